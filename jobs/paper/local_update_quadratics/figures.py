"""Seed 002's quadratic figures: (rho, Delta) Pareto frontiers of local update methods.

Regenerates Figures 1-5 (main text) and 7-10 (App. D) of Charles & Konečný from the closed
forms in fedray.theory.surrogate; "line N" is a line of shared/seeds/002_ca229c69b5271fde.txt.
Each figure uses its caption's settings (lines 317, 328, 335, 338, 349, 1041, 1053, 1056,
1059); rho is Table 2's rate (lines 257-262), Delta the suboptimality of eq. 17 (line 312).
Choices the seed leaves open, and ours:
- K grid: ``--points`` (default 400) log-spaced values in [1, 10^6], rounded to integers with
  duplicates removed (331 distinct K for 400). Fig. 1 has no K range in its caption; it uses
  the same grid. Fig. 4's caption says K in [0, 10^6]; K = 0 is no method, so [1, 10^6].
- Fig. 1 (right) varies gamma over [0, 1/L): 0 and ``--points`` log-spaced values of gamma L in
  [1e-5, 1 - 1e-9].
- Fig. 2 says "varying L" without values: L in {2, 5, 10, 100}, Fig. 7's set (line 1041).
  Fig. 9 says "varying alpha": {0, 0.5, 1, 5}, Fig. 3's set (it is Fig. 3's analog, line 1045).
- Simulated figures (5, 7, 8, 10): A = beta_1 B^T B + beta_2 I with B ~ N(0, 1)^{d x d}
  (App. D.1, lines 1032-1034), d in {5, 100} (line 349; the App. D captions give no d).
  One fresh B per (d, K) so that the d = 5 noise of line 353 shows along the curve, drawn once
  with numpy.random.default_rng(seed) (``--seed``, default 0) and shared by Figs. 5, 7, 8 and
  10 (only the affine map to [mu, L] changes with L). Delta there is Lemma 5's
  (sqrt b - sqrt a)/(sqrt b + sqrt a) from Q's extreme eigenvalues, as App. D.1 says
  (line 1030); Section 5 says eq. 17 (line 351), which for MAML beyond gamma = 1/(K L) goes
  negative and cannot move away from FedAvg's curve (checks.json reports both). The FedAvg
  comparison curves use the same gamma and are analytic (they equal the simulated ones).
- Heavy-ball's rate is (sqrt kappa - 1)/(sqrt kappa + 1) (see surrogate.rate for why).

Writes fig1.png ... fig10.png and checks.json (the numbers behind docs/reproductions.md's
verdicts) and prints one line per figure. About 5 s on 2 cores.

    python jobs/paper/local_update_quadratics/figures.py [--out DIR] [--points N] [--seed S]
        [--noise-draws R]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

# Hundreds of 100 x 100 eigenvalue problems: one BLAS thread each is ~15x faster than two
# threads fighting over 2 busy cores. setdefault, so an explicit setting still wins.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from fedray.theory import surrogate as S  # noqa: E402

MU = 1.0
DIMS = (5, 100)
LABEL = {"none": "no momentum", "nesterov": "Nesterov", "heavy_ball": "heavy-ball"}
COLOR = {"none": "tab:blue", "nesterov": "tab:orange", "heavy_ball": "tab:green"}
FEDAVG_C, MAML_C = "tab:blue", "tab:red"


def _f(x) -> float:
    return float(np.round(float(x), 6))


def _axes(ax, title: str) -> None:
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("convergence rate ρ")
    ax.set_ylabel("suboptimality Δ")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.set_aspect("equal")


def _save(fig, out: Path, name: str) -> str:
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    path = out / name
    fig.savefig(path, dpi=100)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return str(path)


def _residual(fr: S.Frontier, kappa0: float, momentum: str) -> np.ndarray:
    """Delta minus the Delta that eq. 17 pairs with the point's rho (0 on the common curve)."""
    return fr.delta - S.curve_delta(fr.rho, kappa0, momentum)


def _intercept(kappa0: float) -> float:
    """FedAvg's Delta as K -> infinity with alpha = 0 (kappa -> 1): one-shot averaging."""
    return float(S.suboptimality(1.0, kappa0))


class Context:
    def __init__(self, out: Path, points: int, seed: int, noise_draws: int = 32):
        self.out, self.points, self.seed, self.noise_draws = out, points, seed, noise_draws
        self.K = S.k_grid(points)
        rng = np.random.default_rng(seed)
        # B^T B's eigenvalues, one B per (d, K); mapped to [mu, L] per figure (App. D.1)
        self.base = {d: np.linalg.eigvalsh(_gram(rng.standard_normal((len(self.K), d, d))))
                     for d in DIMS}

    def spectra(self, d: int, L: float) -> np.ndarray:
        return S.rescale_spectra(self.base[d], MU, L)


def _gram(B: np.ndarray) -> np.ndarray:
    return np.swapaxes(B, 1, 2) @ B


# ------------------------------------------------------------------------------------------


def fig1(ctx: Context, plt) -> tuple[dict, str]:
    """Line 317: mu = 1, alpha = 0, Theta_{1:K}, L in {5, 50}; gamma = 0.01 varying K (left),
    K = 100 varying gamma (right). SERVEROPT gradient descent (line 321)."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 4.6))
    u = np.concatenate([[0.0], np.logspace(-5, 0, ctx.points)])
    u[-1] = 1 - 1e-9
    checks = {}
    for L, ls in ((5.0, "-"), (50.0, "--")):
        k0 = L / MU
        byK = S.analytic_frontier(MU, L, 0.0, 0.01, ctx.K, "fedavg")
        byg = S.analytic_frontier(MU, L, 0.0, u / L, 100, "fedavg")
        axes[0].plot(byK.rho, byK.delta, ls, color="k", label=f"L = {L:g}")
        axes[1].plot(byg.rho, byg.delta, ls, color="k", label=f"L = {L:g}")
        # the common curve over kappa in [1, kappa0], and its chord
        kap = np.exp(np.linspace(0, np.log(k0), 2001))
        rho_c, del_c = S.rate(kap), S.suboptimality(kap, k0)
        chord = del_c.max() * (1 - rho_c / rho_c.max())
        checks[f"L={L:g}"] = {
            "vary_K_rho_min": _f(byK.rho.min()), "vary_K_delta_at_rho_min":
                _f(byK.delta[np.argmin(byK.rho)]),
            "vary_gamma_rho_min": _f(byg.rho.min()),
            "vary_gamma_delta_at_rho_min": _f(byg.delta[np.argmin(byg.rho)]),
            "kappa_limit_gamma_to_1_over_L": _f(1 / (1 - (1 - MU / L) ** 100)),
            "max_residual_to_common_curve": float(max(
                np.abs(_residual(byK, k0, "none")).max(),
                np.abs(_residual(byg, k0, "none")).max())),
            "curve_max_deviation_from_chord_over_intercept":
                _f((del_c - chord).max() / del_c.max()),
        }
    _axes(axes[0], "γ = 0.01, K ∈ [1, 10⁶]")
    _axes(axes[1], "K = 100, γ ∈ [0, 1/L)")
    for ax in axes:
        ax.legend(fontsize=8)
    fig.suptitle("Fig. 1: μ = 1, α = 0, Θ_{1:K}, gradient descent", fontsize=10)
    _save(fig, ctx.out, "fig1.png")
    c5, c50 = checks["L=5"], checks["L=50"]
    return checks, (f"fig1: rho_min vary-K / vary-gamma: L=5 {c5['vary_K_rho_min']:.3g} / "
                    f"{c5['vary_gamma_rho_min']:.3g}, L=50 {c50['vary_K_rho_min']:.3g} / "
                    f"{c50['vary_gamma_rho_min']:.3g}")


def fig2(ctx: Context, plt) -> tuple[dict, str]:
    """Line 328: mu = 1, alpha = 0, gamma = 1/(2L), Theta_{1:K}, K in [1, 10^6], three kinds of
    server momentum; "varying L" (values ours: {2, 5, 10, 100})."""
    Ls = (2.0, 5.0, 10.0, 100.0)
    fig, axes = plt.subplots(1, len(Ls), figsize=(16, 4.4))
    checks = {}
    for ax, L in zip(axes, Ls, strict=True):
        k0 = L / MU
        fr = {m: S.analytic_frontier(MU, L, 0.0, 1 / (2 * L), ctx.K, "fedavg", m)
              for m in S.MOMENTA}
        for m in S.MOMENTA:
            ax.plot(fr[m].rho, fr[m].delta, color=COLOR[m], label=LABEL[m])
        ax.plot([0, 1], [0, 1], ":", color="grey", linewidth=0.8)
        _axes(ax, f"L = {L:g}")
        ax.legend(fontsize=7)
        above1 = fr["none"].log_kappa > 1e-12
        order = int(np.sum(~((fr["heavy_ball"].rho < fr["nesterov"].rho)
                             & (fr["nesterov"].rho < fr["none"].rho))[above1]))
        r1 = {m: float(fr[m].rho[0]) for m in S.MOMENTA}
        checks[f"L={L:g}"] = {
            "ordering_violations_hb<nesterov<none": order,
            "points_compared": int(above1.sum()),
            "rho_at_K1": {m: _f(r1[m]) for m in S.MOMENTA},
            "rho_gap_none_minus_hb_at_K1": _f(r1["none"] - r1["heavy_ball"]),
            "rounds_ratio_none_over_hb_at_K1": _f(np.log(r1["heavy_ball"]) / np.log(r1["none"])),
            "max_mirror_residual": {  # |rho - curve_delta(Delta)|: 0 iff (Delta, rho) on curve
                m: float(np.abs(fr[m].rho - S.curve_delta(fr[m].delta, k0, m)).max())
                for m in S.MOMENTA},
        }
    fig.suptitle("Fig. 2: μ = 1, α = 0, γ = 1/(2L), Θ_{1:K}, K ∈ [1, 10⁶]; dotted: ρ = Δ",
                 fontsize=10)
    _save(fig, ctx.out, "fig2.png")
    viol = sum(c["ordering_violations_hb<nesterov<none"] for c in checks.values())
    hb = max(c["max_mirror_residual"]["heavy_ball"] for c in checks.values())
    return checks, (f"fig2: ordering violations {viol}; heavy-ball mirror residual {hb:.1e}; "
                    f"rounds ratio none/hb at K=1: " + ", ".join(
                        f"L={k[2:]} {c['rounds_ratio_none_over_hb_at_K1']:.2f}"
                        for k, c in checks.items()))


def fig3(ctx: Context, plt) -> tuple[dict, str]:
    """Line 335: mu = 1, L = 10, Theta_{1:K}, gamma = (1/2)(L + alpha)^{-1}, gradient
    descent, alpha in {0, 0.5, 1, 5}, K in [1, 10^6]."""
    L, k0, alphas = 10.0, 10.0, (0.0, 0.5, 1.0, 5.0)
    fig, ax = plt.subplots(figsize=(5, 4.8))
    checks, fr = {}, {}
    for a, w in zip(alphas, (6, 4, 2.5, 1.2), strict=True):
        fr[a] = S.analytic_frontier(MU, L, a, 0.5 / (L + a), ctx.K, "fedavg")
        ax.plot(fr[a].rho, fr[a].delta, linewidth=w, label=f"α = {a:g}")
    for a in alphas:
        checks[f"alpha={a:g}"] = {
            "rho_range": [_f(fr[a].rho.min()), _f(fr[a].rho.max())],
            "delta_max": _f(fr[a].delta.max()),
            "kappa_limit_K_inf": _f(L * (MU + a) / (MU * (L + a))),
            "max_residual_to_alpha0_curve": float(np.abs(_residual(fr[a], k0, "none")).max()),
            "inside_alpha0_range": bool(fr[a].rho.min() >= fr[0.0].rho.min() - 1e-12
                                        and fr[a].rho.max() <= fr[0.0].rho.max() + 1e-12),
        }
    _axes(ax, "Fig. 3: μ = 1, L = 10, Θ_{1:K}, γ = ½(L+α)⁻¹, GD")
    ax.legend(fontsize=8)
    _save(fig, ctx.out, "fig3.png")
    return checks, ("fig3: rho_min by alpha " + ", ".join(
        f"{k[6:]}: {c['rho_range'][0]:.3f}" for k, c in checks.items())
        + f"; max residual {max(c['max_residual_to_alpha0_curve'] for c in checks.values()):.1e}")


def fig4(ctx: Context, plt) -> tuple[dict, str]:
    """Line 338: mu = 1, L = 10, alpha = 0; Theta_{1:K} with gamma = 0.001 and Theta_K with
    gamma = (2 L K)^{-1}; K in [1, 10^6]; three kinds of server momentum."""
    L, k0 = 10.0, 10.0
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.6))
    checks = {}
    for ax, m in zip(axes, S.MOMENTA, strict=True):
        fa = S.analytic_frontier(MU, L, 0.0, 0.001, ctx.K, "fedavg", m)
        ma = S.analytic_frontier(MU, L, 0.0, 1 / (2 * L * ctx.K), ctx.K, "maml", m)
        ax.plot(fa.rho, fa.delta, color=FEDAVG_C, linewidth=4, alpha=0.5,
                label="FedAvg Θ_{1:K}, γ = 0.001")
        ax.plot(ma.rho, ma.delta, color=MAML_C, label="MAML Θ_K, γ = 1/(2LK)")
        _axes(ax, LABEL[m])
        ax.legend(fontsize=7)
        checks[m] = {
            "maml_all_valid": bool(ma.valid.all()),
            "maml_max_residual_to_fedavg_curve": float(np.abs(_residual(ma, k0, m)).max()),
            "maml_rho_range": [_f(ma.rho.min()), _f(ma.rho.max())],
            "fedavg_rho_range": [_f(fa.rho.min()), _f(fa.rho.max())],
            "maml_kappa_range": [_f(ma.kappa.min()), _f(ma.kappa.max())],
            "fedavg_delta_at_rho_min": _f(fa.delta[np.argmin(fa.rho)]),
        }
    fig.suptitle("Fig. 4: μ = 1, L = 10, α = 0, K ∈ [1, 10⁶]", fontsize=10)
    _save(fig, ctx.out, "fig4.png")
    c = checks["none"]
    return checks, (f"fig4: MAML rho in {c['maml_rho_range']} inside FedAvg's "
                    f"{c['fedavg_rho_range']} (no momentum); max residual "
                    f"{max(v['maml_max_residual_to_fedavg_curve'] for v in checks.values()):.1e}"
                    "; FedAvg Delta at rho_min: " + ", ".join(
                        f"{m} {v['fedavg_delta_at_rho_min']:.4f}" for m, v in checks.items()))


def _cusp(fr: S.Frontier, K: np.ndarray) -> dict:
    i = int(np.argmin(fr.rho))
    return {"K": int(K[i]), "rho": _f(fr.rho[i]), "delta": _f(fr.delta[i])}


def _k_star(L: float, alpha: float, gamma: float) -> float:
    """K where cond(Q(Theta_K)) = L/mu, i.e. psi(mu) = psi(L): where the smaller end of psi
    switches from mu to L (our derivation; the cusp of the dense-spectrum curve)."""
    return 1 + np.log(L / MU) / (np.log1p(-gamma * (MU + alpha)) - np.log1p(-gamma * (L + alpha)))


def _departure(res: np.ndarray, K: np.ndarray, tol: float = 0.01) -> int | None:
    off = np.flatnonzero(np.abs(res) > tol)
    return int(K[off[0]]) if off.size else None


def _arc_fraction(kappa: float, kappa0: float) -> float:
    """Share of FedAvg's whole curve (no momentum, kappa from kappa0 down to 1), by arc
    length in the (rho, Delta) plane, that lies between kappa0 and ``kappa``."""
    k = np.exp(np.linspace(np.log(kappa0), 0.0, 4001))
    seg = np.hypot(np.diff(S.rate(k)), np.diff(S.suboptimality(k, kappa0)))
    arc = np.concatenate([[0.0], np.cumsum(seg)])
    return float(np.interp(-np.log(kappa), -np.log(k), arc) / arc[-1])


def _noise(ctx: Context, L: float, alpha: float, gamma: float, Ks) -> dict:
    """std of rho over ctx.noise_draws fresh matrices at a few K, for each d."""
    rng = np.random.default_rng([ctx.seed, 1])
    out = {}
    for d in DIMS:
        row = {}
        for K in Ks:
            lam = S.random_spectra(ctx.noise_draws, d, MU, L, rng)
            fr = S.frontier_from_spectrum(lam, alpha, gamma, K, "maml", "none", "lemma5")
            row[f"K={K}"] = _f(fr.rho.std())
        out[f"d={d}"] = row
    return out


def fig5(ctx: Context, plt) -> tuple[dict, str]:
    """Line 349: mu = 1, L = 10, alpha = 0, gamma = 0.001, Theta_K, gradient descent, random
    A in R^{d x d}, d in {5, 100}, K in [1, 10^6]; compared with Theta_{1:K}."""
    L, k0, g = 10.0, 10.0, 0.001
    K = ctx.K
    fa = S.analytic_frontier(MU, L, 0.0, g, K, "fedavg")
    cont = S.continuum_maml_frontier(MU, L, 0.0, g, K)
    thr = 1 / (g * L)  # gamma >= 1/(K L) from here on
    kstar = _k_star(L, 0.0, g)
    fig, axes = plt.subplots(1, 2, figsize=(9.5, 4.8))
    checks = {"threshold_K_1_over_gammaL": _f(thr), "K_star_condQ_equals_kappa0": _f(kstar),
              "fedavg_intercept_delta": _f(_intercept(k0)),
              "fedavg_delta_at_K_max": _f(fa.delta[-1])}
    for ax, d in zip(axes, DIMS, strict=True):
        lam = ctx.spectra(d, L)
        ma = S.frontier_from_spectrum(lam, 0.0, g, K, "maml", "none", "lemma5")
        ma17 = S.frontier_from_spectrum(lam, 0.0, g, K, "maml", "none", "eq17")
        sim_fa = S.frontier_from_spectrum(lam, 0.0, g, K, "fedavg", "none", "lemma5")
        res = _residual(ma, k0, "none")
        ax.plot(fa.rho, fa.delta, color=FEDAVG_C, linewidth=3, alpha=0.5, zorder=3,
                label="FedAvg Θ_{1:K}")
        ax.plot(ma.rho, ma.delta, ".-", color=MAML_C, markersize=2.5, linewidth=0.8,
                label="MAML Θ_K (simulated)")
        ax.plot(cont.rho, cont.delta, ":", color="k", linewidth=1,
                label="MAML, dense spectrum (d → ∞)")
        ax.axhline(_intercept(k0), color="grey", linewidth=0.6, linestyle="--")
        _axes(ax, f"d = {d}")
        ax.legend(fontsize=7, loc="upper left")
        checks[f"d={d}"] = {
            "max_residual_K_below_threshold": float(np.abs(res[K < thr]).max()),
            "min_distance_to_origin": {"maml": _f(np.hypot(ma.rho, ma.delta).min()),
                                       "fedavg": _f(np.hypot(fa.rho, fa.delta).min())},
            "departure_K_residual_over_0.01": _departure(res, K),
            "cusp_min_rho": _cusp(ma, K),
            "max_abs_rho_minus_dense_limit": _f(np.abs(ma.rho - cont.rho).max()),
            "simulated_fedavg_max_diff_from_analytic": float(max(
                np.abs(sim_fa.rho - fa.rho).max(), np.abs(sim_fa.delta - fa.delta).max())),
            "eq17_points_with_negative_delta": int(np.sum(ma17.delta < 0)),
            "eq17_max_residual": float(np.abs(_residual(ma17, k0, "none")).max()),
            "delta_at_K_max": _f(ma.delta[-1]), "rho_at_K_max": _f(ma.rho[-1]),
        }
    checks["rho_std_over_draws"] = _noise(ctx, L, 0.0, g, (150, int(round(kstar)), 500, 2000))
    fig.suptitle("Fig. 5: μ = 1, L = 10, α = 0, γ = 0.001, GD; dashed: FedAvg's Δ at K → ∞",
                 fontsize=10)
    _save(fig, ctx.out, "fig5.png")
    c = checks["d=100"]
    return checks, (f"fig5: residual K<100 {c['max_residual_K_below_threshold']:.1e}; "
                    f"d=100 cusp at K={c['cusp_min_rho']['K']} Delta "
                    f"{c['cusp_min_rho']['delta']:.4f} vs FedAvg intercept "
                    f"{checks['fedavg_intercept_delta']:.4f}; rho std d=5/100 at K=500: "
                    f"{checks['rho_std_over_draws']['d=5']['K=500']:.3g}/"
                    f"{checks['rho_std_over_draws']['d=100']['K=500']:.3g}")


def fig7(ctx: Context, plt) -> tuple[dict, str]:
    """Line 1041: mu = 1, gamma = 0.001, Theta_K, GD, L in {2, 5, 10, 100}, K in [1, 10^6],
    random A (d in {5, 100}, line 1036); compared with Theta_{1:K} at the same L."""
    Ls, g, K = (2.0, 5.0, 10.0, 100.0), 0.001, ctx.K
    fig, axes = plt.subplots(len(DIMS), len(Ls), figsize=(15, 8.6))
    checks = {}
    for j, L in enumerate(Ls):
        k0 = L / MU
        fa = S.analytic_frontier(MU, L, 0.0, g, K, "fedavg")
        row = {"threshold_K": _f(1 / (g * L)), "fedavg_intercept_delta": _f(_intercept(k0))}
        for i, d in enumerate(DIMS):
            ma = S.frontier_from_spectrum(ctx.spectra(d, L), 0.0, g, K, "maml", "none",
                                          "lemma5")
            res = _residual(ma, k0, "none")
            dep = _departure(res, K)
            ax = axes[i, j]
            _fedavg_and_maml(ax, fa, ma)
            _axes(ax, f"L = {L:g}, d = {d}")
            ax.legend(fontsize=7, loc="upper left")
            # the last MAML point still on FedAvg's curve
            on = np.flatnonzero(K == dep)[0] - 1 if dep is not None else len(K) - 1
            row[f"d={d}"] = {
                "departure_K_residual_over_0.01": dep,
                "last_on_curve": {"K": int(K[on]), "rho": _f(ma.rho[on]),
                                  "delta": _f(ma.delta[on])},
                "fraction_of_fedavg_delta_range_followed": _f(ma.delta[on] / _intercept(k0)),
                "fraction_of_fedavg_arc_length_followed":
                    _f(_arc_fraction(ma.kappa[on], k0)),
                "cusp_min_rho": _cusp(ma, K),
            }
        checks[f"L={L:g}"] = row
    fig.suptitle("Fig. 7: μ = 1, γ = 0.001, α = 0, GD; MAML Θ_K (simulated) vs FedAvg Θ_{1:K}",
                 fontsize=10)
    _save(fig, ctx.out, "fig7.png")
    return checks, ("fig7: share of FedAvg's curve (arc length) MAML follows, d=100: "
                    + ", ".join(f"{k}: {v['d=100']['fraction_of_fedavg_arc_length_followed']:.2f}"
                                for k, v in checks.items()))


def _fedavg_and_maml(ax, fa, ma) -> None:
    """FedAvg's analytic frontier under the simulated MAML one, as Figs. 5, 7, 8 draw them."""
    ax.plot(fa.rho, fa.delta, color=FEDAVG_C, linewidth=3, alpha=0.5, zorder=3,
            label="FedAvg")
    ax.plot(ma.rho, ma.delta, ".-", color=MAML_C, markersize=2, linewidth=0.8,
            label="MAML (simulated)")


def _chord_gap(rho: np.ndarray, delta: np.ndarray) -> float:
    """Area between a branch rho = g(Delta) and its chord, over the bounding box's area:
    > 0 when the branch bows towards small rho (g convex: the region to its right convex)."""
    o = np.argsort(delta)
    x, y = delta[o], rho[o]
    chord = y[0] + (y[-1] - y[0]) * (x - x[0]) / (x[-1] - x[0])
    gap = chord - y
    area = float(np.sum((gap[1:] + gap[:-1]) * np.diff(x)) / 2)
    return area / ((x[-1] - x[0]) * (y[-1] - y[0]))


def fig8(ctx: Context, plt) -> tuple[dict, str]:
    """Line 1053: mu = 1, L = 10, gamma = 0.001, Theta_K, three kinds of server momentum, K in
    [1, 10^6], random A (d in {5, 100}, line 1038); compared with Theta_{1:K}."""
    L, g, K = 10.0, 0.001, ctx.K
    fig, axes = plt.subplots(len(DIMS), 3, figsize=(12, 8.8))
    checks = {}
    fr = {}
    for i, d in enumerate(DIMS):
        lam = ctx.spectra(d, L)
        for j, m in enumerate(S.MOMENTA):
            fa = S.analytic_frontier(MU, L, 0.0, g, K, "fedavg", m)
            fr[d, m] = ma = S.frontier_from_spectrum(lam, 0.0, g, K, "maml", m, "lemma5")
            ax = axes[i, j]
            _fedavg_and_maml(ax, fa, ma)
            _axes(ax, f"{LABEL[m]}, d = {d}")
            ax.legend(fontsize=7, loc="upper left")
    for d in DIMS:
        viol = int(np.sum(~((fr[d, "heavy_ball"].rho <= fr[d, "nesterov"].rho)
                            & (fr[d, "nesterov"].rho <= fr[d, "none"].rho))))
        row = {"ordering_violations_hb<=nesterov<=none": viol}
        for m in S.MOMENTA:
            ma = fr[d, m]
            i = int(np.argmin(ma.rho))
            keep = (np.arange(len(K)) >= i) & (ma.rho < 0.999) & (ma.delta < 0.999)
            row[m] = {"cusp_min_rho": _cusp(ma, K),
                      "post_cusp_chord_gap": _f(_chord_gap(ma.rho[keep], ma.delta[keep])),
                      "post_cusp_points": int(keep.sum())}
        checks[f"d={d}"] = row
    fig.suptitle("Fig. 8: μ = 1, L = 10, γ = 0.001, α = 0; MAML Θ_K (simulated) vs FedAvg",
                 fontsize=10)
    _save(fig, ctx.out, "fig8.png")
    c = checks["d=100"]
    return checks, ("fig8: d=100 cusp rho " + ", ".join(
        f"{m} {c[m]['cusp_min_rho']['rho']:.3f}" for m in S.MOMENTA) + "; chord gap " + ", ".join(
        f"{m} {c[m]['post_cusp_chord_gap']:+.3f}" for m in S.MOMENTA)
        + f"; ordering violations {c['ordering_violations_hb<=nesterov<=none']}")


def fig9(ctx: Context, plt) -> tuple[dict, str]:
    """Line 1056: mu = 1, L = 10, gamma = 1e-7, Theta_K, "varying alpha" (ours: {0, 0.5, 1,
    5}), K in [1, 10^6], GD; only gamma < 1/(K L + alpha) (line 1045)."""
    L, k0, g, alphas = 10.0, 10.0, 1e-7, (0.0, 0.5, 1.0, 5.0)
    fig, ax = plt.subplots(figsize=(5, 4.8))
    checks, fr = {}, {}
    for a, w in zip(alphas, (7, 4.5, 2.5, 1), strict=True):
        f = S.analytic_frontier(MU, L, a, g, ctx.K, "maml")
        fr[a] = f
        v = f.valid
        ax.plot(f.rho[v], f.delta[v], linewidth=w, label=f"α = {a:g}")
    for a in alphas:
        v = fr[a].valid
        both = v & fr[0.0].valid
        checks[f"alpha={a:g}"] = {
            "valid_points": int(v.sum()), "largest_valid_K": int(ctx.K[v].max()),
            "rho_range": [_f(fr[a].rho[v].min()), _f(fr[a].rho[v].max())],
            "delta_max": _f(fr[a].delta[v].max()),
            "max_residual_to_common_curve": float(np.abs(_residual(fr[a], k0, "none")[v]).max()),
            "max_abs_rho_diff_vs_alpha0_same_K": float(np.abs(fr[a].rho - fr[0.0].rho)[both]
                                                       .max()),
        }
    _axes(ax, "Fig. 9: μ = 1, L = 10, γ = 10⁻⁷, Θ_K, GD")
    ax.set_xlim(0.6, 0.85)
    ax.set_ylim(-0.01, 0.25)
    ax.set_aspect("auto")
    ax.legend(fontsize=8)
    _save(fig, ctx.out, "fig9.png")
    return checks, ("fig9: rho range by alpha " + ", ".join(
        f"{k[6:]}: {c['rho_range']}" for k, c in checks.items()) + "; max rho diff vs alpha=0 "
        f"{max(c['max_abs_rho_diff_vs_alpha0_same_K'] for c in checks.values()):.1e}")


def fig10(ctx: Context, plt) -> tuple[dict, str]:
    """Line 1059: mu = 1, L = 10, gamma = 0.001, Theta_K, GD, alpha in {0, 0.5, 1, 10}, K in
    [1, 10^6], random A (d in {5, 100}); compared with Theta_{1:K} at the same alpha."""
    L, g, alphas, K = 10.0, 0.001, (0.0, 0.5, 1.0, 10.0), ctx.K
    fig, axes = plt.subplots(len(DIMS), len(alphas), figsize=(15, 8.6))
    checks, ma = {}, {}
    for j, a in enumerate(alphas):
        fa = S.analytic_frontier(MU, L, a, g, K, "fedavg")
        checks[f"alpha={a:g}"] = {"fedavg_rho_min": _f(fa.rho.min()),
                                  "fedavg_delta_max": _f(fa.delta.max())}
        for i, d in enumerate(DIMS):
            ma[a, d] = S.frontier_from_spectrum(ctx.spectra(d, L), a, g, K, "maml", "none",
                                                "lemma5")
            ax = axes[i, j]
            ax.plot(fa.rho, fa.delta, color=FEDAVG_C, linewidth=3, alpha=0.5, zorder=3,
                    label="FedAvg")
            ax.plot(ma[a, d].rho, ma[a, d].delta, ".-", color=MAML_C, markersize=2,
                    linewidth=0.8, label="MAML (simulated)")
            _axes(ax, f"α = {a:g}, d = {d}")
            ax.legend(fontsize=7, loc="upper left")
    for a in alphas:
        for d in DIMS:
            m, m0 = ma[a, d], ma[0.0, d]
            checks[f"alpha={a:g}"][f"d={d}"] = {
                "maml_max_abs_rho_diff_vs_alpha0_same_K": _f(np.abs(m.rho - m0.rho).max()),
                "maml_max_abs_delta_diff_vs_alpha0_same_K": _f(np.abs(m.delta - m0.delta).max()),
                "maml_hausdorff_vs_alpha0": _f(S.hausdorff((m.rho, m.delta), (m0.rho, m0.delta))),
                "cusp_min_rho": _cusp(m, K),
            }
    fig.suptitle("Fig. 10: μ = 1, L = 10, γ = 0.001, GD; MAML Θ_K (simulated) vs FedAvg Θ_{1:K}",
                 fontsize=10)
    _save(fig, ctx.out, "fig10.png")
    return checks, ("fig10: FedAvg rho_min by alpha " + ", ".join(
        f"{k[6:]}: {c['fedavg_rho_min']:.3f}" for k, c in checks.items())
        + "; MAML Hausdorff vs alpha=0 (d=100) " + ", ".join(
        f"{k[6:]}: {c['d=100']['maml_hausdorff_vs_alpha0']:.3f}" for k, c in checks.items()))


FIGURES = {"fig1": fig1, "fig2": fig2, "fig3": fig3, "fig4": fig4, "fig5": fig5, "fig7": fig7,
           "fig8": fig8, "fig9": fig9, "fig10": fig10}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(ROOT / "docs" / "figures" / "local_update_quadratics"),
                   help="directory for fig*.png and checks.json")
    p.add_argument("--points", type=int, default=400,
                   help="log-spaced K values in [1, 10^6] before rounding (and gamma values)")
    p.add_argument("--seed", type=int, default=0, help="numpy default_rng seed of the random A")
    p.add_argument("--noise-draws", type=int, default=32,
                   help="fresh matrices per K for the d = 5 vs d = 100 spread (Fig. 5)")
    args = p.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ctx = Context(out, args.points, args.seed, args.noise_draws)
    checks = {"settings": {"points": args.points, "distinct_K": len(ctx.K), "seed": args.seed,
                           "dims": list(DIMS), "noise_draws": args.noise_draws}}
    for name, make in FIGURES.items():
        checks[name], line = make(ctx, plt)
        print(line, flush=True)
    with open(out / "checks.json", "w") as f:
        json.dump(checks, f, indent=1)
    print(f"wrote {len(FIGURES)} figures and checks.json to {out} "
          f"({len(ctx.K)} distinct K, seed {args.seed}, {time.perf_counter() - t0:.1f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
