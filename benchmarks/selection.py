"""Client selection and clustered FL: two studies, each a table, a JSON and figures.

``femnist``: who takes part in a round (``algorithm.selector``) on the real LEAF FEMNIST
sample (105 writers) on the simulated clock with fedray's default heterogeneous devices
(``clock.enabled``, docs/time.md): ``uniform``, ``power_of_choice`` and ``oort`` at their
defaults, the same rounds each, several seeds. It records per selector the simulated time
(and rounds) to a target federated accuracy, the final accuracy, the accuracy at the
simulated time the earliest run ends (all runs compared at one time budget), and the
fairness cost read from the participants tables (``participants/round_*.arrow``): the
share of writers ever invited, the most invitations of one writer, and the Gini
coefficient of the invitation counts. ``fedray report --x sim_time`` draws accuracy
against simulated time.

``ifca``: clustered FL (``algorithm.name=ifca``) on MNIST t10k split IID into clients,
with a known cluster structure: ``data.per_client.domains=K`` puts client c in domain
c % K and rotates all of a domain's images by one angle drawn per run seed. IFCA with the
true K against FedAvg: the final federated accuracy (each client evaluated with the model
it picks, IFCA; the global model, FedAvg), per domain, and the cluster recovery rate: the
share of clients whose IFCA cluster is their true domain under the best one-to-one
relabelling of the clusters (every permutation tried). The domain angles are drawn from
the seed, and some seeds draw near-equal angles (seed 0, K=2: 21 and 37 degrees), which
would make two domains one; by default the study takes the first seeds whose angles are
pairwise at least MIN_SEPARATION[K] degrees apart (on the circle) and prints them.

Each writes ``table.md``, ``results.json`` (every run's numbers) and its figures under
``--out``. Re-running a command reuses every finished run directory (an interrupted run
resumes from its checkpoint), so it can be stopped and continued at any time.
docs/selection.md has the protocol and the results.

    python benchmarks/selection.py femnist --out /tmp/sel/femnist   # 3 selectors x 3 seeds
    python benchmarks/selection.py ifca --out /tmp/sel/ifca         # K = 2 and 4, 3 seeds
    python benchmarks/selection.py all --out /tmp/sel               # both: OUT/femnist, OUT/ifca
    python benchmarks/selection.py femnist --selectors uniform oort --seeds 0 1
    python benchmarks/selection.py ifca --domains 4 --seeds 12 28 52

Runs use ``runtime.backend=inline`` with one worker (no Ray: on 2 cores the actors only add
start-up time).
"""

from __future__ import annotations

import argparse
import glob
import itertools
import json
import math
import os
import shutil
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))

import personalization as common  # noqa: E402  (benchmarks/ is not a package)

REPO, SHARED_DATA = common.REPO, common.SHARED_DATA

# ---------------------------------------------------------------------------------------
# The protocols: every run's config, spelled out
# ---------------------------------------------------------------------------------------

# Each selector at fedray's defaults (fedray/algorithms/selection.py), written out so that
# the runs' configs say what they ran; nothing was tuned.
SELECTORS: dict[str, dict[str, Any]] = {
    "uniform": {},
    "power_of_choice": {"candidates": 2.0, "probe_cost": 0.33},
    "oort": {"exploration": 0.9, "exploration_decay": 0.98, "exploration_min": 0.3,
             "cutoff": 0.95, "staleness": 0.1, "alpha": 2.0, "preferred_percentile": 30.0,
             "pacer_window": 20, "pacer_step_s": 10.0},
}
LABELS = {"uniform": "uniform", "power_of_choice": "power of choice (d = 2k)",
          "oort": "Oort"}

# Per study: rounds, clients per round, local epochs, client lr, eval every. FEMNIST: the
# MLP at lr 0.03 and 5 local epochs (lr 0.1 stalled at ~9 % in a 50-round trial; 0.03
# reached ~0.6 in 100 rounds); MNIST: 1 epoch at lr 0.1.
DEFAULTS = {"femnist": (100, 10, 5, 0.03, 2), "ifca": (60, 10, 1, 0.1, 5),
            # the smoke test's sizes (tests/test_benchmark_selection.py)
            "synthetic": (3, 4, 1, 0.1, 1)}
TARGET = 0.55  # FEMNIST: a federated accuracy every selector reached in the trials

ROTATION = 180.0  # data.per_client.rotation: angles uniform in [-180, 180] degrees
MIN_SEPARATION = {2: 90.0, 3: 75.0, 4: 60.0}  # degrees between two domains' angles
DEFAULT_CLIENTS = 60  # MNIST t10k in this many IID clients (about 133 train, 33 test each)
LAST_ROUNDS = 10  # recovery from the participants tables: clients trained in these rounds


def selection_job(args: argparse.Namespace, selector: str, seed: int) -> dict:
    """One FEMNIST (or smoke-test) run: the MLP, clients_per_round writers a round, the
    clock on with its default devices (log-normal compute and bandwidth, always online, no
    deadline), every writer evaluated on its own test split every eval_every rounds (the
    store has no central test set), the participants table written every round."""
    synthetic = args.dataset == "synthetic"
    job: dict[str, Any] = {
        "name": f"selection_{args.dataset}", "seed": seed, "rounds": args.rounds,
        "data": {"partition": "synthetic" if synthetic else common.femnist_store(args)},
        "model": {"name": "mlp"},
        "client": {"lr": args.lr, "batch_size": 20, "local_epochs": args.local_epochs},
        "sampling": {"clients_per_round": args.clients_per_round},
        "algorithm": {"name": "fedavg", "selector": selector},
        "clock": {"enabled": True},
        "eval": {"every": args.eval_every, "federated_clients": args.population,
                 "central": False},
        "runtime": {"backend": "inline", "num_workers": 1},
        "output": {"save_weights": False, "tensorboard": False, "participants": True}}
    if SELECTORS[selector]:
        job["algorithm"][selector] = dict(SELECTORS[selector])
    if synthetic:
        job["data"]["synthetic"] = {"num_clients": args.population, "min_examples": 20,
                                    "max_examples": 40, "test_fraction": 0.2}
    return job


def ifca_job(args: argparse.Namespace, method: str, k: int, seed: int) -> dict:
    """One MNIST run: K rotated domains (client c in domain c % K), the MLP, every client
    evaluated on its own (rotated) test split every eval_every rounds, with the model it
    picks (IFCA) or the global model (FedAvg). IFCA: K models, model averaging, its
    preset's server optimizer (sgd at lr 1, which it requires)."""
    job: dict[str, Any] = {
        "name": f"selection_ifca_k{k}", "seed": seed, "rounds": args.rounds,
        "data": {"partition": mnist_store(args),
                 "per_client": {"rotation": ROTATION, "domains": k}},
        "model": {"name": "mlp"},
        "client": {"lr": args.lr, "batch_size": 20, "local_epochs": args.local_epochs},
        "sampling": {"clients_per_round": args.clients_per_round},
        "algorithm": {"name": method},
        "eval": {"every": args.eval_every, "federated_clients": args.clients,
                 "central": False},
        "runtime": {"backend": "inline", "num_workers": 1},
        "output": {"save_weights": False, "tensorboard": False, "participants": True}}
    if method == "ifca":
        job["algorithm"]["ifca"] = {"clusters": k, "averaging": "model"}
    return job


# ---------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------

def mnist_store(args: argparse.Namespace) -> str:
    return os.path.join(args.out, "stores", f"mnist_iid{args.clients}")


def iid_clients(n: int, num_clients: int, seed: int) -> tuple[Any, Any]:
    """Each example's client and split: a seeded permutation cut into ``num_clients`` equal
    parts (sizes differ by at most one), the last 20 % of each part its own test split."""
    import numpy as np

    perm = np.random.default_rng(seed).permutation(n)
    owner = np.empty(n, dtype=np.int64)
    split = np.empty(n, dtype=object)
    for c, part in enumerate(np.array_split(perm, num_clients)):
        owner[part] = c
        n_test = max(1, round(0.2 * len(part)))
        split[part[:-n_test]] = "train"
        split[part[-n_test:]] = "test"
    return owner, split


def prepare_mnist(args: argparse.Namespace) -> None:
    """MNIST t10k (10,000 real images) in ``--clients`` IID clients, each with its own test
    split, written once under --out. User names are zero-padded so that the natural
    partitioner's client index (names sorted) is the user number."""
    out = mnist_store(args)
    if os.path.exists(os.path.join(out, "manifest.json")):
        return
    from fedray.data import from_arrays
    from fedray.data.sources.mnist import load_mnist

    print(f"building {out} from {args.data}/mnist-t10k", flush=True)
    ds = load_mnist(os.path.join(args.data, "mnist-t10k"))
    owner, split = iid_clients(len(ds.train.y), args.clients, seed=0)
    names = [f"u{c:05d}" for c in owner]
    (from_arrays(ds.train.x, ds.train.y, user_ids=names, split=split.astype(str))
     .partition("natural", seed=0).write_store(out))


def domain_angles(seed: int, k: int, rotation: float = ROTATION) -> list[float]:
    """The angle (degrees) each of the K domains draws in a run with this seed: what the
    worker applies (fedray.data.transforms.per_client.draw_shift, client d is in domain d)."""
    from fedray.data.transforms.per_client import PerClient, draw_shift

    spec = PerClient(rotation=rotation, domains=k)
    return [draw_shift(spec, seed, d).angle for d in range(k)]


def separation(angles: list[float]) -> float:
    """The smallest angle between two domains' rotations, on the circle (degrees)."""
    if len(angles) < 2:
        return 360.0
    return min(min(abs(a - b) % 360.0, 360.0 - abs(a - b) % 360.0)
               for a, b in itertools.combinations(angles, 2))


def pick_seeds(k: int, count: int, min_sep: float, rotation: float = ROTATION) -> list[int]:
    """The first ``count`` seeds >= 0 whose K domain angles are pairwise >= min_sep apart."""
    out, s = [], 0
    while len(out) < count:
        if separation(domain_angles(s, k, rotation)) >= min_sep:
            out.append(s)
        s += 1
    return out


# ---------------------------------------------------------------------------------------
# Reading a run
# ---------------------------------------------------------------------------------------

def read_tables(run_dir: str, sub: str) -> dict[int, Any]:
    """A run's per-round tables of one kind (``participants`` or ``client_eval``), by
    round."""
    from fedray.tracking.client_eval import read_table

    out = {}
    for path in sorted(glob.glob(os.path.join(run_dir, sub, "round_*.arrow"))):
        r = int(os.path.basename(path)[len("round_"):-len(".arrow")])
        with open(path, "rb") as f:
            out[r] = read_table(f.read())
    return out


def population(run_dir: str) -> int:
    with open(os.path.join(run_dir, "summary.json")) as f:
        return int(json.load(f)["population"])


def invitation_counts(run_dir: str) -> tuple[list[int], list[int]]:
    """How often each client (0..population-1) was invited over the run, and how often its
    update arrived, from the participants tables."""
    import numpy as np

    n = population(run_dir)
    invited, arrived = np.zeros(n, np.int64), np.zeros(n, np.int64)
    for t in read_tables(run_dir, "participants").values():
        ids = t.column("client_id").to_numpy()
        invited[ids] += 1
        arrived[ids[t.column("arrived").to_numpy(zero_copy_only=False)]] += 1
    return invited.tolist(), arrived.tolist()


def gini(counts: Any) -> float:
    """Gini coefficient of non-negative counts: mean |x_i - x_j| over all ordered pairs,
    over twice the mean (0: everyone equal; (n - 1) / n: one client has everything)."""
    import numpy as np

    x = np.sort(np.asarray(counts, dtype=np.float64))
    n, total = len(x), x.sum()
    if n == 0 or total == 0:
        return 0.0
    # sum_ij |x_i - x_j| = 2 sum_i (2 i - n + 1) x_(i), i = 0..n-1 over the sorted values
    return float(2.0 * np.sum((2 * np.arange(n) - n + 1) * x) / (2.0 * n * total))


def invitation_stats(invited: list[int]) -> dict[str, float]:
    import numpy as np

    x = np.asarray(invited)
    return {"ever_invited": float((x > 0).mean()), "max_invited": float(x.max()),
            "gini": gini(x)}


def summarize_selection(run_dir: str) -> dict:
    """A finished selection run: the federated accuracy curve against rounds and simulated
    time, its final numbers and the invitation counts."""
    from fedray.state.run_dir import read_metrics

    rows = read_metrics(run_dir)
    evals = [r for r in rows if "fed_test_accuracy" in r]
    invited, arrived = invitation_counts(run_dir)
    last = evals[-1]
    return {"curve": [[r["round"], r["sim_time_s"], r["fed_test_accuracy"]] for r in evals],
            "accuracy": last["fed_test_accuracy"],
            "clients_mean": last["clients_accuracy_mean"],
            "clients_p10": last["clients_accuracy_p10"],
            "rounds": rows[-1]["round"], "sim_time_s": rows[-1]["sim_time_s"],
            "sim_round_s": sum(r["sim_round_s"] for r in rows) / len(rows),
            "train_s_per_round": sum(r["train_s"] for r in rows) / len(rows),
            "invited": invited, "arrived": arrived, **invitation_stats(invited)}


def to_target(curve: list[list[float]], target: float) -> tuple[float | None, float | None]:
    """(round, simulated seconds) of the first evaluation at or above target, or Nones:
    what ``fedray report --target`` reports per run."""
    for r, t, acc in curve:
        if acc >= target:
            return r, t
    return None, None


def at_time(curve: list[list[float]], budget: float) -> float | None:
    """The last accuracy evaluated at or before ``budget`` simulated seconds (None: none)."""
    seen = [acc for _, t, acc in curve if t <= budget]
    return seen[-1] if seen else None


def recovery(clusters: Any, truth: Any, k: int) -> float:
    """The share of clients whose cluster is their true domain under the best one-to-one
    relabelling of the K clusters (every permutation tried); NaN clusters are left out."""
    import numpy as np

    c = np.asarray(clusters, dtype=np.float64)
    keep = np.isfinite(c)
    c, t = c[keep].astype(np.int64), np.asarray(truth, dtype=np.int64)[keep]
    if not len(c):
        return float("nan")
    return max(float(np.mean(np.asarray(p)[c] == t))
               for p in itertools.permutations(range(k)))


def summarize_ifca(run_dir: str, k: int) -> dict:
    """A finished MNIST run: federated accuracy (pooled and per client) over rounds, the
    final per-domain client accuracy and, for IFCA, the cluster each client picks at every
    evaluation and its recovery rate, and the recovery among the clients trained in the
    last LAST_ROUNDS rounds (their latest round's cluster, participants tables)."""
    import numpy as np

    from fedray.state.run_dir import read_metrics

    rows = read_metrics(run_dir)
    evals = [r for r in rows if "clients_accuracy_mean" in r]
    last = evals[-1]
    tables = read_tables(run_dir, "client_eval")
    final = tables[max(tables)]
    cid = final.column("client_id").to_numpy()
    acc = final.column("accuracy").to_numpy()
    domain = cid % k
    out: dict[str, Any] = {
        "curve": [[r["round"], r["clients_accuracy_mean"]] for r in evals],
        "clients_mean": last["clients_accuracy_mean"],
        "clients_p10": last["clients_accuracy_p10"],
        "accuracy": last["fed_test_accuracy"],
        "domain_accuracy": [float(acc[domain == d].mean()) for d in range(k)],
        "train_s_per_round": sum(r["train_s"] for r in rows) / len(rows),
        "rounds": rows[-1]["round"]}
    if "global_accuracy" in final.column_names:  # IFCA: model 0 for every client
        out["global_mean"] = last["clients_global_accuracy_mean"]
    if "cluster" not in final.column_names:
        return out
    out["clusters"] = final.column("cluster").to_numpy().tolist()
    out["recovery"] = recovery(out["clusters"], domain, k)
    out["recovery_curve"] = [
        [r, recovery(t.column("cluster").to_numpy(), t.column("client_id").to_numpy() % k, k)]
        for r, t in sorted(tables.items())]
    used = np.asarray(out["clusters"])
    out["clusters_used"] = int(len(np.unique(used[np.isfinite(used)])))
    latest: dict[int, float] = {}
    parts = read_tables(run_dir, "participants")
    for r in sorted(parts)[-LAST_ROUNDS:]:
        t = parts[r]
        for c, j in zip(t.column("client_id").to_pylist(), t.column("cluster").to_pylist(),
                        strict=True):
            if j is not None and math.isfinite(j):
                latest[c] = j
    ids = np.array(sorted(latest), dtype=np.int64)
    out["trained_last"] = len(ids)
    out["recovery_trained"] = recovery([latest[c] for c in ids], ids % k, k)
    return out


# ---------------------------------------------------------------------------------------
# Statistics and tables
# ---------------------------------------------------------------------------------------

def mean_std(values: list[float]) -> tuple[float, float] | None:
    import numpy as np

    v = [x for x in values if x is not None and math.isfinite(x)]
    if not v:
        return None
    a = np.asarray(v, float)
    return float(a.mean()), float(a.std())


def cell(values: list[float], digits: int = 3) -> str:
    ms = mean_std(values)
    return "–" if ms is None else f"{ms[0]:.{digits}f} ± {ms[1]:.{digits}f}"


def log_fn(args: argparse.Namespace):
    return (lambda s: print(s, flush=True)) if not args.quiet else (lambda s: None)


def progress(r: dict, t0: float) -> str:
    """A run's progress line: its main numbers and its wall time (or that it was reused)."""
    if "missing" in r:
        return "not run"
    if "failed" in r:
        return f"failed: {r['failed']}"
    how = "reused" if r.get("reused") else f"{time.perf_counter() - t0:.0f}s wall"
    return ", ".join(
        [f"accuracy {r['accuracy']:.3f}"]
        + ([f"client mean {r['clients_mean']:.3f}"] if "clients_mean" in r else [])
        + ([f"{r['sim_time_s']:.0f} simulated s"] if "sim_time_s" in r else [])
        + ([f"recovery {r['recovery']:.2f}"] if "recovery" in r else [])) + f" ({how})"


def fedray_report(run_dirs: list[str], out: str, target: float, title: str,
                  log, quiet: bool = False) -> dict | None:
    """``fedray report RUN... --x sim_time --group-by algorithm.selector --metric
    fed_test_accuracy --target T`` into ``out`` (replaced: the report refuses a directory
    that already holds one); its report.json."""
    from fedray.cli import main as cli

    shutil.rmtree(out, ignore_errors=True)
    argv = ["report", *run_dirs, "--out", out, "--x", "sim_time", "--group-by",
            "algorithm.selector", "--metric", "fed_test_accuracy", "--target", f"{target:g}",
            "--title", title]
    log("fedray " + " ".join(os.path.relpath(a) if os.path.exists(a) else a for a in argv))
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO() if quiet else sys.stdout):
        rc = cli(argv)
    if rc != 0:
        log("fedray report failed; no time figure")
        return None
    with open(os.path.join(out, "report.json")) as f:
        return json.load(f)


def selection_markdown(args: argparse.Namespace, rows: list[dict], budget: float | None) -> str:
    b = f"{budget:.0f}" if budget is not None else "–"
    lines = [
        f"Data set `{args.dataset}`: {args.rounds} rounds, {args.clients_per_round} clients "
        f"a round of {args.population}, MLP, {args.local_epochs} local epochs at lr "
        f"{args.lr}, batch 20; the simulated clock with its default devices; federated "
        f"accuracy over every client's test split every {args.eval_every} rounds; seeds "
        f"{', '.join(map(str, args.seeds))}; mean ± std over seeds; "
        f"`python benchmarks/selection.py {' '.join(sys.argv[1:])}`".rstrip(), "",
        f"| selector | runs | sim time to ≥ {args.target:g} (s) | rounds to ≥ {args.target:g} "
        f"| final accuracy | accuracy at {b} s | final client p10 | final sim time (s) "
        "| sim s/round |",
        "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        runs = row["runs"]
        if not runs:
            lines.append(f"| {row['label']} | 0 | | | | | | | |")
            continue
        reached = [r for r in runs if r["time_to_target"] is not None]
        lines.append(
            f"| {row['label']} | {len(runs)} | "
            f"{cell([r['time_to_target'] for r in reached], 0)} ({len(reached)}/{len(runs)}) | "
            f"{cell([r['rounds_to_target'] for r in reached], 1)} | "
            f"{cell([r['accuracy'] for r in runs])} | "
            f"{cell([r['at_budget'] for r in runs])} | "
            f"{cell([r['clients_p10'] for r in runs])} | "
            f"{cell([r['sim_time_s'] for r in runs], 0)} | "
            f"{cell([r['sim_round_s'] for r in runs], 1)} |")
    expected = args.rounds * args.clients_per_round / args.population
    lines += ["", f"Invitations over the run (participants tables; {args.population} clients, "
              f"{args.rounds * args.clients_per_round} invitations, {expected:.1f} per client "
              "on average):", "",
              "| selector | share ever invited | max invitations of one client | Gini of "
              "invitation counts |", "|---|---|---|---|"]
    for row in rows:
        runs = row["runs"]
        if runs:
            lines.append(f"| {row['label']} | {cell([r['ever_invited'] for r in runs])} | "
                         f"{cell([r['max_invited'] for r in runs], 1)} | "
                         f"{cell([r['gini'] for r in runs])} |")
    return "\n".join(lines) + "\n"


def invitation_figure(args: argparse.Namespace, rows: list[dict], path: str) -> None:
    """Each selector's invitation counts, clients sorted from most to least invited (mean
    over seeds of the sorted counts)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for row, style in zip(rows, ("-", "--", "-.", ":"), strict=False):
        if not row["runs"]:
            continue
        counts = np.mean([np.sort(r["invited"])[::-1] for r in row["runs"]], axis=0)
        ax.plot(np.arange(1, len(counts) + 1), counts, style, label=row["label"])
    ax.axhline(args.rounds * args.clients_per_round / args.population, color="grey", lw=0.8,
               label="the mean, any selector")
    ax.set_xlabel("clients, most invited first")
    ax.set_ylabel(f"invitations in {args.rounds} rounds")
    ax.set_title(f"{args.dataset}: invitations per client (mean over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_selection(args: argparse.Namespace) -> dict:
    """The FEMNIST (or smoke-test) selection study: every (selector, seed), the report
    against simulated time, the table, the JSON and the figures."""
    log = log_fn(args)
    t_start = time.perf_counter()
    if args.dataset == "femnist":
        common.prepare_femnist(args)
        with open(os.path.join(common.femnist_store(args), "manifest.json")) as f:
            args.population = int(json.load(f)["num_clients"])  # every writer evaluated
    proto = (f"R{args.rounds}_K{args.clients_per_round}_L{args.local_epochs}_lr{args.lr}"
             f"_E{args.eval_every}")
    total, count = len(args.selectors) * len(args.seeds), 0
    results: dict[str, Any] = {"study": args.dataset, "argv": sys.argv[1:],
                               "target": args.target, "selectors": {}, "runs": {}}
    for sel in args.selectors:
        for seed in args.seeds:
            count += 1
            run_dir = os.path.join(args.out, "runs", proto, sel, f"s{seed}")
            t0 = time.perf_counter()
            r = common.run_one(selection_job(args, sel, seed), [], run_dir, log,
                               args.report_only, summarize_selection)
            results["runs"][os.path.relpath(run_dir, args.out)] = {
                **r, "selector": sel, "seed": seed, "dir": run_dir}
            log(f"[{count}/{total}] {args.dataset} {sel} seed {seed}: "
                + progress(r, t0))
    done = [r for r in results["runs"].values() if "curve" in r]
    budget = min((r["sim_time_s"] for r in done), default=None)
    results["budget_s"] = budget
    for r in done:
        r["rounds_to_target"], r["time_to_target"] = to_target(r["curve"], args.target)
        r["at_budget"] = at_time(r["curve"], budget)
    rows = []
    for sel in args.selectors:
        runs = [r for r in done if r["selector"] == sel]
        rows.append({"key": sel, "label": LABELS[sel], "runs": runs})
        results["selectors"][sel] = {
            k: mean_std([r[k] for r in runs]) for k in (
                "time_to_target", "rounds_to_target", "accuracy", "at_budget", "clients_mean",
                "clients_p10", "sim_time_s", "sim_round_s", "ever_invited", "max_invited",
                "gini")} | {"runs": len(runs), "reached": sum(
                    r["time_to_target"] is not None for r in runs)}
    os.makedirs(args.out, exist_ok=True)
    if done:
        rep = fedray_report([r["dir"] for r in done], os.path.join(args.out, "report"),
                            args.target,
                            f"{args.dataset}: federated accuracy against simulated time", log,
                            args.quiet)
        if rep is not None:
            # the report's time to target is the table's (the same definition): say so if not
            for g in rep["groups"]:
                mine = results["selectors"].get(g["algorithm.selector"], {})
                theirs = g.get("sim_time_to_target_s_mean")
                ok = mine.get("time_to_target") is None and theirs is None or (
                    mine.get("time_to_target") is not None and theirs is not None
                    and abs(mine["time_to_target"][0] - theirs) < 1e-6 * max(1.0, theirs))
                if not ok:
                    log(f"warning: fedray report's time to target for "
                        f"{g['algorithm.selector']} is {theirs}, this script's "
                        f"{mine.get('time_to_target')}")
            src = os.path.join(args.out, "report", "fed_test_accuracy.png")
            if os.path.exists(src):
                shutil.copy(src, os.path.join(args.out, f"selection_{args.dataset}_time.png"))
        invitation_figure(args, rows, os.path.join(
            args.out, f"selection_{args.dataset}_invitations.png"))
    results["total_s"] = time.perf_counter() - t_start
    text = selection_markdown(args, rows, budget)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=2, default=float)
    log(text)
    log(f"done: {count} runs in {results['total_s']:.0f}s; outputs in {args.out}")
    return results


# ---------------------------------------------------------------------------------------
# The IFCA study
# ---------------------------------------------------------------------------------------

IFCA_METHODS = {"fedavg": "FedAvg (global model)", "ifca": "IFCA (each client's cluster)"}


def ifca_markdown(args: argparse.Namespace, blocks: list[dict]) -> str:
    lines = [f"MNIST t10k in {args.clients} IID clients (80/20 train/test each), K rotated "
             f"domains (`data.per_client.rotation={ROTATION:g}`, `domains=K`: client c in "
             f"domain c % K), MLP, {args.rounds} rounds of {args.clients_per_round} clients, "
             f"{args.local_epochs} local epoch(s) at lr {args.lr}, batch 20; every client "
             f"evaluated on its own rotated test split; mean ± std over seeds; "
             f"`python benchmarks/selection.py {' '.join(sys.argv[1:])}`".rstrip()]
    for b in blocks:
        k = b["k"]
        angles = "; ".join(f"seed {s}: " + ", ".join(f"{a:.0f}" for a in b["angles"][s])
                           + f" (min {separation(b['angles'][s]):.0f})" for s in b["seeds"])
        lines += ["", f"K = {k} (domain angles in degrees, {angles}):", "",
                  "| method | runs | client mean accuracy | pooled accuracy | worst domain "
                  "| model 0 for every client | recovery, all clients (final eval) "
                  f"| recovery, clients trained in the last {LAST_ROUNDS} rounds "
                  "| clusters used |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for m, label in IFCA_METHODS.items():
            runs = b["runs"][m]
            if not runs:
                lines.append(f"| {label} | 0 | | | | | | | |")
                continue
            ifca = m == "ifca"
            lines.append(
                f"| {label} | {len(runs)} | {cell([r['clients_mean'] for r in runs])} | "
                f"{cell([r['accuracy'] for r in runs])} | "
                f"{cell([min(r['domain_accuracy']) for r in runs])} | "
                + (f"{cell([r['global_mean'] for r in runs])} | "
                   f"{cell([r['recovery'] for r in runs])} | "
                   f"{cell([r['recovery_trained'] for r in runs])} "
                   f"({mean_std([r['trained_last'] for r in runs])[0]:.0f} clients) | "
                   + ", ".join(str(r["clusters_used"]) for r in runs) + " |"
                   if ifca else "– | – | – | – |"))
    return "\n".join(lines) + "\n"


def ifca_figure(args: argparse.Namespace, blocks: list[dict], path: str) -> None:
    """Per K: client mean accuracy over rounds (IFCA, FedAvg; mean over seeds, min-max band)
    and IFCA's recovery rate over rounds (one line per seed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    blocks = [b for b in blocks if any(b["runs"].values())]
    if not blocks:
        return
    fig, axes = plt.subplots(2, len(blocks), figsize=(4.4 * len(blocks), 6.4), squeeze=False)
    for col, b in enumerate(blocks):
        ax, ax2 = axes[0][col], axes[1][col]
        for m, label in IFCA_METHODS.items():
            runs = b["runs"][m]
            if not runs:
                continue
            n = min(len(r["curve"]) for r in runs)
            x = [p[0] for p in runs[0]["curve"][:n]]
            y = np.array([[p[1] for p in r["curve"][:n]] for r in runs])
            (line,) = ax.plot(x, y.mean(0), marker=".", label=label)
            ax.fill_between(x, y.min(0), y.max(0), color=line.get_color(), alpha=0.2)
        ax.set_title(f"K = {b['k']} rotated domains")
        ax.set_xlabel("round")
        ax.set_ylabel("client mean accuracy")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
        # seeds often share a curve (1.0, or 0.75 when two domains share a cluster): each
        # its own line style and marker, its final value in the legend
        for r, style, marker in zip(b["runs"]["ifca"], ("-", "--", ":", "-."), "osv^D",
                                    strict=False):
            c = r["recovery_curve"]
            ax2.plot([p[0] for p in c], [p[1] for p in c], style, marker=marker,
                     fillstyle="none", label=f"seed {r['seed']} (final {c[-1][1]:.2f})")
        ax2.axhline(1.0 / b["k"], color="grey", lw=0.8, ls="--", label="1/K")
        ax2.set_xlabel("round")
        ax2.set_ylabel("IFCA cluster recovery (all clients)")
        ax2.set_ylim(0, 1.05)
        ax2.grid(alpha=0.3)
        ax2.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def run_ifca(args: argparse.Namespace) -> dict:
    """The IFCA study: for each K, the seeds (given, or the first with separated angles),
    IFCA and FedAvg on each, the table, the JSON and the figure."""
    log = log_fn(args)
    t_start = time.perf_counter()
    prepare_mnist(args)
    proto = (f"N{args.clients}_R{args.rounds}_K{args.clients_per_round}_L{args.local_epochs}"
             f"_lr{args.lr}_E{args.eval_every}")
    plan = {k: args.seeds or pick_seeds(k, args.num_seeds, MIN_SEPARATION.get(k, 0.0))
            for k in args.domains}
    total = sum(len(s) * len(IFCA_METHODS) for s in plan.values())
    count = 0
    results: dict[str, Any] = {"study": "ifca", "argv": sys.argv[1:], "blocks": []}
    for k, seeds in plan.items():
        angles = {s: domain_angles(s, k) for s in seeds}
        for s in seeds:
            sep = separation(angles[s])
            log(f"K={k} seed {s}: domain angles " + ", ".join(f"{a:.1f}" for a in angles[s])
                + f" degrees, closest two {sep:.1f} apart"
                + (f" (below {MIN_SEPARATION[k]:g}: two domains look alike)"
                   if sep < MIN_SEPARATION.get(k, 0.0) else ""))
        block: dict[str, Any] = {"k": k, "seeds": seeds, "angles": angles,
                                 "runs": {m: [] for m in IFCA_METHODS}}
        for m in IFCA_METHODS:
            for s in seeds:
                count += 1
                run_dir = os.path.join(args.out, "runs", proto, f"D{k}_rot{ROTATION:g}", m,
                                       f"s{s}")
                t0 = time.perf_counter()
                r = common.run_one(ifca_job(args, m, k, s), [], run_dir, log,
                                   args.report_only,
                                   lambda d, k=k: summarize_ifca(d, k))
                log(f"[{count}/{total}] ifca K={k} {m} seed {s}: "
                    + progress(r, t0))
                if "curve" in r:
                    block["runs"][m].append({**r, "seed": s, "dir": run_dir})
        results["blocks"].append(block)
    results["total_s"] = time.perf_counter() - t_start
    os.makedirs(args.out, exist_ok=True)
    text = ifca_markdown(args, results["blocks"])
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=2, default=float)
    ifca_figure(args, results["blocks"], os.path.join(args.out, "selection_ifca.png"))
    log(text)
    log(f"done: {count} runs in {results['total_s']:.0f}s; outputs in {args.out}")
    return results


# ---------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------

STUDIES = ["femnist", "ifca", "all", "synthetic"]


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = common.base_parser(__doc__, STUDIES, "selection")
    p.add_argument("--seeds", nargs="+", type=int,
                   help="default 0 1 2 (femnist); ifca: the first --num-seeds seeds with "
                        "separated domain angles")
    p.add_argument("--num-seeds", type=int, default=3, help="ifca: how many seeds to pick")
    p.add_argument("--selectors", nargs="+", choices=list(SELECTORS), default=list(SELECTORS))
    p.add_argument("--target", type=float, default=TARGET,
                   help="the federated accuracy whose simulated time is reported")
    p.add_argument("--domains", nargs="+", type=int, default=[2, 4],
                   help="ifca: the numbers of rotated domains K, one block each")
    p.add_argument("--clients", type=int, default=DEFAULT_CLIENTS,
                   help="ifca: MNIST t10k in this many IID clients")
    p.add_argument("--rounds", type=int)
    p.add_argument("--clients-per-round", type=int)
    p.add_argument("--local-epochs", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--eval-every", type=int)
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--report-only", action="store_true",
                   help="train nothing: the tables from the finished runs")
    args = p.parse_args(argv)
    if any(k < 2 for k in args.domains):
        p.error("--domains: K must be >= 2 (IFCA needs 2 clusters or more)")
    args.given = {k: getattr(args, k) for k in ("rounds", "clients_per_round", "local_epochs",
                                                 "lr", "eval_every")}
    args.root = os.path.abspath(args.out or os.path.join("runs", "selection"))
    return args


def for_study(args: argparse.Namespace, study: str, nested: bool) -> argparse.Namespace:
    """The arguments of one study: its sizes (the defaults, or what was given) and its
    output directory (``--out`` itself, or ``--out/STUDY`` for ``all`` and no --out)."""
    a = argparse.Namespace(**vars(args))
    a.dataset = study
    for (name, given), default in zip(a.given.items(), DEFAULTS[study], strict=True):
        setattr(a, name, default if given is None else given)
    a.out = os.path.join(args.root, study) if nested else args.root
    if study != "ifca" and a.seeds is None:
        a.seeds = [0, 1, 2]
    a.population = 20  # the smoke test's writers (FEMNIST: read from its store)
    return a


def main(argv: list[str] | None = None) -> int:
    import signal

    # SIGTERM unwinds like Ctrl-C: the run in progress keeps its checkpoint for the next call
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args = parse(argv)
    studies = ["femnist", "ifca"] if args.dataset == "all" else [args.dataset]
    nested = args.dataset == "all" or args.out is None
    for study in studies:
        a = for_study(args, study, nested)
        if study == "ifca":
            run_ifca(a)
        else:
            run_selection(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
