"""The simulated clock's cost on the driver (docs/performance.md, "The simulated clock").

Per synchronous round: sampling k online clients and their update durations
(fedray.timing.rounds.RoundClock.select). Per buffered step (FedBuff): the schedule's
share of fedray.timing.buffered.buffered_schedule, with concurrency 2k. Populations of
1,000 to 1,000,000 clients, always online or diurnal (8 h a day).

    python benchmarks/clock.py
"""

import time, numpy as np
from omegaconf import OmegaConf
from fedray.config import ClockConfig
from fedray.timing.rounds import LocalWork, RoundClock
from fedray.timing.buffered import buffered_schedule
for pop, k in ((1000, 10), (100_000, 100), (1_000_000, 1000)):
    sizes = np.full(pop, 100)
    for avail in ("always", "diurnal"):
        cfg = OmegaConf.merge(OmegaConf.structured(ClockConfig), {"enabled": True, "availability": {"model": avail}})
        c = RoundClock(cfg, 0, sizes, num_params=1_000_000, work=LocalWork(20, 1, None))
        t0 = time.perf_counter(); t = 0.0
        for r in range(1, 21):
            t = c.select(r, t, k).outcome.end_s
        sel = (time.perf_counter() - t0) / 20
        t0 = time.perf_counter(); s = buffered_schedule(c, 2 * k, k, 20)
        buf = (time.perf_counter() - t0) / 20
        print(f"pop {pop:>9,} k {k:>5} {avail:>8}: sync select {sel*1e3:7.2f} ms/round; buffered schedule {buf*1e3:8.2f} ms/step")
