"""Seed 004's simulated quadratics: SGD vs FedAvg vs SCAFFOLD as G and K grow.

The construction is ours (the paper's exact one was not available offline); it has the
paper's three knobs. N = 2 clients, w in R^2, f_i(w) = 1/2 sum_j a_ij (w_j - u_ij)^2 and
f = (f_1 + f_2) / 2:
- smoothness beta = 1: f's curvatures are lambda = (1, 0.1) (one stiff, one flat direction);
- Hessian dissimilarity delta = 1: a_1j = lambda_j (1 + delta/2), a_2j = lambda_j (1 - delta/2),
  so the clients' Hessians differ by delta * lambda_j <= delta * beta;
- gradient dissimilarity G: u_ij is placed so that the optimum of f is w* = 0 and
  grad f_1(w*) = -grad f_2(w*) = (G/sqrt 2)(1, 1), whose norm is G.
Each client holds two points (x = sqrt(2 a_ij) e_j, y = x u_ij), so fedray's mse loss on them
is exactly f_i; the evaluation set (x = sqrt(2 lambda_j) e_j, y = 0) makes test_loss exactly
the optimality gap f(w) - f(w*), which float32 resolves down to 1e-10 even when G = 100.
Full batch, no sampling, w starts at (1, 1), server lr 1: nothing is random, so one seed is
the whole story. SGD is fedsgd (one full-batch step per round). Each method gets each
client lr of a small grid, and the best (fewest rounds to the target gap) is reported.

    python jobs/paper/quadratics/run.py --out docs/figures/quadratics
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from common import parser, run_all  # noqa: E402

LAMBDA = np.array([1.0, 0.1])
DELTA = 1.0
GS = (1, 10, 100)
KS = (2, 10)
LRS = (0.03, 0.1, 0.3, 1.0, 1.5)
TARGET = 1e-6  # optimality gap; the start's gap is 0.55
METHODS = {"fedsgd": "SGD", "fedavg": "FedAvg", "scaffold": "SCAFFOLD"}


def make_clients(G: float) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """The two clients' (x [2, 2], y [2]) for gradient dissimilarity G."""
    g = G / math.sqrt(2.0)
    clients = {}
    for i, (sign, scale) in enumerate(((1.0, 1 + DELTA / 2), (-1.0, 1 - DELTA / 2))):
        a = LAMBDA * scale
        u = -sign * g / a  # grad f_i(0) = a * (0 - u) = sign * g
        x = np.diag(np.sqrt(2.0 * a))
        clients[i] = (x.astype(np.float32), (np.sqrt(2.0 * a) * u).astype(np.float32))
    return clients


def gap_set() -> tuple[np.ndarray, np.ndarray]:
    """Points whose mean mse loss at w is f(w) - f(w*) = 1/2 sum_j lambda_j w_j^2."""
    return np.diag(np.sqrt(2.0 * LAMBDA)).astype(np.float32), np.zeros(2, dtype=np.float32)


def linear_factory():
    """A model factory (a closure, shipped by value) for w.x without bias, started at (1, 1)."""
    def model_fn():
        import torch
        from torch import nn

        model = nn.Linear(2, 1, bias=False)
        with torch.no_grad():
            model.weight.fill_(1.0)
        return model
    return model_fn


def run_dir(runs_dir: str, method: str, G: int, K: int, lr: float) -> str:
    return f"{runs_dir}/{method}/G{G}-K{K}-lr{lr}" if method != "fedsgd" else \
        f"{runs_dir}/fedsgd/G{G}-lr{lr}"


def plan(runs_dir: str, rounds: int | None) -> list:
    job, runs = str(HERE / "quadratics.yaml"), []
    extra = [] if rounds is None else [f"rounds={rounds}"]
    for G in GS:
        kwargs = {"model_fn": linear_factory(), "client_data": make_clients(G),
                  "test_data": gap_set()}
        for method in METHODS:
            for K in (KS if method != "fedsgd" else (1,)):
                for lr in LRS:
                    runs.append((job, [f"algorithm.name={method}", f"client.local_steps={K}",
                                       f"client.lr={lr}", *extra],
                                 run_dir(runs_dir, method, G, K, lr), kwargs))
    return runs


def curve(path: str) -> np.ndarray:
    """The gap after each round (index 0 = round 1); nan/inf kept as inf."""
    with open(os.path.join(path, "metrics.jsonl")) as f:
        vals = [m.get("test_loss") for m in map(json.loads, f)]
    return np.array([np.inf if v is None or not np.isfinite(v) else v for v in vals])


def rounds_to(gaps: np.ndarray) -> int | None:
    hit = np.flatnonzero(gaps <= TARGET)
    return int(hit[0]) + 1 if len(hit) else None


def best(runs_dir: str) -> dict[tuple[str, int, int], dict]:
    """Per (method, G, K): the grid lr with the fewest rounds to the target (else the lowest
    final gap), its rounds and its curve. SGD takes one step per round: its K is 1."""
    out = {}
    for method in METHODS:
        for G in GS:
            for K in (KS if method != "fedsgd" else (1,)):
                curves = {lr: curve(run_dir(runs_dir, method, G, K, lr)) for lr in LRS}

                def key(lr: float, curves: dict = curves) -> tuple:
                    r = rounds_to(curves[lr])
                    return (0, r, 0.0) if r is not None else (1, 0, float(curves[lr][-1]))
                lr = min(LRS, key=key)
                out[method, G, K] = {"lr": lr, "rounds": rounds_to(curves[lr]),
                                     "curve": curves[lr]}
    return out


def summarize(runs_dir: str, out: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = best(runs_dir)
    fig, axes = plt.subplots(1, len(KS), figsize=(12, 4.5), sharey=True)
    colors = {"fedsgd": "black", "fedavg": "tab:red", "scaffold": "tab:blue"}
    styles = {1: ":", 10: "--", 100: "-"}
    for ax, K in zip(axes, KS, strict=True):
        for (method, G, k), res in results.items():
            if k not in (1, K):  # SGD (k = 1) is drawn on both panels
                continue
            c = res["curve"]
            ax.semilogy(np.arange(1, len(c) + 1), np.clip(c, 1e-12, 1e3), color=colors[method],
                        linestyle=styles[G], linewidth=1.3,
                        label=f"{METHODS[method]}, G={G} (lr {res['lr']:g})")
        ax.axhline(TARGET, color="grey", linewidth=0.8)
        ax.set_title(f"K = {K} local steps (SGD: 1 step per round)")
        ax.set_xlabel("round")
        ax.legend(fontsize=7, ncol=1)
    axes[0].set_ylabel("optimality gap f(w) - f(w*)")
    fig.suptitle("Simulated quadratics: N = 2 full-batch clients, delta = 1, beta = 1, best lr")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "gap.png"), dpi=110)
    plt.close(fig)
    lines = [f"| method | G | K | best client lr | rounds to gap <= {TARGET:g} | gap after the "
             "last round |", "|---|---|---|---|---|---|"]
    data = []
    for (method, G, K), res in sorted(results.items(), key=lambda kv: (kv[0][2], *kv[0][:2])):
        r, last = res["rounds"], float(res["curve"][-1])
        k = K if method != "fedsgd" else "-"
        data.append({"method": METHODS[method], "G": G, "K": k, "lr": res["lr"], "rounds": r,
                     "final_gap": last})
        lines.append(f"| {METHODS[method]} | {G} | {k} | {res['lr']:g} | "
                     f"{r if r is not None else 'not reached'} | {last:.3g} |")
    with open(os.path.join(out, "quadratics.json"), "w") as f:
        json.dump(data, f, indent=1)
    table = "\n".join(lines)
    with open(os.path.join(out, "quadratics.md"), "w") as f:
        f.write(f"# Simulated quadratics: rounds to an optimality gap of {TARGET:g}\n\n"
                f"{table}\n\n![gap](gap.png)\n")
    return table


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, "runs/paper/quadratics")
    args = p.parse_args(argv)
    runs_dir = os.path.abspath(args.runs)
    run_all(plan(runs_dir, args.rounds))
    os.makedirs(args.out, exist_ok=True)
    print(summarize(runs_dir, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
