"""Seed 001's toy: client drift from one outlier client, as local steps (tau) grow.

M = 10 clients, each with 50 points per class in 2-D: class 0 ~ N((0,0), I/4) everywhere,
class 1 ~ N((1,1), I/4) on the 9 regular clients and N((4,4), I/4) on the outlier. A
perceptron sigma(s.x + b) with BCE; the slope s is frozen at the centralized optimum (s*, b*)
of the global objective, so only the bias is trained, from b = 0. Every round trains two
clients: the outlier (``sampling.always``) and one regular client drawn at random. Full batch,
lr 0.2, tau local steps. The tracked quantity is the global objective, the mean BCE over all
1,000 points (the evaluation set is the union of the clients' data), and its plateau is its
mean over the last 20 rounds.

Why a script: the data and the frozen slope are derived here and passed to fedray.run as
in-memory clients and a model factory; the FL part is the ordinary fedray runtime.

    python jobs/paper/toy/run.py --out docs/figures/toy
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from common import parser, run_all  # noqa: E402

M, PER_CLASS, OUTLIER = 10, 50, 9
TAUS = (10, 50, 300, 1000)
PROX_TAU = 3000
PLATEAU_ROUNDS = 20


def make_clients(seed: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """The M clients' (x [100, 2] float32, y [100] float32 in {0, 1}); client 9 is the outlier."""
    g = np.random.default_rng([seed, 1])
    clients = {}
    for c in range(M):
        mean1 = (4.0, 4.0) if c == OUTLIER else (1.0, 1.0)
        x0 = g.normal((0.0, 0.0), 0.5, size=(PER_CLASS, 2))  # std 0.5: covariance I/4
        x1 = g.normal(mean1, 0.5, size=(PER_CLASS, 2))
        x = np.concatenate([x0, x1]).astype(np.float32)
        y = np.repeat(np.array([0.0, 1.0], dtype=np.float32), PER_CLASS)
        clients[c] = (x, y)
    return clients


def pooled(clients: dict[int, tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """All clients' points together: the global objective's data and the evaluation set."""
    return (np.concatenate([clients[c][0] for c in range(M)]),
            np.concatenate([clients[c][1] for c in range(M)]))


def centralized_optimum(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float, float]:
    """(s*, b*, f*) of the mean BCE over all points, by Newton's method in float64."""
    a = np.concatenate([x.astype(np.float64), np.ones((len(x), 1))], axis=1)
    y = y.astype(np.float64)
    w = np.zeros(3)
    for _ in range(100):
        p = 1.0 / (1.0 + np.exp(-a @ w))
        grad = a.T @ (p - y) / len(y)
        hess = (a * (p * (1 - p))[:, None]).T @ a / len(y)
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.abs(step).max() < 1e-12:
            break
    z = a @ w
    f = float(np.mean(np.logaddexp(0.0, z) - y * z))
    return w[:2], float(w[2]), f


def perceptron_factory(slope: np.ndarray):
    """A model factory (a closure, so Ray ships it by value) for sigma(slope.x + b)."""
    def model_fn():
        import torch
        from torch import nn

        class FrozenSlopePerceptron(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.register_buffer("slope", torch.tensor(slope, dtype=torch.float32))
                self.bias = nn.Parameter(torch.zeros(1))

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return x @ self.slope + self.bias

        return FrozenSlopePerceptron()
    return model_fn


def plan(runs_dir: str, seeds: list[int], rounds: int | None) -> list:
    runs = []
    extra = [] if rounds is None else [f"rounds={rounds}"]
    for seed in seeds:
        clients = make_clients(seed)
        x, y = pooled(clients)
        slope, _, _ = centralized_optimum(x, y)
        kwargs = {"model_fn": perceptron_factory(slope), "client_data": clients,
                  "test_data": (x, y)}
        for tau in TAUS:
            runs.append((str(HERE / "fedavg.yaml"), [f"seed={seed}", f"client.local_steps={tau}",
                                                     *extra],
                         f"{runs_dir}/tau{tau}/fedavg-s{seed}", kwargs))
        for alg in ("fedavg", "fedprox"):
            runs.append((str(HERE / f"{alg}.yaml"),
                         [f"seed={seed}", f"client.local_steps={PROX_TAU}", *extra],
                         f"{runs_dir}/tau{PROX_TAU}/{alg}-s{seed}", kwargs))
    return runs


def plateau(run_dir: str) -> float:
    """Mean global loss over the last PLATEAU_ROUNDS evaluated rounds."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        losses = [m["test_loss"] for m in map(json.loads, f) if "test_loss" in m]
    return float(np.mean(losses[-PLATEAU_ROUNDS:]))


def summarize(runs_dir: str, seeds: list[int]) -> tuple[str, dict]:
    optimum = {s: centralized_optimum(*pooled(make_clients(s))) for s in seeds}
    rows = [(f"FedAvg, tau {t}", [f"{runs_dir}/tau{t}/fedavg-s{s}" for s in seeds]) for t in TAUS]
    rows += [(f"{name}, tau {PROX_TAU}", [f"{runs_dir}/tau{PROX_TAU}/{alg}-s{s}" for s in seeds])
             for alg, name in (("fedavg", "FedAvg"), ("fedprox", "FedProx (mu 0.1)"))]
    fstar = np.array([optimum[s][2] for s in seeds])
    lines = [f"| method | plateau loss (mean of the last {PLATEAU_ROUNDS} rounds) | gap to the "
             f"optimum f* | per seed |", "|---|---|---|---|"]
    data: dict = {"f_star": fstar.tolist(), "seeds": seeds, "rows": {}}
    for label, dirs in rows:
        p = np.array([plateau(d) for d in dirs])
        gap = p - fstar
        lines.append(f"| {label} | {p.mean():.4f} ± {p.std():.4f} | {gap.mean():.4f} ± "
                     f"{gap.std():.4f} | {', '.join(f'{v:.4f}' for v in p)} |")
        data["rows"][label] = {"plateau": p.tolist(), "gap": gap.tolist()}
    lines.append(f"| centralized optimum f* | {fstar.mean():.4f} ± {fstar.std():.4f} | 0 | "
                 f"{', '.join(f'{v:.4f}' for v in fstar)} |")
    return "\n".join(lines), data


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, "runs/paper/toy")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = p.parse_args(argv)
    runs_dir = os.path.abspath(args.runs)
    run_all(plan(runs_dir, args.seeds, args.rounds))

    from fedray.tracking.report import build_report

    os.makedirs(args.out, exist_ok=True)
    runs_dir = args.runs.rstrip("/")  # as given, so the reports name the runs as the user did
    build_report([f"{runs_dir}/tau{t}/fedavg-s{s}" for t in TAUS for s in args.seeds],
                 os.path.join(args.out, "tau"), metric="test_loss",
                 group_by="client.local_steps",
                 title="Toy: FedAvg global loss vs rounds, by local steps tau (3 seeds)")
    build_report([f"{runs_dir}/tau{PROX_TAU}/{a}-s{s}" for a in ("fedavg", "fedprox")
                  for s in args.seeds], os.path.join(args.out, "prox"), metric="test_loss",
                 group_by="algorithm.name",
                 title=f"Toy: FedAvg vs FedProx (mu 0.1) at tau {PROX_TAU}")
    table, data = summarize(runs_dir, args.seeds)
    with open(os.path.join(args.out, "plateau.md"), "w") as f:
        f.write(f"# Toy: plateau of the global loss\n\n{table}\n")
    with open(os.path.join(args.out, "plateau.json"), "w") as f:
        json.dump(data, f, indent=1)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
