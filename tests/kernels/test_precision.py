"""runtime.precision in the kernels (fedray/kernels/precision.py): fp32 is the float32 path
unchanged; bf16 runs each step's forward under bfloat16 autocast and stays within
bfloat16's rounding of the float32 update.

Why the tolerance is what it is: bfloat16 keeps 8 significant bits, so rounding a value to it
moves it by at most u = 2^-8 of its size (half an ulp of 2^-7). One local step of a model of
two layers passes its values through 4 autocast products (each layer's forward, and the
backward of each through the bfloat16 inputs the forward saved), each of which rounds its
inputs and its output once: errors of about u apiece relative to the size of what flows
through, which add up to a few u of the gradient's size (measured: 0.8-1.5 u of max|delta|
on these models, over 3 seeds, 1 and 4 steps). The bound is BF16_ULPS = 4 u per step,
relative to the delta's largest entry. A wrong formula (a missing term, a wrong sign, the
loss taken at the wrong weights) is off by the delta's own size: 256 u.

The models here are smooth (Tanh): a ReLU whose input lies within bfloat16's rounding of 0
switches its unit on or off, which moves that unit's gradient by its whole size (measured:
16% of max|delta| after one MLP step), so no elementwise bound holds for ReLU models; how such
a model's accuracy fares in bf16 is measured on whole runs (docs/performance.md)."""

from __future__ import annotations

import pytest
import torch
from tolerance import ULPS_PER_STEP, f32_atol
from torch import nn

from fedray.algorithms.base import ClipNorm, LocalTerms
from fedray.core.flat_model import FlatModel
from fedray.kernels.precision import PRECISIONS, forward, precision_context
from fedray.kernels.sequential import local_sgd
from fedray.kernels.vectorized import vmap_local_sgd

U = 2.0 ** -8  # bfloat16's unit roundoff: 8 significant bits, rounded to nearest
BF16_ULPS = 4  # u per step, relative to max|delta| (module docstring)


def _model(kind: str, seed: int = 0) -> FlatModel:
    torch.manual_seed(seed)
    if kind == "mlp":
        net = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 10))
    else:
        net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.Tanh(), nn.Flatten(),
                            nn.Linear(4 * 6 * 6, 10))
    return FlatModel(net)


def _data(n: int = 40, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g)


def _update(model, w, x, y, steps, **kw):
    return local_sgd(model, w, x, y, lr=0.1, batch_size=10, local_epochs=1, local_steps=steps,
                     seed=3, delta_out=torch.empty_like(w), **kw)


def test_fp32_is_the_float32_path_bit_for_bit():
    """precision=fp32 enters no context and casts nothing: the same floats as a call that
    does not name it (every preset's pinned weights rest on that)."""
    model = _model("cnn")
    w = model.flat.clone()
    x, y = _data()
    plain = _update(model, w, x, y, 4)
    d0, loss0 = plain.delta.clone(), plain.loss_sum
    named = _update(model, w, x, y, 4, precision="fp32")
    assert torch.equal(named.delta, d0) and named.loss_sum == loss0
    group = [(x, y), (x[:30], y[:30])]
    kw = dict(lrs=[0.1, 0.1], batch_size=10, local_epochs=1, local_steps=4, seeds=[3, 4],
              closed_form=False)
    a = vmap_local_sgd(model, w, group, **kw)
    b = vmap_local_sgd(model, w, group, precision="fp32", **kw)
    assert torch.equal(a.deltas, b.deltas) and a.loss_sums == b.loss_sums


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
@pytest.mark.parametrize("steps", [1, 4])
def test_bf16_update_is_the_fp32_update_to_bfloat16_rounding(kind, steps):
    """One client's update in bf16 against fp32, sequential and vectorized (torch.func):
    within BF16_ULPS u per step of the delta's size, and not the fp32 update (autocast ran:
    more than float32's own rounding of two ways of computing it)."""
    model = _model(kind)
    w = model.flat.clone()
    x, y = _data()
    ref = _update(model, w, x, y, steps).delta.clone()
    bound = BF16_ULPS * U * steps * float(ref.abs().max())
    low = f32_atol(w, w + ref, ulps=ULPS_PER_STEP * (steps + 1))  # float32-level difference
    seq = _update(model, w, x, y, steps, precision="bf16")
    assert seq.delta.dtype == torch.float32
    err = float((seq.delta - ref).abs().max())
    assert low < err <= bound, (err, bound)
    group = vmap_local_sgd(model, w, [(x, y), (x[:30], y[:30])], lrs=[0.1, 0.1],
                           batch_size=10, local_epochs=1, local_steps=steps, seeds=[3, 4],
                           closed_form=False, precision="bf16")
    err = float((group.delta(0) - ref).abs().max())
    assert group.path == "torch.func" and low < err <= bound, (err, bound)
    # the loss is float32's up to the same rounding of the logits (a few u of its size)
    assert abs(seq.loss_sum - _update(model, w, x, y, steps).loss_sum) <= (
        BF16_ULPS * U * steps * seq.loss_sum)


def test_bf16_is_the_same_floats_every_time():
    """A bf16 update depends only on the client: computed twice, after another client's
    training left the replica elsewhere, it is the same bit for bit (what makes a run's
    result independent of the worker that trains the client)."""
    model = _model("cnn")
    w = model.flat.clone()
    x, y = _data()
    first = _update(model, w, x, y, 4, precision="bf16").delta.clone()
    _update(model, w + 0.01, *_data(seed=5), 2, precision="bf16")
    assert torch.equal(_update(model, w, x, y, 4, precision="bf16").delta, first)


def test_bf16_reaches_the_phase_step_and_per_example_gradients():
    """The general step (_PhaseStep) and a per-example transform take the precision too:
    the update is fp32's to bfloat16 rounding and not fp32's."""
    model = _model("mlp")
    w = model.flat.clone()
    x, y = _data()
    for kw in ({"trainable": [True, True, False, True]},
               {"transform": ClipNorm(max_norm=1e3, per_example=True)}):
        ref = _update(model, w, x, y, 2, **kw).delta.clone()
        got = _update(model, w, x, y, 2, precision="bf16", **kw).delta
        err = float((got - ref).abs().max())
        assert 0 < err <= BF16_ULPS * U * 2 * float(ref.abs().max()), (kw, err)


def test_the_closed_form_chain_step_stays_float32():
    """chain_sgd_step writes its products out itself: bf16 leaves it float32, the same
    floats as fp32 (docs/performance.md, "Reduced precision", says why)."""
    torch.manual_seed(0)
    model = FlatModel(nn.Sequential(nn.Flatten(), nn.Linear(64, 10)))
    w = model.flat.clone()
    x, y = _data()
    kw = dict(lrs=[0.1], batch_size=10, local_epochs=1, local_steps=3, seeds=[3])
    a = vmap_local_sgd(model, w, [(x, y)], **kw)
    b = vmap_local_sgd(model, w, [(x, y)], precision="bf16", **kw)
    assert a.path != "torch.func" and torch.equal(a.deltas, b.deltas)


def test_forward_casts_back_and_names_the_choices():
    lin = nn.Linear(4, 3)
    x = torch.randn(2, 4)
    assert torch.equal(forward("fp32", "cpu", lin, x), lin(x))
    out = forward("bf16", "cpu", lin, x)
    assert out.dtype == torch.float32  # the loss after it is a float32 loss
    with precision_context("bf16", "cpu"):
        assert lin(x).dtype == torch.bfloat16
    assert PRECISIONS == ("fp32", "bf16")
    with pytest.raises(ValueError, match="fp32, bf16.*'fp16'"):
        precision_context("fp16", "cpu")


def test_terms_apply_in_bf16():
    """A proximal pull is added to the float32 gradient, as in fp32."""
    model = _model("mlp")
    w = model.flat.clone()
    x, y = _data()
    terms = LocalTerms(proximal=0.5)
    ref = _update(model, w, x, y, 3, terms=terms).delta.clone()
    got = _update(model, w, x, y, 3, terms=terms, precision="bf16").delta
    assert float((got - ref).abs().max()) <= BF16_ULPS * U * 3 * float(ref.abs().max())
