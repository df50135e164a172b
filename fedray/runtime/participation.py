"""Who takes part in a round: the job's selector's choice, run through dropout,
over-selection and the simulated clock, and what the invited clients report back.

The selector (``algorithm.selector``; fedray.algorithms.selection) decides whom to invite
from a ``SelectionContext``: the round's uniform draw (the clock's online sampler, or the
plain one), a loss probe on the workers, the clock's durations and availability. The
invitees then meet the runtime's own rules -- ``sampling.dropout``, over-selection's k
fastest, the clock's deadline -- exactly as a uniform sample always has
(fedray.core.sampling.survivors, fedray.timing.rounds.RoundClock.run). After the round
the selector's ``feedback`` gets each invitee's outcome, and with ``output.participants``
(or a selector or client part that reports per client) the round's table is written as
``participants/round_{r:06d}.arrow``: ``client_id``, ``arrived``, ``loss``, ``examples``,
``duration_s`` and the client part's columns (IFCA's ``cluster``).

Everything here is a function of (seed, round, the selector's state), never of the worker
count: the probe's losses are deterministic evaluations, and the invitees' reports are
gathered by id.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from fedray.algorithms.base import ClientFeedback, SelectionContext, Selector
from fedray.algorithms.selection import UniformSelector
from fedray.config import SamplingConfig
from fedray.core.sampling import (
    over_selected,
    poisson_clients,
    sample_clients,
    sorted_distinct,
    survivors,
)
from fedray.core.seeding import TAG_SELECT, rng
from fedray.data.transforms.per_round import drawn_columns
from fedray.errors import PartError, key_error
from fedray.state.run_dir import PARTICIPANTS_DIR
from fedray.timing.availability import AlwaysOnline
from fedray.timing.online_sampling import sample_online

__all__ = ["Participation", "RoundInvites", "check_selector", "participants_name",
           "row_columns"]


def participants_name(r: int) -> str:
    """Round ``r``'s participants table, relative to the run directory."""
    return f"{PARTICIPANTS_DIR}/round_{r:06d}.arrow"


def check_selector(name: str, selector: Selector, sampling: Any) -> None:
    """A selector other than ``uniform`` picks its clients itself: refused, in one line,
    with the sampling keys that say who takes part some other way (clients pinned into
    every round, Poisson sampling's independent coins, buffered training's schedule)."""
    if selector is None or type(selector) is UniformSelector:
        return
    for key, on, value in (("sampling.always", len(sampling.always), list(sampling.always)),
                           ("sampling.mode", sampling.mode == "poisson", sampling.mode),
                           ("sampling.concurrency", sampling.concurrency,
                            sampling.concurrency)):
        if on:
            raise key_error(key, f"cannot be combined with algorithm.selector {name}, which "
                            "picks each round's clients itself (only uniform allows it)",
                            value)


@dataclass
class RoundInvites:
    """A round's invitees and who of them trains (``selection``: a RoundSelection, or a
    ClockedSelection on the clock), and the seconds the round waited for a probe."""

    invited: np.ndarray
    selection: Any
    probe_s: float = 0.0


class Participation:
    """The driver's side of client selection: one per synchronous run (the caller has
    checked the selector against the sampling section: ``check_selector``)."""

    def __init__(self, selector: Selector, name: str, sampling: SamplingConfig, seed: int,
                 population: int, sizes_of: Callable[[np.ndarray], np.ndarray],
                 clock: Any = None, columns: tuple[str, ...] = (), *,
                 participants: bool = False, recorded: tuple[str, ...] = ()):
        """``sampling``: the job's section; ``columns``: the client part's per-client values
        (``ClientWork.columns``), which make the table; ``participants``:
        output.participants; ``recorded``: other per-client values the workers record (the
        aggregator's, data.per_round's draws: ``row_columns``), tabled when a table is
        made."""
        self.selector, self.name, self.clock = selector, name, clock
        self.sampling, self.seed = sampling, seed
        self.population, self.sizes_of = population, sizes_of
        self.columns = tuple(dict.fromkeys((*columns, *recorded)))
        # the workers report each aggregated client (loss, examples, the part's columns):
        # for a selector that learns from them, a part's own values, or output.participants
        self.reports = bool(selector.wants_feedback or columns or participants)
        sm = sampling
        self.k, self.n = sm.clients_per_round, over_selected(sm.clients_per_round,
                                                             sm.over_selection, population)

    def invite(self, r: int, start_s: float,
               probe: Callable[[np.ndarray], np.ndarray]) -> RoundInvites:
        """Round ``r``'s invitees (the selector's), and who of them trains."""
        seed, sm, clock = self.seed, self.sampling, self.clock
        probe_s = [0.0]

        def sample(n: int, exclude: Any = ()) -> np.ndarray:
            if len(exclude):
                return self._sample_rest(r, start_s, n, exclude)
            if clock is not None:
                return clock.sample(r, start_s, n)
            if sm.mode == "poisson":
                return poisson_clients(seed, r, self.population, sm.clients_per_round)
            return sample_clients(seed, r, self.population, n, sm.always)

        def probed(ids: Any, share: float) -> np.ndarray:
            ids = np.asarray(ids, dtype=np.int64)
            if clock is not None:
                probe_s[0] = max(probe_s[0], clock.probe_s(ids, share))
            return probe(ids)

        ctx = SelectionContext(
            round=r, k=self.n, population=self.population, seed=seed, start_s=start_s,
            sample=sample, probe=probed,
            durations=clock.durations if clock is not None else None,
            online=((lambda ids: clock.availability.online(np.asarray(ids, np.int64),
                                                           start_s))
                    if clock is not None else None),
            rng=rng(seed, TAG_SELECT, r))
        invited = self._checked(self.selector.select(ctx), r)
        if clock is not None:
            sel = clock.run(r, start_s + probe_s[0], invited, self.k, dropout=sm.dropout)
        else:
            sel = survivors(seed, r, invited, self.k, dropout=sm.dropout,
                            over_selection=sm.over_selection, sizes=self.sizes_of)
        return RoundInvites(invited, sel, probe_s[0])

    def _sample_rest(self, r: int, start_s: float, n: int, exclude: Any) -> np.ndarray:
        """Up to ``n`` eligible clients (online at ``start_s`` on the clock) none of
        ``exclude``, uniformly: fewer when fewer are left. Drawn by rejection from the
        round's stream while ``exclude`` is under half the population (each draw then
        hits with probability over a half, times the online share); beyond that the rest
        is listed, O(population) = O(|exclude|), which the caller already pays for."""
        ex = sorted_distinct(exclude)
        clock = self.clock
        if 2 * len(ex) < self.population:
            if clock is not None:
                return clock.sample(r, start_s, n, ex, partial=True)
            return sample_online(self.seed, r, self.population, n, AlwaysOnline(), 0.0,
                                 exclude=ex, partial=True).ids
        rest = np.setdiff1d(np.arange(self.population, dtype=np.int64), ex,
                            assume_unique=True)
        if clock is not None and len(rest):
            rest = rest[clock.availability.online(rest, start_s)]
        if len(rest) <= n:
            return rest
        g = rng(self.seed, TAG_SELECT, r, 1)  # apart from the selector's own stream
        return np.sort(g.choice(rest, size=n, replace=False))

    def _checked(self, ids: Any, r: int) -> np.ndarray:
        """The selector's choice as sorted distinct int64 ids, or one line naming it."""
        try:
            arr = np.asarray(ids)
            ok = arr.ndim == 1 and (arr.dtype.kind in "iu" or len(arr) == 0)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise PartError(f"selector {self.name} (algorithm.selector): select() must "
                            f"return a 1-d array of client ids, got {type(ids).__name__}")
        arr = arr.astype(np.int64)
        if len(arr) and (arr.min() < 0 or arr.max() >= self.population):
            raise PartError(f"selector {self.name} (algorithm.selector): select() chose "
                            f"client {int(arr.min() if arr.min() < 0 else arr.max())} in "
                            f"round {r}; the clients are 0..{self.population - 1}")
        out = np.unique(arr)
        if len(out) != len(arr):
            raise PartError(f"selector {self.name} (algorithm.selector): select() chose a "
                            f"client twice in round {r}")
        if not len(out):
            raise PartError(f"selector {self.name} (algorithm.selector): select() chose no "
                            f"client in round {r}")
        return out

    def feedback(self, r: int, inv: RoundInvites, arrived: dict[str, np.ndarray] | None,
                 round_s: float) -> pa.Table | None:
        """Hand the selector what the invitees reported; the round's participants table
        (None when no worker reported per client)."""
        if not self.reports:
            return None
        if arrived is None:  # no worker trained anyone (every invitee dropped out or was
            # late): nobody arrived, which a selector learns from too (the late durations)
            arrived = {"id": np.zeros(0, np.int64), "loss": np.zeros(0),
                       "examples": np.zeros(0, np.int64),
                       **{name: np.zeros(0) for name in self.columns}}
        ids = inv.invited
        pos = np.searchsorted(ids, arrived["id"])
        came = np.zeros(len(ids), dtype=bool)
        came[pos] = True
        loss = np.full(len(ids), np.nan)
        loss[pos] = arrived["loss"]
        dur = (self.clock.durations(ids) if self.clock is not None
               else np.full(len(ids), np.nan))
        examples = np.asarray(self.sizes_of(ids), dtype=np.int64)
        if self.selector.wants_feedback:
            self.selector.feedback(ClientFeedback(r, ids, came, loss, dur, examples, round_s))
        cols: dict[str, Any] = {"client_id": ids, "arrived": came, "loss": loss,
                                "examples": examples, "duration_s": dur}
        for name, values in arrived.items():
            if name not in ("id", "loss", "examples"):
                col = np.full(len(ids), np.nan)
                col[pos] = values
                cols[name] = col
        return pa.table(cols)


def row_columns(client: Any, aggregator: Any, per_round: Any) -> tuple[str, ...]:
    """The per-client values a round's participants table holds beyond its fixed columns,
    in this order: the client part's (``columns``: IFCA's cluster), the aggregator's
    (Exp-alpha's log weight) and what ``data.per_round`` drew for the client (its ratio,
    whether it is flipped). The worker records them in ``ClientContext.columns``."""
    return tuple(dict.fromkeys((*client.columns, *aggregator.columns,
                                *drawn_columns(per_round))))


def merge_arrived(parts: list[dict[str, np.ndarray] | None]) -> dict[str, np.ndarray] | None:
    """The workers' reports of their aggregated clients as one, sorted by client id (the
    same whatever the worker count)."""
    parts = [p for p in parts if p is not None]
    if not parts:
        return None
    out = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    order = np.argsort(out["id"], kind="stable")
    return {k: v[order] for k, v in out.items()}
