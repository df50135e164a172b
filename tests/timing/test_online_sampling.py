"""Sampling k distinct online clients: only online ones, deterministic, O(k / share) draws."""

import numpy as np
import pytest

from fedray.errors import FedrayError
from fedray.timing.availability import AlwaysOnline, Diurnal, TraceAvailability
from fedray.timing.online_sampling import sample_online

DIURNAL = Diurnal(seed=3, online_s=8 * 3600)  # online share 1/3 at any time


def test_only_distinct_online_clients():
    for t in (0.0, 5000.0, 3.7 * 86400):
        s = sample_online(1, 7, 10**6, 300, DIURNAL, t)
        assert len(s.ids) == 300 and len(np.unique(s.ids)) == 300
        assert np.all(np.diff(s.ids) > 0) and DIURNAL.online(s.ids, t).all()


def test_deterministic_and_named_by_its_stream():
    a = sample_online(1, 7, 10**6, 50, DIURNAL, 5000.0)
    assert np.array_equal(a.ids, sample_online(1, 7, 10**6, 50, DIURNAL, 5000.0).ids)
    assert not np.array_equal(a.ids, sample_online(1, 8, 10**6, 50, DIURNAL, 5000.0).ids)
    assert not np.array_equal(a.ids, sample_online(2, 7, 10**6, 50, DIURNAL, 5000.0).ids)
    # the candidates are checked in batches, but the result is the first 50 online in the
    # stream: a bound of exactly a.draws candidates gives the same 50, one fewer fails
    again = sample_online(1, 7, 10**6, 50, DIURNAL, 5000.0, max_draws=a.draws)
    assert np.array_equal(a.ids, again.ids) and again.draws == a.draws
    with pytest.raises(FedrayError, match="found 49 of k = 50"):
        sample_online(1, 7, 10**6, 50, DIURNAL, 5000.0, max_draws=a.draws - 1)


def test_draws_follow_k_over_the_share_not_the_population():
    # candidates until k online ones: negative binomial, mean k / share = 3k, sd
    # sqrt(k (1 - share)) / share = 34.6 for k = 200; the bound is the mean + 6 sd. A
    # population of 10^12 could not be scanned: the sampler never lists it.
    for population in (10**5, 10**12):
        s = sample_online(4, 0, population, 200, DIURNAL, 1000.0)
        assert 200 <= s.draws <= 600 + 6 * 34.6
    assert sample_online(4, 0, 10**12, 200, AlwaysOnline(), 0.0).draws == 200


def test_uniform_among_the_online():
    # 6 clients, online 0..2 only: over 3000 draws of k = 1 each online one is drawn with
    # probability 1/3 (count sd sqrt(3000 * 2/9) = 25.8; 5 sd), offline ones never
    trace = TraceAvailability(np.array([0, 1, 2, 3, 3, 3, 3]), np.zeros(3), np.full(3, 10.0),
                              np.full(6, np.nan))
    counts = np.zeros(6, dtype=int)
    for draw in range(3000):
        counts[sample_online(0, draw, 6, 1, trace, 5.0).ids[0]] += 1
    assert counts[3:].sum() == 0 and np.all(np.abs(counts[:3] - 1000) < 5 * 25.8)


def test_exclude_and_errors():
    s = sample_online(0, 0, 10, 5, AlwaysOnline(), 0.0, exclude=[0, 1, 2, 3, 4])
    assert s.ids.tolist() == [5, 6, 7, 8, 9]
    with pytest.raises(FedrayError, match="found 5 of k = 6 clients online") as e:
        sample_online(0, 0, 10, 6, AlwaysOnline(), 0.0, exclude=[0, 1, 2, 3, 4])
    assert "\n" not in str(e.value)
    with pytest.raises(FedrayError, match="k must be in \\[1, population = 10\\]"):
        sample_online(0, 0, 10, 11, AlwaysOnline(), 0.0)
