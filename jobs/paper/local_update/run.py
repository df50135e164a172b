"""Seed 002's non-convex experiments (Charles & Konečný, App. E.3 and F): LOCALUPDATE with
Theta_{1:50} on FEMNIST (Fig. 6/11): (left) SERVEROPT without momentum, with Nesterov and
with heavy-ball momentum (beta = 0.9), alpha = 0; (right) no momentum and a proximal alpha --
each with gamma (client lr) and eta (server lr) tuned. ``--task shakespeare``: App. F's
Fig. 13 on the First Folio store (the character LSTM, batch 4, Theta_{1:10}, alpha = 0):
gamma varied, eta tuned per gamma by the training loss; with ``--eta 0.01`` its Fig. 12
(eta fixed at the seed's 0.01, line 1101: no tuning runs).

The seed tunes gamma and eta over the full grid {10^-3, 10^-2.5, ..., 10^0.5, 10} (line 1092)
and keeps the pair with the best mean test accuracy over the last 100 rounds (line 1094).
On 2 CPU cores that is out of reach (Theta_{1:50} is 500 CNN steps a round), so each setting
is tuned on a coarse subset of that grid by coordinate search on seed 0 with
``--tune-rounds`` rounds: first eta over three grid values at gamma = GAMMA0, then gamma one
grid step below and above GAMMA0 (10^{+-0.5}) at the chosen eta, then, for a coordinate
whose choice is on the edge of the values searched, one grid step beyond that edge; the
score is line 1094's rule, scaled: the mean test accuracy over the last third of the
rounds. The chosen pair then runs ``--rounds`` rounds with seeds 0, 1, 2. The alpha value
(1) is fedray's choice: the seed's text does not list the ones in Fig. 6 (right).

    python jobs/paper/local_update/run.py --tune-rounds 8 --rounds 20 \\
        --out docs/figures/local_update_femnist
    python jobs/paper/local_update/run.py --task shakespeare --tune-rounds 10 --rounds 100 \\
        --jobs 2 --set runtime.backend=inline --out docs/figures/local_update_shakespeare
    python jobs/paper/local_update/run.py --task shakespeare --eta 0.01 --rounds 100 \\
        --jobs 2 --set runtime.backend=inline --out docs/figures/local_update_shakespeare_eta

For Shakespeare every gamma runs seeds 0, 1, 2, and its eta search starts at {0.1, 1} and
runs the pick's missing half-decade neighbours (within line 1119's range, 10^-3 to 10) until
both have been run and lost: every pick is interior.

Writes report.md (the grid, the choices, the final accuracies per seed) and a figure of the
selection metric per round (mean over the seeds, min-max band: test_accuracy.png for
FEMNIST, train_loss.png with the test accuracy beside it for Shakespeare) to --out.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from common import parser, run_all  # noqa: E402

ROOT = HERE.parents[2]
SEEDS = (0, 1, 2)


def grid(*exponents: float) -> list[float]:
    """Values 10^e of the seed's log10 grid (line 1092), rounded as job files write them."""
    return [float(f"{10 ** e:.3g}") for e in exponents]


# (job file, extra overrides, eta values for the first search stage)
ETA_PLAIN = grid(-2.0, -1.5, -1.0)
ETA_MOMENTUM = grid(-3.0, -2.5, -2.0)  # beta = 0.9 steps about 1 / (1 - beta) = 10x further
STUDIES = {
    "femnist": {
        "jobs": ROOT / "jobs" / "paper" / "local_update",
        "gamma0": -1.5,
        "settings": {
            "gradient": ("femnist_gradient.yaml", [], ETA_PLAIN),
            "nesterov": ("femnist_nesterov.yaml", [], ETA_MOMENTUM),
            "momentum": ("femnist_momentum.yaml", [], ETA_MOMENTUM),
            "alpha=1": ("femnist_gradient.yaml", ["algorithm.local_update.alpha=1.0"], ETA_PLAIN),
        },
        "panels": {"server momentum, alpha = 0": ["gradient", "nesterov", "momentum"],
                   "no momentum, proximal alpha": ["gradient", "alpha=1"]},
        "title": "FEMNIST (LEAF sample), LOCALUPDATE Theta_{1:50}",
        "metric": "test_accuracy",
        "extend_edges": True,
    },
    # App. F (lines 1101-1121, Fig. 12-13): Theta_{1:10}, alpha = 0, gamma varied over a
    # subset of line 1103's values, eta tuned per gamma (Fig. 13) on a subset of line 1119's
    # grid by line 1121's rule (smallest mean training loss over the last rounds)
    "shakespeare": {
        "jobs": ROOT / "jobs" / "shakespeare",
        # the end points first, so that a sweep cut short still has them on every seed
        "settings": {f"gamma={g:g}": ("local_update.yaml", [], grid(-1.0, 0.0), g)
                     for g in (0.0, 1.0, 0.1)},
        "panels": {"Theta_{1:10}, alpha = 0, eta tuned per gamma":
                   ["gamma=0", "gamma=0.1", "gamma=1"]},
        "title": "Shakespeare (First Folio), LOCALUPDATE Theta_{1:10}, LSTM",
        "metric": "train_loss",
        # tuning reads the training loss only: no test set evaluation
        "tune_overrides": ["eval.every=0", "eval.central=false"],
        # the claims are about the training loss; the 12,481 test sequences take about 25 s
        "final_overrides": ["eval.every=0"],  # so one test, after the last round
        # eta's search: the half-decade values of line 1119's range (10^-3 to 10) next to
        # the pick, until both neighbours of the pick have been run and lost
        "widen_eta": (-3.0, 1.0),
    },
}


def score(run_dir: str, metric: str = "test_accuracy") -> float:
    """The selection score: the mean of ``metric`` over the last third of the rounds it was
    recorded in (line 1094's rule for test accuracy, line 1121's for the training loss,
    scaled to fedray's rounds), signed so that larger is better."""
    values = curve(run_dir, metric)
    tail = values[-max(1, len(values) // 3):]
    mean = sum(tail) / len(tail)
    if mean != mean:  # a diverged run (NaN loss)
        return -math.inf
    return -mean if metric == "train_loss" else mean


def curve(run_dir: str, metric: str = "test_accuracy") -> list[float]:
    return [v for _, v in rounds_and(run_dir, metric)]


def rounds_and(run_dir: str, metric: str) -> list[tuple[int, float]]:
    """(round, value) of every round that recorded ``metric``, from metrics.jsonl."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [(r["round"], r[metric]) for r in rows if metric in r]


def tune(study: dict, name: str, runs: str, rounds: int,
         overrides: tuple[str, ...] = ()) -> tuple[float, float, dict]:
    """Coordinate search on seed 0: eta at gamma0, then gamma one grid step either side at
    the chosen eta; a setting that fixes gamma (a fourth entry) tunes eta only (widening
    its values until the pick is interior where the study sets ``widen_eta``).
    ``overrides`` go to every run (``--set``)."""
    job, extra, etas, *fixed = study["settings"][name]
    path = str(study["jobs"] / job)
    metric = study["metric"]
    gamma0 = fixed[0] if fixed else float(f"{10 ** study['gamma0']:.3g}")

    def out(gamma: float, eta: float) -> str:
        return os.path.join(runs, "grid", f"{name}-g{gamma:g}-e{eta:g}")

    def batch(pairs):
        run_all([(path, [*extra, *study.get("tune_overrides", []), *overrides,
                         f"client.lr={g}", f"server.lr={e}", "seed=0", f"rounds={rounds}"],
                  out(g, e), {})
                 for g, e in pairs])
        return {(g, e): score(out(g, e), metric) for g, e in pairs}

    scores = batch([(gamma0, e) for e in etas])
    eta = max(etas, key=lambda e: scores[(gamma0, e)])
    if fixed and study.get("widen_eta"):
        # until both half-decade neighbours of the pick have been run and lost (or lie
        # outside the seed's grid): run the missing one, pick again
        low, high = study["widen_eta"]
        tried = list(etas)
        while True:
            e = round(2 * math.log10(eta)) / 2
            missing = [grid(n)[0] for n in (e - 0.5, e + 0.5)
                       if low <= n <= high and grid(n)[0] not in tried]
            if not missing:
                break
            scores.update(batch([(gamma0, missing[0])]))
            tried.append(missing[0])
            eta = max(tried, key=lambda v: scores[(gamma0, v)])
    if fixed:
        return gamma0, eta, scores
    gammas = grid(study["gamma0"] - 0.5, study["gamma0"] + 0.5)
    scores.update(batch([(g, eta) for g in gammas]))
    gamma, eta = max(((g, eta) for g in [gamma0, *gammas]), key=lambda p: scores[p])
    if study.get("extend_edges"):
        # a choice on the edge of the values its stage searched (eta: the first stage's,
        # gamma: the second's): one grid step beyond it, at the other coordinate's choice,
        # taken when it scores better
        for axis, tried in ((1, sorted(etas)), (0, sorted([gamma0, *gammas]))):
            chosen = (gamma, eta)[axis]
            if chosen not in (tried[0], tried[-1]):
                continue
            e = round(2 * math.log10(chosen)) / 2 + (0.5 if chosen == tried[-1] else -0.5)
            pair = (gamma, grid(e)[0]) if axis else (grid(e)[0], eta)
            scores.update(batch([pair]))
            if scores[pair] > scores[(gamma, eta)]:
                gamma, eta = pair
    return gamma, eta, scores


def _run_one(run) -> None:
    run_all([run])


def _starmap(fn, calls: list[tuple], jobs: int) -> list:
    """fn(*call) for every call: one after another, or in ``jobs`` separate processes."""
    if jobs <= 1:
        return [fn(*call) for call in calls]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(fn, *zip(*calls, strict=True)))


def main() -> None:
    p = parser(__doc__, "runs/paper/local_update")
    p.add_argument("--task", choices=sorted(STUDIES), default="femnist")
    p.add_argument("--tune-rounds", type=int, default=10)
    p.add_argument("--only", help="comma-separated settings to run (default: all)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="an override for every run, tuning and final (repeatable; e.g. "
                   "runtime.backend=inline, so that --jobs processes do not each start Ray)")
    p.add_argument("--jobs", type=int, default=1,
                   help="runs at a time, each in its own process: the settings are tuned "
                   "in parallel, then the final runs (default 1: one after another)")
    p.add_argument("--eta", type=float, default=None,
                   help="fix the server lr instead of tuning it (Fig. 12: 0.01): every "
                   "setting runs its own gamma at this eta, with no tuning runs; for a task "
                   "whose settings fix gamma (shakespeare)")
    p.add_argument("--report-only", action="store_true",
                   help="run no final run: write the report and figure from the final runs "
                   "already finished under --runs (the report names the missing ones)")
    args = p.parse_args()
    study = dict(STUDIES[args.task])
    if args.only:
        keep = args.only.split(",")
        study["settings"] = {k: v for k, v in study["settings"].items() if k in keep}
        study["panels"] = {t: [n for n in names if n in keep]
                           for t, names in study["panels"].items()}
        study["panels"] = {t: names for t, names in study["panels"].items() if names}
    runs = os.path.join(args.runs, args.task)
    rounds = args.rounds or 30
    overrides = tuple(args.set)
    names = list(study["settings"])
    if args.eta is not None:  # Fig. 12: eta fixed, nothing to tune
        if not all(len(study["settings"][n]) > 3 for n in names):
            p.error(f"--eta: the {args.task} settings tune gamma; only a task whose settings "
                    "fix gamma (shakespeare) runs at a fixed eta")
        chosen = {n: (study["settings"][n][3], args.eta, {}) for n in names}
        study["title"] += f", eta = {args.eta:g} fixed"
        study["panels"] = {t.replace("eta tuned per gamma", f"eta = {args.eta:g}"): ns
                           for t, ns in study["panels"].items()}
    else:
        tuned = _starmap(tune, [(study, n, runs, args.tune_rounds, overrides) for n in names],
                         args.jobs)
        chosen = dict(zip(names, tuned, strict=True))
    finals, todo = {}, []
    for name, (gamma, eta, scores) in chosen.items():
        print(f"{name}: gamma {gamma:g}, eta {eta:g} " + (
              f"(seed-0 score {scores[(gamma, eta)]:.4f} over {len(scores)} grid runs)"
              if scores else "(fixed)"), flush=True)
        job, extra, *_ = study["settings"][name]
        for s in SEEDS:
            d = os.path.join(runs, "final", f"{name}-g{gamma:g}-e{eta:g}-s{s}")
            todo.append(((str(study["jobs"] / job),
                          [*extra, *study.get("final_overrides", []), *overrides,
                           f"client.lr={gamma}", f"server.lr={eta}", f"seed={s}",
                           f"rounds={rounds}"], d, {}),))
            finals.setdefault(name, []).append(d)
    missing = []
    if args.report_only:
        missing = [d for ds in finals.values() for d in ds
                   if not os.path.exists(os.path.join(d, "summary.json"))]
        finals = {n: [d for d in ds if d not in missing] for n, ds in finals.items()}
        study["panels"] = {t: [n for n in names if finals[n]]
                           for t, names in study["panels"].items()}
    else:
        _starmap(_run_one, todo, args.jobs)
    os.makedirs(args.out, exist_ok=True)
    write_report(args.out, study, chosen, finals, rounds,
                 args.tune_rounds if args.eta is None else None, missing)
    plot(args.out, study, finals)


def write_report(out: str, study: dict, chosen: dict, finals: dict, rounds: int,
                 tune_rounds: int | None, missing: list[str] = ()) -> None:
    """``tune_rounds`` None: eta was fixed (--eta), nothing was tuned."""
    metric = study["metric"]
    rule = ("mean test accuracy" if metric == "test_accuracy"
            else "mean training loss (smaller is better)")
    how = (f"Tuned on seed 0 over {tune_rounds} rounds; final runs {rounds} rounds, "
           f"seeds {', '.join(map(str, SEEDS))}. Selection: {rule} over the last third of "
           "the rounds." if tune_rounds is not None else
           f"No tuning: every gamma at the fixed eta; runs of {rounds} rounds, seeds "
           f"{', '.join(map(str, SEEDS))}.")
    lines = [f"# {study['title']}", "", how, "",
             *([f"Not finished, so left out: {', '.join(os.path.basename(d) for d in missing)}.",
                ""] if missing else []),
             "| setting | gamma | eta | final test accuracy (mean ± std) | per seed | "
             "test accuracy, last third | training loss, last third |",
             "|---|---|---|---|---|---|---|"]
    for name, (gamma, eta, _) in chosen.items():
        if not finals[name]:
            lines.append(f"| {name} | {gamma:g} | {eta:g} | no finished run | — | — | — |")
            continue
        finals_acc = [curve(d)[-1] for d in finals[name]]
        tails = [score(d) for d in finals[name]]
        losses = [-score(d, "train_loss") for d in finals[name]]
        spread = (f"{statistics.stdev(finals_acc):.4f}" if len(finals_acc) > 1
                  else "(seed 0 only)")
        lines.append(f"| {name} | {gamma:g} | {eta:g} | {statistics.mean(finals_acc):.4f} ± "
                     f"{spread} | "
                     f"{', '.join(f'{a:.3f}' for a in finals_acc)} | "
                     f"{statistics.mean(tails):.4f} | {statistics.mean(losses):.4f} |")
    if metric == "train_loss":
        lines += loss_windows(chosen, finals, rounds)
    if tune_rounds is not None:  # the tuning grid behind each pick
        lines += ["", f"Grid (seed 0): the selection score per (gamma, eta) ({rule}; "
                  "-inf: diverged)", "", "| setting | gamma | eta | score |",
                  "|---|---|---|---|"]
        for name, (_, _, scores) in chosen.items():
            for (g, e), sc in sorted(scores.items()):
                lines.append(f"| {name} | {g:g} | {e:g} | "
                             f"{abs(sc) if math.isfinite(sc) else sc:.4f} |")
    Path(out, "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def loss_windows(chosen: dict, finals: dict, rounds: int) -> list[str]:
    """The mean training loss of each final run over rounds 1-10, the first third and the
    last third: mean ± std over the seeds, then per seed."""
    third = max(1, rounds // 3)
    windows = [(1, min(10, rounds)), (1, third), (rounds - third + 1, rounds)]
    head = " | ".join(f"rounds {a}-{b}" for a, b in windows)
    lines = ["", "Training loss of the final runs, mean over each window of rounds "
             "(mean ± std over the seeds; per seed in brackets)", "",
             f"| setting | {head} |", "|---|" + "---|" * len(windows)]
    for name in (n for n in chosen if finals[n]):
        cells = []
        for a, b in windows:
            per = [statistics.mean(v for r, v in rounds_and(d, "train_loss") if a <= r <= b)
                   for d in finals[name]]
            sd = statistics.stdev(per) if len(per) > 1 else float("nan")
            cells.append(f"{statistics.mean(per):.3f} ± {sd:.3f} "
                         f"({', '.join(f'{v:.3f}' for v in per)})")
        lines.append(f"| {name} | {' | '.join(cells)} |")
    return lines


def plot(out: str, study: dict, finals: dict) -> None:
    """The selection metric per round, mean over the seeds with a min-max band; one panel
    per comparison (and the test accuracy beside a training-loss study's curves)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(title, names, study["metric"]) for title, names in study["panels"].items()]
    if study["metric"] != "test_accuracy":
        panels += [(title, names, "test_accuracy") for title, names in study["panels"].items()]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, (title, names, metric) in zip(axes[0], panels, strict=True):
        for name in names:
            runs = [rounds_and(d, metric) for d in finals[name]]
            n = min(len(r) for r in runs)
            xs = [r for r, _ in runs[0][:n]]
            cols = [[v for _, v in run[:n]] for run in runs]
            ax.plot(xs, [statistics.mean(c[i] for c in cols) for i in range(n)],
                    marker="o" if n < 12 else None, label=name)
            ax.fill_between(xs, [min(c[i] for c in cols) for i in range(n)],
                            [max(c[i] for c in cols) for i in range(n)], alpha=0.2)
        if metric != study["metric"]:
            title = f"{metric.replace('_', ' ')} (on its eval rounds)"
        ax.set(title=title, xlabel="round", ylabel=metric.replace("_", " "))
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(study["title"])
    fig.tight_layout()
    fig.savefig(os.path.join(out, f"{study['metric']}.png"), dpi=120)


if __name__ == "__main__":
    main()
