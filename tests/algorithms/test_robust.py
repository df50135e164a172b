"""The Byzantine-robust aggregators and the norm bound of fedray.algorithms.robust, each
against an independent NumPy float64 reference written here with plain loops (no runtime, no
Ray): random update sets, sets with ties (duplicate rows, equal coordinates), round sizes at
each guarantee's limit, the degenerate settings that are the plain mean, their influence,
their refusals (check, check_plan), their degradation on a short round, centered clipping's
checkpointed center, and the outliers they exist to ignore.

Tolerances: the rows are float32, which float64 holds exactly. Where an aggregator computes
in float64 the same operations, in the same order, as the reference (a median, a row-order
sum of kept values, Krum's chosen row) the comparison is exact. Where the order of a float64
sum differs (a norm summed by slices of columns, a sorted-order sum) the comparison allows
``rel_tol`` times the values' size: each of the m <= 64 terms of such a sum is rounded at most
m times by 2^-53, so two orders differ by at most m 2^-53 ~ 7e-15 of the largest term."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedray.algorithms.base import ClientRows, LocalUpdate, ParamError, Payload, RoundPlan
from fedray.algorithms.reduction import PartialSum
from fedray.algorithms.robust import (
    Bulyan,
    BulyanParams,
    CenteredClip,
    CenteredClipParams,
    Krum,
    KrumParams,
    Mean,
    MeanParams,
    Median,
    MultiKrum,
    MultiKrumParams,
    NormBound,
    NormBoundParams,
    TrimmedMean,
    TrimmedMeanParams,
)

REL = 1e-12  # see the module docstring: ~100x the float64 bound for sums of <= 64 terms


# -- inputs ---------------------------------------------------------------------------------


def random_rows(seed: int, k: int, d: int) -> np.ndarray:
    """float32 rows whose columns span six orders of magnitude."""
    g = np.random.default_rng(seed)
    scale = 10.0 ** g.uniform(-3, 3, size=d)
    return (g.normal(size=(k, d)) * scale).astype(np.float32)


def tied_rows(seed: int, k: int, d: int) -> np.ndarray:
    """Small integers (many equal coordinates), with duplicate rows: every float64 sum here is
    exact, so ties are ties in any order of summation."""
    g = np.random.default_rng(seed)
    x = g.integers(-3, 4, size=(k, d)).astype(np.float32)
    x[k - 1] = x[0]
    if k > 3:
        x[2] = x[1]
    return x


def clients(k: int, examples: np.ndarray | None = None) -> ClientRows:
    ex = np.arange(1, k + 1) * 7 if examples is None else examples
    return ClientRows(ids=torch.arange(k), num_examples=torch.as_tensor(ex, dtype=torch.int64),
                      losses=torch.zeros(k, dtype=torch.float64))


def run(agg, x: np.ndarray, examples: np.ndarray | None = None) -> np.ndarray:
    """The aggregator on a copy of ``x`` (it may sort its rows): the update as float64 NumPy,
    after checking its type and that its influence is a distribution over the rows."""
    k = x.shape[0]
    out = agg.aggregate(torch.from_numpy(x.copy()), clients(k, examples), PartialSum(1))
    assert out.dtype == torch.float64 and out.shape == (x.shape[1],)
    inf = agg.influence
    if isinstance(agg, Mean):  # no defense: it judges no client (influence None)
        assert inf is None
        return out.numpy()
    assert inf.dtype == torch.float64 and inf.shape == (k,)
    assert (inf >= 0).all() and math.isclose(float(inf.sum()), 1.0, rel_tol=1e-12)
    return out.numpy()


# both the one-slice path and many slices of a few columns on several threads
@pytest.fixture(params=["one_slice", "sliced"])
def sliced(request):
    def make(agg):
        if request.param == "sliced":
            agg.chunk_values, agg.threads = 24, 3
        return agg
    return make


def plan(k: int) -> RoundPlan:
    return RoundPlan(seed=0, population=1000, clients_per_round=k, sampling="fixed",
                     rounds=10, num_params=8)


# -- the references (float64, loops) --------------------------------------------------------


def stable_order(col: np.ndarray) -> list[int]:
    """The rows by value, equal values by row index (a stable sort)."""
    return sorted(range(len(col)), key=lambda i: (float(col[i]), i))


def row_order_mean(x: np.ndarray, keep: list[int]) -> float:
    total = 0.0
    for i in sorted(keep):
        total += float(x[i])
    return total / len(keep)


def ref_mean(x, w):
    total = np.zeros(x.shape[1])
    for i in range(len(x)):
        total += float(w[i]) * x[i].astype(np.float64)
    return total / float(np.sum(w)), np.asarray(w, np.float64) / float(np.sum(w))


def ref_window(x, lo_of, hi_of):
    """Per coordinate, the rows a stable sort puts at positions lo..hi: their row-order mean
    and each row's share (1 / (hi - lo + 1) where it is one of them), over coordinates."""
    k, d = x.shape
    out, inf = np.empty(d), np.zeros(k)
    lo, hi = lo_of(k), hi_of(k)
    for j in range(d):
        keep = stable_order(x[:, j])[lo:hi + 1]
        out[j] = row_order_mean(x[:, j], keep)
        for i in keep:
            inf[i] += 1.0 / (len(keep) * d)
    return out, inf


def ref_median(x):
    return ref_window(x, lambda k: (k - 1) // 2, lambda k: k // 2)


def ref_trimmed(x, b):
    return ref_window(x, lambda k: b, lambda k: k - 1 - b)


def ref_distances(x):
    k = len(x)
    dist = np.zeros((k, k))
    for i in range(k):
        for j in range(k):
            diff = x[i].astype(np.float64) - x[j].astype(np.float64)
            dist[i, j] = np.sum(diff * diff)
    return dist


def ref_scores(dist, rows, f):
    q = max(0, len(rows) - f - 2)
    return [sum(sorted(dist[i, j] for j in rows if j != i)[:q]) for i in rows]


def ref_krum(x, f):
    n = len(x)
    if n <= 2:
        return x.astype(np.float64).mean(axis=0), np.full(n, 1.0 / n)
    scores = ref_scores(ref_distances(x), list(range(n)), f)
    best = min(range(n), key=lambda i: (scores[i], i))
    inf = np.zeros(n)
    inf[best] = 1.0
    return x[best].astype(np.float64), inf


def ref_multi_krum(x, f, m):
    n = len(x)
    scores = ref_scores(ref_distances(x), list(range(n)), f)
    chosen = sorted(sorted(range(n), key=lambda i: (scores[i], i))[:m])
    total = np.zeros(x.shape[1])
    for i in chosen:
        total += x[i].astype(np.float64)
    inf = np.zeros(n)
    inf[chosen] = 1.0 / m
    return total / m, inf


def ref_bulyan(x, f):
    n, d = x.shape
    dist = ref_distances(x)
    left, chosen = list(range(n)), []
    for _ in range(n - 2 * f):
        scores = ref_scores(dist, left, f)
        pick = min(range(len(left)), key=lambda a: (scores[a], left[a]))
        chosen.append(left.pop(pick))
    chosen.sort()
    beta = len(chosen) - 2 * f
    out, inf = np.empty(d), np.zeros(n)
    for j in range(d):
        vals = [float(x[i, j]) for i in chosen]
        med = float(np.median(vals))
        near = sorted(range(len(vals)), key=lambda t: (abs(vals[t] - med), t))[:beta]
        out[j] = row_order_mean(np.array(vals), near)
        for t in near:
            inf[chosen[t]] += 1.0 / (beta * d)
    return out, inf


def ref_centered_clip(x, v, tau, iterations):
    x = x.astype(np.float64)
    for _ in range(iterations):
        step, factors = np.zeros_like(v), np.empty(len(x))
        for i in range(len(x)):
            diff = x[i] - v
            norm = math.sqrt(float(np.sum(diff * diff)))
            factors[i] = min(1.0, tau / norm) if norm > 0 else 1.0
            step += factors[i] * diff
        v = v + step / len(x)
    return v, factors / factors.sum()


def close(got, want, scale):
    np.testing.assert_allclose(got, want, rtol=0, atol=REL * scale)


# -- mean -----------------------------------------------------------------------------------


@pytest.mark.parametrize("weighted", [True, False])
@pytest.mark.parametrize("seed, k, d", [(0, 7, 30), (1, 1, 5), (2, 12, 41)])
def test_mean_is_fedavgs(sliced, weighted, seed, k, d):
    """Exactly the reference, and exactly what FedAvg's partial sum (proportional, or
    uniform unweighted) computes from the same rows on one worker."""
    x = random_rows(seed, k, d)
    ex = np.random.default_rng(seed).integers(1, 500, size=k)
    agg = sliced(Mean(MeanParams(weighted=weighted)))
    got = run(agg, x, ex)
    w = ex if weighted else np.ones(k)
    want, _ = ref_mean(x, w)
    np.testing.assert_array_equal(got, want)
    acc = PartialSum(d)
    for i in range(k):
        acc.add(torch.from_numpy(x[i]), float(w[i]))
    np.testing.assert_array_equal(got, acc.mean().numpy())


def test_mean_judges_no_client():
    """FedAvg's mean is no defense: a small client's example weight below half of 1/k is
    FedAvg's rule, not a discarded client, so the mean sets no influence (and a run's
    defense metrics count no one it flagged)."""
    for params in (MeanParams(), MeanParams(weighted=False)):
        agg = Mean(params)
        agg.influence = torch.ones(3, dtype=torch.float64)  # a stale value is cleared
        run(agg, random_rows(3, 3, 4), np.array([1, 2, 500]))
        assert agg.influence is None


# -- median ---------------------------------------------------------------------------------


@pytest.mark.parametrize("rows", [random_rows, tied_rows])
@pytest.mark.parametrize("k", [1, 2, 3, 4, 9, 10])
def test_median_matches_numpy_and_the_reference(sliced, rows, k):
    x = rows(k, k, 37)
    agg = sliced(Median())
    got = run(agg, x)
    np.testing.assert_array_equal(got, np.median(x.astype(np.float64), axis=0))
    want, inf = ref_median(x)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(agg.influence.numpy(), inf, rtol=1e-12, atol=1e-15)


def test_median_influence_by_hand():
    agg = Median()
    # odd: column 0's median is row 1's 2, column 1's row 0's 5
    run(agg, np.array([[1, 5], [2, 4], [3, 6]], np.float32))
    np.testing.assert_array_equal(agg.influence.numpy(), [0.5, 0.5, 0.0])
    # even: the two middle rows, half each
    assert run(agg, np.array([[4], [1], [3], [2]], np.float32))[0] == 2.5
    np.testing.assert_array_equal(agg.influence.numpy(), [0.0, 0.0, 0.5, 0.5])
    # all equal: the stable sort's middle row, row 1 of 3; of 4, rows 1 and 2
    run(agg, np.ones((3, 1), np.float32))
    np.testing.assert_array_equal(agg.influence.numpy(), [0.0, 1.0, 0.0])
    run(agg, np.ones((4, 1), np.float32))
    np.testing.assert_array_equal(agg.influence.numpy(), [0.0, 0.5, 0.5, 0.0])
    # a tie across the middle: values 1, 2, 2, 2, 3 in rows 4, 0, 2, 3, 1: the middle (position
    # 2) is the second 2 in row order, row 2
    run(agg, np.array([[2], [3], [2], [2], [1]], np.float32))
    np.testing.assert_array_equal(agg.influence.numpy(), [0.0, 0.0, 1.0, 0.0, 0.0])


def test_median_ignores_fewer_than_half_outliers():
    """4 of 9 rows at +-1e6: every coordinate stays within the honest rows' range, and the
    outliers have no influence."""
    g = np.random.default_rng(5)
    x = g.normal(size=(9, 50)).astype(np.float32)
    bad = [1, 4, 6, 8]
    x[bad] = np.float32(1e6) * np.sign(g.normal(size=(4, 50))).astype(np.float32)
    agg = Median()
    got = run(agg, x)
    honest = np.delete(x, bad, axis=0)
    assert (got >= honest.min(axis=0)).all() and (got <= honest.max(axis=0)).all()
    assert float(agg.influence[bad].sum()) == 0.0


# -- trimmed mean ---------------------------------------------------------------------------


@pytest.mark.parametrize("rows", [random_rows, tied_rows])
@pytest.mark.parametrize("k, beta", [(10, 0.1), (10, 0.25), (7, 0.3), (5, 0.4), (9, 0.49),
                                     (6, 0.0), (1, 0.3), (2, 0.45)])
def test_trimmed_mean_matches_the_reference(sliced, rows, k, beta):
    """(5, 0.4) and (9, 0.49) are at the limit, 2b = k - 1: one value left, the median."""
    x = rows(k + 11, k, 29)
    agg = sliced(TrimmedMean(TrimmedMeanParams(beta=beta)))
    got = run(agg, x)
    b = math.floor(beta * k)
    want, inf = ref_trimmed(x, b)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(agg.influence.numpy(), inf, rtol=1e-12, atol=1e-15)
    assert agg.round_metrics() == {"trimmed_mean_b": float(b)}
    if 2 * b == k - 1:
        np.testing.assert_array_equal(got, np.median(x.astype(np.float64), axis=0))
    # the same numbers as a sorted-order trimmed mean, up to the order of summation
    s = np.sort(x.astype(np.float64), axis=0)[b:k - b]
    close(got, s.mean(axis=0), np.abs(s).max())


def test_trimmed_mean_beta_0_is_the_plain_mean():
    x = random_rows(8, 9, 40)
    got = run(TrimmedMean(TrimmedMeanParams(beta=0.0)), x)
    np.testing.assert_array_equal(got, ref_mean(x, np.ones(9))[0])  # row order: exact


def test_trimmed_mean_influence_by_hand():
    agg = TrimmedMean(TrimmedMeanParams(beta=0.2))  # b = 1 of 5
    assert run(agg, np.array([[5], [1], [3], [2], [4]], np.float32))[0] == 3.0
    np.testing.assert_allclose(agg.influence.numpy(), [0, 0, 1 / 3, 1 / 3, 1 / 3])
    # ties: 1, 1, 1, 1, 2 -> positions 1..3 in row order are rows 1, 2, 3
    run(agg, np.array([[1], [1], [1], [1], [2]], np.float32))
    np.testing.assert_allclose(agg.influence.numpy(), [0, 1 / 3, 1 / 3, 1 / 3, 0])


def test_trimmed_mean_plan_and_degradation():
    """With beta < 1/2, 2 floor(beta k) < k for every k, so the plan is never refused; a
    beta that bypassed ``check`` (0.5) is refused where it would trim every value, and at run
    time trims the most that leave one value."""
    for beta in (0.0, 0.1, 0.25, 0.4999999999999999):
        agg = TrimmedMean(TrimmedMeanParams(beta=beta))
        for k in range(1, 80):
            if beta and math.floor(beta * k) == 0:  # it would trim nothing: refused
                with pytest.raises(ParamError, match="trims nothing at"):
                    agg.check_plan(plan(k))
            else:
                agg.check_plan(plan(k))
    agg = TrimmedMean(TrimmedMeanParams(beta=0.1))
    agg.params.beta = 0.5  # past check, as a user's mutation would be
    agg.check_plan(plan(3))  # floor(1.5) = 1: 2 < 3
    with pytest.raises(ParamError) as err:
        agg.check_plan(plan(4))  # 2 x 2 of 4
    assert err.value.key == "beta" and "4 clients per round" in str(err.value)
    x = random_rows(4, 4, 11)
    got = run(agg, x)  # b = 1: the two middle values
    assert agg.round_metrics() == {"trimmed_mean_b": 1.0}
    np.testing.assert_array_equal(got, ref_trimmed(x, 1)[0])


# -- Krum and Multi-Krum ----------------------------------------------------------------------


@pytest.mark.parametrize("rows", [random_rows, tied_rows])
@pytest.mark.parametrize("n, f", [(5, 1), (7, 2), (12, 3), (9, 0), (3, 0), (13, 5)])
def test_krum_matches_the_reference(sliced, rows, n, f):
    """(5, 1), (7, 2), (3, 0) and (13, 5) are at the limit n = 2f + 3. Tied rows: duplicate
    rows score exactly alike, and the lower one is chosen."""
    x = rows(n * 3 + f, n, 23)
    agg = sliced(Krum(KrumParams(f=f)))
    agg.check_plan(plan(n))
    got = run(agg, x)
    want, inf = ref_krum(x, f)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(agg.influence.numpy(), inf)
    assert agg.round_metrics() == {"krum_f": float(f)}


def test_krum_by_hand_and_ties():
    """Rows 0, 1, 2, 3, 100 with f = 1 (2 neighbours): scores 5, 2, 2, 5, huge; rows 1 and 2
    tie, the lower is chosen. Multi-Krum's default m = n - f = 4 averages rows 0..3."""
    x = np.array([[0], [1], [2], [3], [100]], np.float32)
    agg = Krum(KrumParams(f=1))
    assert run(agg, x)[0] == 1.0
    np.testing.assert_array_equal(agg.influence.numpy(), [0, 1, 0, 0, 0])
    multi = MultiKrum(MultiKrumParams(f=1))
    assert run(multi, x)[0] == 1.5
    np.testing.assert_array_equal(multi.influence.numpy(), [0.25, 0.25, 0.25, 0.25, 0])
    assert multi.round_metrics() == {"multi_krum_f": 1.0, "multi_krum_m": 4.0}
    # all rows equal: every score 0, row 0
    run(agg, np.ones((5, 3), np.float32))
    np.testing.assert_array_equal(agg.influence.numpy(), [1, 0, 0, 0, 0])


@pytest.mark.parametrize("rows", [random_rows, tied_rows])
@pytest.mark.parametrize("n, f, m", [(5, 1, None), (7, 2, 3), (10, 2, 1), (10, 1, 9),
                                     (6, 0, None), (9, 3, None)])
def test_multi_krum_matches_the_reference(sliced, rows, n, f, m):
    x = rows(n * 5 + f, n, 19)
    agg = sliced(MultiKrum(MultiKrumParams(f=f, m=m)))
    agg.check_plan(plan(n))
    got = run(agg, x)
    want, inf = ref_multi_krum(x, f, n - f if m is None else m)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(agg.influence.numpy(), inf)


def test_multi_krum_f_0_m_n_is_the_plain_mean():
    x = random_rows(9, 8, 33)
    for m in (None, 8):
        got = run(MultiKrum(MultiKrumParams(f=0, m=m)), x)
        np.testing.assert_array_equal(got, ref_mean(x, np.ones(8))[0])


def test_krum_plan_refusals_at_the_limit():
    for cls, params in ((Krum, KrumParams), (MultiKrum, MultiKrumParams)):
        for f in (0, 1, 2, 5):
            agg = cls(params(f=f))
            agg.check_plan(plan(2 * f + 3))
            with pytest.raises(ParamError) as err:
                agg.check_plan(plan(2 * f + 2))
            assert err.value.key == "f" and err.value.value == f
            assert f"2f + 2 = {2 * f + 2}" in str(err.value)
            assert f"clients_per_round is {2 * f + 2}" in str(err.value)
    agg = MultiKrum(MultiKrumParams(f=1, m=4))
    agg.check_plan(plan(5))  # m = n - f
    agg.params.m = 5
    with pytest.raises(ParamError) as err:
        agg.check_plan(plan(5))
    assert err.value.key == "m"


def test_krum_degrades_on_a_short_round():
    """A round with fewer rows than the plan: f = max(0, floor((n - 3) / 2)); with two rows or
    fewer, their mean (nothing to compare a row with)."""
    agg, multi = Krum(KrumParams(f=3)), MultiKrum(MultiKrumParams(f=3, m=6))
    for n, f in ((9, 3), (8, 2), (7, 2), (6, 1), (5, 1), (4, 0), (3, 0)):
        x = random_rows(n, n, 13)
        np.testing.assert_array_equal(run(agg, x), ref_krum(x, f)[0])
        assert agg.round_metrics() == {"krum_f": float(f)}
        m = min(6, n - f)
        np.testing.assert_array_equal(run(multi, x), ref_multi_krum(x, f, m)[0])
        assert multi.round_metrics() == {"multi_krum_f": float(f), "multi_krum_m": float(m)}
    for n in (1, 2):
        x = random_rows(n, n, 13)
        for a in (agg, multi):
            np.testing.assert_array_equal(run(a, x), ref_mean(x, np.ones(n))[0])
            np.testing.assert_array_equal(a.influence.numpy(), [1.0 / n] * n)
        assert agg.round_metrics() == {"krum_f": 0.0}


@pytest.mark.parametrize("seed", range(5))
def test_krum_never_chooses_a_huge_attacker(seed):
    """2 of 11 rows are huge (identical, colluding: 0 apart): Krum, Multi-Krum and Bulyan
    give them no influence."""
    g = np.random.default_rng(seed)
    x = g.normal(size=(11, 40)).astype(np.float32)
    bad = g.choice(11, 2, replace=False)
    x[bad] = np.float32(1e4) * np.ones(40, np.float32)
    for agg in (Krum(KrumParams(f=2)), MultiKrum(MultiKrumParams(f=2)),
                Bulyan(BulyanParams(f=2))):
        run(agg, x)
        assert float(agg.influence[torch.from_numpy(bad)].sum()) == 0.0, agg.name
    assert int(agg.influence.argmax()) not in bad


# -- Bulyan ---------------------------------------------------------------------------------


@pytest.mark.parametrize("rows", [random_rows, tied_rows])
@pytest.mark.parametrize("n, f", [(7, 1), (11, 2), (10, 1), (15, 3), (4, 0), (13, 2)])
def test_bulyan_matches_the_reference(sliced, rows, n, f):
    """(7, 1), (11, 2) and (15, 3) are at the limit n = 4f + 3."""
    x = rows(n * 7 + f, n, 21)
    agg = sliced(Bulyan(BulyanParams(f=f)))
    agg.check_plan(plan(n))
    got = run(agg, x)
    want, inf = ref_bulyan(x, f)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(agg.influence.numpy(), inf, rtol=1e-12, atol=1e-15)
    assert agg.round_metrics() == {"bulyan_f": float(f)}


def test_bulyan_f_0_is_the_plain_mean():
    x = random_rows(10, 6, 31)
    agg = Bulyan(BulyanParams(f=0))
    np.testing.assert_array_equal(run(agg, x), ref_mean(x, np.ones(6))[0])
    np.testing.assert_allclose(agg.influence.numpy(), [1 / 6] * 6, rtol=1e-15)


def test_bulyan_influence_by_hand():
    """n = 7, f = 1, one coordinate 0..5 and 50: Krum keeps theta = 5 of them (never 50),
    then beta = 3 closest to their median."""
    x = np.array([[0], [1], [2], [3], [4], [5], [50]], np.float32)
    agg = Bulyan(BulyanParams(f=1))
    got = run(agg, x)
    want, inf = ref_bulyan(x, 1)
    np.testing.assert_array_equal(got, want)
    assert inf[6] == 0 and np.count_nonzero(inf) == 3
    np.testing.assert_allclose(agg.influence.numpy(), inf)
    np.testing.assert_allclose(np.sort(inf)[-3:], [1 / 3] * 3)


def test_bulyan_plan_refusals_and_degradation():
    for f in (0, 1, 2, 4):
        agg = Bulyan(BulyanParams(f=f))
        agg.check_plan(plan(4 * f + 3))
        if f:
            with pytest.raises(ParamError) as err:
                agg.check_plan(plan(4 * f + 2))
            assert err.value.key == "f" and f"4f + 3 = {4 * f + 3}" in str(err.value)
    agg = Bulyan(BulyanParams(f=2))
    for n, f in ((11, 2), (10, 1), (7, 1), (6, 0), (3, 0), (2, 0), (1, 0)):
        x = random_rows(n + 40, n, 9)
        np.testing.assert_array_equal(run(agg, x), ref_bulyan(x, f)[0])
        assert agg.round_metrics() == {"bulyan_f": float(f)}


# -- centered clipping ----------------------------------------------------------------------


@pytest.mark.parametrize("tau, iterations", [(1.0, 1), (0.3, 3), (100.0, 2), (1e-3, 5)])
def test_centered_clip_matches_the_reference(sliced, tau, iterations):
    x = random_rows(11, 8, 26) / np.float32(100)
    agg = sliced(CenteredClip(CenteredClipParams(tau=tau, iterations=iterations)))
    agg.init_server(26, 100)
    v = np.zeros(26)
    for _ in range(3):  # the center carries over rounds
        got = run(agg, x)
        v, inf = ref_centered_clip(x, v, tau, iterations)
        scale = np.abs(x).max()
        close(got, v, scale)
        np.testing.assert_allclose(agg.influence.numpy(), inf, rtol=1e-10)
        np.testing.assert_array_equal(agg.state["center"].numpy(), got)
        x = x + np.float32(0.01)


def test_centered_clip_plain_mean_when_nothing_is_clipped():
    x = random_rows(12, 5, 10) / np.float32(1e4)
    agg = CenteredClip(CenteredClipParams(tau=1e6))
    agg.init_server(10, 5)
    close(run(agg, x), ref_mean(x, np.ones(5))[0], np.abs(x).max())
    np.testing.assert_allclose(agg.influence.numpy(), [0.2] * 5, rtol=1e-15)
    assert agg.round_metrics() == {"centered_clip_clipped": 0.0}


def test_centered_clip_influence_by_hand():
    """Center 0, tau 1: rows at distance 0.5, 1 and 4 get factors 1, 1, 1/4."""
    x = np.array([[0.5, 0.0], [0.0, 1.0], [0.0, -4.0]], np.float32)
    agg = CenteredClip(CenteredClipParams(tau=1.0))
    agg.init_server(2, 3)
    got = run(agg, x)
    np.testing.assert_allclose(agg.influence.numpy(), np.array([1, 1, 0.25]) / 2.25)
    np.testing.assert_allclose(got, [0.5 / 3, (1 - 1) / 3])
    assert agg.round_metrics() == {"centered_clip_clipped": 1 / 3}


def test_centered_clip_state_round_trips_and_steers_the_next_round():
    x1, x2 = random_rows(13, 6, 12) / np.float32(10), random_rows(14, 6, 12) / np.float32(10)
    agg = CenteredClip(CenteredClipParams(tau=0.5, iterations=2))
    agg.init_server(12, 50)
    np.testing.assert_array_equal(agg.state["center"].numpy(), np.zeros(12))
    first = run(agg, x1)
    saved = agg.state_dict()
    np.testing.assert_array_equal(saved["center"].numpy(), first)
    resumed = CenteredClip(CenteredClipParams(tau=0.5, iterations=2))
    resumed.init_server(12, 50)
    resumed.load_state_dict(saved)
    fresh = CenteredClip(CenteredClipParams(tau=0.5, iterations=2))
    fresh.init_server(12, 50)
    second = run(agg, x2)
    np.testing.assert_array_equal(run(resumed, x2), second)
    assert not np.array_equal(run(fresh, x2), second)  # the center changed the result
    close(second, ref_centered_clip(x2, first, 0.5, 2)[0], np.abs(x2).max())


def test_centered_clip_center_grows_to_the_buffers():
    """init_server counts the model's parameters; the rows also carry its float buffers: a
    zero center grows to them in round 1, a used one of another size is an error."""
    agg = CenteredClip()
    agg.init_server(8, 10)
    x = random_rows(15, 4, 10) / np.float32(100)
    close(run(agg, x), ref_centered_clip(x, np.zeros(10), 1.0, 1)[0], 1.0)
    assert agg.state["center"].shape == (10,)
    with pytest.raises(ValueError, match="center has 10 values"):
        agg.aggregate(torch.from_numpy(random_rows(15, 4, 12)), clients(4), PartialSum(1))


# -- the parts' checks --------------------------------------------------------------------


@pytest.mark.parametrize("cls, params, key", [
    (Mean, MeanParams(weighted=1), "weighted"),
    (Mean, MeanParams(weighted="yes"), "weighted"),
    (TrimmedMean, TrimmedMeanParams(beta=0.5), "beta"),
    (TrimmedMean, TrimmedMeanParams(beta=0.7), "beta"),
    (TrimmedMean, TrimmedMeanParams(beta=-0.1), "beta"),
    (TrimmedMean, TrimmedMeanParams(beta=float("nan")), "beta"),
    (TrimmedMean, TrimmedMeanParams(beta=True), "beta"),
    (Krum, KrumParams(f=-1), "f"),
    (Krum, KrumParams(f=True), "f"),
    (Krum, KrumParams(f=1.0), "f"),
    (MultiKrum, MultiKrumParams(f=-2), "f"),
    (MultiKrum, MultiKrumParams(m=0), "m"),
    (MultiKrum, MultiKrumParams(m=-3), "m"),
    (MultiKrum, MultiKrumParams(m=True), "m"),
    (Bulyan, BulyanParams(f=-1), "f"),
    (Bulyan, BulyanParams(f=False), "f"),
    (CenteredClip, CenteredClipParams(tau=0.0), "tau"),
    (CenteredClip, CenteredClipParams(tau=-1.0), "tau"),
    (CenteredClip, CenteredClipParams(tau=float("nan")), "tau"),
    (CenteredClip, CenteredClipParams(tau=float("inf")), "tau"),
    (CenteredClip, CenteredClipParams(tau=True), "tau"),
    (CenteredClip, CenteredClipParams(iterations=0), "iterations"),
    (CenteredClip, CenteredClipParams(iterations=True), "iterations"),
    (CenteredClip, CenteredClipParams(iterations=1.5), "iterations"),
    (NormBound, NormBoundParams(max_norm=0.0), "max_norm"),
    (NormBound, NormBoundParams(max_norm=-1.0), "max_norm"),
    (NormBound, NormBoundParams(max_norm=float("nan")), "max_norm"),
    (NormBound, NormBoundParams(max_norm=True), "max_norm"),
])
def test_bad_params_are_refused_naming_their_key(cls, params, key):
    with pytest.raises(ParamError) as err:
        cls(params)
    assert err.value.key == key
    assert "\n" not in str(err.value)


def test_the_parts_resolve_by_name_from_a_job():
    """The presets and the norm_bound stage, through fedray's config (no run)."""
    from fedray.algorithms import resolve
    from fedray.api import prepare

    for name in ("median", "trimmed_mean", "krum", "multi_krum", "bulyan", "centered_clip"):
        cfg = prepare(None, [f"algorithm.name={name}"])
        got = resolve(cfg.algorithm, cfg.server)
        assert got.names == {"client": "local_sgd", "aggregator": name, "server_opt": "sgd",
                             "selector": "uniform"}
        assert got.aggregator.individual
    cfg = prepare(None, ["algorithm.name=multi_krum", "algorithm.multi_krum.f=2",
                         "algorithm.stages=[norm_bound]", "algorithm.norm_bound.max_norm=0.5"])
    got = resolve(cfg.algorithm, cfg.server)
    assert got.aggregator.params == MultiKrumParams(f=2, m=None)
    assert got.stages[0].params == NormBoundParams(max_norm=0.5)


# -- the norm bound -------------------------------------------------------------------------


def _update(values) -> LocalUpdate:
    return LocalUpdate(delta=torch.tensor(values, dtype=torch.float32), num_examples=3,
                       loss_sum=0.0, examples_seen=3, steps=1)


def test_norm_bound_clips_into_a_new_tensor_and_flags():
    stage = NormBound(NormBoundParams(max_norm=1.0))
    update = _update([3.0, 4.0])
    buffer = update.delta
    assert stage.client_update(None, None, update, None) is None  # env, ctx, acc unused
    assert update.flagged and update.delta is not buffer
    np.testing.assert_array_equal(buffer.numpy(), [3.0, 4.0])  # the kernel's buffer intact
    np.testing.assert_allclose(update.delta.numpy(), [0.6, 0.8], rtol=1e-6)
    assert float(torch.linalg.vector_norm(update.delta, dtype=torch.float64)) <= 1.0
    # within the bound (at it included): untouched, not flagged
    for values in ([0.3, 0.4], [1.0, 0.0], [0.0, 0.0]):
        update = _update(values)
        buffer = update.delta
        stage.client_update(None, None, update, None)
        assert not update.flagged and update.delta is buffer
        np.testing.assert_array_equal(update.delta.numpy(), np.float32(values))


def test_norm_bound_bounds_every_update_exactly():
    stage = NormBound(NormBoundParams(max_norm=0.25))
    g = np.random.default_rng(16)
    for _ in range(50):
        update = _update((g.normal(size=300) * 10.0 ** g.uniform(-3, 3)).tolist())
        before = float(torch.linalg.vector_norm(update.delta, dtype=torch.float64))
        direction = update.delta / before
        stage.client_update(None, None, update, None)
        after = float(torch.linalg.vector_norm(update.delta, dtype=torch.float64))
        assert after <= 0.25 and update.flagged == (before > 0.25)
        if update.flagged:  # the same direction, at the bound
            np.testing.assert_allclose(update.delta.numpy(), (direction * 0.25).numpy(),
                                       rtol=1e-5, atol=1e-9)
            assert after > 0.25 * (1 - 1e-6)


def test_norm_bound_payload_is_unchanged():
    before = Payload(values=100, value_bits=8, index_bits=16, overhead_bytes=4)
    assert NormBound().payload(before) == before


# -- FLTrust ------------------------------------------------------------------------------


def ref_fltrust(x: np.ndarray, root: list[int], examples: np.ndarray) -> tuple:
    """FLTrust (Cao et al., NDSS 2021) in float64 with loops: g0 the root rows' example-
    weighted mean, trust ReLU(cos(g_i, g0)), each other row rescaled to ||g0||, the
    trust-weighted mean; and each row's share (0 for the root rows)."""
    x = x.astype(np.float64)
    g0 = sum(examples[i] * x[i] for i in root) / sum(examples[i] for i in root)
    n0 = math.sqrt(sum(v * v for v in g0))
    out, shares, total = np.zeros(x.shape[1]), np.zeros(len(x)), 0.0
    for i in range(len(x)):
        if i in root:
            continue
        n = math.sqrt(sum(v * v for v in x[i]))
        ts = max(0.0, float(np.dot(x[i], g0)) / (n * n0)) if n > 0 and n0 > 0 else 0.0
        if ts > 0:
            out += ts * (n0 / n) * x[i]
        shares[i], total = ts, total + ts
    return (out / total, shares / total) if total > 0 else (out, shares)


def fltrust(root: list[int]):
    from fedray.algorithms.robust import FLTrust, FLTrustParams

    return FLTrust(FLTrustParams(root_clients=root))


@pytest.mark.parametrize("seed", range(4))
def test_fltrust_matches_its_reference(seed, sliced):
    x = random_rows(seed, 9, 40)
    x[4] = -3 * x[1]  # an attacker against the root's direction: no trust
    examples = np.arange(1, 10) * 5
    agg = sliced(fltrust([1, 6]))
    out = run(agg, x, examples)
    want, shares = ref_fltrust(x, [1, 6], examples)
    # float64 sums over <= 9 rows in another order: REL of the values' size (module doc)
    scale = np.abs(x).max()
    np.testing.assert_allclose(out, want, rtol=0, atol=REL * scale)
    np.testing.assert_allclose(agg.influence.numpy(), shares, rtol=0, atol=1e-12)
    assert agg.influence[1] == 0 and agg.influence[6] == 0  # the server's own rows
    assert agg.round_metrics()["fltrust_trusted"] == float((shares > 0).sum())


def test_fltrust_trusts_no_one_against_the_root_and_needs_a_root_row():
    g0 = np.array([[1.0, 2.0, 0.0]], np.float32)
    x = np.concatenate([g0, -g0, -2 * g0, np.array([[0.0, 0.0, 0.0]], np.float32)])
    agg = fltrust([0])
    out = agg.aggregate(torch.from_numpy(x.copy()), clients(4), PartialSum(1))
    assert torch.equal(out, torch.zeros(3, dtype=torch.float64))  # no positive trust: stay
    assert agg.influence.tolist() == [0.0] * 4
    # a round whose root client did not train: no g0, no step
    agg = fltrust([7])
    out = agg.aggregate(torch.from_numpy(x.copy()), clients(4), PartialSum(1))
    assert torch.equal(out, torch.zeros(3, dtype=torch.float64))
    # one honest client along g0, half its norm: rescaled to ||g0||, the whole update
    x2 = np.concatenate([g0, 0.5 * g0]).astype(np.float32)
    out = fltrust([0]).aggregate(torch.from_numpy(x2.copy()), clients(2), PartialSum(1))
    np.testing.assert_array_equal(out.numpy(), g0[0].astype(np.float64))


def test_fltrust_checks():
    for bad in ([], [-1], [True], [2, 2], "0"):
        with pytest.raises(ParamError) as info:
            fltrust(bad)
        assert info.value.key == "root_clients"
    agg = fltrust([3])
    assert agg.trusted == (3,)
    ok = RoundPlan(seed=0, population=10, clients_per_round=5, sampling="fixed", rounds=1,
                   num_params=1, always=(3,))
    agg.check_plan(ok)
    for bad, rule in ((dict(always=()), "sampling.always"),
                      (dict(population=3), "the data has clients 0..2"),
                      (dict(clients_per_round=1), "leave no client to aggregate")):
        with pytest.raises(ParamError, match=rule):
            agg.check_plan(RoundPlan(**{**ok.__dict__, **bad}))


def test_the_trusted_clients_are_never_malicious():
    from fedray.runtime.adversary import resolve

    adv = resolve({"fraction": 1.0, "attacks": ["sign_flip"]}, seed=0, trusted=(3, 5))
    assert adv.mask(np.arange(8)).tolist() == [True] * 3 + [False, True, False, True, True]
    from fedray.errors import ConfigError

    with pytest.raises(ConfigError, match="adversary.clients': names client 5, which the "
                                          "aggregator trusts"):
        resolve({"clients": [5], "attacks": ["sign_flip"]}, seed=0, trusted=(5,))
