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

from fedray.core.seeding import TAG_BUFFERED
from fedray.errors import FedrayError
from fedray.timing.online_sampling import DRAWS_PER_CLIENT
from fedray.timing.rounds import RoundClock
from fedray.timing.streams import hash64, stream_key

CHUNK = 8  # candidates checked for being online at once


class _Candidates:
    """One stream of uniformly drawn client ids, (seed, TAG_BUFFERED, position), read in
    order: each freed slot takes the next candidate online at that moment and free to
    train. A pure function of the seed, so the schedule is; the cost per slot follows the
    online share, never the population."""

    def __init__(self, clock: RoundClock, population: int):
        self.clock, self.population = clock, population
        self.key = stream_key(clock.seed, TAG_BUFFERED)
        self.position = 0
        self.limit = DRAWS_PER_CLIENT if clock.max_draws is None else clock.max_draws

    def next(self, t: float, busy: set[int]) -> int:
        tried = 0
        while tried < self.limit:
            pos = np.arange(self.position, self.position + CHUNK, dtype=np.int64)
            cand = (hash64(self.key, pos) % np.uint64(self.population)).astype(np.int64)
            online = self.clock.availability.online(cand, t)
            for i, c in enumerate(cand.tolist()):
                if online[i] and c not in busy:
                    self.position += i + 1
                    return c
            self.position += CHUNK
            tried += CHUNK
        raise FedrayError(f"sampling.concurrency: no client online and free at simulated "
                          f"t = {t:g} s after {tried} draws; lower the concurrency or "
                          f"widen the availability windows")


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
    population = clock.population
    if not 1 <= concurrency <= population:
        raise FedrayError(f"sampling.concurrency: must be in [1, the population of "
                          f"{population}], got {concurrency}")
    # (time, client, arrives, start version, start time)
    events: list[tuple[float, int, bool, int, float]] = []
    busy: set[int] = set()  # training, or in the current buffer
    buffer: list[tuple[int, int, float]] = []  # (client, start version, start time)
    out: list[BufferedStep] = []
    candidates = _Candidates(clock, population)
    version = 0
    dropped = 0

    def start(t: float, n: int) -> None:
        ids = []
        for _ in range(n):
            ids.append(candidates.next(t, busy))
            busy.add(ids[-1])
        if not ids:
            return
        a = np.array(ids, dtype=np.int64)
        finish = t + clock.durations(a)
        until = clock.availability.online_until(a, t)
        for cid, f, u in zip(ids, finish.tolist(), until.tolist(), strict=True):
            arrives = f <= u
            heapq.heappush(events, (f if arrives else u, cid, arrives, version, t))

    start(0.0, concurrency)
    while len(out) < steps:
        t = events[0][0]
        freed = 0
        while events and events[0][0] == t:
            _, cid, arrives, v, began = heapq.heappop(events)
            freed += 1
            if not arrives:
                busy.discard(cid)
                dropped += 1
                continue
            buffer.append((cid, v, began))  # busy until its step is applied
            if len(buffer) == k:
                busy.difference_update(c for c, _, _ in buffer)
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
