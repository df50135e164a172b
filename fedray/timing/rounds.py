"""Synchronous rounds on the simulated clock: who trains in round r, and when it ends.

With ``clock.enabled`` the driver asks this module, instead of the clock-free
``fedray.core.sampling.select_round``, which clients take part. The round starts at the
simulated time the previous one ended. k (or ``ceil(k * (1 + over_selection))``, counted
exactly by fedray.core.sampling.over_selected) clients are sampled among those online then
(fedray.timing.online_sampling), those that ``sampling.dropout`` removes never start, and
the rest run an update whose duration comes from their device profile and the examples
their local passes touch (fedray.timing.clock).
``synchronous_round`` decides who is kept (trained and aggregated), who went offline
mid-update (dropped) and who was still running when the server closed the round (late: not
trained, since a real server would discard the work). Everything is a pure function of
(seed, round, the start time, the traces, the config), so 1 or 3 workers, or a resumed
run, see the same schedule.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from fedray.core.sampling import over_selected, stay
from fedray.timing.availability import AlwaysOnline, Availability, Diurnal
from fedray.timing.clock import RoundOutcome, examples_processed, synchronous_round, update_times
from fedray.timing.devices import DeviceModel, LogNormalDevices
from fedray.timing.online_sampling import sample_online

if TYPE_CHECKING:  # the section's type only: timing loads no omegaconf
    from fedray.config import ClockConfig

BYTES_PER_PARAMETER = 4  # float32 weights down, a float32 update up


@dataclass(frozen=True)
class LocalWork:
    """How much local training one update is, as the client section sets it."""

    batch_size: int
    local_epochs: int
    local_steps: int | None
    steps_per_epoch: int | None = None  # client.steps_per_epoch: batch = ceil(n / this)
    full_batch: bool = False  # FedSGD: one step on all of a client's examples
    independent: bool = False  # every step its own batch (LOCALUPDATE)

    def processed(self, examples: np.ndarray) -> np.ndarray:
        """Examples one update touches, per client of ``examples`` (their train sizes)."""
        n = np.asarray(examples, dtype=np.int64)
        if self.full_batch:
            return n.copy()
        if self.steps_per_epoch is None:
            return examples_processed(n, batch_size=self.batch_size,
                                      local_epochs=self.local_epochs,
                                      local_steps=self.local_steps,
                                      independent=self.independent)
        return np.array([examples_processed(
            [m], batch_size=max(1, math.ceil(m / self.steps_per_epoch)),
            local_epochs=self.local_epochs, local_steps=self.local_steps,
            independent=self.independent)[0] for m in n], dtype=np.int64)


def device_model(clock: ClockConfig, seed: int) -> DeviceModel:
    """clock.devices as a device model (a trace file is read here)."""
    d = clock.devices
    if d.source == "trace":
        # imported when used, not at the top: it loads pyarrow (start-up time)
        from fedray.timing.traces import read_device_trace

        return read_device_trace(d.trace)
    return LogNormalDevices(seed, compute_s_per_example=d.compute_s_per_example,
                            compute_sigma=d.compute_sigma,
                            down_bytes_per_s=d.down_bytes_per_s, down_sigma=d.down_sigma,
                            up_bytes_per_s=d.up_bytes_per_s, up_sigma=d.up_sigma)


def availability_model(clock: ClockConfig, seed: int) -> Availability:
    """clock.availability as an availability model (a trace file is read here)."""
    a = clock.availability
    if a.model == "trace":
        # imported when used, not at the top: it loads pyarrow (start-up time)
        from fedray.timing.traces import read_availability_trace

        return read_availability_trace(a.trace)
    if a.model == "diurnal":
        return Diurnal(seed, period_s=a.period_s, online_s=a.online_s,
                       phase_spread_s=a.phase_spread_s, jitter_s=a.jitter_s)
    return AlwaysOnline()


@dataclass(frozen=True)
class ClockedSelection:
    """A round's participants on the clock, with the counts metrics.jsonl reports."""

    participants: np.ndarray  # kept: trained and aggregated, sorted
    sampled: int  # online clients drawn (k, or more with over-selection)
    dropped_out: int  # sampling.dropout, and those that went offline mid-update
    late: int  # still running when the round closed: not trained
    outcome: RoundOutcome


class RoundClock:
    """The simulated clock of a synchronous run: its devices, availability and bytes."""

    def __init__(self, clock: ClockConfig, seed: int,
                 sizes: np.ndarray | Callable[[np.ndarray], np.ndarray], num_params: int,
                 work: LocalWork, update_bytes: int | None = None,
                 population: int | None = None):
        """``sizes``: every client's train count, or a function giving the counts of the
        ids it is passed (fedray.data.client_source.sizes_of), with ``population`` -- the clock
        then asks for the clients it draws alone, never the population's.
        ``update_bytes``: what one update costs on the uplink as the job's update stages
        encode it (compressed, say); None: the model in float32. clock.up_bytes, when set,
        overrides it."""
        self.seed = seed
        if callable(sizes):
            if population is None:
                raise ValueError("RoundClock: sizes given as a function needs population")
            self.population, self.sizes_of = int(population), sizes
        else:
            every = np.asarray(sizes, dtype=np.int64)
            self.population, self.sizes_of = len(every), every.__getitem__
        self.devices = device_model(clock, seed)
        self.availability = availability_model(clock, seed)
        default = float(BYTES_PER_PARAMETER * num_params)
        up = default if update_bytes is None else float(update_bytes)
        self.down_bytes = default if clock.down_bytes is None else float(clock.down_bytes)
        self.up_bytes = up if clock.up_bytes is None else float(clock.up_bytes)
        self.deadline_s = clock.deadline_s
        self.max_draws = clock.max_sample_draws
        self.work = work

    def durations(self, ids: np.ndarray) -> np.ndarray:
        """Simulated seconds of each client's update (download, local passes, upload)."""
        times = update_times(self.devices.profiles(ids), self.work.processed(self.sizes_of(ids)),
                             down_bytes=self.down_bytes, up_bytes=self.up_bytes)
        return times.total_s

    def select(self, round_idx: int, start_s: float, k: int, *, dropout: float = 0.0,
               over_selection: float = 0.0) -> ClockedSelection:
        """Round ``round_idx``, starting at simulated time ``start_s``."""
        population = self.population
        n = over_selected(k, over_selection, population)
        ids = self.sample(round_idx, start_s, n)
        return self.run(round_idx, start_s, ids, k, dropout=dropout)

    def sample(self, round_idx: int, start_s: float, n: int, exclude: Any = (),
               partial: bool = False) -> np.ndarray:
        """``n`` clients online at ``start_s``, uniformly, none of ``exclude``: the round's
        stream (fedray.timing.online_sampling); ``partial``: fewer where fewer are found."""
        return sample_online(self.seed, round_idx, self.population, n, self.availability,
                             start_s, exclude=exclude, max_draws=self.max_draws,
                             partial=partial).ids

    def run(self, round_idx: int, start_s: float, ids: np.ndarray, k: int, *,
            dropout: float = 0.0) -> ClockedSelection:
        """Round ``round_idx`` on the clock with the invited ``ids`` (sorted): those
        ``dropout`` removes never start; the rest run until the round closes
        (``synchronous_round``)."""
        started = stay(self.seed, round_idx, ids, dropout)  # as without the clock
        outcome = synchronous_round(start_s, started, self.durations(started),
                                    self.availability.online_until(started, start_s), k,
                                    deadline_s=self.deadline_s)
        return ClockedSelection(outcome.kept, len(ids),
                                len(ids) - len(started) + len(outcome.dropped),
                                len(outcome.late), outcome)

    def probe_s(self, ids: np.ndarray, share: float) -> float:
        """How long a loss probe of ``ids`` keeps the round waiting: the slowest client's
        model download plus ``share`` of a training example's compute per example it
        holds (a forward pass over its data); its answer, one number, costs no upload."""
        if not len(ids):
            return 0.0
        profiles = self.devices.profiles(ids)
        work = np.asarray(self.sizes_of(ids), dtype=np.float64) * share
        times = update_times(profiles, work, down_bytes=self.down_bytes, up_bytes=0.0)
        return float((times.download_s + times.compute_s).max())
