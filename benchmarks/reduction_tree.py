"""The reduction tree: what the driver spends merging partial sums, flat and as a tree.

A fake multi-node cluster (ray.cluster_utils.Cluster: every node a raylet with its own
object store on 127.0.0.1; the driver on the first) runs the same job three ways for each
pool size: every worker's partial merged by the driver (runtime.reduce.group_size null),
and the tree with one group per node (group_size = workers per node, or 2 where a node has
one worker), its sums made by the driver (where: driver) or by each group's first worker
(where: workers). Each node declares whole CPUs, exactly its workers' share, so Ray places
the same number of workers on every node. The model is an MLP big enough for merges to
matter (784-H-62: H=2048 is 1.7M parameters, a 14 MB float64 partial sum; a worker holds
about 400 MB, so 32 workers fit in this machine's 24 GB, where H=4096's 470 MB a worker
would leave little room for anything else) and the clients are tiny (2 per worker, one
local step), so a round is mostly broadcast and merge.
Reported per pool size: the medians over the rounds after the first of the driver's merge
time (metric merge_s: receiving the ready partials and adding them, not waiting for
workers) and of the round's training time (train_s). The final weights of where=driver and
where=workers must be equal bit for bit (the exit status says); their largest difference
from the flat merge's is printed.

    python benchmarks/reduction_tree.py                                # 4, 8, 16, 32 workers
    python benchmarks/reduction_tree.py --workers 4 --nodes 2 --hidden 256 --rounds 3  # quick
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

MODES = {"flat": {}, "tree, where=driver": {"where": "driver"},
         "tree, where=workers": {"where": "workers"}}


def mlp(hidden: int):
    """A model_fn (shipped to the workers by value): 784 -> hidden -> 62, fixed init."""
    def model_fn():
        import torch
        from torch import nn

        torch.manual_seed(0)
        return nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, hidden), nn.ReLU(),
                             nn.Linear(hidden, 62))
    return model_fn


def job(name: str, workers: int, worker_cpus: float, rounds: int, reduce: dict,
        out: str) -> dict:
    return {"name": name, "seed": 0, "rounds": rounds,
            "data": {"synthetic": {"num_clients": 1000, "min_examples": 4, "max_examples": 8,
                                   "test_writers": 2}},
            "client": {"lr": 0.01, "batch_size": 8, "local_steps": 1},
            "sampling": {"clients_per_round": 2 * workers},
            "eval": {"every": 0, "central": False},
            "runtime": {"num_workers": workers, "max_retries": 0, "reduce": reduce,
                        "worker": {"num_cpus": worker_cpus, "vectorize": "off",
                                   "cache_mb": 16}},
            "output": {"dir": out, "save_weights": False, "tensorboard": False}}


def measure(workers: int, nodes: int, hidden: int, rounds: int, worker_cpus: float,
            store_mb: int) -> dict:
    """The three modes on a fresh cluster of ``nodes`` nodes with workers / nodes workers
    each."""
    import ray
    import torch
    from ray.cluster_utils import Cluster

    import fedray

    per_node = workers // nodes
    # a node declares whole CPUs: its workers share them exactly (one worker on a node
    # then reserves a whole CPU); every worker trains on one torch thread all the same
    node_cpus = math.ceil(per_node * worker_cpus - 1e-9)
    worker_cpus = node_cpus / per_node
    node = {"num_cpus": node_cpus, "node_ip_address": "127.0.0.1",
            "include_dashboard": False, "object_store_memory": store_mb * 2**20}
    t0 = time.perf_counter()
    cluster = Cluster(initialize_head=True, head_node_args=node)
    group = max(2, per_node)  # one worker per node: groups of two nodes' workers
    out: dict = {"workers": workers, "nodes": nodes, "group_size": group,
                 "worker_cpus": worker_cpus}
    try:
        for _ in range(nodes - 1):
            cluster.add_node(**node)
        ray.init(address=cluster.address, logging_level="ERROR")
        out["cluster_start_s"] = time.perf_counter() - t0
        weights = {}
        for mode, reduce in MODES.items():
            if mode != "flat":
                reduce = {"group_size": group, **reduce}
            with tempfile.TemporaryDirectory() as tmp:
                res = fedray.run(job(f"tree-{workers}", workers, worker_cpus, rounds, reduce,
                                     f"{tmp}/run"), model_fn=mlp(hidden))
            steady = res.metrics[1:]
            nodes_seen = [w["node_id"] for w in res.summary["workers"]]
            out[mode] = {
                "merge_s": statistics.median(m["merge_s"] for m in steady),
                "train_s": statistics.median(m["train_s"] for m in steady),
                "worker_busy_s": statistics.median(m["worker_busy_s"] for m in steady),
                "worker_mem_mb": max(m["worker_mem_mb"] for m in res.metrics),
                "driver_mem_mb": max(m["driver_mem_mb"] for m in res.metrics),
                "workers_per_node": sorted(nodes_seen.count(n) for n in set(nodes_seen)),
                # node-major: a node's workers in consecutive slots (the tree's pools)
                "node_runs": sum(1 for i, n in enumerate(nodes_seen)
                                 if i == 0 or nodes_seen[i - 1] != n)}
            weights[mode] = res.weights
            print(f"  [{time.perf_counter() - t0:.0f}s] {workers} workers, {mode}: "
                  f"{out[mode]}", flush=True)
        drv, wrk, flat = (weights[m] for m in ("tree, where=driver", "tree, where=workers",
                                                 "flat"))
        out["tree_bit_identical"] = all(torch.equal(drv[k], wrk[k]) for k in drv)
        out["flat_max_abs_diff"] = max(float((drv[k] - flat[k]).abs().max()) for k in drv)
        out["params"] = sum(v.numel() for v in drv.values())
    finally:
        ray.shutdown()
        cluster.shutdown()
    return out


def table(rows: list[dict]) -> str:
    lines = ["| workers | nodes | group size | merge_s flat | merge_s tree, driver | "
             "merge_s tree, workers | train_s flat | train_s tree, driver | "
             "train_s tree, workers | tree weights equal |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ms = [r[m]["merge_s"] * 1e3 for m in MODES]
        ts = [r[m]["train_s"] * 1e3 for m in MODES]
        lines.append(f"| {r['workers']} | {r['nodes']} | {r['group_size']} | "
                     + " | ".join(f"{v:.1f} ms" for v in ms + ts)
                     + f" | {'yes' if r['tree_bit_identical'] else 'NO'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, nargs="+", default=[4, 8, 16, 32])
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--hidden", type=int, default=2048, help="the MLP's hidden width")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--worker-cpus", type=float, default=0.5,
                   help="CPUs each worker reserves, at most (each node declares its workers' "
                   "share, rounded up to whole CPUs)")
    p.add_argument("--store-mb", type=int, default=1024, help="object store per node")
    p.add_argument("--out", help="the numbers as JSON")
    args = p.parse_args(argv)
    bad = [w for w in args.workers if w % args.nodes]
    if bad:
        p.error(f"--workers {bad}: not a multiple of --nodes {args.nodes}")
    # every node on loopback, and Ray's files (its socket paths, the cluster's address
    # file) in a directory of this run's, not in /tmp/ray, where another Ray would find them
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.pop("RAY_ADDRESS", None)
    temp = tempfile.mkdtemp(prefix="frt", dir="/tmp")  # short: socket paths
    os.environ["RAY_TMPDIR"] = temp
    load = os.getloadavg()
    print(f"{os.cpu_count()} CPUs, load average {load[0]:.1f} at the start; "
          f"MLP 784-{args.hidden}-62, {args.rounds} rounds (the first not counted)",
          flush=True)
    rows = []
    try:
        for w in args.workers:
            rows.append(measure(w, args.nodes, args.hidden, args.rounds, args.worker_cpus,
                                args.store_mb))
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end; "
          f"{rows[0]['params']:,} parameters" if rows else "")
    print(table(rows))
    for r in rows:
        print(f"{r['workers']} workers: tree vs flat weights differ by at most "
              f"{r['flat_max_abs_diff']:.3g}; cluster start {r['cluster_start_s']:.1f}s "
              f"(not counted); worker memory {r['tree, where=workers']['worker_mem_mb']:.0f} MB")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    ok = all(r["tree_bit_identical"] for r in rows)
    if not ok:
        print("tree weights differ between where=driver and where=workers", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
