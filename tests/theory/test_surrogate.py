"""fedray.theory.surrogate against first principles: brute-force matrix sums, simulated
LOCALUPDATE clients (Algorithm 2 of seed 002), finite differences, and the seed's lemmas.

"line N" is a line of shared/seeds/002_ca229c69b5271fde.txt. Pure NumPy, float64."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fedray.theory import surrogate as S

MU, L = 1.0, 5.0


def rotation(d: int, rng: np.random.Generator) -> np.ndarray:
    return np.linalg.qr(rng.standard_normal((d, d)))[0]


def spd(d: int, rng: np.random.Generator, mu: float = MU, L: float = L,
        ends: bool = False) -> np.ndarray:
    """A random symmetric matrix with eigenvalues in [mu, L] (exactly mu and L if ends)."""
    lam = rng.uniform(mu, L, d)
    if ends:
        lam[:2] = mu, L
    V = rotation(d, rng)
    return (V * lam) @ V.T


def population(n: int, d: int, rng: np.random.Generator, **kw):
    A = np.stack([spd(d, rng, **kw) for _ in range(n)])
    c = rng.standard_normal((n, d))
    p = rng.dirichlet(np.ones(n))
    return A, c, p


def brute_q(A: np.ndarray, alpha: float, gamma: float, theta, power_offset: int = -1):
    """sum_k theta_k (I - gamma (A + alpha I))^(k + power_offset), by explicit matrix powers
    (eq. 6, line 165, is power_offset = -1)."""
    M = np.eye(len(A)) - gamma * (A + alpha * np.eye(len(A)))
    return sum(t * np.linalg.matrix_power(M, k + power_offset)
               for k, t in enumerate(theta, start=1))


def client_update(x: np.ndarray, examples, alpha: float, gamma: float, theta,
                  batches=None) -> np.ndarray:
    """Algorithm 2 (lines 128-138) in float64: K(Theta) steps on the client's examples (full
    batch, or the given example index per step), returning sum_k theta_k g_k."""
    B, c = examples
    x1, xk, msg = x.copy(), x.copy(), np.zeros_like(x)
    for k, t in enumerate(S.check_theta(theta)):
        idx = range(len(B)) if batches is None else [batches[k]]
        g = np.mean([B[z] @ (xk - c[z]) for z in idx], axis=0) + alpha * (xk - x1)
        msg += t * g
        xk = xk - gamma * g
    return msg


def examples(n_ex: int, d: int, rng: np.random.Generator):
    """A client's examples z: PSD B_z (eq. 1) whose mean is well conditioned, and c_z."""
    B = np.stack([spd(d, rng, 0.5, 3.0) for _ in range(n_ex)])
    return B, rng.standard_normal((n_ex, d))


THETAS = {
    "ones": S.theta_ones(6),
    "last": S.theta_last(6),
    "index3": S.theta_index(3),
    "explicit": np.array([0.5, 0.0, 2.0, 0.0, 1.5]),
    "scaled_ones": 0.3 * S.theta_ones(4),
}


# ------------------------------------------------------------------------------------------
# Theta


def test_theta_helpers_follow_eqs_4_and_5():
    assert S.theta_ones(3).tolist() == [1, 1, 1]
    assert S.theta_last(3).tolist() == [0, 0, 1]
    assert S.theta_index(1).tolist() == [1]
    assert S.theta_K([0.0, 2.0, 0.0, 0.0]) == 2  # trailing zeros are not steps
    assert S.theta_w([0.5, 0.0, 2.0]) == 2.5
    assert S.theta_K(S.theta_last(7)) == 7 and S.theta_w(S.theta_last(7)) == 1
    for bad in ([], [0.0, 0.0], [1.0, -0.1], [np.nan]):
        with pytest.raises(ValueError):
            S.check_theta(bad)


# ------------------------------------------------------------------------------------------
# Q (eq. 6) and its closed forms


@pytest.mark.parametrize("name", THETAS)
@pytest.mark.parametrize("alpha,gamma", [(0.0, 0.05), (0.7, 0.1), (0.0, 0.3)])
def test_distortion_matrix_is_the_sum_of_matrix_powers(name, alpha, gamma):
    """gamma = 0.3 > 1/L: r < 0 on the top eigenvalue, outside Lemma 1 but still eq. 6."""
    rng = np.random.default_rng(1)
    A = spd(4, rng)
    theta = THETAS[name]
    Q = S.distortion_matrix(A, alpha, gamma, theta)
    assert np.allclose(Q, brute_q(A, alpha, gamma, theta), rtol=1e-12, atol=1e-12)
    assert np.allclose(Q, Q.T)
    # the test can fail: with (.)^k instead of (.)^(k-1) it does, unless Theta = Theta_1
    assert not np.allclose(Q, brute_q(A, alpha, gamma, theta, power_offset=0), atol=1e-3)


def test_distortion_matrix_stacks_clients():
    rng = np.random.default_rng(2)
    A = np.stack([spd(3, rng) for _ in range(4)])
    Q = S.distortion_matrix(A, 0.2, 0.04, S.theta_ones(5))
    for i in range(4):
        assert np.allclose(Q[i], brute_q(A[i], 0.2, 0.04, S.theta_ones(5)), atol=1e-12)


CASES = [(K, a, g) for K in (1, 2, 50, 1000, 10**5)
         for a, g in ((0.0, 1e-7), (0.0, 0.01), (2.0, 0.1), (0.0, 0.999 / L), (0.0, 0.3))
         if not (g * (L + a) > 1 and K > 1000)]  # |r| > 1 there: the powers overflow
CASES.append((10**6, 0.0, 1e-7))  # r within 1e-6 of 1 at the figures' largest K (Fig. 9)


@pytest.mark.parametrize("K,alpha,gamma", CASES)
def test_closed_forms_match_the_term_by_term_sum(K, alpha, gamma):
    lam = np.array([MU, 2.3, L])
    gen_ones = S.q_general(lam, alpha, gamma, S.theta_ones(K))
    gen_last = S.q_general(lam, alpha, gamma, S.theta_last(K))
    assert np.allclose(S.q_ones(lam, alpha, gamma, K), gen_ones, rtol=1e-10, atol=1e-300)
    assert np.allclose(S.q_last(lam, alpha, gamma, K), gen_last, rtol=1e-10, atol=1e-300)
    # the dispatcher picks the closed forms, the log forms agree where q > 0
    assert np.allclose(S.q_eigenvalues(lam, alpha, gamma, S.theta_ones(K)), gen_ones, rtol=1e-10)
    # (an absolute error in log q is a relative error in q; the reference's own rounding of
    # r = 1 - 1e-7, raised to the power 1e5, is ~1e-11)
    pos = gen_ones > 0
    assert np.allclose(S.log_q_ones(lam, alpha, gamma, K)[pos], np.log(gen_ones[pos]),
                       rtol=0, atol=1e-10)
    pos = gen_last > 1e-300
    assert np.allclose(S.log_q_last(lam, alpha, gamma, K)[pos], np.log(gen_last[pos]),
                       rtol=0, atol=1e-10)
    if K > 1 and gamma * (L + alpha) < 1:  # a wrong exponent is caught: r^K is not r^(K-1)
        wrong = K * np.log1p(-gamma * (lam + alpha))  # (in logs: r^K underflows at K = 10^6)
        assert np.abs(S.log_q_last(lam, alpha, gamma, K) - wrong).min() > 1e-9


def test_log_forms_survive_where_q_underflows():
    """K = 10^6, gamma = 0.001, lam = 10: q_last = 0.99^999999 ~ e^-10050 underflows, but its
    log is exact; the geometric sum tends to 1/(gamma lam)."""
    assert S.q_last(10.0, 0.0, 0.001, 10**6) == 0.0
    assert np.isclose(S.log_q_last(10.0, 0.0, 0.001, 10**6), 999999 * np.log(0.99), rtol=1e-14)
    assert np.isclose(S.q_ones(10.0, 0.0, 0.001, 10**6), 100.0, rtol=1e-14)
    assert np.isclose(S.q_ones(1.0, 0.0, 1e-9, 10), 10 - 45e-9, rtol=1e-14)  # r -> 1


# ------------------------------------------------------------------------------------------
# Theorem 1: the expected client message is the surrogate gradient


@pytest.mark.parametrize("name", THETAS)
@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_surrogate_gradient_is_the_deterministic_client_message(name, alpha):
    """Full-batch clients: Lemma 7 and Theorem 1 (lines 462, 490) hold without expectation."""
    rng = np.random.default_rng(3)
    theta, gamma, d = THETAS[name], 0.08, 3
    clients = [examples(4, d, rng) for _ in range(3)]
    quads = [S.client_quadratic(B, c) for B, c in clients]  # eq. 3
    A = np.stack([a for a, _ in quads])
    c = np.stack([ci for _, ci in quads])
    p = np.array([0.2, 0.5, 0.3])
    x = rng.standard_normal(d)
    msgs = [client_update(x, ex, alpha, gamma, theta) for ex in clients]
    for i, m in enumerate(msgs):
        assert np.allclose(m, S.surrogate_client_gradient(x, A[i], c[i], alpha, gamma, theta),
                           rtol=1e-11, atol=1e-12)
    q_t = sum(pi * m for pi, m in zip(p, msgs, strict=True))
    assert np.allclose(q_t, S.surrogate_gradient(x, A, c, alpha, gamma, theta, p), atol=1e-12)
    # a wrong Q (powers k instead of k-1) is caught
    wrong = brute_q(A[0], alpha, gamma, theta, power_offset=0) @ A[0] @ (x - c[0])
    assert not np.allclose(msgs[0], wrong, atol=1e-4)


def test_theorem1_in_expectation_over_every_minibatch_sequence():
    """B = 1 and 3 examples: the expectation over the 27 equally likely sequences of K = 3
    sampled examples, computed exactly, is the surrogate gradient (Theorem 1, line 177)."""
    rng = np.random.default_rng(4)
    ex = examples(3, 2, rng)
    A_i, c_i = S.client_quadratic(*ex)
    x, alpha, gamma, theta = rng.standard_normal(2), 0.4, 0.15, np.array([0.5, 1.0, 2.0])
    msgs = [client_update(x, ex, alpha, gamma, theta, batches=seq)
            for seq in itertools.product(range(3), repeat=3)]
    expected = np.mean(msgs, axis=0)
    assert np.allclose(expected, S.surrogate_client_gradient(x, A_i, c_i, alpha, gamma, theta),
                       atol=1e-12)
    assert np.std([m[0] for m in msgs]) > 0.1  # the single messages do differ


def test_surrogate_loss_gradient_and_minimizer_are_consistent():
    rng = np.random.default_rng(5)
    A, c, p = population(4, 3, rng)
    alpha, gamma, theta = 0.3, 0.05, np.array([1.0, 0.0, 0.5, 2.0])
    x, h = rng.standard_normal(3), 1e-4
    fd = np.array([(S.surrogate_loss(x + h * e, A, c, alpha, gamma, theta, p)
                    - S.surrogate_loss(x - h * e, A, c, alpha, gamma, theta, p)) / (2 * h)
                   for e in np.eye(3)])
    assert np.allclose(fd, S.surrogate_gradient(x, A, c, alpha, gamma, theta, p), atol=1e-8)
    xs = S.surrogate_minimizer(A, c, alpha, gamma, theta, p)
    assert np.allclose(S.surrogate_gradient(xs, A, c, alpha, gamma, theta, p), 0, atol=1e-12)
    assert S.minimizer_distance(A, c, alpha, gamma, theta, p) > 1e-3  # heterogeneous clients
    xt = S.true_minimizer(A, c, p)
    grad_f = np.einsum("n,nij,nj->i", p, A, xt[None] - c)
    assert np.allclose(grad_f, 0, atol=1e-12)


# ------------------------------------------------------------------------------------------
# Theorem 2: MAML is Theta_{2K+1}


@pytest.mark.parametrize("K", [1, 2, 5])
def test_maml_gradient_is_the_theta_2k_plus_1_surrogate_gradient(K):
    """grad of m(x) = f_i(X_K(x)), X_K = K full-batch GD steps (line 187), by central
    differences of the examples' own losses (eq. 1), equals grad f~_i(x, 0, gamma,
    Theta_{2K+1}) (Theorem 2, line 191) and the closed form (I - gA)^K A (I - gA)^K (x - c)."""
    rng = np.random.default_rng(6)
    B, cz = examples(5, 3, rng)
    A_i, c_i = S.client_quadratic(B, cz)
    gamma = 0.1

    def f_i(y):
        return np.mean([0.5 * (y - cz[z]) @ B[z] @ (y - cz[z]) for z in range(len(B))])

    def m(x):
        for _ in range(K):
            x = x - gamma * np.mean([B[z] @ (x - cz[z]) for z in range(len(B))], axis=0)
        return f_i(x)

    x, h = rng.standard_normal(3), 1e-3
    fd = np.array([(m(x + h * e) - m(x - h * e)) / (2 * h) for e in np.eye(3)])
    M = np.linalg.matrix_power(np.eye(3) - gamma * A_i, K)
    surrogate = S.surrogate_client_gradient(x, A_i, c_i, 0.0, gamma, S.theta_index(2 * K + 1))
    assert np.allclose(fd, surrogate, atol=1e-9)
    assert np.allclose(M @ A_i @ M @ (x - c_i), surrogate, atol=1e-12)
    wrong = S.surrogate_client_gradient(x, A_i, c_i, 0.0, gamma, S.theta_index(2 * K))
    assert not np.allclose(fd, wrong, atol=1e-4)


# ------------------------------------------------------------------------------------------
# gamma = 0 or K = 1: no distortion (line 183)


def test_gamma_zero_or_one_step_gives_w_times_f():
    rng = np.random.default_rng(7)
    A, c, p = population(3, 3, rng)
    x = rng.standard_normal(3)
    f = S.true_loss(x, A, c, p)
    for alpha, gamma, theta in [(0.0, 0.0, [1.0, 2.0, 0.5]), (0.8, 0.0, S.theta_last(9)),
                                (0.5, 0.1, [2.5])]:
        w = S.theta_w(theta)
        assert np.isclose(S.surrogate_loss(x, A, c, alpha, gamma, theta, p), w * f, rtol=1e-13)
        assert np.allclose(S.distortion_matrix(A, alpha, gamma, theta), w * np.eye(3))
    assert not np.isclose(S.surrogate_loss(x, A, c, 0.0, 0.1, [1.0, 1.0], p), 2 * f, rtol=1e-3)


def test_gamma_zero_costs_no_accuracy():
    """Delta = 0 at gamma = 0 (eq. 17 with kappa = kappa_0), and x*(alpha, 0, Theta) = x*."""
    rng = np.random.default_rng(8)
    A, c, p = population(4, 3, rng)
    for theta in (S.theta_ones(10), S.theta_last(10), [0.3, 0.0, 1.0]):
        assert S.minimizer_distance(A, c, 0.5, 0.0, theta, p) < 1e-12
        assert S.minimizer_distance(A, c, 0.0, 0.05, theta, p) > 1e-3 or S.theta_K(theta) == 1
    for fam in ("fedavg", "maml"):
        fr = S.analytic_frontier(MU, L, 0.3, 0.0, [1, 10, 1000], fam)
        assert np.allclose(fr.delta, 0, atol=1e-15)
        assert np.allclose(fr.kappa, L / MU)
    assert np.isclose(S.suboptimality(L / MU, L / MU), 0.0)


# ------------------------------------------------------------------------------------------
# Lemmas 2-6 on random instances, and their tightness (App. B.3)


@pytest.mark.parametrize("alpha", [0.0, 0.5])
@pytest.mark.parametrize("K", [1, 3, 20, 1000])
def test_lemma3_bounds_theta_ones(alpha, K):
    rng = np.random.default_rng(9)
    theta = S.theta_ones(K)
    for _ in range(5):
        A, c, p = population(4, 3, rng)
        gamma = rng.uniform(0, 1 / (L + alpha))
        kap = S.kappa(A, alpha, gamma, theta, p)
        bound = S.kappa_bound_ones(MU, L, alpha, gamma, K)
        assert S.surrogate_cond(A, alpha, gamma, theta, p) <= kap * (1 + 1e-12)  # Lemma 2
        assert kap <= bound * (1 + 1e-12)  # eq. 11
        H = np.einsum("n,nij->ij", p, S.surrogate_hessians(A, alpha, gamma, theta))
        lam = np.linalg.eigvalsh(H)
        assert lam[-1] <= S.phi(L, alpha, gamma, K) * (1 + 1e-12)  # phi(L)-smooth
        assert lam[0] >= S.phi(MU, alpha, gamma, K) * (1 - 1e-12)  # phi(mu)-strongly convex
        for Ai in A:  # Lemma 6
            assert S.distortion_cond(Ai, alpha, gamma, theta) <= (L / MU) / kap * (1 + 1e-12)
    # tight for A = diag(L, mu) (App. B.3, line 705)
    gamma = 0.5 / (L + alpha)
    D = np.diag([L, MU])
    assert np.isclose(S.kappa(D, alpha, gamma, theta), S.kappa_bound_ones(MU, L, alpha, gamma, K),
                      rtol=1e-13)


@pytest.mark.parametrize("alpha", [0.0, 0.5])
@pytest.mark.parametrize("K", [1, 3, 20, 1000])
def test_lemma4_bounds_theta_last(alpha, K):
    rng = np.random.default_rng(10)
    theta = S.theta_last(K)
    for _ in range(5):
        A, c, p = population(4, 3, rng)
        gamma = rng.uniform(0, 1 / (K * L + alpha))
        kap = S.kappa(A, alpha, gamma, theta, p)
        assert S.surrogate_cond(A, alpha, gamma, theta, p) <= kap * (1 + 1e-12)
        assert kap <= S.kappa_bound_last(MU, L, alpha, gamma, K) * (1 + 1e-12)  # eq. 13
        lam = np.linalg.eigvalsh(np.einsum("n,nij->ij", p,
                                           S.surrogate_hessians(A, alpha, gamma, theta)))
        assert lam[-1] <= S.psi(L, alpha, gamma, K) * (1 + 1e-12)
        assert lam[0] >= S.psi(MU, alpha, gamma, K) * (1 - 1e-12)
        for Ai in A:
            assert S.distortion_cond(Ai, alpha, gamma, theta) <= (L / MU) / kap * (1 + 1e-12)
    gamma = 0.5 / (K * L + alpha)
    assert np.isclose(S.kappa(np.diag([L, MU]), alpha, gamma, theta),
                      S.kappa_bound_last(MU, L, alpha, gamma, K), rtol=1e-12)


def test_lemma4_needs_its_step_size_condition():
    """Past gamma = 1/(K L + alpha) eq. 13 is no bound (line 237): it drops below 1."""
    K, gamma = 50, 0.1  # gamma (K L) = 25
    bound = S.kappa_bound_last(MU, L, 0.0, gamma, K)
    assert bound < 1 <= S.kappa(np.diag([L, MU]), 0.0, gamma, S.theta_last(K))


def test_lemma5_bounds_the_distance_between_minimizers():
    rng = np.random.default_rng(11)
    for theta in (S.theta_ones(8), S.theta_last(8), [1.0, 0.0, 3.0]):
        for _ in range(10):
            A, c, p = population(3, 3, rng)
            gamma = rng.uniform(0, 1 / L)
            dist = S.minimizer_distance(A, c, 0.0, gamma, theta, p)
            assert dist <= S.lemma5_bound(A, c, 0.0, gamma, theta)  # eq. 15, constant 8
        for _ in range(10):  # d = 1: constant 2 (Lemma 12, line 801)
            A1, c1, p1 = population(3, 1, rng)
            gamma = rng.uniform(0, 1 / L)
            assert (S.minimizer_distance(A1, c1, 0.0, gamma, theta, p1)
                    <= S.lemma5_bound(A1, c1, 0.0, gamma, theta, constant=2.0) + 1e-15)


def test_lemma12_is_nearly_attained_by_the_seeds_example():
    """App. C.2 (line 835): A = (4, 1), c = (1, -1), gamma = 1/8, Theta_K; with p -> 1 and
    K large the distance approaches 2 (eq. 37: 8p/(3p + 1)) and so does the bound."""
    A, c = np.array([[[4.0]], [[1.0]]]), np.array([[1.0], [-1.0]])
    p, K = np.array([0.999, 0.001]), 200
    dist = S.minimizer_distance(A, c, 0.0, 1 / 8, S.theta_last(K), p)
    bound = S.lemma5_bound(A, c, 0.0, 1 / 8, S.theta_last(K), constant=2.0)
    assert np.isclose(dist, 8 * p[0] / (3 * p[0] + 1), rtol=1e-6)
    assert dist <= bound and dist > 0.99 * bound


# ------------------------------------------------------------------------------------------
# Table 2 and Theorem 3


def test_table2_rates_at_known_kappa():
    assert np.isclose(S.rate(9.0, "none"), 0.8)
    assert np.isclose(S.rate(9.0, "heavy_ball"), 0.5)
    assert np.isclose(S.rate(9.0, "nesterov"), 1 - 2 / np.sqrt(28))
    for m in S.MOMENTA:
        assert S.rate(1.0, m) == 0.0 and S.rate(np.inf, m) == 1.0
    k = np.exp(np.linspace(1e-6, 20, 500))
    assert np.all(S.rate(k, "heavy_ball") < S.rate(k, "nesterov"))
    assert np.all(S.rate(k, "nesterov") < S.rate(k, "none"))
    with pytest.raises(ValueError):
        S.rate(2.0, "adam")


@pytest.mark.parametrize("momentum", S.MOMENTA)
def test_localupdate_with_server_momentum_converges_at_table2_rate(momentum):
    """Deterministic LOCALUPDATE (line 245): simulated clients, SERVEROPT tuned as in
    Lessard et al.; the error contracts at Table 2's rho for kappa = cond(f~) (Theorem 3).
    c = 0 keeps x* = 0, so the error is the iterate and float64 resolves it to 1e-300."""
    alpha, gamma, theta = 0.2, 0.05, S.theta_ones(4)
    B = np.array([np.diag([L, MU])])
    ex = (B, np.zeros((1, 2)))
    mu_t, L_t = S.phi(MU, alpha, gamma, 4), S.phi(L, alpha, gamma, 4)
    kap = S.kappa(B, alpha, gamma, theta)
    assert np.isclose(kap, L_t / mu_t)
    step, beta = S.server_hyperparameters(mu_t, L_t, momentum)
    x_prev = x = np.array([1.0, 1.0])
    norms = []
    for _ in range(200):
        y = x + beta * (x - x_prev) if momentum == "nesterov" else x
        q = client_update(y, ex, alpha, gamma, theta)
        x_new = y - step * q + (beta * (x - x_prev) if momentum == "heavy_ball" else 0)
        x_prev, x = x, x_new
        norms.append(np.linalg.norm(x))
    measured = (norms[199] / norms[99]) ** (1 / 100)
    rho = float(S.rate(kap, momentum))
    assert rho * 0.98 < measured < rho * 1.01


def test_localupdate_converges_to_the_surrogate_minimizer_not_x_star():
    rng = np.random.default_rng(12)
    clients = [examples(3, 2, rng) for _ in range(3)]
    quads = [S.client_quadratic(*ex) for ex in clients]
    A, c = np.stack([q[0] for q in quads]), np.stack([q[1] for q in quads])
    alpha, gamma, theta = 0.0, 0.2, S.theta_ones(5)
    H = np.mean(S.surrogate_hessians(A, alpha, gamma, theta), axis=0)
    step = 1 / np.linalg.eigvalsh(H)[-1]
    x = np.zeros(2)
    for _ in range(500):
        x = x - step * np.mean([client_update(x, ex, alpha, gamma, theta) for ex in clients], 0)
    assert np.allclose(x, S.surrogate_minimizer(A, c, alpha, gamma, theta), atol=1e-10)
    assert np.linalg.norm(x - S.true_minimizer(A, c)) > 1e-3


# ------------------------------------------------------------------------------------------
# Frontiers


def test_analytic_frontier_is_lemma3_4_and_eq17():
    K = S.k_grid(60)
    fa = S.analytic_frontier(MU, L, 0.5, 0.01, K, "fedavg", "nesterov")
    kap = S.kappa_bound_ones(MU, L, 0.5, 0.01, K)
    assert np.allclose(fa.kappa, kap, rtol=1e-10)
    assert np.allclose(fa.rho, S.rate(kap, "nesterov"), atol=1e-14)
    assert np.allclose(fa.delta, S.suboptimality(kap, L / MU), atol=1e-14)
    # on A = diag(L, mu) the frontier's kappa is kappa() of the matrix (moderate K)
    for k in (1, 7, 300):
        assert np.isclose(S.analytic_frontier(MU, L, 0.5, 0.01, k, "fedavg").kappa[0],
                          S.kappa(np.diag([L, MU]), 0.5, 0.01, S.theta_ones(k)), rtol=1e-12)
    g = 1 / (2 * L * K)
    ma = S.analytic_frontier(MU, L, 0.0, g, K, "maml")
    assert ma.valid.all()
    assert np.allclose(ma.kappa, S.kappa_bound_last(MU, L, 0.0, g, K), rtol=1e-10)
    # where Lemma 6 is an equality, eq. 17 and Lemma 5's form give the same Delta
    for fr, fam, gam in ((fa, "fedavg", 0.01), (ma, "maml", g)):
        l5 = S.frontier_from_spectrum([MU, L], 0.5 if fam == "fedavg" else 0.0, gam, K, fam,
                                      "nesterov" if fam == "fedavg" else "none", "lemma5")
        assert np.allclose(l5.delta, fr.delta, atol=1e-13)
    big = S.analytic_frontier(MU, L, 0.0, 0.001, 10**6, "fedavg")
    assert np.isfinite(big.rho).all() and big.rho[0] < 1e-12


def test_all_points_lie_on_one_curve_and_heavy_ball_is_symmetric():
    """With eq. 17, (rho, Delta) depends on kappa alone, so every method lies on one curve
    per SERVEROPT; for heavy-ball, kappa -> kappa_0/kappa swaps rho and Delta (our algebra,
    which settles the symmetry the seed conjectures at line 332)."""
    K = S.k_grid(80)
    for m in S.MOMENTA:
        fr = S.analytic_frontier(MU, 10.0, 0.0, 0.05, K, "fedavg", m)
        assert np.abs(fr.delta - S.curve_delta(fr.rho, 10.0, m)).max() < 1e-12
        mirror = np.abs(fr.rho - S.curve_delta(fr.delta, 10.0, m)).max()
        assert (mirror < 1e-12) if m == "heavy_ball" else (mirror > 0.05)


def test_simulated_spectra_and_the_dense_limit():
    rng = np.random.default_rng(13)
    A = S.random_quadratic(6, MU, L, rng)
    lam = np.linalg.eigvalsh(A)
    assert np.isclose(lam[0], MU) and np.isclose(lam[-1], L) and np.allclose(A, A.T)
    K = S.k_grid(50)
    spectra = S.random_spectra(len(K), 20, MU, L, rng)
    assert spectra.shape == (len(K), 20)
    assert (spectra[:, 0] == MU).all() and (spectra[:, -1] == L).all()
    sim = S.frontier_from_spectrum(spectra, 0.0, 0.01, K, "maml", "none", "lemma5")
    dense = S.continuum_maml_frontier(MU, L, 0.0, 0.01, K)
    assert np.all(sim.log_kappa <= dense.log_kappa + 1e-12)  # a max over fewer eigenvalues
    assert np.allclose(sim.delta, dense.delta)  # Q's extremes sit at mu and L either way
    below = K < 1 / (0.01 * L)  # inside Lemma 4's range the point is on FedAvg's curve
    assert np.abs(sim.delta - S.curve_delta(sim.rho, L / MU))[below].max() < 1e-12
    assert np.abs(sim.delta - S.curve_delta(sim.rho, L / MU))[~below].max() > 0.1
