"""Shared fixtures: one small Ray instance for the whole session.

It declares 2 CPUs and one (fake) GPU, so that fractional GPU placement can be tested on a
machine without one; fedray.run reuses an initialised Ray and leaves it running.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

SHARED_DATA = Path(os.environ.get("FEDRAY_SHARED_DATA")
                   or Path(__file__).resolve().parents[2] / "shared" / "data")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data (real LEAF FEMNIST sample, MNIST t10k), beside the repository, or
    wherever FEDRAY_SHARED_DATA points.

    Tests that use it skip when it is missing, unless FEDRAY_REQUIRE_SHARED_DATA=1 (set by
    .ci/run), where its absence is a failure: CI must never silently skip real-data tests.
    """
    if SHARED_DATA.is_dir():
        return SHARED_DATA
    if os.environ.get("FEDRAY_REQUIRE_SHARED_DATA") == "1":
        pytest.fail(f"{SHARED_DATA} is missing but FEDRAY_REQUIRE_SHARED_DATA=1")
    pytest.skip(f"real data not found at {SHARED_DATA} (see shared/data/README.md)")


@pytest.fixture(scope="session")
def ray_cluster():
    import ray

    # address="local": a private instance, even if a `ray start` cluster is around
    ray.init(address="local", num_cpus=2, num_gpus=1, include_dashboard=False,
             logging_level="ERROR")
    yield ray
    ray.shutdown()


def tiny_job(tmp_path, **over) -> dict:
    """A few-second job: logistic regression on 40 synthetic writers."""
    job = {
        "name": "tiny", "seed": 3, "rounds": 3,
        "data": {"synthetic": {"num_clients": 40, "min_examples": 10, "max_examples": 30,
                               "test_writers": 20}},
        "model": {"name": "logreg"},
        "client": {"lr": 0.05, "batch_size": 8},
        "sampling": {"clients_per_round": 8},
        # two workers on the session's 2 CPUs; sequential clients: a worker's first
        # vectorized step imports torch._dynamo (about 1 s), which dozens of few-second runs
        # would pay for nothing (tests/runtime/test_session.py runs this job vectorized, and auto)
        "runtime": {"worker": {"num_cpus": 1.0, "vectorize": "off"}},
        "output": {"dir": str(tmp_path / "run")},
    }
    for key, value in over.items():
        node = job
        parts = key.split("__")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return job


def blobs(num_clients: int, dim: int = 5, classes: int = 3, seed: int = 0
          ) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Small in-memory clients of varying size."""
    g = np.random.default_rng(seed)
    out = {}
    for c in range(num_clients):
        n = int(g.integers(4, 12))
        out[c] = (g.normal(size=(n, dim)).astype(np.float32), g.integers(0, classes, size=n))
    return out


def softmax_grad(w: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray):
    """NumPy gradient of the mean cross-entropy of a linear model (an independent reference)."""
    logits = x @ w.T + b
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(len(y)), y] -= 1.0
    return p.T @ x / len(y), p.mean(0)


def fixed_linear(dim: int = 5, classes: int = 3, seed: int = 0):
    """A model_fn of a linear layer with a fixed initialisation, and that init (float64)."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    init = nn.Linear(dim, classes)

    def model_fn():  # a closure: shipped to the workers by value
        m = nn.Linear(dim, classes)
        m.load_state_dict(init.state_dict())
        return m

    return (model_fn, init.weight.detach().double().numpy().copy(),
            init.bias.detach().double().numpy().copy())
