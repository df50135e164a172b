import pytest
import torch
from tolerance import ULPS_PER_STEP, f32_atol
from torch import nn

from fedray.algorithms.base import NO_TERMS, LocalTerms
from fedray.core.flat_model import FlatModel
from fedray.kernels.sequential import local_sgd, num_local_steps


def _setup(n=23, seed=0):
    torch.manual_seed(seed)
    m = FlatModel(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.3), nn.Linear(8, 3)))
    x, y = torch.randn(n, 4), torch.randint(0, 3, (n,))
    return m, m.flat.clone(), x, y


def _run(m, w, x, y, **kw):
    args = dict(lr=0.1, batch_size=5, local_epochs=1, local_steps=None, seed=42,
                delta_out=torch.empty_like(w))
    args.update(kw)
    return local_sgd(m, w, x, y, **args)


def test_step_counts():
    assert num_local_steps(23, 5, 1, None) == 5
    assert num_local_steps(23, 5, 3, None) == 15
    assert num_local_steps(23, 5, 3, 7) == 7
    m, w, x, y = _setup()
    r = _run(m, w, x, y, local_steps=7)
    assert r.steps == 7 and r.examples_seen == 7 * 5 - 2  # one partial batch after 4 full
    r = _run(m, w, x, y, local_epochs=2)
    assert r.steps == 10 and r.examples_seen == 46 and r.num_examples == 23


def test_same_seed_same_delta_any_replica_state():
    m, w, x, y = _setup()
    d1 = _run(m, w, x, y).delta.clone()
    m.flat.normal_()  # a replica left in another client's state
    d2 = _run(m, w, x, y).delta.clone()
    assert torch.equal(d1, d2)
    d3 = _run(m, w, x, y, seed=43).delta
    assert not torch.equal(d1, d3)
    m.module.eval()  # a replica an evaluation left in eval mode: local SGD still trains
    d4 = _run(m, w, x, y).delta.clone()  # with dropout (d1's masks)
    assert m.module.training and torch.equal(d1, d4)


def test_matches_plain_sgd_loop():
    torch.manual_seed(0)
    m = FlatModel(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)))
    w, x, y = m.flat.clone(), torch.randn(23, 4), torch.randint(0, 3, (23,))
    ref = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    torch.nn.utils.vector_to_parameters(w.clone(), ref.parameters())
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    perm = torch.randperm(23, generator=torch.Generator().manual_seed(42))
    for i in range(0, 23, 5):
        opt.zero_grad()
        nn.functional.cross_entropy(ref(x[perm[i:i + 5]]), y[perm[i:i + 5]]).backward()
        opt.step()
    r = _run(m, w, x, y)
    expected = torch.nn.utils.parameters_to_vector(ref.parameters()) - w
    # torch.optim.SGD's update is another code path: ulps of the weights' size, per step
    torch.testing.assert_close(r.delta, expected, rtol=0,
                               atol=f32_atol(w, w + expected, ulps=ULPS_PER_STEP * (r.steps + 1)))


def test_client_without_examples_takes_no_step():
    m, w, x, y = _setup()
    r = _run(m, w, x[:0], y[:0], local_steps=3)
    assert r.steps == 0 and r.num_examples == 0 and torch.equal(r.delta, torch.zeros_like(w))


def test_steps_per_epoch_batch_size():
    from fedray.kernels.sequential import client_batch_size

    assert client_batch_size(23, 5, None) == 5
    assert client_batch_size(23, 5, 5) == 5  # ceil(23 / 5)
    assert client_batch_size(100, 7, 5) == 20
    assert client_batch_size(3, 20, 5) == 1  # fewer examples than steps: one per step
    assert num_local_steps(100, client_batch_size(100, 7, 5), 2, None) == 10


def test_correction_is_added_to_every_gradient():
    """A linear term (SCAFFOLD's y <- y - lr (g(y) + correction)): a constant one on a model
    whose loss gradient is zero (lr 0 elsewhere) moves it by -steps * lr * correction."""
    m, w, x, y = _setup()
    corr = torch.randn(m.num_params)
    base = _run(m, w, x, y, local_steps=1, batch_size=23).delta.clone()
    shifted = _run(m, w, x, y, local_steps=1, batch_size=23,
                   terms=LocalTerms(linear=corr)).delta
    # each delta y - x is rounded at the size of y: one step, two deltas
    torch.testing.assert_close(shifted[: m.num_params] - base[: m.num_params], -0.1 * corr,
                               rtol=0, atol=f32_atol(w, w + shifted, ulps=2 * ULPS_PER_STEP))
    zero = _run(m, w, x, y, local_steps=1, batch_size=23,
                terms=LocalTerms(linear=torch.zeros(m.num_params))).delta
    assert torch.equal(zero, base)


def test_full_gradient_and_sensitivity_on_a_linear_model():
    from fedray.algorithms.elastic import sensitivity
    from fedray.kernels.sequential import full_gradient

    torch.manual_seed(0)
    m = FlatModel(nn.Linear(3, 1, bias=False))
    w = m.flat.clone()
    x, y = torch.randn(7, 3), torch.randn(7)
    g = full_gradient(m, w, x, y, batch_size=3, seed=0, out=torch.empty(3), loss="mse")
    wv, xd = w.double(), x.double()
    expected = xd.T @ (xd @ wv - y.double()) / 7
    # float32 against float64: a mean of 7 products, in batches of 3, each rounded at about
    # the size of the terms |x_i| |x_i.w - y_i| (which cancel); a few ulps of that
    terms = xd.abs().T @ (xd @ wv - y.double()).abs() / 7
    torch.testing.assert_close(g.double(), expected, rtol=0, atol=f32_atol(terms, ulps=8))
    mu = 0.8
    om = sensitivity(m, w, x, batch_size=4, mu=mu, out=torch.empty(3))
    ref = torch.zeros(3, dtype=torch.float64)
    terms = torch.zeros(3, dtype=torch.float64)
    for lo in (0, 4):
        xb = x[lo:lo + 4].double()
        ref = mu * ref + (1 - mu) * (2 * (xb @ wv)[:, None] * xb).mean(0).abs()
        terms = torch.maximum(terms, (2 * (xb @ wv)[:, None] * xb).abs().mean(0))
    # float32 against float64: batch means of 4 terms of this size, as above
    torch.testing.assert_close(om.double(), ref, rtol=0, atol=f32_atol(terms, ulps=8))


def test_full_gradient_by_hand_in_train_mode_from_its_seed():
    """full_gradient: the size-weighted mean of its batches' gradients, in train mode (the
    dropout masks of ``seed``, whatever the global RNG and the module's mode were), written
    over ``out`` whatever it held, each batch's gradient on its own."""
    import copy

    import torch.nn.functional as F

    from fedray.kernels.sequential import full_gradient

    m, w, x, y = _setup(n=13)
    ref = copy.deepcopy(m.module)
    torch.manual_seed(3)
    want = torch.zeros(m.num_params)
    for lo in range(0, 13, 5):
        ref.zero_grad()
        F.cross_entropy(ref(x[lo:lo + 5]), y[lo:lo + 5]).backward()
        want += torch.cat([p.grad.flatten() for p in ref.parameters()]) * (
            min(13, lo + 5) - lo) / 13
    m.module.eval()
    m.flat.normal_()  # a replica left at another model: the gradient is taken at w
    torch.manual_seed(99)
    got = full_gradient(m, w, x, y, batch_size=5, seed=3, out=torch.full((m.num_params,), 7.0))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    other = full_gradient(m, w, x, y, batch_size=5, seed=4, out=torch.zeros(m.num_params))
    assert not torch.allclose(other, want)  # another seed: other dropout masks


def test_full_batch_is_one_step_on_every_example():
    """FedSGD's schedule: one step whose batch is all n examples, whatever batch_size and
    local_epochs say; no step for a client without examples."""
    from fedray.kernels.sequential import batch_schedule

    s = batch_schedule(7, 3, 4, None, seed=1, full_batch=True)
    assert len(s) == 1 and sorted(s[0].tolist()) == list(range(7))
    assert batch_schedule(7, 3, 1, 5, seed=1, full_batch=True)[0].numel() == 7
    assert batch_schedule(0, 3, 1, None, seed=1, full_batch=True) == []
    assert [b.tolist() for b in batch_schedule(1, 3, 2, None, seed=1, full_batch=True)] == [[0]]


def test_batches_are_cut_from_one_permutation_per_epoch_by_default():
    """The default schedule: each epoch's batches partition the client's examples;
    independent batches (LOCALUPDATE) are asked for, never the default."""
    from fedray.kernels.sequential import batch_schedule

    s = batch_schedule(10, 3, 2, None, seed=1)
    assert [len(b) for b in s] == [3, 3, 3, 1] * 2
    for epoch in (s[:4], s[4:]):
        assert sorted(torch.cat(epoch).tolist()) == list(range(10))
    indep = batch_schedule(10, 3, 2, None, seed=1, independent=True)
    assert [len(b) for b in indep] == [3] * 8



@pytest.mark.parametrize("full_batch", [False, True])
def test_batch_rows_are_batch_schedule_as_one_array(full_batch):
    """The vectorized kernel lays out a client's batches from batch_rows: they must be
    batch_schedule's, index for index (padding -1 after a short last batch), for every
    size, batch, number of epochs and step count, including cycling through permutations
    (local_steps past an epoch), a batch larger than the client, and no examples."""
    from fedray.kernels.sequential import batch_rows, batch_schedule

    for n in (0, 1, 2, 7, 20, 23, 60):
        for b in (1, 3, 20, 64):
            for epochs, steps in ((1, None), (3, None), (1, 1), (1, 5), (2, 13)):
                seed = 1000 * n + 10 * b + epochs
                want = batch_schedule(n, b, epochs, steps, seed, full_batch)
                got = batch_rows(n, b, epochs, steps, seed, full_batch)
                assert len(got) == len(want), (n, b, epochs, steps)
                for row, idx in zip(got, want, strict=True):
                    assert row[:len(idx)].tolist() == idx.tolist()
                    assert (row[len(idx):] == -1).all()

def test_proximal_term_by_hand():
    """FedProx's term mu (y - x) joins every step's gradient, anchored at the global model
    (two full-batch steps: the first has no pull yet, the second has)."""
    import copy

    import torch.nn.functional as F

    torch.manual_seed(0)
    m = FlatModel(nn.Linear(4, 3))
    w, x, y = m.flat.clone(), torch.randn(9, 4), torch.randint(0, 3, (9,))
    ref = copy.deepcopy(m.module)
    anchor = [p.detach().clone() for p in ref.parameters()]
    for _ in range(2):
        ref.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        with torch.no_grad():
            for p, a in zip(ref.parameters(), anchor, strict=True):
                p -= 0.3 * (p.grad + 0.5 * (p - a))
    want = torch.cat([p.detach().flatten() for p in ref.parameters()]) - w
    got = _run(m, w, x, y, lr=0.3, batch_size=9, local_steps=2,
               terms=LocalTerms(proximal=0.5)).delta
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    plain = _run(m, w, x, y, lr=0.3, batch_size=9, local_steps=2).delta
    assert not torch.allclose(plain, want, rtol=1e-5, atol=1e-6)  # the term mattered


def test_gradient_sum_is_the_theta_weighted_sum_of_the_steps_gradients():
    """gradient_sum receives sum_k theta_k g_k (LOCALUPDATE's message), written over what the
    buffer held, and loss_sum the batches' losses weighted by their sizes; lr = 0 takes every
    step at the global model, so both can be checked by hand."""
    import copy

    from fedray.core.losses import loss_fn
    from fedray.kernels.sequential import batch_schedule

    m, w, x, y = _setup(n=13)
    thetas = [0.5, 0.0, 2.0]
    ref = copy.deepcopy(m.module)
    ref.train()
    torch.manual_seed(42)
    want, loss_sum = torch.zeros(m.num_params), 0.0
    for theta, idx in zip(thetas, batch_schedule(13, 5, 1, None, 42), strict=True):
        ref.zero_grad()
        batch_loss = loss_fn("cross_entropy")(ref(x[idx]), y[idx])
        batch_loss.backward()
        want += theta * torch.cat([p.grad.flatten() for p in ref.parameters()])
        loss_sum += float(batch_loss.detach()) * len(idx)  # batches of 5, 5, 3
    for junk in (0.0, 7.0):
        got = torch.full((m.num_params,), junk)
        r = _run(m, w, x, y, lr=0.0, step_weights=thetas, gradient_sum=got)
        assert r.steps == 3 and torch.equal(r.delta, torch.zeros_like(w))
        assert r.examples_seen == 13 and abs(r.loss_sum - loss_sum) <= 1e-5 * loss_sum
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


# -- phase hooks (fedray.algorithms.base.Phase): start, trainable, optimizer, transform ------

def _old_local_sgd(model, global_weights, x, y, *, lr, batch_size, local_epochs, local_steps,
                   seed, delta_out, terms=NO_TERMS):
    """local_sgd's loop as it was before the phase hooks (commit 57939ab), kept verbatim: a
    client part without hooks must still run these exact float operations (every preset's
    final weights are pinned), not just a result close to them."""
    from fedray.kernels.sequential import batch_schedule

    criterion = torch.nn.functional.cross_entropy
    model.load_(global_weights)
    torch.manual_seed(seed)
    schedule = batch_schedule(len(y), batch_size, local_epochs, local_steps, seed)
    model.module.train()
    linears = [None] * len(model.param_list) if terms.linear is None else model.split(
        terms.linear)
    anchors = model.split(global_weights) if terms.proximal else linears
    with model.own_grads() as params:
        for idx in schedule:
            for p in params:
                p.grad = None
            criterion(model.module(x[idx]), y[idx]).backward()
            with torch.no_grad():
                grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in params]
                if not terms.empty:
                    for g, p, a, c in zip(grads, params, anchors, linears, strict=True):
                        terms.add_to_(g, p, a, c)
                if lr:
                    torch._foreach_add_(params, grads, alpha=-lr)
    torch.sub(model.flat, global_weights, out=delta_out)
    return delta_out


def test_no_hook_runs_the_old_loop_bit_for_bit():
    """Without hooks local_sgd is the old loop; with hooks that change nothing (every
    parameter trainable, plain SGD named) the general step takes the same float operations
    too, dropout masks included (the same torch.manual_seed)."""
    from fedray.algorithms.base import ClientOptimizer

    m, w, x, y = _setup()
    terms = LocalTerms(proximal=0.1, linear=torch.randn(m.num_params) * 0.01)
    kw = dict(local_epochs=2, terms=terms)
    old = _old_local_sgd(m, w, x, y, lr=0.1, batch_size=5, local_steps=None, seed=42,
                         delta_out=torch.empty_like(w), **kw).clone()
    new = _run(m, w, x, y, **kw)
    assert torch.equal(new.delta, old) and new.opt_state is None
    assert torch.equal(_run(m, w, x, y, optimizer=ClientOptimizer("sgd"), **kw).delta, old)
    general = _run(m, w, x, y, trainable=[True] * 4, **kw)
    assert torch.equal(general.delta, old) and general.loss_sum == new.loss_sum
    assert torch.equal(_run(m, w, x, y, start=w.clone(), **kw).delta, old)


def _reference(w0, anchor, x, y, schedule, *, lr, flags, terms, kind="sgd", momentum=0.9,
               betas=(0.9, 0.999), eps=1e-8, opt_in=None, clip=None, per_example=False):
    """The phase's local training written out in float64 for nn.Linear (weight, bias):
    frozen parameters (flags) take no step and are left out of the clip's norm; terms are
    added before a per-batch clip, after the average of per-example clipped gradients."""
    import numpy as np

    shapes = [(3, 4), (3,)]
    sizes = [12, 3]
    ws = [t.clone() for t in torch.split(w0.double(), sizes)]
    ws = [t.view(s) for t, s in zip(ws, shapes, strict=True)]
    anc = [t.view(s) for t, s in zip(torch.split(anchor.double(), sizes), shapes, strict=True)]
    lin = (None if terms.linear is None else
           [t.view(s) for t, s in zip(torch.split(terms.linear.double(), sizes), shapes,
                                      strict=True)])
    m_ = [torch.zeros(s, dtype=torch.float64) for s in shapes]
    v_ = [torch.zeros(s, dtype=torch.float64) for s in shapes]
    t_ = 0.0
    if opt_in is not None:
        m_ = [a.view(s).double().clone() for a, s in
              zip(torch.split(opt_in["m"], sizes), shapes, strict=True)]
        if "v" in opt_in:
            v_ = [a.view(s).double().clone() for a, s in
                  zip(torch.split(opt_in["v"], sizes), shapes, strict=True)]
            t_ = float(opt_in["t"][0])
    xd = x.double()

    def grad_of(rows):
        wv = [t.clone().requires_grad_(True) for t in ws]
        out = xd[rows] @ wv[0].T + wv[1]
        torch.nn.functional.cross_entropy(out, y[rows]).backward()
        return [t.grad if f else torch.zeros_like(t) for t, f in zip(wv, flags, strict=True)]

    def clipped(g):
        norm = float(np.sqrt(sum(float((t * t).sum()) for t in g)))
        scale = min(1.0, clip / max(norm, 1e-12))
        return [t * scale for t in g]

    for idx in schedule:
        if per_example:
            each = [grad_of(idx[j:j + 1]) for j in range(len(idx))]
            each = [clipped(g) if clip is not None else g for g in each]
            g = [sum(e[k] for e in each) / len(idx) for k in range(2)]
        else:
            g = grad_of(idx)
        for k in range(2):
            if flags[k]:
                if lin is not None:
                    g[k] = g[k] + lin[k]
                g[k] = g[k] + terms.proximal * (ws[k] - anc[k])
        if clip is not None and not per_example:
            g = clipped(g)
        if kind == "adam":
            t_ += 1
        for k in range(2):
            if not flags[k]:
                continue
            if kind == "sgd":
                ws[k] = ws[k] - lr * g[k]
            elif kind == "momentum":
                m_[k] = momentum * m_[k] + g[k]
                ws[k] = ws[k] - lr * m_[k]
            else:
                m_[k] = betas[0] * m_[k] + (1 - betas[0]) * g[k]
                v_[k] = betas[1] * v_[k] + (1 - betas[1]) * g[k] ** 2
                mh, vh = m_[k] / (1 - betas[0] ** t_), v_[k] / (1 - betas[1] ** t_)
                ws[k] = ws[k] - lr * mh / (vh.sqrt() + eps)
    flat = torch.cat([t.reshape(-1) for t in ws])
    state = {"m": torch.cat([t.reshape(-1) for t in m_]),
             "v": torch.cat([t.reshape(-1) for t in v_]),
             "t": torch.tensor([t_], dtype=torch.float64)}
    return flat, state


PHASE_CASES = {  # local_sgd's hooks -> the reference's
    "start": ({"start": True}, {}),
    "frozen-weight": ({"trainable": [False, True]}, {"flags": [False, True]}),
    "frozen-bias-momentum": ({"trainable": [True, False], "optimizer": ("momentum", 0.8)},
                             {"flags": [True, False], "kind": "momentum", "momentum": 0.8}),
    "momentum-from-state": ({"optimizer": ("momentum", 0.9), "opt_state": ("m",)},
                            {"kind": "momentum", "momentum": 0.9, "opt_in": ("m",)}),
    "adam": ({"optimizer": ("adam", 0.0)}, {"kind": "adam"}),
    "adam-from-state-frozen-bias": (
        {"optimizer": ("adam", 0.0), "opt_state": ("m", "v", "t"), "trainable": [True, False]},
        {"kind": "adam", "opt_in": ("m", "v", "t"), "flags": [True, False]}),
    "clip-per-batch": ({"clip": False}, {"clip": 0.05}),
    "clip-per-batch-frozen-bias": ({"clip": False, "trainable": [True, False]},
                                   {"clip": 0.05, "flags": [True, False]}),
    "clip-per-example": ({"clip": True}, {"clip": 0.05, "per_example": True}),
    "clip-per-example-frozen-bias": ({"clip": True, "trainable": [True, False]},
                                     {"clip": 0.05, "per_example": True,
                                      "flags": [True, False]}),
}


def _phase_inputs():
    torch.manual_seed(3)
    m = FlatModel(nn.Linear(4, 3))
    w = m.flat.clone()
    x, y = torch.randn(17, 4), torch.randint(0, 3, (17,))
    start = w + 0.3 * torch.randn_like(w)
    terms = LocalTerms(proximal=0.2, linear=0.05 * torch.randn(m.num_params))
    state = {"m": 0.1 * torch.randn(m.num_params), "v": 0.01 * torch.rand(m.num_params),
             "t": torch.tensor([3.0])}
    return m, w, x, y, start, terms, state


@pytest.mark.parametrize("case", PHASE_CASES)
def test_phase_hooks_against_a_float64_reference(case):
    """Each hook against the same training written out in float64 (_reference): 2 epochs
    of batches of 5 from the kernel's own schedule, with a proximal and a linear term. The
    clip bound 0.05 is below every batch's and example's gradient norm here, so clipping
    acts on every step (checked: without it the result moves by far more than the
    tolerance)."""
    from fedray.algorithms.base import ClientOptimizer, ClipNorm
    from fedray.kernels.sequential import batch_schedule

    hooks, ref = PHASE_CASES[case]
    m, w, x, y, start, terms, state = _phase_inputs()
    kw: dict = {"terms": terms, "local_epochs": 2, "lr": 0.05}
    if "start" in hooks:
        kw["start"] = start
    if "trainable" in hooks:
        kw["trainable"] = hooks["trainable"]
    if "optimizer" in hooks:
        kind, mu = hooks["optimizer"]
        kw["optimizer"] = ClientOptimizer(kind, momentum=mu)
    if "opt_state" in hooks:
        kw["opt_state"] = {k: state[k] for k in hooks["opt_state"]}
    if "clip" in hooks:
        kw["transform"] = ClipNorm(0.05, per_example=hooks["clip"])
    out = _run(m, w, x, y, **kw)
    schedule = batch_schedule(17, 5, 2, None, 42)
    expected, moments = _reference(
        start if "start" in hooks else w, w, x, y, schedule, lr=0.05, terms=terms,
        flags=ref.get("flags", [True, True]), kind=ref.get("kind", "sgd"),
        momentum=ref.get("momentum", 0.9), clip=ref.get("clip"),
        per_example=ref.get("per_example", False),
        opt_in={k: state[k] for k in ref["opt_in"]} if "opt_in" in ref else None)
    trained = w.double() + out.delta.double()
    # float32 against float64: ULPS_PER_STEP a step of the weights' size (tolerance.py);
    # Adam's step lr * m_hat / sqrt(v_hat) is a ratio of two rounded moments: its rounding
    # relative to lr is that of the moments, a few ulps, so the same bound holds
    atol = f32_atol(w, trained, ulps=ULPS_PER_STEP * (out.steps + 1))
    torch.testing.assert_close(trained, expected, rtol=0, atol=atol)
    frozen = [i for i, f in enumerate(ref.get("flags", [True, True])) if not f]
    spans = [slice(0, 12), slice(12, 15)]
    for i in frozen:  # exactly where it started
        assert torch.equal(out.delta[spans[i]], (kw.get("start", w) - w)[spans[i]])
    if "kind" in ref:
        assert out.opt_state is not None
        for key, val in out.opt_state.items():
            mom_atol = f32_atol(moments[key], ulps=ULPS_PER_STEP * (out.steps + 1))
            torch.testing.assert_close(val.double(), moments[key], rtol=0, atol=mom_atol)
        if "opt_in" in ref:  # a frozen parameter's moments come back as they went in
            for i in frozen:
                assert torch.equal(out.opt_state["m"][spans[i]], state["m"][spans[i]])
        if ref["kind"] == "adam":
            assert float(out.opt_state["t"][0]) == float(moments["t"][0]) == (
                out.steps + (3.0 if "opt_in" in ref else 0.0))
    if "clip" in ref:  # the clip acted: without it the result is far off the reference
        plain = _run(m, w, x, y, **{k: v for k, v in kw.items() if k != "transform"})
        assert (w.double() + plain.delta.double() - expected).abs().max() > 100 * atol


def test_per_example_transform_refuses_a_model_with_buffers():
    from fedray.algorithms.base import ClipNorm

    torch.manual_seed(0)
    m = FlatModel(nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3)))
    w, x, y = m.flat.clone(), torch.randn(8, 4), torch.randint(0, 3, (8,))
    with pytest.raises(ValueError, match="per-example gradient transform needs a model "
                                         "without buffers"):
        _run(m, w, x, y, transform=ClipNorm(1.0, per_example=True))
