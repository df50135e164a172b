"""The accuracy-vs-epsilon table of docs/privacy.md from runs of jobs/privacy/femnist_dp.yaml.

    python jobs/privacy/table.py RUN_DIR [RUN_DIR ...] [--scale 100000 1000] [--plot PNG]

One markdown row per setting, sorted by noise: its DP settings (from config.yaml), the
final pooled accuracy over every writer's test split (mean ± std when runs of several
seeds share the setting), epsilon at the run's delta (from summary.json), and the final
clip. ``--scale N K`` adds the epsilon the same noise gives
with N clients and K a round -- the same noise multiplier, and the same noise on the model
(z scaled by K / the run's clients a round, since the noise on the mean is z C / K).
"""

from __future__ import annotations

import argparse
import json

import fsspec
import numpy as np
import yaml

from fedray.privacy.accountant import default_delta, epsilon
from fedray.state.run_dir import read_metrics


def _read(run_dir: str) -> tuple[dict, dict, dict]:
    """(config, summary, the last eval round's metrics)."""
    base = run_dir.rstrip("/")
    with fsspec.open(f"{base}/config.yaml", "rt") as f:
        cfg = yaml.safe_load(f)
    with fsspec.open(f"{base}/summary.json", "rt") as f:
        summary = json.load(f)
    last = [m for m in read_metrics(run_dir) if "fed_test_accuracy" in m][-1]
    return cfg, summary, last


def row(run_dir: str, scale: tuple[int, int] | None
        ) -> tuple[tuple, float, float | None, list[str]]:
    """(the run's setting, its final accuracy, its epsilon (None without DP), the setting's
    cells but accuracy): runs that differ only in their seed share a setting, and their
    epsilon (the same accountant)."""
    cfg, summary, last = _read(run_dir)
    algo = cfg["algorithm"]
    dp = summary.get("stages", {}).get("dp")
    rounds = last["round"]
    acc = last["fed_test_accuracy"]
    if dp is not None and dp["noise_multiplier"] == 0 and dp["clip"] >= 1e8:
        dp = None  # the job's dp stage, neither clipping nor noising: FedAvg (uniform)
    if dp is None:
        cells = ["no DP", "-", "-", "-", "-"] + (["-", "-"] if scale else [])
        return (-1.0, False, ""), acc, None, cells
    z = dp["noise_multiplier"]
    quantile = algo["dp"].get("target_quantile")
    clip = f"adaptive, γ = {quantile}" if quantile is not None else "fixed"
    cells = [f"z = {z:g}", clip, f"{algo['dp']['clip']:g} → {dp['clip']:.3g}",
             f"{dp['epsilon']:.3g}", f"{dp['delta']:.2g}"]
    if quantile is not None:
        cells[2] = f"{algo['dp']['clip']:g} → ~{dp['clip']:.2g}"  # differs a little by seed
    if scale:
        n, k = scale
        same_z = epsilon(z, rounds, default_delta(n), sampling="poisson", population=n,
                         clients_per_round=k)
        same_noise = epsilon(z * k / cfg["sampling"]["clients_per_round"], rounds,
                             default_delta(n), sampling="poisson", population=n,
                             clients_per_round=k)
        cells += [f"{same_z:.3g}", f"{same_noise:.3g}"]
    return (z, quantile is not None, clip), acc, dp["epsilon"], cells


def _accuracy(accs: list[float]) -> str:
    """The mean, with the standard deviation over seeds when there are several."""
    if len(accs) == 1:
        return f"{accs[0]:.3f} (1 seed)"
    return f"{np.mean(accs):.3f} ± {np.std(accs, ddof=1):.3f} ({len(accs)} seeds)"


def plot(settings: dict[tuple, tuple[list[float], list[str]]], eps: dict[tuple, float],
         path: str) -> None:
    """Final accuracy against epsilon (log scale), fixed and adaptive clipping apart (the
    mean over seeds, a bar for their spread), with no DP and clipping alone as horizontal
    lines: where DP costs accuracy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    curves: dict[str, list[tuple[float, float, float, float]]] = {"fixed C": [],
                                                                   "adaptive C": []}
    for key, (accs, _) in settings.items():
        z, adaptive, _ = key
        mean = float(np.mean(accs))
        if z < 0:
            ax.axhline(mean, color="black", ls="--", lw=1, label=f"no DP ({mean:.3f})")
        elif z == 0:
            ax.axhline(mean, color="grey", ls=":", lw=1, label=f"clipping only ({mean:.3f})")
        else:
            spread = float(np.std(accs, ddof=1)) if len(accs) > 1 else 0.0
            curves["adaptive C" if adaptive else "fixed C"].append((eps[key], mean, spread, z))
    for (name, pts), marker in zip(curves.items(), ("o", "s"), strict=True):
        pts.sort()
        if pts:
            ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts],
                        marker=marker, capsize=3, label=name)
            for e, a, _, z in pts:
                ax.annotate(f"z={z:g}", (e, a), textcoords="offset points", xytext=(4, 4),
                            fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("epsilon after the run (rdp; delta in the table)")
    ax.set_ylabel("final pooled accuracy (mean over seeds, ± std)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title("DP-FedAvg on the LEAF FEMNIST sample: accuracy against epsilon", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=130)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--scale", nargs=2, type=int, metavar=("N", "K"),
                    help="also the epsilon at N clients, K a round")
    ap.add_argument("--plot", metavar="PNG", help="also draw accuracy against epsilon")
    args = ap.parse_args()
    head = ["noise", "clipping", "clip C (start → end)", "final accuracy", "epsilon",
            "delta"]
    if args.scale:
        n, k = args.scale
        head += [f"epsilon, same z, N={n:,} K={k:,}", f"epsilon, same noise on the model, "
                 f"N={n:,} K={k:,}"]
    settings: dict[tuple, tuple[list[float], list[str]]] = {}
    eps: dict[tuple, float] = {}
    for run in args.runs:
        key, acc, spent, cells = row(run, args.scale)
        settings.setdefault(key, ([], cells))[0].append(acc)
        if spent is not None:
            eps[key] = spent
    if args.plot:
        plot(settings, eps, args.plot)
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for key in sorted(settings):
        accs, cells = settings[key]
        print("| " + " | ".join(cells[:3] + [_accuracy(accs)] + cells[3:]) + " |")


if __name__ == "__main__":
    main()
