"""Robust aggregation under attack: every attack against FedAvg and every defense, side by side.

For one data set, each (attack, defense, seed) is one run with 20 % of the population
malicious (``adversary.fraction``); it records the final clean test accuracy and, for the
backdoors, the attack's success on the triggered test inputs of the other classes
(``test_attack_success``), and the defense's mean precision and recall over the rounds.
It writes ``table.md`` (mean ± std over seeds), ``results.json`` (every run's numbers) and
``robustness_<data set>.png`` (accuracy over rounds under the attack that hurts FedAvg
most, one line per defense) under ``--out``. Re-running the command reuses every finished
run directory (an interrupted one resumes from its checkpoint). docs/robustness.md has the
protocol and the results.

    python benchmarks/robustness.py femnist            # LEAF FEMNIST sample, 105 writers
    python benchmarks/robustness.py mnist_dirichlet    # MNIST t10k, 100 clients, Dirichlet 0.5
    python benchmarks/robustness.py femnist --attacks none sign_flip --defenses fedavg median

Runs use ``runtime.backend=inline`` with one worker (no Ray: on 2 cores the actors only add
start-up time).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))

import personalization as common  # noqa: E402  (benchmarks/ is not a package)

REPO, SHARED_DATA = common.REPO, common.SHARED_DATA
FRACTION = 0.2  # the malicious share of the population


@dataclass(frozen=True)
class Attack:
    key: str
    label: str
    overrides: tuple[str, ...]  # adversary.* keys (empty: no attack)
    backdoor: bool = False  # has a success rate on triggered inputs
    omniscient: bool = False  # rewrites rows on the driver: not with an update stage


@dataclass(frozen=True)
class Defense:
    key: str
    label: str
    overrides: tuple[str, ...]  # algorithm.* keys


def _adv(*attacks: str, **params: Any) -> tuple[str, ...]:
    return (f"adversary.fraction={FRACTION}", f"adversary.attacks=[{','.join(attacks)}]",
            *(f"adversary.{k.replace('__', '.')}={v}" for k, v in params.items()))


# fedray's choices of each attack's strength (docs/robustness.md): none is a value taken
# from the papers the attacks come from
ATTACKS = [
    Attack("none", "no attack", ()),
    Attack("label_flip", "label flip, all to 0", _adv("label_flip")),
    Attack("label_flip_random", "label flip, random", _adv(
        "label_flip", label_flip__mode="random")),
    Attack("backdoor", "backdoor (pixel trigger, 50 % poisoned)", _adv("backdoor"),
           backdoor=True),
    Attack("model_replacement", "backdoor + boost 5 (model replacement)", _adv(
        "backdoor", "scaling", scaling__boost=5), backdoor=True),
    Attack("sign_flip", "sign flip x4", _adv("sign_flip", sign_flip__scale=4)),
    Attack("scaling", "scaling x10", _adv("scaling")),
    Attack("noise", "Gaussian noise (std 0.01)", _adv("noise", noise__std=0.01)),
    Attack("alie", "ALIE (z from n, m)", _adv("alie"), omniscient=True),
    Attack("ipm", "IPM (epsilon 0.5)", _adv("ipm", ipm__epsilon=0.5), omniscient=True),
]
F = 4  # the attackers a round is expected to hold: 20 % of 20
DEFENSES = [
    Defense("fedavg", "FedAvg (mean)", ("algorithm.aggregator=mean",)),
    Defense("median", "coordinate median", ("algorithm.aggregator=median",)),
    Defense("trimmed_mean", "trimmed mean (beta 0.2)", (
        "algorithm.aggregator=trimmed_mean", "algorithm.trimmed_mean.beta=0.2")),
    Defense("krum", f"Krum (f {F})", ("algorithm.aggregator=krum", f"algorithm.krum.f={F}")),
    Defense("multi_krum", f"Multi-Krum (f {F})", (
        "algorithm.aggregator=multi_krum", f"algorithm.multi_krum.f={F}")),
    Defense("bulyan", f"Bulyan (f {F})", ("algorithm.aggregator=bulyan",
                                          f"algorithm.bulyan.f={F}")),
    # tau and the norm bound near the honest updates' norms on FEMNIST (0.25-0.6 from
    # round 1 to 20, p10-p90: docs/robustness.md)
    Defense("centered_clip", "centered clipping (tau 0.5)", (
        "algorithm.aggregator=centered_clip", "algorithm.centered_clip.tau=0.5")),
    # the root data set: two clients of the store, trained every round (sampling.always)
    Defense("fltrust", "FLTrust (root: clients 0, 1)", (
        "algorithm.aggregator=fltrust", "algorithm.fltrust.root_clients=[0,1]",
        "sampling.always=[0,1]")),
    Defense("norm_bound", "norm bound 0.5 + mean", (
        "algorithm.aggregator=mean", "algorithm.stages=[norm_bound]",
        "algorithm.norm_bound.max_norm=0.5")),
]


def femnist_job(args: argparse.Namespace) -> dict:
    return base_job(args, common.femnist_store(args))


def mnist_store(args: argparse.Namespace) -> str:
    return os.path.join(args.out, "stores", "mnist_dir05")


def prepare_mnist(args: argparse.Namespace) -> None:
    """MNIST t10k in 100 clients, label shares ~ Dirichlet(0.5) (partitions/dirichlet.yaml),
    20 % held out as the central test set; built once under --out."""
    out = mnist_store(args)
    if os.path.exists(os.path.join(out, "manifest.json")):
        return
    from fedray.data.recipe import build

    print(f"building {out} from {args.data}/mnist-t10k", flush=True)
    build(os.path.join(REPO, "partitions", "dirichlet.yaml"),
          [f"source.path={os.path.join(args.data, 'mnist-t10k')}", "test_fraction=0.2",
           f"out={out}"])


def base_job(args: argparse.Namespace, partition: str) -> dict:
    return {"name": f"robustness_{args.dataset}", "seed": 0, "rounds": args.rounds,
            "data": {"partition": partition}, "model": {"name": "mlp"},
            "client": {"lr": args.lr, "batch_size": 20, "local_epochs": args.local_epochs},
            "sampling": {"clients_per_round": args.clients_per_round},
            "eval": {"every": args.eval_every},
            "runtime": {"backend": "inline", "num_workers": 1},
            "output": {"save_weights": False, "tensorboard": False}}


DATASETS = {"femnist": (femnist_job, common.prepare_femnist),
            "mnist_dirichlet": (lambda a: base_job(a, mnist_store(a)), prepare_mnist),
            # the test's smoke data (tests/test_benchmark_robustness.py); not a benchmark
            "synthetic": (lambda a: base_job(a, "synthetic") | {
                "data": {"synthetic": {"num_clients": 30, "min_examples": 20,
                                       "max_examples": 30}}}, lambda a: None)}


def summarize(run_dir: str) -> dict:
    """A finished run's numbers: the final clean accuracy and attack success, the curve of
    accuracy over rounds, and the defense's precision and recall averaged over the rounds
    that define them."""
    from fedray.state.run_dir import read_metrics

    rows = read_metrics(run_dir)
    evals = [r for r in rows if "test_accuracy" in r]
    out: dict[str, Any] = {"accuracy": evals[-1]["test_accuracy"],
                           "curve": [[r["round"], r["test_accuracy"]] for r in evals],
                           "train_s_per_round": sum(r["train_s"] for r in rows) / len(rows)}
    if "test_attack_success" in evals[-1]:
        out["attack_success"] = evals[-1]["test_attack_success"]
    for key in ("defense_precision", "defense_recall"):
        v = [r[key] for r in rows if key in r]
        if v:
            out[key] = sum(v) / len(v)
    return out


def mean_std(values: list[float]) -> tuple[float, float]:
    import numpy as np

    a = np.asarray(values, float)
    return float(a.mean()), float(a.std())


NOT_WITH_STAGES = ("an omniscient attack replaces updates on the driver, after the update "
                   "stages ran on the workers, so a stage cannot defend against it (refused)")


def cell(runs: list[dict], key: str) -> str:
    if runs and all("skipped" in r for r in runs):
        return "n/a"
    v = [r[key] for r in runs if key in r and r[key] is not None and math.isfinite(r[key])]
    if not v:
        return "–"
    mu, sd = mean_std(v)
    return f"{mu:.3f} ± {sd:.3f}"


def markdown(args: argparse.Namespace, grid: dict, attacks: list[Attack],
             defenses: list[Defense]) -> str:
    head = "| attack | " + " | ".join(d.label for d in defenses) + " |"
    rule = "|---" * (len(defenses) + 1) + "|"
    lines = [f"Data set `{args.dataset}`: {args.rounds} rounds, {args.clients_per_round} "
             f"clients a round, {FRACTION:.0%} of the population malicious, MLP, "
             f"{args.local_epochs} local epochs "
             f"at lr {args.lr}; seeds {', '.join(map(str, args.seeds))}; "
             f"`python benchmarks/robustness.py {' '.join(sys.argv[1:])}`", "",
             "Final clean test accuracy (mean ± std over seeds):", "", head, rule]
    for a in attacks:
        lines.append(f"| {a.label} | " + " | ".join(
            cell(grid[a.key][d.key], "accuracy") for d in defenses) + " |")
    bd = [a for a in attacks if a.backdoor]
    if bd:
        lines += ["", "Backdoor success (triggered test inputs of the other classes taken for "
                  "the target; lower is better):", "", head, rule]
        for a in bd:
            lines.append(f"| {a.label} | " + " | ".join(
                cell(grid[a.key][d.key], "attack_success") for d in defenses) + " |")
    if any(a.omniscient for a in attacks) and any(
            any(o.startswith("algorithm.stages=") for o in d.overrides) for d in defenses):
        lines += ["", f"n/a: {NOT_WITH_STAGES}."]
    lines += ["", "Defense precision / recall of the malicious clients (mean over rounds and "
              "seeds; – where the defense flags no one):", "", head, rule]
    for a in attacks:
        if a.key == "none":
            continue
        lines.append(f"| {a.label} | " + " | ".join(
            "n/a" if cell(grid[a.key][d.key], "accuracy") == "n/a" else
            f"{cell(grid[a.key][d.key], 'defense_precision').split(' ')[0]} / "
            f"{cell(grid[a.key][d.key], 'defense_recall').split(' ')[0]}"
            for d in defenses) + " |")
    return "\n".join(lines) + "\n"


def figure(args: argparse.Namespace, grid: dict, attack: Attack,
           defenses: list[Defense], path: str) -> None:
    """Accuracy over rounds under ``attack``: one line per defense (mean over seeds), the
    clean FedAvg run dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    for d in defenses:
        runs = [r for r in grid[attack.key][d.key] if "curve" in r]
        if not runs:
            continue
        x = [p[0] for p in runs[0]["curve"]]
        y = np.mean([[p[1] for p in r["curve"]] for r in runs], axis=0)
        ax.plot(x, y, marker=".", label=d.label)
    clean = [r for r in grid.get("none", {}).get("fedavg", []) if "curve" in r]
    if clean:
        ax.plot([p[0] for p in clean[0]["curve"]],
                np.mean([[p[1] for p in r["curve"]] for r in clean], axis=0), "k--",
                label="FedAvg, no attack")
    ax.set_xlabel("round")
    ax.set_ylabel("clean test accuracy (mean over seeds)")
    ax.set_title(f"{args.dataset}: {attack.label}, {FRACTION:.0%} malicious")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def benchmark(args: argparse.Namespace) -> dict:
    job, prepare = DATASETS[args.dataset]
    log = (lambda s: print(s, flush=True)) if not args.quiet else (lambda s: None)
    prepare(args)
    base = job(args)
    attacks = [a for a in ATTACKS if a.key in args.attacks]
    defenses = [d for d in DEFENSES if d.key in args.defenses]
    total = len(attacks) * len(defenses) * len(args.seeds)
    grid: dict[str, dict[str, list[dict]]] = {a.key: {d.key: [] for d in defenses}
                                             for a in attacks}
    t_start, count = time.perf_counter(), 0
    proto = f"R{args.rounds}_K{args.clients_per_round}_L{args.local_epochs}_lr{args.lr}"
    for a in attacks:
        for d in defenses:
            for seed in args.seeds:
                count += 1
                if a.omniscient and any(o.startswith("algorithm.stages=") for o in d.overrides):
                    # refused by fedray: the rows are rewritten after the stages ran
                    grid[a.key][d.key].append({"skipped": NOT_WITH_STAGES, "seed": seed})
                    continue
                run_dir = os.path.join(args.out, "runs", proto, a.key, d.key, f"s{seed}")
                r = common.run_one(base, [*a.overrides, *d.overrides, f"seed={seed}",
                                          *args.overrides], run_dir, log, args.report_only,
                                   summarize)
                grid[a.key][d.key].append({**r, "seed": seed})
                what = ("not run" if "missing" in r else "failed: " + r["failed"]
                        if "failed" in r else f"accuracy {r['accuracy']:.3f}" + (
                            f", attack success {r['attack_success']:.3f}"
                            if "attack_success" in r else ""))
                log(f"[{count}/{total}] {a.key} vs {d.key} seed {seed}: {what}")
    results = {"dataset": args.dataset, "argv": sys.argv[1:], "grid": grid,
               "total_s": time.perf_counter() - t_start}
    text = markdown(args, grid, attacks, defenses)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(text)
    # the strongest attack: the one that leaves FedAvg the lowest final accuracy
    scored = [(sum(r["accuracy"] for r in grid[a.key]["fedavg"] if "accuracy" in r)
               / max(1, sum("accuracy" in r for r in grid[a.key]["fedavg"])), a)
              for a in attacks if a.key != "none" and "fedavg" in grid[a.key]
              and any("accuracy" in r for r in grid[a.key]["fedavg"])]
    if scored:
        strongest = min(scored, key=lambda t: t[0])[1]
        results["strongest"] = strongest.key
        figure(args, grid, strongest, defenses, args.figure
               or os.path.join(args.out, f"robustness_{args.dataset}.png"))
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=2, default=float)
    log(text)
    log(f"done: {count} runs in {results['total_s']:.0f}s; outputs in {args.out}")
    return results


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = common.base_parser(__doc__, list(DATASETS), "robustness")
    p.add_argument("--attacks", nargs="+", choices=[a.key for a in ATTACKS],
                   default=[a.key for a in ATTACKS])
    p.add_argument("--defenses", nargs="+", choices=[d.key for d in DEFENSES],
                   default=[d.key for d in DEFENSES])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--clients-per-round", type=int, default=20)
    p.add_argument("--lr", type=float, default=0.03)
    p.add_argument("--local-epochs", type=int, default=3)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--figure", help="where the figure goes (default: in --out)")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--report-only", action="store_true",
                   help="train nothing: the table from the finished runs")
    p.add_argument("overrides", nargs="*", help="key=value applied to every run")
    args = p.parse_args(argv)
    args.out = os.path.abspath(args.out or os.path.join("runs", "robustness", args.dataset))
    return args


def main(argv: list[str] | None = None) -> int:
    import signal

    # SIGTERM unwinds like Ctrl-C: the run in progress keeps its checkpoint for the next call
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    benchmark(parse(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
