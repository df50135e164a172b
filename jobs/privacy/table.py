"""The accuracy-vs-epsilon table of docs/privacy.md from runs of jobs/privacy/femnist_dp.yaml.

    python jobs/privacy/table.py RUN_DIR [RUN_DIR ...] [--scale 100000 1000] [--plot PNG]

One markdown row per run, sorted by noise: its DP settings (from config.yaml), the final
pooled accuracy over every writer's test split, epsilon at the run's delta (from
summary.json), and the final clip. ``--scale N K`` adds the epsilon the same noise gives
with N clients and K a round -- the same noise multiplier, and the same noise on the model
(z scaled by K / the run's clients a round, since the noise on the mean is z C / K).
"""

from __future__ import annotations

import argparse
import json

import fsspec
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


def row(run_dir: str, scale: tuple[int, int] | None) -> tuple[float, list[str]]:
    cfg, summary, last = _read(run_dir)
    algo = cfg["algorithm"]
    dp = summary.get("stages", {}).get("dp")
    rounds = last["round"]
    if dp is not None and dp["noise_multiplier"] == 0 and dp["clip"] >= 1e8:
        dp = None  # the job's dp stage, neither clipping nor noising: FedAvg (uniform)
    if dp is None:
        cells = ["no DP", "-", "-", f"{last['fed_test_accuracy']:.3f}", "-", "-"]
        return -1.0, cells + (["-", "-"] if scale else [])
    z = dp["noise_multiplier"]
    clip = ("adaptive, q = " f"{algo['dp']['target_quantile']}"
            if algo["dp"].get("target_quantile") is not None else "fixed")
    cells = [f"z = {z:g}", clip, f"{algo['dp']['clip']:g} → {dp['clip']:.3g}",
             f"{last['fed_test_accuracy']:.3f}", f"{dp['epsilon']:.3g}",
             f"{dp['delta']:.2g}"]
    if scale:
        n, k = scale
        same_z = epsilon(z, rounds, default_delta(n), sampling="poisson", population=n,
                         clients_per_round=k)
        same_noise = epsilon(z * k / cfg["sampling"]["clients_per_round"], rounds,
                             default_delta(n), sampling="poisson", population=n,
                             clients_per_round=k)
        cells += [f"{same_z:.3g}", f"{same_noise:.3g}"]
    return z, cells


def plot(runs: list[str], path: str) -> None:
    """Final accuracy against epsilon (log scale), fixed and adaptive clipping apart, with
    the run without DP and clipping alone as horizontal lines: where DP costs accuracy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points: dict[str, list[tuple[float, float, float]]] = {"fixed C": [], "adaptive C": []}
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for run in runs:
        cfg, summary, last = _read(run)
        dp = summary.get("stages", {}).get("dp")
        acc = last["fed_test_accuracy"]
        if dp is None or (dp["noise_multiplier"] == 0 and dp["clip"] >= 1e8):
            ax.axhline(acc, color="black", ls="--", lw=1, label=f"no DP ({acc:.3f})")
        elif dp["noise_multiplier"] == 0:
            ax.axhline(acc, color="grey", ls=":", lw=1,
                       label=f"clipping only, C = {dp['clip']:g} ({acc:.3f})")
        else:
            kind = ("adaptive C" if cfg["algorithm"]["dp"].get("target_quantile") is not None
                    else "fixed C")
            points[kind].append((dp["epsilon"], acc, dp["noise_multiplier"]))
    for (kind, pts), marker in zip(points.items(), ("o", "s"), strict=True):
        pts.sort()
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, label=kind)
            for e, a, z in pts:
                ax.annotate(f"z={z:g}", (e, a), textcoords="offset points", xytext=(4, 4),
                            fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("epsilon after the run (rdp; delta in the table)")
    ax.set_ylabel("final pooled accuracy")
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
    if args.plot:
        plot(args.runs, args.plot)
    head = ["noise", "clipping", "clip C (start → end)", "final accuracy", "epsilon",
            "delta"]
    if args.scale:
        n, k = args.scale
        head += [f"epsilon, same z, N={n:,} K={k:,}", f"epsilon, same noise on the model, "
                 f"N={n:,} K={k:,}"]
    rows = sorted((row(r, args.scale) for r in args.runs), key=lambda t: t[0])
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for _, cells in rows:
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
