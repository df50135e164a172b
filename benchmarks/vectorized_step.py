"""A worker's vectorized step, in-process: the closed-form step of Linear/ReLU chains
(fedray.vectorized.chain_sgd_step) against torch.func's vmap(grad(...)) on the same groups.

No Ray, one thread, as a worker of one CPU runs: each side trains the same clients
(synthetic FEMNIST writers of 30-90 examples, fedray.data.synthetic; 1 local epoch, batch 20)
in groups of the size a worker would use, from the same weights with the same batch orders.
The sides alternate, ``--repeat`` times, and the medians are printed with the largest
difference between the two sides' updates (float rounding only: both are the same local SGD).

    python benchmarks/vectorized_step.py                  # logreg and mlp, 200 clients
    python benchmarks/vectorized_step.py --model mlp --group 25 --repeat 9 --json step.json
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

from fedray.data.synthetic import SyntheticFEMNIST  # noqa: E402
from fedray.models import build_model  # noqa: E402
from fedray.replica import FlatModel  # noqa: E402
from fedray.runtime import keep_freed_memory  # noqa: E402
from fedray.vectorized import group_size, linear_chain, vmap_local_sgd  # noqa: E402

SHAPE, CLASSES = SyntheticFEMNIST.input_shape, SyntheticFEMNIST.num_classes


def make_clients(count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    src = SyntheticFEMNIST(num_clients=count, min_examples=30, max_examples=90)
    return [tuple(torch.from_numpy(a) for a in src.client(cid)) for cid in range(count)]


def train(model: FlatModel, w0: torch.Tensor, clients, group: int,
          closed_form: bool) -> list[torch.Tensor]:
    """Every client's delta, trained in consecutive groups of ``group``."""
    deltas = []
    for s in range(0, len(clients), group):
        part = clients[s:s + group]
        res = vmap_local_sgd(model, w0, part, lrs=[0.05] * len(part), batch_size=20,
                             local_epochs=1, local_steps=None,
                             seeds=list(range(s, s + len(part))), closed_form=closed_form)
        deltas.extend(res.delta(i) for i in range(len(part)))
    return deltas


def measure(name: str, clients, group: int | None, repeat: int) -> dict:
    torch.manual_seed(0)
    model = FlatModel(build_model(name, SHAPE, CLASSES))
    assert linear_chain(model.module, "cross_entropy") is not None  # else both sides match
    w0 = model.flat.clone()
    group = group or group_size(model.num_params)
    closed = train(model, w0, clients, group, True)  # also the warm-up of both sides
    func = train(model, w0, clients, group, False)
    diff = max(float((a - b).abs().max()) for a, b in zip(closed, func, strict=True))
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(repeat):
        for side in (True, False):
            t0 = time.perf_counter()
            train(model, w0, clients, group, side)
            times[side].append(time.perf_counter() - t0)
    rate = {side: len(clients) / statistics.median(ts) for side, ts in times.items()}
    row = {"model": name, "group": group, "clients": len(clients), "repeat": repeat,
           "closed_form_per_s": rate[True], "torch_func_per_s": rate[False],
           "speedup": rate[True] / rate[False], "max_abs_diff": diff}
    print(f"{name:7s} groups of {group:3d}: closed form {rate[True]:7.1f}/s | vmap(grad) "
          f"{rate[False]:7.1f}/s | {row['speedup']:.2f}x | max |delta diff| {diff:.1e}",
          flush=True)
    return row


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", nargs="+", default=["logreg", "mlp"], choices=["logreg", "mlp"])
    ap.add_argument("--clients", type=int, default=200, help="clients per side (default 200)")
    ap.add_argument("--group", type=int, default=None,
                    help="clients per group (default: the worker's, fedray.vectorized.group_size)")
    ap.add_argument("--repeat", type=int, default=7,
                    help="timed passes per side, alternating (default 7)")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = ap.parse_args(argv)
    if args.clients < 1 or args.repeat < 1 or (args.group is not None and args.group < 1):
        ap.error("--clients, --repeat and --group must be at least 1")
    torch.set_num_threads(1)
    keep_freed_memory()  # as a worker does (runtime.keep_freed_memory)
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"1 thread", flush=True)
    clients = make_clients(args.clients)
    rows = [measure(name, clients, args.group, args.repeat) for name in args.model]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
