"""Ditto (fedray/algorithms/personal_models.py) against an independent NumPy float64
re-implementation of Li et al. (ICML 2021), Alg. 1, on deterministic full-batch regression
clients -- the global model, every client's stored personal model after several rounds and
the per-client evaluation with it and with the global model -- then lam = 0, the refusals,
the vectorized kernels, a CLI run resumed bit for bit, and 1 against 3 Ray workers."""

from __future__ import annotations

import numpy as np
import pytest
from linear_regression import W0, D, linear_model_fn
from personalized_runs import (
    CLIENTS,
    LR,
    ROUNDS,
    STEPS,
    check_eval,
    cli_resumes_bit_for_bit,
    f64,
    one_vs_three_ray_workers,
    run_linear,
    stored,
)
from tolerance import ULPS_PER_STEP, f32_atol

from fedray.errors import ConfigError

LAM, P_STEPS, P_LR = 0.5, 2, 0.05


def grad(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return x.T @ (x @ w - y) / len(y)


def ditto_numpy(rounds: int = ROUNDS, lam: float = LAM
                ) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """Li et al. (ICML 2021), Alg. 1, with full participation, in float64: each client
    takes STEPS GD steps from w^t (its update, averaged by example counts), and P_STEPS
    steps v <- v - P_LR (grad f_k(v) + lam (v - w^t)) of its personal model v_k, from w^t
    in its first round. Returns w and every v_k."""
    w, personal = W0.copy(), {}
    for _ in range(rounds):
        num, den = np.zeros(D), 0.0
        for cid, data in CLIENTS.items():
            x, y = f64(data["train"])
            local = w.copy()
            for _ in range(STEPS):
                local = local - LR * grad(local, x, y)
            num += len(y) * (local - w)
            den += len(y)
            v = personal.get(cid, w).copy()
            for _ in range(P_STEPS):
                v = v - P_LR * (grad(v, x, y) + lam * (v - w))
            personal[cid] = v
        w = w + num / den
    return w, personal


@pytest.mark.parametrize("vectorize", ["off", "on"])
def test_ditto_matches_its_paper(tmp_path, vectorize):
    w, personal = ditto_numpy()
    algorithm = {"name": "ditto", "ditto": {"lam": LAM, "steps": P_STEPS, "lr": P_LR}}
    got, run_dir = run_linear(tmp_path, f"ditto-{vectorize}", algorithm, linear_model_fn(),
                              vectorize)
    # a round's local steps and its delta, tolerance.ULPS_PER_STEP each, of the weights' size
    atol = f32_atol(w, *personal.values(), ulps=ULPS_PER_STEP * (STEPS + 1) * ROUNDS)
    np.testing.assert_allclose(got["weight"].reshape(-1), w, rtol=0, atol=atol)
    # the global model is FedAvg's, bit for bit: the personal phase draws from its own
    # seed and leaves the update and the replica's next client alone
    fedavg, _ = run_linear(tmp_path, f"fedavg-{vectorize}", {"name": "fedavg"},
                           linear_model_fn(), vectorize)
    np.testing.assert_array_equal(got["weight"], fedavg["weight"])
    state = stored(run_dir)
    assert sorted(state) == sorted(CLIENTS)
    for cid, v in personal.items():
        assert set(state[cid]) == {"personal"}
        np.testing.assert_allclose(state[cid]["personal"].double().numpy(), v, rtol=0,
                                   atol=atol)
        assert np.abs(v - w).max() > 1e-2  # personal models are not the global one
    # the pull matters: another lam moves the personal models far beyond the tolerance
    other = ditto_numpy(lam=2 * LAM)[1]
    assert max(np.abs(other[c] - personal[c]).max() for c in CLIENTS) > 100 * atol
    check_eval(run_dir, lambda c, x: x @ personal[c], lambda c, x: x @ w, atol)


def test_ditto_at_lambda_zero_trains_each_client_alone(tmp_path):
    """lam = 0: a personal model is the client's own local training, carried across rounds
    (its ROUNDS * P_STEPS steps of plain GD from the initial model), whatever the global."""
    algorithm = {"name": "ditto", "ditto": {"lam": 0.0, "steps": P_STEPS, "lr": P_LR}}
    _, run_dir = run_linear(tmp_path, "lam0", algorithm, linear_model_fn(), "off")
    state = stored(run_dir)
    for cid, data in CLIENTS.items():
        x, y = f64(data["train"])
        v = W0.copy()
        for _ in range(ROUNDS * P_STEPS):
            v = v - P_LR * grad(v, x, y)
        np.testing.assert_allclose(state[cid]["personal"].double().numpy(), v, rtol=0,
                                   atol=f32_atol(v, ulps=ULPS_PER_STEP * (P_STEPS + 1)
                                                 * ROUNDS))


@pytest.mark.parametrize("ditto, key, rule", [
    ({"lam": -1.0}, "lam", "must be a finite number >= 0"),
    ({"steps": 0}, "steps", "must be an integer >= 1"),
    ({"steps": 2, "epochs": 1}, "steps", "give steps or epochs, not both"),
    ({"lr": 0.0}, "lr", "must be > 0")])
def test_its_parameters_are_refused_in_one_line(tmp_path, ditto, key, rule):
    from fedray.api import prepare

    job = {"algorithm": {"name": "ditto", "ditto": ditto},
           "sampling": {"clients_per_round": 3}, "output": {"dir": str(tmp_path / "run")}}
    with pytest.raises(ConfigError, match=rf"config key 'algorithm\.ditto\.{key}': {rule}"):
        prepare(job, client_data=CLIENTS, model_fn=linear_model_fn())


def test_the_cli_runs_and_resumes_it_bit_for_bit(tmp_path):
    cli_resumes_bit_for_bit(tmp_path, ["algorithm.name=ditto", "algorithm.ditto.lam=0.5",
                                       "model.name=logreg"])


def test_one_vs_three_ray_workers(ray_cluster, tmp_path):
    one_vs_three_ray_workers(tmp_path, "ditto", {"name": "ditto"})
