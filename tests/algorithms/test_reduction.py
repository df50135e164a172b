"""Partial sums: merging worker partials equals one pass, for plain, scaled (Exp-alpha) and
extra (SCAFFOLD / Elastic) sums; the driver-side finishing steps by hand."""

import math

import numpy as np
import torch

from fedray.algorithms.base import extra_sizes
from fedray.algorithms.elastic import elastic_scale
from fedray.algorithms.expalpha import expalpha_log_weight
from fedray.algorithms.reduction import PartialSum
from fedray.algorithms.scaffold import ScaffoldAggregator, ScaffoldClient
from fedray.algorithms.server_opt import ServerSGD


def _split_merge(items, size, parts=3, extra=0):
    """Fold items (value, weight, log_scale, extra) into `parts` partials, then merge."""
    extras = {"e": extra} if extra else {}
    partials = [PartialSum(size, extras=extras) for _ in range(parts)]
    for i, (v, w, s, e) in enumerate(items):
        partials[i % parts].add(v, w, s)
        if e is not None:
            partials[i % parts].add_extra("e", e, w)
    merged = PartialSum(size, extras=extras)
    for p in partials:
        merged.merge(p.to_message())
    return merged


def test_partial_sums_equal_one_pass():
    rng = np.random.default_rng(0)
    deltas = [torch.from_numpy(rng.normal(size=10).astype(np.float32)) for _ in range(9)]
    weights = rng.integers(1, 100, size=9).astype(float)
    whole = PartialSum(10)
    for d, w in zip(deltas, weights, strict=True):
        whole.add(d, w)
    merged = _split_merge([(d, w, 0.0, None) for d, w in zip(deltas, weights, strict=True)], 10)
    expected = sum(w * d.double() for d, w in zip(deltas, weights, strict=True)) / weights.sum()
    torch.testing.assert_close(merged.mean(), expected)
    # one pass against 3 partials merged: float64 sums of the same 9 terms grouped otherwise,
    # off by at most 9 float64 ulps of sum_k w_k |d_k| (then divided by sum_k w_k)
    scale = sum(w * d.double().abs() for d, w in zip(deltas, weights, strict=True))
    atol = 9 * np.finfo(np.float64).eps * float(scale.max()) / weights.sum()
    torch.testing.assert_close(whole.mean(), merged.mean(), rtol=0, atol=atol)


def test_scaled_partials_are_a_softmax_without_overflow():
    """(max, scaled sum) merging gives softmax weights, also for scores around 1e4."""
    rng = np.random.default_rng(1)
    deltas = [torch.from_numpy(rng.normal(size=6)) for _ in range(7)]
    for scale in (1.0, 1e4):
        scores = rng.normal(size=7) * scale
        merged = _split_merge([(d, 1.0, float(s), None) for d, s in zip(deltas, scores,
                                                                          strict=True)], 6)
        rho = np.exp(scores - scores.max())
        rho /= rho.sum()
        expected = sum(r * d for r, d in zip(rho, deltas, strict=True))
        mean = merged.mean()
        assert torch.isfinite(mean).all()
        torch.testing.assert_close(mean, expected, rtol=1e-12, atol=1e-12)


def test_empty_partial_merges_as_nothing():
    a = PartialSum(3)
    a.add(torch.ones(3), 2.0)
    a.merge(PartialSum(3).to_message())
    torch.testing.assert_close(a.mean(), torch.ones(3, dtype=torch.float64))


def test_expalpha_log_weight():
    assert expalpha_log_weight(2.0, 1.5, 0.25) == -2.0


def test_elastic_scale_by_hand():
    omega = torch.tensor([0.0, 1.0, 4.0], dtype=torch.float64)
    torch.testing.assert_close(elastic_scale(omega, 0.5),
                               torch.tensor([1.5, 1.25, 0.5], dtype=torch.float64))
    torch.testing.assert_close(elastic_scale(torch.zeros(2, dtype=torch.float64), 0.5),
                               torch.full((2,), 1.5, dtype=torch.float64))


def test_scaffold_finish_updates_c_by_population():
    agg = ScaffoldAggregator()
    agg.init_server(num_params=3, population=10)
    sizes = extra_sizes((ScaffoldClient(), agg), 3)
    assert sizes == {"dc": 3}
    acc = PartialSum(4, extras=sizes)
    acc.add(torch.tensor([1.0, 2.0, 3.0, 4.0]), 1.0)
    acc.add(torch.tensor([3.0, 2.0, 1.0, 0.0]), 1.0)
    acc.add_extra("dc", torch.tensor([1.0, -2.0, 0.5]))
    acc.add_extra("dc", torch.tensor([1.0, 0.0, 0.5]))
    delta = agg.finish(acc)
    torch.testing.assert_close(delta, torch.tensor([2.0, 2.0, 2.0, 2.0], dtype=torch.float64))
    torch.testing.assert_close(agg.state["c"], torch.tensor([0.2, -0.2, 0.1]))
    state = agg.state_dict()
    other = ScaffoldAggregator()
    other.init_server(num_params=3, population=10)
    other.load_state_dict(state)
    assert np.array_equal(other.broadcast()["c"].numpy(), state["c"].numpy())


def test_server_sgd():
    w = torch.tensor([1.0, 2.0])
    out = ServerSGD(0.5).step(w, torch.tensor([2.0, -4.0], dtype=torch.float64))
    assert out.dtype == torch.float32 and torch.equal(out, torch.tensor([2.0, 0.0]))


def test_log_scale_starts_empty():
    p = PartialSum(2)
    assert p.log_scale == -math.inf and p.weight == 0.0


def test_an_empty_partial_into_an_empty_sum_stays_zero():
    """Two workers whose clients all dropped: merging their empty partials must not turn
    exp(-inf - -inf) into NaN, nor count anything."""
    a = PartialSum(3, extras={"e": 2})
    a.merge(PartialSum(3, extras={"e": 2}).to_message())
    assert torch.equal(a.total, torch.zeros(3, dtype=torch.float64))
    assert a.weight == 0.0 and a.log_scale == -math.inf


def test_mean_of_no_weight_is_refused_not_nan():
    """A round no client contributed to has no mean: mean() refuses it (0/0 would be a
    model of NaNs); the smallest positive weight still has one."""
    import pytest

    empty = PartialSum(3)
    with pytest.raises(ValueError, match="no client contributed"):
        empty.mean()
    empty.merge(PartialSum(3).to_message())
    with pytest.raises(ValueError, match="no client contributed"):
        empty.mean()
    tiny = PartialSum(2)
    tiny.add(torch.tensor([1.0, -2.0]), 5e-324)
    assert torch.equal(tiny.mean(), torch.tensor([1.0, -2.0], dtype=torch.float64))


def test_add_defaults_to_unit_scale():
    """add(value, weight) is a plain weighted sum: log scale 0, so DP (which refuses any
    other scale) and a merge with explicitly scaled partials agree."""
    p = PartialSum(2)
    p.add(torch.ones(2), 2.0)
    assert p.log_scale == 0.0 and p.to_message().log_scale == 0.0
    q = PartialSum(2)
    q.add(torch.ones(2), 2.0, log_scale=0.0)
    q.add(torch.full((2,), 4.0), 1.0, log_scale=math.log(3.0))
    p.merge(PartialSum(2).to_message())
    r = PartialSum(2)
    r.add(torch.full((2,), 4.0), 1.0, log_scale=math.log(3.0))
    p.merge(r.to_message())
    torch.testing.assert_close(p.mean(), q.mean())
    torch.testing.assert_close(p.mean(), torch.full((2,), (2 + 12) / 5, dtype=torch.float64))


def test_fold_partials_is_merge_in_order_on_one_thread(monkeypatch):
    """fold_partials: the messages merged into one, from zero, in order, each merge on one
    torch thread (bit-identical wherever it runs) and the thread count restored after."""
    import pytest

    from fedray.algorithms.reduction import fold_partials

    msgs = []
    for i in range(3):
        p = PartialSum(4, extras={"e": 2})
        p.add(torch.arange(4, dtype=torch.float64) + i, 1.0 + i, log_scale=0.5 * i)
        p.add_extra("e", torch.ones(2), float(i))
        msgs.append(p.to_message())
    want = PartialSum(4, extras={"e": 2})
    for m in msgs:
        want.merge(m)
    threads = []
    merge = PartialSum.merge

    def spy(self, part):
        threads.append(torch.get_num_threads())
        merge(self, part)

    monkeypatch.setattr(PartialSum, "merge", spy)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        got = fold_partials(iter(msgs))
        assert threads == [1, 1, 1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert np.array_equal(got.sum, want.to_message().sum) and got.weight == want.weight
    assert got.log_scale == want.log_scale == 1.0
    assert np.array_equal(got.extras["e"], np.array([3.0, 3.0]))
    one = fold_partials([msgs[0]])
    assert np.array_equal(one.sum, msgs[0].sum) and one.weight == msgs[0].weight
    with pytest.raises(ValueError, match="no partial sums"):
        fold_partials([])
