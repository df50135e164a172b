"""The partial-model presets (fedray/algorithms/partial_models.py): fedper, fedrep, lg_fedavg
and fedbn against independent NumPy float64 re-implementations of their papers on
deterministic full-batch regression clients -- the global model, every client's stored
local part after several rounds, and the per-client evaluation with the client's own model
and with the global one -- then the selectors' defaults and refusals, the vectorized kernels,
a CLI run resumed bit for bit, and 1 against 3 Ray workers."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
import torch
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
from torch import nn

import fedray
from fedray.core.flat_model import FlatModel
from fedray.core.models import build_model
from fedray.errors import ConfigError

# a linear body (2 features, no bias: "0.") and a linear head ("1.": weight, bias)
D = 3
BODY0 = np.array([[0.3, -0.2, 0.1], [0.2, 0.1, -0.3]])
HEAD0 = np.array([0.5, -0.4, 0.1])  # 1.weight (2 values), then 1.bias
H_STEPS, H_LR = 4, 0.05  # FedRep's head phase


def two_layer_fn(norm: bool = False):
    """The two-layer model; ``norm``: with a BatchNorm1d between the layers (FedBN's), the
    head then being "2."."""
    def model_fn():  # a closure: shipped to the workers by value
        layers = [nn.Linear(D, 2, bias=False)] + ([nn.BatchNorm1d(2)] if norm else []) + [
            nn.Linear(2, 1)]
        m = nn.Sequential(*layers)
        with torch.no_grad():
            m[0].weight.copy_(torch.tensor(BODY0, dtype=torch.float32))
            m[-1].weight.copy_(torch.tensor(HEAD0[:2], dtype=torch.float32).view(1, 2))
            m[-1].bias.fill_(float(np.float32(HEAD0[2])))
        return m
    return model_fn


def grads(b: np.ndarray, h: np.ndarray, x: np.ndarray, y: np.ndarray
          ) -> tuple[np.ndarray, np.ndarray]:
    """The mse's gradients in the body and the head of x -> (x b^T) h[:2] + h[2]."""
    feat = x @ b.T
    r = feat @ h[:2] + h[2] - y
    return np.outer(h[:2], x.T @ r / len(y)), np.append(feat.T @ r / len(y), r.mean())


def predict(b: np.ndarray, h: np.ndarray, x: np.ndarray) -> np.ndarray:
    return x @ b.T @ h[:2] + h[2]


def partial_numpy(kind: str, rounds: int = ROUNDS):
    """The three papers in float64, full participation, STEPS full-batch GD steps at LR:

    fedper     (Arivazhagan et al. 2019) the whole model trains from the global body and the
               client's own head (the initial head before its first round); the server
               averages the bodies' deltas weighted by example counts; heads stay local.
    fedrep     (Collins et al. 2021, Alg. 1) the client's head first, H_STEPS steps at H_LR
               with the body frozen, then the body STEPS steps with the head frozen; bodies
               averaged, heads local.
    lg_fedavg  (Liang et al. 2020) the whole model from the client's own body and the
               global head; heads averaged, bodies local.
    Returns the global body and head and every client's local part."""
    body, head, own = BODY0.copy(), HEAD0.copy(), {}
    for _ in range(rounds):
        num, den = 0.0, 0.0
        for cid, data in CLIENTS.items():
            x, y = f64(data["train"])
            if kind == "lg_fedavg":
                b, h = own.get(cid, body).copy(), head.copy()
            else:
                b, h = body.copy(), own.get(cid, head).copy()
            if kind == "fedrep":
                for _ in range(H_STEPS):
                    h = h - H_LR * grads(b, h, x, y)[1]
                for _ in range(STEPS):
                    b = b - LR * grads(b, h, x, y)[0]
            else:
                for _ in range(STEPS):
                    gb, gh = grads(b, h, x, y)
                    b, h = b - LR * gb, h - LR * gh
            den += len(y)
            if kind == "lg_fedavg":
                num, own[cid] = num + len(y) * (h - head), b
            else:
                num, own[cid] = num + len(y) * (b - body), h
        if kind == "lg_fedavg":
            head = head + num / den
        else:
            body = body + num / den
    return body, head, own


PRESETS = {"fedper": {"name": "fedper"},
           "fedrep": {"name": "fedrep", "fedrep": {"head_steps": H_STEPS, "head_lr": H_LR}},
           "lg_fedavg": {"name": "lg_fedavg"}}


@pytest.mark.parametrize("vectorize", ["off", "on"])
@pytest.mark.parametrize("kind", list(PRESETS))
def test_partial_models_match_their_papers(tmp_path, kind, vectorize):
    body, head, own = partial_numpy(kind)
    got, run_dir = run_linear(tmp_path, f"{kind}-{vectorize}", PRESETS[kind], two_layer_fn(),
                              vectorize)
    # The float32 runtime against the float64 reference: a round's local steps and its
    # delta (tolerance.ULPS_PER_STEP each) of the weights' size; the two-layer model's
    # gradient is a product of the body and the head, each within that of the reference,
    # so twice it (FedRep's head phase adds its H_STEPS steps)
    steps = STEPS + 1 + (H_STEPS if kind == "fedrep" else 0)
    atol = f32_atol(body, head, *own.values(), ulps=2 * ULPS_PER_STEP * steps * ROUNDS)
    shared, local = ("1.", "0.") if kind == "lg_fedavg" else ("0.", "1.")
    if kind == "lg_fedavg":
        np.testing.assert_allclose(got["1.weight"].reshape(-1), head[:2], rtol=0, atol=atol)
        np.testing.assert_allclose(got["1.bias"], head[2:], rtol=0, atol=atol)
        # the global body is never averaged: it stays the initial one, bit for bit
        np.testing.assert_array_equal(got["0.weight"], np.float32(BODY0))
    else:
        np.testing.assert_allclose(got["0.weight"], body, rtol=0, atol=atol)
        np.testing.assert_array_equal(got["1.weight"].reshape(-1), np.float32(HEAD0[:2]))
        np.testing.assert_array_equal(got["1.bias"], np.float32(HEAD0[2:]))
    state = stored(run_dir)
    assert sorted(state) == sorted(CLIENTS)
    for cid, part in own.items():
        assert set(state[cid]) == {"local"}
        np.testing.assert_allclose(state[cid]["local"].double().numpy(), part.reshape(-1),
                                   rtol=0, atol=atol)
    # the test means something: the shared part moved, and the local parts went their own
    # ways far beyond the tolerance
    moved = head - HEAD0 if kind == "lg_fedavg" else body - BODY0
    assert np.abs(moved).max() > 1e-2, shared
    assert min(np.abs(own[a] - own[b]).max() for a in own for b in own if a < b) > 1e-2, local
    if kind == "fedrep":  # the head phase matters: FedPer's numbers are far from FedRep's
        assert np.abs(partial_numpy("fedper")[0] - body).max() > 100 * atol
    if kind == "lg_fedavg":
        check_eval(run_dir, lambda c, x: predict(own[c], head, x),
                   lambda c, x: predict(body, head, x), atol)
    else:
        check_eval(run_dir, lambda c, x: predict(body, own[c], x),
                   lambda c, x: predict(body, head, x), atol)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert {"clients_loss_mean", "clients_global_loss_mean", "fed_test_global_loss"} <= set(
        metrics[-1])


# -- FedBN: a BatchNorm layer between the two linear layers -------------------------------

EPS, MOMENTUM = 1e-5, 0.1  # BatchNorm1d's defaults


def bn_forward(p: dict, x: np.ndarray, train: bool):
    h = x @ p["w"].T
    mu, var = (h.mean(0), h.var(0)) if train else (p["rm"], p["rv"])
    inv = 1 / np.sqrt(var + EPS)
    xh = (h - mu) * inv
    z = p["gamma"] * xh + p["beta"]
    return h, mu, var, inv, xh, z, z @ p["w2"] + p["b2"]


def fedbn_step(p: dict, x: np.ndarray, y: np.ndarray) -> dict:
    """One full-batch GD step of the mse, BatchNorm in training mode (batch statistics, the
    running ones updated as torch does: momentum 0.1, the unbiased variance)."""
    n = len(y)
    h, mu, var, inv, xh, z, out = bn_forward(p, x, train=True)
    g = (out - y) / n  # d loss / d out
    dz = np.outer(g, p["w2"])
    dxh = dz * p["gamma"]
    dh = inv / n * (n * dxh - dxh.sum(0) - xh * (dxh * xh).sum(0))
    new = {"w": p["w"] - LR * dh.T @ x, "gamma": p["gamma"] - LR * (dz * xh).sum(0),
           "beta": p["beta"] - LR * dz.sum(0), "w2": p["w2"] - LR * z.T @ g,
           "b2": p["b2"] - LR * g.sum(),
           "rm": (1 - MOMENTUM) * p["rm"] + MOMENTUM * mu,
           "rv": (1 - MOMENTUM) * p["rv"] + MOMENTUM * var * n / (n - 1)}
    return new


LOCAL_BN = ("gamma", "beta", "rm", "rv")  # BatchNorm's "1." entries, in flat order


def fedbn_numpy(rounds: int = ROUNDS, shared: bool = False):
    """Li et al. (ICLR 2021), Alg. 1, in float64, full participation: each client trains
    the whole model from the global linear layers and its own BatchNorm layer (affine
    parameters and running statistics; the initial ones before its first round), STEPS
    full-batch steps; the server averages the linear layers' deltas weighted by example
    counts; the BatchNorm layer stays with the client. ``shared``: FedAvg's, which averages
    the BatchNorm layer too (what the tests tell apart)."""
    g = {"w": BODY0.copy(), "gamma": np.ones(2), "beta": np.zeros(2), "w2": HEAD0[:2].copy(),
         "b2": HEAD0[2:].copy(), "rm": np.zeros(2), "rv": np.ones(2)}
    own = {}
    for _ in range(rounds):
        num, den = {k: 0.0 for k in ("w", "w2", "b2") + (LOCAL_BN if shared else ())}, 0.0
        for cid, data in CLIENTS.items():
            x, y = f64(data["train"])
            p = {**g, **({} if shared else own.get(cid, {}))}
            for _ in range(STEPS):
                p = fedbn_step(p, x, y)
            den += len(y)
            for k in num:
                num[k] = num[k] + len(y) * (p[k] - g[k])
            own[cid] = {k: p[k] for k in LOCAL_BN}
        g = {**g, **{k: g[k] + num[k] / den for k in num}}
    return g, own


def test_fedbn_matches_its_paper(tmp_path):
    g, own = fedbn_numpy()
    got, run_dir = run_linear(tmp_path, "fedbn", {"name": "fedbn"}, two_layer_fn(norm=True),
                              "off")
    # the two-layer model's tolerance (a product of two weights: twice a round's ulps),
    # twice again for the normalisation, whose division by the batch's standard deviation
    # scales every step's float32 rounding
    atol = f32_atol(*g.values(), *(v for p in own.values() for v in p.values()),
                    ulps=4 * ULPS_PER_STEP * (STEPS + 1) * ROUNDS)
    assert np.abs(fedbn_numpy(shared=True)[0]["w"] - g["w"]).max() > 100 * atol  # FedAvg's
    np.testing.assert_allclose(got["0.weight"], g["w"], rtol=0, atol=atol)
    np.testing.assert_allclose(got["2.weight"].reshape(-1), g["w2"], rtol=0, atol=atol)
    np.testing.assert_allclose(got["2.bias"], g["b2"], rtol=0, atol=atol)
    # the global BatchNorm layer is never averaged: its initial values, bit for bit
    for k, v in (("1.weight", 1.0), ("1.bias", 0.0), ("1.running_mean", 0.0),
                 ("1.running_var", 1.0)):
        assert (got[k] == v).all(), k
    state = stored(run_dir)
    for cid, p in own.items():
        np.testing.assert_allclose(state[cid]["local"].double().numpy(),
                                   np.concatenate([p[k] for k in LOCAL_BN]), rtol=0,
                                   atol=atol)
    assert min(np.abs(own[a]["rm"] - own[b]["rm"]).max()
               for a in own for b in own if a < b) > 1e-2  # each client its own statistics

    def evaluated(cid, x, local=True):
        p = {**g, **(own[cid] if local else {})}
        return bn_forward(p, x, train=False)[-1]

    check_eval(run_dir, evaluated, lambda c, x: evaluated(c, x, local=False), atol)


# -- selectors: the zoo's defaults, and what is refused ----------------------------------

def test_every_zoo_model_has_a_head_and_a_body():
    """FedPer, FedRep and LG-FedAvg run on every model of the zoo with their defaults; the
    BatchNorm ones have normalization layers for FedBN. Which parameters, exactly, is what
    docs/algorithms.md says."""
    expected = {"emnist_cnn": ("classifier.3.",), "leaf_cnn": ("9.",), "logreg": ("1.bias",),
                "mlp": ("3.",), "shakespeare_lstm": ("out.",),
                "resnet18_gn": ("net.fc.",), "emnist_cnn_bn": ("classifier.4.",),
                "cifar_cnn_bn": ("classifier.3.",)}
    from fedray.core.model_parts import head_prefixes

    for name, head in expected.items():
        shape = {"shakespeare_lstm": (80,), "cifar_cnn_bn": (3, 32, 32),
                 "resnet18_gn": (3, 32, 32)}.get(name, (1, 28, 28))
        model = FlatModel(build_model(name, shape, 90 if name == "shakespeare_lstm" else 62))
        assert head_prefixes(model.module) == head, name
        n_head = model.positions(("@head",)).numel()
        n_body = model.positions(("@body",)).numel()
        assert 0 < n_head < model.size and n_head + n_body == model.size, name
        assert model.positions(("!@head",)).tolist() == model.positions(("@body",)).tolist()
        norm = model.positions(("@norm",)).numel()
        assert (norm > 0) is name.endswith(("_bn", "_gn")), name


@pytest.mark.parametrize("algorithm, model_fn, match", [
    ({"name": "fedper", "fedper": {"head": ["2."]}}, two_layer_fn(),
     r"'algorithm\.fedper\.head': keeps no parameter of the model local"),
    ({"name": "lg_fedavg", "lg_fedavg": {"head": [""]}}, two_layer_fn(),
     r"'algorithm\.lg_fedavg\.head': must be a non-empty list"),
    ({"name": "fedrep", "fedrep": {"head": ["0.", "1."]}}, two_layer_fn(),
     r"'algorithm\.fedrep\.head': keeps every parameter of the model local"),
    ({"name": "fedbn"}, two_layer_fn(),
     r"'algorithm\.fedbn\.norm': keeps no parameter of the model local .*emnist_cnn_bn"),
    ({"name": "fedper", "fedper": {"head": ["!1."]}}, two_layer_fn(),
     r"'algorithm\.fedper\.head': must be a non-empty list of parameter-name prefixes or "
     r"the selectors"),
    ({"name": "fedrep", "fedrep": {"head_steps": 0}}, two_layer_fn(),
     r"'algorithm\.fedrep\.head_steps': must be an integer >= 1"),
    ({"name": "fedrep", "fedrep": {"head_lr": -1.0}}, two_layer_fn(),
     r"'algorithm\.fedrep\.head_lr': must be > 0")])
def test_bad_selections_are_refused_in_one_line(tmp_path, algorithm, model_fn, match):
    """Before any worker starts: a head that is empty would run FedAvg silently, one that is
    everything would share nothing."""
    with pytest.raises(ConfigError, match=match):
        run_linear(tmp_path, "bad", algorithm, model_fn, "off")


# -- the vectorized kernels, the CLI with a resume, 1 against 3 Ray workers ---------------

@pytest.mark.parametrize("model", ["logreg", "mlp"])
@pytest.mark.parametrize("preset", ["fedper", "fedrep", "lg_fedavg", "ditto"])
def test_vectorize_on_trains_them_in_the_batched_kernel(tmp_path, monkeypatch, preset,
                                                        model):
    """`runtime.worker.vectorize: on` is accepted, and no client trains on the sequential
    path (which raises here: the in-process backend's workers are this process's
    objects): every phase runs batched, logreg's head being its bias (Ditto, a personal
    model of two phases, here too)."""
    from example_runs import tiny_job

    from fedray.runtime.worker import ClientWorker

    def refuse(*args, **kwargs):
        raise AssertionError("a client trained one after another")

    monkeypatch.setattr(ClientWorker, "_train_client", refuse)
    job = tiny_job(preset, {"name": preset}, model=model, workers=1, vectorize="on")
    job["runtime"]["backend"] = "inline"
    job["output"]["dir"] = str(tmp_path / "run")
    res = fedray.run(job)
    assert json.loads(pathlib.Path(res.run_dir, "summary.json").read_text())["vectorized"]
    assert stored(pathlib.Path(res.run_dir))  # the clients' state was kept


CLI = {"fedper": ["model.name=logreg"], "fedrep": ["model.name=logreg",
                                                   "algorithm.fedrep.head_epochs=2"],
       "lg_fedavg": ["model.name=mlp"], "fedbn": ["model.name=emnist_cnn_bn"]}


@pytest.mark.parametrize("preset", list(CLI))
def test_the_cli_runs_and_resumes_it_bit_for_bit(tmp_path, preset):
    cli_resumes_bit_for_bit(tmp_path, [f"algorithm.name={preset}", *CLI[preset]])


@pytest.mark.parametrize("preset", ["fedper", "fedrep", "lg_fedavg"])
def test_one_vs_three_ray_workers(ray_cluster, tmp_path, preset):
    one_vs_three_ray_workers(tmp_path, preset, {"name": preset})
