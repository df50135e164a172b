"""Seed 002's character LSTM, a worker's clients in-process: one after another (the fused
nn.LSTM, fedray.kernels.sequential.local_sgd) against groups of G in one batched step
(the unrolled LSTM under vmap, fedray.kernels.vectorized.vmap_local_sgd; issue 47).

No Ray, one thread, as a worker of one CPU runs: the clients of benchmarks/throughput.py's
lstm-10 workload (Shakespeare-shaped: 20-60 sequences of 80 token ids, every fourth padded),
1 local epoch, batch 4, ``model.loss: sequence_cross_entropy``, from the same weights with
the same batch orders. The sides (sequential, and each ``--group`` size) alternate,
``--repeat`` times, and the medians are printed as client updates per second, with each
group's ratio to sequential and the largest difference between its deltas and sequential
training's (float rounding only: the same local SGD).

    python benchmarks/recurrent_step.py                       # groups of 5, 10 and 20
    python benchmarks/recurrent_step.py --group 1 2 5 --clients 10 --repeat 3
    python benchmarks/recurrent_step.py --steps 4     # 4 local steps per client: quicker
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import throughput as tp  # noqa: E402
import torch  # noqa: E402

from fedray.core.flat_model import FlatModel  # noqa: E402
from fedray.core.models import build_model  # noqa: E402
from fedray.kernels.sequential import local_sgd  # noqa: E402
from fedray.kernels.vectorized import group_sizes, vmap_local_sgd  # noqa: E402

LOSS, BATCH, LR = "sequence_cross_entropy", 4, 1.0  # lstm-10's


def sequential(model: FlatModel, w0: torch.Tensor, clients,
               steps: int | None) -> list[torch.Tensor]:
    return [local_sgd(model, w0, x, y, lr=LR, seed=i, delta_out=torch.empty_like(w0),
                      batch_size=BATCH, local_epochs=1, local_steps=steps, loss=LOSS
                      ).delta.clone() for i, (x, y) in enumerate(clients)]


def grouped(model: FlatModel, w0: torch.Tensor, clients, group: int,
            steps: int | None) -> list[torch.Tensor]:
    """Every client's delta, in consecutive groups of about ``group``, cut as a worker cuts
    its clients (fedray.kernels.vectorized.group_sizes)."""
    deltas, s = [], 0
    for size in group_sizes(len(clients), group):
        part = clients[s:s + size]
        res = vmap_local_sgd(model, w0, part, lrs=[LR] * size, batch_size=BATCH,
                             local_epochs=1, local_steps=steps, seeds=list(range(s, s + size)),
                             loss=LOSS)
        deltas.extend(res.delta(i).clone() for i in range(size))
        s += size
    return deltas


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--group", type=int, nargs="+", default=[5, 10, 20])
    ap.add_argument("--clients", type=int, default=20, help="clients per side (default 20)")
    ap.add_argument("--repeat", type=int, default=2, help="timed runs per side (default 2)")
    ap.add_argument("--steps", type=int, default=None,
                    help="local steps per client (default: its epoch, 5-15 batches)")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    data = tp.text_clients()
    clients = [tuple(torch.from_numpy(a) for a in data[cid]) for cid in range(args.clients)]
    torch.manual_seed(0)
    model = FlatModel(build_model("shakespeare_lstm", (80,), 90))
    w0 = model.flat.clone()
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"1 thread; load average {os.getloadavg()[0]:.2f}; {args.clients} clients, "
          f"{sum(len(y) for _, y in clients)} sequences", flush=True)
    sides = ["sequential", *args.group]
    run = {"sequential": lambda: sequential(model, w0, clients, args.steps)}
    run.update({g: (lambda g=g: grouped(model, w0, clients, g, args.steps))
                for g in args.group})
    # warm-up: one step of each kind (torch.func's first call imports and traces)
    sequential(model, w0, clients[:1], 1)
    grouped(model, w0, clients[:2], 2, 1)
    times: dict = {s: [] for s in sides}
    deltas = {}
    for _ in range(args.repeat):
        for s in sides:
            t0 = time.perf_counter()
            deltas[s] = run[s]()
            times[s].append(time.perf_counter() - t0)
    seq_rate = args.clients / statistics.median(times["sequential"])
    print(f"sequential (fused nn.LSTM): {seq_rate:.2f} clients/s "
          f"{[round(t, 1) for t in times['sequential']]} s", flush=True)
    rows = []
    for g in args.group:
        rate = args.clients / statistics.median(times[g])
        diff = max(float((a - b).abs().max()) for a, b in
                   zip(deltas[g], deltas["sequential"], strict=True))
        print(f"groups of {g:3d} (unrolled, vmap): {rate:.2f} clients/s "
              f"{[round(t, 1) for t in times[g]]} s = {rate / seq_rate:.2f}x sequential | "
              f"max |delta - sequential's| {diff:.1e}", flush=True)
        rows.append({"group": g, "clients": args.clients, "repeat": args.repeat,
                     "vectorized_per_s": rate, "sequential_per_s": seq_rate,
                     "ratio": rate / seq_rate, "max_abs_diff": diff})
    print(f"load average after: {os.getloadavg()[0]:.2f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
