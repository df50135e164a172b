"""Client updates per second: fedray (vectorized and sequential) against a plain PyTorch loop.

The plain loop is the no-framework limit: the same clients (already in memory), the same
sampled ids per round, the same model, seeds and local SGD, written as anyone would write
it with torch.optim.SGD in one process. It runs twice, with torch's default intra-op threads
and with one thread, and the faster one is the baseline. fedray runs the same job through
its Ray worker pool, with the clients handed over as in-memory client_data, once with
runtime.worker.vectorize=off (clients one after another) and once with it on (groups of
clients in one batched step). Only steady-state rounds are timed (the first ``--warmup``
rounds of each side are dropped); Ray start-up and pool creation are not counted.

    python benchmarks/throughput.py                       # the issue 8 workloads
    python benchmarks/throughput.py --workload a b        # the issue 2 workloads
    python benchmarks/throughput.py --workload mlp-100 --rounds 6
    python benchmarks/throughput.py --repeat 3            # medians of 3 interleaved runs
    python benchmarks/throughput.py --flower-python /tmp/flower/bin/python  # and Flower

With ``--flower-python``, Flower's simulation engine runs the same workload too, under the
Python of a separate environment that has flwr[simulation] and torch (benchmarks/flower_side.py
says how it is set up); fedray never depends on Flower.

Workloads: 1,000 FEMNIST-shaped clients of 30-90 examples, 1 local epoch, batch 20, and
  logreg-100, logreg-1000: logistic regression, 100 or 1,000 clients per round;
  mlp-100, mlp-1000: the 2-layer MLP (200 hidden units), 100 or 1,000 per round;
  cnn-20, cnn-100: the LEAF FEMNIST CNN (no dropout), 20 or 100;
  a: the TFF EMNIST CNN (with dropout, its masks drawn per client), 20 per round (issue 2);
  b: logistic regression, 100 per round (issue 2; the same job as logreg-100);
and, on 1,000 Shakespeare-shaped clients of 20-60 token sequences (80 ids of TFF's
90-token vocabulary, a padded tail on every fourth sequence; the First Folio store has 37
sequences per role on average), 1 local epoch, batch 4 (seed 002's Shakespeare batch):
  lstm-10: seed 002's character LSTM, 10 per round, with the masked sequence cross-entropy
  (fedray's model.loss: sequence_cross_entropy); its vectorized side (vectorize: on, as
  every workload's) trains the LSTM unrolled (fedray/kernels/recurrent.py), which auto
  does not (benchmarks/recurrent_step.py times it in-process, group size by group size).

Algorithm API v2's examples (issue 40), against built-in FedAvg in the same invocation:
  examples-logreg, examples-mlp: logistic regression or the MLP, 100 clients per round, the
  same job with algorithm fedavg, fedper (the built-in successor of examples/local_head.py;
  the head is logreg's bias or the MLP's output layer), ditto (of examples/personal_model.py:
  lam 0.1, a personal phase as long as the global one) and examples/median.py
  (coordinate-wise median over individual updates); and built-in SCAFFOLD, a built-in part
  with per-client state, for reference. An update is a client's round (what it sends up);
  Ditto's clients train twice per update, so its rate is also given per pass of local
  training (x2).
  pers-logreg, pers-mlp (issue 42): the same against every personalization preset (fedper,
  fedrep, lg_fedavg, ditto, apfl, pfedme, per_fedavg, per_fedavg_hf; fedbn needs a
  BatchNorm model, which never trains vectorized). Each runs vectorized where its hooks
  allow (runtime.worker.vectorize=auto; the summary says which did); FedRep's clients make
  1 + algorithm.fedrep.head_epochs passes per update.

    python benchmarks/throughput.py --workload examples-logreg examples-mlp --repeat 3
    python benchmarks/throughput.py --workload pers-logreg pers-mlp --repeat 3

Reduced precision (runtime.precision, fedray/kernels/precision.py): ``--precision bf16`` also
runs fedray's sides with runtime.precision=bf16 (rows sequential_bf16, vectorized_bf16),
interleaved with the fp32 sides and against the same float32 raw loop:

    python benchmarks/throughput.py --workload cnn-20 a logreg-100 mlp-100 --precision bf16
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

from fedray.algorithms.partial_models import FedRepParams  # noqa: E402
from fedray.core.models import build_model  # noqa: E402
from fedray.core.sampling import sample_clients  # noqa: E402
from fedray.core.seeding import TAG_INIT, client_seed, derive_seed  # noqa: E402
from fedray.data.sources.synthetic import SyntheticFEMNIST  # noqa: E402

SMALL, LARGE = (12, 2), (5, 1)  # default (rounds, warmup) per workload size
WORKLOADS = {
    "logreg-100": {"model": "logreg", "clients_per_round": 100, "lr": 0.01, "rounds": SMALL},
    "logreg-1000": {"model": "logreg", "clients_per_round": 1000, "lr": 0.01, "rounds": LARGE},
    "mlp-100": {"model": "mlp", "clients_per_round": 100, "lr": 0.05, "rounds": SMALL},
    "mlp-1000": {"model": "mlp", "clients_per_round": 1000, "lr": 0.05, "rounds": LARGE},
    "cnn-20": {"model": "leaf_cnn", "clients_per_round": 20, "lr": 0.05, "rounds": LARGE},
    "cnn-100": {"model": "leaf_cnn", "clients_per_round": 100, "lr": 0.05, "rounds": LARGE},
    "a": {"model": "emnist_cnn", "clients_per_round": 20, "lr": 0.05, "rounds": SMALL},
    "b": {"model": "logreg", "clients_per_round": 100, "lr": 0.01, "rounds": SMALL},
    "lstm-10": {"model": "shakespeare_lstm", "clients_per_round": 10, "lr": 1.0,
                "rounds": LARGE, "data": "text"},
    "examples-logreg": {"model": "logreg", "clients_per_round": 100, "lr": 0.01,
                        "rounds": SMALL, "algorithms": "examples"},
    "examples-mlp": {"model": "mlp", "clients_per_round": 100, "lr": 0.05, "rounds": SMALL,
                     "algorithms": "examples"},
    "pers-logreg": {"model": "logreg", "clients_per_round": 100, "lr": 0.01,
                    "rounds": SMALL, "algorithms": "personalization"},
    "pers-mlp": {"model": "mlp", "clients_per_round": 100, "lr": 0.05, "rounds": SMALL,
                 "algorithms": "personalization"},
}


def example_algorithm(name: str, model: str) -> dict:
    """The ``algorithm`` section of an algorithms workload: a built-in preset by name, or
    an example by import path (from the repository root, which this script puts on
    sys.path)."""
    if name == "median":
        return {"aggregator": "examples.median:Median"}
    if name == "ditto":
        return {"name": "ditto", "ditto": {"lam": 0.1}}
    return {"name": name}


# built-in SCAFFOLD is there as a reference: a built-in part that keeps per-client state
# (c_i) in the client state store, whose writes fedper and ditto pay too
ALGORITHMS = {"examples": ["fedavg", "fedper", "ditto", "median", "scaffold"],
              "personalization": ["fedavg", "fedper", "fedrep", "lg_fedavg", "ditto", "apfl",
                                  "pfedme", "per_fedavg", "per_fedavg_hf"]}
# passes of local training per update (Ditto: two phases; FedRep: the head's, then one)
PASSES = {"ditto": 2, "fedrep": 1 + FedRepParams().head_epochs}
# what each kind of data looks like to the model: (input shape, classes, batch, loss)
DATA = {"images": ((1, 28, 28), 62, 20, "cross_entropy"),
        "text": ((80,), 90, 4, "sequence_cross_entropy")}
ISSUE_8 = ["logreg-100", "logreg-1000", "mlp-100", "mlp-1000", "cnn-20", "cnn-100"]
POPULATION, MIN_EX, MAX_EX, BATCH, SEED = 1000, 30, 90, 20, 0


def make_clients(kind: str = "images") -> dict[int, tuple[np.ndarray, np.ndarray]]:
    if kind == "text":
        return text_clients()
    src = SyntheticFEMNIST(num_clients=POPULATION, min_examples=MIN_EX, max_examples=MAX_EX)
    return {cid: src.client(cid) for cid in range(POPULATION)}


def text_clients() -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Token sequences shaped like the Shakespeare store's: x the 80 input ids, y the next
    ids (x shifted by one), every fourth sequence padded (id 0) after a random length."""
    g = np.random.default_rng(SEED)
    out = {}
    for cid in range(POPULATION):
        n = int(g.integers(20, 61))
        ids = g.integers(1, 90, size=(n, 81))
        for row in range(0, n, 4):
            ids[row, int(g.integers(10, 81)):] = 0
        out[cid] = (ids[:, :-1].astype(np.float32), ids[:, 1:].astype(np.int64))
    return out


def model_factory(name: str):
    shape, classes = DATA[data_kind(name)][:2]

    def make() -> torch.nn.Module:
        return build_model(name, shape, classes)
    return make


def data_kind(model_name: str) -> str:
    return "text" if model_name == "shakespeare_lstm" else "images"


def batch_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy as one would write it: per example, or per non-padding position."""
    if y.dim() == 2:
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1), ignore_index=0)
    return F.cross_entropy(out, y)


def raw_loop(clients, model_name: str, k: int, lr: float, rounds: int,
             threads: int) -> tuple[list, dict]:
    """The plain PyTorch loop on ``threads`` intra-op threads; returns per-round seconds and
    the final state_dict."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _raw_loop(clients, model_name, k, lr, rounds)
    finally:
        torch.set_num_threads(before)


def train_client(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float,
                 seed: int) -> None:
    """One client's epoch as anyone would write it: torch.optim.SGD over a seeded permutation,
    in batches of BATCH. The raw loop and the Flower client (flower_side.py) train this way."""
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    torch.manual_seed(seed)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    batch = BATCH if y.dim() == 1 else DATA["text"][2]
    for i in range(0, len(y), batch):
        idx = perm[i:i + batch]
        opt.zero_grad()
        batch_loss(model(x[idx]), y[idx]).backward()
        opt.step()


def _raw_loop(clients, model_name: str, k: int, lr: float, rounds: int) -> tuple[list, dict]:
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
            train_client(model, x, y, lr, client_seed(SEED, r, int(cid)))
            n = float(len(y))
            for name, t in model.state_dict().items():
                acc[name] += n * (t - global_state[name])
            total += n
        global_state = {name: (global_state[name].double() + acc[name] / total).float()
                        for name in global_state}
        times.append(time.perf_counter() - t0)
    return times, global_state


def fedray_run(clients, model_name: str, k: int, lr: float, rounds: int, workers: int | None,
               out_dir: str, vectorize: str, worker_cpus: float = 1.0,
               algorithm: dict | None = None,
               precision: str = "fp32") -> tuple[list, dict, dict]:
    import fedray

    _, _, batch, loss = DATA[data_kind(model_name)]
    cfg = {"name": f"bench-{model_name}", "seed": SEED, "rounds": rounds,
           "model": {"loss": loss}, "algorithm": algorithm or {"name": "fedavg"},
           "client": {"lr": lr, "batch_size": batch, "local_epochs": 1},
           "sampling": {"clients_per_round": k},
           "runtime": {"num_workers": workers, "precision": precision,
                       "worker": {"vectorize": vectorize, "num_cpus": worker_cpus}},
           "eval": {"every": 0, "central": False},
           "output": {"dir": out_dir, "save_weights": False}}
    res = fedray.run(cfg, model_fn=model_factory(model_name), client_data=clients)
    return [m["train_s"] for m in res.metrics], res.weights, res.summary


def steady_rate(times: list[float], k: int, warmup: int) -> float:
    steady = times[warmup:]
    return k * len(steady) / sum(steady)


def max_diff(a: dict, b: dict) -> float:
    return max(float((a[n] - b[n]).abs().max()) for n in a)


def write_clients(clients, path: str) -> None:
    """The clients as flower_side.py reads them: x and y of every client concatenated, and
    the offsets where each client starts (an uncompressed .npz)."""
    ids = range(POPULATION)
    sizes = [len(clients[c][1]) for c in ids]
    np.savez(path, x=np.concatenate([clients[c][0] for c in ids]),
             y=np.concatenate([clients[c][1] for c in ids]),
             offsets=np.concatenate([[0], np.cumsum(sizes)]))


def flower_run(python: str, name: str, data: str, rounds: int) -> dict:
    """flower_side.py under ``python`` (an environment with flwr[simulation]), in its own
    Ray instance: its per-round seconds, updates per round and Flower's version."""
    import subprocess
    import tempfile

    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "flower_side.py")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "flower.json")
        proc = subprocess.run([python, script, "--workload", name, "--data", data,
                               "--rounds", str(rounds), "--json", out],
                              capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            tail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or [""]
            raise SystemExit(f"throughput.py: flower_side.py failed under {python} "
                             f"(exit {proc.returncode}): {tail[0]}")
        with open(out) as f:
            return json.load(f)


def measure(name: str, clients, args) -> dict:
    """One workload, every side, ``args.repeat`` times interleaved (raw loop, fedray
    sequential, fedray vectorized, then again), so that a slow spell of this shared machine
    lands on every side alike; each side's rate is its median over the repeats, in client
    updates per second, and the ratios are ratios of medians."""
    import tempfile

    from fedray.core.models import build_model as build
    from fedray.kernels.vectorized import unsupported_reason

    w = WORKLOADS[name]
    k, lr = w["clients_per_round"], w["lr"]
    rounds, warmup = (args.rounds, args.warmup) if args.rounds else w["rounds"]
    repeat = args.repeat
    row = {"workload": name, "model": w["model"], "clients_per_round": k, "rounds": rounds,
           "warmup": warmup, "repeat": repeat}
    thread_counts = sorted({torch.get_num_threads(), 1}, reverse=True)
    sides = ["off"]
    shape, classes = DATA[data_kind(w["model"])][:2]
    if unsupported_reason(build(w["model"], shape, classes)) is None:
        sides.append("on")
    labels = {"off": "sequential", "on": "vectorized"}
    precisions = ["fp32", *(q for q in getattr(args, "precision", ()) if q != "fp32")]
    rates: dict[str, list[float]] = {}
    weights: dict[str, dict] = {}
    for _ in range(repeat):
        for threads in thread_counts:
            times, weights[f"raw_{threads}"] = raw_loop(clients, w["model"], k, lr, rounds,
                                                        threads)
            rates.setdefault(f"raw_{threads}", []).append(steady_rate(times, k, warmup))
        for vectorize in sides:
            for precision in precisions:  # fp32: the rows as before; bf16: label_bf16
                label = labels[vectorize] + ("" if precision == "fp32" else f"_{precision}")
                with tempfile.TemporaryDirectory() as tmp:
                    times, weights[label], summary = fedray_run(
                        clients, w["model"], k, lr, rounds, args.workers, f"{tmp}/run",
                        vectorize, args.vectorized_worker_cpus if vectorize == "on" else 1.0,
                        **({} if precision == "fp32" else {"precision": precision}))
                rates.setdefault(label, []).append(steady_rate(times, k, warmup))
                row[f"{label}_workers"] = summary["num_workers"]
        if args.flower_python:
            flower = flower_run(args.flower_python, name, args.flower_data, rounds)
            if set(flower["updates"]) != {k}:
                raise SystemExit(f"throughput.py: Flower aggregated {flower['updates']} "
                                 f"updates per round, not {k}")
            rates.setdefault("flower", []).append(steady_rate(flower["round_s"], k, warmup))
            row["flower_version"] = flower["flower_version"]
    for threads in thread_counts:
        row[f"raw_{threads}_threads_updates_per_s"] = float(np.median(rates[f"raw_{threads}"]))
    best = max(thread_counts, key=lambda t: row[f"raw_{t}_threads_updates_per_s"])
    row["raw_updates_per_s"], row["raw_threads"] = row[f"raw_{best}_threads_updates_per_s"], best
    row["raw_runs"] = rates[f"raw_{best}"]
    for label in (labels[v] for v in sides):
        row[f"{label}_updates_per_s"] = float(np.median(rates[label]))
        row[f"{label}_runs"] = rates[label]
        row[f"{label}_ratio"] = row[f"{label}_updates_per_s"] / row["raw_updates_per_s"]
        row[f"{label}_max_weight_diff_vs_raw"] = max_diff(weights[label], weights[f"raw_{best}"])

    reduced = [f"{labels[v]}_{q}" for v in sides for q in precisions[1:]]
    for label in reduced:
        fp32 = label.rsplit("_", 1)[0]
        row[f"{label}_updates_per_s"] = float(np.median(rates[label]))
        row[f"{label}_runs"] = rates[label]
        row[f"{label}_ratio"] = row[f"{label}_updates_per_s"] / row["raw_updates_per_s"]
        row[f"{label}_vs_fp32"] = row[f"{label}_updates_per_s"] / row[f"{fp32}_updates_per_s"]
        row[f"{label}_max_weight_diff_vs_raw"] = max_diff(weights[label], weights[f"raw_{best}"])

    if "flower" in rates:
        row["flower_updates_per_s"] = float(np.median(rates["flower"]))
        row["flower_runs"] = rates["flower"]
        row["flower_ratio"] = row["flower_updates_per_s"] / row["raw_updates_per_s"]
        best_fedray = max(row.get(f"{labels[v]}_updates_per_s", 0.0) for v in sides)
        row["fedray_vs_flower"] = best_fedray / row["flower_updates_per_s"]

    def rate(label: str) -> str:
        runs = row[f"{label}_runs"]
        spread = f" [{min(runs):.1f}-{max(runs):.1f}]" if len(runs) > 1 else ""
        return f"{row[f'{label}_updates_per_s']:7.1f}/s{spread}"

    line = (f"{name:12s} ({w['model']}, {k} clients/round, {rounds - warmup} timed rounds"
            f"{f', median of {repeat}' if repeat > 1 else ''}): raw loop {rate('raw')} "
            f"({best} thread{'s' if best > 1 else ''}) | fedray sequential "
            f"{rate('sequential')} = {row['sequential_ratio']:.2f}x")
    if "vectorized_updates_per_s" in row:
        line += (f" | fedray vectorized {rate('vectorized')} = "
                 f"{row['vectorized_ratio']:.2f}x raw, "
                 f"{row['vectorized_updates_per_s'] / row['sequential_updates_per_s']:.2f}x "
                 f"sequential")
    else:
        line += (" | vectorized: n/a (the model cannot be vectorized: AlphaDropout, buffers, "
                 "or a recurrent layer other than a plain nn.LSTM)")
    if "flower_runs" in row:
        line += (f" | Flower {row['flower_version']} {rate('flower')} = "
                 f"{row['flower_ratio']:.2f}x raw; fedray's best "
                 f"{row['fedray_vs_flower']:.1f}x Flower")
    diffs = ", ".join(f"{label} {row[f'{label}_max_weight_diff_vs_raw']:.1e}"
                      for label in ("sequential", "vectorized") if f"{label}_ratio" in row)
    workers = ", ".join(f"{label} {row[f'{label}_workers']}"
                        for label in ("sequential", "vectorized") if f"{label}_ratio" in row)
    print(line + f" | workers: {workers} | max |w - w_raw|: {diffs}", flush=True)
    for label in reduced:
        print(f"{'':12s} {label}: {rate(label)} = {row[f'{label}_ratio']:.2f}x raw (fp32), "
              f"{row[f'{label}_vs_fp32']:.2f}x fedray fp32 | max |w - w_raw|: "
              f"{row[f'{label}_max_weight_diff_vs_raw']:.1e}", flush=True)
    return row


def measure_algorithms(name: str, clients, args) -> dict:
    """An examples workload: fedray vectorized with FedAvg and each example algorithm on the
    same model, clients and sampled ids, ``args.repeat`` times interleaved (every algorithm,
    then again); each rate is a median over the repeats, and each example's ratio is its
    rate over FedAvg's."""
    import tempfile

    w = WORKLOADS[name]
    k, lr, model = w["clients_per_round"], w["lr"], w["model"]
    rounds, warmup = (args.rounds, args.warmup) if args.rounds else w["rounds"]
    row = {"workload": name, "model": model, "clients_per_round": k, "rounds": rounds,
           "warmup": warmup, "repeat": args.repeat}
    rates: dict[str, list[float]] = {}
    names = ALGORITHMS[w["algorithms"]]
    for _ in range(args.repeat):
        for algo in names:
            with tempfile.TemporaryDirectory() as tmp:
                times, _, summary = fedray_run(clients, model, k, lr, rounds, args.workers,
                                               f"{tmp}/run", "auto",
                                               args.vectorized_worker_cpus,
                                               example_algorithm(algo, model))
            rates.setdefault(algo, []).append(steady_rate(times, k, warmup))
            row[f"{algo}_vectorized"] = summary["vectorized"]
            row[f"{algo}_workers"] = summary["num_workers"]
    base = float(np.median(rates["fedavg"]))
    parts = []
    for algo in names:
        rate = float(np.median(rates[algo]))
        row[f"{algo}_updates_per_s"], row[f"{algo}_runs"] = rate, rates[algo]
        row[f"{algo}_vs_fedavg"] = rate / base
        passes = PASSES.get(algo, 1)
        row[f"{algo}_passes_per_update"] = passes
        spread = (f" [{min(rates[algo]):.1f}-{max(rates[algo]):.1f}]"
                  if len(rates[algo]) > 1 else "")
        text = f"{algo} {rate:7.1f}/s{spread}"
        if algo != "fedavg":
            text += f" = {rate / base:.2f}x fedavg"
            if passes > 1:
                text += (f" ({rate * passes:.1f} passes/s = "
                         f"{rate * passes / base:.2f}x per pass)")
        if not row[f"{algo}_vectorized"]:
            text += " (NOT vectorized)"
        parts.append(text)
    print(f"{name:15s} ({model}, {k} clients/round, {rounds - warmup} timed rounds"
          f"{f', median of {args.repeat}' if args.repeat > 1 else ''}, vectorized where "
          "allowed, "
          f"{row['fedavg_workers']} workers): " + " | ".join(parts), flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", nargs="+", choices=[*WORKLOADS, "all"], default=ISSUE_8,
                   help="workloads to run (default: the issue 8 set; all: every one)")
    p.add_argument("--rounds", type=int, default=None,
                   help="rounds per side (default: 12 for the small workloads, 5 for the "
                        "1,000-client and CNN ones)")
    p.add_argument("--warmup", type=int, default=1,
                   help="untimed first rounds when --rounds is given (default 1)")
    p.add_argument("--repeat", type=int, default=1,
                   help="measure every side this many times, interleaved, and report the "
                        "medians with their range (default 1)")
    p.add_argument("--workers", type=int, default=None, help="fedray workers (default: auto)")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs for the local Ray")
    p.add_argument("--vectorized-worker-cpus", type=float, default=1.0,
                   help="runtime.worker.num_cpus of the vectorized side (default 1; the "
                        "sequential side always uses 1)")
    p.add_argument("--flower-python", metavar="PYTHON",
                   help="also time Flower's simulation (flower_side.py) under this Python, "
                        "of an environment with flwr[simulation] and torch")
    p.add_argument("--precision", nargs="+", choices=["fp32", "bf16"], default=["fp32"],
                   help="runtime.precision of fedray's sides: bf16 adds rows in bfloat16 "
                        "autocast next to the fp32 ones, against the same float32 raw loop "
                        "(default: fp32 only)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = p.parse_args(argv)
    if args.rounds is not None and args.rounds <= args.warmup:
        p.error("--rounds must be larger than --warmup")
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    names = list(WORKLOADS) if "all" in args.workload else args.workload

    import ray

    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"raw loop threads: {torch.get_num_threads()} (torch's default) and 1")
    kinds = sorted({data_kind(WORKLOADS[n]["model"]) for n in names})
    datasets = {}
    for kind in kinds:
        t0 = time.perf_counter()
        datasets[kind] = make_clients(kind)
        print(f"data ({kind}): {POPULATION} clients, "
              f"{sum(len(v[1]) for v in datasets[kind].values())} examples "
              f"({time.perf_counter() - t0:.1f}s to generate)")
    clients = datasets.get("images")
    if args.flower_python:
        if clients is None or "text" in datasets:
            p.error("--flower-python: flower_side.py runs the image workloads only")
        import tempfile

        flower_dir = tempfile.TemporaryDirectory()
        args.flower_data = os.path.join(flower_dir.name, "clients.npz")
        write_clients(clients, args.flower_data)
    t0 = time.perf_counter()
    ray.init(num_cpus=args.num_cpus, include_dashboard=False, logging_level="ERROR")
    print(f"ray start-up: {time.perf_counter() - t0:.1f}s (not counted below)", flush=True)
    try:
        results = [(measure_algorithms if WORKLOADS[name].get("algorithms") else measure)(
            name, datasets[data_kind(WORKLOADS[name]["model"])], args) for name in names]
    finally:
        ray.shutdown()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
