import torch
from tolerance import ULPS_PER_STEP, f32_atol
from torch import nn

from fedray.algorithms.base import LocalTerms
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
