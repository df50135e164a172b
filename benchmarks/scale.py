"""Population scale: does a round cost the same with 1,000 or 100,000 clients?

Runs the same job (TFF EMNIST CNN, synthetic FEMNIST writers of 30-90 examples, 20 clients
per round, 1 local epoch, batch 20) over populations of different sizes and reports the
median steady-state round time and the driver actor's resident memory. Clients are virtual
and generated lazily, so neither should depend on the population.

    python benchmarks/scale.py                       # 1,000 vs 100,000
    python benchmarks/scale.py --populations 1000 100000 1000000 --rounds 8
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--populations", type=int, nargs="+", default=[1_000, 100_000])
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--model", default="emnist_cnn")
    args = p.parse_args(argv)

    import ray

    import fedray

    t0 = time.perf_counter()
    ray.init(include_dashboard=False, logging_level="ERROR")
    print(f"ray start-up: {time.perf_counter() - t0:.1f}s (not counted)")
    rows = []
    try:
        for n in args.populations:
            with tempfile.TemporaryDirectory() as tmp:
                res = fedray.run({
                    "name": f"scale-{n}", "rounds": args.rounds,
                    "data": {"synthetic": {"num_clients": n}},
                    "model": {"name": args.model},
                    "client": {"lr": 0.05, "batch_size": 20, "local_epochs": 1},
                    "sampling": {"clients_per_round": 20},
                    "eval": {"every": 0, "central": False},
                    "output": {"dir": f"{tmp}/run", "save_weights": False}})
            steady = [m["wall_s"] for m in res.metrics[args.warmup:]]
            rss = [m["driver_mem_mb"] for m in res.metrics]
            row = (n, statistics.median(steady), rss[0], rss[-1])
            rows.append(row)
            print(f"population {n:>9,}: median round {row[1]:.3f}s, driver private memory "
                  f"{row[2]:.0f} MB after round 1, {row[3]:.0f} MB after round {args.rounds}",
                  flush=True)
    finally:
        ray.shutdown()
    base = rows[0]
    for n, t, _, rss in rows[1:]:
        print(f"{n:,} vs {base[0]:,}: round time {t / base[1]:.2f}x, driver memory "
              f"{rss - base[3]:+.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
