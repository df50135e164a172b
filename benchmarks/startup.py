"""Run start-up: the wall time of a short fedray.run, and how long its driver waits for its
workers to be ready.

A sweep of many short trials, a notebook re-running a job, the test suite: all pay a run's
fixed cost many times. Most of it is processes importing torch (1-2 s each): the driver's
and its workers'. fedray.run starts the workers' processes beside the driver's
(fedray.runtime.pool.launch_workers), so the two imports overlap instead of following each other.
``pool_start_s`` (summary.json) is what is left of the wait once the driver has its spec.

    python benchmarks/startup.py              # 6 runs of a 3-round job, in one Ray session
    python benchmarks/startup.py --runs 10 --json startup.json

The job is the test suite's ``tiny_job`` (tests/conftest.py), the run the suite pays for most
often: logistic regression on 40 synthetic writers, 8 clients per round, 3 rounds, two
workers of one CPU, clients one after another; its rounds take well under a second.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

from conftest import tiny_job  # noqa: E402  (the test suite's job: the run it pays most often)

import fedray.api  # noqa: E402  (imported here, so the first run does not pay for it)


def time_runs(runs: int, out_dir: str) -> list[dict]:
    """``runs`` runs of tiny_job one after another in the current Ray session, each timed."""
    rows = []
    for i in range(runs):
        job = tiny_job(pathlib.Path(out_dir) / f"run{i}")
        t0 = time.perf_counter()
        result = fedray.api.run(job)
        wall = time.perf_counter() - t0
        s = result.summary
        rows.append({"wall_s": wall, "pool_start_s": s["pool_start_s"],
                     "rounds_s": s["total_s"], "workers": s["num_workers"]})
        print(f"run {i + 1}/{runs}: {wall:5.2f}s, of which the driver waited "
              f"{s['pool_start_s']:.2f}s for its workers and the rounds took "
              f"{s['total_s']:.2f}s", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=6, help="runs to time (default 6)")
    p.add_argument("--num-cpus", type=int, default=2,
                   help="CPUs of the local Ray instance (default 2: two workers)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs must be at least 1")

    import ray

    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=args.num_cpus, include_dashboard=False, logging_level="ERROR")
    try:
        with tempfile.TemporaryDirectory() as out_dir:
            rows = time_runs(args.runs, out_dir)
    finally:
        if started:
            ray.shutdown()
    result = {"runs": rows,
              "median_wall_s": statistics.median(r["wall_s"] for r in rows),
              "median_pool_start_s": statistics.median(r["pool_start_s"] for r in rows)}
    print(f"median of {len(rows)}: {result['median_wall_s']:.2f}s a run, "
          f"{result['median_pool_start_s']:.2f}s waiting for workers")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
