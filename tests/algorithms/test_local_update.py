"""LOCALUPDATE and MAML (fedray/algorithms/local_update.py, seed 002 Alg. 1-2, Table 1,
Theorems 1-2, App. A) through the whole runtime, against an independent NumPy float64
re-implementation on linear-regression clients: f_i(w) = 1/2 ||X_i w - y_i||^2 / n_i, a
quadratic 1/2 (w - c_i)^T A_i (w - c_i) + const with A_i = X_i^T X_i / n_i and c_i the
client's least-squares solution.

With client.batch_size above every client's size each step is a full-batch gradient step
(a batch is a permutation of all the client's examples), so the reference needs no batch
order: every row of Table 1 is then deterministic. Theorem 1 is an expectation over the
batches; it is checked with small batches on many copies of one client (each copy draws its
own batches from its own seed), against the surrogate gradient within Monte Carlo error.

The runs use the inline backend (the driver and its worker in this process, bit-identical
to Ray's at one worker: tests/runtime/test_inline.py), so each takes milliseconds.
"""

from __future__ import annotations

import numpy as np
import pytest
from linear_regression import W0, D, linear_model_fn, regression_clients
from tolerance import ULPS_PER_STEP, f32_atol

import fedray
from fedray.core.sampling import sample_clients
from fedray.errors import ConfigError

SEED = 3
STEPS = 3  # K
ROUNDS = 3
GAMMA = 0.05  # client lr: small enough that every client's K-step map contracts
ETA = 0.5  # server lr

CLIENTS = regression_clients([5, 8, 11, 6, 9], seed=1, scale_step=0.25)


def job(out_dir, algorithm: dict, *, clients: int, per_round: int, lr: float = GAMMA,
        steps: int | None = STEPS, batch_size: int = 64, rounds: int = ROUNDS,
        server: dict | None = None) -> dict:
    return {"name": "local_update", "seed": SEED, "rounds": rounds, "model": {"loss": "mse"},
            "algorithm": algorithm,
            "client": {"lr": lr, "batch_size": batch_size, "local_steps": steps},
            "server": {"lr": ETA, **(server or {})},
            "sampling": {"clients_per_round": per_round},
            "runtime": {"backend": "inline", "num_workers": 1},
            "eval": {"central": False}, "checkpoint": {"every": 0},
            "output": {"dir": str(out_dir)}}


def run(out_dir, algorithm: dict, data=None, **kw) -> np.ndarray:
    data = CLIENTS if data is None else data
    per_round = kw.pop("per_round", min(3, len(data)))
    res = fedray.run(job(out_dir, algorithm, clients=len(data), per_round=per_round, **kw),
                     model_fn=linear_model_fn(), client_data=data)
    return res.weights["weight"].double().numpy().reshape(-1)


# -- the NumPy reference ------------------------------------------------------------------

def quadratic(data, i: int) -> tuple[np.ndarray, np.ndarray]:
    """A_i and c_i of client i (eq. 3)."""
    x, y = (a.astype(np.float64) for a in data[i])
    a = x.T @ x / len(y)
    return a, np.linalg.solve(a, x.T @ y / len(y))


def grad(data, i: int, w: np.ndarray) -> np.ndarray:
    x, y = (a.astype(np.float64) for a in data[i])
    return x.T @ (x @ w - y) / len(y)


def client_message(data, i: int, x: np.ndarray, gamma: float, alpha: float,
                   theta: list[float]) -> np.ndarray:
    """Alg. 2 with full-batch steps: g_k = grad f_i(x_k) + alpha (x_k - x),
    x_{k+1} = x_k - gamma g_k; the message is sum_k theta_k g_k."""
    w, q = x.copy(), np.zeros_like(x)
    for th in theta:
        g = grad(data, i, w) + alpha * (w - x)
        q += th * g
        w = w - gamma * g
    return q


def maml_message(data, i: int, x: np.ndarray, gamma: float, steps: int) -> np.ndarray:
    """grad_x f_i(X_K(x)) for K full-batch gradient steps: the chain rule through
    X_{k+1} = (I - gamma A_i) X_k + const, i.e. (I - gamma A_i)^K grad f_i(X_K)."""
    a, _ = quadratic(data, i)
    w = x.copy()
    for _ in range(steps):
        w = w - gamma * grad(data, i, w)
    return np.linalg.matrix_power(np.eye(len(x)) - gamma * a, steps) @ grad(data, i, w)


def server_numpy(data, message, rounds: int = ROUNDS, per_round: int = 3, eta: float = ETA,
                 momentum: float = 0.0) -> np.ndarray:
    """Alg. 1: q_t = (1/M) sum_i q_t^i over the sampled clients; SERVEROPT gradient descent
    (heavy-ball with ``momentum``: m <- beta m - q, x <- x + eta m)."""
    x, m = W0.astype(np.float64).copy(), np.zeros(D)
    for r in range(1, rounds + 1):
        ids = [int(c) for c in sample_clients(SEED, r, len(data), per_round)]
        q = np.mean([message(data, i, x) for i in ids], axis=0)
        m = momentum * m - q
        x = x + eta * m
    return x


def atol_for(expected: np.ndarray, steps: int = STEPS, rounds: int = ROUNDS) -> float:
    """float32 runtime vs the float64 reference: each local step rounds the gradient, the
    message's running sum and the new weights differently on the two sides
    (tolerance.ULPS_PER_STEP a step), and each round's float32 weights once more; ulps of the
    weights' size. A wrong formula is off by far more (each test checks the nearest wrong
    alternative is)."""
    return f32_atol(expected, W0, ulps=ULPS_PER_STEP * (steps + 1) * rounds)


# -- Table 1, row by row -------------------------------------------------------------------

ONE = {0: CLIENTS[2]}  # |P| = 1: a population of one client

TABLE_1 = {
    # name: (algorithm section, client lr, data, theta, alpha)
    "minibatch_sgd": ({"name": "minibatch_sgd"}, 0.0, ONE, [1.0], 0.0),
    "lookahead": ({"name": "local_update"}, GAMMA, ONE, [1.0] * STEPS, 0.0),
    "fedsgd": ({"name": "local_update"}, 0.0, CLIENTS, [1.0] * STEPS, 0.0),
    "fedavg_reptile": ({"name": "local_update"}, GAMMA, CLIENTS, [1.0] * STEPS, 0.0),
    "fedprox": ({"name": "local_update", "local_update": {"alpha": 0.5}}, GAMMA, CLIENTS,
                [1.0] * STEPS, 0.5),
    "fomaml": ({"name": "fomaml"}, GAMMA, CLIENTS, [0.0] * (STEPS - 1) + [1.0], 0.0),
    "theta_index_2": ({"name": "local_update", "local_update": {"theta": {"index": 2}}},
                      GAMMA, CLIENTS, [0.0, 1.0], 0.0),
    "theta_list": ({"name": "local_update", "local_update": {"theta": [0.5, 0.0, 2.0, 0.0]}},
                   GAMMA, CLIENTS, [0.5, 0.0, 2.0], 0.0),
}


@pytest.mark.parametrize("row", list(TABLE_1))
def test_table_1_against_numpy(tmp_path, row):
    algorithm, lr, data, theta, alpha = TABLE_1[row]
    per_round = min(3, len(data))
    got = run(tmp_path / row, algorithm, data, lr=lr, per_round=per_round)

    def message(d, i, x):
        return client_message(d, i, x, lr, alpha, theta)

    expected = server_numpy(data, message, per_round=per_round)
    atol = atol_for(expected)
    assert np.abs(expected - W0).max() > 0.05  # the model moved
    # the nearest wrong reading -- the plain gradient instead of the theta-weighted sum of
    # the steps' gradients -- is far outside the tolerance (for the one-step row, the
    # K = 3 version of it)
    wrong_theta = [1.0] * STEPS if len(theta) == 1 else [1.0]
    wrong = server_numpy(data, lambda d, i, x: client_message(d, i, x, lr, alpha, wrong_theta),
                         per_round=per_round)
    assert np.abs(wrong - expected).max() > 100 * atol
    np.testing.assert_allclose(got, expected, rtol=0, atol=atol)


def test_maml_against_numpy(tmp_path):
    """MAML's message: the exact gradient of f_i after K gradient steps (second order)."""
    got = run(tmp_path / "maml", {"name": "maml"})
    expected = server_numpy(CLIENTS, lambda d, i, x: maml_message(d, i, x, GAMMA, STEPS))
    fomaml = server_numpy(CLIENTS, lambda d, i, x: client_message(
        d, i, x, GAMMA, 0.0, [0.0] * STEPS + [1.0]))  # first order: the K+1-th gradient only
    atol = atol_for(expected, steps=2 * STEPS + 1)
    assert np.abs(fomaml - expected).max() > 100 * atol
    np.testing.assert_allclose(got, expected, rtol=0, atol=atol)


def test_theorem_2_maml_is_the_theta_2k_plus_1_surrogate(tmp_path):
    """Seed 002 Theorem 2: with full-batch gradient descent, MAML's message is the gradient of
    the Theta_{2K+1} surrogate, Q_i(0, gamma, Theta_{2K+1}) A_i (x - c_i), Q = (I - gamma
    A_i)^{2K} (eq. 6-7) -- checked on one round (x = W0) to float precision."""
    got = run(tmp_path / "maml1", {"name": "maml"}, rounds=1)
    ids = [int(c) for c in sample_clients(SEED, 1, len(CLIENTS), 3)]
    surrogate = []
    for i in ids:
        a, c = quadratic(CLIENTS, i)
        q = np.linalg.matrix_power(np.eye(D) - GAMMA * a, 2 * STEPS)
        surrogate.append(q @ a @ (W0 - c))
    expected = W0 - ETA * np.mean(surrogate, axis=0)
    np.testing.assert_allclose(got, expected, rtol=0, atol=atol_for(expected, 2 * STEPS + 1, 1))


def test_any_serveropt_heavy_ball(tmp_path):
    """SERVEROPT is the job's server optimizer: heavy-ball momentum on the mean message."""
    got = run(tmp_path / "hb", {"name": "local_update", "server_opt": "momentum"},
              server={"momentum": 0.9}, rounds=4)

    def message(d, i, x):
        return client_message(d, i, x, GAMMA, 0.0, [1.0] * STEPS)

    expected = server_numpy(CLIENTS, message, rounds=4, momentum=0.9)
    plain = server_numpy(CLIENTS, message, rounds=4)
    atol = atol_for(expected, rounds=4)
    assert np.abs(plain - expected).max() > 100 * atol
    np.testing.assert_allclose(got, expected, rtol=0, atol=atol)


def test_appendix_a_fedavg_is_theta_1_to_k_at_server_lr_gamma(tmp_path):
    """Seed 002 App. A: FedAvg's averaged models (the uniform mean of the deltas, server lr 1)
    equal LOCALUPDATE with Theta_{1:K} and SERVEROPT gradient descent at eta = gamma, since
    x - y_i = gamma sum_k g_k. Different float32 computations of one quantity (the delta
    y - x against the sum of the gradients): compared at the float32 tolerance."""
    lu = fedray.run(job(tmp_path / "lu", {"name": "local_update"}, clients=5, per_round=3,
                        server={"lr": GAMMA}),
                    model_fn=linear_model_fn(), client_data=CLIENTS)
    fa = fedray.run(job(tmp_path / "fa", {"name": "fedavg", "aggregator": "uniform"},
                        clients=5, per_round=3, server={"lr": 1.0}),
                    model_fn=linear_model_fn(), client_data=CLIENTS)
    a, b = (r.weights["weight"].double().numpy().reshape(-1) for r in (lu, fa))
    assert np.abs(a - W0).max() > 0.05
    np.testing.assert_allclose(a, b, rtol=0, atol=atol_for(b))


def test_gamma_0_is_fedsgd(tmp_path):
    """gamma = 0 with one step: each client's full-batch gradient at x, weighted by its
    examples (the proportional aggregator) -- FedSGD (McMahan et al.) at server lr eta is
    fedray's ``fedsgd`` preset at client lr eta, server lr 1."""
    lu = fedray.run(job(tmp_path / "lu", {"name": "minibatch_sgd", "aggregator": "proportional"},
                        clients=5, per_round=3, lr=0.0, steps=None),
                    model_fn=linear_model_fn(), client_data=CLIENTS)
    fs = fedray.run(job(tmp_path / "fs", {"name": "fedsgd"}, clients=5, per_round=3, lr=ETA,
                        steps=None, server={"lr": 1.0}),
                    model_fn=linear_model_fn(), client_data=CLIENTS)
    a, b = (r.weights["weight"].double().numpy().reshape(-1) for r in (lu, fs))
    assert np.abs(a - W0).max() > 0.05
    np.testing.assert_allclose(a, b, rtol=0, atol=atol_for(b, steps=1))


# -- Theorem 1, by simulation -------------------------------------------------------------

COPIES = 800  # one client, copied: each copy draws its own batches (its own seed)
BATCH = 2


def surrogate_gradient(a, c, x, gamma, alpha, theta) -> np.ndarray:
    """Q_i(alpha, gamma, Theta) A_i (x - c_i), eq. 6-7."""
    step = np.eye(len(x)) - gamma * (a + alpha * np.eye(len(x)))
    q = sum(th * np.linalg.matrix_power(step, k) for k, th in enumerate(theta))
    return q @ a @ (x - c)


def sampled_messages(xs, ys, x, gamma, alpha, theta, draws: int, rng) -> np.ndarray:
    """Alg. 2 with independent batches of BATCH examples, in NumPy: ``draws`` messages, to
    measure their spread (the Monte Carlo error of a mean of COPIES of them)."""
    out = np.empty((draws, len(x)))
    for d in range(draws):
        w, q = x.copy(), np.zeros_like(x)
        for th in theta:
            idx = rng.permutation(len(ys))[:BATCH]
            g = xs[idx].T @ (xs[idx] @ w - ys[idx]) / BATCH + alpha * (w - x)
            q += th * g
            w = w - gamma * g
        out[d] = q
    return out


@pytest.mark.parametrize("theta_name,alpha", [("ones", 0.0), ("last", 0.0), ("ones", 0.5)])
def test_theorem_1_mean_message_is_the_surrogate_gradient(tmp_path, theta_name, alpha):
    """Seed 002 Theorem 1: E[CLIENTUPDATE] = grad f~_i. One round of COPIES copies of one
    client (batches of 2 of its 8 examples, K = 6 steps, gamma = 0.8 < 1/L: a distortion of
    15-30 standard errors) at server lr 1: the new model is x - the mean message. That mean
    is within 4.5 standard errors of the surrogate gradient on every coordinate (the
    standard error from NumPy draws of the same messages; 4.5 sigma on 3 coordinates fails
    by chance about once in 50,000), while the undistorted gradient w(Theta) grad f_i(x)
    is more than 10 standard errors away."""
    steps, gamma = 6, 0.8
    xs, ys = regression_clients([8], seed=5, scale_step=0.25)[0]
    data = {i: (xs, ys) for i in range(COPIES)}
    got = run(tmp_path / "t1", {"name": "local_update",
                                "local_update": {"theta": theta_name, "alpha": alpha}},
              data, lr=gamma, steps=steps, batch_size=BATCH, rounds=1, per_round=COPIES,
              server={"lr": 1.0})
    mean_message = W0 - got
    x64, y64 = xs.astype(np.float64), ys.astype(np.float64)
    a, c = quadratic({0: (xs, ys)}, 0)
    theta = [1.0] * steps if theta_name == "ones" else [0.0] * (steps - 1) + [1.0]
    expected = surrogate_gradient(a, c, W0, gamma, alpha, theta)
    spread = sampled_messages(x64, y64, W0, gamma, alpha, theta, 2000,
                              np.random.default_rng(0)).std(axis=0)
    stderr = spread / np.sqrt(COPIES)
    np.testing.assert_array_less(np.abs(mean_message - expected), 4.5 * stderr)
    undistorted = sum(theta) * a @ (W0 - c)
    assert np.abs(undistorted - expected).max() > 10 * stderr.max()


# -- bad values ---------------------------------------------------------------------------

@pytest.mark.parametrize("override,key", [
    ({"theta": "first"}, "algorithm.local_update.theta"),
    ({"theta": {"index": 0}}, "algorithm.local_update.theta"),
    ({"theta": [0, 0]}, "algorithm.local_update.theta"),
    ({"theta": [1, -1]}, "algorithm.local_update.theta"),
    ({"alpha": -0.1}, "algorithm.local_update.alpha"),
])
def test_bad_values_name_their_key(tmp_path, override, key):
    with pytest.raises(ConfigError, match=rf"config key '{key}'"):
        run(tmp_path / "bad", {"name": "local_update", "local_update": override})


def test_zero_client_lr_only_where_a_part_allows_it(tmp_path):
    with pytest.raises(ConfigError, match=r"config key 'client.lr': must be > 0 for client "
                                          r"part local_sgd"):
        run(tmp_path / "bad", {"name": "fedavg"}, lr=0.0)
