"""FedDyn (fedray/algorithms/feddyn.py) through the whole runtime, against an independent
NumPy float64 re-implementation of Acar et al. (ICLR 2021), Alg. 1, on deterministic
full-batch linear-regression clients (f_k(w) = 1/2 ||X_k w - y_k||^2 / n_k) with partial
participation: 5 clients, 3 a round, so the server's 1/m (m the population) and the plain
mean over the round's |P_t| clients differ, and a client's gradient state g_k skips the
rounds it sits out.

The runs use the inline backend (runtime.backend=inline: the driver and its workers in this
process, bit-identical to Ray's at the same worker count: tests/runtime/test_inline.py), so each
takes milliseconds; test_one_vs_three_workers keeps one run on three Ray worker processes,
which write and read the one client state store. One straight run (``straight``) is the
reference check, the resumed run's baseline and the worker-count test's one worker."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from linear_regression import W0, D, linear_model_fn, regression_clients
from tolerance import ULPS_PER_STEP, f32_atol, merge_ulps

import fedray
from fedray.api import RunResult
from fedray.core.sampling import sample_clients
from fedray.state.checkpoint import read_checkpoint
from fedray.state.client_state import ClientStateStore
from fedray.state.run_dir import SERVER_STATE_FILE, load_tensors, read_metrics

SEED = 7
ROUNDS, STEPS, PER_ROUND = 4, 3, 3
LR, ALPHA = 0.1, 0.1


def make_clients(num: int = 5, seed: int = 0) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Heterogeneous regression clients: own feature scale, own true weights, own size."""
    return regression_clients([6 + 3 * i for i in range(num)], seed, scale_step=0.25)


CLIENTS = make_clients()
POPULATION = len(CLIENTS)


def job(out_dir, *, rounds: int = ROUNDS, workers: int = 1, vectorize: str = "off",
        backend: str = "inline") -> dict:
    """batch_size 64 > every client's size: each of the STEPS local steps is a full-batch
    step (a permutation of all of the client's examples), so the reference needs no batch
    order."""
    return {"name": "feddyn", "seed": SEED, "rounds": rounds, "model": {"loss": "mse"},
            "algorithm": {"name": "feddyn", "feddyn": {"alpha": ALPHA}},
            "client": {"lr": LR, "batch_size": 64, "local_steps": STEPS},
            "sampling": {"clients_per_round": PER_ROUND},
            "checkpoint": {"every": 2},
            "runtime": {"backend": backend, "num_workers": workers,
                        "worker": {"num_cpus": 0.5, "vectorize": vectorize}},
            "eval": {"central": False}, "output": {"dir": str(out_dir)}}


def run(out_dir, **kw) -> RunResult:
    return fedray.run(job(out_dir, **kw), model_fn=linear_model_fn(), client_data=CLIENTS)


def weights_of(res) -> np.ndarray:
    return res.weights["weight"].double().numpy().reshape(-1)


# -- the NumPy reference ------------------------------------------------------------------

def grad(i: int, w: np.ndarray) -> np.ndarray:
    x, y = (a.astype(np.float64) for a in CLIENTS[i])
    return x.T @ (x @ w - y) / len(y)


def feddyn_numpy(rounds: int, variant: str = "feddyn"
                 ) -> tuple[np.ndarray, np.ndarray, dict[int, np.ndarray]]:
    """Acar et al., Alg. 1, with the client's minimisation done by STEPS SGD steps:

    client k in P_t, from theta^{t-1}: minimise L_k(th) - <g_k, th> + alpha/2 ||th - theta||^2
        (gradient grad L_k(th) - g_k + alpha (th - theta));
        then g_k <- g_k - alpha (theta_k - theta)         (g_k = grad L_k(theta_k^{t-1}))
    server: h <- h - alpha (1/m) sum_{k in P_t} (theta_k - theta),  m the population
            theta <- (1/|P_t|) sum_{k in P_t} theta_k - h / alpha
    Returns theta^R, h^R and every client's g_k. Two wrong variants show that the tests
    below tell them apart: "no_h" leaves out - h / alpha, "per_round" divides h's sum by
    |P_t| instead of m."""
    theta, h = W0.copy(), np.zeros(D)
    g = {i: np.zeros(D) for i in CLIENTS}
    for r in range(1, rounds + 1):
        ids = [int(c) for c in sample_clients(SEED, r, POPULATION, PER_ROUND)]
        local = []
        for k in ids:
            th = theta.copy()
            for _ in range(STEPS):
                th = th - LR * (grad(k, th) - g[k] + ALPHA * (th - theta))
            g[k] = g[k] - ALPHA * (th - theta)
            local.append(th)
        m = len(ids) if variant == "per_round" else POPULATION
        h = h - ALPHA * sum(th - theta for th in local) / m
        theta = np.mean(local, axis=0) - (0.0 if variant == "no_h" else h / ALPHA)
    return theta, h, g


def ref_atol(expected: np.ndarray, rounds: int) -> float:
    """The float32 runtime against the float64 reference: every local step of every round
    rounds differently on the two sides (tolerance.ULPS_PER_STEP), and each round's float32
    weights once more; ulps of the weights' size."""
    return f32_atol(expected, ulps=ULPS_PER_STEP * (STEPS + 1) * rounds)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """ROUNDS rounds in one go: one worker, clients one after another."""
    return run(tmp_path_factory.mktemp("feddyn") / "straight")


def stored_g(run_dir: str) -> dict[int, tuple[int, torch.Tensor]]:
    """Every client's current stored state, as the final checkpoint locates it: (version,
    g); and every client with state in the store is in the checkpoint's index."""
    store = ClientStateStore(f"{run_dir}/client_state")
    current = store.current(read_checkpoint(run_dir).client_versions)
    assert sorted(current) == sorted(store.versions())
    return {cid: (v, state["g"]) for cid, (v, state) in current.items()}


# -- the tests ----------------------------------------------------------------------------

def test_feddyn_matches_the_paper(straight):
    """Final weights, the server state h and every client's g_k against Alg. 1."""
    theta, h, g = feddyn_numpy(ROUNDS)
    got = weights_of(straight)
    atol = ref_atol(theta, ROUNDS)
    # the test means something: the model moved, h is far from zero, and leaving out
    # - h / alpha or dividing by |P_t| instead of m moves the model far beyond the tolerance
    assert np.abs(got - W0).max() > 0.1
    assert np.abs(h / ALPHA).max() > 0.1
    for wrong in ("no_h", "per_round"):
        assert np.abs(feddyn_numpy(ROUNDS, wrong)[0] - theta).max() > 100 * atol, wrong
    np.testing.assert_allclose(got, theta, rtol=0, atol=atol)

    server = load_tensors(straight.run_dir, SERVER_STATE_FILE)
    assert server["aggregator.h"].dtype == torch.float64
    # h / alpha = mean_k theta_k - theta (the server's update, read backwards): the
    # difference of two weight-sized float32 results, each within the weights' tolerance
    np.testing.assert_allclose(server["aggregator.h"].numpy() / ALPHA, h / ALPHA, rtol=0,
                               atol=2 * f32_atol(theta, h / ALPHA,
                                                 ulps=ULPS_PER_STEP * (STEPS + 1) * ROUNDS))
    assert int(server["server_opt.step"]) == ROUNDS

    # g_k / alpha = -(sum of client k's deltas over its rounds): up to ROUNDS deltas, each
    # the difference of two weight-sized results within the weights' tolerance
    rounds_of = {i: [r for r in range(1, ROUNDS + 1)
                     if i in sample_clients(SEED, r, POPULATION, PER_ROUND)] for i in CLIENTS}
    # client 0 sits out round 2 and comes back: its g_k must wait for it in the store
    assert rounds_of[0] == [1, 3]
    state = stored_g(straight.run_dir)
    assert sorted(state) == [i for i in CLIENTS if rounds_of[i]]
    for cid, (version, gk) in state.items():
        assert version == rounds_of[cid][-1]  # the state of the client's last round
        np.testing.assert_allclose(gk.double().numpy() / ALPHA, g[cid] / ALPHA, rtol=0,
                                   atol=2 * ROUNDS * ref_atol(theta, ROUNDS))
    assert [m["clients"] for m in read_metrics(straight.run_dir)] == [PER_ROUND] * ROUNDS


def test_resume_is_bit_identical(straight, tmp_path):
    """h and the clients' g_k carry across rounds and through a checkpoint: ROUNDS / 2
    rounds, then resumed to ROUNDS, equal the straight run bit for bit -- weights, the
    saved server state (aggregator.h, server_opt.step) and every client's stored g_k."""
    half = tmp_path / "half"
    first = run(half, rounds=ROUNDS // 2)
    h_half = load_tensors(first.run_dir, SERVER_STATE_FILE)["aggregator.h"]
    ckpt = read_checkpoint(first.run_dir)
    assert ckpt.round == ROUNDS // 2  # the checkpoint the resume starts from holds h
    assert torch.count_nonzero(h_half) == D and torch.equal(ckpt.server_state["aggregator.h"],
                                                            h_half)
    more = fedray.run(resume=str(half), overrides=[f"rounds={ROUNDS}"],
                      allow_changes=["rounds"], model_fn=linear_model_fn(),
                      client_data=CLIENTS)
    assert more.summary["resumed_from_round"] == ROUNDS // 2
    assert [m["round"] for m in more.metrics] == list(range(ROUNDS // 2 + 1, ROUNDS + 1))
    assert straight.weights.keys() == more.weights.keys()
    assert all(torch.equal(straight.weights[k], more.weights[k]) for k in straight.weights)

    a = load_tensors(straight.run_dir, SERVER_STATE_FILE)
    b = load_tensors(more.run_dir, SERVER_STATE_FILE)
    assert a.keys() == b.keys() and "aggregator.h" in a
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["aggregator.h"], h_half)  # h moved on after the resume

    sa, sb = stored_g(straight.run_dir), stored_g(more.run_dir)
    assert sa.keys() == sb.keys()
    for cid in sa:
        assert sa[cid][0] == sb[cid][0] and torch.equal(sa[cid][1], sb[cid][1])


def test_one_vs_three_workers(ray_cluster, straight, tmp_path):
    """The worker count changes nothing but the grouping of the float64 merge."""
    one = weights_of(straight)
    three = run(tmp_path / "w3", workers=3, backend="ray")
    assert three.summary["num_workers"] == 3
    # both sequential: every client's float32 arithmetic (and its g_k) is the same; only the
    # driver's float64 merge of the workers' partial sums is grouped otherwise
    np.testing.assert_allclose(weights_of(three), one, rtol=0,
                               atol=f32_atol(one, ulps=merge_ulps(ROUNDS)))
    # and so is h: h / alpha = mean_k theta_k - theta, two weight-sized results, each
    # within that tolerance
    h1, h3 = (load_tensors(r, SERVER_STATE_FILE)["aggregator.h"].numpy() / ALPHA
              for r in (straight.run_dir, three.run_dir))
    np.testing.assert_allclose(h3, h1, rtol=0, atol=2 * f32_atol(one, h1,
                                                                 ulps=merge_ulps(ROUNDS)))

    # vectorized (the closed-form chain step for this linear model): batched products round
    # otherwise than sequential training's at every local step of every round, and a
    # worker's group (3 clients on one worker, 1 on each of three) has another shape, so
    # against each other and against sequential training: ULPS_PER_STEP per step
    atol = f32_atol(one, ulps=ULPS_PER_STEP * (STEPS + 1) * ROUNDS)
    vec = {}
    for n in (1, 3):
        res = run(tmp_path / f"v{n}", workers=n, vectorize="on")
        assert res.summary["vectorized"]
        vec[n] = weights_of(res)
        np.testing.assert_allclose(vec[n], one, rtol=0, atol=atol)
    np.testing.assert_allclose(vec[3], vec[1], rtol=0, atol=atol)
