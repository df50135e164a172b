"""The client selectors of fedray.algorithms.selection, round by round by hand, no runtime,
no Ray: ``uniform`` is the plain sampler's draw; ``power_of_choice`` probes ceil(d * k)
uniformly drawn clients and invites the k of highest loss (ties to the lower id); ``oort``
explores never-seen clients at a decaying share, learns a sparse state from the feedback
(utility = examples * loss of the clients that arrived, their last round, invitations and
durations), scores them (staleness bonus, (T / t)^alpha penalty), fixes T at a percentile of
the known durations and relaxes it with the pacer, exploits only clients above the cutoff
and online, and restores from its state_dict to the same choices (a finite state_dict:
unknown durations and an unset T are saved as -1, as the checkpoint refuses NaN and Inf).
Also the one-line errors a selector's parameters get (config key
'algorithm.<section>.<field>').

Why: a selector decides who trains, so a slip here (a tie broken by position, a utility
counted for a client that never arrived, an offline client exploited, an epsilon that does
not decay) changes every later round silently; none of it would show in a loss curve.

The SelectionContext here is a fake: ``sample`` takes the first n of a fixed preference
order (minus ``exclude``), so each round's choice can be written down by hand; ``probe``
returns the given losses. Every comparison is exact: the selectors compute in float64 the
same operations, in the same order, as the expected values written here (the numbers are
chosen so that the hand's arithmetic is exact where the order could differ: 0.25 * 3, 0.5^2).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from fedray.algorithms.base import ClientFeedback, RoundPlan, SelectionContext
from fedray.algorithms.registry import resolve
from fedray.algorithms.selection import (
    Oort,
    OortParams,
    PowerOfChoice,
    PowerOfChoiceParams,
    UniformSelector,
)
from fedray.config import ServerConfig
from fedray.core.sampling import sample_clients
from fedray.errors import ConfigError

POPULATION = 12
SERVER = OmegaConf.structured(ServerConfig)  # the job's server section, as resolve gets it
# the fake sampler's order of preference: sample(n) is the first n of it, sorted
ORDER = [7, 2, 9, 4, 11, 0, 5, 3, 10, 1, 8, 6]


class Fake:
    """A SelectionContext's callables, recording what the selector asked."""

    def __init__(self, losses: dict[int, float] | None = None,
                 online: set[int] | None = None, order: list[int] = ORDER):
        self.losses, self.offline, self.order = losses or {}, online, order
        self.samples: list[tuple[int, tuple[int, ...]]] = []
        self.probes: list[tuple[tuple[int, ...], float]] = []

    def sample(self, n: int, exclude=()) -> np.ndarray:
        self.samples.append((n, tuple(int(c) for c in exclude)))
        left = [c for c in self.order if c not in set(int(c) for c in exclude)]
        return np.sort(np.array(left[:n], dtype=np.int64))

    def probe(self, ids, share: float) -> np.ndarray:
        self.probes.append((tuple(int(c) for c in ids), share))
        return np.array([self.losses[int(c)] for c in ids], dtype=np.float64)

    def online_of(self, ids) -> np.ndarray:
        return np.array([int(c) in self.offline for c in ids], dtype=bool)

    def ctx(self, r: int = 1, k: int = 4, population: int = POPULATION,
            seed: int = 0) -> SelectionContext:
        return SelectionContext(
            round=r, k=k, population=population, seed=seed, start_s=0.0,
            sample=self.sample, probe=self.probe, durations=None,
            online=self.online_of if self.offline is not None else None,
            rng=np.random.default_rng(seed))


def plan(population: int = POPULATION) -> RoundPlan:
    return RoundPlan(seed=0, population=population, clients_per_round=4, sampling="fixed",
                     rounds=10, num_params=3)


def oort(**params) -> Oort:
    sel = Oort(OortParams(**params))
    sel.init_server(plan())
    return sel


def feedback(r: int, ids, arrived, loss, duration, examples,
             round_s: float = math.nan) -> ClientFeedback:
    return ClientFeedback(r, np.array(ids, np.int64), np.array(arrived, bool),
                          np.array(loss, np.float64), np.array(duration, np.float64),
                          np.array(examples, np.int64), round_s)


def state_of(sel: Oort, ids, utility, last_round, duration, *, preferred=math.inf,
             epsilon: float | None = None, exploited=()) -> None:
    """Oort's explored clients (invited once each) set by hand, through its checkpoint's
    load_state_dict; epsilon None: the exploration parameter's, as at round 1."""
    epsilon = sel.params.exploration if epsilon is None else epsilon
    f64, i64 = torch.float64, torch.int64
    sel.load_state_dict({"ids": torch.tensor(ids, dtype=i64),
                         "utility": torch.tensor(utility, dtype=f64),
                         "last_round": torch.tensor(last_round, dtype=i64),
                         "duration_s": torch.tensor(duration, dtype=f64),
                         "invited": torch.ones(len(ids), dtype=i64),
                         "epsilon": torch.tensor([epsilon], dtype=f64),
                         "preferred_s": torch.tensor([preferred], dtype=f64),
                         "exploited": torch.tensor(exploited, dtype=f64)})


def st(sel: Oort) -> dict[str, torch.Tensor]:
    """Oort's state as the checkpoint saves it."""
    return sel.state_dict()


# -- uniform ------------------------------------------------------------------------------

def test_uniform_is_the_plain_draw():
    """ctx.sample(k) itself, no exclusion, nothing probed: the sampler's stream as it was."""
    sel = UniformSelector()
    sel.init_server(plan())
    assert sel.wants_feedback is False and sel.state == {}
    for r in (1, 2, 7):
        calls = []

        def sample(n, exclude=(), r=r, calls=calls):
            calls.append((n, tuple(exclude)))
            return sample_clients(5, r, 100, n)

        ctx = SelectionContext(round=r, k=6, population=100, seed=5, start_s=0.0,
                               sample=sample, probe=None, durations=None, online=None,
                               rng=np.random.default_rng(0))
        got = sel.select(ctx)
        assert calls == [(6, ())]
        np.testing.assert_array_equal(got, sample_clients(5, r, 100, 6))
        assert got.dtype == np.int64
    assert sel.round_metrics() == {}


# -- power of choice ------------------------------------------------------------------------

def test_power_of_choice_invites_the_highest_losses_ties_to_the_lower_id():
    """d = ceil(2 * 3) = 6 drawn: 7, 2, 9, 4, 11, 0 (the fake's order); the two of loss 0.9
    (2 and 9), then of the three at 0.5 (0, 4, 11) the lowest id, 0."""
    losses = {7: 0.1, 2: 0.9, 9: 0.9, 4: 0.5, 11: 0.5, 0: 0.5}
    fake = Fake(losses)
    sel = PowerOfChoice(PowerOfChoiceParams(candidates=2.0, probe_cost=0.25))
    sel.init_server(plan())
    got = sel.select(fake.ctx(k=3))
    np.testing.assert_array_equal(got, [0, 2, 9])
    assert fake.samples == [(6, ())]
    assert fake.probes == [((0, 2, 4, 7, 9, 11), 0.25)]  # every candidate, at probe_cost
    # the metrics: how many were probed, the chosen ones' mean probe loss (highest first)
    assert sel.round_metrics() == {"power_of_choice_probed": 6,
                                   "power_of_choice_loss": float(np.mean([0.9, 0.9, 0.5]))}


def test_power_of_choice_pool_size():
    """ceil(candidates * k): 1.5 * 3 = 4.5 -> 5; 1.0 * 3 -> 3 (no choice: nothing probed, no
    loss metric); capped at the population."""
    losses = {c: float(c) for c in range(POPULATION)}
    for candidates, k, population, drawn in ((1.5, 3, POPULATION, 5), (1.1, 10, POPULATION, 11),
                                             (3.0, 4, 10, 10), (1.0, 3, POPULATION, 3)):
        fake = Fake(losses, order=[c for c in ORDER if c < population])
        sel = PowerOfChoice(PowerOfChoiceParams(candidates=candidates))
        sel.init_server(plan(population))
        got = sel.select(fake.ctx(k=k, population=population))
        assert fake.samples == [(drawn, ())], candidates
        pool = fake.sample(drawn)
        if drawn == k:
            assert fake.probes == [] and sel.round_metrics() == {"power_of_choice_probed": k}
            np.testing.assert_array_equal(got, pool)
        else:
            assert len(fake.probes) == 1
            # loss = id here: the k largest ids of the pool
            np.testing.assert_array_equal(got, pool[-k:])
            assert sel.round_metrics()["power_of_choice_probed"] == drawn


# -- oort: state -----------------------------------------------------------------------------

def test_oort_first_round_is_all_exploration():
    sel = oort()
    fake = Fake()
    got = sel.select(fake.ctx(k=4))
    np.testing.assert_array_equal(got, fake.sample(4))
    assert fake.samples[0] == (4, ())  # nothing to exclude yet: the plain draw
    assert got.dtype == np.int64
    assert sel.round_metrics() == {"oort_explored": 0.0, "oort_exploration": 0.9,
                                   "oort_exploited": 0.0}
    assert len(st(sel)["ids"]) == 0  # select learns nothing: feedback does


def test_oort_feedback_grows_a_sparse_sorted_state():
    sel = oort(exploration=0.5, exploration_decay=0.5, exploration_min=0.2)
    # round 1: 7 did not arrive (its finite loss must not count), 9 arrived
    sel.select(Fake().ctx(k=4))
    sel.feedback(feedback(1, [2, 7, 9, 11], [True, False, True, True],
                          [1.5, 3.0, 0.5, 2.0], [10.0, 30.0, 40.0, 20.0], [10, 8, 6, 4]))
    s = st(sel)
    assert s["ids"].tolist() == [2, 7, 9, 11] and s["ids"].dtype == torch.int64
    assert s["utility"].tolist() == [15.0, 0.0, 3.0, 8.0] and s["utility"].dtype == torch.float64
    assert s["last_round"].tolist() == [1, 1, 1, 1]
    assert s["invited"].tolist() == [1, 1, 1, 1]
    assert s["duration_s"].tolist() == [10.0, 30.0, 40.0, 20.0]
    assert s["exploited"].tolist() == [0.0]  # round 1 exploited no one
    assert float(s["epsilon"][0]) == 0.25
    # round 2: 1 and 8 are new (merged in id order), 11 comes back without arriving: its
    # utility stays, its duration, last round and invitations move; 8's duration unknown
    sel.feedback(feedback(2, [1, 8, 11], [True, True, False], [1.0, 2.5, math.nan],
                          [5.0, math.nan, 25.0], [2, 3, 4]))
    s = st(sel)
    assert s["ids"].tolist() == [1, 2, 7, 8, 9, 11]
    assert s["utility"].tolist() == [2.0, 15.0, 0.0, 7.5, 3.0, 8.0]
    assert s["last_round"].tolist() == [2, 1, 1, 2, 1, 2]
    assert s["invited"].tolist() == [1, 1, 1, 1, 1, 2]
    # 8's duration unknown: -1 in the checkpoint, which holds finite values only
    assert s["duration_s"].tolist() == [5.0, 10.0, 30.0, -1.0, 40.0, 25.0]
    assert all(bool(torch.isfinite(t).all()) for t in s.values())
    # a client that arrives with a NaN loss (it had no examples) keeps its utility
    sel.feedback(feedback(3, [2], [True], [math.nan], [12.0], [0]))
    assert st(sel)["utility"].tolist() == [2.0, 15.0, 0.0, 7.5, 3.0, 8.0]
    assert st(sel)["invited"].tolist() == [1, 2, 1, 1, 1, 2]
    # epsilon: 0.5 -> 0.25 -> 0.2 (0.125 is under exploration_min) -> 0.2
    assert float(st(sel)["epsilon"][0]) == 0.2


def test_oort_exploration_share_decays_to_its_floor():
    """n_exploit = k - ceil(eps k): with k = 10 and eps 0.9, 0.72, ... the exploited count
    grows as epsilon decays by 0.8 a round, until exploration_min 0.3 holds it at 7."""
    sel = oort(exploration=0.9, exploration_decay=0.8, exploration_min=0.3)
    # every client explored, equal utility: exploitation only limited by epsilon
    state_of(sel, list(range(POPULATION)), [1.0] * POPULATION, [1] * POPULATION,
             [math.nan] * POPULATION)
    eps = 0.9
    for r in range(1, 9):
        fake = Fake()
        sel.select(fake.ctx(r=r, k=10))
        m = sel.round_metrics()
        assert m["oort_exploration"] == eps
        assert m["oort_exploited"] == 10 - math.ceil(eps * 10 - 1e-9)
        sel.feedback(feedback(r, [0], [True], [1.0], [math.nan], [1]))
        eps = max(eps * 0.8, 0.3)
        assert float(st(sel)["epsilon"][0]) == eps
    assert eps == 0.3 and m["oort_exploited"] == 7


# -- oort: scores -----------------------------------------------------------------------------

def test_oort_scores_by_hand():
    """Three clients at round 5, T = 20 s, staleness 0.5, alpha 1.5:
    score = (utility + sqrt(0.5 ln 5 / last_round)) * (T / t)^alpha where t > T."""
    sel = oort(staleness=0.5, alpha=1.5)
    state_of(sel, [1, 4, 6], [6.0, 2.0, 4.0], [1, 4, 2], [10.0, 80.0, math.nan],
             preferred=20.0)
    bonus = [math.sqrt(0.5 * math.log(5) / last) for last in (1.0, 4.0, 2.0)]
    expected = [6.0 + bonus[0],  # faster than T: no penalty
                (2.0 + bonus[1]) * 0.125,  # (20 / 80)^1.5
                4.0 + bonus[2]]  # duration unknown: no penalty
    assert sel._scores(5).tolist() == expected
    assert st(sel)["utility"].tolist() == [6.0, 2.0, 4.0]  # scoring changed nothing
    # round 1: ln 1 = 0, no bonus; a last round of 0 counts as 1 (no division by zero)
    state_of(sel, [1, 4, 6], [6.0, 2.0, 4.0], [0, 4, 2], [10.0, 80.0, math.nan],
             preferred=20.0)
    assert sel._scores(1).tolist() == [6.0, 2.0 * 0.125, 4.0]
    assert sel._scores(3)[0] == 6.0 + math.sqrt(0.5 * math.log(3) / 1.0)
    # no T yet (inf): no penalty at all
    state_of(sel, [1, 4, 6], [6.0, 2.0, 4.0], [1, 4, 2], [10.0, 80.0, math.nan])
    assert sel._scores(1).tolist() == [6.0, 2.0, 4.0]


def test_oort_preferred_duration_is_a_percentile_of_the_known_ones():
    """T is set once, at the first select that knows durations: the 25th percentile of
    [10, 20, 30, 40] (NaN, unknown, left out) is 10 + 0.75 * 10 = 17.5; later durations
    leave it."""
    sel = oort(preferred_percentile=25.0)
    sel.select(Fake().ctx(k=5))
    assert "oort_preferred_s" not in sel.round_metrics()
    sel.feedback(feedback(1, [0, 2, 4, 7, 9], [True] * 5, [1.0] * 5,
                          [20.0, math.nan, 40.0, 10.0, 30.0], [1] * 5))
    assert float(st(sel)["preferred_s"][0]) == -1.0  # unset (saved as -1): select sets it
    sel.select(Fake().ctx(r=2, k=5))
    assert float(st(sel)["preferred_s"][0]) == 17.5
    assert sel.round_metrics()["oort_preferred_s"] == 17.5
    sel.feedback(feedback(2, [1, 3], [True, True], [1.0, 1.0], [1.0, 2.0], [1, 1]))
    sel.select(Fake().ctx(r=3, k=5))
    assert float(st(sel)["preferred_s"][0]) == 17.5


def test_oort_pacer_relaxes_t_when_exploited_utility_stalls():
    """pacer_window 2: after each even round, T += 10 s when the utility exploited in the
    last two rounds is no higher than in the two before."""
    def stepped(history: list[float], utility: float, preferred: float = 17.5) -> float:
        sel = oort(pacer_window=2, pacer_step_s=10.0)
        state_of(sel, [2], [1.0], [1], [5.0], preferred=preferred, exploited=history)
        sel._exploit_ids = np.array([2], np.int64)  # as select left it: 2 was exploited
        sel.feedback(feedback(5, [2], [True], [utility], [5.0], [1]))
        assert st(sel)["exploited"].tolist() == [*history, utility]
        t = float(st(sel)["preferred_s"][0])
        return math.inf if t == -1.0 else t  # unset T is saved as -1

    assert stepped([5.0, 3.0, 4.0], 4.0) == 27.5  # 4 + 4 <= 5 + 3: stalled
    assert stepped([5.0, 3.0, 4.0], 3.0) == 27.5
    assert stepped([5.0, 3.0, 4.0], 5.0) == 17.5  # 9 > 8: growing
    assert stepped([5.0, 3.0], 1.0) == 17.5  # 3 rounds: not a window's end
    assert stepped([5.0], 1.0) == 17.5  # one window only: nothing to compare
    assert stepped([5.0, 3.0, 4.0], 4.0, preferred=math.inf) == math.inf  # no T yet

    # only the exploited clients' utility counts: an explored one adds nothing
    sel = oort(pacer_window=2)
    state_of(sel, [2], [1.0], [1], [5.0], preferred=17.5)
    sel._exploit_ids = np.array([2], np.int64)
    sel.feedback(feedback(5, [2, 3, 8], [True, True, False], [2.0, 7.0, 1.0],
                          [5.0, 5.0, 5.0], [3, 1, 1]))
    assert st(sel)["exploited"].tolist() == [6.0]


def test_oort_checkpoint_is_finite_and_restores_what_is_unknown():
    """The driver refuses a checkpoint whose server state holds NaN or Inf (a diverged
    run), so Oort saves an unknown duration and an unset T as -1 -- and reads -1 back as
    unknown: T from the known durations only (the median of 10 and 30, not of -1, 10, 30),
    no penalty for an unknown one."""
    sel = oort(preferred_percentile=50.0)
    state_of(sel, [1, 4, 6], [6.0, 2.0, 4.0], [1, 1, 1], [math.nan, 10.0, 30.0])
    saved = st(sel)
    assert saved["duration_s"].tolist() == [-1.0, 10.0, 30.0]
    assert saved["preferred_s"].tolist() == [-1.0]
    assert all(bool(torch.isfinite(t).all()) for t in saved.values())
    back = oort(preferred_percentile=50.0)
    back.load_state_dict(saved)
    for s in (sel, back):
        s.select(Fake().ctx(r=2, k=4))
        assert s.round_metrics()["oort_preferred_s"] == 20.0
        # T = 20: 30 s is slower (score (4 + bonus) * (20 / 30)^2), the unknown one is not
        bonus = math.sqrt(0.1 * math.log(2))
        assert s._scores(2)[0] == 6.0 + bonus and s._scores(2)[1] == 2.0 + bonus
        assert s._scores(2)[2] < 4.0 + bonus
    assert torch.equal(st(sel)["preferred_s"], st(back)["preferred_s"])


# -- oort: who is invited -------------------------------------------------------------------

SIX = dict(ids=[0, 1, 2, 3, 4, 5], utility=[10.0, 9.0, 8.6, 8.5, 1.0, 0.0],
           last_round=[1] * 6, duration=[math.nan] * 6)


def test_oort_exploits_only_clients_above_the_cutoff():
    """k = 4, epsilon 0.5: 2 exploited, 2 explored. Round 1 (no staleness bonus), no T: the
    scores are the utilities; the 2nd best is 9, so the bar is 0.95 * 9 = 8.55 and 0, 1, 2
    are eligible (3, at 8.5, is not), drawn in proportion to their scores."""
    picked = set()
    for seed in range(40):
        sel = oort(exploration=0.5, exploration_min=0.5, cutoff=0.95)
        state_of(sel, **SIX)
        fake = Fake()
        got = sel.select(fake.ctx(k=4, seed=seed))
        w = np.array([10.0, 9.0, 8.6]) + 1e-12
        pick = np.random.default_rng(seed).choice(3, size=2, replace=False, p=w / w.sum())
        exploit = np.sort(np.array([0, 1, 2])[pick])
        # the explored ones: the fake's first two never seen (7 and 9: 2, 4, 11, 0 ... seen)
        explore = fake.sample(2, exclude=SIX["ids"])
        np.testing.assert_array_equal(got, np.union1d(exploit, explore))
        assert fake.samples[0] == (2, tuple(SIX["ids"]))
        assert sel.round_metrics()["oort_exploited"] == 2.0
        picked |= set(exploit.tolist())
    assert picked == {0, 1, 2}  # each eligible one is drawn sometimes, never 3, 4, 5


def test_oort_never_exploits_an_offline_client():
    """0 and 1 offline: the bar comes from the online ones (2nd best 8.5 -> 8.075), so 2 and
    3 are exploited, whatever the draw."""
    for seed in range(10):
        sel = oort(exploration=0.5, exploration_min=0.5)
        state_of(sel, **SIX)
        fake = Fake(online=set(range(POPULATION)) - {0, 1})
        got = sel.select(fake.ctx(k=4, seed=seed))
        np.testing.assert_array_equal(got, np.union1d([2, 3], fake.sample(2, exclude=SIX["ids"])))
    # every explored client offline: no exploitation, the round is all exploration
    sel = oort(exploration=0.5, exploration_min=0.5)
    state_of(sel, **SIX)
    fake = Fake(online=set(range(6, POPULATION)))
    got = sel.select(fake.ctx(k=4))
    np.testing.assert_array_equal(got, fake.sample(4, exclude=SIX["ids"]))
    assert sel.round_metrics()["oort_exploited"] == 0.0


def test_oort_fills_the_round_from_the_explored_when_none_is_left_to_explore():
    """Population 6, all explored: the 2 exploited, then the best 2 of the rest by score
    (ties to the lower id), and nothing sampled."""
    sel = oort(exploration=0.5, exploration_min=0.5, cutoff=1.0)
    state = dict(SIX, utility=[10.0, 9.0, 3.0, 3.0, 5.0, 0.0])
    state_of(sel, **state)
    fake = Fake(order=[3, 1, 0, 5, 2, 4])
    got = sel.select(fake.ctx(k=4, population=6))
    # cutoff 1: only the top 2 (0 and 1) are eligible, and both are drawn; then 4 (5.0) and
    # of 2 and 3 (3.0 each) the lower id
    np.testing.assert_array_equal(got, [0, 1, 2, 4])
    assert fake.samples == []


def test_oort_fill_skips_offline_clients_and_negative_scores_keep_the_top_n():
    """The fill from the explored clients invites no offline one, also when nothing was
    exploited (exploration 1); and a utility below zero (a user's loss may be negative)
    still leaves the n best eligible, where cutoff * a negative n-th best would exclude it."""
    sel = oort(exploration=1.0, exploration_min=1.0)
    state_of(sel, **SIX)
    fake = Fake(order=[3, 1, 0, 5, 2, 4], online={2, 3, 4, 5})
    got = sel.select(fake.ctx(k=4, population=6))
    assert set(got.tolist()) <= {2, 3, 4, 5} and len(got) == 4
    sel = oort(exploration=0.5, exploration_min=0.5, staleness=0.0)
    state_of(sel, **dict(SIX, utility=[-1.0, -2.0, -3.0, -4.0, -5.0, -6.0]))
    got = sel.select(Fake().ctx(k=4))
    assert len(got) == 4 and {0, 1} <= set(got.tolist())


def test_oort_state_dict_round_trip_restores_the_same_choices():
    """Three rounds of select and feedback; the state as the checkpoint saves it, loaded
    into a fresh Oort: the next rounds choose the same clients and learn the same state."""
    def rounds(sel: Oort, first: int, last: int) -> list[list[int]]:
        out = []
        for r in range(first, last + 1):
            fake = Fake()
            got = sel.select(fake.ctx(r=r, k=4, seed=100 + r))
            out.append(got.tolist())
            g = np.random.default_rng(r)
            sel.feedback(feedback(r, got, g.random(len(got)) < 0.8, g.uniform(0.5, 3.0, len(got)),
                                  g.uniform(5.0, 50.0, len(got)), g.integers(1, 30, len(got))))
        return out

    params = dict(exploration=0.6, exploration_decay=0.9, exploration_min=0.2,
                  pacer_window=1, pacer_step_s=3.0)
    a = oort(**params)
    rounds(a, 1, 3)
    saved = a.state_dict()
    assert sorted(saved) == ["duration_s", "epsilon", "exploited", "ids", "invited",
                             "last_round", "preferred_s", "utility"]
    after_a = rounds(a, 4, 7)
    # the saved tensors are copies: the rounds after did not move them
    assert len(saved["exploited"]) == 3 and len(st(a)["exploited"]) == 7
    b = oort(**params)
    b.load_state_dict(saved)
    assert rounds(b, 4, 7) == after_a
    sa, sb = st(a), st(b)
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) and sa[k].dtype == sb[k].dtype for k in sa)
    assert len(sa["ids"]) > 4 and len(sa["exploited"]) == 7
    with pytest.raises(ValueError, match=r"selector oort: state lacks \['utility'\]"):
        oort().load_state_dict({k: v for k, v in saved.items() if k != "utility"})


# -- parameters ---------------------------------------------------------------------------

@pytest.mark.parametrize("section, key, value, rule", [
    ("oort", "exploration", 2, "must be in [0, 1]"),
    ("oort", "exploration_min", 0.95, "must be <= exploration (0.9)"),
    ("oort", "cutoff", -0.1, "must be in [0, 1]"),
    ("oort", "exploration_decay", 0, "must be in (0, 1]"),
    ("oort", "alpha", -1.0, "must be >= 0"),
    ("oort", "preferred_percentile", 101, "must be in [0, 100]"),
    ("oort", "pacer_window", 0, "must be >= 1"),
    ("power_of_choice", "candidates", 0.5, "must be >= 1"),
    ("power_of_choice", "probe_cost", -1.0, "must be >= 0"),
])
def test_parameter_errors_name_the_key(section, key, value, rule):
    with pytest.raises(ConfigError) as info:
        resolve({"name": "fedavg", "selector": section, section: {key: value}}, SERVER)
    msg = str(info.value)
    assert msg.startswith(f"config key 'algorithm.{section}.{key}': {rule}"), msg
    # the value as the part's Params typed it (2 for a float field reads as 2.0)
    default = getattr({"oort": OortParams(), "power_of_choice": PowerOfChoiceParams()}[section],
                      key)
    assert msg.endswith(f", got {type(default)(value)!r}")
    assert "\n" not in msg


def test_selector_resolution():
    """uniform by default; a named one with its section's parameters (the others kept at
    their defaults); the section of a selector the job does not use, or a field it does
    not have, refused."""
    assert isinstance(resolve({"name": "fedavg"}, SERVER).selector, UniformSelector)
    got = resolve({"name": "fedavg", "selector": "oort", "oort": {"alpha": 1.0}}, SERVER)
    assert isinstance(got.selector, Oort) and got.selector.params == OortParams(alpha=1.0)
    assert got.names["selector"] == "oort"
    assert got.sections["oort"] == {**OortParams().__dict__, "alpha": 1.0}
    with pytest.raises(ConfigError, match=r"unknown config key 'algorithm.oort'"):
        resolve({"name": "fedavg", "oort": {"alpha": 1.0}}, SERVER)
    with pytest.raises(ConfigError, match=r"unknown config key 'algorithm.oort.alfa'"):
        resolve({"name": "fedavg", "selector": "oort", "oort": {"alfa": 1.0}}, SERVER)
    with pytest.raises(ConfigError, match=r"algorithm.selector"):
        resolve({"name": "fedavg", "selector": "oracle"}, SERVER)
