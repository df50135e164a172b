"""Personalized FL on one data set: every registered personalization preset beside FedAvg.

For each method -- FedAvg, FedAvg + fine-tune (``eval.personalize``), and each of fedper,
fedrep, lg_fedavg, fedbn, ditto, apfl, pfedme, per_fedavg, per_fedavg_hf that is registered
-- it tunes a small grid (client lr x the method's key hyper-parameter, 2 x 2) on seed 0 by
the final ``clients_accuracy_mean`` (every evaluated client on its own test split, with the
model the method gives it), then runs the best setting for the remaining seeds. It records
per method the mean, p10 and worst-10 % client accuracy (mean ± std over seeds), the global
model's mean client accuracy, and the time per round; it writes ``table.md``,
``results.json`` (every run's final numbers, the grid and the choice) and
``personalization_<data set>.png`` under ``--out``. Re-running the command reuses every
finished run directory (an interrupted run resumes from its checkpoint), so it can be
stopped and continued at any time. docs/personalization.md has the protocol and results.

    python benchmarks/personalization.py femnist              # LEAF FEMNIST sample, 105 writers
    python benchmarks/personalization.py mnist_pathological   # MNIST t10k, 2 classes a client
    python benchmarks/personalization.py feature_shift        # needs data.per_client
    python benchmarks/personalization.py femnist --methods fedavg fedper --seeds 0 1 2

Runs use ``runtime.backend=inline`` with one worker by default (no Ray: on 2 busy cores the
actors only add start-up time); ``--backend ray`` runs the same configs with one worker actor.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from itertools import product
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
SHARED_DATA = os.path.join(REPO, "..", "shared", "data")


@dataclass(frozen=True)
class Method:
    """One row of the table. ``family`` names the run directories: FedAvg and FedAvg +
    fine-tune share theirs (fine-tuning never changes training, docs/evaluation.md), and only
    ``prefix`` -- which metrics.jsonl columns are this row's model -- differs."""

    key: str  # the row's name on the command line (--methods)
    label: str  # the table's name
    preset: str  # algorithm.name (also what must be registered)
    grid: dict[str, list[Any]]  # the method's key hyper-parameter(s): config key -> values
    family: str = ""  # run directories' folder (default: key)
    prefix: str = "clients_"  # clients_ or clients_personalized_
    fixed: tuple[str, ...] = ()  # overrides every run of the method gets
    lrs: tuple[float, ...] | None = None  # its own client lr grid (None: the data set's)
    note: str = ""  # shown in the table

    @property
    def folder(self) -> str:
        return self.family or self.key


# The method grids: fedray's choices, two values of each method's key hyper-parameter, its
# preset's default first (what --first-value-only keeps), then one on the other side of it
# (docs/personalization.md). The client lr grid is the data set's (DatasetSpec.lrs, --lrs).
FT = ("eval.personalize.epochs=1",)
METHODS: list[Method] = [
    Method("fedavg", "FedAvg", "fedavg", {"eval.personalize.lr": [0.01, 0.1]}, fixed=FT),
    Method("fedavg_ft", "FedAvg + fine-tune (1 epoch)", "fedavg",
           {"eval.personalize.lr": [0.01, 0.1]}, family="fedavg",
           prefix="clients_personalized_", fixed=FT),
    # FedPer and LG-FedAvg: the split into head and body is their one design choice, and
    # the MLP has two layers, so there is one split (@head, the output layer): lr only
    Method("fedper", "FedPer", "fedper", {}),
    Method("fedrep", "FedRep", "fedrep", {"algorithm.fedrep.head_epochs": [5, 1]}),
    Method("lg_fedavg", "LG-FedAvg", "lg_fedavg", {}),
    Method("ditto", "Ditto", "ditto", {"algorithm.ditto.lam": [0.1, 1.0]}),
    Method("apfl", "APFL", "apfl", {"algorithm.apfl.alpha": [0.25, 0.5]}),
    Method("pfedme", "pFedMe", "pfedme", {"algorithm.pfedme.lam": [15.0, 5.0]}),
    Method("per_fedavg", "Per-FedAvg (FO)", "per_fedavg",
           {"algorithm.per_fedavg.alpha": [0.01, 0.05]}),
    Method("per_fedavg_hf", "Per-FedAvg (HF)", "per_fedavg_hf",
           {"algorithm.per_fedavg.alpha": [0.01, 0.05]}),
    # FedBN needs BatchNorm layers: the BN CNN, trained one client at a time (no vectorized
    # kernel takes BatchNorm buffers), by far the slowest row: one lr, no grid, and one
    # local epoch (on 2 busy cores, 5 epochs took about 80 s a round: 40 minutes a run)
    Method("fedbn", "FedBN", "fedbn", {}, family="fedbn_cnn_bn_1epoch",
           fixed=("model.name=emnist_cnn_bn", "client.local_epochs=1"), lrs=(0.1,),
           note="emnist_cnn_bn, 1 local epoch: not the MLP's protocol"),
]


@dataclass
class DatasetSpec:
    """A data set's base job, how to build its data, and its default sizes."""

    name: str
    job: Callable[[argparse.Namespace], dict | str]  # the base job (dict or YAML path)
    prepare: Callable[[argparse.Namespace], None] = lambda args: None  # build the store
    lrs: tuple[float, ...] = (0.03, 0.1)  # the client lr grid
    overrides: list[str] = field(default_factory=list)
    skip: dict[str, str] = field(default_factory=dict)  # method -> why it is not run here


def common_job(args: argparse.Namespace, partition: str, model: str = "mlp") -> dict:
    """The protocol every data set shares: local_epochs epochs at batch 20,
    clients_per_round clients a round, eval_clients clients evaluated on their own test
    split."""
    return {"name": f"personalization_{args.dataset}", "seed": 0, "rounds": args.rounds,
            "data": {"partition": partition}, "model": {"name": model},
            "client": {"lr": 0.1, "batch_size": 20, "local_epochs": args.local_epochs},
            "sampling": {"clients_per_round": args.clients_per_round},
            "eval": {"every": args.eval_every, "federated_clients": args.eval_clients,
                     "central": False},
            "output": {"save_weights": False}}


def femnist_store(args: argparse.Namespace) -> str:
    return os.path.join(args.out, "stores", "femnist")


def prepare_femnist(args: argparse.Namespace) -> None:
    """The LEAF FEMNIST sample's natural writer split (partitions/femnist.yaml), built once
    under --out (never in the repository)."""
    out = femnist_store(args)
    if os.path.exists(os.path.join(out, "manifest.json")):
        return
    from fedray.data.recipe import build

    print(f"building {out} from {args.data}/femnist-leaf-sample", flush=True)
    build(os.path.join(REPO, "partitions", "femnist.yaml"),
          [f"source.path={os.path.join(args.data, 'femnist-leaf-sample')}", f"out={out}"])


def pathological_store(args: argparse.Namespace) -> str:
    return os.path.join(args.out, "stores", "mnist_pathological")


def pathological_clients(y: Any, num_clients: int, seed: int) -> tuple[Any, Any]:
    """Each client's id and split per example: client i holds two distinct classes,
    i % C and (i % C + 1 + (i // C) % (C - 1)) % C, so every class is held by about
    2 * num_clients / C clients and every pair of neighbouring offsets occurs; each class's
    examples, in a seeded order, are cut evenly among its holders, and each client's last
    20 % of each class is its own test split. fedray's choice of a pathological split
    (McMahan et al. 2017 deal sorted shards at random, which can give a client one class
    twice); fedray has no shards partitioner (docs/personalization.md)."""
    import numpy as np

    c = int(y.max()) + 1
    holders: dict[int, list[int]] = {k: [] for k in range(c)}
    for i in range(num_clients):
        a = i % c
        holders[a].append(i)
        holders[(a + 1 + (i // c) % (c - 1)) % c].append(i)
    rng = np.random.default_rng(seed)
    owner = np.empty(len(y), dtype=np.int64)
    split = np.empty(len(y), dtype=object)
    for k, clients in holders.items():
        idx = rng.permutation(np.flatnonzero(y == k))
        for cid, part in zip(clients, np.array_split(idx, len(clients)), strict=True):
            owner[part] = cid
            n_test = max(1, round(0.2 * len(part)))
            split[part[:-n_test]] = "train"
            split[part[-n_test:]] = "test"
    return owner, split


def prepare_pathological(args: argparse.Namespace) -> None:
    """MNIST t10k (10,000 real images) in 100 clients of 2 classes, each with its own test
    split, written as a store with the natural partitioner (one client per user id)."""
    out = pathological_store(args)
    if os.path.exists(os.path.join(out, "manifest.json")):
        return
    from fedray.data import from_arrays
    from fedray.data.sources.mnist import load_mnist

    print(f"building {out} from {args.data}/mnist-t10k", flush=True)
    ds = load_mnist(os.path.join(args.data, "mnist-t10k"))
    owner, split = pathological_clients(ds.train.y, 100, seed=0)
    (from_arrays(ds.train.x, ds.train.y, user_ids=owner, split=split.astype(str))
     .partition("natural", seed=0).write_store(out))


FEATURE_SHIFT_JOB = os.path.join(REPO, "jobs", "personalization", "feature_shift_mnist.yaml")


def shift_store(args: argparse.Namespace) -> str:
    return os.path.join(args.out, "stores", "mnist_clients20")


def prepare_feature_shift(args: argparse.Namespace) -> None:
    """The job's store, by its own script (jobs/personalization/mnist_clients.py: MNIST t10k
    in 20 clients, each with a test split), built once under --out."""
    if not os.path.exists(FEATURE_SHIFT_JOB):
        raise SystemExit(f"error: {FEATURE_SHIFT_JOB} is not there (the feature-shift job, "
                         "with data.per_client, is another change); nothing was run")
    out = shift_store(args)
    if os.path.exists(os.path.join(out, "manifest.json")):
        return
    import subprocess

    print(f"building {out} from {args.data}/mnist-t10k", flush=True)
    subprocess.run([sys.executable, os.path.join(REPO, "jobs", "personalization",
                                                 "mnist_clients.py"),
                    os.path.join(args.data, "mnist-t10k"), out], check=True)


def feature_shift_job(args: argparse.Namespace) -> str:
    """jobs/personalization/feature_shift_mnist.yaml (its data.per_client shifts); the
    protocol's sizes, the store and the MLP are set on top of it as overrides (FedBN keeps
    the job's emnist_cnn_bn)."""
    return FEATURE_SHIFT_JOB


def size_overrides(args: argparse.Namespace) -> list[str]:
    return [f"rounds={args.rounds}", f"sampling.clients_per_round={args.clients_per_round}",
            f"eval.every={args.eval_every}", f"eval.federated_clients={args.eval_clients}",
            "client.batch_size=20", f"client.local_epochs={args.local_epochs}",
            "output.save_weights=false"]


DATASETS: dict[str, DatasetSpec] = {
    "femnist": DatasetSpec("femnist", lambda a: common_job(a, femnist_store(a)),
                           prepare_femnist),
    "mnist_pathological": DatasetSpec(
        "mnist_pathological", lambda a: common_job(a, pathological_store(a)),
        prepare_pathological,
        skip={"fedbn": "no BN model is run on this data set (FedBN targets feature shift)"}),
    "feature_shift": DatasetSpec("feature_shift", feature_shift_job, prepare_feature_shift),
    # the test's smoke data (tests/test_benchmark_personalization.py): fedray's generated
    # writers, each with its own test split; not a benchmark
    "synthetic": DatasetSpec(
        "synthetic", lambda a: common_job(a, "synthetic"),
        overrides=["data.synthetic.num_clients=12", "data.synthetic.min_examples=20",
                   "data.synthetic.max_examples=30", "data.synthetic.test_fraction=0.2"]),
}
DEFAULTS = {  # rounds, clients per round, eval every, eval clients
    "femnist": (30, 10, 10, 105), "mnist_pathological": (30, 10, 10, 100),
    "feature_shift": (30, 5, 10, 20), "synthetic": (2, 4, 1, 6)}


def slug(over: dict[str, Any]) -> str:
    """A run directory's name from its settings: the last part of each key and its value."""
    parts = []
    for k, v in over.items():
        text = str(v).strip("[]").replace("@", "").replace(",", "+").replace(".", "p")
        parts.append(f"{k.rsplit('.', 1)[-1]}{text}")
    return "_".join(parts)


def protocol_dir(args: argparse.Namespace) -> str:
    """Run directories of one protocol live apart (runs/R30_K10_L5_E10_N105/...), so a
    changed --rounds, --clients-per-round or --local-epochs never reuses a run made with
    other sizes."""
    return os.path.join("runs", f"R{args.rounds}_K{args.clients_per_round}"
                                f"_L{args.local_epochs}_E{args.eval_every}_N{args.eval_clients}")


def settings(method: Method, lrs: tuple[float, ...]) -> list[dict[str, Any]]:
    """The method's grid: client lr x its key hyper-parameter(s), in a fixed order."""
    grid = {"client.lr": list(method.lrs or lrs), **method.grid}
    keys = list(grid)
    return [dict(zip(keys, vals, strict=True)) for vals in product(*grid.values())]


def final_metrics(run_dir: str) -> dict:
    """The last eval round's metrics, with the run's mean time per round: ``train_s``
    (sampling to server update) and ``wall_s`` (the round with its evaluation)."""
    from fedray.state.run_dir import read_metrics

    rows = read_metrics(run_dir)
    last = [r for r in rows if "clients_evaluated" in r][-1]
    train = [r["train_s"] for r in rows if "train_s" in r]
    wall = [r["wall_s"] for r in rows if "wall_s" in r]
    return {**{k: v for k, v in last.items() if k.startswith(("clients_", "fed_test_"))},
            "round": last["round"], "rounds": len(rows),
            "train_s_per_round": sum(train) / max(1, len(train)),
            "wall_s_per_round": sum(wall) / max(1, len(wall)),
            "wall_s": sum(wall)}


def run_one(base: dict | str, overrides: list[str], run_dir: str,
            log: Callable[[str], None], report_only: bool = False,
            summarize: Callable[[str], dict] | None = None) -> dict:
    """One run, or its finished result: a directory with summary.json is read, not re-run;
    one with a checkpoint is resumed; anything else there is removed and run afresh. A run
    that diverges (a result about its learning rate) is recorded as such in
    ``RUN_DIR.failed.json`` and not retried; any other error stops the benchmark. With
    ``report_only`` nothing is trained: an unfinished run is ``{"missing": True}``.
    ``summarize``: what is kept of a finished run (default ``final_metrics``)."""
    summarize = summarize or final_metrics
    import fedray
    from fedray.errors import DivergedError

    failed = run_dir.rstrip("/") + ".failed.json"
    if os.path.exists(os.path.join(run_dir, "summary.json")):
        return {**summarize(run_dir), "reused": True}
    if os.path.exists(failed):
        with open(failed) as f:
            return json.load(f)
    if report_only:
        return {"missing": True}
    t0 = time.perf_counter()
    try:
        if os.path.exists(os.path.join(run_dir, "checkpoint.safetensors")):
            log(f"resuming {run_dir}")
            fedray.run(resume=run_dir)
        else:
            shutil.rmtree(run_dir, ignore_errors=True)
            fedray.run(base, overrides=[*overrides, f"output.dir={run_dir}"])
    except DivergedError as exc:
        out = {"failed": str(exc).splitlines()[0]}
        with open(failed, "w") as f:
            json.dump(out, f)
        return out
    return {**summarize(run_dir), "run_s": time.perf_counter() - t0}


def row_stats(method: Method, runs: list[dict]) -> dict:
    """A method's numbers over its seeds: mean and population std of each statistic."""
    import numpy as np

    p = method.prefix
    keys = {"mean": f"{p}accuracy_mean", "p10": f"{p}accuracy_p10",
            "worst10": f"{p}accuracy_worst10"}
    out: dict[str, Any] = {}
    for name, k in keys.items():
        v = np.array([r[k] for r in runs])
        out[name], out[f"{name}_std"] = float(v.mean()), float(v.std())
    # the global model's mean client accuracy: own-model presets report it as
    # clients_global_*; for FedAvg (+ fine-tune) the global model is clients_*
    g = np.array([r.get("clients_global_accuracy_mean", r["clients_accuracy_mean"])
                  for r in runs])
    out["global_mean"], out["global_mean_std"] = float(g.mean()), float(g.std())
    for k in ("train_s_per_round", "wall_s_per_round"):
        out[k] = float(np.mean([r[k] for r in runs]))
    return out


def score(method: Method, result: dict) -> float:
    """The tuning criterion: final mean client accuracy of the method's model (-inf for a
    failed run, NaN-safe)."""
    v = result.get(f"{method.prefix}accuracy_mean")
    return -math.inf if v is None or not math.isfinite(v) else float(v)


def fmt(mu: float, sd: float) -> str:
    return f"{mu:.3f} ± {sd:.3f}"


def markdown(dataset: str, rows: list[dict], protocol: str) -> str:
    lines = [f"Data set `{dataset}`: {protocol}", "",
             "| method | best setting (seed 0) | grid runs | seeds | client mean | client p10 "
             "| worst 10 % | global model, client mean | train s/round | s/round with eval |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['label']} | not run: {r['skipped']} | | | | | | | | |")
            continue
        best = " ".join(f"{k.removeprefix('algorithm.').removeprefix('eval.')}={v}"
                        for k, v in r["best"].items())
        s = r["stats"]
        lines.append(
            f"| {r['label']} | {best} | {r['tuned']} | {len(r['seeds'])} | "
            f"{fmt(s['mean'], s['mean_std'])} | "
            f"{fmt(s['p10'], s['p10_std'])} | {fmt(s['worst10'], s['worst10_std'])} | "
            f"{fmt(s['global_mean'], s['global_mean_std'])} | {s['train_s_per_round']:.2f} | "
            f"{s['wall_s_per_round']:.2f} |")
    return "\n".join(lines) + "\n"


def figure(dataset: str, rows: list[dict], path: str) -> None:
    """Grouped bars per method: client mean, p10 and worst 10 % (std over seeds as error
    bars), the global model's client mean as a black tick."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    done = [r for r in rows if "stats" in r]
    if not done:
        return
    x = np.arange(len(done))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(done) + 3), 4.8))
    for i, (k, name) in enumerate([("mean", "client mean"), ("p10", "client p10"),
                                   ("worst10", "worst 10 %")]):
        ax.bar(x + (i - 1) * 0.27, [r["stats"][k] for r in done], 0.27,
               yerr=[r["stats"][f"{k}_std"] for r in done], capsize=2, label=name)
    ax.scatter(x - 0.27, [r["stats"]["global_mean"] for r in done], marker="_", s=300,
               color="black", zorder=3, label="global model, client mean")
    most = max(len(r["seeds"]) for r in done)  # a row with fewer seeds says so
    ax.set_xticks(x, [r.get("short", r["label"]) + (
        f" ({len(r['seeds'])} seed{'s' * (len(r['seeds']) > 1)})"
        if len(r["seeds"]) < most else "") for r in done], rotation=30, ha="right")
    notes = [f"{r['short']}: {r['label'].removeprefix(r['short'].rstrip('*')).strip(' ()')}"
             for r in done if r.get("short", "").endswith("*")]
    if notes:
        ax.set_xlabel("; ".join(notes), fontsize=8)
    ax.set_ylabel("final accuracy on the client's own test split")
    ax.set_title(f"{dataset}: per-client accuracy (mean ± std over seeds)")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def benchmark(spec: DatasetSpec, args: argparse.Namespace,
              methods: list[Method]) -> dict:
    """Tune every method on seed 0, run its best setting on every seed, write the outputs.
    Returns what results.json holds."""
    from fedray.algorithms import PRESETS

    log = (lambda s: print(s, flush=True)) if not args.quiet else (lambda s: None)
    t_start = time.perf_counter()
    spec.prepare(args)
    base = spec.job(args)
    if spec.name == "feature_shift":  # the job's store, built under --out
        spec = replace(spec, overrides=[f"data.partition={shift_store(args)}",
                                        "model.name=mlp"])
    common = [*spec.overrides, *(size_overrides(args) if isinstance(base, str) else []),
              f"runtime.backend={args.backend}", "runtime.num_workers=1", *args.overrides]
    if args.lrs:
        spec = replace(spec, lrs=tuple(args.lrs))
    todo = [m for m in methods if m.preset in PRESETS and m.key not in spec.skip]
    # at most this many runs: FedAvg and its fine-tune row share their seed-0 grid
    todo = [replace(m, grid={k: v[:1] for k, v in m.grid.items()})
            if m.key in args.first_value_only else m for m in todo]
    total = len({(m.folder, slug(o)) for m in todo for o in settings(m, spec.lrs)}) \
        + sum(len(args.seeds) - 1 for m in todo)
    count = 0
    results: dict[str, Any] = {"dataset": spec.name, "argv": sys.argv[1:], "runs": {},
                               "rows": []}

    def one(m: Method, over: dict[str, Any], seed: int) -> dict:
        nonlocal count
        count += 1
        run_dir = os.path.join(args.out, protocol_dir(args), m.folder, f"{slug(over)}_s{seed}")
        name = os.path.relpath(run_dir, args.out)
        if name in results["runs"]:
            count -= 1  # shared with an earlier row (FedAvg and its fine-tune)
            return results["runs"][name]
        t0 = time.perf_counter()
        # the method's own settings after the data set's (FedBN's model over an mlp default)
        r = run_one(base, [f"algorithm.name={m.preset}", *common, *m.fixed, f"seed={seed}",
                           *(f"{k}={v}" for k, v in over.items())], run_dir, log,
                    args.report_only)
        r = {**r, "settings": over, "seed": seed, "method": m.folder}
        results["runs"][name] = r
        what = "not run" if "missing" in r else ("failed: " + r["failed"]) if "failed" in r else (
            f"client mean {r[f'{m.prefix}accuracy_mean']:.3f}"
            + (" (reused)" if r.get("reused") else f" ({time.perf_counter() - t0:.0f}s)"))
        log(f"[{count}/{total} at most] {m.key} {slug(over)} seed {seed}: {what}")
        return r

    for m in methods:
        if m.preset not in PRESETS or m.key in spec.skip:
            why = spec.skip.get(m.key, f"preset {m.preset} is not registered")
            results["rows"].append({"key": m.key, "label": m.label, "skipped": why})
            log(f"{m.key}: not run ({why})")
            continue
        if m.key in args.first_value_only:
            m = replace(m, grid={k: v[:1] for k, v in m.grid.items()})
        grid = settings(m, spec.lrs)
        tuned = [(score(m, one(m, over, args.seeds[0])), i) for i, over in enumerate(grid)]
        best = grid[max(range(len(grid)), key=lambda i: tuned[i][0])]  # ties: the first
        runs = [results["runs"][os.path.join(protocol_dir(args), m.folder,
                                             f"{slug(best)}_s{s}")]
                if s == args.seeds[0] else one(m, best, s) for s in args.seeds]
        if not math.isfinite(max(tuned)[0]):  # seed 0 never finished: the seeds mean nothing
            runs = [{"missing": True}]
        ok = [r for r in runs if "failed" not in r and "missing" not in r]
        row = {"key": m.key, "label": m.label + (f" ({m.note})" if m.note else ""),
               "short": m.label + ("*" if m.note else ""),
               "best": best, "seeds": [r["seed"] for r in ok],
               "tuned": f"{sum(math.isfinite(t) for t, _ in tuned)}/{len(grid)}",
               "grid": [{**o, "score": t if math.isfinite(t) else None}
                        for o, (t, _) in zip(grid, tuned, strict=True)]}
        if ok:
            row["stats"] = row_stats(m, ok)
        elif all("missing" in r for r in runs):
            row["skipped"] = "no run of it has ended (--report-only)"
        else:
            row["skipped"] = "every run failed: " + next(
                (r["failed"] for r in runs if "failed" in r), "")
        results["rows"].append(row)
    results["total_s"] = time.perf_counter() - t_start
    protocol = (f"{args.rounds} rounds, {args.clients_per_round} clients a round, "
                f"{args.local_epochs} local epochs at batch 20, {args.eval_clients} clients "
                f"evaluated on their own test split; seeds {', '.join(map(str, args.seeds))}; "
                f"`python benchmarks/personalization.py {' '.join(sys.argv[1:])}`".rstrip())
    if args.only_seed0:
        protocol += " (seed 0 only)"
    text = markdown(spec.name, results["rows"], protocol)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=2, default=float)
    figure(spec.name, results["rows"], args.figure
           or os.path.join(args.out, f"personalization_{spec.name}.png"))
    log(text)
    log(f"done: {count} runs in {results['total_s']:.0f}s; outputs in {args.out}")
    return results


def base_parser(doc: str, datasets: list[str], name: str) -> argparse.ArgumentParser:
    """What every data-set benchmark's command line starts with: the data set, where its
    outputs go (default runs/NAME/DATASET) and the shared data directory."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("dataset", choices=datasets)
    p.add_argument("--out", help=f"stores, run directories and outputs (default "
                                 f"runs/{name}/DATASET)")
    p.add_argument("--data", default=SHARED_DATA, help="the shared data directory")
    return p


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = base_parser(__doc__, list(DATASETS), "personalization")
    p.add_argument("--methods", nargs="+", choices=[m.key for m in METHODS],
                   default=[m.key for m in METHODS])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2],
                   help="the first one tunes")
    p.add_argument("--lrs", nargs="+", type=float,
                   help="the client lr grid (default: the data set's)")
    p.add_argument("--local-epochs", type=int, default=5)
    p.add_argument("--first-value-only", nargs="+", default=[], metavar="METHOD",
                   help="tune only the first value of these methods' key hyper-parameter "
                        "(its default): for the slowest rows on a busy machine")
    p.add_argument("--rounds", type=int)
    p.add_argument("--clients-per-round", type=int)
    p.add_argument("--eval-every", type=int)
    p.add_argument("--eval-clients", type=int)
    p.add_argument("--backend", default="inline", choices=["inline", "ray"])
    p.add_argument("--figure", help="where the figure goes (default: in --out)")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--report-only", action="store_true",
                   help="train nothing: the table from the finished runs, rows without one "
                        "say so")
    p.add_argument("overrides", nargs="*", help="key=value applied to every run")
    args = p.parse_args(argv)
    for name, v in zip(("rounds", "clients_per_round", "eval_every", "eval_clients"),
                       DEFAULTS[args.dataset], strict=True):
        if getattr(args, name) is None:
            setattr(args, name, v)
    args.out = os.path.abspath(args.out or os.path.join("runs", "personalization",
                                                        args.dataset))
    args.only_seed0 = args.seeds == [0]
    return args


def main(argv: list[str] | None = None) -> int:
    import signal

    # SIGTERM (kill, a scheduler's stop) unwinds like Ctrl-C, so the run in progress
    # releases its run directory's lock and the next call resumes it from its checkpoint
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args = parse(argv)
    chosen = [m for m in METHODS if m.key in args.methods]
    benchmark(DATASETS[args.dataset], args, chosen)
    return 0


if __name__ == "__main__":
    sys.exit(main())
