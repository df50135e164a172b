"""The synthetic population's client sizes: hashed per client id, in O(ids asked), with the
distribution of the former single Beta(1.5, 1.5) stream. Pure numpy, no Ray."""

import numpy as np
import pytest

from fedray.data.client_source import MemorySource, sizes_of
from fedray.data.sources.synthetic import SyntheticFEMNIST, beta15_cdf, size_cdf


def _pmf(span: int) -> np.ndarray:
    return np.diff(np.concatenate([[0.0], size_cdf(span)]))


def _chi2(counts: np.ndarray, pmf: np.ndarray) -> float:
    expected = pmf * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def test_closed_form_cdf_is_the_beta_integral():
    # Beta(1.5, 1.5)'s density integrated numerically (composite Simpson on 200,001 points,
    # after x = sin^2 t removes the square-root ends): error ~1e-20, so 1e-12 is the
    # closed form's own float64 rounding
    t = np.linspace(0.0, np.pi / 2, 200_001)
    dens = (8 / np.pi) * (np.sin(t) * np.cos(t)) * 2 * np.sin(t) * np.cos(t)  # pdf(x) dx/dt
    h = t[1] - t[0]
    simpson = np.concatenate([[0.0], np.cumsum(h / 3 * (dens[:-2:2] + 4 * dens[1:-1:2]
                                                          + dens[2::2]))])
    x = np.sin(t[::2]) ** 2
    closed = np.array([beta15_cdf(v) for v in x])
    assert np.abs(closed - simpson).max() < 1e-12
    assert beta15_cdf(0.0) == 0.0 and beta15_cdf(1.0) == 1.0
    assert abs(beta15_cdf(0.5) - 0.5) < 1e-15  # symmetric: half the mass below 1/2


def test_size_table_is_the_distribution_of_the_former_draws():
    span = 60
    pmf = _pmf(span)
    assert size_cdf(span)[-1] == 1.0 and (pmf > 0).all() and abs(pmf.sum() - 1) < 1e-15
    assert np.allclose(pmf, pmf[::-1], atol=1e-15)  # Beta(1.5, 1.5) is symmetric
    # min + rint(beta(1.5, 1.5) * span), the former draw: 10^6 of them fit the table; the
    # bound is chi-square's mean (60 d.o.f.) plus 8 standard deviations (p < 1e-9)
    u = np.random.default_rng(5).beta(1.5, 1.5, size=1_000_000)
    former = np.bincount(np.rint(u * span).astype(int), minlength=span + 1)
    bound = span + 8 * np.sqrt(2 * span)
    assert _chi2(former, pmf) < bound
    # a wrong table does not: the plain uniform's pmf (rint's half-width ends)
    flat = np.full(span + 1, 1 / span)
    flat[[0, -1]] = 0.5 / span
    assert _chi2(former, flat) > 100 * bound


def test_hashed_sizes_follow_the_table():
    src = SyntheticFEMNIST(num_clients=500_000, min_examples=30, max_examples=90, seed=3)
    sizes = src.train_sizes_of(np.arange(500_000))
    assert sizes.min() == 30 and sizes.max() == 90
    counts = np.bincount(sizes - 30, minlength=61)
    assert _chi2(counts, _pmf(60)) < 60 + 8 * np.sqrt(120)  # as above: p < 1e-9
    assert SyntheticFEMNIST(num_clients=10, min_examples=7, max_examples=7).train_sizes_of(
        np.arange(10)).tolist() == [7] * 10  # span 0


def test_sizes_of_any_ids_equal_the_whole_population_bit_for_bit(monkeypatch):
    src = SyntheticFEMNIST(num_clients=3_000_000, seed=1, test_fraction=0.2)
    every, every_test = src.train_sizes(), src.test_sizes()  # chunked: 3 passes of 2^20 ids
    assert every.dtype == np.int64 and len(every) == 3_000_000
    ids = np.random.default_rng(0).integers(0, 3_000_000, size=5_000)  # repeats, any order
    fresh = SyntheticFEMNIST(num_clients=3_000_000, seed=1, test_fraction=0.2)
    monkeypatch.setattr(SyntheticFEMNIST, "train_sizes",
                        lambda self: pytest.fail("O(population) read"))
    assert np.array_equal(fresh.train_sizes_of(ids), every[ids])
    assert np.array_equal(fresh.test_sizes_of(ids), every_test[ids])
    assert np.array_equal(fresh.train_sizes_of(ids[::-1]), every[ids[::-1]])
    assert [int(fresh.train_sizes_of([c])[0]) for c in ids[:50]] == every[ids[:50]].tolist()
    assert np.array_equal(sizes_of(fresh, ids), every[ids])
    assert np.array_equal(sizes_of(fresh, ids, "test"), every_test[ids])
    x, _ = fresh.client(int(ids[0]))  # a worker's read: one id's size, nothing more
    assert len(x) == every[ids[0]]
    assert fresh.train_sizes_of([]).shape == (0,)
    for bad in ([3_000_000], [-1]):
        with pytest.raises(IndexError, match="outside the population of 3000000"):
            fresh.train_sizes_of(bad)


def test_other_sizes_per_seed_and_a_source_without_sizes_of():
    a = SyntheticFEMNIST(num_clients=1000, seed=0).train_sizes_of(np.arange(1000))
    b = SyntheticFEMNIST(num_clients=1000, seed=1).train_sizes_of(np.arange(1000))
    assert (a != b).mean() > 0.9  # the data seed changes the sizes
    # in-memory clients have no per-id path: sizes_of indexes their stored counts
    mem = MemorySource({k: (np.zeros((n, 2)), np.zeros(n, int)) for k, n in
                        enumerate([3, 1, 4])}, in_process=True)
    assert sizes_of(mem, [2, 0, 2]).tolist() == [4, 3, 4]
