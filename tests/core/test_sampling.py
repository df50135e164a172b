import math

import numpy as np
import pytest

from fedray.core.sampling import federated_eval_clients, sample_clients
from fedray.core.seeding import client_seed, derive_seed


def test_without_replacement_within_round():
    for r in range(1, 20):
        ids = sample_clients(0, r, 50, 50)
        assert sorted(ids.tolist()) == list(range(50))
        ids = sample_clients(0, r, 1000, 20)
        assert len(set(ids.tolist())) == 20 and ids.min() >= 0 and ids.max() < 1000


def test_seeded_and_independent_across_rounds():
    a = [sample_clients(7, r, 100_000, 20) for r in range(1, 30)]
    b = [sample_clients(7, r, 100_000, 20) for r in range(1, 30)]
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not np.array_equal(a[0], a[1])
    assert not np.array_equal(sample_clients(8, 1, 100_000, 20), a[0])


def test_with_replacement_across_rounds():
    """Rounds are independent draws: two consecutive rounds of 10 of 30 share k^2 / N = 3.33
    clients on average (hypergeometric, sd 1.2), not 0 as a sampler that avoided repeats
    until everyone had a turn would give. (Counting any repeat over 390 draws of 30 ids, as
    this test once did, passes for every sampler.)"""
    rounds = [set(sample_clients(0, r, 30, 10).tolist()) for r in range(1, 2002)]
    overlap = np.array([len(a & b) for a, b in zip(rounds[:-1], rounds[1:], strict=True)])
    assert abs(overlap.mean() - 10 * 10 / 30) < 4 * 1.2 / math.sqrt(len(overlap))
    assert (overlap == 0).any() and (overlap >= 6).any()


def test_uniform():
    counts = np.bincount(np.concatenate([sample_clients(1, r, 20, 5) for r in range(4000)]),
                         minlength=20)
    assert counts.min() > 0.9 * 1000 and counts.max() < 1.1 * 1000


def test_seeds_differ_per_client_round_and_fit_torch():
    seeds = {client_seed(0, r, c) for r in range(5) for c in range(50)}
    assert len(seeds) == 250
    assert all(0 <= s < 2**63 for s in seeds)
    assert derive_seed(1, 2, 3) == derive_seed(1, 2, 3) != derive_seed(1, 3, 2)


def test_federated_eval_clients_fixed():
    assert np.array_equal(federated_eval_clients(0, 500, 30), federated_eval_clients(0, 500, 30))
    assert len(set(federated_eval_clients(0, 500, 30).tolist())) == 30
    # its own stream (seed, TAG_FED_EVAL), drawn without replacement: all 50 of 50
    from fedray.core.seeding import TAG_FED_EVAL, rng

    want = np.sort(rng(4, TAG_FED_EVAL).choice(500, size=30, replace=False))
    assert np.array_equal(federated_eval_clients(4, 500, 30), want)
    assert federated_eval_clients(4, 50, 50).tolist() == list(range(50))
    assert not np.array_equal(federated_eval_clients(4, 500, 30), sample_clients(4, 0, 500, 30))


def test_poisson_sampling_is_its_round_stream_and_never_trimmed():
    """Poisson rounds: the count ~ Binomial(N, k / N), then that many distinct ids, both
    from (seed, TAG_SAMPLE, round); select_round keeps a round of more than k whole."""
    from fedray.core.sampling import poisson_clients, select_round
    from fedray.core.seeding import TAG_SAMPLE, rng

    more = 0
    for r in range(1, 40):
        g = rng(9, TAG_SAMPLE, r)
        count = int(g.binomial(200, 20 / 200))
        want = np.sort(g.choice(200, size=count, replace=False))
        got = poisson_clients(9, r, 200, 20)
        assert np.array_equal(got, want) and got.dtype == np.int64
        sel = select_round(9, r, 200, 20, mode="poisson")
        assert np.array_equal(sel.participants, got) and sel.sampled == len(got)
        assert sel.late == sel.dropped_out == 0
        more += len(got) > 20
    assert more > 5  # rounds of more than k did occur, and were kept whole


def test_fixed_sampling_is_its_round_stream():
    """A plain round is k distinct ids from (seed, TAG_SAMPLE, round) -- that stream and no
    other (seed and tag in that order), so a job's rounds are reproducible from its seed."""
    from fedray.core.seeding import TAG_SAMPLE, rng

    for seed, r in ((9, 1), (12345, 7), (2**40 + 3, 2)):
        want = np.sort(rng(seed, TAG_SAMPLE, r).choice(1000, size=25, replace=False))
        got = sample_clients(seed, r, 1000, 25)
        assert np.array_equal(got, want) and got.dtype == np.int64


def test_always_clients_join_every_round_and_the_rest_stay_uniform():
    rounds = [sample_clients(3, r, 10, 2, always=[9]) for r in range(3000)]
    assert all(len(ids) == 2 and 9 in ids.tolist() for ids in rounds)
    others = np.bincount([i for ids in rounds for i in ids.tolist() if i != 9], minlength=10)
    assert others[9] == 0 and others[:9].min() > 0.85 * 3000 / 9
    assert np.array_equal(sample_clients(3, 5, 10, 2, always=[9]), rounds[5])
    # several pinned clients at the edges: still k distinct ids, the rest never pinned ones
    many = np.concatenate([sample_clients(1, r, 30, 10, always=[29, 0, 5]) for r in range(500)])
    assert all(len(set(ids.tolist())) == 10 for ids in np.split(many, 500))
    assert np.bincount(many, minlength=30)[[0, 5, 29]].tolist() == [500] * 3
    assert np.bincount(many, minlength=30).min() > 0
    # no pinned client: exactly the plain draw, so existing runs are unchanged
    assert np.array_equal(sample_clients(3, 5, 10, 2, always=[]), sample_clients(3, 5, 10, 2))


def test_always_is_validated():
    import pytest

    from fedray.config import load_config, validate
    from fedray.errors import ConfigError

    for bad, match in (("[3, 3]", "must not repeat"), ("[1000]", r"indices in 0\.\.999"),
                       ("[0, 1, 2]", "more clients than")):
        cfg = load_config({"sampling": {"clients_per_round": 2}},
                          [f"sampling.always={bad}"])
        with pytest.raises(ConfigError, match=f"sampling.always.*{match}"):
            validate(cfg, population=1000)


def test_select_round_without_dropout_or_over_selection_is_plain_sampling():
    from fedray.core.sampling import select_round

    sizes = np.arange(1, 101)
    for r in range(1, 20):
        sel = select_round(4, r, 100, 10, sizes=sizes)
        assert np.array_equal(sel.participants, sample_clients(4, r, 100, 10))
        assert (sel.sampled, sel.dropped_out, sel.late) == (10, 0, 0)


def test_dropout_rate_and_determinism():
    from fedray.core.sampling import select_round

    sels = [select_round(0, r, 1000, 50, dropout=0.3) for r in range(400)]
    rate = sum(s.dropped_out for s in sels) / (400 * 50)
    assert abs(rate - 0.3) < 0.02
    assert all(len(s.participants) == 50 - s.dropped_out for s in sels)
    again = select_round(0, 7, 1000, 50, dropout=0.3)
    assert np.array_equal(again.participants, sels[7].participants)
    # a client's fate depends on (seed, round, client) only, not on who else was sampled
    a = select_round(0, 7, 1000, 50, dropout=0.3, always=[int(sels[7].participants[0])])
    common = np.intersect1d(sample_clients(0, 7, 1000, 50), sample_clients(0, 7, 1000, 50, [
        int(sels[7].participants[0])]))
    kept_a, kept_b = set(a.participants.tolist()), set(sels[7].participants.tolist())
    assert all((c in kept_a) == (c in kept_b) for c in common.tolist())


def test_over_selection_keeps_the_first_k_to_finish():
    from fedray.core.sampling import select_round
    from fedray.core.seeding import TAG_DROPOUT, TAG_SPEED, rng

    sizes = np.random.default_rng(0).integers(10, 200, size=500)
    for r in range(1, 30):
        sel = select_round(2, r, 500, 20, dropout=0.2, over_selection=0.5, sizes=sizes)
        assert sel.sampled == 30 and len(sel.participants) == min(20, 30 - sel.dropped_out)
        assert sel.sampled == len(sel.participants) + sel.dropped_out + sel.late
        survivors = [c for c in sample_clients(2, r, 500, 30)
                     if rng(2, TAG_DROPOUT, r, int(c)).random() >= 0.2]
        finish = {c: sizes[c] * rng(2, TAG_SPEED, r, int(c)).lognormal(0.0, 1.0)
                  for c in survivors}
        assert sorted(sel.participants.tolist()) == sorted(sorted(finish, key=finish.get)[:20])
    assert select_round(2, 1, 25, 20, over_selection=0.5, sizes=sizes[:25]).sampled == 25


def test_a_round_costs_its_clients_not_the_population():
    import tracemalloc

    from fedray.core.sampling import select_round

    calls = []

    def sizes_of(ids):  # what the driver passes: counts of the ids asked, nothing more
        calls.append(len(ids))
        return 10 + ids % 97

    tracemalloc.start()
    try:
        sel = select_round(1, 3, 10**12, 1_000, over_selection=0.3, sizes=sizes_of)
        fed = federated_eval_clients(1, 10**12, 500)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # Floyd's algorithm in numpy's choice: a table of about 2 x 1,300 ids, never an arange
    # of 10^12; 1 MB leaves room for the lists of speeds and ids
    assert peak < 2**20, peak
    assert calls == [1_300] and len(sel.participants) == 1_000 and sel.late == 300
    assert len(np.unique(fed)) == 500 and fed.max() < 10**12
    every = 10 + np.arange(2_000) % 97  # the same counts as an array: the same selection
    a = select_round(1, 3, 2_000, 100, over_selection=0.3, sizes=every)
    b = select_round(1, 3, 2_000, 100, over_selection=0.3, sizes=sizes_of)
    assert np.array_equal(a.participants, b.participants) and a.late == b.late == 30


def test_over_selection_counts_exactly_as_documented():
    """ceil(k * (1 + o)) over the exact decimal o, never float arithmetic: with floats
    ceil(100 * 1.1) is 111 (110.00000000000001), one client too many for 54 pairs of k <= 1000,
    o in 0.1..0.9. Every such pair whose product is not an integer is checked against exact
    rational arithmetic (the integer products are checked too: there float is right)."""
    from fractions import Fraction

    from fedray.core.sampling import over_selected, select_round

    wrong_in_float = 0
    for tenths in range(1, 10):
        o = tenths / 10
        for k in range(1, 1001):
            exact = k * (1 + Fraction(tenths, 10))
            want = -(-exact.numerator // exact.denominator)
            assert over_selected(k, o, 10**9) == want, (k, o)
            wrong_in_float += math.ceil(k * (1.0 + o)) != want
    assert wrong_in_float == 54  # the class of inputs the issue counted: all are now right
    assert over_selected(100, 0.1, 10**6) == 110
    assert select_round(0, 1, 10_000, 100, over_selection=0.1,
                        sizes=np.ones(10_000, dtype=np.int64)).sampled == 110
    # other decimals, hundredths and beyond, and float noise: the decimal that is meant
    for k, o, want in ((100, 0.07, 107), (1000, 0.001, 1001), (10, 0.35, 14), (20, 0.35, 27),
                       (7, 2.3, 24), (10, 0.1 + 0.2, 13), (3, 1 / 3, 4), (1, 1e-9, 2),
                       (100, 0.1, 110), (10, 0.5, 15), (10, 1, 20)):
        assert over_selected(k, o, 10**9) == want, (k, o)
    assert over_selected(100, 0.0, 50) == 100  # no over-selection: k as it is
    assert over_selected(100, 0.5, 120) == 120  # at most the population
    assert over_selected(100, math.inf, 5000) == 5000
    for bad in (-0.1, math.nan):
        with pytest.raises(ValueError, match="over_selection"):
            over_selected(10, bad, 100)
