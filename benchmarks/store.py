"""Partition store at scale: build a 100,000-client Dirichlet store, then read it cold.

Builds ``partitions/synthetic_dirichlet.yaml`` (8,000 generated FEMNIST-like writers,
about 480,000 examples, re-partitioned into 100,000 clients with Dirichlet(0.5) label
proportions) and times the whole build, generation included. Then a fresh process opens the
store and reads 1,000 random clients; with --drop-caches (root only) the OS page cache is
dropped first, so the read really comes from disk.

    python benchmarks/store.py --out /tmp/syn100k
    python benchmarks/store.py --out /tmp/syn100k --reuse --drop-caches   # read only
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

READ = """
import sys, time, numpy as np
t0 = time.perf_counter()
from fedray.data.store import StoreSource
src = StoreSource(sys.argv[1])
t1 = time.perf_counter()
ids = np.random.default_rng(0).choice(src.population, size=int(sys.argv[2]), replace=False)
rows = 0
for c in ids:
    x, y = src.client(int(c))
    rows += len(y)
    float(x.sum())  # touch the pixels: the pages must really be read
t2 = time.perf_counter()
print(f"{t1 - t0:.3f} {t2 - t1:.3f} {rows}")
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="where to build the store (a new path)")
    p.add_argument("--clients", type=int, default=100_000)
    p.add_argument("--reads", type=int, default=1_000)
    p.add_argument("--reuse", action="store_true", help="read an existing store, do not build")
    p.add_argument("--drop-caches", action="store_true", help="drop the OS page cache first")
    p.add_argument("--keep", action="store_true", help="keep the store afterwards")
    args = p.parse_args(argv)

    from fedray.data import recipe

    if not args.reuse:
        t0 = time.perf_counter()
        url, manifest = recipe.build(
            os.path.join(ROOT, "partitions", "synthetic_dirichlet.yaml"),
            [f"out={args.out}", f"partitioner.num_clients={args.clients}"],
            log=lambda s: print(s, flush=True))
        build_s = time.perf_counter() - t0
        size = sum(s["bytes"] for s in manifest["shards"]) / 2**20
        print(f"build: {manifest['num_clients']:,} clients, "
              f"{sum(manifest['clients']['train']['count']):,} examples, "
              f"{len(manifest['shards'])} shards, {size:.0f} MB in {build_s:.1f}s", flush=True)
    if args.drop_caches:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        print("dropped the OS page cache")
    out = subprocess.run([sys.executable, "-c", READ, args.out, str(args.reads)],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    open_s, read_s, rows = out.stdout.split()
    print(f"cold read: opening the store {float(open_s):.2f}s, then {args.reads:,} random "
          f"clients ({int(rows):,} examples) in {float(read_s):.2f}s")
    if not args.keep and not args.reuse:
        shutil.rmtree(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
