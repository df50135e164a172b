"""Dropout masks drawn per client (fedray/kernels/dropout.py): torch's own masks on the CPU,
the same masks in the sequential and the vectorized kernel, whatever the group, and hence
vectorized training of dropout models equal to sequential training up to the rounding of
the batched products."""

import pytest
import torch
import torch.nn.functional as F
from tolerance import ULPS_PER_STEP, f32_atol
from torch import nn

import fedray.kernels.dropout as dropout
import fedray.kernels.vectorized as vectorized
from fedray.algorithms.base import ClientOptimizer, ClipNorm
from fedray.core.flat_model import FlatModel
from fedray.core.models import build_model
from fedray.kernels.dropout import ClientDropout
from fedray.kernels.sequential import local_sgd
from fedray.kernels.vectorized import (
    batch_failure,
    unsupported_reason,
    vectorize_plan,
    vmap_local_sgd,
)

# (layer, input shape): every kind, batched and the shapes torch treats as unbatched
LAYERS = [(nn.Dropout(0.5), (6, 5)), (nn.Dropout(0.25), (4, 3, 5, 5)),
          (nn.Dropout(1 / 3, inplace=True), (7, 9)),
          (nn.Dropout1d(0.3), (6, 4, 5)), (nn.Dropout1d(0.3), (12, 5)),
          (nn.Dropout2d(0.4), (5, 3, 4, 4)), (nn.Dropout2d(0.4, inplace=True), (5, 3, 4, 4)),
          (nn.Dropout3d(0.2), (4, 4, 3, 3, 3)), (nn.Dropout3d(0.2), (12, 3, 3, 3))]


@pytest.mark.parametrize(("layer", "shape"), LAYERS,
                         ids=[f"{type(m).__name__}-{len(s)}d{'-inplace' if m.inplace else ''}"
                              for m, s in LAYERS])
def test_the_cpu_masks_are_torchs_own(layer, shape):
    """A client's generator seeded with its seed draws torch's own masks, bit for bit, in
    the forward and the backward pass: the sequential kernel's results of dropout models
    (pinned elsewhere, e.g. tests/kernels/test_sequential.py) do not change."""
    layer.train()
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    outs, grads = [], []
    for ours in (False, True):
        xi = x.clone().requires_grad_(True)
        h = xi * 1.0  # an inplace layer needs a non-leaf input
        torch.manual_seed(5)
        if ours:
            with ClientDropout(layer).drawing(torch.Generator().manual_seed(5)):
                out = layer(h)
        else:
            out = layer(h)
        (out * torch.arange(out.numel()).view(out.shape)).sum().backward()
        outs.append(out.detach())
        grads.append(xi.grad)
    assert torch.equal(outs[0], outs[1]) and torch.equal(grads[0], grads[1])
    assert (outs[1] == 0).any() and (outs[1] != 0).any()  # it did drop, and keep
    assert "forward" not in layer.__dict__  # the patch is gone


@pytest.mark.parametrize(("p", "training"), [(0.0, True), (1.0, True), (0.5, False)])
def test_p_0_p_1_and_eval_mode_as_torch_and_drawing_nothing(p, training):
    layer = nn.Dropout(p).train(training)
    x = torch.randn(4, 6)
    gen = torch.Generator().manual_seed(3)
    state = gen.get_state()
    with ClientDropout(layer).drawing(gen):
        out = layer(x)
    assert torch.equal(out, F.dropout(x, p, training))
    assert torch.equal(gen.get_state(), state)
    assert ClientDropout(layer).calls(x[0]) == []  # no call that draws


def test_the_patch_is_removed_when_the_forward_fails():
    class Fails(nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = nn.Dropout(0.5)

        def forward(self, x):
            self.drop(x)
            raise RuntimeError("boom")

    model = Fails()
    with pytest.raises(RuntimeError, match="boom"), ClientDropout(model).drawing(None):
        model(torch.ones(2, 3))
    assert "forward" not in model.drop.__dict__


def _mlp_dropout():
    """A small MLP with dropout (not a LinearChain: the torch.func step)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(36, 24), nn.ReLU(), nn.Dropout(0.5),
                         nn.Linear(24, 5))


def _conv_dropout2d():
    """Channel (feature) dropout: masks of shape [batch, channels, 1, 1]."""
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Dropout2d(0.3), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(4 * 2 * 2, 5))


# emnist_cnn on 12x12 inputs (the TFF EMNIST CNN's layers, with 64 * 4 * 4 inputs to fc128)
MODELS = {"emnist_cnn": (lambda: build_model("emnist_cnn", (1, 12, 12), 5), (1, 12, 12)),
          "mlp_dropout": (_mlp_dropout, (1, 6, 6)),
          "conv_dropout2d": (_conv_dropout2d, (1, 6, 6))}


def _clients(shape, sizes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn((n, *shape), generator=g), torch.randint(0, 5, (n,), generator=g))
            for n in sizes]


def _setup(name, sizes):
    make, shape = MODELS[name]
    torch.manual_seed(1)
    model = FlatModel(make())
    return model, model.flat.clone(), _clients(shape, sizes)


class _Recorder:
    """The masks each kernel draws: the sequential kernel's ``draw_`` results in order,
    and the vectorized kernel's ``draw_masks`` stacks, one tuple per step."""

    def __init__(self, monkeypatch):
        self.sequential, self.vectorized = [], []
        real_draw, real_masks = dropout.draw_, vectorized.draw_masks

        def draw_(noise, p, gen):
            out = real_draw(noise, p, gen)
            self.sequential.append(out.clone())
            return out

        def draw_masks(calls, gens, lengths, width, device):
            out = real_masks(calls, gens, lengths, width, device)
            self.vectorized.append((list(lengths), [m.clone() for m in out]))
            return out

        monkeypatch.setattr(dropout, "draw_", draw_)
        monkeypatch.setattr(vectorized, "draw_masks", draw_masks)

    def client_masks(self, row):
        """A vectorized client's masks (training row ``row``), each cut to its real batch."""
        return [m[row, :lengths[row]] for lengths, ms in self.vectorized
                if row < len(lengths) for m in ms]


KW = {"batch_size": 4, "local_epochs": 2, "local_steps": None}


def _sequential(model, w0, data, lrs, seeds, **kw):
    return [local_sgd(model, w0, x, y, lr=lr, seed=s, delta_out=torch.empty_like(w0), **kw)
            for (x, y), lr, s in zip(data, lrs, seeds, strict=True)]


@pytest.mark.parametrize("name", MODELS)
def test_vectorized_dropout_equals_sequential(name, monkeypatch):
    """Every client of a group gets its sequential update, with the same masks bit for bit.

    Tolerance: the masks are the same floats (0 or the one float32 1/(1-p), multiplied in
    both kernels into the same activations), so dropout adds no rounding difference of its
    own; what differs is the batched products' summation order, as for models without
    dropout (tests/kernels/test_vectorized.py): ULPS_PER_STEP float32 ulps of the weights'
    size per local step, and one step more for the delta's rounding. Wrong masks (another
    client's seed) are thousands of times further off, checked below."""
    model, w0, data = _setup(name, [13, 3, 0, 9, 25])
    lrs, seeds = [0.1, 0.05, 0.1, 0.2, 0.08], [11, 12, 13, 14, 15]
    rec = _Recorder(monkeypatch)
    results = _sequential(model, w0, data, lrs, seeds, **KW)
    drawn = list(rec.sequential)  # (draw_masks draws through draw_ too)
    got = vmap_local_sgd(model, w0, data, lrs=lrs, seeds=seeds, **KW)
    assert got.path == "torch.func"
    per_call = len(drawn) // sum(r.steps for r in results)  # dropout calls per forward
    assert per_call == (2 if name == "emnist_cnn" else 1)
    at = 0
    for i, r in enumerate(results):
        mine = drawn[at:at + per_call * r.steps]
        at += len(mine)
        theirs = rec.client_masks(got.rows[i])
        assert len(theirs) == len(mine)
        assert all(torch.equal(a, b) for a, b in zip(mine, theirs, strict=True)), i
        atol = f32_atol(w0, w0 + r.delta, ulps=ULPS_PER_STEP * (r.steps + 1))
        assert torch.allclose(got.delta(i), r.delta, atol=atol, rtol=0), (
            i, float((got.delta(i) - r.delta).abs().max()), atol)
        assert got.steps[i] == r.steps and got.examples_seen[i] == r.examples_seen
    assert got.loss_sums == pytest.approx([r.loss_sum for r in results], rel=1e-5, abs=1e-6)
    # the bound is far below what other masks change
    other = _sequential(model, w0, data[:1], lrs[:1], [99], **KW)[0]
    assert (other.delta - results[0].delta).abs().max() > 1000 * f32_atol(
        w0, w0 + results[0].delta, ulps=ULPS_PER_STEP * (results[0].steps + 1))


def test_a_clients_masks_and_update_do_not_depend_on_its_group(monkeypatch):
    """The same client alone, in a group of 2 and in a group of 5 with other clients
    (other batch widths, other step counts around it): its masks are bit for bit the same,
    and its update differs only by the rounding of batched products of other shapes, at
    the bound of test_vectorized_dropout_equals_sequential."""
    model, w0, data = _setup("emnist_cnn", [10, 31, 2, 17, 6])
    me = data[0]
    groups = {"alone": ([me], [7], 4), "pair": ([data[2], me], [3, 7], 4),
              "five": ([data[1], data[3], me, data[4], data[2]], [1, 2, 7, 5, 3], 6)}
    masks, deltas, steps = {}, {}, {}
    for key, (clients, seeds, batch) in groups.items():
        rec = _Recorder(monkeypatch)
        k = seeds.index(7)
        got = vmap_local_sgd(model, w0, clients, lrs=[0.1] * len(clients), seeds=seeds,
                             batch_size=[batch if c is not me else 4 for c in clients],
                             local_epochs=2, local_steps=None)
        masks[key] = rec.client_masks(got.rows[k])
        deltas[key], steps[key] = got.delta(k).clone(), got.steps[k]
    assert len(masks["alone"]) == 2 * steps["alone"] > 0
    for key in ("pair", "five"):
        assert all(torch.equal(a, b) for a, b in zip(masks["alone"], masks[key], strict=True))
        atol = f32_atol(w0, w0 + deltas["alone"], ulps=ULPS_PER_STEP * (steps[key] + 1))
        assert torch.allclose(deltas[key], deltas["alone"], atol=atol, rtol=0), (
            key, float((deltas[key] - deltas["alone"]).abs().max()), atol)


@pytest.mark.parametrize("kind", ["sgd", "momentum", "adam"])
def test_very_different_step_counts_train_in_one_step_sequence(kind, monkeypatch):
    """Clients of 1 to 60 examples (1 to 30 steps) train in one sequence of batched steps,
    longest first: step t computes exactly the clients that still have a step t (a prefix
    of the group, the finished ones left out), each with its own masks and optimizer
    state, and each equals its sequential update (bound: as above)."""
    model, w0, data = _setup("mlp_dropout", [60, 1, 7, 33, 2])
    seeds = [4, 5, 6, 7, 8]
    optimizer = None if kind == "sgd" else ClientOptimizer(kind, momentum=0.8, eps=1e-3)
    kw = {**KW, "optimizer": optimizer}
    results = _sequential(model, w0, data, [0.05] * 5, seeds, **kw)
    rec = _Recorder(monkeypatch)
    got = vmap_local_sgd(model, w0, data, lrs=[0.05] * 5, seeds=seeds, **kw)
    steps = [r.steps for r in results]
    assert steps == [30, 2, 4, 18, 2] and got.steps == steps
    active = [sum(s > t for s in steps) for t in range(max(steps))]
    assert [len(lengths) for lengths, _ in rec.vectorized] == active  # one call per step
    widths = {m.shape[1] for _, ms in rec.vectorized for m in ms}
    assert widths == {4}  # padded to the batch size, not wider
    for i, r in enumerate(results):
        atol = f32_atol(w0, w0 + r.delta, ulps=ULPS_PER_STEP * (r.steps + 1))
        assert torch.allclose(got.delta(i), r.delta, atol=atol, rtol=0), (
            i, float((got.delta(i) - r.delta).abs().max()), atol)
        if optimizer is not None:
            for key, stacked in got.opt_state.items():
                want = r.opt_state[key].reshape(-1)
                tol = 0 if key == "t" else f32_atol(want, ulps=ULPS_PER_STEP * (r.steps + 1))
                assert torch.allclose(stacked[got.rows[i]], want, atol=tol, rtol=0)


def test_per_example_transform_with_dropout(monkeypatch):
    """A per-example gradient transform (DP-SGD's clipping) sees each example through its
    rows of the batch's masks, in both kernels: the same masks as a step without the
    transform, and the same update up to rounding (bound: as above; the clip's scale is
    elementwise arithmetic, rounding alike in both up to an ulp of what it scales)."""
    model, w0, data = _setup("mlp_dropout", [9, 3, 6])
    seeds, clip = [1, 2, 3], ClipNorm(0.3, per_example=True)
    rec = _Recorder(monkeypatch)
    results = _sequential(model, w0, data, [0.1] * 3, seeds, **KW, transform=clip)
    plain = _sequential(model, w0, data[:1], [0.1], seeds[:1], **KW)[0]
    # the per-example steps drew what the plain client's steps drew
    n = len(rec.sequential)
    _sequential(model, w0, data[:1], [0.1], seeds[:1], **KW)
    first = results[0].steps
    assert all(torch.equal(a, b) for a, b in
               zip(rec.sequential[:first], rec.sequential[n:n + first], strict=True))
    got = vmap_local_sgd(model, w0, data, lrs=[0.1] * 3, seeds=seeds, **KW, transform=clip)
    for i, r in enumerate(results):
        atol = f32_atol(w0, w0 + r.delta, ulps=ULPS_PER_STEP * (r.steps + 1))
        assert torch.allclose(got.delta(i), r.delta, atol=atol, rtol=0), (
            i, float((got.delta(i) - r.delta).abs().max()), atol)
    assert (plain.delta - results[0].delta).abs().max() > 1e-3  # the clip binds


class _FunctionalDropout(nn.Module):
    """Dropout called as a function: drawn from the global generator, not per client."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(F.dropout(x, 0.5, self.training))


class _MyDropout(nn.Dropout):
    """A subclass: its forward may be anything."""


def test_randomness_not_drawn_per_client_keeps_a_model_sequential():
    """AlphaDropout, a Dropout subclass and F.dropout in a forward are not drawn per
    client: the first two are refused by name, the third by the probe's batched step."""
    for layer, what in ((nn.AlphaDropout(0.2), "AlphaDropout"),
                        (nn.FeatureAlphaDropout(0.2), "FeatureAlphaDropout"),
                        (_MyDropout(0.2), "_MyDropout")):
        why = unsupported_reason(nn.Sequential(nn.Linear(4, 4), layer))
        assert why == f"it has dropout whose masks are not drawn per client (1: {what})"
    model = FlatModel(_FunctionalDropout())
    assert unsupported_reason(model.module) is None
    failure = batch_failure(model, (4,), "cross_entropy")
    assert failure is not None and "random" in failure
    on, why = vectorize_plan(model.module, "auto", gpu=True,
                             probe=lambda: batch_failure(model, (4,), "cross_entropy"))
    assert not on and "one batched step fails" in why
    for name in MODELS:  # while nn.Dropout(2d) models pass the probe
        model, _, data = _setup(name, [1])
        assert batch_failure(model, tuple(data[0][0].shape[1:]), "cross_entropy") is None


def test_the_benchmark_times_the_conv_sides_on_the_same_clients(capsys):
    """benchmarks/vectorized_step.py's convolutional mode: the plain loop, fedray
    sequential and torch.func in groups, each a rate and a ratio to the plain loop; and
    --against-sequential compares the torch.func side (the only one a CNN has)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "vectorized_step.py"
    spec = importlib.util.spec_from_file_location("vectorized_step", path)
    step = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(step)
    clients = step.make_clients(2)
    row, = step.measure_conv("emnist_cnn", clients, groups=[2], repeat=1)
    assert set(row["per_s"]) == {"raw loop", "sequential", "vectorized 2"}
    assert all(r > 0 for r in row["per_s"].values()) and row["vs_raw_loop"]["raw loop"] == 1
    assert "emnist_cnn 2 clients, 1 thread: raw loop" in capsys.readouterr().out
    row = step.against_sequential("emnist_cnn", clients, 2)
    torch.manual_seed(0)  # the benchmark's model, for the size of its weights
    w0 = FlatModel(build_model("emnist_cnn", step.SHAPE, step.CLASSES)).flat
    # at most 5 steps of 20 (30-90 examples): the bound of the tests above, of the size of
    # the weights after training, which one epoch at lr 0.05 keeps within twice the initial
    assert row["torch_func_max_diff"] <= f32_atol(2 * w0, ulps=ULPS_PER_STEP * (5 + 1))
