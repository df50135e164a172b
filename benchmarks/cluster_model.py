"""A paper model of a cluster run, built from costs measured on this machine.

The question: with 10,000,000 clients, 10,000 a round, 64 GPUs and ResNet-18, where does a
fedray round spend its time, and what is the first bottleneck? No cluster is at hand, so
the round is split into the costs that fedray's design makes it pay, each one measured here
in one invocation (so the ratios are sound even on a noisy machine):

- driver bookkeeping per round: sampling k ids from the population, their example counts,
  the balanced assignment to the workers and the tasks (measured at the model's k and N);
- broadcast: serializing the float32 model into the object store once (``ray.put``);
- one partial-sum merge: a float64 model-sized ``PartialSum.merge`` on the driver (and on a
  node's reducer, with ``runtime.reduce.group_size``);
- a worker folding one client's update into its float64 partial sum (on the CPU; a GPU
  worker folds on the device, which the per-client training time below includes);
- a client's state round trip, for stateful algorithms (SCAFFOLD's c_i is model-sized):
  one safetensors write and one cold read through the client state store.

What cannot be measured here is given on the command line and printed as an assumption:
the time one client takes to train on a GPU share (this machine has no GPU) and the network
bandwidth between nodes. The model then says, for a range of per-client training times,
how long a round takes with the flat merge and with the reduction tree, and which part is
the critical path.

    python benchmarks/cluster_model.py                       # 10M clients, 10k/round, 64 GPUs
    python benchmarks/cluster_model.py --client-train-s 0.05 --network-gbps 100
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def _median_s(fn, repeat: int) -> float:
    fn()  # warm: allocations, lazy imports
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(num_params: int, population: int, k: int, workers: int, repeat: int) -> dict:
    """The per-unit costs, measured in this process (and one private Ray for the put)."""
    import numpy as np
    import torch

    from fedray.algorithms.reduction import PartialMessage, PartialSum
    from fedray.core.assignment import assign_balanced
    from fedray.core.sampling import select_round
    from fedray.data.client_source import sizes_of
    from fedray.data.sources.synthetic import SyntheticFEMNIST
    from fedray.state.client_state import ClientStateStore

    torch.set_num_threads(1)  # the driver actor's setting
    out: dict[str, float] = {}
    source = SyntheticFEMNIST(num_clients=population)

    def bookkeeping() -> None:
        ids = select_round(0, 1, population, k).participants
        sizes = sizes_of(source, ids)
        groups = assign_balanced(ids, sizes, workers)
        [list(g) for g in groups]

    out["driver_round_s"] = _median_s(bookkeeping, repeat)

    rng = np.random.default_rng(0)
    part = PartialMessage(rng.standard_normal(num_params), 1.0, 0.0)
    acc = PartialSum(num_params)
    out["merge_s"] = _median_s(lambda: acc.merge(part), repeat)
    update = torch.from_numpy(rng.standard_normal(num_params).astype(np.float32))
    out["fold_s"] = _median_s(lambda: acc.add(update, 1.0), repeat)

    import ray

    ray.init(num_cpus=1, include_dashboard=False, logging_level="ERROR")
    try:
        weights = rng.standard_normal(num_params).astype(np.float32)
        refs = []

        def put() -> None:
            refs.append(ray.put(weights))

        out["put_s"] = _median_s(put, repeat)
        refs.clear()
    finally:
        ray.shutdown()

    with tempfile.TemporaryDirectory() as tmp:
        store = ClientStateStore(tmp, cache_mb=0)
        state = {"c": update}
        counter = iter(range(1, 10_000))

        def round_trip() -> None:
            cid = next(counter)
            store.put(cid, 1, state)
            store.get(cid, 1)

        out["state_round_trip_s"] = _median_s(round_trip, repeat)
    return out


def model(m: dict, *, k: int, gpus: int, nodes: int, num_params: int, client_train_s: float,
          network_gbps: float, group_size: int) -> dict:
    """One round's critical path, flat merge and reduction tree, in seconds."""
    per_worker = math.ceil(k / gpus)
    link = network_gbps * 1e9 / 8  # bytes/s into or out of one node
    weights_b, partial_b = 4 * num_params, 8 * num_params
    broadcast = m["put_s"] + (nodes - 1) * weights_b / link  # the head's uplink, serially
    # a GPU worker folds each update into its partial sum on the device: part of the
    # client's time on its GPU share (the CPU fold measured here is a CPU worker's cost)
    train = per_worker * client_train_s
    remote = gpus - gpus // nodes  # partials that cross the network to the driver's node
    flat = gpus * m["merge_s"] + remote * partial_b / link
    groups = math.ceil(gpus / group_size)
    tree = (group_size * m["merge_s"]  # every node's reducer, in parallel
            + groups * m["merge_s"] + (groups - 1) * partial_b / link)
    base = m["driver_round_s"] + broadcast + train
    return {"driver": m["driver_round_s"], "broadcast": broadcast, "train": train,
            "merge_flat": flat, "merge_tree": tree, "round_flat": base + flat,
            "round_tree": base + tree}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--population", type=int, default=10_000_000)
    p.add_argument("--clients-per-round", type=int, default=10_000)
    p.add_argument("--gpus", type=int, default=64, help="workers, one per GPU")
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--network-gbps", type=float, default=25.0,
                   help="ASSUMED bandwidth of one node's link (not measurable here)")
    p.add_argument("--client-train-s", type=float, nargs="+",
                   default=[0.01, 0.03, 0.1, 0.3, 1.0],
                   help="ASSUMED seconds one client trains on its GPU (no GPU here)")
    p.add_argument("--repeat", type=int, default=7)
    args = p.parse_args(argv)

    from fedray.core.models import resnet18_gn

    num_params = sum(t.numel() for t in resnet18_gn((3, 32, 32), 100).parameters())
    group = args.gpus // args.nodes
    print(f"ResNet-18 (GroupNorm, CIFAR-100): {num_params:,} parameters; "
          f"{args.population:,} clients, {args.clients_per_round:,} a round, {args.gpus} GPUs "
          f"on {args.nodes} nodes (tree: groups of {group}); network "
          f"{args.network_gbps:g} Gbit/s per node (assumed)", flush=True)
    m = measure(num_params, args.population, args.clients_per_round, args.gpus, args.repeat)
    print("\nmeasured on this machine (median of "
          f"{args.repeat}; python benchmarks/cluster_model.py):")
    print("| cost | seconds |\n|---|---|")
    names = {"driver_round_s": f"driver bookkeeping for {args.clients_per_round:,} clients",
             "put_s": "broadcast: ray.put of the float32 model",
             "merge_s": "merge one float64 partial sum",
             "fold_s": "fold one client's update into a CPU worker's partial",
             "state_round_trip_s": "one client's model-sized state: write + read"}
    for key, name in names.items():
        print(f"| {name} | {m[key]:.4f} |")
    print("\nper round (seconds; train assumes the per-client time in the first column):")
    print("| client train s | driver | broadcast | train | merge flat | merge tree | round flat "
          "| round tree | critical path |")
    print("|---|---|---|---|---|---|---|---|---|")
    for t in args.client_train_s:
        r = model(m, k=args.clients_per_round, gpus=args.gpus, nodes=args.nodes,
                  num_params=num_params, client_train_s=t, network_gbps=args.network_gbps,
                  group_size=group)
        parts = {"training": r["train"], "merge (flat)": r["merge_flat"],
                 "broadcast": r["broadcast"], "driver bookkeeping": r["driver"]}
        worst = max(parts, key=parts.get)
        print(f"| {t:g} | {r['driver']:.3f} | {r['broadcast']:.3f} | {r['train']:.1f} | "
              f"{r['merge_flat']:.2f} | {r['merge_tree']:.2f} | {r['round_flat']:.1f} | "
              f"{r['round_tree']:.1f} | {worst} |")
    # where the flat merge starts to cost as much as training
    r0 = model(m, k=args.clients_per_round, gpus=args.gpus, nodes=args.nodes,
               num_params=num_params, client_train_s=0.0, network_gbps=args.network_gbps,
               group_size=group)
    per_worker = math.ceil(args.clients_per_round / args.gpus)
    even = max(0.0, (r0["merge_flat"] - r0["train"]) / per_worker)
    print(f"\nthe flat merge costs as much as training when a client trains in {even:.4f} s "
          f"or less; the tree moves that to "
          f"{max(0.0, (r0['merge_tree'] - r0['train']) / per_worker):.4f} s")
    state = args.clients_per_round * m["state_round_trip_s"] / args.gpus
    print(f"a stateful algorithm (SCAFFOLD) adds {state:.2f} s a round per worker for its "
          f"clients' model-sized state ({args.clients_per_round // args.gpus + 1} clients "
          "each), at this machine's disk speed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
