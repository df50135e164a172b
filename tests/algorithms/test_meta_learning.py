"""Per-FedAvg (fedray/algorithms/meta_learning.py) through the whole runtime, against an
independent NumPy float64 re-implementation of Fallah, Mokhtari, Ozdaglar (NeurIPS 2020),
Algorithm 1, first-order (FO) and with the Hessian term (HF), on deterministic full-batch
linear-regression clients (f_k(w) = 1/2 ||X_k w - y_k||^2 / n_k, whose Hessian is the
constant X_k^T X_k / n_k) with partial participation: 5 clients, 3 a round. Every client
holds out 5 examples as its own test split, on which federated evaluation measures the
global model after one step at alpha on the client's training split, and the global model.

The runs use the inline backend (the driver and its worker in this process, bit-identical
to Ray's at the same worker count: tests/runtime/test_inline.py); test_one_vs_three_workers
keeps one run per variant on three Ray worker processes."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
import torch
from linear_regression import W0, linear_model_fn
from personalized_runs import clients_with_tests, eval_table, regression_job, weights_of
from tolerance import F32_EPS, ULPS_PER_STEP, f32_atol, merge_ulps

import fedray
from fedray.core.sampling import sample_clients
from fedray.errors import ConfigError
from fedray.state.checkpoint import read_checkpoint
from fedray.state.run_dir import SERVER_STATE_FILE, load_tensors

SEED = 7
ROUNDS, STEPS, PER_ROUND = 4, 3, 3
LR = 0.1  # client.lr: the meta step beta
ALPHA = 0.05  # the personalization step
PRESETS = {"fo": "per_fedavg", "hf": "per_fedavg_hf"}


CLIENTS = clients_with_tests([6 + 3 * i for i in range(5)], scale_step=0.25)
POPULATION = len(CLIENTS)


def f64(cid: int, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    x, y = CLIENTS[cid][split]
    return x.astype(np.float64), y.astype(np.float64)


def job(out_dir, which: str, *, rounds: int = ROUNDS, workers: int = 1,
        backend: str = "inline", batch_size: int = 64, **params) -> dict:
    """``which``: fo or hf, the preset per_fedavg or per_fedavg_hf. At the default batch
    size each of a step's batches D, D', D'' is all of the client's data (a permutation).
    Every client is evaluated on its own test split every second round."""
    return regression_job(out_dir, PRESETS[which],
                          {"name": PRESETS[which], "per_fedavg": {"alpha": ALPHA} | params},
                          seed=SEED, rounds=rounds, clients=POPULATION, per_round=PER_ROUND,
                          lr=LR, steps=STEPS, batch_size=batch_size, workers=workers,
                          backend=backend, eval_every=2, extra={"checkpoint": {"every": 2}})


def run(out_dir, variant: str, **kw):
    return fedray.run(job(out_dir, variant, **kw), model_fn=linear_model_fn(),
                      client_data=CLIENTS)


# -- the NumPy reference ------------------------------------------------------------------

def grad(cid: int, w: np.ndarray) -> np.ndarray:
    x, y = f64(cid)
    return x.T @ (x @ w - y) / len(y)


def hessian(cid: int) -> np.ndarray:
    x, _ = f64(cid)
    return x.T @ x / len(x)


def per_fedavg_numpy(rounds: int, variant: str, alpha: float = ALPHA) -> np.ndarray:
    """Algorithm 1 in float64: a sampled client starts at w^t and takes STEPS steps
    tmp = w - alpha grad f(w); FO: w -= LR grad f(tmp); HF: w -= LR (I - alpha H) grad
    f(tmp). The server sets the next model to the plain mean of the round's clients'
    models. A wrong variant, "proportional", weighs that mean by example counts (FO)."""
    w = W0.copy()
    for r in range(1, rounds + 1):
        ids = [int(c) for c in sample_clients(SEED, r, POPULATION, PER_ROUND)]
        deltas = []
        for k in ids:
            wk = w.copy()
            for _ in range(STEPS):
                g = grad(k, wk - alpha * grad(k, wk))
                if variant == "hf":
                    g = g - alpha * hessian(k) @ g
                wk = wk - LR * g
            deltas.append(wk - w)
        sizes = [len(CLIENTS[k]["train"][1]) if variant == "proportional" else 1 for k in ids]
        w = w + sum(s * d for s, d in zip(sizes, deltas, strict=True)) / sum(sizes)
    return w


def adapted(cid: int, w: np.ndarray) -> np.ndarray:
    """The paper's personalized model: one gradient step at ALPHA on the client's data."""
    return w - ALPHA * grad(cid, w)


def ref_atol(variant: str, *values) -> float:
    """The float32 runtime against the float64 reference (tolerance.py): ULPS_PER_STEP
    ulps of the weights' size for every float32 update of a model -- a step's tmp and its
    w (FO), and the Hessian term's (HF) -- and one for the delta, every round."""
    per_step = 3 if variant == "hf" else 2
    return f32_atol(*values, ulps=ULPS_PER_STEP * (per_step * STEPS + 1) * ROUNDS)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """ROUNDS rounds in one go per variant: one worker, clients one after another."""
    runs = {}

    def get(variant: str):
        if variant not in runs:
            runs[variant] = run(tmp_path_factory.mktemp(variant) / "straight", variant)
        return runs[variant]
    return get


# -- the tests ----------------------------------------------------------------------------

@pytest.mark.parametrize("variant", ["fo", "hf"])
def test_per_fedavg_matches_the_paper(straight, variant):
    res = straight(variant)
    w = per_fedavg_numpy(ROUNDS, variant)
    got = weights_of(res)
    atol = ref_atol(variant, w)
    # the test means something: the model moved, and the other variant, a mean weighed by
    # example counts, or FedAvg-like training without the personalization step (alpha 0)
    # each move it far beyond the tolerance
    assert np.abs(got - W0).max() > 0.1
    other = per_fedavg_numpy(ROUNDS, "hf" if variant == "fo" else "fo")
    assert np.abs(other - w).max() > 100 * atol
    assert np.abs(per_fedavg_numpy(ROUNDS, "proportional") - per_fedavg_numpy(ROUNDS, "fo")
                  ).max() > 100 * atol
    assert np.abs(per_fedavg_numpy(ROUNDS, variant, alpha=0.0) - w).max() > 100 * atol
    np.testing.assert_allclose(got, w, rtol=0, atol=atol)
    assert res.summary["algorithm"]["client"] == "per_fedavg"
    assert res.summary["algorithm"]["aggregator"] == "uniform"
    # no client state: the personalized model is made at evaluation and never kept
    assert not (pathlib.Path(res.run_dir) / "client_state").exists() or not any(
        (pathlib.Path(res.run_dir) / "client_state").iterdir())

    # every client evaluated after one step at ALPHA on its training split (a full batch:
    # batch_size 64), beside the global model. The adapted weights are within
    # atol (1 + ALPHA |H|_inf) of the reference's, below 2 atol for these clients; a loss
    # 1/2 mean(r^2) with weights within that moves by at most mean(|r| |dr| + dr^2 / 2),
    # |dr| <= sum_j |x_j| of it, plus a few ulps of the loss for the float32 evaluation
    assert max(ALPHA * np.abs(hessian(k)).sum(1).max() for k in CLIENTS) < 1
    table = eval_table(res.run_dir, ROUNDS, CLIENTS)
    for cid in CLIENTS:
        x, y = f64(cid, "test")
        dr = np.abs(x).sum(1) * 2 * atol
        personal = adapted(cid, w)
        for col, model in (("loss", personal), ("global_loss", w)):
            r = x @ model - y
            expected = float(0.5 * np.mean(r ** 2))
            tol = float(np.mean(np.abs(r) * dr + dr ** 2 / 2)) + 16 * F32_EPS * expected
            assert abs(table[col][cid] - expected) <= tol, (col, cid, table[col][cid],
                                                            expected)
        # the adapted model is not the global one, far beyond the tolerance
        assert abs(0.5 * np.mean((x @ personal - y) ** 2) - 0.5 * np.mean((x @ w - y) ** 2)
                   ) > 1e-3


@pytest.mark.parametrize("variant", ["fo", "hf"])
def test_resume_is_bit_identical(straight, tmp_path, variant):
    """ROUNDS / 2 rounds, then resumed to ROUNDS, equal the straight run bit for bit: the
    weights, the saved server state, and every round's client_eval table."""
    half = tmp_path / "half"
    first = run(half, variant, rounds=ROUNDS // 2)
    assert read_checkpoint(first.run_dir).round == ROUNDS // 2
    more = fedray.run(resume=str(half), overrides=[f"rounds={ROUNDS}"],
                      allow_changes=["rounds"], model_fn=linear_model_fn(),
                      client_data=CLIENTS)
    assert more.summary["resumed_from_round"] == ROUNDS // 2
    base = straight(variant)
    assert base.weights.keys() == more.weights.keys()
    assert all(torch.equal(base.weights[k], more.weights[k]) for k in base.weights)
    a = load_tensors(base.run_dir, SERVER_STATE_FILE)
    b = load_tensors(more.run_dir, SERVER_STATE_FILE)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert eval_table(base.run_dir, ROUNDS, CLIENTS) == eval_table(more.run_dir, ROUNDS, CLIENTS)


@pytest.mark.parametrize("variant", ["fo", "hf"])
def test_one_vs_three_workers(ray_cluster, tmp_path, variant):
    """With minibatches (batch_size 4: a step's D, D', D'' are three independent draws),
    the batches are a function of (seed, round, client) only, so every client's float32
    arithmetic is the same on one worker and on three; only the driver's float64 merge of
    the workers' partial sums is grouped otherwise (tolerance.merge_ulps). A schedule that
    depended on the worker would differ by whole gradient steps."""
    one = weights_of(run(tmp_path / "w1", variant, batch_size=4))
    three = run(tmp_path / "w3", variant, batch_size=4, workers=3, backend="ray")
    assert three.summary["num_workers"] == 3
    np.testing.assert_allclose(weights_of(three), one, rtol=0,
                               atol=f32_atol(one, ulps=merge_ulps(ROUNDS)))
    # and the minibatches matter: full batches give another model, far beyond that
    full = per_fedavg_numpy(ROUNDS, variant)
    assert np.abs(full - one).max() > 100 * f32_atol(one, ulps=merge_ulps(ROUNDS))


def test_the_hessian_term_is_exact_on_a_nonlinear_model(tmp_path):
    """On a model whose Hessian changes with w (a tanh layer), one HF client step from the
    runtime equals w - beta (I - alpha H(w)) grad f(w - alpha grad f(w)), H(w) formed in
    float64 by torch.func.hessian: the double backward is the exact product, not an
    approximation of it (a central difference would be off by O(delta^2) terms)."""
    from torch import nn
    from torch.func import functional_call, hessian
    from torch.func import grad as fgrad

    torch.manual_seed(0)

    def model_fn():
        torch.manual_seed(1)
        return nn.Sequential(nn.Linear(3, 2), nn.Tanh(), nn.Linear(2, 1))

    x, y = CLIENTS[2]["train"]
    data = {0: (x, y)}
    cfg = job(tmp_path / "tanh", "hf", rounds=1) | {"eval": {"central": False}}
    cfg["client"]["local_steps"] = 1
    cfg["sampling"]["clients_per_round"] = 1
    res = fedray.run(cfg, model_fn=model_fn, client_data=data)

    ref = model_fn().double()
    names = [n for n, _ in ref.named_parameters()]
    shapes = [p.shape for _, p in ref.named_parameters()]
    sizes = [p.numel() for _, p in ref.named_parameters()]
    xd, yd = torch.tensor(x, dtype=torch.float64), torch.tensor(y, dtype=torch.float64)

    def loss(flat):
        params = {n: t.view(s) for n, t, s in zip(names, flat.split(sizes), shapes,
                                                   strict=True)}
        out = functional_call(ref, params, (xd,))
        return 0.5 * ((out.reshape(-1) - yd) ** 2).mean()

    w = torch.cat([p.detach().reshape(-1) for p in ref.parameters()])
    g = fgrad(loss)(w - ALPHA * fgrad(loss)(w))
    want = w - LR * (g - ALPHA * hessian(loss)(w) @ g)
    fo = w - LR * g
    got = torch.cat([res.weights[n].double().reshape(-1) for n in names])
    atol = f32_atol(want.numpy(), ulps=ULPS_PER_STEP * 4)  # one step: tmp, w, H term, delta
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=0, atol=atol)
    assert (want - fo).abs().max() > 100 * atol  # the Hessian term mattered


@pytest.mark.parametrize("key, value, rule", [
    ("alpha", 0.0, r"must be a finite number > 0, got 0\.0"),
    ("variant", "so", r"must be fo or hf, got 'so'"),
    ("variant", 2, r"must be a string \(quote it\), got 2")])
def test_bad_values_are_refused_in_one_line(tmp_path, key, value, rule):
    from fedray.api import prepare

    with pytest.raises(ConfigError, match=rf"^config key 'algorithm\.per_fedavg\.{key}': "
                                          rf"{rule}$"):
        prepare(job(tmp_path / "run", "fo", **{key: value}), client_data=CLIENTS,
                model_fn=linear_model_fn())


def test_a_batchnorm_model_trains_and_evaluates(tmp_path):
    """Float buffers take every forward pass of a step (HF's double backward included):
    the run stays finite and the global running statistics moved."""
    from torch import nn

    def bn_model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 1))

    for variant in ("fo", "hf"):
        res = fedray.run(job(tmp_path / variant, variant, rounds=2), model_fn=bn_model,
                         client_data=CLIENTS)
        assert all(torch.isfinite(v).all() for v in res.weights.values())
        assert not torch.equal(res.weights["1.running_mean"], torch.zeros(4))
        assert "fed_test_global_loss" in res.metrics[-1]
