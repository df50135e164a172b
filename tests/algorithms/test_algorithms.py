"""Algorithm composition: presets, part overrides, FedProx/FedSGD/uniform against NumPy."""

import numpy as np
import pytest
import torch
from conftest import blobs, fixed_linear, softmax_grad
from tolerance import ULPS_PER_STEP, f32_atol
from torch import nn

import fedray
from fedray.algorithms import PRESETS, Algorithm, load_builtins, resolve
from fedray.algorithms.base import LocalTerms
from fedray.api import prepare
from fedray.config import load_config
from fedray.core.flat_model import FlatModel
from fedray.errors import FedrayError
from fedray.kernels.sequential import local_sgd


def _names(cfg):
    return resolve(cfg.algorithm, cfg.server).names


def test_presets_and_overrides():
    cfg = load_config()
    assert _names(cfg) == {"client": "local_sgd", "aggregator": "proportional",
                           "server_opt": "sgd", "selector": "uniform"}
    cfg = load_config({"algorithm": {"name": "fedprox", "server_opt": "momentum",
                                     "selector": "oort"}})
    assert _names(cfg) == {"client": "fedprox", "aggregator": "proportional",
                           "server_opt": "momentum", "selector": "oort"}
    load_builtins()
    assert PRESETS["fedprox"] == Algorithm("fedprox", "proportional", "sgd")
    assert {p.server_opt for p in PRESETS.values()} == {"sgd", "momentum", "nesterov", "adam",
                                                        "yogi", "adagrad"}
    assert {p.selector for p in PRESETS.values()} == {"uniform"}


def test_part_sections_and_legacy_keys():
    """A part's hyper-parameters live in its section; the flat keys of older jobs are read
    into the section of a part that uses them, and ignored otherwise."""
    cfg = prepare(None, ["algorithm.name=elastic_fedprox", "algorithm.fedprox.mu=0.3"])
    assert cfg.algorithm.fedprox.mu == 0.3 and cfg.algorithm.elastic.tau == 0.5
    assert "prox_mu" not in cfg.algorithm
    cfg = prepare(None, ["algorithm.name=fedprox", "algorithm.prox_mu=0.2",
                         "algorithm.elastic_tau=3"])
    assert cfg.algorithm.fedprox.mu == 0.2 and "elastic" not in cfg.algorithm
    with pytest.raises(FedrayError, match="unknown config key 'algorithm.fedprox'"):
        prepare(None, ["algorithm.fedprox.mu=0.2"])  # fedavg has no fedprox part
    with pytest.raises(FedrayError, match="unknown config key 'algorithm.fedprox.nu'"):
        prepare(None, ["algorithm.name=fedprox", "algorithm.fedprox.nu=0.2"])


@pytest.mark.parametrize("override, key", [
    ("algorithm.client=scaffoldx", "algorithm.client"),
    ("algorithm.aggregator=geomedian", "algorithm.aggregator"),
    ("algorithm.server_opt=lamb", "algorithm.server_opt"),
    # a legacy key, read where it counts
    ("algorithm.name=fedprox algorithm.prox_mu=-1", "algorithm.fedprox.mu"),
    ("algorithm.name=fedprox algorithm.fedprox.mu=-1", "algorithm.fedprox.mu"),
    ("algorithm.name=feddyn algorithm.feddyn.alpha=0", "algorithm.feddyn.alpha"),
    ("server.momentum=1.0", "server.momentum"),
    ("server.dampening=1.0", "server.dampening"),
    ("algorithm.name=elastic_fedavgm algorithm.elastic.method=mean",
     "algorithm.elastic.method"),
    ("server.tau=0", "server.tau"),
])
def test_bad_parts(override, key):
    with pytest.raises(FedrayError, match=key):
        prepare(None, override.split())


def _client(seed=0, n=9, d=4, c=3):
    g = np.random.default_rng(seed)
    return g.normal(size=(n, d)).astype(np.float32), g.integers(0, c, size=n)


def test_fedprox_two_full_batch_steps_match_numpy():
    x, y = _client()
    torch.manual_seed(0)
    m = FlatModel(nn.Linear(4, 3))
    start = m.flat.clone()
    w0 = m.module.weight.detach().double().numpy().copy()
    b0 = m.module.bias.detach().double().numpy().copy()
    lr, mu = 0.5, 0.3
    res = local_sgd(m, start, torch.from_numpy(x), torch.from_numpy(y), lr=lr, batch_size=9,
                    local_epochs=1, local_steps=2, seed=1, delta_out=torch.empty_like(start),
                    terms=LocalTerms(proximal=mu))
    w, b = w0.copy(), b0.copy()
    for _ in range(2):
        gw, gb = softmax_grad(w, b, x.astype(np.float64), y)
        w, b = w - lr * (gw + mu * (w - w0)), b - lr * (gb + mu * (b - b0))
    expected = np.concatenate([(w - w0).ravel(), b - b0])
    # float32 against float64, two steps: ulps of the weights' size (the delta is y - x)
    np.testing.assert_allclose(res.delta.numpy(), expected, rtol=0,
                               atol=f32_atol(w0, b0, w, b, ulps=ULPS_PER_STEP * 3))
    plain = local_sgd(m, start, torch.from_numpy(x), torch.from_numpy(y), lr=lr, batch_size=9,
                      local_epochs=1, local_steps=2, seed=1, delta_out=torch.empty_like(start))
    assert not torch.allclose(plain.delta, res.delta)  # the proximal term matters


def test_fedsgd_is_one_full_batch_step():
    x, y = _client(n=23)
    torch.manual_seed(0)
    m = FlatModel(nn.Linear(4, 3))
    start = m.flat.clone()
    w0 = m.module.weight.detach().double().numpy().copy()
    b0 = m.module.bias.detach().double().numpy().copy()
    res = local_sgd(m, start, torch.from_numpy(x), torch.from_numpy(y), lr=0.2, batch_size=5,
                    local_epochs=3, local_steps=None, seed=1, delta_out=torch.empty_like(start),
                    full_batch=True)
    gw, gb = softmax_grad(w0, b0, x.astype(np.float64), y)
    assert res.steps == 1 and res.examples_seen == 23
    # float32 against float64, one step: ulps of the weights' size (the delta is y - x)
    np.testing.assert_allclose(res.delta.numpy(), np.concatenate([-0.2 * gw.ravel(), -0.2 * gb]),
                               rtol=0, atol=f32_atol(w0, b0, ulps=ULPS_PER_STEP * 2))


def test_uniform_aggregator_end_to_end(ray_cluster, tmp_path):
    clients = blobs(5, dim=5, classes=3, seed=4)
    model_fn, w0, b0 = fixed_linear()

    job = {"rounds": 1, "algorithm": {"aggregator": "uniform"},
           "client": {"lr": 0.4, "local_steps": 1, "batch_size": 100},
           "sampling": {"clients_per_round": 5}, "output": {"dir": str(tmp_path / "r")}}
    res = fedray.run(job, model_fn=model_fn, client_data=clients)
    grads = [softmax_grad(w0, b0, x.astype(np.float64), y) for x, y in clients.values()]
    # float32 (vectorized workers, by default) against float64: one step, then the float64
    # mean rounded to float32 once; ulps of the weights' size
    atol = f32_atol(w0, b0, ulps=ULPS_PER_STEP * 2)
    np.testing.assert_allclose(res.weights["weight"].numpy(),
                               w0 - 0.4 * np.mean([g[0] for g in grads], axis=0), rtol=0,
                               atol=atol)
    np.testing.assert_allclose(res.weights["bias"].numpy(),
                               b0 - 0.4 * np.mean([g[1] for g in grads], axis=0), rtol=0,
                               atol=atol)
    assert res.summary["algorithm"]["aggregator"] == "uniform"


def test_fedavgm_with_zero_momentum_equals_fedavg(ray_cluster, tmp_path):
    clients = blobs(8, seed=5)
    base = {"rounds": 3, "sampling": {"clients_per_round": 4},
            "client": {"lr": 0.3, "batch_size": 4}, "eval": {"central": False},
            # one sequential worker: the presets, not the runtime, are compared here
            "runtime": {"num_workers": 1, "worker": {"vectorize": "off"}}}

    model_fn, _, _ = fixed_linear()

    def run(name, **server):
        job = dict(base, algorithm={"name": name}, server=server,
                   output={"dir": str(tmp_path / f"{name}{server}")})
        return fedray.run(job, model_fn=model_fn, client_data=clients).weights

    fedavg = run("fedavg")
    assert all(torch.equal(fedavg[k], v) for k, v in run("fedavgm", momentum=0.0).items())
    moved = run("fedavgm", momentum=0.9)
    assert any(not torch.equal(fedavg[k], v) for k, v in moved.items())
    # the other presets are checked against hand-computed numbers in test_algorithms_numeric.py
