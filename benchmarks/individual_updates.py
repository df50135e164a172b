"""Individual updates (Aggregator.individual) against the partial sum: what an aggregator
that sees every client's update costs the driver, in memory and round time.

The same job once per path (``--paths``), each in a process of its own (so that each
process's peak memory is its own): the MLP (model.name mlp, 784-200-62: 169,462 parameters)
on 1000 synthetic clients, ``--clients`` a round, ``runtime.backend: inline`` with 2 workers
(the driver and the workers in this one process, so its memory counts the workers' rows as
well as the driver's: an upper bound on what the driver alone holds on Ray). The
partial-sum paths (proportional FedAvg, alone or behind the norm_bound stage: each worker
folds its clients into one float64 sum) against the individual ones (examples/median.py's
median, or a built-in robust aggregator: every kept client's float32 update reaches the
driver, which calls ``aggregate`` once with the (k, d) rows).

Reported per path: the (k, d) float32 buffer's size (k x d x 4 bytes; none for the sum),
the process's peak resident memory (ru_maxrss) and its resident memory sampled every 2 ms
during the rounds after the first (peak above what it held when round 2 began), the median
round time (train_s) and driver merge time (merge_s) over the rounds after the first, and
the workers' busy time (metric worker_busy_s: training, and copying each update into its
row), the median time of the aggregation step itself (``finish`` on the merged sum, or
``aggregate`` on the rows: timed around the call).

    python benchmarks/individual_updates.py                    # 100 clients a round, 4 rounds
    python benchmarks/individual_updates.py --clients 20 --rounds 3   # quick
    python benchmarks/individual_updates.py --clients 1000 --rounds 3 --paths proportional \\
        norm_bound trimmed_mean median            # the robust aggregators (docs/robustness.md)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, REPO)

# --paths KEY: (label, aggregator, update stages)
PATHS = {"proportional": ("partial sum (proportional)", "proportional", []),
         "norm_bound": ("partial sum + norm_bound stage", "proportional", ["norm_bound"]),
         "example_median": ("individual (examples.median:Median)", "examples.median:Median",
                            []),
         "median": ("individual (median)", "median", []),
         "trimmed_mean": ("individual (trimmed_mean, beta 0.1)", "trimmed_mean", []),
         "krum": ("individual (krum, f 1)", "krum", []),
         "multi_krum": ("individual (multi_krum, f 1)", "multi_krum", [])}


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class _Sampler(threading.Thread):
    """The process's resident memory, every 2 ms, from when ``start_round`` is set."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.base: float | None = None
        self.peak = 0.0
        self.armed = threading.Event()
        self.done = threading.Event()

    def run(self) -> None:
        self.armed.wait()
        self.base = _rss_mb()
        while not self.done.is_set():
            self.peak = max(self.peak, _rss_mb())
            time.sleep(0.002)


def child(key: str, clients: int, rounds: int, out: str) -> dict:
    import fedray
    from fedray.algorithms.base import Aggregator
    from fedray.tracking.callbacks import Callback

    times: list[float] = []

    def timed(fn):
        def wrapper(self, *args):
            t = time.perf_counter()
            try:
                return fn(self, *args)
            finally:
                times.append(time.perf_counter() - t)
        return wrapper

    _, aggregator, stages = PATHS[key]
    if aggregator == "proportional":
        Aggregator.finish = timed(Aggregator.finish)
    elif aggregator.startswith("examples."):
        from examples.median import Median

        Median.aggregate = timed(Median.aggregate)
    else:
        from fedray.algorithms import registry

        cls = registry.registered("aggregator")[aggregator]
        cls.aggregate = timed(cls.aggregate)
    sampler = _Sampler()
    sampler.start()

    class Arm(Callback):
        def on_round_end(self, round: int, metrics: dict, weights: dict | None = None) -> None:
            if round == 1:
                sampler.armed.set()

    job = {"name": "individual", "seed": 0, "rounds": rounds,
           "data": {"synthetic": {"num_clients": 1000, "test_writers": 2}},
           "model": {"name": "mlp"}, "client": {"lr": 0.01, "batch_size": 16},
           "sampling": {"clients_per_round": clients},
           "algorithm": {"aggregator": aggregator, "stages": stages},
           "runtime": {"backend": "inline", "num_workers": 2, "worker": {"num_cpus": 1}},
           "eval": {"every": 0, "central": False},
           "output": {"dir": out, "tensorboard": False, "save_weights": False}}
    res = fedray.run(job, callbacks=[Arm()])
    sampler.done.set()
    sampler.join()
    later = res.metrics[1:]
    d = sum(v.numel() for v in res.weights.values())
    return {"k": clients, "d": d,
            "buffer_mb": clients * d * 4 / 2**20 if aggregator != "proportional" else 0.0,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "round_rss_above_mb": sampler.peak - (sampler.base or 0.0),
            "train_s": statistics.median(m["train_s"] for m in later),
            "merge_s": statistics.median(m["merge_s"] for m in later),
            "worker_s": statistics.median(m["worker_busy_s"] for m in later),
            "aggregate_s": statistics.median(times[1:] or times),
            "vectorized": res.summary["vectorized"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--paths", nargs="+", choices=list(PATHS),
                    default=["proportional", "example_median"],
                    help="the aggregation paths to measure, each in a process of its own")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        with tempfile.TemporaryDirectory() as out:
            print(json.dumps(child(a.child, a.clients, a.rounds, out)))
        return 0
    rows = {}
    for key in a.paths:
        label = PATHS[key][0]
        out = subprocess.run([sys.executable, __file__, "--child", key, "--clients",
                              str(a.clients), "--rounds", str(a.rounds)], cwd=REPO,
                             capture_output=True, text=True)
        if out.returncode:
            sys.stderr.write(out.stderr[-3000:])
            return 1
        rows[label] = json.loads(out.stdout.strip().splitlines()[-1])
    first = next(iter(rows.values()))
    print(f"MLP d={first['d']:,}, k={a.clients} clients a round, {a.rounds} rounds, inline "
          f"backend, 2 workers (vectorized: {first['vectorized']}); medians over rounds 2..")
    print("| path | (k, d) buffer MB | peak RSS MB | RSS above round 2's start MB | "
          "round s | workers' busy s | merge s | aggregation step s |")
    print("|---|---|---|---|---|---|---|---|")
    for label, r in rows.items():
        print(f"| {label} | {r['buffer_mb']:.1f} | {r['peak_rss_mb']:.0f} | "
              f"{r['round_rss_above_mb']:.0f} | {r['train_s']:.2f} | {r['worker_s']:.2f} | "
              f"{r['merge_s']:.3f} | "
              f"{r['aggregate_s']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
