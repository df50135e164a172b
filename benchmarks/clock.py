"""The simulated clock's cost on the driver (docs/performance.md, "The simulated clock").

Per synchronous round: sampling k online clients and their update durations
(fedray.timing.rounds.RoundClock.select). Per buffered step (FedBuff): the schedule's
share of fedray.timing.buffered.buffered_schedule, with concurrency 2k. Populations of
1,000 to 1,000,000 clients, always online or diurnal (8 h a day).

    python benchmarks/clock.py
"""

from __future__ import annotations

import time

import numpy as np
from omegaconf import OmegaConf

from fedray.config import ClockConfig
from fedray.timing.buffered import buffered_schedule
from fedray.timing.rounds import LocalWork, RoundClock

ROUNDS = 20
CASES = ((1_000, 10), (100_000, 100), (1_000_000, 1_000))  # (population, k)


def main() -> None:
    print("| population | k | availability | synchronous round | buffered step |")
    print("|---|---|---|---|---|")
    for population, k in CASES:
        sizes = np.full(population, 100)
        for availability in ("always", "diurnal"):
            cfg = OmegaConf.merge(OmegaConf.structured(ClockConfig),
                                  {"enabled": True, "availability": {"model": availability}})
            clock = RoundClock(cfg, 0, sizes, num_params=1_000_000,
                               work=LocalWork(20, 1, None))
            start, t = time.perf_counter(), 0.0
            for r in range(1, ROUNDS + 1):
                t = clock.select(r, t, k).outcome.end_s
            per_round = (time.perf_counter() - start) / ROUNDS
            start = time.perf_counter()
            buffered_schedule(clock, 2 * k, k, ROUNDS)
            per_step = (time.perf_counter() - start) / ROUNDS
            print(f"| {population:,} | {k:,} | {availability} | {per_round * 1e3:.1f} ms | "
                  f"{per_step * 1e3:.1f} ms |")


if __name__ == "__main__":
    main()
