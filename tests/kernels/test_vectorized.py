"""Vectorized client work equals sequential client work, client by client, up to the
rounding of the batched products: tolerance.ULPS_PER_STEP ulps of the weights' size per
local step."""

import subprocess
import sys

import pytest
import torch
from tolerance import ULPS_PER_STEP, f32_atol
from torch import nn

from fedray.algorithms.base import ClientOptimizer, ClipNorm, LocalTerms, Normalize
from fedray.core.flat_model import FlatModel
from fedray.core.models import build_model
from fedray.kernels.sequential import local_sgd
from fedray.kernels.vectorized import (
    batch_failure,
    defer_first_layer,
    group_size,
    group_sizes,
    linear_chain,
    unsupported_reason,
    vectorize_plan,
    vmap_local_sgd,
)


def _clients(shape, classes, sizes, seed=0, loss="cross_entropy"):
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in sizes:
        x = torch.randn((n, *shape), generator=g)
        y = (torch.randn((n, 1), generator=g) if loss == "mse"
             else torch.randint(0, classes, (n,), generator=g))
        out.append((x, y))
    return out


def _atol(w0, deltas, steps) -> float:
    """Sequential against vectorized training over ``steps`` local steps: ulps of the size
    of the weights (the deltas are y - x, rounded at the weights' size, not their own)."""
    return f32_atol(w0, w0 + deltas, ulps=ULPS_PER_STEP * (steps + 1))


def _sequential(model, w0, data, lrs, seeds, **kw):
    deltas, results = [], []
    for (x, y), lr, seed, i in zip(data, lrs, seeds, range(len(data)), strict=True):
        terms = kw.get("terms", LocalTerms())
        linear = None if terms.linear is None else terms.linear[i]
        res = local_sgd(model, w0, x, y, lr=lr, seed=seed, delta_out=torch.empty_like(w0),
                        batch_size=kw["batch_size"], local_epochs=kw["local_epochs"],
                        local_steps=kw["local_steps"],
                        terms=LocalTerms(proximal=terms.proximal, linear=linear),
                        full_batch=kw.get("full_batch", False), loss=kw.get("loss",
                                                                            "cross_entropy"))
        deltas.append(res.delta.clone())
        results.append(res)
    return torch.stack(deltas), results


CASES = {
    "fedavg": {},
    "fedavg-local-steps": {"local_steps": 7, "local_epochs": 1},
    "fedprox": {"proximal": 0.1},
    "feddyn": {"proximal": 0.1, "scaffold": True},  # both terms at once
    "fedsgd": {"full_batch": True},
    "scaffold": {"scaffold": True},
}
MODELS = {"logreg": (1, 6, 6), "mlp": (1, 6, 6), "leaf_cnn": (1, 8, 8)}
# (model, path): logistic regression and the MLP take their gradients in closed form
# (chain_sgd_step), with the first layer's weights as sums over the examples
# (FirstLayerSums) or stacked, unless told to use torch.func; every way must equal
# sequential training. The CNN has only torch.func's.
PATH_OPTIONS = {"sums": {"defer_first": True}, "stacks": {"defer_first": False},
                "torch.func": {"closed_form": False}}
PATHS = [("logreg", "sums"), ("logreg", "stacks"), ("logreg", "torch.func"),
         ("mlp", "sums"), ("mlp", "stacks"), ("mlp", "torch.func"),
         ("leaf_cnn", "torch.func")]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize(("name", "path"), PATHS)
def test_each_client_gets_its_sequential_update(name, path, case):
    shape, classes = MODELS[name], 5
    torch.manual_seed(1)
    model = FlatModel(build_model(name, shape, classes))
    assert (linear_chain(model.module, "cross_entropy") is not None) == (name != "leaf_cnn")
    w0 = model.flat.clone()
    sizes = [13, 3, 0, 9, 25]  # a client smaller than a batch, one without examples
    data = _clients(shape, classes, sizes)
    lrs = [0.1, 0.05, 0.1, 0.2, 0.08]  # each client its own
    seeds = [11, 12, 13, 14, 15]
    opts = dict(CASES[case])
    scaffold = opts.pop("scaffold", False)
    proximal = opts.pop("proximal", 0.0)
    linear = None
    if scaffold:  # |c - c_i| of a realistic size: a large one makes SGD diverge, and then
        # float rounding differences grow without bound in any implementation
        linear = 1e-3 * torch.randn(len(sizes), model.num_params,
                                    generator=torch.Generator().manual_seed(3))
    kw = {"batch_size": 4, "local_epochs": 2, "local_steps": None,
          "terms": LocalTerms(proximal=proximal, linear=linear), **opts}
    expected, results = _sequential(model, w0, data, lrs, seeds, **kw)
    got = vmap_local_sgd(model, w0, data, lrs=lrs, seeds=seeds, **PATH_OPTIONS[path], **kw)
    assert got.path == path
    deltas = torch.stack([got.delta(i) for i in range(len(sizes))])
    assert deltas.shape == expected.shape
    atol = _atol(w0, expected, max(r.steps for r in results))
    assert torch.allclose(deltas, expected, atol=atol, rtol=0), (
        float((deltas - expected).abs().max()), atol)
    assert expected.abs().max() > 1e-3  # the clients did move
    assert got.steps == [r.steps for r in results]
    assert got.examples_seen == [r.examples_seen for r in results]
    assert got.num_examples == [r.num_examples for r in results]
    assert got.loss_sums == pytest.approx([r.loss_sum for r in results], rel=1e-5, abs=1e-6)


def test_per_client_batch_sizes_and_regression_loss():
    model = FlatModel(build_model("mlp", (4,), 1))
    w0 = model.flat.clone()
    data = _clients((4,), 1, [10, 7, 12], seed=4, loss="mse")
    kw = {"local_epochs": 1, "local_steps": None, "loss": "mse"}
    lrs, seeds = [0.05, 0.05, 0.05], [1, 2, 3]
    got = vmap_local_sgd(model, w0, data, lrs=lrs, seeds=seeds, batch_size=[5, 7, 4], **kw)
    for i, ((x, y), b) in enumerate(zip(data, [5, 7, 4], strict=True)):
        res = local_sgd(model, w0, x, y, lr=0.05, batch_size=b, seed=seeds[i],
                        delta_out=torch.empty_like(w0), **kw)
        assert torch.allclose(got.delta(i), res.delta, atol=_atol(w0, res.delta, res.steps),
                              rtol=0)


@pytest.mark.parametrize("model", [
    nn.Sequential(nn.Linear(4, 6, bias=False), nn.ReLU(), nn.Linear(6, 2)),  # no Flatten, a
    # Linear without bias
    nn.Sequential(nn.Linear(4, 2)),  # on [n, 3, 4] inputs: applied to the last axis, so not
    # a chain there (torch.func's way)
])
def test_regression_chains_with_and_without_flatten(model):
    torch.manual_seed(2)
    flat = FlatModel(model)
    w0 = flat.flat.clone()
    shape = (4,) if len(model) == 3 else (3, 4)
    g = torch.Generator().manual_seed(5)
    data = [(torch.randn((n, *shape), generator=g), torch.randn((n, *shape[:-1], 2), generator=g))
            for n in (9, 5, 14)]
    kw = {"batch_size": 4, "local_epochs": 2, "local_steps": None, "loss": "mse"}
    lrs, seeds = [0.05] * 3, [1, 2, 3]
    expected, results = _sequential(flat, w0, data, lrs, seeds, **kw)
    got = vmap_local_sgd(flat, w0, data, lrs=lrs, seeds=seeds, **kw)
    deltas = torch.stack([got.delta(i) for i in range(len(data))])
    atol = _atol(w0, expected, max(r.steps for r in results))
    assert torch.allclose(deltas, expected, atol=atol, rtol=0)
    assert expected.abs().max() > 1e-3


def test_only_linear_relu_chains_take_the_closed_form():
    chain = linear_chain(build_model("mlp", (1, 28, 28), 62), "cross_entropy")
    assert chain is not None and chain.flatten and chain.layers == ((0, 1), (2, 3))
    assert linear_chain(build_model("logreg", (1, 28, 28), 62), "mse").layers == ((0, 1),)
    no_bias = linear_chain(nn.Sequential(nn.Linear(3, 4, bias=False), nn.ReLU(),
                                         nn.Linear(4, 2)), "cross_entropy")
    assert no_bias is not None and not no_bias.flatten and no_bias.layers == ((0, None), (1, 2))

    class Doubled(nn.Sequential):  # the layers of a chain, but another forward
        def forward(self, x):
            return 2 * super().forward(x)

    shared = nn.Linear(3, 3)
    for other in (build_model("leaf_cnn", (1, 8, 8), 5),
                  nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)),
                  nn.Sequential(nn.Linear(3, 4), nn.ReLU()),  # does not end in a Linear
                  nn.Sequential(nn.Flatten(2), nn.Linear(3, 2)),
                  nn.Sequential(nn.Flatten(), nn.Flatten(), nn.Linear(3, 2)),
                  nn.Sequential(shared, nn.ReLU(), shared),  # one layer used twice
                  Doubled(nn.Linear(3, 2)),
                  nn.Sequential()):
        assert linear_chain(other, "cross_entropy") is None, other
    assert linear_chain(build_model("logreg", (1, 28, 28), 62), "bce") is None


def test_closed_form_steps_do_not_import_torch_dynamo():
    """torch.func's first grad call imports torch._dynamo (1-2 s per worker process); a
    logistic regression or MLP worker never pays it."""
    code = ("import sys, torch\n"
            "from fedray.core.models import build_model\n"
            "from fedray.core.flat_model import FlatModel\n"
            "from fedray.kernels.vectorized import vmap_local_sgd\n"
            "m = FlatModel(build_model('mlp', (1, 6, 6), 5))\n"
            "data = [(torch.randn(n, 1, 6, 6), torch.randint(0, 5, (n,))) for n in (5, 9)]\n"
            "vmap_local_sgd(m, m.flat, data, lrs=[0.1, 0.1], seeds=[0, 1], batch_size=4,\n"
            "               local_epochs=1, local_steps=None, closed_form={cf})\n"
            "print('torch._dynamo' in sys.modules)\n")
    for closed_form, imported in ((True, "False"), (False, "True")):
        out = subprocess.run([sys.executable, "-c", code.format(cf=closed_form)],
                             capture_output=True, text=True, check=True).stdout
        assert out.strip() == imported


def test_models_that_cannot_be_vectorized_say_why():
    assert unsupported_reason(build_model("logreg", (1, 28, 28), 62)) is None
    assert unsupported_reason(build_model("leaf_cnn", (1, 28, 28), 62)) is None
    # nn.Dropout's masks are drawn per client (test_dropout.py); AlphaDropout's are not
    assert unsupported_reason(build_model("emnist_cnn", (1, 28, 28), 62)) is None
    alpha = nn.Sequential(nn.Flatten(), nn.Linear(4, 3), nn.AlphaDropout(0.2))
    assert "dropout whose masks are not drawn per client (2: AlphaDropout)" in (
        unsupported_reason(alpha))
    bn = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    assert "batch-norm" in unsupported_reason(bn)
    with pytest.raises(ValueError, match="cannot train this model vectorized: it has dropout"):
        m = FlatModel(alpha)
        vmap_local_sgd(m, m.flat, _clients((4,), 3, [2]), lrs=[0.1], seeds=[0],
                       batch_size=2, local_epochs=1, local_steps=None)


def test_vectorize_plan_follows_the_mode_and_says_why_not():
    logreg, cnn = build_model("logreg", (1, 28, 28), 62), build_model("leaf_cnn", (1, 28, 28), 62)
    dropout = nn.Sequential(nn.Linear(4, 3), nn.FeatureAlphaDropout(0.2))
    assert vectorize_plan(logreg, "auto", gpu=False) == (True, None)
    assert vectorize_plan(logreg, "off", gpu=False) == (False, None)
    assert vectorize_plan(cnn, "on", gpu=False) == (True, None)
    assert vectorize_plan(cnn, "auto", gpu=True) == (True, None)
    on, why = vectorize_plan(cnn, "auto", gpu=False)
    assert not on and "measured slower for models with convolutions" in why
    assert vectorize_plan(build_model("mlp", (1, 28, 28), 62), "auto", gpu=False) == (True, None)
    on, why = vectorize_plan(dropout, "auto", gpu=True)
    assert not on and "cannot be vectorized: it has dropout" in why
    with pytest.raises(ValueError, match="'runtime.worker.vectorize': .* it has dropout.*got 'on'"):
        vectorize_plan(dropout, "on", gpu=True)


class _Asserts(nn.Module):
    """Checks its input with a Python ``assert`` on a tensor."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        assert torch.isfinite(x).all(), "non-finite input"
        return self.fc(x)


class _Item(nn.Module):
    """Scales by a Python float read with ``.item()``."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x) / (1.0 + x.abs().max().item())


class _Branches(nn.Module):
    """Takes a branch chosen by a tensor's value."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        if x.sum() > 0:
            return self.fc(x)
        return self.fc(-x)


@pytest.mark.parametrize("kind", [_Asserts, _Item, _Branches])
def test_a_model_that_fails_under_vmap_falls_back_or_is_refused(kind):
    """A forward pass that an ordinary model may well have (an ``assert`` on a tensor,
    ``.item()``, an ``if`` on tensor data) passes every static check, but cannot run inside
    ``vmap``. The probe, one tiny batched step, finds that before round 1: ``auto`` trains
    the model one client after another and says why in one line; ``on`` refuses it in one
    line naming the key. The probe changes no weight and leaves the mode as it was."""
    model = FlatModel(kind())
    before = model.flat.clone()
    model.module.eval()
    failure = batch_failure(model, (4,), "cross_entropy")
    assert failure is not None and "\n" not in failure
    assert torch.equal(model.flat, before) and not model.module.training
    probe = lambda: batch_failure(model, (4,), "cross_entropy")  # noqa: E731
    on, why = vectorize_plan(model.module, "auto", gpu=False, probe=probe)
    assert not on and why.startswith("runtime.worker.vectorize=auto: clients train one after "
                                     "another, as this model cannot be vectorized: one "
                                     "batched step fails: ")
    with pytest.raises(ValueError, match=r"^config key 'runtime.worker.vectorize': this model "
                       r"cannot be trained vectorized: one batched step fails: .*got 'on'$"):
        vectorize_plan(model.module, "on", gpu=False, probe=probe)


@pytest.mark.parametrize("name,shape,loss", [("logreg", (1, 28, 28), "cross_entropy"),
                                             ("mlp", (1, 28, 28), "cross_entropy"),
                                             ("leaf_cnn", (1, 28, 28), "cross_entropy"),
                                             ("logreg", (5,), "mse"), ("logreg", (5,), "bce")])
def test_the_probe_passes_the_zoo(name, shape, loss):
    """Every zoo model that auto would vectorize, under each loss it trains with, passes the
    probe: it never sends an ordinary model to sequential training by mistake."""
    model = FlatModel(build_model(name, shape, 1 if loss in ("mse", "bce") else 62))
    assert batch_failure(model, shape, loss) is None
    assert vectorize_plan(model.module, "on", gpu=False, loss=loss,
                          probe=lambda: batch_failure(model, shape, loss)) == (True, None)


def test_hooks_keep_a_model_sequential():
    """A hook would be skipped by the batched step (torch.func trains copies of the
    parameters; the closed-form chain never calls the modules): a gradient hook (clipping),
    a forward hook on any module, or a global module hook keeps auto sequential, with a
    reason, and makes on an error. Checked by reverting: auto vectorized all three."""
    from torch.nn.modules import module as nn_module

    clipped = nn.Sequential(nn.Linear(4, 3))
    clipped[0].weight.register_hook(lambda g: g.clamp(-0.1, 0.1))
    watched = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    watched[1].register_forward_hook(lambda module, args, out: None)
    cases = [(clipped, "parameter 0.weight has a gradient hook"),
             (watched, "module 1 has a forward hook")]
    for model, reason in cases:
        on, why = vectorize_plan(model, "auto", gpu=False)
        assert not on and why.endswith(f"cannot be vectorized: {reason}"), why
        with pytest.raises(ValueError, match=f"trained vectorized: {reason}, got 'on'"):
            vectorize_plan(model, "on", gpu=False)
    plain = nn.Sequential(nn.Linear(4, 3))
    handle = nn_module.register_module_forward_hook(lambda module, args, out: None)
    try:
        assert vectorize_plan(plain, "auto", gpu=False) == (
            False, "runtime.worker.vectorize=auto: clients train one after another, as this "
            "model cannot be vectorized: a global module forward hook is registered")
    finally:
        handle.remove()
    assert vectorize_plan(plain, "auto", gpu=False) == (True, None)


def test_a_clipping_hook_is_honoured_under_vectorize_auto(ray_cluster, tmp_path, capfd):
    """Through fedray.run: with auto, a model that clips its gradients trains exactly as
    with vectorize off (bit for bit: both are the sequential path), the clipping changes the
    result, and the run says once why it did not vectorize. Before, auto vectorized it and
    trained unclipped without a word."""
    import numpy as np

    import fedray

    g = np.random.default_rng(0)
    clients = {c: (g.normal(size=(12, 4)).astype(np.float32) * 5, g.integers(0, 3, size=12))
               for c in range(6)}

    def model(clip: bool):
        def model_fn():  # a closure: shipped to the workers by value
            torch.manual_seed(0)
            m = nn.Sequential(nn.Linear(4, 3))
            if clip:
                for p in m.parameters():
                    p.register_hook(lambda grad: grad.clamp(-0.01, 0.01))
            return m
        return model_fn

    def run(name: str, clip: bool, mode: str):
        job = {"rounds": 2, "sampling": {"clients_per_round": 6},
               "client": {"lr": 0.5, "batch_size": 4},
               "runtime": {"num_workers": 1, "worker": {"num_cpus": 1, "vectorize": mode}},
               "output": {"dir": str(tmp_path / name)}}
        res = fedray.run(job, model_fn=model(clip), client_data=clients)
        return res.weights["0.weight"], res.summary["vectorized"]

    auto, auto_vectorized = run("auto", True, "auto")
    assert "fedray: runtime.worker.vectorize=auto: clients train one after another, as this " \
           "model cannot be vectorized: parameter 0.weight has a gradient hook" in \
           capfd.readouterr().err
    off, _ = run("off", True, "off")
    free, free_vectorized = run("free", False, "auto")
    assert not auto_vectorized and free_vectorized
    assert torch.equal(auto, off)
    assert (auto - free).abs().max() > 0.1  # clipping changed what was learned


def test_first_layer_as_sums_only_where_it_pays_and_no_relu_follows():
    """FirstLayerSums pays for several passes over small clients, not for one pass (its Gram
    matrix costs what the stack saves) nor for clients much larger than the layer's output.
    Before a ReLU it is never chosen: its rounding can flip a unit sitting at 0."""
    sizes = [30, 45, 60, 75, 90]
    one_pass = [20 * -(-n // 20) for n in sizes]
    assert not defer_first_layer(sizes, one_pass, 62)  # logistic regression, 1 epoch
    assert defer_first_layer(sizes, [2 * s for s in one_pass], 62)  # 2 epochs
    assert defer_first_layer(sizes, one_pass, 200)  # a wider layer
    assert not defer_first_layer([2000], [2000], 200)  # a large client
    kw = {"lrs": [0.01] * 4, "seeds": [0, 1, 2, 3], "batch_size": 4, "local_steps": None}
    for name, epochs, path in (("logreg", 3, "sums"), ("logreg", 1, "stacks"),
                               ("mlp", 3, "stacks")):
        model = FlatModel(build_model(name, (1, 6, 6), 5))
        data = _clients((1, 6, 6), 5, [9, 7, 12, 5])
        got = vmap_local_sgd(model, model.flat, data, local_epochs=epochs, **kw)
        assert got.path == path, (name, epochs)


def test_group_size_bounds_the_stacked_weights():
    assert group_size(48_670) == 32  # logistic regression on FEMNIST: 32 x 195 KB
    assert group_size(169_462) == 9  # the MLP: 9 x 678 KB
    assert group_size(6_603_710) == 1  # the LEAF CNN: 26 MB, one at a time on the CPU
    assert group_size(6_603_710, gpu=True) == 20
    assert group_size(10) == 128
    assert group_size(10**9, gpu=True) == 1


def test_group_sizes_split_a_round_evenly_without_a_small_tail():
    assert group_sizes(50, 24) == [25, 25]  # not 24 + 24 + 2
    assert group_sizes(9, 4) == [5, 4]
    assert group_sizes(500, 24) == [24] * 17 + [23] * 4
    assert group_sizes(3, 86) == [3]
    assert group_sizes(0, 24) == []
    for n in range(1, 60):
        sizes = group_sizes(n, 7)
        assert sum(sizes) == n and max(sizes) - min(sizes) <= 1 and max(sizes) <= 7 * 1.5


@pytest.mark.parametrize(("name", "path"), [("mlp", "stacks"), ("logreg", "sums"),
                                            ("mlp", "sums"), ("logreg", "torch.func")])
def test_a_client_trains_the_same_in_any_group(name, path):
    torch.manual_seed(0)
    model = FlatModel(build_model(name, (1, 6, 6), 5))
    data = _clients((1, 6, 6), 5, [13, 3, 9, 25, 7, 11])
    w0 = model.flat.clone()
    kw = {"batch_size": 4, "local_epochs": 2, "local_steps": None, **PATH_OPTIONS[path]}
    everyone = vmap_local_sgd(model, w0, data, lrs=[0.1] * 6, seeds=list(range(6)), **kw)
    some = vmap_local_sgd(model, w0, [data[i] for i in (4, 1, 2)], lrs=[0.1] * 3,
                          seeds=[4, 1, 2], **kw)
    # the same arithmetic per client, but batched products over other group sizes (fewer
    # clients stacked, FirstLayerSums' product over fewer examples), which BLAS may block,
    # thread and so round otherwise: ulps of the weights' size, per local step
    for k, i in enumerate((4, 1, 2)):
        atol = _atol(w0, everyone.delta(i), some.steps[k])
        assert torch.allclose(some.delta(k), everyone.delta(i), atol=atol, rtol=0), (
            float((some.delta(k) - everyone.delta(i)).abs().max()), atol)


# ---- a phase's hooks (fedray.algorithms.base.Phase): starts, trainable, optimizer, transform

BEFORE_HOOKS = "554df7e"  # the last vectorized.py without the phase hooks


def _vectorized_before(tmp_path):
    """fedray/kernels/vectorized.py as it was before the phase hooks, imported from git."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    try:
        src = subprocess.run(["git", "show", f"{BEFORE_HOOKS}:fedray/kernels/vectorized.py"],
                             cwd=root, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("the repository's history is not here")
    path = tmp_path / "vectorized_before.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("vectorized_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["vectorized_before"] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["vectorized_before"]
    return module


def test_without_hooks_every_path_is_bit_identical_to_before(tmp_path):
    """Every preset's final weights are pinned: unused, the hooks leave each path's float
    operations as they were, so a group trains bit for bit as the kernel before them did
    (and a start equal to the global model, or every parameter trainable, changes nothing
    on the stacked path)."""
    before = _vectorized_before(tmp_path)
    for name, path in [("logreg", "sums"), ("mlp", "stacks"), ("mlp", "torch.func"),
                       ("cnn", "torch.func")]:
        torch.manual_seed(1)
        model = FlatModel(_phase_model(name))
        w0 = model.flat.clone()
        data = _clients(MODELS.get(name, (1, 6, 6)), 5, [9, 3, 6, 14])
        linear = 1e-3 * torch.randn(4, model.num_params,
                                    generator=torch.Generator().manual_seed(3))
        kw = {"lrs": [0.1, 0.05, 0.2, 0.08], "seeds": [1, 2, 3, 4], "batch_size": 4,
              "local_epochs": 2, "local_steps": None,
              "terms": LocalTerms(proximal=0.1, linear=linear), **PATH_OPTIONS[path]}
        old = before.vmap_local_sgd(model, w0, data, **kw)
        new = vmap_local_sgd(model, w0, data, **kw)
        assert new.path == old.path == path
        assert torch.equal(new.deltas, old.deltas) and new.rows == old.rows, (name, path)
        assert new.loss_sums == old.loss_sums and new.opt_state is None
        if name != "mlp":
            continue
        same = [vmap_local_sgd(model, w0, data, trainable=[True] * len(model.param_list),
                               optimizer=ClientOptimizer("sgd"), **kw)]
        if path == "stacks":  # a start equal to x: only FirstLayerSums would change
            same.append(vmap_local_sgd(model, w0, data, starts=w0.expand(4, -1), **kw))
        for got in same:
            assert torch.equal(got.deltas, old.deltas), (name, path)


def _phase_sequential(model, w0, data, lrs, seeds, *, starts=None, opt_state=None, **kw):
    """Each client through sequential.local_sgd with the same hooks (one start and one
    optimizer state each: row i of the group's)."""
    deltas, results = [], []
    terms = kw.pop("terms", LocalTerms())
    for i, ((x, y), lr, seed) in enumerate(zip(data, lrs, seeds, strict=True)):
        linear = None if terms.linear is None else terms.linear[i]
        state = None if opt_state is None else {k: v[i] for k, v in opt_state.items()}
        res = local_sgd(model, w0, x, y, lr=lr, seed=seed, delta_out=torch.empty_like(w0),
                        terms=LocalTerms(proximal=terms.proximal, linear=linear),
                        start=None if starts is None else starts[i], opt_state=state, **kw)
        deltas.append(res.delta.clone())
        results.append(res)
    return torch.stack(deltas), results


def _phase_model(name):
    """logreg and the MLP (LinearChains), or a conv net small enough for a fast test (the
    torch.func step)."""
    if name != "cnn":
        return build_model(name, MODELS[name], 5)
    return nn.Sequential(nn.Conv2d(1, 3, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(3 * 2 * 2, 5))


def _phase_case(name, sizes=(9, 3, 0, 6, 14)):
    torch.manual_seed(1)
    model = FlatModel(_phase_model(name))
    w0 = model.flat.clone()
    data = _clients(MODELS.get(name, (1, 6, 6)), 5, list(sizes))
    g = torch.Generator().manual_seed(7)
    # each client starts elsewhere: the global model moved by a personal offset
    starts = w0 + 0.05 * torch.randn(len(sizes), model.size, generator=g)
    linear = 1e-3 * torch.randn(len(sizes), model.num_params, generator=g)
    kw = {"lrs": [0.1, 0.05, 0.1, 0.2, 0.08][:len(sizes)],
          "seeds": [11, 12, 13, 14, 15][:len(sizes)], "batch_size": 4, "local_epochs": 2,
          "local_steps": None, "terms": LocalTerms(proximal=0.1, linear=linear)}
    return model, w0, data, starts, kw


def _check(model, w0, data, kw, vector_kw, steps_slack=0, **hooks):
    """The group against each client trained alone with the same hooks, at ULPS_PER_STEP
    ulps of the weights' size per local step (as every other path of this kernel): the two
    ways sum the same gradient in another order, and the hooks add only elementwise
    arithmetic (a momentum buffer, Adam's moments, a norm's scale), which rounds alike in
    both up to an ulp of what it scales."""
    expected, results = _phase_sequential(model, w0, data, kw["lrs"], kw["seeds"],
                                          **{k: v for k, v in kw.items()
                                             if k not in ("lrs", "seeds")}, **hooks)
    got = vmap_local_sgd(model, w0, data, **kw, **vector_kw, **hooks)
    deltas = torch.stack([got.delta(i) for i in range(len(data))])
    atol = _atol(w0, expected, max(r.steps for r in results) + steps_slack)
    assert torch.allclose(deltas, expected, atol=atol, rtol=0), (
        float((deltas - expected).abs().max()), atol)
    assert got.loss_sums == pytest.approx([r.loss_sum for r in results], rel=1e-5, abs=1e-6)
    assert got.steps == [r.steps for r in results]
    return got, results, expected


@pytest.mark.parametrize(("name", "path"), [("logreg", "stacks"), ("mlp", "stacks"),
                                            ("mlp", "torch.func"), ("cnn", "torch.func")])
def test_each_client_starts_from_its_own_weights(name, path):
    """``starts``: row i is client i's start; the delta is still y - x and the proximal
    pull still toward x (the broadcast model). FirstLayerSums, which describes the first
    layer as the global weight plus a delta, is not used even when asked for."""
    model, w0, data, starts, kw = _phase_case(name)
    options = {"defer_first": True} if path == "stacks" else PATH_OPTIONS[path]
    got, _, expected = _check(model, w0, data, kw, options, starts=starts)
    assert got.path == path
    # the client without examples reports where it started (it took no step)
    assert torch.equal(got.delta(2), starts[2] - w0)
    plain = vmap_local_sgd(model, w0, data, **kw, **options)
    assert (plain.deltas - got.deltas).abs().max() > 1e-2  # the starts mattered


def test_starts_that_differ_past_the_first_weight_keep_first_layer_sums():
    """A start that is the global model but for the bias (a local bias, FedPer's on
    logistic regression) keeps FirstLayerSums, which trains the weight from the global one;
    each client's bias starts from its own, and the group trains as each client alone
    does. One changed weight entry sends the group to the stack."""
    model, w0, data, starts, kw = _phase_case("logreg")
    weight = model.module[1].weight.numel()
    starts[:, :weight] = w0[:weight]  # the flat layout: 1.weight, then 1.bias
    got, _, _ = _check(model, w0, data, kw, {"defer_first": True}, starts=starts)
    assert got.path == "sums"
    assert torch.equal(got.delta(2), starts[2] - w0)  # no examples: where it started
    starts[3, 5] += 1e-3
    assert vmap_local_sgd(model, w0, data, **kw, defer_first=True,
                          starts=starts).path == "stacks"


@pytest.mark.parametrize(("name", "path", "frozen"), [
    ("logreg", "stacks", "1.weight"),  # the bias alone trains
    ("mlp", "stacks", "1."),  # the first Linear frozen: backward stops above it
    ("mlp", "stacks", "3."),  # the output layer frozen: backward passes through it
    ("mlp", "torch.func", "1."),
    ("cnn", "torch.func", "0."),  # the convolution frozen: the dense head trains
])
def test_frozen_parameters_take_no_step(name, path, frozen):
    """``trainable``: a frozen parameter does not move (its terms included: both the
    proximal pull and the linear term are on), the others train as the sequential kernel
    trains them."""
    model, w0, data, starts, kw = _phase_case(name)
    names = [n for n, _ in model.module.named_parameters()]
    trainable = [not n.startswith(frozen) for n in names]
    assert 0 < sum(trainable) < len(trainable), names
    got, _, expected = _check(model, w0, data, kw, PATH_OPTIONS[path], starts=starts,
                              trainable=trainable)
    assert got.path == path
    for k, part in enumerate(model.split(torch.arange(model.num_params))):
        cols = part.reshape(-1)
        moved = (got.deltas[got.rows][:, cols] - (starts[:, cols] - w0[cols])).abs().max()
        assert (moved == 0) != trainable[k], (names[k], float(moved))


@pytest.mark.parametrize(("name", "path"), [("mlp", "stacks"), ("cnn", "torch.func")])
@pytest.mark.parametrize("kind", ["momentum", "adam"])
def test_client_optimizer_state_carries_over(name, path, kind):
    """``optimizer`` with ``opt_state``: a heavy-ball or Adam step from each client's own
    stored tensors (row i client i's; the clients' moments differ), returned afterwards in
    the rows of the deltas, as the sequential kernel returns one client's. Adam's eps is
    1e-3 here: with the default 1e-8 its step is lr m/sqrt(v), the size of lr whatever the
    gradient's size, so a gradient entry that is 0 up to rounding (1e-9 one way, -1e-9 the
    other) steps by +lr or -lr; any two ways of summing the gradient may differ there."""
    model, w0, data, starts, kw = _phase_case(name)
    g = torch.Generator().manual_seed(9)
    n, p = len(data), model.num_params
    state = {"m": 0.01 * torch.randn(n, p, generator=g)}
    if kind == "adam":
        state["v"] = 1e-4 * torch.rand(n, p, generator=g)
        state["t"] = torch.tensor([[3.0], [0.0], [1.0], [7.0], [2.0]])
    optimizer = ClientOptimizer(kind, momentum=0.8, eps=1e-3)
    trainable = [True, True, False, True] if name == "mlp" else None
    got, results, _ = _check(model, w0, data, kw, PATH_OPTIONS[path], starts=starts,
                             trainable=trainable, optimizer=optimizer, opt_state=state)
    assert got.path == path  # the chain writes its gradients out for the optimizer
    assert set(got.opt_state) == set(state)
    for key, stacked in got.opt_state.items():
        for i, r in enumerate(results):
            want = r.opt_state[key].reshape(-1)
            atol = 0 if key == "t" else f32_atol(want, ulps=ULPS_PER_STEP * (r.steps + 1))
            assert torch.allclose(stacked[got.rows[i]], want, atol=atol, rtol=0), (key, i)
    if kind == "adam":
        assert got.opt_state["t"][got.rows[3], 0] == 7.0 + results[3].steps
    if trainable is not None:  # a frozen parameter's moments stay as they came
        cols = torch.arange(p).split([q.numel() for q in model.param_list])[2]
        assert torch.equal(got.opt_state["m"][got.rows][:, cols], state["m"][:, cols])
    plain = vmap_local_sgd(model, w0, data, **kw, starts=starts, trainable=trainable)
    assert (plain.deltas - got.deltas).abs().max() > 1e-3  # the optimizer mattered


@pytest.mark.parametrize(("name", "transform", "path"), [
    ("logreg", ClipNorm(0.5), "stacks"), ("mlp", Normalize(), "stacks"),
    ("cnn", ClipNorm(0.5), "torch.func"),
    ("mlp", ClipNorm(0.3, per_example=True), "torch.func"),
    ("cnn", ClipNorm(0.3, per_example=True), "torch.func")],
    ids=["logreg-clip", "mlp-normalize", "cnn-clip", "mlp-clip-per-example",
         "cnn-clip-per-example"])
def test_gradient_transform_per_batch_and_per_example(name, transform, path):
    """``transform`` under vmap over the group: per batch on the gradient with the terms,
    per example on each example's gradient (padding left out of the mean) before the
    terms, as sequential.local_sgd applies it; a chain writes its gradients out for a
    per-batch transform, and leaves per-example ones to torch.func, whether asked for the
    closed form or not. The thresholds bind: the result differs from training without the
    transform."""
    model, w0, data, starts, kw = _phase_case(name)
    trainable = [True] * (len(model.param_list) - 1) + [False]
    got, _, _ = _check(model, w0, data, kw, {}, trainable=trainable, transform=transform)
    assert got.path == path
    plain = vmap_local_sgd(model, w0, data, **kw, trainable=trainable)
    assert (plain.deltas - got.deltas).abs().max() > 1e-3


def test_per_example_gradients_of_a_large_group_are_taken_in_chunks(monkeypatch):
    """A group whose per-example gradients ([clients, batch, P]) exceed GROUP_BYTES takes
    them a few clients at a time (here one: a budget of 1 byte); each client's result is
    still its sequential one."""
    import fedray.kernels.vectorized as vectorized

    monkeypatch.setattr(vectorized, "GROUP_BYTES", {"cpu": 1, "gpu": 1})
    model, w0, data, _, kw = _phase_case("logreg")
    got, _, _ = _check(model, w0, data, kw, {}, transform=ClipNorm(0.3, per_example=True))
    assert got.path == "torch.func"
