"""The schedule of buffered asynchronous training (FedBuff, Nguyen et al., AISTATS 2022) on
the simulated clock, computed ahead of any training.

``concurrency`` clients train at every simulated moment. A client starts from the model
version current when it starts; its update arrives after its simulated duration (or never,
if it goes offline first) and enters the server's buffer; every K arrivals (``k``) the
server applies the buffer and the version advances. The finished or dropped client's slot
is given at once to another client online then. Which client starts when, from which
version, and which K updates make server step s depend on the clock alone, never on the
model's values -- so the whole schedule is a pure function of (seed, traces, config),
computed before round 1 and recomputed identically on resume. The runtime then trains step
s like a round whose clients carry their start versions (fedray.runtime.driver).

Rules, so that the schedule is well defined:
- events at the same simulated moment are handled together, in client-id order: every
  arrival and drop of that moment first (the buffer may be applied in between), then the
  freed slots are refilled, from the version current after them;
- a replacement is sampled among the clients online then that are neither training nor
  already in the current buffer, so a client contributes at most once per server step
  (its training seed is then (seed, step, client id), as in a synchronous round);
- the staleness of an update applied at step s that started from version v is s - 1 - v.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from fedray.errors import FedrayError
from fedray.timing.online_sampling import sample_online
from fedray.timing.rounds import RoundClock


@dataclass(frozen=True)
class BufferedStep:
    """Server step ``step`` (1-based): the K updates it applies, in arrival order."""

    step: int
    end_s: float  # when its K-th update arrived (the server applies the buffer then)
    client_ids: np.ndarray
    start_versions: np.ndarray  # the model version each started from (0: the initial one)
    start_s: np.ndarray  # when each started (its update arrived start_s + its duration)
    dropped: int  # clients that went offline mid-update since the previous step

    @property
    def staleness(self) -> np.ndarray:
        return self.step - 1 - self.start_versions


def buffered_schedule(clock: RoundClock, concurrency: int, k: int, steps: int
                      ) -> list[BufferedStep]:
    """The first ``steps`` server steps of buffered asynchronous training on ``clock``
    (its seed, devices, availability and local work)."""
    population = len(clock.sizes)
    if not 1 <= concurrency <= population:
        raise FedrayError(f"sampling.concurrency: must be in [1, the population of "
                          f"{population}], got {concurrency}")
    # (time, client, arrives, start version, start time)
    events: list[tuple[float, int, bool, int, float]] = []
    training: set[int] = set()
    buffer: list[tuple[int, int, float]] = []  # (client, start version, start time)
    out: list[BufferedStep] = []
    draws = 0
    version = 0
    dropped = 0

    def start(t: float, n: int) -> None:
        nonlocal draws
        for _ in range(n):
            banned = np.array(sorted(training | {b[0] for b in buffer}), dtype=np.int64)
            cid = int(sample_online(clock.seed, draws, population, 1, clock.availability, t,
                                    exclude=banned, max_draws=clock.max_draws).ids[0])
            draws += 1
            ids = np.array([cid])
            finish = t + float(clock.durations(ids)[0])
            until = float(clock.availability.online_until(ids, t)[0])
            arrives = finish <= until
            heapq.heappush(events, (finish if arrives else until, cid, arrives, version, t))
            training.add(cid)

    start(0.0, concurrency)
    while len(out) < steps:
        t = events[0][0]
        freed = 0
        while events and events[0][0] == t:
            _, cid, arrives, v, began = heapq.heappop(events)
            training.discard(cid)
            freed += 1
            if not arrives:
                dropped += 1
                continue
            buffer.append((cid, v, began))
            if len(buffer) == k:
                ids, versions, starts = (np.array(a) for a in zip(*buffer, strict=True))
                out.append(BufferedStep(len(out) + 1, t, ids.astype(np.int64),
                                        versions.astype(np.int64), starts.astype(np.float64),
                                        dropped))
                version += 1
                buffer, dropped = [], 0
                if len(out) == steps:
                    break
        start(t, freed)
    return out


def versions_needed(schedule: list[BufferedStep]) -> dict[int, int]:
    """For each model version some step's clients start from: the last step that needs it
    (the driver keeps that version's weights until then)."""
    last: dict[int, int] = {}
    for s in schedule:
        for v in np.unique(s.start_versions):
            last[int(v)] = s.step
    return last
