"""Client updates per second: fedray against a plain single-process PyTorch loop.

The plain loop is the no-framework limit: the same clients (already in memory), the same
sampled ids per round, the same model, seeds and local SGD, written as anyone would write
it with torch.optim.SGD in one process (torch's default intra-op threads). fedray runs the
same job through its Ray worker pool, with the clients handed over as in-memory client_data.
Only steady-state rounds are timed (the first ``--warmup`` rounds of each side are dropped);
Ray start-up and pool creation are reported on their own line.

    python benchmarks/throughput.py                 # workloads a and b
    python benchmarks/throughput.py --workload a --rounds 12

Workloads (issue 2):
  a: 1,000 FEMNIST-shaped clients of 30-90 examples, 20 per round, TFF EMNIST CNN,
     1 local epoch, batch 20;
  b: the same clients, logistic regression, 100 per round.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from fedray.data.synthetic import SyntheticFEMNIST  # noqa: E402
from fedray.models import build_model  # noqa: E402
from fedray.sampling import sample_clients  # noqa: E402
from fedray.seeding import TAG_INIT, client_seed, derive_seed  # noqa: E402

WORKLOADS = {
    "a": {"model": "emnist_cnn", "clients_per_round": 20, "lr": 0.05},
    "b": {"model": "logreg", "clients_per_round": 100, "lr": 0.01},
}
POPULATION, MIN_EX, MAX_EX, BATCH, SEED = 1000, 30, 90, 20, 0


def make_clients() -> dict[int, tuple[np.ndarray, np.ndarray]]:
    src = SyntheticFEMNIST(num_clients=POPULATION, min_examples=MIN_EX, max_examples=MAX_EX)
    return {cid: src.client(cid) for cid in range(POPULATION)}


def model_factory(name: str):
    def make() -> torch.nn.Module:
        return build_model(name, (1, 28, 28), 62)
    return make


def raw_loop(clients, model_name: str, k: int, lr: float, rounds: int) -> tuple[list, dict]:
    """The plain PyTorch loop; returns per-round seconds and the final state_dict."""
    torch.manual_seed(derive_seed(SEED, TAG_INIT))
    model = model_factory(model_name)()
    global_state = {n: t.detach().clone() for n, t in model.state_dict().items()}
    tensors = {cid: (torch.from_numpy(x), torch.from_numpy(y)) for cid, (x, y) in clients.items()}
    times = []
    for r in range(1, rounds + 1):
        t0 = time.perf_counter()
        ids = sample_clients(SEED, r, POPULATION, k)
        acc = {n: torch.zeros_like(t, dtype=torch.float64) for n, t in global_state.items()}
        total = 0.0
        for cid in ids:
            x, y = tensors[int(cid)]
            model.load_state_dict(global_state)
            model.train()
            opt = torch.optim.SGD(model.parameters(), lr=lr)
            seed = client_seed(SEED, r, int(cid))
            torch.manual_seed(seed)
            perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
            for i in range(0, len(y), BATCH):
                idx = perm[i:i + BATCH]
                opt.zero_grad()
                F.cross_entropy(model(x[idx]), y[idx]).backward()
                opt.step()
            n = float(len(y))
            for name, t in model.state_dict().items():
                acc[name] += n * (t - global_state[name])
            total += n
        global_state = {name: (global_state[name].double() + acc[name] / total).float()
                        for name in global_state}
        times.append(time.perf_counter() - t0)
    return times, global_state


def fedray_run(clients, model_name: str, k: int, lr: float, rounds: int, workers: int | None,
               out_dir: str) -> tuple[list, dict, dict]:
    import fedray

    cfg = {"name": f"bench-{model_name}", "seed": SEED, "rounds": rounds,
           "client": {"lr": lr, "batch_size": BATCH, "local_epochs": 1},
           "sampling": {"clients_per_round": k},
           "runtime": {"num_workers": workers},
           "eval": {"every": 0, "central": False},
           "output": {"dir": out_dir, "save_weights": False}}
    res = fedray.run(cfg, model_fn=model_factory(model_name), client_data=clients)
    return [m["train_s"] for m in res.metrics], res.weights, res.summary


def steady_rate(times: list[float], k: int, warmup: int) -> float:
    steady = times[warmup:]
    return k * len(steady) / sum(steady)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=["a", "b", "all"], default="all")
    p.add_argument("--rounds", type=int, default=12, help="rounds per side (default 12)")
    p.add_argument("--warmup", type=int, default=2, help="untimed first rounds (default 2)")
    p.add_argument("--workers", type=int, default=None, help="fedray workers (default: auto)")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs for the local Ray")
    p.add_argument("--raw-threads", type=int, default=None,
                   help="torch threads of the raw loop (default: torch's, one per core)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = p.parse_args(argv)
    if args.rounds <= args.warmup:
        p.error("--rounds must be larger than --warmup")

    import tempfile

    import ray

    if args.raw_threads:
        torch.set_num_threads(args.raw_threads)

    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"torch threads in the raw loop: {torch.get_num_threads()}")
    t0 = time.perf_counter()
    clients = make_clients()
    print(f"data: {POPULATION} clients, {sum(len(v[1]) for v in clients.values())} examples "
          f"({time.perf_counter() - t0:.1f}s to generate)")
    t0 = time.perf_counter()
    ray.init(num_cpus=args.num_cpus, include_dashboard=False, logging_level="ERROR")
    print(f"ray start-up: {time.perf_counter() - t0:.1f}s (not counted below)")
    results = []
    try:
        for name in (["a", "b"] if args.workload == "all" else [args.workload]):
            w = WORKLOADS[name]
            k, lr = w["clients_per_round"], w["lr"]
            raw_times, raw_w = raw_loop(clients, w["model"], k, lr, args.rounds)
            with tempfile.TemporaryDirectory() as tmp:
                fr_times, fr_w, summary = fedray_run(clients, w["model"], k, lr, args.rounds,
                                                     args.workers, f"{tmp}/run")
            raw_rate = steady_rate(raw_times, k, args.warmup)
            fr_rate = steady_rate(fr_times, k, args.warmup)
            diff = max(float((fr_w[n] - raw_w[n]).abs().max()) for n in raw_w)
            row = {"workload": name, "model": w["model"], "clients_per_round": k,
                   "raw_updates_per_s": raw_rate, "fedray_updates_per_s": fr_rate,
                   "ratio": fr_rate / raw_rate, "fedray_workers": summary["num_workers"],
                   "pool_start_s": summary["pool_start_s"], "max_weight_diff": diff}
            results.append(row)
            print(f"workload {name} ({w['model']}, {k} clients/round): raw loop "
                  f"{raw_rate:8.1f} updates/s | fedray {fr_rate:8.1f} updates/s "
                  f"({summary['num_workers']} workers; pool start {summary['pool_start_s']:.1f}s)"
                  f" | ratio {fr_rate / raw_rate:.2f}x | max |w_fedray - w_raw| {diff:.1e}",
                  flush=True)
    finally:
        ray.shutdown()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
