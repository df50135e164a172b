"""The scripted reproductions' own math (seed 001's toy, seed 004's quadratics) and one short
run of each through the real runtime."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _load(name: str, path: pathlib.Path):
    sys.path.insert(0, str(path.parent.parent))  # jobs/paper/common.py
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def toy():
    return _load("paper_toy", ROOT / "jobs" / "paper" / "toy" / "run.py")


@pytest.fixture(scope="module")
def quad():
    return _load("paper_quadratics", ROOT / "jobs" / "paper" / "quadratics" / "run.py")


def _metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (pathlib.Path(run_dir) / "metrics.jsonl").open()]


def test_toy_clients_follow_the_recipe(toy):
    clients = toy.make_clients(0)
    assert len(clients) == 10
    for c, (x, y) in clients.items():
        assert x.shape == (100, 2) and y.tolist() == [0.0] * 50 + [1.0] * 50
        mean1 = (4, 4) if c == toy.OUTLIER else (1, 1)
        assert np.abs(x[:50].mean(0)).max() < 0.25
        assert np.abs(x[50:].mean(0) - mean1).max() < 0.25
    x, _ = toy.pooled(clients)
    assert 0.4 < x[:50].std() < 0.6  # covariance I/4


def test_toy_optimum_is_stationary(toy):
    x, y = toy.pooled(toy.make_clients(1))
    slope, bias, f = toy.centralized_optimum(x, y)
    z = x.astype(np.float64) @ slope + bias
    p = 1 / (1 + np.exp(-z))
    grad = np.concatenate([x.T @ (p - y), [np.sum(p - y)]]) / len(y)
    assert np.abs(grad).max() < 1e-9 and 0 < f < np.log(2)
    # moving the bias either way raises the loss
    for d in (-0.05, 0.05):
        zd = z + d
        assert np.mean(np.logaddexp(0, zd) - y * zd) > f


def test_quadratic_clients_have_the_stated_G_delta_beta(quad):
    for G in (1, 10, 100):
        clients = quad.make_clients(G)
        hess, grads = [], []
        for x, y in clients.values():
            x, y = x.astype(np.float64), y.astype(np.float64)
            hess.append(x.T @ x / len(y))
            grads.append(x.T @ (x @ np.zeros(2) - y) / len(y))  # gradient at w* = 0
        h_mean = (hess[0] + hess[1]) / 2
        assert np.allclose(h_mean, np.diag(quad.LAMBDA))  # f's curvatures; beta = 1
        assert np.isclose(np.abs(hess[0] - hess[1]).max(), quad.DELTA * quad.LAMBDA.max())
        assert np.allclose([np.linalg.norm(g) for g in grads], G, rtol=1e-5)
        assert np.allclose(grads[0] + grads[1], 0, atol=1e-5 * G)  # w* = 0 is the optimum
    xg, yg = quad.gap_set()
    w = np.array([0.3, -2.0])
    gap = 0.5 * np.mean((xg @ w - yg) ** 2)
    assert np.isclose(gap, 0.5 * np.sum(quad.LAMBDA * w**2))


def test_quadratics_through_the_runtime(quad, ray_cluster, tmp_path):
    """SCAFFOLD contracts the gap geometrically; FedAvg stalls at a G-dependent floor."""
    import fedray

    runs = {}
    for method, G in (("scaffold", 10), ("fedavg", 1), ("fedavg", 10)):
        runs[method, G] = fedray.run(
            str(ROOT / "jobs" / "paper" / "quadratics" / "quadratics.yaml"),
            model_fn=quad.linear_factory(), client_data=quad.make_clients(G),
            test_data=quad.gap_set(),
            overrides=["rounds=25", "client.lr=0.3", f"algorithm.name={method}",
                       "runtime.worker.vectorize=off",  # each run: no 1.5 s torch._dynamo import
                       f"output.dir={tmp_path / f'{method}-{G}'}"])
    gaps = {k: [m["test_loss"] for m in r.metrics] for k, r in runs.items()}
    assert gaps["scaffold", 10][-1] < 1e-6 * gaps["scaffold", 10][0]
    floor1, floor10 = gaps["fedavg", 1][-1], gaps["fedavg", 10][-1]
    assert floor1 > 1e-3 and 50 < floor10 / floor1 < 200  # the drift floor grows like G^2


def test_toy_through_the_runtime(toy, ray_cluster, tmp_path):
    """Two clients a round, and the frozen slope never moves while the bias trains."""
    import fedray
    from fedray.state.run_dir import load_tensors

    clients = toy.make_clients(0)
    x, y = toy.pooled(clients)
    slope, _, _ = toy.centralized_optimum(x, y)
    r = fedray.run(str(ROOT / "jobs" / "paper" / "toy" / "fedavg.yaml"),
                   model_fn=toy.perceptron_factory(slope), client_data=clients,
                   test_data=(x, y), overrides=["rounds=4", "client.local_steps=20",
                                                f"output.dir={tmp_path / 'toy'}"])
    assert [m["clients"] for m in r.metrics] == [2] * 4
    weights = load_tensors(str(tmp_path / "toy"))
    assert np.allclose(weights["slope"].numpy(), slope.astype(np.float32))
    assert weights["bias"].item() != 0.0
