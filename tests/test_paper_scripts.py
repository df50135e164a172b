"""Seed 001's toy reproduction: its own math and one short run through the real runtime
(seed 004's quadratics are tested in test_paper_quadratics.py)."""

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
