"""Seed 004 (SCAFFOLD, Karimireddy et al.) Tables 3, 4 and 5 on the MNIST t10k similarity
stores (or, with --data femnist, on the LEAF FEMNIST sample's): SGD, FedAvg, SCAFFOLD
(option II) and FedProx (mu = 1), client lr tuned per method.

What each table compares (seed 004 line 316):
- Table 3 (lines 328-350): logistic regression, 20% of clients per round, rounds to a target
  test accuracy for SGD (one full-batch step) and for FedAvg, SCAFFOLD and FedProx at
  E in {1, 5, 10, 20} local epochs of 5 steps, at similarity 0, 10 and 100%.
- Table 4 (lines 352-360): logistic regression, E = 5, FedAvg and SCAFFOLD at 20, 5 and 1%
  of clients per round, similarity 0 and 10%, rounds to a (lower) target.
- Table 5 (line 364-369): the 2-layer fully connected net, E = 5, 20% of clients, SGD,
  FedAvg and SCAFFOLD at similarity 0 and 10%: best test accuracy within the horizon.

The seed tunes eta_l per algorithm (line 308) but gives no grid and no rule. fedray's
protocol, to fit 2 shared CPU cores:
- every table cell (method, E, similarity, participation, model) is tuned on seed 0 over
  GRID = 10^{-2, -1.5, -1, -0.5, 0} (Table 5: 10^{-1.5, -1, -0.5}); while the choice is on
  the edge of the values tried, one half-decade beyond it is tried too (within
  [10^-3, 10^1.5]);
- the rule is the table's own metric: fewest rounds to the target (ties: the higher test
  accuracy in that round, then the smaller lr; no lr reaching it: the best accuracy), and
  for Table 5 the best test accuracy;
- a run stops in the round it reaches the target (the metric needs nothing after it), and a
  tuning run also stops once it can no longer beat the best lr found so far;
- the chosen lr runs seeds 1 and 2; its seed-0 tuning run (complete: it either reached the
  target or ran the whole horizon) is the seed-0 run;
- horizons: 200 rounds (Table 3), 1000 (Table 4, as the seed), 100 (Table 5) instead of 1k.

    python jobs/paper/scaffold_mnist/run.py --out docs/figures/scaffold_mnist

--data femnist: the closer substitute for the seed's EMNIST (62 classes, handwriting): the
100-client similarity stores of the LEAF FEMNIST sample (stores/femnist_sim{0,0.1,1.0}, its
own test split as the central test set) and the seed's own targets, 0.5 (Table 3) and 0.45
(Table 4). Its lr is tuned as line 308 says, once per algorithm: per (algorithm,
similarity) on Table 3's E = 5 cell (SGD: its only cell), and that lr serves every E of
Table 3 and Table 4's cells of the same similarity; Table 5 is tuned per cell as above.
The edge extension may go down to 10^-4 (its inputs, 1.0 on a white background, need
smaller steps than MNIST's). --sims runs a subset of the similarities (two processes can
share the work; a last run with every table reads the finished runs and writes the report).

    python jobs/paper/scaffold_mnist/run.py --data femnist --horizons 300,1000,100 \
        --out docs/figures/scaffold_femnist

Writes report.md (every table with mean +- std over seeds 0-2 and the chosen lrs), results.json,
and table3.png, table4.png, table5.png to --out. Runs go to --runs (finished ones are reused).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from common import parser, run_all  # noqa: E402

from fedray.tracking.callbacks import STOP, Callback  # noqa: E402

ROOT = HERE.parents[2]
SEEDS = (0, 1, 2)
SIMS = {"0": "0%", "0.1": "10%", "1.0": "100%"}


@dataclass(frozen=True)
class Data:
    """The similarity stores a run of the tables reads, and what that data's targets are."""

    name: str  # as --data names it
    title: str  # in report titles
    short: str  # in figure titles
    store: str  # the store of similarity {s}, relative to the repository
    target3: float
    target4: float
    tune_per_cell: bool  # False: once per (algorithm, similarity), on Table 3's E = 5 cell
    limits: tuple[float, float] = (-3.0, 1.5)  # log10 eta_l the edge extension stays within


DATA = {
    # MNIST's 10 classes pass 0.5 within 1-7 rounds everywhere: 0.80 instead, and 0.75 for
    # Table 4 (0.05 below, as the seed's 0.45 is below its 0.5, line 352); see
    # docs/reproductions.md section 3
    "mnist": Data("mnist", "MNIST t10k", "MNIST", "stores/mnist_sim{s}", 0.80, 0.75, True),
    # EMNIST's substitute: the seed's own targets (lines 328, 352)
    "femnist": Data("femnist", "the LEAF FEMNIST sample", "the FEMNIST sample",
                       "stores/femnist_sim{s}", 0.5, 0.45, False, (-4.0, 1.5)),
}
TARGET3, TARGET4 = DATA["mnist"].target3, DATA["mnist"].target4
GRID = (-2.0, -1.5, -1.0, -0.5, 0.0)  # log10 eta_l, fedray's choice
GRID5 = (-1.5, -1.0, -0.5)
LIMITS = DATA["mnist"].limits
ALGS = ("fedsgd", "fedavg", "scaffold", "fedprox")
LABEL = {"fedsgd": "SGD", "fedavg": "FedAvg", "scaffold": "SCAFFOLD", "fedprox": "FedProx"}


@dataclass(frozen=True)
class Cell:
    """One entry of a seed table: what is tuned and run with three seeds."""

    table: int
    alg: str
    epochs: int  # local epochs (1 for SGD, where it does not apply)
    sim: str  # the store's similarity, as in its name
    clients: int  # clients per round (of 100)
    rounds: int  # horizon
    target: float | None  # None: Table 5's best accuracy
    data: str = "mnist"  # a key of DATA

    @property
    def name(self) -> str:
        return f"t{self.table}/sim{self.sim}/p{self.clients}/{self.alg}-e{self.epochs}"

    def overrides(self, lr: float, seed: int) -> list[str]:
        out = [
            f"data.partition={DATA[self.data].store.format(s=self.sim)}",
            f"client.lr={lr:g}",
            f"sampling.clients_per_round={self.clients}",
            f"rounds={self.rounds}",
            f"seed={seed}",
            "output.tensorboard=false",
            "checkpoint.every=0",
        ]
        if self.alg != "fedsgd":
            out.append(f"client.local_epochs={self.epochs}")
        if self.table == 5:
            out.append("model.name=mlp")
        return out


def cells(rounds: dict[int, int], data: str = "mnist") -> list[Cell]:
    """Every cell of Tables 3-5, in the order they run (the cheap logistic tables first)."""
    d = DATA[data]
    out = [Cell(3, "fedsgd", 1, s, 20, rounds[3], d.target3, data) for s in SIMS]
    out += [
        Cell(3, a, e, s, 20, rounds[3], d.target3, data)
        for s in SIMS
        for a in ("fedavg", "scaffold", "fedprox")
        for e in (1, 5, 10, 20)
    ]
    out += [
        Cell(4, a, 5, s, p, rounds[4], d.target4, data)
        for s in ("0", "0.1")
        for a in ("fedavg", "scaffold")
        for p in (20, 5, 1)
    ]
    out += [
        Cell(5, a, 5, s, 20, rounds[5], None, data)
        for s in ("0", "0.1")
        for a in ("fedsgd", "fedavg", "scaffold")
    ]
    return out


def tuned_on(cell: Cell, rounds: dict[int, int]) -> Cell:
    """The cell whose seed-0 search picks ``cell``'s lr: itself, or, where the data tunes
    once per algorithm (seed 004 line 308), Table 3's cell of the same algorithm and
    similarity at E = 5 (SGD: its one cell). Table 5, another model, is tuned per cell."""
    d = DATA[cell.data]
    if d.tune_per_cell or cell.table == 5:
        return cell
    return Cell(3, cell.alg, 1 if cell.alg == "fedsgd" else 5, cell.sim, 20, rounds[3],
                d.target3, cell.data)


def lr_of(exponent: float) -> float:
    """10^e rounded as a job file writes it (3 significant digits)."""
    return float(f"{10**exponent:.3g}")


class StopAt(Callback):
    """Ends a run in the round its test accuracy reaches ``target``, after round ``cap``, or
    when the test loss is no longer finite (a diverged lr)."""

    def __init__(self, target: float | None, cap: int | None = None) -> None:
        self.target, self.cap, self.stop = target, cap, False

    def on_evaluation(self, round: int, metrics: dict) -> None:
        acc, loss = metrics.get("test_accuracy"), metrics.get("test_loss")
        if self.target is not None and acc is not None and acc >= self.target:
            self.stop = True
        if loss is not None and not math.isfinite(loss):
            self.stop = True

    def on_round_end(self, round: int, metrics: dict, weights: Any) -> Any:
        if self.stop or (self.cap is not None and round >= self.cap):
            return STOP
        return None


def accuracies(run_dir: str) -> dict[int, float]:
    """round -> test accuracy, from metrics.jsonl (NaN counts as 0: a diverged run)."""
    out = {}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                if "test_accuracy" in row:
                    v = float(row["test_accuracy"])
                    out[int(row["round"])] = v if math.isfinite(v) else 0.0
    return out


def reached(acc: dict[int, float], target: float) -> int | None:
    """The first round whose test accuracy is >= target (None: never)."""
    return next((r for r, v in sorted(acc.items()) if v >= target), None)


def key(acc: dict[int, float], target: float | None, lr: float) -> tuple:
    """The selection key (larger is better): Tables 3-4 by fewest rounds to the target, then
    the higher accuracy in that round, then the smaller lr; a run that never reaches it
    ranks below all that do, by its best accuracy. Table 5 by the best accuracy."""
    best = max(acc.values(), default=0.0)
    if target is None:
        return (best, -lr)
    r = reached(acc, target)
    if r is None:
        return (0, 0, best, -lr)
    return (1, -r, acc[r], -lr)


def choose(tried: dict[float, tuple]) -> float:
    """The exponent whose key is largest."""
    return max(tried, key=lambda e: tried[e])


def next_exponent(tried: dict[float, tuple],
                  limits: tuple[float, float] = LIMITS) -> float | None:
    """One half-decade beyond the chosen exponent when it is on the edge of those tried and
    the limits allow; None when the choice is inside (the search is done)."""
    e, lo, hi = choose(tried), min(tried), max(tried)
    if e == hi and e + 0.5 <= limits[1]:
        return e + 0.5
    if e == lo and e - 0.5 >= limits[0]:
        return e - 0.5
    return None


def run_dir(runs: str, cell: Cell, lr: float, seed: int) -> str:
    return os.path.join(runs, cell.name, f"lr{lr:g}-s{seed}")


def tune(cell: Cell, runs: str, grid: tuple[float, ...]) -> tuple[float, dict[float, tuple]]:
    """Seed-0 search over ``grid`` (log10 eta_l), middle first, extended at the edges."""
    job = str(HERE / f"{cell.alg}.yaml")
    tried: dict[float, tuple] = {}
    todo = sorted(grid, key=lambda e: (abs(e - grid[len(grid) // 2]), e))
    while todo:
        e = todo.pop(0)
        lr = lr_of(e)
        cap = None
        if cell.target is not None and tried:
            best = tried[choose(tried)]
            if best[0] == 1:  # an lr reached the target: only as fast or faster matters
                cap = -best[1]
        out = run_dir(runs, cell, lr, 0)
        run_all([(job, cell.overrides(lr, 0), out, {"callbacks": [StopAt(cell.target, cap)]})])
        tried[e] = key(accuracies(out), cell.target, lr)
        if not todo:
            nxt = next_exponent(tried, DATA[cell.data].limits)
            if nxt is not None and nxt not in tried:
                todo.append(nxt)
    return choose(tried), tried


def run_cell(cell: Cell, runs: str, rounds: dict[int, int]) -> dict:
    """Tune (on ``tuned_on``'s cell), then run the seeds that search did not run at the
    chosen lr; the per-seed results."""
    base = tuned_on(cell, rounds)
    e, tried = tune(base, runs, GRID5 if cell.table == 5 else GRID)
    lr = lr_of(e)
    job = str(HERE / f"{cell.alg}.yaml")
    run_all(
        [
            (
                job,
                cell.overrides(lr, s),
                run_dir(runs, cell, lr, s),
                {"callbacks": [StopAt(cell.target)]},
            )
            for s in (SEEDS[1:] if base == cell else SEEDS)
        ]
    )
    per_seed = []
    for s in SEEDS:
        acc = accuracies(run_dir(runs, cell, lr, s))
        per_seed.append(
            {
                "seed": s,
                "rounds_to_target": None if cell.target is None else reached(acc, cell.target),
                "best": max(acc.values()),
                "rounds_run": max(acc),
                "rounds_to_0.5": reached(acc, 0.5),
            }
        )
    # MNIST's results.json as before this option existed: regenerated byte for byte
    fields = {k: v for k, v in cell.__dict__.items() if k != "data" or v != "mnist"}
    return {
        "cell": fields,
        **({} if base == cell else {"tuned_on": base.name}),
        "lr": lr,
        "grid": {f"{lr_of(x):g}": list(k) for x, k in sorted(tried.items())},
        "seeds": per_seed,
    }


# ---------------------------------------------------------------- tables and figures


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), statistics.pstdev(values) if len(values) > 1 else 0.0


def rounds_text(res: dict) -> str:
    """Mean +- std of the rounds to the target; 'H+' when no seed reached it in H rounds,
    'mean (k/3 reached)' counting the others as H when some did."""
    horizon = res["cell"]["rounds"]
    r = [x["rounds_to_target"] for x in res["seeds"]]
    hit = [x for x in r if x is not None]
    if not hit:
        return f"{horizon}+"
    m, sd = mean_std([x if x is not None else horizon for x in r])
    note = "" if len(hit) == len(r) else f" ({len(hit)}/{len(r)} reached; others as {horizon})"
    return f"{m:.1f} ± {sd:.1f}{note}"


def mean_rounds(res: dict) -> float:
    """Mean rounds to the target with unreached seeds counted as the horizon (a lower bound)."""
    horizon = res["cell"]["rounds"]
    return statistics.mean(x["rounds_to_target"] or horizon for x in res["seeds"])


def rounds_row(pairs: list[tuple[dict | None, dict | None]], ratio) -> tuple[list[str], list[str]]:
    """A table row's cells, "rounds (ratio×)" for each (result, reference) pair ("–" for a
    cell not run; no bracket without a reference), and the lrs chosen for its cells."""
    row, lrs = [], []
    for r, ref in pairs:
        if r is None:
            row.append("–")
            continue
        row.append(rounds_text(r) + (f" ({ratio(r, ref):.1f}×)" if ref else ""))
        lrs.append(f"{r['lr']:g}")
    return row, lrs


def report(results: list[dict], out: str, data: str = "mnist") -> str:
    d = DATA[data]
    by = {
        (
            r["cell"]["table"],
            r["cell"]["alg"],
            r["cell"]["epochs"],
            r["cell"]["sim"],
            r["cell"]["clients"],
        ): r
        for r in results
    }
    lines = [
        f"# Seed 004 Tables 3-5 on {d.title} (fedray)",
        "",
        "Mean ± std over seeds 0, 1, 2 at the lr chosen on seed 0 (population std).",
        "",
    ]
    if not d.tune_per_cell:
        lines += ["Tables 3 and 4 use the lr chosen on Table 3's E = 5 cell of the same "
                  "algorithm and similarity (SGD: its one cell); Table 5 is tuned per cell.", ""]
    if any(k[0] == 3 for k in by):
        lines += [
            f"## Table 3: rounds to {d.target3} test accuracy, logistic regression, 20% "
            "of clients (speed-up vs SGD in brackets)",
            "",
            "| method | E | "
            + " | ".join(f"{v} similarity" for v in SIMS.values())
            + " | lr (per similarity) |",
            "|---|---|---|---|---|---|",
        ]
        for a in ALGS:
            for e in (1,) if a == "fedsgd" else (1, 5, 10, 20):
                row, lrs = rounds_row(
                    [(by.get((3, a, e, s, 20)), by.get((3, "fedsgd", 1, s, 20))) for s in SIMS],
                    lambda r, sgd: mean_rounds(sgd) / mean_rounds(r),
                )
                lines.append(f"| {LABEL[a]} | {e} | " + " | ".join(row) + f" | {', '.join(lrs)} |")
        lines += [] if d.target3 == 0.5 else [
            "",
            "Rounds to 0.5 (the seed's EMNIST target) in the same runs, mean:",
            "",
            "| method | E | " + " | ".join(SIMS.values()) + " |",
            "|---|---|---|---|---|",
        ]
        for a in ALGS if d.target3 != 0.5 else ():
            for e in (1,) if a == "fedsgd" else (1, 5, 10, 20):
                row = []
                for s in SIMS:
                    r = by.get((3, a, e, s, 20))
                    v = [x["rounds_to_0.5"] for x in r["seeds"]] if r else []
                    row.append(f"{statistics.mean(v):.1f}" if v and None not in v else "–")
                lines.append(f"| {LABEL[a]} | {e} | " + " | ".join(row) + " |")
    if any(k[0] == 4 for k in by):
        lines += [
            "",
            f"## Table 4: rounds to {d.target4} test accuracy, logistic regression, "
            "E = 5 (slow-down vs 20% in brackets)",
            "",
            "| method | clients | 0% similarity | 10% similarity | lr (per similarity) |",
            "|---|---|---|---|---|",
        ]
        for a in ("scaffold", "fedavg"):
            for p in (20, 5, 1):
                row, lrs = rounds_row(
                    [(by.get((4, a, 5, s, p)), by.get((4, a, 5, s, 20))) for s in ("0", "0.1")],
                    lambda r, ref: mean_rounds(r) / mean_rounds(ref),
                )
                lines.append(f"| {LABEL[a]} | {p}% | " + " | ".join(row) + f" | {', '.join(lrs)} |")
    if any(k[0] == 5 for k in by):
        lines += [
            "",
            "## Table 5: best test accuracy within the horizon, 2-layer FC net "
            "(fedray's `mlp`), E = 5, 20% of clients",
            "",
            "| method | 0% similarity | 10% similarity | lr (per similarity) |",
            "|---|---|---|---|",
        ]
        for a in ("fedsgd", "fedavg", "scaffold"):
            row, lrs = [], []
            for s in ("0", "0.1"):
                r = by.get((5, a, 5, s, 20))
                if r is None:
                    row.append("–")
                    continue
                m, sd = mean_std([x["best"] for x in r["seeds"]])
                row.append(f"{m:.3f} ± {sd:.3f}")
                lrs.append(f"{r['lr']:g}")
            lines.append(f"| {LABEL[a]} | " + " | ".join(row) + f" | {', '.join(lrs)} |")
    lines += [
        "",
        "## The lr search (seed 0): the key of every lr tried",
        "",
        "Key: (1, -rounds to target, accuracy then, -lr) when reached, (0, 0, best "
        "accuracy, -lr) when not; Table 5: (best accuracy, -lr). Largest wins.",
        "",
    ]
    for r in results:
        c = r["cell"]
        tried = ", ".join(f"{lr}: {tuple(round(v, 4) for v in k)}" for lr, k in r["grid"].items())
        lines.append(
            f"- Table {c['table']} {LABEL[c['alg']]} E={c['epochs']} "
            f"s={SIMS[c['sim']]} {c['clients']}%: chose {r['lr']:g}; {tried}"
        )
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(text)
    return text


def save(fig, title: str, path: str) -> None:
    """Title, lay out, write and close one table's figure."""
    import matplotlib.pyplot as plt

    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def figures(results: list[dict], runs: str, out: str, data: str = "mnist") -> None:
    """table3.png / table4.png: rounds to the target as bars (mean, seeds as dots, unreached
    drawn at the horizon and hatched), one panel per similarity; table5.png: the test
    accuracy curves (mean over seeds, min-max band)."""
    import matplotlib

    d = DATA[data]
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"fedsgd": "k", "fedavg": "tab:orange", "scaffold": "tab:blue", "fedprox": "tab:green"}

    def bars(ax, items: list[tuple[str, str, dict]], title: str) -> None:
        for i, (_label, alg, r) in enumerate(items):
            h = r["cell"]["rounds"]
            vals = [x["rounds_to_target"] or h for x in r["seeds"]]
            miss = any(x["rounds_to_target"] is None for x in r["seeds"])
            ax.bar(
                i,
                statistics.mean(vals),
                color=colors[alg],
                alpha=0.7,
                hatch="//" if miss else None,
                edgecolor="k" if miss else None,
            )
            ax.plot([i] * len(vals), vals, "k.", ms=3)
        ax.set_xticks(range(len(items)), [x[0] for x in items], rotation=90, fontsize=7)
        ax.set_yscale("log")
        ax.set_title(title, fontsize=9)
        ax.grid(axis="y", alpha=0.3)

    t3 = [r for r in results if r["cell"]["table"] == 3]
    if t3:
        fig, axes = plt.subplots(1, 3, figsize=(13, 4), sharey=True)
        for ax, s in zip(axes, SIMS, strict=True):
            items = [
                (
                    f"{LABEL[r['cell']['alg']]}"
                    + ("" if r["cell"]["alg"] == "fedsgd" else f" E{r['cell']['epochs']}"),
                    r["cell"]["alg"],
                    r,
                )
                for r in t3
                if r["cell"]["sim"] == s
            ]
            bars(ax, items, f"{SIMS[s]} similarity")
        axes[0].set_ylabel(f"rounds to {d.target3} (hatched: not reached, at the horizon)")
        per = "cell" if d.tune_per_cell else "algorithm and similarity"
        save(fig, f"Seed 004 Table 3 on {d.short}: logistic regression, 20% of clients, "
            f"lr tuned per {per}, seeds 0-2", os.path.join(out, "table3.png"))
    t4 = [r for r in results if r["cell"]["table"] == 4]
    if t4:
        fig, axes = plt.subplots(1, 2, figsize=(8, 4), sharey=True)
        for ax, s in zip(axes, ("0", "0.1"), strict=True):
            items = [
                (f"{LABEL[r['cell']['alg']]} {r['cell']['clients']}%", r["cell"]["alg"], r)
                for r in t4
                if r["cell"]["sim"] == s
            ]
            bars(ax, items, f"{SIMS[s]} similarity")
        axes[0].set_ylabel(f"rounds to {d.target4}")
        save(fig, f"Seed 004 Table 4 on {d.short}: logistic regression, E = 5",
             os.path.join(out, "table4.png"))
    t5 = [r for r in results if r["cell"]["table"] == 5]
    if t5:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
        for ax, s in zip(axes, ("0", "0.1"), strict=True):
            for r in t5:
                c = r["cell"]
                if c["sim"] != s:
                    continue
                curves = [accuracies(run_dir(runs, Cell(**c), r["lr"], x)) for x in SEEDS]
                rounds = sorted(set.intersection(*(set(a) for a in curves)))
                ys = [[a[k] for a in curves] for k in rounds]
                ax.plot(
                    rounds,
                    [statistics.mean(y) for y in ys],
                    color=colors[c["alg"]],
                    label=f"{LABEL[c['alg']]} (lr {r['lr']:g})",
                )
                ax.fill_between(
                    rounds,
                    [min(y) for y in ys],
                    [max(y) for y in ys],
                    color=colors[c["alg"]],
                    alpha=0.2,
                )
            ax.set_title(f"{SIMS[s]} similarity", fontsize=9)
            ax.set_xlabel("round")
            ax.set_ylim(0.5 if data == "mnist" else 0.0, 1.0)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        axes[0].set_ylabel("test accuracy")
        save(fig, f"Seed 004 Table 5 on {d.short}: 2-layer FC net (200 hidden), E = 5, 20% "
            "of clients, mean and min-max of seeds 0-2", os.path.join(out, "table5.png"))


def main() -> None:
    mnist_runs = str(ROOT / "runs" / "paper" / "scaffold_mnist")
    p = parser(__doc__, mnist_runs)
    p.add_argument("--data", choices=sorted(DATA), default="mnist",
                   help="the similarity stores: mnist (stores/mnist_sim*) or femnist "
                   "(stores/femnist_sim*, the seed's targets; runs default to "
                   "runs/paper/scaffold_femnist)")
    p.add_argument("--tables", default="3,4,5", help="which tables to run (comma-separated)")
    p.add_argument("--sims", default=",".join(SIMS),
                   help="which similarities to run (comma-separated, of " + ", ".join(SIMS)
                   + "); a subset's report covers only it")
    p.add_argument(
        "--horizons", default="200,1000,100", help="rounds of Tables 3, 4, 5 (the seed: 1000 each)"
    )
    args = p.parse_args()
    h = [int(x) for x in args.horizons.split(",")]
    rounds = {3: h[0], 4: h[1], 5: h[2]}
    if args.rounds:
        rounds = dict.fromkeys(rounds, args.rounds)
    tables = {int(x) for x in args.tables.split(",")}
    sims = set(args.sims.split(","))
    if not sims <= set(SIMS):
        p.error(f"--sims: {', '.join(sorted(sims - set(SIMS)))} is not one of {', '.join(SIMS)}")
    runs = args.runs
    if args.data != "mnist" and runs == mnist_runs:
        runs = str(ROOT / "runs" / "paper" / f"scaffold_{args.data}")
    out = os.path.abspath(args.out)
    os.chdir(ROOT)  # the jobs' store paths are relative to the repository
    stores = [DATA[args.data].store.format(s=s) for s in sorted(sims)]
    missing = [path for path in stores if not os.path.exists(path)]
    if missing:
        p.error(f"{missing[0]} not found: build it first (fedray partition "
                "partitions/similarity.yaml ..., as docs/reproductions.md shows)")
    os.makedirs(out, exist_ok=True)
    results = []
    for cell in cells(rounds, args.data):
        if cell.table in tables and cell.sim in sims:
            results.append(run_cell(cell, runs, rounds))
            print(f"done {cell.name}: lr {results[-1]['lr']:g}", flush=True)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(report(results, out, args.data))
    figures(results, runs, out, args.data)


if __name__ == "__main__":
    main()
