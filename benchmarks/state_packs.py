"""Client state packs (fedray.state.client_state): what a pack saves in files and costs in disk.

Two measurements.

1. Writing a round's client states, interleaved in one invocation: ``--clients`` states of
   ``--floats`` float32 each, written by ClientStateStore.put_async as one file per client
   (``runtime.worker.state_pack_mb: 0``) and into packs (``begin_packs``), then flushed;
   ``--repeat`` times each, median milliseconds per client. On this machine's disk the
   cost of creating a file varies several-fold from one minute to the next: the two sides
   alternate so both see the same disk.

2. The disk a run's store holds at the end, with packs against one file per client: the
   driver's own accounting (ClientVersions.record and live_packs, as
   fedray.runtime.driver counts a pack down) over ``--rounds`` rounds of ``k`` uniformly
   sampled clients of a population ``N``, split over ``W`` worker tasks, each task's
   clients in packs of ``per_pack`` states. A pack stays while any of its states is
   current, so the store holds more states than clients; a file per client holds one.

    python benchmarks/state_packs.py
    python benchmarks/state_packs.py --clients 50 --floats 62 --repeat 9
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from fedray.state.client_state import ClientStateStore, ClientVersions  # noqa: E402

# (population, clients a round, worker tasks, states per pack, rounds)
REGIMES = [(1000, 100, 2, 50, 300), (1000, 100, 8, 12, 300), (1000, 100, 2, 10, 300),
           (3400, 10, 1, 10, 1000), (100_000, 100, 2, 50, 1000)]


def write_round(url: str, version: int, states: list[torch.Tensor], packed: bool) -> float:
    """Seconds to stage and write one round's states (one worker's task), flush included."""
    store = ClientStateStore(url, cache_mb=0)
    start = time.perf_counter()
    if packed:
        store.begin_packs(version, task=0)
    for cid, state in enumerate(states):
        store.put_async(cid, version, {"local": state})
    store.flush()
    return time.perf_counter() - start


def disk(population: int, k: int, workers: int, per_pack: int, rounds: int,
         seed: int = 0) -> tuple[int, int]:
    """(states the store holds with packs, clients with state) after ``rounds`` rounds."""
    g = np.random.default_rng(seed)
    index = ClientVersions(population)
    sizes: dict[tuple[int, int], int] = {}  # every state a pack was written with counts
    for r in range(1, rounds + 1):
        tasks = np.array_split(g.choice(population, k, replace=False), workers)
        packs = np.concatenate([t * 4096 + np.arange(len(share)) // per_pack
                                for t, share in enumerate(tasks)])
        for pack in packs.tolist():
            sizes[(r, pack)] = sizes.get((r, pack), 0) + 1
        index.record(np.concatenate(tasks), r, packs)
    held = sum(sizes[pack] for pack in index.live_packs())
    return held, len(index)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=50, help="states a round (default 50)")
    p.add_argument("--floats", type=int, default=62,
                   help="float32 values per state (default 62: logistic regression's bias)")
    p.add_argument("--repeat", type=int, default=7, help="rounds per side (default 7)")
    p.add_argument("--dir", default=None, help="where to write (default: a temporary folder)")
    args = p.parse_args(argv)
    states = [torch.randn(args.floats) for _ in range(args.clients)]
    times: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for r in range(1, args.repeat + 1):
            for packed in (False, True):
                url = os.path.join(tmp, "packs" if packed else "files")
                times[packed].append(write_round(url, r, states, packed))
    per = {k: 1e3 * statistics.median(v) / args.clients for k, v in times.items()}
    print(f"writing {args.clients} states of {args.floats} float32 (median of {args.repeat}): "
          f"a file each {per[False]:.3f} ms/client, one pack {per[True]:.3f} ms/client "
          f"({per[False] / per[True]:.1f}x)")
    for population, k, workers, per_pack, rounds in REGIMES:
        held, clients = disk(population, k, workers, per_pack, rounds)
        print(f"N={population} k={k} tasks={workers} states/pack={per_pack} "
              f"rounds={rounds}: the store holds {held} states for {clients} clients with "
              f"state = {held / clients:.2f}x a file per client")
    return 0


if __name__ == "__main__":
    sys.exit(main())
