"""Scale: does a round cost the same with 1,000 or 100,000,000 clients, and how does it grow
with the clients of a round?

The default mode runs the same job (TFF EMNIST CNN by default, 1 local epoch, batch 20) over
synthetic populations (``--populations``) or partition stores (``--stores``, data.verify
off: its cost is the store benchmark's) and reports the median steady-state round time,
updates per second, the driver's merge time and the driver actor's private memory. With
several ``--clients-per-round`` it runs each K on the one population instead.

    python benchmarks/scale.py                       # 1,000 vs 100,000 synthetic clients
    python benchmarks/scale.py --stores S_1K S_100K S_1M --clients-per-round 100
    python benchmarks/scale.py --model logreg --clients-per-round 1000 5000 10000

``--first-round POP...``: how long fedray.run takes to start round 1, and the driver's
memory, for each synthetic population (logistic regression, 1,000 clients per round, 3
rounds, Ray; Ray's own start-up is not counted). ``--per-round-k K...``: the driver's own
milliseconds per round (sampling, sizes, assignment, tasks, merging, bookkeeping: the
round's time less the workers' training) against clients per round, with the inline
backend (logistic regression, 1,000,000 synthetic clients; ``--algorithm scaffold`` adds
the client state index).

    python benchmarks/scale.py --first-round 1000 100000000
    python benchmarks/scale.py --per-round-k 1000 5000 10000

``--selectors``: a selector's own driver cost per round (fedray.runtime.participation:
its ``select`` with the round's draws, and its ``feedback``) over a population of
100,000,000, on the simulated clock, without training: every invitee arrives with a
random loss, the probe's losses are random (its cost is the workers'), so what is timed is
the driver's alone -- at round 1 and after hundreds of rounds, when Oort has seen
rounds x k clients.

    python benchmarks/scale.py --selectors uniform power_of_choice oort
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def _job(tmp: str, name: str, rounds: int, data: dict, model: str, k: int, **extra) -> dict:
    """The benchmark's one job: 1 local epoch, batch 20, lr 0.05, no evaluation, no weights
    saved; every mode varies only the data, the model and the clients per round."""
    return {"name": name, "rounds": rounds, "data": data, "model": {"name": model},
            "client": {"lr": 0.05, "batch_size": 20, "local_epochs": 1},
            "sampling": {"clients_per_round": k}, "eval": {"every": 0, "central": False},
            "output": {"dir": f"{tmp}/run", "save_weights": False}, **extra}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--populations", type=int, nargs="+", default=[1_000, 100_000],
                   help="synthetic populations to compare (the default mode)")
    p.add_argument("--stores", nargs="+", metavar="URL",
                   help="partition stores to compare instead (data.verify off: timed apart)")
    p.add_argument("--clients-per-round", type=int, nargs="+", default=[20], metavar="K",
                   help="clients per round; several: one run per K (the population fixed)")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--model", default="emnist_cnn")
    p.add_argument("--first-round", type=int, nargs="+", metavar="POP",
                   help="time to round 1 and driver memory per synthetic population")
    p.add_argument("--per-round-k", type=int, nargs="+", metavar="K",
                   help="driver milliseconds per round against clients per round (inline)")
    p.add_argument("--algorithm", default="fedavg", help="with --per-round-k")
    p.add_argument("--selectors", nargs="+", metavar="NAME",
                   help="driver ms per round of each selector at 10^8 clients (no training)")
    p.add_argument("--population", type=int, default=100_000_000, help="with --selectors")
    args = p.parse_args(argv)
    if args.selectors:
        return selector_cost(args.selectors, args.population, args.clients_per_round,
                             args.rounds)
    if args.first_round:
        return first_round(args.first_round)
    if args.per_round_k:
        return per_round(args.per_round_k, args.algorithm)

    import ray

    import fedray

    datas = ([{"partition": url, "verify": False} for url in args.stores] if args.stores else
             [{"synthetic": {"num_clients": n}} for n in args.populations])
    cases = [(d, k) for d in datas for k in args.clients_per_round]
    t0 = time.perf_counter()
    ray.init(include_dashboard=False, logging_level="ERROR")
    print(f"ray start-up: {time.perf_counter() - t0:.1f}s (not counted); {args.model}, "
          f"1 local epoch, batch 20, {args.rounds} rounds (median of rounds "
          f"{args.warmup + 1}..), {int(ray.cluster_resources()['CPU'])} CPUs, default pool")
    print("| data | clients per round | median round s | updates/s | driver merge ms | "
          "driver MB after round 1 | after the last | worker MB after round 1 | "
          "largest worker MB |")
    print("|---|---|---|---|---|---|---|---|---|")
    rows = []
    try:
        for data, k in cases:
            with tempfile.TemporaryDirectory() as tmp:
                res = fedray.run(_job(tmp, "scale", args.rounds, data, args.model, k))
            steady = res.metrics[args.warmup:]
            wall = statistics.median(m["wall_s"] for m in steady)
            merge = statistics.median(m["merge_s"] for m in steady) * 1e3
            rss = [m["driver_mem_mb"] for m in res.metrics]
            worker = [m["worker_mem_mb"] for m in res.metrics]  # the largest worker's
            name = data.get("partition") or f"synthetic {res.summary['population']:,}"
            rows.append((name, k, wall, rss[-1]))
            print(f"| {name} ({res.summary['population']:,} clients) | {k:,} | {wall:.3f} | "
                  f"{k / wall:.0f} | {merge:.1f} | {rss[0]:.0f} | {rss[-1]:.0f} | "
                  f"{worker[0]:.0f} | {max(worker):.0f} |", flush=True)
    finally:
        ray.shutdown()
    if len(args.clients_per_round) == 1:
        base = rows[0]
        for name, _, t, rss in rows[1:]:
            print(f"{name} vs {base[0]}: round time {t / base[2]:.2f}x, driver memory "
                  f"{rss - base[3]:+.0f} MB")
    return 0


def first_round(populations: list[int], k: int = 1_000, rounds: int = 3) -> int:
    """Seconds from fedray.run to the start of round 1 (the driver's setup, its workers'
    start, the source built and shipped) and to the end of round 1, and the driver's
    private memory after each round."""
    import ray

    import fedray
    from fedray.tracking.callbacks import Callback

    class Times(Callback):
        def __init__(self) -> None:
            self.start, self.ends = 0.0, []

        def on_run_start(self, run) -> None:
            self.start = time.perf_counter()

        def on_round_end(self, round, metrics, weights) -> None:
            self.ends.append(time.perf_counter())

    ray.init(include_dashboard=False, logging_level="ERROR")
    print(f"ray start-up and a warm-up run: not counted; logistic "
          f"regression, {k:,} clients per round, {rounds} rounds, "
          f"{int(ray.cluster_resources()['CPU'])} CPUs")
    rows = []
    try:
        # uncounted: the first run in a process also pays for imports and Ray's first
        # worker processes, whatever its population
        with tempfile.TemporaryDirectory() as tmp:
            fedray.run(_job(tmp, "warm-up", 1, {"synthetic": {"num_clients": 100}}, "logreg",
                            10))
        for n in populations:
            times = Times()
            with tempfile.TemporaryDirectory() as tmp:
                t0 = time.perf_counter()
                res = fedray.run(_job(tmp, f"first-round-{n}", rounds,
                                      {"synthetic": {"num_clients": n}}, "logreg", k),
                                 callbacks=[times])
            setup, first = times.start - t0, times.ends[0] - t0
            driver = [m["driver_mem_mb"] for m in res.metrics]
            rows.append((n, setup, first, driver))
            walls = ", ".join(f"{m['wall_s']:.2f}" for m in res.metrics)
            workers = ", ".join(f"{m['worker_mem_mb']:.0f}" for m in res.metrics)
            print(f"population {n:>11,}: round 1 starts after {setup:.1f}s and ends after "
                  f"{first:.1f}s; rounds {walls} s; driver private MB after each round "
                  f"{', '.join(f'{d:.0f}' for d in driver)}; largest worker MB {workers}",
                  flush=True)
    finally:
        ray.shutdown()
    base = rows[0]
    for n, setup, first, driver in rows[1:]:
        print(f"{n:,} vs {base[0]:,}: round 1 starts {setup - base[1]:+.1f}s later, ends "
              f"{first - base[2]:+.1f}s later; driver memory after round 1 "
              f"{driver[0] - base[3][0]:+.0f} MB, after round {rounds} "
              f"{driver[-1] - base[3][-1]:+.0f} MB")
    return 0


def per_round(ks: list[int], algorithm: str, population: int = 1_000_000,
              rounds: int = 3) -> int:
    """The driver's own time per round, at each clients-per-round ``k``: the round's time
    (Driver._train_round) less the workers' (their train calls, run in this process by the
    inline backend); the median over rounds 2.. (round 1 builds the workers' kernels)."""
    import fedray
    from fedray.runtime import driver as driver_module
    from fedray.runtime.inline import InlinePool

    spent = {"round": [], "workers": 0.0}
    train_round, run = driver_module.Driver._train_round, InlinePool._run

    def timed_round(self, r):
        spent["workers"] = 0.0
        start = time.perf_counter()
        out = train_round(self, r)
        spent["round"].append((time.perf_counter() - start, spent["workers"]))
        return out

    def timed_run(self, method, slot, args):
        start = time.perf_counter()
        try:
            return run(self, method, slot, args)
        finally:
            spent["workers"] += time.perf_counter() - start

    driver_module.Driver._train_round, InlinePool._run = timed_round, timed_run
    print(f"inline backend, 2 workers, logistic regression, {algorithm}, "
          f"{population:,} synthetic clients, {rounds} rounds (median of rounds 2..)")
    print("| clients per round | driver ms per round | per 1,000 clients | workers s per round |")
    print("|---|---|---|---|")
    try:
        for k in ks:
            spent["round"] = []
            with tempfile.TemporaryDirectory() as tmp:
                fedray.run(_job(tmp, f"per-round-{k}", rounds,
                                {"synthetic": {"num_clients": population}}, "logreg", k,
                                algorithm={"name": algorithm},
                                runtime={"backend": "inline", "num_workers": 2}))
            steady = spent["round"][1:]
            own = statistics.median(t - w for t, w in steady) * 1e3
            work = statistics.median(w for _, w in steady)
            print(f"| {k:,} | {own:.1f} | {own / k * 1e3:.2f} | {work:.1f} |", flush=True)
    finally:
        driver_module.Driver._train_round, InlinePool._run = train_round, run
    return 0


def selector_cost(names: list[str], population: int, ks: list[int], rounds: int) -> int:
    """Milliseconds a selector's round takes on the driver (invite: its select with the
    round's draws, the clock's outcome; feedback: what it learns, the participants table),
    with ``population`` clients on the clock, ``rounds`` rounds per (selector, k)."""
    import numpy as np

    from fedray.algorithms.base import RoundPlan
    from fedray.algorithms.registry import lookup
    from fedray.config import load_config
    from fedray.runtime.participation import Participation
    from fedray.timing.rounds import LocalWork, RoundClock

    def sizes(ids):  # a synthetic population's counts: a pure function of the id
        return 20 + np.asarray(ids, dtype=np.int64) % 181

    print(f"{population:,} clients on the simulated clock (default devices, always online), "
          f"{rounds} rounds per row; ms per round on the driver, no training")
    print("| selector | clients per round | round 1 ms | median ms, rounds 2.. | last round ms "
          "| clients seen at the end |")
    print("|---|---|---|---|---|---|")
    for k in ks:
        for name in names:
            cfg = load_config({"sampling": {"clients_per_round": k}, "clock": {"enabled": True}})
            clock = RoundClock(cfg.clock, cfg.seed, sizes, 100_000, LocalWork(20, 1, None),
                               population=population)
            selector = lookup("selector", name, "algorithm.selector")()
            selector.init_server(RoundPlan(seed=0, population=population,
                                           clients_per_round=k, sampling="fixed",
                                           rounds=rounds, num_params=100_000))
            part = Participation(selector, name, cfg.sampling, cfg.seed, population, sizes, clock)
            gen = np.random.default_rng(0)
            times, t = [], 0.0
            for r in range(1, rounds + 1):
                start = time.perf_counter()
                inv = part.invite(r, t, lambda ids, gen=gen: gen.random(len(ids)))
                kept = inv.selection.participants
                arrived = {"id": kept, "loss": gen.random(len(kept)) * 3,
                           "examples": sizes(kept)}
                part.feedback(r, inv, arrived, inv.selection.outcome.duration_s)
                times.append((time.perf_counter() - start) * 1e3)
                t = inv.selection.outcome.end_s
            seen = len(selector.state["ids"]) if "ids" in selector.state else "-"
            print(f"| {name} | {k:,} | {times[0]:.1f} | {statistics.median(times[1:]):.1f} | "
                  f"{times[-1]:.1f} | {seen if isinstance(seen, str) else f'{seen:,}'} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
