"""Local update methods on quadratics as first-order methods on a surrogate loss.

Seed 002 (Charles & Konečný, "Convergence and Accuracy Trade-Offs in Federated Learning and
Meta-Learning"); "line N" below is a line of ``shared/seeds/002_ca229c69b5271fde.txt``.

Client i has the quadratic loss f_i(x) = 1/2 (x - c_i)^T A_i (x - c_i) (line 72) and the
population loss is f = E_i f_i (line 106). LOCALUPDATE (Algorithms 1-2, lines 96-138) runs
K(Theta) steps of (mini-batch) gradient descent with client learning rate gamma on
f_i + alpha/2 ||. - x||^2 and sends sum_k theta_k g_k. Theorem 1 (line 177) says its expected
message is the gradient of the surrogate f~_i (eq. 7, line 169), built from the distortion
matrix Q_i (eq. 6, line 165); so one round of LOCALUPDATE is one step of the server
optimizer on f~ (eq. 8, line 173), and everything about convergence (kappa, eq. 9, line 213;
rate rho, Table 2, lines 257-262) and accuracy (distance between the minimizers, Lemma 5 at
line 278, suboptimality Delta, eq. 17, line 312) follows from the spectra of Q_i and A_i.

Why the eigenvalue route: Q_i is a polynomial in A_i, so Q_i and A_i share eigenvectors and
Q_i's eigenvalue on A_i's eigenvalue lambda is q(lambda) = sum_k theta_k r^(k-1) with
r = 1 - gamma (lambda + alpha) (Lemma 9, line 587). The figures go up to K = 10^6 local
steps, where summing matrix powers is out of the question; for Theta_{1:K} the geometric sum
has a closed form (eq. 33, line 653) and for Theta_K it is the single power r^(K-1). Both are
evaluated with log1p/expm1, which stays accurate when gamma (lambda + alpha) is 1e-7 (Fig. 9)
and when r^K underflows (K = 10^6). The frontier helpers work with log kappa throughout:
kappa itself overflows float64 for MAML at large K.

Conventions: Theta is a 1-D array (theta_1, ..., theta_K) of non-negative weights with a
positive entry (line 88); trailing zeros are ignored, as K(Theta) is the last positive index
(eq. 4, line 90). A client population is ``A`` of shape (n, d, d) (or (d, d) for one client),
``c`` of shape (n, d) (or (d,)) and optional probabilities ``p`` (uniform by default).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

Momentum = Literal["none", "nesterov", "heavy_ball"]
Family = Literal["fedavg", "maml"]
MOMENTA: tuple[Momentum, ...] = ("none", "nesterov", "heavy_ball")

_CHUNK = 1 << 16  # columns of r^(k-1) held at once by the generic sum

# ------------------------------------------------------------------------------------------
# Theta (eqs. 4-5, lines 86-146)


def theta_ones(K: int) -> NDArray[np.float64]:
    """Theta_{1:K} = (1, ..., 1) (eq. 5, line 146): FedAvg/Reptile/FedProx (Table 1)."""
    if K < 1:
        raise ValueError(f"K must be >= 1, got {K}")
    return np.ones(int(K))


def theta_last(K: int) -> NDArray[np.float64]:
    """Theta_K = (0, ..., 0, 1) (eq. 5, line 146): only the K-th gradient is sent (FOMAML)."""
    if K < 1:
        raise ValueError(f"K must be >= 1, got {K}")
    theta = np.zeros(int(K))
    theta[-1] = 1.0
    return theta


def theta_index(j: int) -> NDArray[np.float64]:
    """Theta_j, the j-th unit vector (eq. 5 with K = j); MAML with K steps is Theta_{2K+1}
    (Theorem 2, line 191)."""
    return theta_last(j)


def check_theta(theta: ArrayLike) -> NDArray[np.float64]:
    """Theta as a float64 vector without trailing zeros, after checking that its weights are
    finite and non-negative with at least one positive (line 88)."""
    t = np.asarray(theta, dtype=np.float64).reshape(-1)
    if t.size == 0 or not np.all(np.isfinite(t)) or np.any(t < 0) or not np.any(t > 0):
        raise ValueError("Theta needs finite, non-negative weights with one positive")
    return t[: int(np.flatnonzero(t > 0)[-1]) + 1]


def theta_K(theta: ArrayLike) -> int:
    """K(Theta) = max{k : theta_k > 0} (eq. 4, line 90): the number of local steps run."""
    return int(check_theta(theta).size)


def theta_w(theta: ArrayLike) -> float:
    """w(Theta) = sum_k theta_k (eq. 4, line 90): f~ -> w(Theta) f as gamma -> 0 (line 183)."""
    return float(check_theta(theta).sum())


# ------------------------------------------------------------------------------------------
# Eigenvalues of Q (Lemma 9, line 587)


def _one_minus_r(lam: ArrayLike, alpha: ArrayLike, gamma: ArrayLike) -> NDArray[np.float64]:
    return np.asarray(gamma, dtype=np.float64) * (np.asarray(lam, dtype=np.float64) + alpha)


def _broadcast(lam: ArrayLike, alpha: ArrayLike, gamma: ArrayLike, K: ArrayLike
               ) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """1 - r and K broadcast together, and an output array of their shape."""
    x, k = np.broadcast_arrays(_one_minus_r(lam, alpha, gamma),
                               np.asarray(K, dtype=np.float64))
    return x, k, np.empty(x.shape)


def q_ones(lam: ArrayLike, alpha: ArrayLike, gamma: ArrayLike,
           K: ArrayLike) -> NDArray[np.float64]:
    """Eigenvalue of Q(alpha, gamma, Theta_{1:K}) on A's eigenvalue lam: the geometric sum
    sum_{k=1}^K r^(k-1), r = 1 - gamma (lam + alpha) (eqs. 29 and 33, lines 591 and 653).

    For 0 < 1 - r < 1 it is -expm1(K log1p(r - 1)) / (1 - r), exact to rounding for any K;
    r = 1 gives K; r <= 0 (gamma beyond Lemma 1's range) falls back to (1 - r^K) / (1 - r).
    Broadcasts over all arguments."""
    x, K, out = _broadcast(lam, alpha, gamma, K)
    with np.errstate(all="ignore"):
        inside = (x > 0) & (x < 1)
        out[inside] = -np.expm1(K[inside] * np.log1p(-x[inside])) / x[inside]
        zero = x == 0
        out[zero] = K[zero]
        rest = ~inside & ~zero
        out[rest] = (1.0 - np.power(1.0 - x[rest], K[rest])) / x[rest]
    return out


def q_last(lam: ArrayLike, alpha: ArrayLike, gamma: ArrayLike,
           K: ArrayLike) -> NDArray[np.float64]:
    """Eigenvalue of Q(alpha, gamma, Theta_K) on A's eigenvalue lam: r^(K-1) (eq. 29), as
    exp((K-1) log1p(r - 1)) when 0 < r <= 1. Broadcasts over all arguments."""
    x, K, out = _broadcast(lam, alpha, gamma, K)
    with np.errstate(all="ignore"):
        inside = (x >= 0) & (x < 1)
        out[inside] = np.exp((K[inside] - 1.0) * np.log1p(-x[inside]))
        out[~inside] = np.power(1.0 - x[~inside], K[~inside] - 1.0)
    return out


def log_q_ones(lam: ArrayLike, alpha: ArrayLike, gamma: ArrayLike,
               K: ArrayLike) -> NDArray[np.float64]:
    """log q_ones without forming q (the frontiers need ratios of numbers that under- or
    overflow); nan where q <= 0."""
    x, K, out = _broadcast(lam, alpha, gamma, K)
    with np.errstate(all="ignore"):
        inside = (x > 0) & (x < 1)
        out[inside] = (np.log(-np.expm1(K[inside] * np.log1p(-x[inside])))
                       - np.log(x[inside]))
        zero = x == 0
        out[zero] = np.log(K[zero])
        rest = ~inside & ~zero
        q = (1.0 - np.power(1.0 - x[rest], K[rest])) / x[rest]
        out[rest] = np.where(q > 0, np.log(np.where(q > 0, q, 1.0)), np.nan)
    return out


def log_q_last(lam: ArrayLike, alpha: ArrayLike, gamma: ArrayLike,
               K: ArrayLike) -> NDArray[np.float64]:
    """log q_last = (K - 1) log r; -inf where r = 0 (and K > 1), nan where r^(K-1) < 0."""
    x, K, out = _broadcast(lam, alpha, gamma, K)
    with np.errstate(all="ignore"):
        inside = (x >= 0) & (x < 1)
        out[inside] = (K[inside] - 1.0) * np.log1p(-x[inside])
        q = np.power(1.0 - x[~inside], K[~inside] - 1.0)
        out[~inside] = np.where(q > 0, np.log(np.where(q > 0, q, 1.0)),
                                np.where(q == 0, -np.inf, np.nan))
    return out


def q_general(lam: ArrayLike, alpha: float, gamma: float,
              theta: ArrayLike) -> NDArray[np.float64]:
    """sum_k theta_k r^(k-1) for an explicit Theta (eq. 29), summed term by term in chunks of
    powers; any Theta, but O(K) work per eigenvalue."""
    t = check_theta(theta)
    lam = np.asarray(lam, dtype=np.float64)
    r = (1.0 - gamma * (lam + alpha)).reshape(-1, 1)
    total = np.zeros(r.shape[0])
    for k0 in range(0, t.size, _CHUNK):
        ks = np.arange(k0, min(k0 + _CHUNK, t.size), dtype=np.float64)
        with np.errstate(under="ignore"):
            total += (np.power(r, ks) * t[k0 : k0 + ks.size]).sum(axis=1)
    return total.reshape(lam.shape)


def q_eigenvalues(lam: ArrayLike, alpha: float, gamma: float,
                  theta: ArrayLike) -> NDArray[np.float64]:
    """Q(alpha, gamma, Theta)'s eigenvalue on each eigenvalue lam of A (Lemma 9, eq. 29).

    A Theta that is a multiple of Theta_{1:K} takes the closed geometric sum, one that is a
    multiple of Theta_K the single power; any other Theta is summed term by term."""
    t = check_theta(theta)
    if np.all(t == t[0]):
        return t[0] * q_ones(lam, alpha, gamma, t.size)
    if not np.any(t[:-1]):
        return t[-1] * q_last(lam, alpha, gamma, t.size)
    return q_general(lam, alpha, gamma, t)


# ------------------------------------------------------------------------------------------
# Matrices: Q_i (eq. 6), the surrogate (eqs. 7-8) and the minimizers (Lemma 11)


def _sym_eig(A: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    A = np.asarray(A, dtype=np.float64)
    if A.shape[-1] != A.shape[-2] or not np.allclose(A, np.swapaxes(A, -1, -2)):
        raise ValueError("A must be symmetric (d, d) matrices")
    return np.linalg.eigh(A)


def _from_eig(vals: NDArray[np.float64], vecs: NDArray[np.float64]) -> NDArray[np.float64]:
    return (vecs * vals[..., None, :]) @ np.swapaxes(vecs, -1, -2)


def distortion_matrix(A: ArrayLike, alpha: float, gamma: float,
                      theta: ArrayLike) -> NDArray[np.float64]:
    """Q_i(alpha, gamma, Theta) = sum_k theta_k (I - gamma (A_i + alpha I))^(k-1) (eq. 6,
    line 165), through the eigen-decomposition of A_i; A of shape (d, d) or (n, d, d)."""
    lam, V = _sym_eig(A)
    return _from_eig(q_eigenvalues(lam, alpha, gamma, theta), V)


def distortion_cond(A: ArrayLike, alpha: float, gamma: float, theta: ArrayLike) -> float:
    """cond(Q_i) for one client (Lemma 6, line 288: at most kappa_0 / kappa in its settings);
    inf when Q_i is not positive definite."""
    lam = np.linalg.eigvalsh(np.asarray(A, dtype=np.float64))
    q = q_eigenvalues(lam, alpha, gamma, theta)
    return float(q.max() / q.min()) if q.min() > 0 else float("inf")


def cond(M: ArrayLike) -> float:
    """lambda_max / lambda_min of a symmetric matrix (cond, as line 215 writes it); inf unless it
    is positive definite."""
    lam = np.linalg.eigvalsh(np.asarray(M, dtype=np.float64))
    return float(lam[-1] / lam[0]) if lam[0] > 0 else float("inf")


def _population(A: ArrayLike, c: ArrayLike, p: ArrayLike | None):
    A = np.asarray(A, dtype=np.float64)
    c = np.asarray(c, dtype=np.float64)
    if A.ndim == 2:
        A, c = A[None], c.reshape(1, -1)
    if A.ndim != 3 or c.shape != A.shape[:2]:
        raise ValueError(f"A {A.shape} and c {c.shape} do not describe (n, d, d), (n, d)")
    n = A.shape[0]
    p = np.full(n, 1.0 / n) if p is None else np.asarray(p, dtype=np.float64).reshape(n)
    if np.any(p < 0) or not np.isclose(p.sum(), 1.0):
        raise ValueError("p must be a probability vector")
    return A, c, p


def client_quadratic(B: ArrayLike, c: ArrayLike,
                     weights: ArrayLike | None = None) -> tuple[NDArray, NDArray]:
    """(A_i, c_i) of a client whose examples z have losses 1/2 ||B_z^(1/2) (x - c_z)||^2
    (eq. 1, line 100): A_i = E[B_z], c_i = A_i^{-1} E[B_z c_z] (eq. 3, line 112). Then f_i
    equals 1/2 ||A_i^(1/2)(x - c_i)||^2 up to a constant (line 116)."""
    B = np.asarray(B, dtype=np.float64)
    c = np.asarray(c, dtype=np.float64)
    w = (np.full(len(B), 1.0 / len(B)) if weights is None
         else np.asarray(weights, dtype=np.float64) / np.sum(weights))
    A_i = np.einsum("z,zij->ij", w, B)
    return A_i, np.linalg.solve(A_i, np.einsum("z,zij,zj->i", w, B, c))


def surrogate_hessians(A: ArrayLike, alpha: float, gamma: float,
                       theta: ArrayLike) -> NDArray[np.float64]:
    """Q_i A_i for each client: the Hessian of f~_i (line 611). Symmetric because Q_i is a
    polynomial in A_i; its eigenvalues are q(lam) lam (eq. 30, line 595)."""
    lam, V = _sym_eig(A)
    return _from_eig(q_eigenvalues(lam, alpha, gamma, theta) * lam, V)


def surrogate_client_loss(x: ArrayLike, A_i: ArrayLike, c_i: ArrayLike, alpha: float,
                          gamma: float, theta: ArrayLike) -> float:
    """f~_i(x, alpha, gamma, Theta) = 1/2 (x - c_i)^T Q_i A_i (x - c_i) (eq. 7, line 169)."""
    H = surrogate_hessians(A_i, alpha, gamma, theta)
    e = np.asarray(x, dtype=np.float64) - np.asarray(c_i, dtype=np.float64)
    return float(0.5 * e @ H @ e)


def surrogate_client_gradient(x: ArrayLike, A_i: ArrayLike, c_i: ArrayLike, alpha: float,
                              gamma: float, theta: ArrayLike) -> NDArray[np.float64]:
    """grad f~_i = Q_i A_i (x - c_i): by Theorem 1 (line 177) the expected CLIENTUPDATE
    message of client i at x."""
    H = surrogate_hessians(A_i, alpha, gamma, theta)
    return H @ (np.asarray(x, dtype=np.float64) - np.asarray(c_i, dtype=np.float64))


def surrogate_loss(x: ArrayLike, A: ArrayLike, c: ArrayLike, alpha: float, gamma: float,
                   theta: ArrayLike, p: ArrayLike | None = None) -> float:
    """f~(x, alpha, gamma, Theta) = E_i f~_i (eq. 8, line 173)."""
    A, c, p = _population(A, c, p)
    e = np.asarray(x, dtype=np.float64)[None] - c
    H = surrogate_hessians(A, alpha, gamma, theta)
    return float(0.5 * np.einsum("n,ni,nij,nj->", p, e, H, e))


def surrogate_gradient(x: ArrayLike, A: ArrayLike, c: ArrayLike, alpha: float, gamma: float,
                       theta: ArrayLike, p: ArrayLike | None = None) -> NDArray[np.float64]:
    """grad f~ = E_i Q_i A_i (x - c_i): the expected server pseudo-gradient q_t (line 181)."""
    A, c, p = _population(A, c, p)
    e = np.asarray(x, dtype=np.float64)[None] - c
    return np.einsum("n,nij,nj->i", p, surrogate_hessians(A, alpha, gamma, theta), e)


def surrogate_minimizer(A: ArrayLike, c: ArrayLike, alpha: float, gamma: float,
                        theta: ArrayLike, p: ArrayLike | None = None) -> NDArray[np.float64]:
    """x*(alpha, gamma, Theta) = E[Q_i A_i]^{-1} E[Q_i A_i c_i] (Lemma 11, line 729): where
    LOCALUPDATE converges, which is not x* unless gamma = 0 or K(Theta) = 1 (line 308)."""
    A, c, p = _population(A, c, p)
    H = surrogate_hessians(A, alpha, gamma, theta)
    return np.linalg.solve(np.einsum("n,nij->ij", p, H), np.einsum("n,nij,nj->i", p, H, c))


def true_loss(x: ArrayLike, A: ArrayLike, c: ArrayLike, p: ArrayLike | None = None) -> float:
    """f(x) = E_i 1/2 (x - c_i)^T A_i (x - c_i) (eq. 2 with line 116's form)."""
    A, c, p = _population(A, c, p)
    e = np.asarray(x, dtype=np.float64)[None] - c
    return float(0.5 * np.einsum("n,ni,nij,nj->", p, e, A, e))


def true_minimizer(A: ArrayLike, c: ArrayLike, p: ArrayLike | None = None) -> NDArray:
    """x* = E[A_i]^{-1} E[A_i c_i], the minimizer of the empirical loss f (line 272)."""
    A, c, p = _population(A, c, p)
    return np.linalg.solve(np.einsum("n,nij->ij", p, A), np.einsum("n,nij,nj->i", p, A, c))


def minimizer_distance(A: ArrayLike, c: ArrayLike, alpha: float, gamma: float,
                       theta: ArrayLike, p: ArrayLike | None = None) -> float:
    """||x*(alpha, gamma, Theta) - x*||: the accuracy lost by optimizing the surrogate."""
    return float(np.linalg.norm(surrogate_minimizer(A, c, alpha, gamma, theta, p)
                                - true_minimizer(A, c, p)))


# ------------------------------------------------------------------------------------------
# Condition numbers (eqs. 9-13), rates (Table 2) and accuracy (Lemma 5, eq. 17)


def kappa(A: ArrayLike, alpha: float, gamma: float, theta: ArrayLike,
          p: ArrayLike | None = None) -> float:
    """kappa(alpha, gamma, Theta) = E_i lambda_max(Q_i A_i) / E_i lambda_min(Q_i A_i) (eq. 9,
    line 213), an upper bound on cond(f~) (Lemma 2). inf if the denominator is <= 0 (gamma
    outside Lemma 1's range with an odd power going negative)."""
    A, _, p = _population(A, np.zeros(np.shape(A)[:-1]), p)
    lam = np.linalg.eigvalsh(A)
    h = q_eigenvalues(lam, alpha, gamma, theta) * lam
    lo, hi = float(p @ h.min(axis=1)), float(p @ h.max(axis=1))
    return hi / lo if lo > 0 else float("inf")


def surrogate_cond(A: ArrayLike, alpha: float, gamma: float, theta: ArrayLike,
                   p: ArrayLike | None = None) -> float:
    """cond(f~) = cond(E_i Q_i A_i), what kappa bounds (Lemma 2, line 215)."""
    A, _, p = _population(A, np.zeros(np.shape(A)[:-1]), p)
    return cond(np.einsum("n,nij->ij", p, surrogate_hessians(A, alpha, gamma, theta)))


def phi(lam: ArrayLike, alpha: ArrayLike, gamma: ArrayLike, K: ArrayLike) -> NDArray:
    """phi(lam, alpha, gamma, K) = sum_{k=1}^K (1 - gamma (lam + alpha))^(k-1) lam (eq. 10,
    line 219): Q A's eigenvalue for Theta_{1:K}; closed form eq. 33 (line 653)."""
    return q_ones(lam, alpha, gamma, K) * np.asarray(lam, dtype=np.float64)


def psi(lam: ArrayLike, alpha: ArrayLike, gamma: ArrayLike, K: ArrayLike) -> NDArray:
    """psi(lam, alpha, gamma, K) = (1 - gamma (lam + alpha))^(K-1) lam (eq. 12, line 229):
    Q A's eigenvalue for Theta_K."""
    return q_last(lam, alpha, gamma, K) * np.asarray(lam, dtype=np.float64)


def kappa_bound_ones(mu: float, L: float, alpha: ArrayLike, gamma: ArrayLike,
                     K: ArrayLike) -> NDArray:
    """phi(L) / phi(mu), Lemma 3's bound on kappa(alpha, gamma, Theta_{1:K}) (eq. 11, line
    225); valid for gamma < 1/(L + alpha), tight for A = diag(L, mu) (App. B.3, line 705)."""
    return phi(L, alpha, gamma, K) / phi(mu, alpha, gamma, K)


def kappa_bound_last(mu: float, L: float, alpha: ArrayLike, gamma: ArrayLike,
                     K: ArrayLike) -> NDArray:
    """((1 - gamma (L + alpha)) / (1 - gamma (mu + alpha)))^(K-1) L / mu, Lemma 4's bound on
    kappa(alpha, gamma, Theta_K) (eq. 13, line 235); valid for gamma < 1/(K L + alpha)."""
    gamma = np.asarray(gamma, dtype=np.float64)
    K = np.asarray(K, dtype=np.float64)
    return np.exp((K - 1.0) * (np.log1p(-gamma * (L + alpha)) - np.log1p(-gamma * (mu + alpha)))
                  ) * (L / mu)


def _rate_from_log_kappa(log_kappa: ArrayLike, momentum: Momentum) -> NDArray:
    lk = np.asarray(log_kappa, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        if momentum == "none":
            return np.tanh(lk / 2.0)  # (kappa - 1) / (kappa + 1)
        if momentum == "heavy_ball":
            return np.tanh(lk / 4.0)  # (sqrt kappa - 1) / (sqrt kappa + 1)
        if momentum == "nesterov":
            return 1.0 - 2.0 / np.sqrt(3.0 * np.exp(lk) + 1.0)
    raise ValueError(f"momentum must be one of {MOMENTA}, got {momentum!r}")


def rate(kappa: ArrayLike, momentum: Momentum = "none") -> NDArray:
    """The convergence rate rho of Theorem 3 (line 249) from Table 2 (lines 257-262).

    none: (kappa - 1)/(kappa + 1); Nesterov: 1 - 2/sqrt(3 kappa + 1); heavy-ball:
    (sqrt kappa - 1)/(sqrt kappa + 1). The heavy-ball cell reads sqrt(kappa - 1)/sqrt(kappa + 1)
    in the seed's text (line 262); that would make heavy-ball slower than no momentum, against
    line 325 and the cited Lessard et al. (2016, Prop. 1), so the standard form is used.
    kappa = inf gives 1."""
    with np.errstate(divide="ignore"):
        return _rate_from_log_kappa(np.log(np.asarray(kappa, dtype=np.float64)), momentum)


def server_hyperparameters(mu: float, L: float, momentum: Momentum = "none") -> tuple[float,
                                                                                       float]:
    """(step size, momentum beta) that give gradient descent the rate of Table 2 on an
    L-smooth, mu-strongly convex quadratic: Lessard et al. (2016, Prop. 1), which the seed
    cites for Table 2 (line 247); the values are theirs, the seed does not list them.

    none: 2/(L + mu), beta 0. Nesterov (y = x_t + beta (x_t - x_{t-1}),
    x_{t+1} = y - step grad(y)): 4/(3L + mu), beta = (sqrt(3k+1) - 2)/(sqrt(3k+1) + 2).
    Heavy-ball (x_{t+1} = x_t - step grad(x_t) + beta (x_t - x_{t-1})): 4/(sqrt L + sqrt mu)^2,
    beta = ((sqrt k - 1)/(sqrt k + 1))^2; k = L/mu."""
    k = L / mu
    if momentum == "none":
        return 2.0 / (L + mu), 0.0
    if momentum == "nesterov":
        s = np.sqrt(3.0 * k + 1.0)
        return 4.0 / (3.0 * L + mu), float((s - 2.0) / (s + 2.0))
    if momentum == "heavy_ball":
        return 4.0 / (np.sqrt(L) + np.sqrt(mu)) ** 2, float(((np.sqrt(k) - 1) / (np.sqrt(k) + 1))
                                                             ** 2)
    raise ValueError(f"momentum must be one of {MOMENTA}, got {momentum!r}")


def suboptimality(kappa: ArrayLike, kappa0: ArrayLike) -> NDArray:
    """Delta = (sqrt kappa_0 - sqrt kappa)/(sqrt kappa_0 + sqrt kappa) (eq. 17, line 312), with
    kappa_0 = L/mu (line 286): Theorem 4's bound on ||x*(alpha, gamma, Theta) - x*|| / (8C)."""
    k = np.sqrt(np.asarray(kappa, dtype=np.float64))
    k0 = np.sqrt(np.asarray(kappa0, dtype=np.float64))
    return (k0 - k) / (k0 + k)


def q_extremes(A: ArrayLike, alpha: float, gamma: float,
               theta: ArrayLike) -> tuple[float, float]:
    """(a, b) = (min_i lambda_min(Q_i), max_i lambda_max(Q_i)), Lemma 5's a and b (line 278)."""
    lam = np.linalg.eigvalsh(np.asarray(A, dtype=np.float64))
    q = q_eigenvalues(lam, alpha, gamma, theta)
    return float(q.min()), float(q.max())


def lemma5_bound(A: ArrayLike, c: ArrayLike, alpha: float, gamma: float, theta: ArrayLike,
                 constant: float = 8.0) -> float:
    """constant * C (sqrt b - sqrt a)/(sqrt b + sqrt a) with C = max_i ||c_i|| (Lemma 5, eq. 15,
    line 280: constant 8; Lemma 12, line 801: constant 2 when d = 1)."""
    A, c, _ = _population(A, c, None)
    a, b = q_extremes(A, alpha, gamma, theta)
    C = float(np.linalg.norm(c, axis=1).max())
    return constant * C * (np.sqrt(b) - np.sqrt(a)) / (np.sqrt(b) + np.sqrt(a))


# ------------------------------------------------------------------------------------------
# Pareto frontiers (Section 5, lines 306-357; App. D, lines 1026-1059)


@dataclass(frozen=True)
class Frontier:
    """(rho, Delta) along a sweep of K or gamma, with what produced each point.

    ``valid`` marks the points inside the theory's range: gamma < 1/(L + alpha) for FedAvg
    (Theorem 3, line 249), gamma < 1/(K L + alpha) for MAML (Lemma 4, line 233; App. D.2 keeps
    only those in Fig. 9, line 1045). The simulated figures plot MAML beyond it (line 351)."""

    rho: NDArray[np.float64]
    delta: NDArray[np.float64]
    log_kappa: NDArray[np.float64]
    log_cond_q: NDArray[np.float64]
    K: NDArray[np.float64]
    gamma: NDArray[np.float64]
    valid: NDArray[np.bool_]

    @property
    def kappa(self) -> NDArray[np.float64]:
        with np.errstate(over="ignore"):
            return np.exp(self.log_kappa)


def frontier_from_spectrum(lam: ArrayLike, alpha: float, gamma: ArrayLike, K: ArrayLike,
                           family: Family, momentum: Momentum = "none",
                           delta: Literal["eq17", "lemma5"] = "eq17") -> Frontier:
    """(rho, Delta) of one client with A's eigenvalues ``lam`` as K and/or gamma vary.

    lam: (d,) for one spectrum, or (n, d) for one spectrum per point (the simulated figures
    draw a fresh A per K). gamma and K broadcast to the n points. Theta is Theta_{1:K}
    (``family="fedavg"``) or Theta_K (``"maml"``). kappa is cond(Q A) (eq. 9 with one client),
    rho comes from Table 2, and Delta is either eq. 17 with kappa_0 = max lam / min lam
    (``"eq17"``, the main text, line 312) or Lemma 5's (sqrt b - sqrt a)/(sqrt b + sqrt a)
    from Q's extreme eigenvalues (``"lemma5"``, App. D.1, line 1030). The two agree wherever
    Lemma 6 (line 288) holds with equality, which it does in the ranges of Lemmas 3-4 when A's
    extreme eigenvalues are mu and L; they differ for MAML beyond gamma = 1/(K L + alpha).
    Everything is computed from log-eigenvalues: at K = 10^6 kappa overflows float64."""
    lam = np.atleast_2d(np.asarray(lam, dtype=np.float64))
    gamma = np.asarray(gamma, dtype=np.float64)
    K = np.asarray(K, dtype=np.float64)
    n = np.broadcast_shapes(lam.shape[:1], np.shape(gamma), np.shape(K))
    gamma, K = np.broadcast_to(gamma, n), np.broadcast_to(K, n)
    lam = np.broadcast_to(lam, n + lam.shape[1:])
    if family not in ("fedavg", "maml"):
        raise ValueError(f"family must be 'fedavg' or 'maml', got {family!r}")
    log_q = (log_q_ones if family == "fedavg" else log_q_last)(lam, alpha, gamma[:, None],
                                                                 K[:, None])
    log_h = log_q + np.log(lam)
    log_kappa = log_h.max(axis=1) - log_h.min(axis=1)
    log_cond_q = log_q.max(axis=1) - log_q.min(axis=1)
    rho = _rate_from_log_kappa(log_kappa, momentum)
    if delta == "eq17":
        log_kappa0 = np.log(lam.max(axis=1) / lam.min(axis=1))
        d = np.tanh((log_kappa0 - log_kappa) / 4.0)
    elif delta == "lemma5":
        d = np.tanh(log_cond_q / 4.0)
    else:
        raise ValueError(f"delta must be 'eq17' or 'lemma5', got {delta!r}")
    L = lam.max(axis=1)
    valid = gamma < 1.0 / ((L if family == "fedavg" else K * L) + alpha)
    return Frontier(rho, d, log_kappa, log_cond_q, np.array(K), np.array(gamma), valid)


def analytic_frontier(mu: float, L: float, alpha: float, gamma: ArrayLike, K: ArrayLike,
                      family: Family, momentum: Momentum = "none") -> Frontier:
    """The frontier of Figs. 1-4 and 9: kappa from Lemma 3/4's bound (eqs. 11, 13), which is
    kappa exactly for A = diag(L, mu) (App. B.3, line 705), and Delta from eq. 17."""
    return frontier_from_spectrum(np.array([mu, L]), alpha, gamma, K, family, momentum, "eq17")


def continuum_maml_frontier(mu: float, L: float, alpha: float, gamma: float, K: ArrayLike,
                            momentum: Momentum = "none") -> Frontier:
    """MAML's simulated frontier in the limit of A's spectrum filling [mu, L] (our addition,
    not the seed's): kappa = max over lam in [mu, L] of psi / min(psi(mu), psi(L)).

    log psi(lam) = (K-1) log(1 - gamma (lam + alpha)) + log lam is concave in lam, so its
    minimum over [mu, L] is at an end and its maximum at lam* = (1 - gamma alpha)/(gamma K)
    clipped to [mu, L]. Delta is Lemma 5's, which depends on the ends only."""
    K = np.asarray(K, dtype=np.float64)
    star = np.clip((1.0 - gamma * alpha) / (gamma * K), mu, L)
    lam = np.stack([np.full_like(K, mu), star, np.full_like(K, L)], axis=1)
    return frontier_from_spectrum(lam, alpha, gamma, K, "maml", momentum, "lemma5")


def curve_delta(rho: ArrayLike, kappa0: float, momentum: Momentum = "none") -> NDArray:
    """The Delta that eq. 17 pairs with rate rho: Table 2 inverted for kappa, then eq. 17.

    With eq. 17, every (rho, Delta) of a given SERVEROPT and kappa_0 lies on this one curve,
    whatever alpha, gamma and Theta produced kappa: methods differ only in how much of it they
    reach. ``delta - curve_delta(rho)`` is a point's distance (in Delta) from that curve."""
    rho = np.asarray(rho, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        if momentum == "none":
            log_k = 2.0 * np.arctanh(rho)
        elif momentum == "heavy_ball":
            log_k = 4.0 * np.arctanh(rho)
        elif momentum == "nesterov":
            log_k = np.log((4.0 / (1.0 - rho) ** 2 - 1.0) / 3.0)
        else:
            raise ValueError(f"momentum must be one of {MOMENTA}, got {momentum!r}")
    return np.tanh((np.log(kappa0) - log_k) / 4.0)


def k_grid(points: int, k_max: int = 10**6) -> NDArray[np.int64]:
    """``points`` log-spaced values in [1, k_max], rounded to integers, duplicates removed (so
    fewer than ``points`` come back: the small K repeat)."""
    return np.unique(np.rint(np.logspace(0.0, np.log10(k_max), points)).astype(np.int64))


def random_spectra(n: int, d: int, mu: float, L: float,
                   rng: np.random.Generator) -> NDArray[np.float64]:
    """Eigenvalues of n random A in R^{d x d} drawn as in App. D.1 (lines 1032-1034): B with
    N(0, 1) entries and A = beta_1 B^T B + beta_2 I with the unique beta_1, beta_2 that make
    lambda_min(A) = mu and lambda_max(A) = L. Shape (n, d), ascending. Only the spectrum is
    kept: Q(alpha, gamma, Theta) is a polynomial in A, so kappa and cond(Q) depend on A's
    eigenvalues alone (Lemma 9)."""
    B = rng.standard_normal((n, d, d))
    s = np.linalg.eigvalsh(np.swapaxes(B, 1, 2) @ B)
    return rescale_spectra(s, mu, L)


def rescale_spectra(s: ArrayLike, mu: float, L: float) -> NDArray[np.float64]:
    """beta_1 s + beta_2 with beta_1 = (L - mu)/(s_max - s_min) and beta_2 = mu - beta_1 s_min,
    row by row: the affine map of App. D.1 (line 1032) applied to B^T B's eigenvalues s."""
    s = np.sort(np.atleast_2d(np.asarray(s, dtype=np.float64)), axis=1)
    lo, hi = s.min(axis=1, keepdims=True), s.max(axis=1, keepdims=True)
    out = mu + (L - mu) * (s - lo) / (hi - lo)
    out[:, 0], out[:, -1] = mu, L  # exact ends, as the construction prescribes
    return out


def random_quadratic(d: int, mu: float, L: float, rng: np.random.Generator) -> NDArray:
    """One matrix A of App. D.1's construction (lines 1032-1034), for tests and examples."""
    B = rng.standard_normal((d, d))
    S = B.T @ B
    s = np.linalg.eigvalsh(S)
    beta1 = (L - mu) / (s[-1] - s[0])
    return beta1 * S + (mu - beta1 * s[0]) * np.eye(d)


def hausdorff(a: Sequence[NDArray], b: Sequence[NDArray]) -> float:
    """Hausdorff distance between two point sets in the (rho, Delta) plane, each given as
    (rho, Delta) arrays; used to say how far two sampled frontiers are apart."""
    P = np.stack([np.asarray(a[0]), np.asarray(a[1])], axis=1)
    R = np.stack([np.asarray(b[0]), np.asarray(b[1])], axis=1)
    D = np.sqrt(((P[:, None, :] - R[None, :, :]) ** 2).sum(-1))
    return float(max(D.min(axis=1).max(), D.min(axis=0).max()))
