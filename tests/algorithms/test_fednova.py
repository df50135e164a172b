"""FedNova (fedray/algorithms/fednova.py) through the whole runtime, against an independent
NumPy float64 re-implementation of Wang et al. (NeurIPS 2020), on linear-regression clients
(f_k(w) = 1/2 ||X_k w - y_k||^2 / n_k) that take DIFFERENT numbers of local steps: every
client trains ``local_epochs`` epochs of minibatches of BATCH examples, so a client of n
examples takes EPOCHS * ceil(n / BATCH) steps (4 to 10 here). The minibatches are random, but
a client's batch order depends only on (seed, round, client id): the reference draws the same
one with fedray.kernels.sequential.batch_schedule, and is then deterministic. 5 clients, 3 a
round (partial participation), so p_k is normalised over the round's clients.

The FedProx client (algorithm.client = fedprox) shrinks earlier steps' gradients, which
changes ||a_k||_1; with the same number of steps for every client FedNova is FedAvg.

The runs use the inline backend (runtime.backend=inline: the driver and its workers in this
process, bit-identical to Ray's at the same worker count: tests/runtime/test_inline.py), so each
takes milliseconds; test_one_vs_three_workers keeps one run on three Ray worker processes,
whose partial sums (and extra sums of |D_k| ||a_k||_1) the driver merges."""

from __future__ import annotations

import math

import numpy as np
import pytest
from linear_regression import W0, linear_model_fn, regression_clients
from tolerance import ULPS_PER_STEP, f32_atol, merge_ulps

import fedray
from fedray.api import RunResult
from fedray.core.sampling import sample_clients
from fedray.core.seeding import client_seed
from fedray.kernels.sequential import batch_schedule

SEED = 5
ROUNDS, PER_ROUND = 4, 3
LR, MU = 0.05, 2.0  # lr * mu = 0.1: the proximal term changes ||a_k||_1 by 15% to 35%
BATCH, EPOCHS = 4, 2


def make_clients(num: int = 5, seed: int = 1) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Heterogeneous regression clients: own feature scale, own true weights, own size
    (5 to 17 examples: 2 to 5 batches of BATCH an epoch)."""
    return regression_clients((5, 7, 10, 13, 17)[:num], seed, scale_step=0.25)


CLIENTS = make_clients()
POPULATION = len(CLIENTS)
SIZES = np.array([len(CLIENTS[i][1]) for i in sorted(CLIENTS)], dtype=np.float64)
STEPS = [EPOCHS * math.ceil(n / BATCH) for n in SIZES.astype(int)]  # [4, 4, 6, 8, 10]


def run(out_dir, algorithm: dict, *, client: dict | None = None, workers: int = 1,
        vectorize: str = "off", backend: str = "inline") -> RunResult:
    job = {"name": "fednova", "seed": SEED, "rounds": ROUNDS, "model": {"loss": "mse"},
           "algorithm": algorithm,
           "client": client or {"lr": LR, "batch_size": BATCH, "local_epochs": EPOCHS},
           "sampling": {"clients_per_round": PER_ROUND},
           "runtime": {"backend": backend, "num_workers": workers,
                       "worker": {"num_cpus": 0.5, "vectorize": vectorize}},
           "eval": {"central": False}, "output": {"dir": str(out_dir)}}
    return fedray.run(job, model_fn=linear_model_fn(), client_data=CLIENTS)


def weights_of(res) -> np.ndarray:
    return res.weights["weight"].double().numpy().reshape(-1)


FEDNOVA_PROX = {"name": "fednova", "client": "fedprox", "fedprox": {"mu": MU}}


# -- the NumPy reference ------------------------------------------------------------------

def local_sgd(k: int, x: np.ndarray, r: int, mu: float) -> tuple[np.ndarray, float, int]:
    """Client k's local SGD in round r from x (FedProx's proximal term mu): its delta,
    ||a_k||_1 and its number of steps tau. ||a_k||_1 is the sum of the weights its steps'
    gradients enter the delta with, written out as the vector a_k of Wang et al.: step j's
    gradient is shrunk by (1 - lr mu) at each of the tau - 1 - j later steps, so
    a_k = [(1 - lr mu)^(tau-1), ..., (1 - lr mu), 1]."""
    xs, ys = (a.astype(np.float64) for a in CLIENTS[k])
    w = x.copy()
    schedule = batch_schedule(len(ys), BATCH, EPOCHS, None, client_seed(SEED, r, k))
    for idx in schedule:
        i = idx.numpy()
        w = w - LR * (xs[i].T @ (xs[i] @ w - ys[i]) / len(i) + mu * (w - x))
    tau = len(schedule)
    a = (1.0 - LR * mu) ** np.arange(tau - 1, -1, -1)
    return w - x, float(a.sum()), tau


def fednova_numpy(rounds: int, mu: float = 0.0, variant: str = "fednova") -> np.ndarray:
    """update = tau_eff sum_k p_k d_k / ||a_k||_1, tau_eff = sum_k p_k ||a_k||_1, p_k
    proportional to |D_k| over the round's clients; server SGD at lr 1. Two wrong variants
    show that the tests below tell them apart: "fedavg", sum_k p_k d_k, and "tau", plain
    tau_k for ||a_k||_1 whatever the proximal term."""
    x = W0.copy()
    for r in range(1, rounds + 1):
        ids = [int(c) for c in sample_clients(SEED, r, POPULATION, PER_ROUND)]
        p = SIZES[ids] / SIZES[ids].sum()
        out = [local_sgd(k, x, r, mu) for k in ids]
        deltas = [d for d, _, _ in out]
        norms = np.array([tau if variant == "tau" else a for _, a, tau in out], dtype=float)
        if variant == "fedavg":
            x = x + sum(pk * d for pk, d in zip(p, deltas, strict=True))
        else:
            tau_eff = float(p @ norms)
            x = x + tau_eff * sum(pk * d / a for pk, d, a in zip(p, deltas, norms, strict=True))
    return x


def ref_atol(expected: np.ndarray) -> float:
    """The float32 runtime against the float64 reference: every local step of every round
    rounds differently on the two sides (tolerance.ULPS_PER_STEP, counted for the longest
    client), and each round's float32 weights once more; the update weighs a client's delta
    by tau_eff / ||a_k||_1, at most max(STEPS) / min(STEPS), so its rounding counts up to
    that many times. Ulps of the weights' size."""
    ratio = max(STEPS) / min(STEPS)
    return f32_atol(expected, ulps=ratio * ULPS_PER_STEP * (max(STEPS) + 1) * ROUNDS)


def test_the_setup_exercises_fednova():
    """Each round mixes clients of different step counts, so normalising changes the
    update by far more than the tolerance (tau_eff = 1, or FedAvg, would fail the tests
    below), and so does the proximal ||a_k||_1 against plain tau_k."""
    for r in range(1, ROUNDS + 1):
        ids = sample_clients(SEED, r, POPULATION, PER_ROUND)
        assert len({STEPS[i] for i in ids}) > 1, (r, ids)
    nova = fednova_numpy(ROUNDS)
    assert np.abs(nova - fednova_numpy(ROUNDS, variant="fedavg")).max() > 100 * ref_atol(nova)
    prox = fednova_numpy(ROUNDS, MU)
    assert np.abs(prox - fednova_numpy(ROUNDS, MU, "tau")).max() > 100 * ref_atol(prox)


# -- the runtime against it -----------------------------------------------------------------

@pytest.fixture(scope="module")
def prox_run(tmp_path_factory):
    """FedNova with the FedProx client: one worker, clients one after another."""
    return run(tmp_path_factory.mktemp("fednova") / "prox", FEDNOVA_PROX)


def test_fednova_matches_the_paper(tmp_path):
    res = run(tmp_path / "nova", {"name": "fednova"})
    expected = fednova_numpy(ROUNDS)
    got = weights_of(res)
    assert np.abs(got - W0).max() > 0.1  # the model moved
    np.testing.assert_allclose(got, expected, rtol=0, atol=ref_atol(expected))
    assert res.summary["algorithm"] == {"name": "fednova", "client": "local_sgd",
                                        "aggregator": "fednova", "server_opt": "sgd",
                                        "selector": "uniform"}
    # the round's clients are the sampler's (the reference's): their sizes add up
    for r, m in enumerate(res.metrics, start=1):
        ids = sample_clients(SEED, r, POPULATION, PER_ROUND)
        assert m["clients"] == PER_ROUND and m["examples"] == SIZES[ids].sum()


def test_fednova_with_the_fedprox_client(prox_run):
    """||a_k||_1 = (1 - (1 - lr mu)^tau_k) / (lr mu) for local SGD with a proximal term."""
    expected = fednova_numpy(ROUNDS, MU)
    got = weights_of(prox_run)
    assert np.abs(got - W0).max() > 0.1
    np.testing.assert_allclose(got, expected, rtol=0, atol=ref_atol(expected))
    assert prox_run.summary["algorithm"] == {"name": "fednova", "client": "fedprox",
                                             "aggregator": "fednova", "server_opt": "sgd",
                                             "selector": "uniform"}


def test_equal_steps_is_fedavg(tmp_path):
    """Every client takes the same 3 full-batch steps: ||a_k||_1 = tau_eff = 3, and the
    update is FedAvg's sum_k p_k d_k."""
    client = {"lr": LR, "batch_size": 64, "local_steps": 3}
    nova = weights_of(run(tmp_path / "nova", {"name": "fednova"}, client=client))
    avg = weights_of(run(tmp_path / "avg", {"name": "fedavg"}, client=client))
    assert np.abs(avg - W0).max() > 0.1  # the model moved
    # the same float32 client updates, aggregated otherwise: FedNova divides each d_k by 3
    # in float32 (off by half an ulp of d_k / 3 at most: a fraction of an ulp of the
    # largest weight, as every |d_k| is below it here) and multiplies the float64 mean by
    # tau_eff = 3, so rounding the new weights to float32 can flip a last bit in a round,
    # which the later rounds carry: one ulp a round, tolerance.merge_ulps
    np.testing.assert_allclose(nova, avg, rtol=0, atol=f32_atol(avg, ulps=merge_ulps(ROUNDS)))


def test_one_vs_three_workers(ray_cluster, prox_run, tmp_path):
    """The worker count changes nothing but the grouping of the float64 merge (and of
    the extra sum of |D_k| ||a_k||_1 that tau_eff is made of)."""
    one = weights_of(prox_run)
    three = run(tmp_path / "w3", FEDNOVA_PROX, workers=3, backend="ray")
    assert three.summary["num_workers"] == 3
    # both sequential: every client's float32 arithmetic is the same; only the driver's
    # float64 merge of the workers' partial sums is grouped otherwise
    np.testing.assert_allclose(weights_of(three), one, rtol=0,
                               atol=f32_atol(one, ulps=merge_ulps(ROUNDS)))

    # vectorized (the closed-form chain step for this linear model; clients of different
    # step counts in one group): batched products round otherwise than sequential
    # training's at every local step of every round, and a worker's group (3 clients on
    # one worker, 1 on each of three) has another shape, so against each other and
    # against sequential training: ULPS_PER_STEP per step of the longest client, each
    # delta weighed by up to max(STEPS) / min(STEPS) (ref_atol's reasoning)
    atol = ref_atol(one)
    vec = {}
    for n in (1, 3):
        res = run(tmp_path / f"v{n}", FEDNOVA_PROX, workers=n, vectorize="on")
        assert res.summary["vectorized"]
        vec[n] = weights_of(res)
        np.testing.assert_allclose(vec[n], one, rtol=0, atol=atol)
    np.testing.assert_allclose(vec[3], vec[1], rtol=0, atol=atol)
