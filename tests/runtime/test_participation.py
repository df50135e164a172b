"""The driver's side of client selection (fedray.runtime.participation), without Ray or a
run: the ``uniform`` selector through ``Participation.invite`` is the sampler fedray has
always had, bit for bit -- ``select_round`` without the clock (dropout, over-selection,
pinned clients, Poisson rounds), ``RoundClock.select`` with it (online sampling, dropout,
the deadline, over-selection) -- round after round; ``check_selector`` refuses the sampling
keys that decide who takes part some other way for any selector but the built-in uniform;
a user's selector that returns what the runtime cannot use (duplicates, an id out of range,
nobody, floats, a 2-d array) gets one line naming it; ``merge_arrived`` orders the workers'
reports by client id; ``Participation.feedback`` aligns what arrived with the invitees, in
the selector's ClientFeedback and in the participants table, also for a round in which no
one arrived. At the end: Oort's exploration when few never-seen clients are left or online.

Why: the selector replaced the driver's call of select_round / RoundClock.select, so every
existing uniform run (its metrics, its checkpoints, its resumes) depends on the two paths
drawing the same clients; and feedback misaligned by one row would teach a selector the
wrong client's loss. Every comparison is exact: the same functions on the same inputs.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
import torch
from omegaconf import OmegaConf

from fedray.algorithms.base import RoundPlan, Selector
from fedray.algorithms.selection import Oort, PowerOfChoice, UniformSelector
from fedray.config import FedrayConfig, typed
from fedray.core.sampling import over_selected, poisson_clients, sample_clients, select_round
from fedray.errors import ConfigError, PartError
from fedray.runtime.participation import (
    Participation,
    check_selector,
    merge_arrived,
    participants_name,
)
from fedray.timing.rounds import LocalWork, RoundClock

SEED, POPULATION, K = 11, 60, 8
SIZES = np.random.default_rng(3).integers(1, 40, size=POPULATION)


def sizes_of(ids) -> np.ndarray:
    return SIZES[np.asarray(ids, dtype=np.int64)]


def config(**over) -> FedrayConfig:
    cfg = OmegaConf.structured(FedrayConfig)
    return typed(OmegaConf.merge(cfg, {"seed": SEED, "sampling": {"clients_per_round": K}},
                                 over))


def participation(selector, name, cfg: FedrayConfig, *args, **kwargs) -> Participation:
    """Participation as the driver makes it, from the job's typed sections."""
    return Participation(selector, name, cfg.sampling, cfg.seed, *args,
                         participants=cfg.output.participants, **kwargs)


def no_probe(ids):
    raise AssertionError(f"uniform probed {ids}")


def uniform() -> UniformSelector:
    sel = UniformSelector()
    sel.init_server(RoundPlan(SEED, POPULATION, K, "fixed", 10, 5))
    return sel


def same_selection(a, b) -> None:
    np.testing.assert_array_equal(a.participants, b.participants)
    assert a.participants.dtype == b.participants.dtype == np.int64
    assert (a.sampled, a.dropped_out, a.late) == (b.sampled, b.dropped_out, b.late)


# -- uniform is the sampler as it was --------------------------------------------------------

@pytest.mark.parametrize("sampling", [
    {},
    {"dropout": 0.3},
    {"over_selection": 0.5},
    {"dropout": 0.2, "over_selection": 0.3},
    {"always": [4, 17], "dropout": 0.2, "over_selection": 0.25},
    {"mode": "poisson", "dropout": 0.1},
], ids=["plain", "dropout", "over", "dropout-over", "always", "poisson"])
def test_uniform_without_the_clock_is_select_round(sampling):
    cfg = config(sampling=sampling)
    sm = cfg.sampling
    part = participation(uniform(), "uniform", cfg, POPULATION, sizes_of)
    n = over_selected(K, sm.over_selection, POPULATION)
    assert (part.k, part.n) == (K, n)
    dropped = late = 0
    for r in range(1, 9):
        inv = part.invite(r, 0.0, no_probe)
        want = select_round(SEED, r, POPULATION, K, always=sm.always, dropout=sm.dropout,
                            over_selection=sm.over_selection, sizes=sizes_of, mode=sm.mode)
        same_selection(inv.selection, want)
        drawn = (poisson_clients(SEED, r, POPULATION, K) if sm.mode == "poisson"
                 else sample_clients(SEED, r, POPULATION, n, sm.always))
        np.testing.assert_array_equal(inv.invited, drawn)
        assert inv.probe_s == 0.0
        dropped, late = dropped + want.dropped_out, late + want.late
    # the rules acted: what is compared is not only the draw
    assert dropped > 0 or not sm.dropout
    assert late > 0 or not sm.over_selection


CLOCK = {"enabled": True, "deadline_s": 60.0,
         "devices": {"compute_s_per_example": 0.5},
         "availability": {"model": "diurnal", "period_s": 600.0, "online_s": 300.0}}


def round_clock(cfg) -> RoundClock:
    """As the driver builds it: sizes as a function of ids, with the population."""
    cl = cfg.client
    return RoundClock(cfg.clock, cfg.seed, sizes_of, 5,
                      LocalWork(cl.batch_size, cl.local_epochs, cl.local_steps,
                                cl.steps_per_epoch),
                      population=POPULATION)


@pytest.mark.parametrize("sampling", [{}, {"dropout": 0.2, "over_selection": 0.5}],
                         ids=["plain", "dropout-over"])
def test_uniform_on_the_clock_is_roundclock_select(sampling):
    cfg = config(sampling=sampling, clock=CLOCK, client={"batch_size": 4})
    sm = cfg.sampling
    clock, reference = round_clock(cfg), round_clock(cfg)
    part = participation(uniform(), "uniform", cfg, POPULATION, sizes_of, clock)
    t = ref_t = 0.0
    events = 0
    for r in range(1, 11):
        inv = part.invite(r, t, no_probe)
        want = reference.select(r, ref_t, K, dropout=sm.dropout,
                                over_selection=sm.over_selection)
        same_selection(inv.selection, want)
        got = inv.selection.outcome
        assert (got.start_s, got.end_s) == (want.outcome.start_s, want.outcome.end_s)
        for field in ("kept", "dropped", "late"):
            np.testing.assert_array_equal(getattr(got, field), getattr(want.outcome, field))
        # every invitee was online when the round started
        assert clock.availability.online(inv.invited, t).all()
        t, ref_t = got.end_s, want.outcome.end_s
        events += want.dropped_out + want.late
    assert t > 0 and events > 0  # the clock decided something


# -- which sampling keys a selector allows -------------------------------------------------

@pytest.mark.parametrize("sampling, key, value", [
    ({"always": [3]}, "sampling.always", "[3]"),
    ({"mode": "poisson"}, "sampling.mode", "'poisson'"),
    ({"concurrency": 4}, "sampling.concurrency", "4"),
])
def test_check_selector(sampling, key, value):
    sm = config(sampling=sampling).sampling
    check_selector("uniform", uniform(), sm)  # the uniform sampler allows them all
    check_selector("uniform", None, sm)
    for name, sel in (("oort", Oort()), ("power_of_choice", PowerOfChoice())):
        with pytest.raises(ConfigError) as info:
            check_selector(name, sel, sm)
        assert str(info.value) == (
            f"config key '{key}': cannot be combined with algorithm.selector {name}, which "
            f"picks each round's clients itself (only uniform allows it), got {value}")
    # a user's selector named "uniform" is not the built-in one
    with pytest.raises(ConfigError, match=rf"'{key}': cannot be combined with "
                                          r"algorithm.selector mine:Uniform"):
        check_selector("mine:Uniform", Returns(name="uniform"), sm)
    check_selector("oort", Oort(), config().sampling)  # plain sampling: nothing to refuse


# -- a user's selector returning what the runtime cannot use --------------------------------

class Returns(Selector):
    """A user's selector: returns ``out`` every round."""

    wants_feedback = False

    def __init__(self, out=None, name: str = "returns"):
        super().__init__()
        self.out, self.name = out, name

    def select(self, ctx):
        return self.out


@pytest.mark.parametrize("out, problem", [
    ([3, 5, 3], "select() chose a client twice in round 2"),
    ([0, POPULATION], f"select() chose client {POPULATION} in round 2; the clients are "
                      f"0..{POPULATION - 1}"),
    (np.array([-1, 4]), "select() chose client -1 in round 2; the clients are "
                        f"0..{POPULATION - 1}"),
    ([], "select() chose no client in round 2"),
    ([0.5, 1.0], "select() must return a 1-d array of client ids, got list"),
    (np.array([1.0, 2.0]), "select() must return a 1-d array of client ids, got ndarray"),
    (np.array([[1, 2]]), "select() must return a 1-d array of client ids, got ndarray"),
    (None, "select() must return a 1-d array of client ids, got NoneType"),
    ("12", "select() must return a 1-d array of client ids, got str"),
], ids=["duplicate", "too-high", "negative", "empty", "floats", "float-array", "2-d", "none",
        "str"])
def test_a_bad_choice_is_one_line_naming_the_selector(out, problem):
    part = participation(Returns(out), "my_sel:Returns", config(), POPULATION, sizes_of)
    with pytest.raises(PartError) as info:
        part.invite(2, 0.0, no_probe)
    assert str(info.value) == f"selector my_sel:Returns (algorithm.selector): {problem}"


def test_a_good_choice_is_sorted_int64():
    part = participation(Returns([9, 2, 30]), "my_sel:Returns", config(), POPULATION,
                         sizes_of)
    inv = part.invite(1, 0.0, no_probe)
    np.testing.assert_array_equal(inv.invited, [2, 9, 30])
    assert inv.invited.dtype == np.int64
    np.testing.assert_array_equal(inv.selection.participants, [2, 9, 30])
    part = participation(Returns(np.array([7], np.uint8)), "x", config(), POPULATION, sizes_of)
    assert part.invite(1, 0.0, no_probe).invited.tolist() == [7]


# -- what comes back --------------------------------------------------------------------------

def test_merge_arrived_orders_by_client_id():
    a = {"id": np.array([9, 2]), "loss": np.array([0.9, 0.2]), "examples": np.array([90, 20]),
         "cluster": np.array([1.0, 0.0])}
    b = {"id": np.array([5]), "loss": np.array([0.5]), "examples": np.array([50]),
         "cluster": np.array([2.0])}
    for parts in ([a, None, b], [b, a], [None, b, None, a]):  # any split, any worker order
        got = merge_arrived(parts)
        assert list(got) == ["id", "loss", "examples", "cluster"]
        assert got["id"].tolist() == [2, 5, 9]
        assert got["loss"].tolist() == [0.2, 0.5, 0.9]
        assert got["examples"].tolist() == [20, 50, 90]
        assert got["cluster"].tolist() == [0.0, 2.0, 1.0]
    assert merge_arrived([None, None]) is None and merge_arrived([]) is None


class Records(Selector):
    name = "records"

    def select(self, ctx):
        return ctx.sample(ctx.k)

    def feedback(self, fb):
        self.got = fb


def test_feedback_aligns_the_arrived_with_the_invited():
    sel = Records()
    part = participation(sel, "records", config(), POPULATION, sizes_of)
    inv = part.invite(3, 0.0, no_probe)
    ids = inv.invited
    assert len(ids) == K
    came = ids[[1, 4, 6]]
    arrived = {"id": came, "loss": np.array([0.5, 1.5, 2.5]),
               "examples": sizes_of(came), "cluster": np.array([1.0, 0.0, 2.0])}
    table = part.feedback(3, inv, arrived, 42.0)
    fb = sel.got
    assert fb.round == 3 and fb.round_s == 42.0
    np.testing.assert_array_equal(fb.ids, ids)
    mask = np.isin(ids, came)
    np.testing.assert_array_equal(fb.arrived, mask)
    np.testing.assert_array_equal(fb.loss[mask], [0.5, 1.5, 2.5])
    assert np.isnan(fb.loss[~mask]).all()
    np.testing.assert_array_equal(fb.examples, sizes_of(ids))  # every invitee's, from data
    assert fb.examples.dtype == np.int64
    assert np.isnan(fb.duration_s).all()  # no clock
    assert table.column_names == ["client_id", "arrived", "loss", "examples", "duration_s",
                                  "cluster"]
    assert table.schema.field("arrived").type == pa.bool_()
    cols = table.to_pydict()
    assert cols["client_id"] == ids.tolist() and cols["arrived"] == mask.tolist()
    np.testing.assert_array_equal(table["loss"].to_numpy(), fb.loss)
    cluster = table["cluster"].to_numpy()
    np.testing.assert_array_equal(cluster[mask], [1.0, 0.0, 2.0])
    assert np.isnan(cluster[~mask]).all()
    # no worker trained anyone (every invitee dropped out or was late): the selector still
    # learns that nobody arrived, and the table says so
    table = part.feedback(4, inv, None, 1.0)
    assert sel.got.round == 4 and not sel.got.arrived.any() and np.isnan(sel.got.loss).all()
    np.testing.assert_array_equal(sel.got.ids, ids)
    assert table.num_rows == K and not any(table["arrived"].to_pylist())
    # ... unless nobody asked for either: uniform without output.participants
    for participants, rows in ((False, None), (True, K)):
        quiet = participation(uniform(), "uniform", config(output={"participants": participants}),
                              POPULATION, sizes_of)
        table = quiet.feedback(4, quiet.invite(4, 0.0, no_probe), None, 1.0)
        assert (table if table is None else table.num_rows) == rows
    assert participants_name(3) == "participants/round_000003.arrow"


def test_feedback_on_the_clock_carries_durations_and_skips_a_selector_that_wants_none():
    cfg = config(clock=CLOCK, client={"batch_size": 4})
    clock = round_clock(cfg)
    sel = Records()
    part = participation(sel, "records", cfg, POPULATION, sizes_of, clock)
    inv = part.invite(1, 0.0, no_probe)
    kept = inv.selection.participants
    arrived = {"id": kept, "loss": np.ones(len(kept)), "examples": sizes_of(kept)}
    table = part.feedback(1, inv, arrived, 5.0)
    np.testing.assert_array_equal(sel.got.duration_s, clock.durations(inv.invited))
    np.testing.assert_array_equal(table["duration_s"].to_numpy(), sel.got.duration_s)
    assert table.column_names == ["client_id", "arrived", "loss", "examples", "duration_s"]
    # uniform learns nothing (wants_feedback False) and, unless a client part records
    # columns or output.participants asks, the workers report nothing and no table is made
    quiet = participation(uniform(), "uniform", config(), POPULATION, sizes_of)
    assert not quiet.reports
    assert quiet.feedback(1, quiet.invite(1, 0.0, no_probe), None, math.nan) is None
    # a client part's columns (IFCA's cluster): reported and tabled with uniform too, the
    # column there (NaN) even in a round nobody arrived
    own = participation(uniform(), "uniform", config(), POPULATION, sizes_of,
                        columns=("cluster",))
    assert own.reports
    table = own.feedback(1, own.invite(1, 0.0, no_probe), None, math.nan)
    assert table.column_names[-1] == "cluster" and np.isnan(table["cluster"].to_numpy()).all()


# -- known failures: Oort's exploration when few never-seen clients are left ---------------
#
# Oort asks ctx.sample(n, exclude=<every client it has seen>) for n = min(wanted,
# population - seen). The sampler is the online one (fedray.timing.online_sampling), which
# draws candidates from the whole population and gives up after 1000 draws per client
# asked for; so it raises when the clients left are too few to be found that way: offline
# ones on the clock (diurnal availability), or a handful among thousands without it.
# Uniform sampling of k clients never meets this (it excludes no one). Kept here, strict,
# until exploration takes what is left (and the round's remaining places are exploited).


def _explored_all_but(population: int, left: list[int]) -> Oort:
    ids = np.setdiff1d(np.arange(population), left)
    n = len(ids)
    sel = Oort()
    sel.init_server(RoundPlan(SEED, population, K, "fixed", 50, 5))
    sel.load_state_dict({"ids": torch.from_numpy(ids),
                         "utility": torch.ones(n, dtype=torch.float64),
                         "last_round": torch.ones(n, dtype=torch.int64),
                         "duration_s": torch.full((n,), math.nan, dtype=torch.float64),
                         "invited": torch.ones(n, dtype=torch.int64),
                         "epsilon": torch.tensor([0.9], dtype=torch.float64),
                         "preferred_s": torch.tensor([math.inf], dtype=torch.float64),
                         "exploited": torch.zeros(0, dtype=torch.float64)})
    return sel


def test_oort_on_a_diurnal_clock_explores_what_is_online_and_fills_with_seen_clients():
    """40 clients, a third of them online at a time, 8 a round: by round 3 fewer never-seen
    clients are online than Oort wants to explore. The round takes the ones there are and
    fills up with seen clients that are online, rather than failing; every invitee is
    online at the round's start."""
    population = 40
    cfg = config(clock={"enabled": True, "availability": {
        "model": "diurnal", "period_s": 3600.0, "online_s": 1200.0}})
    sizes = np.arange(population) % 7 + 5
    clock = RoundClock(cfg.clock, cfg.seed, sizes, 5, LocalWork(4, 1, None))
    sel = Oort()
    sel.init_server(RoundPlan(SEED, population, K, "fixed", 50, 5))
    part = participation(sel, "oort", cfg, population, sizes.__getitem__, clock)
    t, seen_before = 0.0, 0
    for r in range(1, 11):
        inv = part.invite(r, t, no_probe)
        assert 1 <= len(inv.invited) <= K
        assert clock.availability.online(inv.invited, t).all()
        assert len(sel.state["ids"]) >= seen_before
        seen_before = len(sel.state["ids"])
        kept = inv.selection.participants
        part.feedback(r, inv, {"id": kept, "loss": np.ones(len(kept)),
                               "examples": sizes[kept]}, inv.selection.outcome.end_s - t)
        t = inv.selection.outcome.end_s


def test_oort_finds_the_last_unseen_client_of_a_large_population():
    """No clock: one client of 3000 never seen. Rejection sampling's 1000 draws would miss
    it with probability (1 - 1/3000)^1000 = 0.72; with more than half the population
    excluded the rest is listed instead, so it is explored every time."""
    for r in range(1, 11):
        sel = _explored_all_but(3000, [1234])
        part = participation(sel, "oort", config(), 3000,
                             lambda ids: np.ones(len(ids), np.int64))
        assert 1234 in part.invite(r, 0.0, no_probe).invited
