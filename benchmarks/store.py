"""Partition store at scale: build a store, then open it and read it cold, each in a fresh
process.

Two workloads:
- ``partitions/synthetic_dirichlet.yaml`` (the default): 8,000 generated FEMNIST-like
  writers (about 480,000 examples) re-partitioned into ``--clients`` clients (100,000) with
  Dirichlet(0.5) label proportions; the data set is gathered in memory, then written.
- ``partitions/synthetic_million.yaml``: ``--clients`` generated writers (1,000,000) of 2-8
  examples each, one client per writer, uint8 pixels, streamed into shards writer by writer.

Reports the build's wall time and peak memory (the build process, its generator processes,
and the whole process tree sampled every 0.2 s), the manifest's, the client index's and the
shards' bytes, then in a new process: the time to open the store (``StoreSource``, its
sizes, one client's name) and the memory that costs, and 1,000 random clients read; with
--drop-caches (root only) the OS page cache is dropped first, so the index and the clients
really come from disk. --verify times ``verify_store`` (what ``data.verify`` costs a run),
--compare-v1 opens the same store written as format version 1 (per-client JSON lists).

    python benchmarks/store.py --out /tmp/syn100k
    python benchmarks/store.py --recipe partitions/synthetic_million.yaml --clients 1000000 \\
        --out /tmp/stores/syn_1m --keep --drop-caches --verify --compare-v1
    python benchmarks/store.py --out /tmp/stores/syn_1m --reuse --drop-caches   # read only
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

BUILD = """
import json, resource, sys, time
t0 = time.perf_counter()
from fedray.data import recipe
url, m = recipe.build(sys.argv[1], json.loads(sys.argv[2]), log=lambda s: print(s, flush=True))
wall = time.perf_counter() - t0
train = sum(s["rows"] for s in m["shards"] if s["split"] == "train")
print("RESULT " + json.dumps({
    "wall_s": wall, "clients": m["num_clients"], "train_examples": train,
    "shards": len(m["shards"]),
    "self_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

OPEN_READ = """
import json, resource, sys, time

def rss_mb():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS")) / 1024

t0 = time.perf_counter()
import numpy as np
from fedray.data.store import StoreSource
import pandas, torch  # what a worker has imported anyway (and format 1's reader): not the
# store's cost
t1 = time.perf_counter()
before = rss_mb()
src = StoreSource(sys.argv[1])
sizes = src.train_sizes()
last = src.name(src.population - 1)
t2 = time.perf_counter()
opened = rss_mb()
ids = np.random.default_rng(0).choice(src.population, size=int(sys.argv[2]), replace=False)
rows = 0
for c in ids:
    x, y = src.client(int(c))
    rows += len(y)
    float(x.sum())  # touch the pixels: the pages must really be read
t3 = time.perf_counter()
print("RESULT " + json.dumps({
    "import_s": t1 - t0, "open_s": t2 - t1, "rss_before_open_mb": before,
    "rss_after_open_mb": opened, "read_s": t3 - t2, "rows": rows, "reads": len(ids),
    "rss_after_read_mb": rss_mb(),
    "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

VERIFY = """
import json, resource, sys, time
from fedray.data.store import verify_store
t0 = time.perf_counter()
verify_store(sys.argv[1])
print("RESULT " + json.dumps({"verify_s": time.perf_counter() - t0,
      "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def _tree_rss_mb(pid: int) -> float:
    import psutil

    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total / 2**20


def _child(code: str, *args: str, log: bool = False) -> tuple[dict, float]:
    """Run ``code`` in a fresh interpreter; its RESULT line, and the peak RSS of its whole
    process tree (sampled)."""
    proc = subprocess.Popen([sys.executable, "-u", "-c", code, *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    peak = [0.0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _tree_rss_mb(proc.pid))
            done.wait(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    result: dict = {}
    tail: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("RESULT "):
            result = json.loads(line[7:])
        else:
            tail = (tail + [line])[-20:]
            if log:
                print(line, end="", flush=True)
    code_ = proc.wait()
    done.set()
    sampler.join()
    if code_ != 0:
        raise SystemExit(f"child failed ({code_}):\n{''.join(tail)}")
    return result, peak[0]


def _drop_caches() -> None:
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def _write_v1(store: str, out: str) -> int:
    """The store as format version 1 wrote it, at ``out``: manifest.json with every client's
    lists (names; per split shard, offset, count, dense label_histogram), the same shards
    (symbolic links). Written client block by client block. Returns the manifest's bytes."""
    import numpy as np

    from fedray.data.store.format import read_manifest
    from fedray.data.store.reader import client_index

    m = read_manifest(store)
    ix = client_index(store, m)
    os.makedirs(out)
    for sh in m["shards"]:
        os.symlink(os.path.join(os.path.abspath(store), sh["file"]), os.path.join(out, sh["file"]))
    head = {k: m[k] for k in ("format", "fedray_version", "recipe", "source", "seed",
                              "partitioner", "num_clients", "num_classes", "num_coarse",
                              "input_shape", "dtype", "scale", "schema")}
    head["format_version"] = 1
    tail = {k: m[k] for k in ("central_test", "shards", "info")}
    step = 50_000
    with open(os.path.join(out, "manifest.json"), "w") as f:
        f.write(json.dumps(head)[:-1] + ', "clients": {"names": ')
        f.write(json.dumps(ix.names()))
        for split in ix.splits:
            f.write(f', "{split}": {{')
            for key, col in (("shard", ix.shards(split)), ("offset", ix.offsets(split)),
                             ("count", ix.counts(split))):
                f.write(f'"{key}": {json.dumps(col.tolist())}, ')
            f.write('"label_histogram": [')
            for lo in range(0, ix.num_clients, step):
                ids = np.arange(lo, min(lo + step, ix.num_clients))
                rows = json.dumps(ix.histograms(split, ids).tolist())[1:-1]
                f.write(("" if lo == 0 else ", ") + rows)
            f.write("]}")
        f.write("}, " + json.dumps(tail)[1:])
    return os.path.getsize(os.path.join(out, "manifest.json"))


def _du_mb(path: str) -> float:
    return sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path)) / 2**20


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="where to build the store (a new path)")
    p.add_argument("--recipe", default=os.path.join("partitions", "synthetic_dirichlet.yaml"))
    p.add_argument("--clients", type=int, default=None,
                   help="clients: partitioner.num_clients, or source.num_writers for a "
                        "natural recipe (default: the recipe's)")
    p.add_argument("--reads", type=int, default=1_000)
    p.add_argument("--reuse", action="store_true", help="read an existing store, do not build")
    p.add_argument("--drop-caches", action="store_true", help="drop the OS page cache first")
    p.add_argument("--verify", action="store_true", help="time verify_store (data.verify)")
    p.add_argument("--compare-v1", action="store_true",
                   help="also open the store written as format version 1")
    p.add_argument("--keep", action="store_true", help="keep the store afterwards")
    args = p.parse_args(argv)
    recipe = os.path.join(ROOT, args.recipe) if not os.path.isabs(args.recipe) else args.recipe

    if not args.reuse:
        from fedray.data.recipe import load_recipe

        overrides = [f"out={args.out}"]
        if args.clients is not None:
            natural = load_recipe(recipe, overrides).partitioner.name == "natural"
            key = "source.num_writers" if natural else "partitioner.num_clients"
            overrides.append(f"{key}={args.clients}")
        print(f"building {args.recipe} {' '.join(overrides)}", flush=True)
        built, tree_peak = _child(BUILD, recipe, json.dumps(overrides), log=True)
        print(f"build: {built['clients']:,} clients, {built['train_examples']:,} train examples, "
              f"{built['shards']} shards in {built['wall_s']:.1f}s; peak RSS: build process "
              f"{built['self_maxrss_mb']:.0f} MB, build process and its generator processes "
              f"together {tree_peak:.0f} MB (sampled every 0.2 s; shared pages counted in "
              f"each)", flush=True)
    with open(os.path.join(args.out, "manifest.json")) as f:
        m = json.load(f)
    index = m.get("client_index", {}).get("bytes", 0)
    shards = sum(s["bytes"] for s in m["shards"])
    print(f"sizes: manifest.json {os.path.getsize(os.path.join(args.out, 'manifest.json')):,} "
          f"bytes, clients.arrow {index / 2**20:.1f} MB, {len(m['shards'])} shards "
          f"{shards / 2**30:.2f} GB; directory {_du_mb(args.out) / 1024:.2f} GB", flush=True)
    if args.drop_caches:
        _drop_caches()
        print("dropped the OS page cache", flush=True)
    got, _ = _child(OPEN_READ, args.out, str(args.reads))
    cold = "cold " if args.drop_caches else ""
    print(f"{cold}open in a new process: {got['open_s'] * 1e3:.1f} ms (StoreSource, its train "
          f"sizes, one client's name; after {got['import_s']:.2f}s of imports), RSS "
          f"{got['rss_before_open_mb']:.0f} -> {got['rss_after_open_mb']:.0f} MB", flush=True)
    print(f"{cold}read: {got['reads']:,} random clients ({got['rows']:,} examples) in "
          f"{got['read_s']:.2f}s; RSS after {got['rss_after_read_mb']:.0f} MB (peak "
          f"{got['maxrss_mb']:.0f} MB)", flush=True)
    if args.verify:
        if args.drop_caches:
            _drop_caches()
        ver, _ = _child(VERIFY, args.out)
        print(f"{cold}verify_store (data.verify): {ver['verify_s']:.1f}s, peak RSS "
              f"{ver['maxrss_mb']:.0f} MB", flush=True)
    if args.compare_v1:
        v1 = args.out.rstrip("/") + "-v1"
        t0 = time.perf_counter()
        size = _write_v1(args.out, v1)
        print(f"format 1 copy: manifest.json {size / 2**20:.0f} MB (written in "
              f"{time.perf_counter() - t0:.0f}s)", flush=True)
        if args.drop_caches:
            _drop_caches()
        old, _ = _child(OPEN_READ, v1, str(args.reads))
        print(f"{cold}format 1 open: {old['open_s']:.2f}s, RSS {old['rss_before_open_mb']:.0f} "
              f"-> {old['rss_after_open_mb']:.0f} MB (peak {old['maxrss_mb']:.0f} MB); read "
              f"{old['reads']:,} clients in {old['read_s']:.2f}s", flush=True)
        shutil.rmtree(v1)
    if not args.keep and not args.reuse:
        shutil.rmtree(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
