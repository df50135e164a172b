"""A worker's vectorized step, in-process: the closed-form step of Linear/ReLU chains
(fedray.kernels.vectorized.chain_sgd_step) against torch.func's vmap(grad(...)) on the same groups.

No Ray, one thread, as a worker of one CPU runs: each side trains the same clients
(synthetic FEMNIST writers of 30-90 examples, fedray.data.sources.synthetic; batch 20, 1 local epoch
or ``--epochs``) in groups of the size a worker would use, from the same weights with the
same batch orders. The sides are the closed form with the first layer's weights stacked per
client (``stacks``) and, for single-layer chains (logistic regression), kept as sums over the
examples (``sums``, fedray.kernels.vectorized.FirstLayerSums), and torch.func. They (and the group
sizes, given several ``--group``) alternate, ``--repeat`` times, and the medians are printed
with the side the workers' automatic choice takes and the largest difference between the
sides' updates (float rounding only: all are the same local SGD).

    python benchmarks/vectorized_step.py                  # logreg and mlp, 200 clients
    python benchmarks/vectorized_step.py --model logreg --epochs 5
    python benchmarks/vectorized_step.py --model mlp --group 5 9 25 50 --json step.json
    python benchmarks/vectorized_step.py --against-sequential --clients 1000
    python benchmarks/vectorized_step.py --model leaf_cnn emnist_cnn --clients 20 --group 1 2 5

``--against-sequential`` times nothing: it compares each side's updates with sequential
training's, client by client, and counts the clients that differ by more than 1e-5.

The convolutional models (``leaf_cnn``; ``emnist_cnn``, with dropout) have no closed form:
for them the sides are a plain PyTorch loop (torch.optim.SGD over the same batches, as
benchmarks/throughput.py's raw loop trains a client), fedray's sequential kernel
(kernels.sequential.local_sgd) and torch.func's step in groups of each ``--group`` size
(vmap turns each convolution into a grouped one, and the client's dropout masks are drawn
outside vmap), all on one thread, as a worker of one CPU trains. The CPU worker's own group
size for the LEAF CNN (26 MB of weights, over GROUP_BYTES) is 1.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from fedray.core.flat_model import FlatModel  # noqa: E402
from fedray.core.models import build_model  # noqa: E402
from fedray.data.sources.synthetic import SyntheticFEMNIST  # noqa: E402
from fedray.kernels.sequential import batch_schedule, local_sgd  # noqa: E402
from fedray.kernels.vectorized import (  # noqa: E402
    group_size,
    group_sizes,
    linear_chain,
    vmap_local_sgd,
)
from fedray.runtime.session import keep_freed_memory  # noqa: E402

SHAPE, CLASSES = SyntheticFEMNIST.input_shape, SyntheticFEMNIST.num_classes
# the learning rates of benchmarks/throughput.py: 0.05 is past the stable step size of
# logistic regression on these inputs, where SGD amplifies rounding differences
LR, BATCH = {"logreg": 0.01, "mlp": 0.05, "leaf_cnn": 0.05, "emnist_cnn": 0.05}, 20
CONV = ("leaf_cnn", "emnist_cnn")


def make_clients(count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    src = SyntheticFEMNIST(num_clients=count, min_examples=30, max_examples=90)
    return [tuple(torch.from_numpy(a) for a in src.client(cid)) for cid in range(count)]


# the ways a LinearChain's group can be stepped (vmap_local_sgd's options)
SIDES = {"stacks": {"defer_first": False}, "sums": {"defer_first": True},
         "torch.func": {"closed_form": False}}


def train(model: FlatModel, w0: torch.Tensor, clients, group: int, epochs: int, lr: float,
          **options) -> list[torch.Tensor]:
    """Every client's delta, trained in consecutive groups of about ``group``, cut as a
    worker cuts its clients (fedray.kernels.vectorized.group_sizes)."""
    deltas, s = [], 0
    for size in group_sizes(len(clients), group):
        part = clients[s:s + size]
        res = vmap_local_sgd(model, w0, part, lrs=[lr] * len(part), batch_size=BATCH,
                             local_epochs=epochs, local_steps=None,
                             seeds=list(range(s, s + len(part))), **options)
        deltas.extend(res.delta(i) for i in range(len(part)))
        s += size
    return deltas


def measure(name: str, clients, groups: list[int | None], repeat: int,
            epochs: int = 1) -> list[dict]:
    """One row per group size; every (group size, side) pair is timed once per repeat, all
    pairs in turn, so that a slow spell of the machine lands on all of them alike."""
    torch.manual_seed(0)
    model = FlatModel(build_model(name, SHAPE, CLASSES))
    chain = linear_chain(model.module, "cross_entropy")
    assert chain is not None  # else every side is torch.func
    # FirstLayerSums for a chain with a ReLU is not what workers use (it can flip a unit
    # at 0; fedray.kernels.vectorized), so it is timed only for single-layer chains
    sides = [s for s in SIDES if s != "sums" or len(chain.layers) == 1]
    w0 = model.flat.clone()
    lr = LR[name]
    groups = [g or group_size(model.num_params) for g in groups]
    pairs = [(g, s) for g in groups for s in sides]
    deltas = {p: train(model, w0, clients, p[0], epochs, lr, **SIDES[p[1]])  # and warm-up
              for p in pairs}
    times: dict[tuple[int, str], list[float]] = {p: [] for p in pairs}
    for _ in range(repeat):
        for p in pairs:
            t0 = time.perf_counter()
            train(model, w0, clients, p[0], epochs, lr, **SIDES[p[1]])
            times[p].append(time.perf_counter() - t0)
    rows = []
    for group in groups:
        rate = {s: len(clients) / statistics.median(times[group, s]) for s in sides}
        diff = max(float((a - b).abs().max()) for s in sides[1:]
                   for a, b in zip(deltas[group, sides[0]], deltas[group, s], strict=True))
        auto = vmap_local_sgd(model, w0, clients[:group], lrs=[lr] * len(clients[:group]),
                              batch_size=BATCH, local_epochs=epochs, local_steps=None,
                              seeds=list(range(len(clients[:group])))).path  # workers' way
        row = {"model": name, "group": group, "clients": len(clients), "epochs": epochs,
               "lr": lr, "repeat": repeat, "auto": auto, "closed_form_per_s": rate[auto],
               "torch_func_per_s": rate["torch.func"],
               "speedup": rate[auto] / rate["torch.func"], "max_abs_diff": diff}
        row.update({f"{s.replace('.', '_')}_per_s": r for s, r in rate.items()})
        rates = " | ".join(f"{s} {r:7.1f}/s" for s, r in rate.items())
        print(f"{name:7s} groups of {group:3d}, {epochs} epoch{'s' if epochs > 1 else ''}: "
              f"{rates} | closed form ({auto}) / torch.func {row['speedup']:.2f}x | "
              f"max |delta diff| {diff:.1e}", flush=True)
        rows.append(row)
    return rows


def raw_client(module: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float,
               seed: int, epochs: int) -> None:
    """One client as anyone would train it (benchmarks/throughput.py's train_client):
    torch.optim.SGD over fedray's batch order, dropout from torch.manual_seed(seed)."""
    module.train()
    opt = torch.optim.SGD(module.parameters(), lr=lr)
    torch.manual_seed(seed)
    for idx in batch_schedule(len(y), BATCH, epochs, None, seed):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(module(x[idx]), y[idx]).backward()
        opt.step()


def measure_conv(name: str, clients, groups: list[int | None], repeat: int,
                 epochs: int = 1) -> list[dict]:
    """A convolutional model: the plain loop, fedray sequential and torch.func in groups
    of each size, every side timed once per repeat in turn; one row with the rates (clients
    per second) and each side's ratio to the plain loop."""
    torch.manual_seed(0)
    model = FlatModel(build_model(name, SHAPE, CLASSES))
    raw = build_model(name, SHAPE, CLASSES)
    raw.load_state_dict(model.module.state_dict())
    start = {k: v.clone() for k, v in raw.state_dict().items()}
    w0, lr = model.flat.clone(), LR[name]
    groups = [g or group_size(model.num_params) for g in groups]

    def plain():
        for i, (x, y) in enumerate(clients):
            raw.load_state_dict(start)
            raw_client(raw, x, y, lr, i, epochs)

    def sequential():
        for i, (x, y) in enumerate(clients):
            local_sgd(model, w0, x, y, lr=lr, batch_size=BATCH, local_epochs=epochs,
                      local_steps=None, seed=i, delta_out=torch.empty_like(w0))

    sides = {"raw loop": plain, "sequential": sequential}
    for g in groups:
        sides[f"vectorized {g}"] = (lambda g=g: train(model, w0, clients, g, epochs, lr))
    for run in sides.values():  # warm-up
        run()
    times: dict[str, list[float]] = {s: [] for s in sides}
    for _ in range(repeat):
        for side, run in sides.items():
            t0 = time.perf_counter()
            run()
            times[side].append(time.perf_counter() - t0)
    rate = {s: len(clients) / statistics.median(t) for s, t in times.items()}
    row = {"model": name, "clients": len(clients), "epochs": epochs, "lr": lr,
           "repeat": repeat, "groups": groups, "per_s": rate,
           "vs_raw_loop": {s: r / rate["raw loop"] for s, r in rate.items()}}
    print(f"{name:10s} {len(clients)} clients, 1 thread: " + " | ".join(
        f"{s} {r:6.2f}/s ({r / rate['raw loop']:.2f}x)" for s, r in rate.items()), flush=True)
    return [row]


def against_sequential(name: str, clients, group: int | None, epochs: int = 1,
                       tol: float = 1e-5) -> dict:
    """Every side's updates against sequential training's (kernels.sequential.local_sgd), client
    by client: the largest difference, and how many clients differ by more than ``tol``.
    FirstLayerSums is checked for every chain here, also where workers never use it (before
    a ReLU), to show why they don't."""
    torch.manual_seed(0)
    model = FlatModel(build_model(name, SHAPE, CLASSES))
    w0, lr = model.flat.clone(), LR[name]
    group = group or group_size(model.num_params)
    sides = SIDES if linear_chain(model.module, "cross_entropy") else {"torch.func": {}}
    expected = [local_sgd(model, w0, x, y, lr=lr, batch_size=BATCH, local_epochs=epochs,
                          local_steps=None, seed=i, delta_out=torch.empty_like(w0)).delta.clone()
                for i, (x, y) in enumerate(clients)]
    row: dict = {"model": name, "group": group, "clients": len(clients), "epochs": epochs,
                 "lr": lr, "tol": tol}
    for side, options in sides.items():
        diffs = [float((got - want).abs().max()) for got, want in zip(
            train(model, w0, clients, group, epochs, lr, **options), expected, strict=True)]
        key = side.replace(".", "_")
        row[f"{key}_max_diff"] = max(diffs)
        row[f"{key}_above_tol"] = sum(d > tol for d in diffs)
    print(f"{name:7s} against sequential training, {len(clients)} clients, groups of {group}, "
          f"{epochs} epoch{'s' if epochs > 1 else ''}: " + " | ".join(
              f"{side} max {row[f'{k}_max_diff']:.1e}, {row[f'{k}_above_tol']} above {tol:g}"
              for side, k in ((s, s.replace(".", "_")) for s in sides)), flush=True)
    return row


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", nargs="+", default=["logreg", "mlp"],
                    choices=["logreg", "mlp", *CONV])
    ap.add_argument("--clients", type=int, default=200, help="clients per side (default 200)")
    ap.add_argument("--group", type=int, nargs="+", default=[None],
                    help="clients per group, one or more sizes (default: the worker's, "
                         "fedray.kernels.vectorized.group_size)")
    ap.add_argument("--epochs", type=int, default=1, help="local epochs (default 1)")
    ap.add_argument("--repeat", type=int, default=7,
                    help="timed passes per side, alternating (default 7)")
    ap.add_argument("--against-sequential", action="store_true",
                    help="instead of timing, compare every side's updates with sequential "
                         "training's, client by client")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = ap.parse_args(argv)
    if min(args.clients, args.repeat, args.epochs, *(g or 1 for g in args.group)) < 1:
        ap.error("--clients, --repeat, --epochs and --group must be at least 1")
    torch.set_num_threads(1)
    keep_freed_memory()  # as a worker does (runtime.keep_freed_memory)
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"1 thread", flush=True)
    clients = make_clients(args.clients)
    if args.against_sequential:
        rows = [against_sequential(name, clients, group, args.epochs)
                for name in args.model for group in args.group]
    else:
        rows = [row for name in args.model
                for row in (measure_conv if name in CONV else measure)(
                    name, clients, args.group, args.repeat, args.epochs)]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
