"""Seed 003's Fig. 2: Exp-alpha's aggregation weights per kind of client, and its test
accuracy against proportional aggregation, in fixed compositions of each round.

Every setting and where it comes from (seed 003 = ../shared/seeds/003_*.txt):
  the jobs of section 6 (jobs/paper/expalpha_mnist/{imbalance,label_flip}_{fedavg,expalpha}
    .yaml: MNIST substitute, MLP, E = 20, alpha = 0.2, FedAvg backbone, 100 rounds; each
    file says where each value comes from), with each round's make-up fixed instead of drawn:
  (a) imbalance, ten clients a round (line 138), data.per_round.imbalance.composition:
      {1.0 x 4, 0.01 x 3, 0.1 x 3}                                  the seed's, line 138
      {1.0 x 10}, every client balanced                            the seed's, line 152
      {1.0 x 4, 0.1 x 6} and {1.0 x 4, 0.001 x 6}                   fedray's choice: the
        seed's figure has four configurations (line 138) whose other two the text does not
        give; these two are Tables 8-9's make-up (six of ten imbalanced, line 306) at a mild
        and at the seed's most severe ratio (line 136), to test "more improvement when the
        imbalance is more severe" (line 152)
  (b) label flips, six class-balanced clients a round (line 177), corrupted 4 or 2 of them
      (data.per_round.label_flip.corrupted, the deterministic rate 2/3 or 1/3, line 177),
      flip ratio 1.0 (every class wrong) or 0.1 (one class of ten), line 177: the four
      combinations ("four configurations", line 177)
  3 seeds                                                          line 150 ("three runs")
  rounds 100                                                       seed: t = 400 (lines 138,
                                                                   177); shortened as in
                                                                   section 6
The weights come from each round's participants table (output.participants: Exp-alpha's
expalpha_log_weight, and the client's drawn imbalance_ratio / label_flipped): a client's
weight is the softmax of the round's log weights, averaged per kind of client over the
round's clients of that kind, then over the rounds, then over the seeds. Proportional
aggregation gives every client its share of the round's examples (here all equal: 1/10 or
1/6).

    python jobs/paper/expalpha_mnist/fig2.py --out docs/figures/expalpha_mnist/fig2
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from common import parser, run_all  # noqa: E402
from table import curve, fmt  # noqa: E402

from fedray.tracking.client_eval import read_table  # noqa: E402

SEEDS = (0, 1, 2)
METHODS = {"proportional": "fedavg", "expalpha": "expalpha"}  # name -> job file suffix


@dataclass(frozen=True)
class Config:
    name: str
    setting: str  # imbalance | label_flip
    label: str  # as the seed writes it
    overrides: tuple[str, ...]

    @property
    def kinds(self) -> str:
        return "imbalance_ratio" if self.setting == "imbalance" else "label_flipped"


def composition_override(parts: list[tuple[float, int]]) -> str:
    """The override that fixes each round's ratios: ``[(1.0, 4), (0.1, 6)]`` is four
    balanced clients and six at ratio 0.1."""
    ratios = [r for r, n in parts for _ in range(n)]
    return "data.per_round.imbalance.composition=[" + ",".join(str(r) for r in ratios) + "]"


def _imbalance(name: str, parts: list[tuple[float, int]]) -> Config:
    label = "{" + ", ".join(f"{r:g} × {n}" for r, n in parts) + "}"
    return Config(name, "imbalance", label,
                  ("data.per_round.imbalance.ratios=[]", composition_override(parts)))


def _flip(name: str, corrupted: int, flip_ratio: float) -> Config:
    return Config(name, "label_flip", f"{corrupted} of 6 flipped, flip ratio {flip_ratio:g}",
                  ("data.per_round.label_flip.corruption=0.0",
                   f"data.per_round.label_flip.corrupted={corrupted}",
                   f"data.per_round.label_flip.flip_ratio={flip_ratio}"))


CONFIGS = (
    _imbalance("imb_seed", [(1.0, 4), (0.01, 3), (0.1, 3)]),
    _imbalance("imb_balanced", [(1.0, 10)]),
    _imbalance("imb_mild", [(1.0, 4), (0.1, 6)]),
    _imbalance("imb_severe", [(1.0, 4), (0.001, 6)]),
    _flip("flip_4_all", 4, 1.0),
    _flip("flip_2_all", 2, 1.0),
    _flip("flip_4_one", 4, 0.1),
    _flip("flip_2_one", 2, 0.1),
)


def runs(root: str, configs: list[Config], seeds: tuple[int, ...], rounds: int | None):
    for cfg in configs:
        for method, suffix in METHODS.items():
            for s in seeds:
                over = [*cfg.overrides, f"seed={s}", "output.participants=true",
                        *([f"rounds={rounds}"] if rounds else [])]
                yield (str(HERE / f"{cfg.setting}_{suffix}.yaml"), over,
                       f"{root}/{cfg.name}/{method}-s{s}", {})


def final_accuracy(run: Path) -> float:
    """The last evaluated round's test accuracy (the seed's final test accuracy)."""
    acc = curve(run)
    return acc[max(acc)]


def kind_weights(run: Path, kinds: str) -> tuple[dict[float, float], float]:
    """Each kind's mean weight (over its clients in a round, then over rounds) and the mean
    within-round coefficient of variation of the weights (how unequal a round's are)."""
    per_kind: dict[float, list[float]] = {}
    cvs = []
    for path in sorted((run / "participants").glob("round_*.arrow")):
        t = read_table(path.read_bytes())
        came = t["arrived"].to_numpy(zero_copy_only=False)
        lw = t["expalpha_log_weight"].to_numpy()[came]
        kind = t[kinds].to_numpy()[came]
        w = np.exp(lw - lw.max())
        w /= w.sum()
        cvs.append(float(w.std() / w.mean()))
        for k in np.unique(kind):
            per_kind.setdefault(float(k), []).append(float(w[kind == k].mean()))
    return {k: statistics.fmean(v) for k, v in sorted(per_kind.items())}, statistics.fmean(cvs)


def _kind_name(cfg: Config, k: float) -> str:
    if cfg.setting == "label_flip":
        return "flipped" if k else "clean"
    return f"ratio {k:g}"


def collect(root: Path, configs: list[Config], seeds: tuple[int, ...]) -> dict:
    out = {}
    for cfg in configs:
        acc = {m: [final_accuracy(root / cfg.name / f"{m}-s{s}") for s in seeds]
               for m in METHODS}
        weights, cvs = {}, []
        for s in seeds:
            kw, cv = kind_weights(root / cfg.name / f"expalpha-s{s}", cfg.kinds)
            cvs.append(cv)
            for k, v in kw.items():
                weights.setdefault(_kind_name(cfg, k), []).append(v)
        out[cfg.name] = {"label": cfg.label, "setting": cfg.setting, "seeds": list(seeds),
                         "accuracy": acc,
                         "gain": [e - p for e, p in zip(acc["expalpha"], acc["proportional"],
                                                        strict=True)],
                         "weights": weights, "weight_cv": cvs}
    return out


def report(res: dict, rounds: int) -> str:
    lines = [f"Seed 003's Fig. 2 on the MNIST substitute: {rounds} rounds, seeds "
             f"{', '.join(map(str, next(iter(res.values()))['seeds']))}; mean ± std over seeds.",
             "Weights: a client's Exp-alpha weight in its round, averaged per kind of client "
             "over rounds (proportional: 1/n each, the clients' sizes being equal).", "",
             "| configuration | proportional, final test acc | Exp-alpha, final test acc | "
             "gain per seed | Exp-alpha's mean weight per kind | within-round CV |",
             "|---|---|---|---|---|---|"]
    for r in res.values():
        gains = ", ".join(f"{g:+.4f}" for g in r["gain"])
        kinds = "; ".join(f"{k}: {fmt(v, 4)}" for k, v in r["weights"].items())
        lines.append(f"| {r['label']} | {fmt(r['accuracy']['proportional'], 4)} | "
                     f"{fmt(r['accuracy']['expalpha'], 4)} | {gains} | {kinds} | "
                     f"{fmt(r['weight_cv'], 3)} |")
    return "\n".join(lines) + "\n"


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [[r for r in res.values() if r["setting"] == s] for s in ("imbalance", "label_flip")]
    groups = [g for g in groups if g]
    fig, axes = plt.subplots(1, len(groups), figsize=(6.5 * len(groups), 4.2), squeeze=False)
    for ax, group in zip(axes[0], groups, strict=True):
        # one colour per kind of client across the panel, the most shifted first
        every = {k for r in group for k in r["weights"]}
        order = sorted(every, key=lambda k: (k != "flipped", k != "clean",
                                             float(k.split()[-1]) if k[0] == "r" else 0))
        colour = {k: f"C{i}" for i, k in enumerate(order)}
        x = 0.0
        ticks, named = [], set()
        for r in group:
            kinds = sorted(r["weights"], key=order.index)
            for i, k in enumerate(kinds):
                v = r["weights"][k]
                sd = statistics.stdev(v) if len(v) > 1 else 0.0
                ax.bar(x + i * 0.8 / len(kinds), statistics.fmean(v), 0.8 / len(kinds),
                       yerr=sd, color=colour[k], label=None if k in named else k)
                named.add(k)
            n = 10 if r["setting"] == "imbalance" else 6
            ax.hlines(1 / n, x - 0.1, x + 0.8, colors="k", linestyles=":")
            acc = r["accuracy"]
            label = r["label"].replace(", flip", ",\nflip")
            ticks.append((x + 0.35, f"{label}\nacc {statistics.fmean(acc['expalpha']):.3f} vs "
                          f"{statistics.fmean(acc['proportional']):.3f}"))
            x += 1.3
        ax.set_xticks([t for t, _ in ticks], [s for _, s in ticks], fontsize=7)
        ax.set_ylabel("Exp-alpha weight of a client (mean over rounds)")
        ax.set_title(f"{group[0]['setting'].replace('_', ' ')}: dotted = proportional 1/n; "
                     "acc: Exp-alpha vs proportional", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = parser(__doc__, "runs/paper/expalpha_mnist/fig2")
    ap.add_argument("--configs", nargs="+", choices=[c.name for c in CONFIGS],
                    help="only these configurations (run two invocations side by side on "
                    "two cores; the report is written from every configuration's runs)")
    ap.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    args = ap.parse_args()
    chosen = [c for c in CONFIGS if not args.configs or c.name in args.configs]
    seeds = tuple(args.seeds)
    run_all(runs(args.runs, chosen, seeds, args.rounds))
    if args.configs:  # a share of the work: the report needs every configuration
        return
    res = collect(Path(args.runs), list(CONFIGS), seeds)
    rounds = args.rounds or 100
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = report(res, rounds)
    (out / "fig2.md").write_text(text)
    (out / "fig2.json").write_text(json.dumps({"rounds": rounds, "configs": res}, indent=1,
                                              allow_nan=False) + "\n")
    plot(res, out / "fig2.png")
    print(text)


if __name__ == "__main__":
    main()
