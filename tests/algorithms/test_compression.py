"""The compression stages (fedray/algorithms/compression.py) as the worker calls them: no Ray,
a fake WorkerEnv on the CPU, the client's state passed back as the client state store would
(a CPU copy of what the stage returned)."""

from __future__ import annotations

import pytest
import torch
from tolerance import F32_EPS

from fedray.algorithms.base import ClientContext, LocalUpdate, ParamError, Payload, WorkerEnv
from fedray.algorithms.compression import (
    Quantize,
    QuantizeParams,
    TopK,
    TopKParams,
    sent_count,
    stochastic_quantize,
    top_k,
    topk_with_feedback,
)
from fedray.core.flat_model import FlatModel
from fedray.core.seeding import TAG_QUANTIZE, derive_seed


def make_env(inputs: int = 50, outputs: int = 20) -> WorkerEnv:
    model = FlatModel(torch.nn.Linear(inputs, outputs), "cpu")
    return WorkerEnv(model=model, device=torch.device("cpu"), lr=0.1, loss="cross_entropy",
                     eval_batch_size=64, batch_size_for=lambda n: n)


def make_ctx(cid: int = 0, round_idx: int = 1, state: dict | None = None) -> ClientContext:
    return ClientContext(cid=cid, round=round_idx, seed=derive_seed(7, round_idx, cid),
                         x=torch.zeros(1, 1), y=torch.zeros(1), batch_size=1, state=state)


def make_update(delta: torch.Tensor) -> LocalUpdate:
    return LocalUpdate(delta=delta, num_examples=10, loss_sum=0.0, examples_seen=10, steps=1)


def stored(new: dict | None) -> dict | None:
    """What the client state store gives back next round: its own CPU copy."""
    return None if new is None else {k: v.detach().to("cpu", copy=True) for k, v in new.items()}


# -- top-k ------------------------------------------------------------------------------------


def test_top_k_keeps_exactly_the_k_largest():
    g = torch.Generator().manual_seed(0)
    v = torch.randn(1000, generator=g)
    for k in (1, 10, 999, 1000):
        idx, values = top_k(v, k)
        assert idx.numel() == k and len(set(idx.tolist())) == k
        assert torch.equal(values, v[idx])
        rest = torch.ones(1000, dtype=torch.bool)
        rest[idx] = False
        if k < 1000:  # every kept magnitude >= every dropped one
            assert values.abs().min() >= v[rest].abs().max()


def test_stage_without_feedback_sends_k_entries_unchanged():
    env = make_env()
    stage = TopK(TopKParams(fraction=0.07, error_feedback=False))
    assert stage.client_state == ()
    g = torch.Generator().manual_seed(1)
    before = torch.randn(env.model.size, generator=g)
    update = make_update(before.clone())
    assert stage.client_update(env, make_ctx(), update, None) is None
    k = sent_count(0.07, env.model.size)
    assert k == 72  # ceil(0.07 * 1020) = ceil(71.4)
    sent = update.delta != 0
    assert int(sent.sum()) == k
    assert torch.equal(update.delta[sent], before[sent])  # the values as they were
    assert before[sent].abs().min() >= before[~sent].abs().max()


def test_sent_count_reads_the_fraction_as_written():
    assert 0.07 * 100 > 7  # binary floating point: a naive ceil would send 8
    assert sent_count(0.07, 100) == 7
    assert sent_count(0.01, 1020) == 11
    assert sent_count(1.0, 5) == 5 and sent_count(1e-9, 5) == 1


def test_feedback_function_splits_v_exactly():
    g = torch.Generator().manual_seed(2)
    delta, residual = torch.randn(500, generator=g), torch.randn(500, generator=g)
    sent, new = topk_with_feedback(delta, residual, 25)
    v = delta + residual
    assert int((sent != 0).sum()) == 25
    assert torch.equal(sent + new, v)  # each entry in exactly one of the two, unchanged
    assert torch.equal(sent, torch.where(new == 0, v, torch.zeros_like(v)))


def test_error_feedback_loses_no_mass_over_rounds():
    """20 rounds of one client: sum of what it sent + its final residual == sum of its
    deltas. Splitting v into sent and residual is exact; the only rounding is v = delta +
    residual in float32 each round (half an ulp of |v| at most), so the identity holds to
    ROUNDS * eps * max|v| per coordinate, sums taken in float64. Losing a round's unsent
    entries (no feedback) is off by the size of the deltas themselves."""
    env = make_env()
    stage = TopK(TopKParams(fraction=0.05))
    assert stage.client_state == ("topk_residual",)
    rounds, n = 20, env.model.size
    g = torch.Generator().manual_seed(3)
    state, sent_sum, delta_sum, peak = None, torch.zeros(n, dtype=torch.float64), \
        torch.zeros(n, dtype=torch.float64), 0.0
    k = sent_count(0.05, n)
    for r in range(1, rounds + 1):
        delta = torch.randn(n, generator=g) * (1 + r)
        delta_sum += delta.double()
        residual = state["topk_residual"] if state else torch.zeros(n)
        peak = max(peak, float((delta + residual).abs().max()))
        # what the pure function computes from the same inputs: the stage's bits exactly
        ref_sent, ref_residual = topk_with_feedback(delta, residual, k)
        update = make_update(delta.clone())
        new = stage.client_update(env, make_ctx(round_idx=r, state=state), update, None)
        assert int((update.delta != 0).sum()) == k
        assert torch.equal(update.delta, ref_sent)
        assert torch.equal(new["topk_residual"], ref_residual)
        sent_sum += update.delta.double()
        state = stored(new) | {"other_part": torch.zeros(3)}  # the store keeps every part's
    lost = (sent_sum + state["topk_residual"].double() - delta_sum).abs().max()
    assert lost <= rounds * F32_EPS * peak
    assert float(state["topk_residual"].abs().max()) > 0  # something was held back


def test_first_round_state_without_the_residual_starts_at_zero():
    env = make_env()
    stage = TopK(TopKParams(fraction=0.1))
    g = torch.Generator().manual_seed(4)
    delta = torch.randn(env.model.size, generator=g)
    a, b = make_update(delta.clone()), make_update(delta.clone())
    ra = stage.client_update(env, make_ctx(state=None), a, None)["topk_residual"].clone()
    rb = stage.client_update(env, make_ctx(state={"c": torch.ones(2)}), b, None)
    assert torch.equal(a.delta, b.delta) and torch.equal(ra, rb["topk_residual"])
    assert torch.equal(a.delta + ra, delta)


def test_topk_params_are_checked():
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ParamError, match="fraction"):
            TopK(TopKParams(fraction=bad))


# -- quantization -----------------------------------------------------------------------------


def test_quantization_error_below_one_step():
    """Every entry moves by less than one step, (max - min) / (2**bits - 1), and lands on
    the grid lo + u step. The arithmetic is float32 ((v - lo) / step, then back): it adds a
    few ulps of the values' size, allowed as 4 * eps * max|v| -- far below a step (at 16
    bits a step is 2**-16 of the range, still ~60 times that here)."""
    g = torch.Generator().manual_seed(5)
    v = torch.randn(4096, generator=g) * 3
    lo, hi = float(v.min()), float(v.max())
    slack = 4 * F32_EPS * float(v.abs().max())
    for bits in (1, 2, 4, 8, 16):
        step = (hi - lo) / (2**bits - 1)
        q = stochastic_quantize(v, bits, torch.Generator().manual_seed(bits))
        assert q.dtype == torch.float32 and q.shape == v.shape
        assert float((q - v).abs().max()) < step + slack
        u = ((q.double() - lo) / step).round()
        assert float((q.double() - (lo + u * step)).abs().max()) <= slack  # on the grid
        assert u.min() >= 0 and u.max() <= 2**bits - 1
        assert len(torch.unique(q)) <= 2**bits


def test_quantization_is_unbiased():
    """The mean over 400 generator seeds is the value: each rounding is one of the two
    levels around v, with variance <= step**2 / 4, so the mean's standard error is at most
    step / (2 sqrt(400)) = step / 40; 6 standard errors (step * 0.15) bounds all 256 entries
    (a systematic bias, e.g. rounding to nearest, is up to half a step)."""
    g = torch.Generator().manual_seed(6)
    v = torch.rand(256, generator=g)
    bits, seeds = 2, 400
    step = float(v.max() - v.min()) / (2**bits - 1)
    mean = sum(stochastic_quantize(v, bits, torch.Generator().manual_seed(s)).double()
               for s in range(seeds)) / seeds
    assert float((mean - v.double()).abs().max()) < 6 * step / (2 * seeds**0.5)
    nearest = torch.round((v - v.min()) / step) * step + v.min()
    assert float((nearest - v).abs().max()) > 0.4 * step  # the bound can tell the two apart


def test_quantization_deterministic_given_the_seed():
    v = torch.randn(1000, generator=torch.Generator().manual_seed(7))
    a = stochastic_quantize(v, 4, torch.Generator().manual_seed(11))
    b = stochastic_quantize(v, 4, torch.Generator().manual_seed(11))
    c = stochastic_quantize(v, 4, torch.Generator().manual_seed(12))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(stochastic_quantize(torch.full((5,), 2.5), 3, torch.Generator()),
                       torch.full((5,), 2.5))  # constant: already on the grid


def test_quantize_stage_uses_the_clients_stream():
    env = make_env()
    stage = Quantize(QuantizeParams(bits=4))
    delta = torch.randn(env.model.size, generator=torch.Generator().manual_seed(8))
    ctx = make_ctx(cid=3, round_idx=2)
    update = make_update(delta.clone())
    assert stage.client_update(env, ctx, update, None) is None
    ref = stochastic_quantize(delta, 4, torch.Generator().manual_seed(
        derive_seed(ctx.seed, TAG_QUANTIZE)))
    assert torch.equal(update.delta, ref)
    again = make_update(delta.clone())
    stage.client_update(env, ctx, again, None)
    assert torch.equal(again.delta, ref)
    other = make_update(delta.clone())
    stage.client_update(env, make_ctx(cid=4, round_idx=2), other, None)
    assert not torch.equal(other.delta, ref)


def test_quantize_after_topk_keeps_the_unsent_entries_zero():
    env = make_env()
    delta = torch.randn(env.model.size, generator=torch.Generator().manual_seed(9))
    update = make_update(delta)
    TopK(TopKParams(fraction=0.1, error_feedback=False)).client_update(env, make_ctx(),
                                                                       update, None)
    sent = update.delta != 0
    values = update.delta[sent].clone()
    ctx = make_ctx()
    Quantize(QuantizeParams(bits=3)).client_update(env, ctx, update, None)
    assert bool((update.delta[~sent] == 0).all())
    ref = stochastic_quantize(values, 3, torch.Generator().manual_seed(
        derive_seed(ctx.seed, TAG_QUANTIZE)))
    assert torch.equal(update.delta[sent], ref)


def test_quantize_params_are_checked():
    for bad in (0, 17):
        with pytest.raises(ParamError, match="bits"):
            Quantize(QuantizeParams(bits=bad))


# -- payload ----------------------------------------------------------------------------------


def test_payloads():
    dense = Payload(values=1000)
    assert dense.bytes == 4000
    top = TopK(TopKParams(fraction=0.07)).payload(dense)
    assert top == Payload(values=70, value_bits=32, index_bits=32)
    assert top.bytes == 70 * 8
    q = Quantize(QuantizeParams(bits=8))
    assert q.payload(dense) == Payload(values=1000, value_bits=8, overhead_bytes=8)
    assert q.payload(dense).bytes == 1000 + 8
    both = q.payload(top)  # topk, then quantize: 70 values of 8 bits, 32-bit indices
    assert both == Payload(values=70, value_bits=8, index_bits=32, overhead_bytes=8)
    assert both.bytes == 70 * 5 + 8
    assert Quantize(QuantizeParams(bits=3)).payload(Payload(values=5)).bytes == 2 + 8
