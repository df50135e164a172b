"""Seed 001's toy: client drift from one outlier client, as local steps (tau) grow.

Every setting and where it comes from (seed 001 = ../shared/seeds/001_eaef941d18240f45.txt):
  50 points per class per client, 2-D                          seed 001 line 55
  class 0 ~ N((0,0), I/4) on every client                      line 55
  class 1 ~ N((1,1), I/4), outlier (last client) N((4,4), I/4) line 55
  test set: generated the same way, 10 points per class         line 55 (per client: our reading)
  perceptron, binary cross-entropy                             lines 55-57
  slope frozen at the value the construction makes optimal,    line 59; the separator's direction
    only the bias trained                                        is perpendicular to (1, 1); its
                                                                 scale, w = (1, 1), is fedray's
                                                                 choice (it gives the seed's
                                                                 L ~ 0.19, zeta ~ 0.41, l. 90, 95)
  full-batch local gradient descent (sigma = 0)                line 30
  client lr 0.2                                                line 59
  tau in {10, 50, 300, 1000}                                   line 59
  iid baseline: tau 1000, the same points shuffled over the   line 59
    clients
  FedAvg vs FedProx at tau 3000, mu 0.1                        line 65
  2 clients per round: the outlier + one of the others        line 67
  server step x + mean of the deltas (server lr 1)             appendix Alg. 1, line 155
  M = 10 clients                                               fedray's choice (M is left open)
  initial bias 1.0                                             fedray's choice: puts D = |b0 - b*|
                                                                 near the seed's D ~ 2 (line 95)
  rounds (50; 25 for tau >= 1000), plateau window              fedray's choice (the seed gives none)
Bound analysis (eq. 2, line 32; zeta eq. 3, line 41; L and D, line 95): computed here in float64
from the data, for the bias, the only trained parameter.

Why a script: the data and the frozen slope are built here and passed to fedray.run as in-memory
clients and a model factory; the FL part is the ordinary fedray runtime. A callback records the
global bias after every round (bias.json in the run directory), from which the final separators
(the seed's Fig. 2 center), the global objective and the gradient divergence of its Fig. 2
(right) are computed exactly.

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

from fedray.tracking.callbacks import Callback  # noqa: E402

M, PER_CLASS, TEST_PER_CLASS, OUTLIER = 10, 50, 10, 9
SLOPE = np.array([1.0, 1.0])  # perpendicular to the class means' diagonal (line 59); scale: ours
B0 = 1.0  # initial bias: fedray's choice, D = |B0 - b*| ~ 2 as line 95 reports
ETA = 0.2
TAUS = (10, 50, 300, 1000)
IID_TAU = 1000
PROX_TAU = 3000
LONG_TAU, LONG_ROUNDS = 1000, 25  # tau >= LONG_TAU runs 25 rounds (2-core budget), others 50
PLATEAU_ROUNDS = 10
Clients = dict[int, tuple[np.ndarray, np.ndarray]]


def _draw(g: np.random.Generator, per_class: int, outlier: bool) -> tuple[np.ndarray, np.ndarray]:
    mean1 = (4.0, 4.0) if outlier else (1.0, 1.0)
    x0 = g.normal((0.0, 0.0), 0.5, size=(per_class, 2))  # std 0.5: variance 1/4 (line 55)
    x1 = g.normal(mean1, 0.5, size=(per_class, 2))
    y = np.repeat(np.array([0.0, 1.0], dtype=np.float32), per_class)
    return np.concatenate([x0, x1]).astype(np.float32), y


def make_clients(seed: int) -> Clients:
    """The M clients' (x [100, 2] float32, y [100] float32 in {0, 1}); client 9 is the outlier."""
    g = np.random.default_rng([seed, 1])
    return {c: _draw(g, PER_CLASS, c == OUTLIER) for c in range(M)}


def make_test(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The test set, drawn like the training clients but 10 points per class each (line 55),
    pooled: 200 points, the outlier's distribution included. Its own stream, so the training
    data are those of make_clients whatever the test set."""
    g = np.random.default_rng([seed, 2])
    parts = [_draw(g, TEST_PER_CLASS, c == OUTLIER) for c in range(M)]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def iid_clients(clients: Clients, seed: int) -> Clients:
    """The same training points shuffled uniformly over the M clients (line 59's iid baseline)."""
    x, y = pooled(clients)
    order = np.random.default_rng([seed, 3]).permutation(len(y))
    return {c: (x[idx], y[idx]) for c, idx in enumerate(np.array_split(order, M))}


def pooled(clients: Clients) -> tuple[np.ndarray, np.ndarray]:
    """All clients' points together: the data of the global objective F = mean of the F_i."""
    return (
        np.concatenate([clients[c][0] for c in range(M)]),
        np.concatenate([clients[c][1] for c in range(M)]),
    )


def _logits(x: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[len(b), n] logits of the frozen-slope perceptron, in float64."""
    return (x.astype(np.float64) @ SLOPE)[None, :] + np.asarray(b, np.float64).reshape(-1, 1)


def objective(x: np.ndarray, y: np.ndarray, b) -> np.ndarray:
    """Mean BCE at each bias in b (the clients hold equal counts, so F = mean of the F_i)."""
    z = _logits(x, b)
    return np.mean(np.logaddexp(0.0, z) - y.astype(np.float64) * z, axis=1)


def bias_grad(x: np.ndarray, y: np.ndarray, b) -> np.ndarray:
    """dF/db at each bias in b: mean(sigmoid(z) - y)."""
    return np.mean(1.0 / (1.0 + np.exp(-_logits(x, b))) - y.astype(np.float64), axis=1)


def bias_curvature(x: np.ndarray, y: np.ndarray, b) -> np.ndarray:
    """d2F/db2 at each bias in b: mean(p (1 - p)), the Hessian of the trained parameter."""
    p = 1.0 / (1.0 + np.exp(-_logits(x, b)))
    return np.mean(p * (1.0 - p), axis=1)


def bias_optimum(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(b*, F(b*)) with the slope frozen, by Newton's method (F is strictly convex in b)."""
    b = 0.0
    for _ in range(100):
        step = float(bias_grad(x, y, b)[0] / bias_curvature(x, y, b)[0])
        b -= step
        if abs(step) < 1e-13:
            break
    return b, float(objective(x, y, b)[0])


def divergence(clients: Clients, b) -> np.ndarray:
    """max_i |dF_i/db - dF/db| at each bias in b: the seed's gradient dissimilarity (line 88)."""
    g = bias_grad(*pooled(clients), b)
    return np.max([np.abs(bias_grad(*clients[c], b) - g) for c in range(M)], axis=0)


GRID = np.linspace(-30.0, 30.0, 6001)  # sup over b, step 0.01: both vanish beyond |b| ~ 15


def bound_constants(clients: Clients) -> dict:
    """zeta (eq. 3, line 41: max_i sup_b |F_i' - F'|), L (line 95: max_b F''), D (line 95:
    |b(0) - b*|) and b*, f* of the global objective."""
    x, y = pooled(clients)
    b_star, f_star = bias_optimum(x, y)
    return {
        "zeta": float(divergence(clients, GRID).max()),
        "L": float(bias_curvature(x, y, GRID).max()),
        "L_clients": float(max(bias_curvature(*clients[c], GRID).max() for c in range(M))),
        "D": abs(B0 - b_star),
        "b_star": b_star,
        "f_star": f_star,
    }


def sampled_optimum(clients: Clients) -> float:
    """F(b_w) - F(b*), where b_w minimises what line 67's sampling averages in expectation:
    half the outlier's objective plus half the mean of the others'. Small-tau FedAvg tends to
    b_w, not b*, since the outlier is in every round (the appendix's assumption 4 is not met)."""
    x, y = pooled(clients)
    xo, yo = clients[OUTLIER]
    xr = np.concatenate([clients[c][0] for c in range(M) if c != OUTLIER])
    yr = np.concatenate([clients[c][1] for c in range(M) if c != OUTLIER])
    b = 0.0
    for _ in range(100):
        g = 0.5 * bias_grad(xo, yo, b)[0] + 0.5 * bias_grad(xr, yr, b)[0]
        h = 0.5 * bias_curvature(xo, yo, b)[0] + 0.5 * bias_curvature(xr, yr, b)[0]
        b -= g / h
    return float(objective(x, y, b)[0] - bias_optimum(x, y)[1])


def bound(tau: int, T: int, c: dict, zeta: float | None = None) -> tuple[float, float]:
    """Eq. 2 (line 32), 18 tau^2 eta^2 L zeta^2, and its finite-T form with D^2 / (2 eta tau T)
    added (line 90, with the seed's misplaced '+' read as a product)."""
    z = c["zeta"] if zeta is None else zeta
    limit = 18 * tau**2 * ETA**2 * c["L"] * z**2
    return limit, c["D"] ** 2 / (2 * ETA * tau * T) + limit


def perceptron_factory(slope: np.ndarray, bias: float = B0):
    """A model factory (a closure, so Ray ships it by value) for sigmoid(slope.x + b)."""

    def model_fn():
        import torch
        from torch import nn

        class FrozenSlopePerceptron(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.register_buffer("slope", torch.tensor(slope, dtype=torch.float32))
                self.bias = nn.Parameter(torch.full((1,), float(bias)))

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return x @ self.slope + self.bias

        return FrozenSlopePerceptron()

    return model_fn


class BiasTrace(Callback):
    """Writes the global bias after every round to bias.json in the run directory."""

    needs_weights = True

    def __init__(self) -> None:
        self.run_dir = ""
        self.biases: list[float] = []

    def on_run_start(self, run) -> None:
        self.run_dir = run.run_dir

    def on_round_end(self, round: int, metrics: dict, weights) -> None:
        self.biases.append(float(weights["bias"].item()))

    def on_run_end(self, summary: dict) -> None:
        with open(os.path.join(self.run_dir, "bias.json"), "w") as f:
            json.dump(self.biases, f)


def plan(runs_dir: str, seeds: list[int], rounds: int | None) -> list:
    runs = []

    def add(job: str, seed: int, tau: int, out: str, clients: Clients, name: str | None = None):
        r = rounds if rounds is not None else (LONG_ROUNDS if tau >= LONG_TAU else None)
        extra = ([] if r is None else [f"rounds={r}"]) + ([] if name is None else [f"name={name}"])
        kwargs = {
            "model_fn": perceptron_factory(SLOPE),
            "client_data": clients,
            "test_data": make_test(seed),
            "callbacks": [BiasTrace()],
        }
        runs.append(
            (str(HERE / job), [f"seed={seed}", f"client.local_steps={tau}", *extra], out, kwargs)
        )

    for seed in seeds:
        clients = make_clients(seed)
        for tau in TAUS:
            add("fedavg.yaml", seed, tau, f"{runs_dir}/tau{tau}/fedavg-s{seed}", clients)
        add(
            "fedavg.yaml",
            seed,
            IID_TAU,
            f"{runs_dir}/iid/fedavg-s{seed}",
            iid_clients(clients, seed),
            name="toy_fedavg_iid",
        )
        for alg in ("fedavg", "fedprox"):
            add(f"{alg}.yaml", seed, PROX_TAU, f"{runs_dir}/tau{PROX_TAU}/{alg}-s{seed}", clients)
    return runs


def _test_losses(run_dir: str) -> list[float]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [m["test_loss"] for m in map(json.loads, f) if "test_loss" in m]


def _biases(run_dir: str) -> np.ndarray:
    with open(os.path.join(run_dir, "bias.json")) as f:
        return np.array(json.load(f))


ROWS = [(f"FedAvg, tau {t}", f"tau{t}/fedavg", t, False) for t in TAUS] + [
    (f"FedAvg iid, tau {IID_TAU}", "iid/fedavg", IID_TAU, True),
    (f"FedAvg, tau {PROX_TAU}", f"tau{PROX_TAU}/fedavg", PROX_TAU, False),
    (f"FedProx (mu 0.1), tau {PROX_TAU}", f"tau{PROX_TAU}/fedprox", PROX_TAU, False),
]


def ms(v) -> str:
    """Mean ± population std over seeds, as the toy's tables print it."""
    v = np.asarray(v, dtype=float)
    return f"{v.mean():.4g} ± {v.std():.2g}"


def summarize(runs_dir: str, seeds: list[int]) -> tuple[str, dict]:
    """Per row, mean ± std over seeds of: the test-loss plateau, the gap F(b) - F(b*) of the
    global (training) objective over the same window, the largest gradient divergence seen
    after a round (the seed's empirical zeta, line 90), and eq. 2's bound."""
    data: dict = {"seeds": seeds, "plateau_rounds": PLATEAU_ROUNDS, "constants": {}, "rows": {}}
    consts = {s: bound_constants(make_clients(s)) for s in seeds}
    iid_consts = {s: bound_constants(iid_clients(make_clients(s), s)) for s in seeds}
    for s in seeds:
        data["constants"][s] = {
            **consts[s],
            "sampled_floor": sampled_optimum(make_clients(s)),
            "zeta_iid": iid_consts[s]["zeta"],
            "test_loss_at_b_star": float(objective(*make_test(s), consts[s]["b_star"])[0]),
        }

    lines = [
        f"| run | test loss, plateau (last {PLATEAU_ROUNDS} rounds) | gap F - F* (train "
        "objective, same window) | largest divergence after a round | eq. 2 bound "
        "18 tau^2 eta^2 L zeta^2 (zeta of eq. 3) | same, empirical zeta | bound / gap |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, sub, tau, iid in ROWS:
        plat, gap, div, lim, lim_emp = [], [], [], [], []
        for s in seeds:
            d = f"{runs_dir}/{sub}-s{s}"
            c = (iid_consts if iid else consts)[s]
            cl = iid_clients(make_clients(s), s) if iid else make_clients(s)
            b = _biases(d)
            x, y = pooled(cl)
            plat.append(np.mean(_test_losses(d)[-PLATEAU_ROUNDS:]))
            gap.append(np.mean(objective(x, y, b[-PLATEAU_ROUNDS:]) - c["f_star"]))
            div.append(float(divergence(cl, b).max()))
            lim.append(bound(tau, len(b), c)[0])
            lim_emp.append(bound(tau, len(b), c, div[-1])[0])
        ratio = np.array(lim) / np.array(gap)
        lines.append(
            f"| {label} | {ms(plat)} | {ms(gap)} | {ms(div)} | {ms(lim)} | "
            f"{ms(lim_emp)} | {ms(ratio)} |"
        )
        data["rows"][label] = {
            "tau": tau,
            "plateau_test_loss": plat,
            "gap": gap,
            "max_divergence": div,
            "bound": lim,
            "bound_empirical_zeta": lim_emp,
        }
    c = data["constants"]
    lines += ["", "| constant (line) | mean ± std over seeds | per seed |", "|---|---|---|"]
    for key, what in (
        ("zeta", "zeta, eq. 3 (line 41), non-iid clients"),
        ("zeta_iid", "zeta, eq. 3, iid clients"),
        ("L", "L = max_b F'' (line 95)"),
        ("L_clients", "max_i max_b F_i''"),
        ("D", "D, distance from b(0) to b* (line 95)"),
        ("b_star", "b*"),
        ("f_star", "F(b*), training objective"),
        ("test_loss_at_b_star", "test loss at b*"),
        ("sampled_floor", "F(b_w) - F(b*), the sampling's own optimum"),
    ):
        v = [c[s][key] for s in seeds]
        lines.append(f"| {what} | {ms(v)} | {', '.join(f'{x:.4g}' for x in v)} |")
    return "\n".join(lines), data


def separators(runs_dir: str, seeds: list[int]) -> tuple[str, dict]:
    """The separator each run ends with (the seed's Fig. 2 center, line 88): with the slope
    frozen, the line SLOPE . x + b = 0 of its last global bias, against the optimum's b*.
    Per row, mean ± std over seeds of the final bias and of its distance |b - b*|."""
    data: dict = {}
    lines = ["| run | final bias b | distance \\|b - b*\\| to the optimum |", "|---|---|---|"]
    for label, sub, _, iid in ROWS:
        final, dist = [], []
        for s in seeds:
            cl = iid_clients(make_clients(s), s) if iid else make_clients(s)
            b_star = bias_optimum(*pooled(cl))[0]
            final.append(float(_biases(f"{runs_dir}/{sub}-s{s}")[-1]))
            dist.append(abs(final[-1] - b_star))
        data[label] = {"final_bias": final, "distance_to_optimum": dist}
        lines.append(f"| {label} | {ms(final)} | {ms(dist)} |")
    return "\n".join(lines), data


def plot_separators(runs_dir: str, seed: int, out: str) -> None:
    """separators.png: seed ``seed``'s training points (the outlier client's apart) and the
    final separator of each non-iid FedAvg run and of the iid baseline, with b*'s."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    clients = make_clients(seed)
    fig, ax = plt.subplots(figsize=(5.5, 5))
    for c, (x, y) in clients.items():
        for cls, color in ((0, "tab:blue"), (1, "tab:red")):
            pts = x[y == cls]
            ax.scatter(pts[:, 0], pts[:, 1], s=6, color=color, alpha=0.35,
                       marker="x" if c == OUTLIER else "o",
                       label=(f"class {cls}" + (", outlier client" if c == OUTLIER else ""))
                       if c in (0, OUTLIER) else None)
    u = np.linspace(-1.5, 5.5, 2)

    def line(b: float, **kw) -> None:  # SLOPE . x + b = 0, solved for x2
        ax.plot(u, -(b + SLOPE[0] * u) / SLOPE[1], **kw)

    line(bias_optimum(*pooled(clients))[0], color="k", lw=2, label="optimum b*")
    cmap = plt.get_cmap("viridis")
    for i, tau in enumerate(TAUS):
        line(float(_biases(f"{runs_dir}/tau{tau}/fedavg-s{seed}")[-1]), color=cmap(i / len(TAUS)),
             lw=1.2, label=f"FedAvg, tau {tau}")
    line(float(_biases(f"{runs_dir}/iid/fedavg-s{seed}")[-1]), color="tab:orange", ls="--",
         lw=1.2, label=f"FedAvg iid, tau {IID_TAU}")
    ax.set_xlim(-1.5, 5.5)
    ax.set_ylim(-1.5, 5.5)
    ax.set_aspect("equal")
    ax.set_xlabel("x1")
    ax.set_ylabel("x2")
    ax.set_title(f"Toy: final separators, seed {seed} (slope frozen, bias trained)",
                 fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "separators.png"), dpi=120)
    plt.close(fig)


def plot(runs_dir: str, seeds: list[int], out: str) -> None:
    """divergence.png (the seed's Fig. 2 right: the gradient divergence after each round, by
    tau), bound.png (Fig. 5: measured gap against eq. 2's bound, by tau) and separators.png
    (Fig. 2 center: the final separators, first seed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plot_separators(runs_dir, seeds[0], out)

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, sub, _, iid in ROWS:
        if "FedProx" in label:
            continue
        curves = []
        for s in seeds:
            cl = iid_clients(make_clients(s), s) if iid else make_clients(s)
            curves.append(divergence(cl, _biases(f"{runs_dir}/{sub}-s{s}")))
        ax.plot(np.arange(1, len(curves[0]) + 1), np.mean(curves, axis=0), label=label)
    zeta = np.mean([bound_constants(make_clients(s))["zeta"] for s in seeds])
    ax.axhline(zeta, color="k", ls="--", lw=1, label=f"zeta (eq. 3) = {zeta:.3f}")
    ax.set_xlabel("round")
    ax.set_ylabel("max_i |F_i'(b) - F'(b)| at the global model")
    ax.set_title(f"Toy: gradient divergence after each round ({len(seeds)} seeds, mean)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "divergence.png"), dpi=120)
    plt.close(fig)

    _, data = summarize(runs_dir, seeds)
    fig, ax = plt.subplots(figsize=(6, 4))
    rows = [(k, v) for k, v in data["rows"].items() if k.startswith("FedAvg, tau")]
    taus = [v["tau"] for _, v in rows]
    ax.errorbar(
        taus,
        [np.mean(v["gap"]) for _, v in rows],
        yerr=[np.std(v["gap"]) for _, v in rows],
        marker="o",
        label="measured gap F - F*",
    )
    ax.plot(
        taus,
        [np.mean(v["bound"]) for _, v in rows],
        marker="s",
        label="eq. 2 bound 18 tau^2 eta^2 L zeta^2",
    )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("local steps tau")
    ax.set_ylabel("loss gap")
    ax.set_title("Toy: measured plateau gap vs eq. 2's bound (FedAvg, non-iid)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "bound.png"), dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, "runs/paper/toy")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = p.parse_args(argv)
    runs_dir = os.path.abspath(args.runs)
    run_all(plan(runs_dir, args.seeds, args.rounds))

    from fedray.tracking.report import build_report

    os.makedirs(args.out, exist_ok=True)
    rel = args.runs.rstrip("/")  # as given, so the reports name the runs as the user did
    build_report(
        [f"{rel}/tau{t}/fedavg-s{s}" for t in TAUS for s in args.seeds],
        os.path.join(args.out, "tau"),
        metric="test_loss",
        group_by="client.local_steps",
        title="Toy: FedAvg test loss vs rounds, by local steps tau (3 seeds)",
    )
    build_report(
        [f"{rel}/{d}/fedavg-s{s}" for d in ("tau1000", "iid") for s in args.seeds],
        os.path.join(args.out, "iid"),
        metric="test_loss",
        group_by="name",
        title=f"Toy: FedAvg at tau {IID_TAU}, non-iid vs the iid baseline",
    )
    build_report(
        [f"{rel}/tau{PROX_TAU}/{a}-s{s}" for a in ("fedavg", "fedprox") for s in args.seeds],
        os.path.join(args.out, "prox"),
        metric="test_loss",
        group_by="algorithm.name",
        title=f"Toy: FedAvg vs FedProx (mu 0.1) at tau {PROX_TAU}",
    )
    table, data = summarize(runs_dir, args.seeds)
    plot(runs_dir, args.seeds, args.out)
    with open(os.path.join(args.out, "plateau.md"), "w") as f:
        f.write(f"# Toy: plateaus and eq. 2's bound\n\n{table}\n")
    with open(os.path.join(args.out, "plateau.json"), "w") as f:
        json.dump(data, f, indent=1)
    sep_table, sep_data = separators(runs_dir, args.seeds)
    with open(os.path.join(args.out, "separators.md"), "w") as f:
        f.write(f"# Toy: the final separators (slope frozen; the last round's bias)\n\n"
                f"{sep_table}\n")
    with open(os.path.join(args.out, "separators.json"), "w") as f:
        json.dump(sep_data, f, indent=1)
    print(table)
    print(sep_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
