"""A partitioner at a million clients: partition an in-memory data set and write its store.

Why: a partitioner that loops in Python per client, or a Partition that holds one small
array per client, costs minutes and gigabytes at 10^6 clients where the data themselves are
a few hundred megabytes. This builds a Dataset of small examples (``--features`` float32
features, ``--classes`` classes, about ``--per-client`` examples per client; owners with
their own test examples for the natural-id partitioners), partitions it with ``--partitioner``
and its ``key=value`` parameters, and writes the store (``write_store``) into a temporary
directory, reporting the wall and CPU time of each phase (CPU time: what a busy machine
inflates least), the process's peak RSS after each (``resource.getrusage``: the high-water
mark so far) and the data's own size for scale.

    python benchmarks/partitioners.py --partitioner iid --clients 1000000
    python benchmarks/partitioners.py --partitioner shard --clients 1000000
    python benchmarks/partitioners.py --partitioner size law=linear --clients 1000000
    python benchmarks/partitioners.py --partitioner grouped_natural group_size=2 \\
        --clients 1000000 --json out.json

``num_clients`` is set from ``--clients`` (for ``grouped_natural`` the owners are
``--clients`` x ``group_size``, so the groups are ``--clients``); ``key=value`` values are
read as YAML scalars (``alpha=0.5``, ``law=square``, ``feature=3``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from fedray.data.dataset import Dataset  # noqa: E402
from fedray.data.examples import Split  # noqa: E402
from fedray.data.partitioners import PARAMS, partition  # noqa: E402
from fedray.data.store import write_store  # noqa: E402

NATURAL_ID = ("natural", "grouped_natural")


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def make_dataset(n_train: int, owners: int | None, features: int, classes: int,
                 seed: int = 0) -> Dataset:
    """Random float32 examples with labels; with ``owners``, every example has an owner
    (about n / owners each) and each owner has one test example of its own."""
    g = np.random.default_rng(seed)
    x = g.standard_normal((n_train, features), dtype=np.float32)
    y = g.integers(0, classes, n_train).astype(np.int64)
    if owners is None:
        test = Split(g.standard_normal((10_000, features), dtype=np.float32),
                     g.integers(0, classes, 10_000).astype(np.int64))
        return Dataset("bench", Split(x, y), test, classes)
    owner = np.sort(g.integers(0, owners, n_train)).astype(np.int64)
    test = Split(g.standard_normal((owners, features), dtype=np.float32),
                 g.integers(0, classes, owners).astype(np.int64),
                 owner=np.arange(owners, dtype=np.int64))
    names = [f"u{i:07d}" for i in range(owners)]
    return Dataset("bench", Split(x, y, owner=owner), test, classes, owners=names)


def _value(text: str) -> object:
    import yaml

    return yaml.safe_load(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--partitioner", required=True)
    ap.add_argument("params", nargs="*", help="key=value parameters of the partitioner")
    ap.add_argument("--clients", type=int, default=1_000_000)
    ap.add_argument("--per-client", type=float, default=5.0)
    ap.add_argument("--features", type=int, default=8)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="append the result as one JSON line to this file")
    args = ap.parse_args()
    params = dict(p.split("=", 1) for p in args.params)
    params = {k: _value(v) for k, v in params.items()}
    name = args.partitioner
    owners = None
    if name in NATURAL_ID:
        owners = args.clients * int(params.get("group_size", 1))
    elif "num_clients" in PARAMS.get(name, ()):
        params.setdefault("num_clients", args.clients)
    n_train = int(round(args.clients * args.per_client))

    out: dict = {"partitioner": name, "params": params, "clients_asked": args.clients,
                 "train_examples": n_train, "owners": owners}
    t = time.perf_counter()
    ds = make_dataset(n_train, owners, args.features, args.classes, args.seed)
    data_mb = (ds.train.x.nbytes + ds.train.y.nbytes
               + (0 if ds.train.owner is None else ds.train.owner.nbytes)
               + (0 if ds.test is None else ds.test.x.nbytes + ds.test.y.nbytes)) / 2**20
    out["make_s"] = time.perf_counter() - t
    out["data_mb"] = data_mb
    out["rss_after_data_mb"] = rss_mb()
    out["peak_after_data_mb"] = peak_mb()

    t, c = time.perf_counter(), time.process_time()
    part = partition(ds, name, args.seed, **params)
    out["partition_s"] = time.perf_counter() - t
    out["partition_cpu_s"] = time.process_time() - c
    out["clients"] = part.num_clients
    out["rss_after_partition_mb"] = rss_mb()
    out["peak_after_partition_mb"] = peak_mb()

    tmp = tempfile.mkdtemp(prefix="fedray_bench_part_")
    try:
        t, c = time.perf_counter(), time.process_time()
        m = write_store(os.path.join(tmp, "store"), ds, part,
                        recipe={"name": "bench", "seed": args.seed,
                                "partitioner": {"name": name, **params}})
        out["write_s"] = time.perf_counter() - t
        out["write_cpu_s"] = time.process_time() - c
        out["store_mb"] = sum(s["bytes"] for s in m["shards"]) / 2**20 \
            + m["client_index"]["bytes"] / 2**20
        out["store_clients"] = m["num_clients"]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out["peak_mb"] = peak_mb()
    out["load_avg"] = os.getloadavg()
    print(json.dumps(out))
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
