"""examples/local_head.py (FedPer) and examples/personal_model.py (Ditto): two user parts
kept outside the package, written against the phases API only, tested as examples/qffl.py
is (tests/test_examples.py): their numbers against the papers' algorithms in NumPy float64
(global model, every client's stored state, and the per-client evaluation that uses it),
the CLI and a resume, 1 against 3 Ray workers, a 2-trial sweep and ``fedray submit``, and
the vectorized kernels on logistic regression and the MLP."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
import torch
from example_runs import (
    REPO,
    cli_run,
    importable,  # noqa: F401 -- a fixture
    submit_to_local_head,
    sweep_elsewhere,
    tiny_job,
)
from linear_regression import W0, D, linear_model_fn, regression_clients
from tolerance import F32_EPS, ULPS_PER_STEP, f32_atol, merge_ulps
from torch import nn

import fedray
from fedray.errors import ConfigError
from fedray.state.checkpoint import read_checkpoint
from fedray.state.client_state import ClientStateStore
from fedray.state.run_dir import load_weights

# every test imports the examples from the repository root, wherever pytest runs
pytestmark = pytest.mark.usefixtures("importable")

LOCAL_HEAD = "examples.local_head:LocalHead"
DITTO = "examples.personal_model:Ditto"

# -- the numbers: deterministic full-batch linear regression ------------------------------

LR, STEPS, ROUNDS, TEST = 0.1, 3, 3, 5


def make_clients() -> dict[int, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Three heterogeneous regression clients (tests/linear_regression.py) of 8, 11 and 14
    training examples, each holding out its last 5 examples as its own test split."""
    out = {}
    for cid, (x, y) in regression_clients([8 + TEST, 11 + TEST, 14 + TEST]).items():
        out[cid] = {"train": (x[:-TEST], y[:-TEST]), "test": (x[-TEST:], y[-TEST:])}
    return out


CLIENTS = make_clients()


def f64(split: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    return split[0].astype(np.float64), split[1].astype(np.float64)


# FedPer's model: a linear body (2 features, no bias) and a linear head ("1.": weight, bias)
BODY0 = np.array([[0.3, -0.2, 0.1], [0.2, 0.1, -0.3]])
HEAD0 = np.array([0.5, -0.4, 0.1])  # 1.weight (2 values), then 1.bias


def two_layer_fn():
    def model_fn():  # a closure: shipped to the workers by value
        m = nn.Sequential(nn.Linear(D, 2, bias=False), nn.Linear(2, 1))
        with torch.no_grad():
            m[0].weight.copy_(torch.tensor(BODY0, dtype=torch.float32))
            m[1].weight.copy_(torch.tensor(HEAD0[:2], dtype=torch.float32).view(1, 2))
            m[1].bias.fill_(float(np.float32(HEAD0[2])))
        return m
    return model_fn


def two_layer_predict(body: np.ndarray, head: np.ndarray, x: np.ndarray) -> np.ndarray:
    return x @ body.T @ head[:2] + head[2]


def fedper_numpy(rounds: int) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """Arivazhagan et al. (2019) with full participation, in float64: every client trains
    the whole model (body and its own head, the initial head before its first round) by
    STEPS full-batch GD steps; the server averages the bodies' deltas weighted by example
    counts; the heads stay on the clients. Returns the body and every client's head."""
    body, heads = BODY0.copy(), {}
    for _ in range(rounds):
        num, den = np.zeros_like(body), 0.0
        for cid, data in CLIENTS.items():
            x, y = f64(data["train"])
            b, h = body.copy(), heads.get(cid, HEAD0).copy()
            for _ in range(STEPS):
                feat = x @ b.T
                r = feat @ h[:2] + h[2] - y
                g_head = np.append(feat.T @ r / len(y), r.mean())
                g_body = np.outer(h[:2], x.T @ r / len(y))
                b, h = b - LR * g_body, h - LR * g_head
            num += len(y) * (b - body)
            den += len(y)
            heads[cid] = h
        body = body + num / den
    return body, heads


# Ditto on tests/linear_regression.py's bias-free Linear(3, 1)
LAM, P_STEPS, P_LR = 0.5, 2, 0.05


def grad(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return x.T @ (x @ w - y) / len(y)


def ditto_numpy(rounds: int) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """Li et al. (ICML 2021), Alg. 1, with full participation, in float64: each client
    takes STEPS GD steps from w^t (its update, averaged by example counts), and P_STEPS
    steps v <- v - P_LR (grad f_k(v) + LAM (v - w^t)) of its personal model v_k, from w^t
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
                v = v - P_LR * (grad(v, x, y) + LAM * (v - w))
            personal[cid] = v
        w = w + num / den
    return w, personal


def run_linear(tmp_path, name: str, algorithm: dict, model_fn, vectorize: str,
               workers: int = 1) -> tuple[dict[str, np.ndarray], pathlib.Path]:
    """Full participation, K full-batch steps (batch 64 > every client's size), MSE, the
    in-process backend; every client evaluated (its own test split) after every round."""
    job = {"name": name, "seed": 1, "rounds": ROUNDS, "model": {"loss": "mse"},
           "algorithm": algorithm, "client": {"lr": LR, "batch_size": 64, "local_steps": STEPS},
           "sampling": {"clients_per_round": len(CLIENTS)},
           "runtime": {"backend": "inline", "num_workers": workers,
                       "worker": {"num_cpus": 0.5, "vectorize": vectorize}},
           "eval": {"central": False, "federated_clients": len(CLIENTS), "every": 1},
           "output": {"dir": str(tmp_path / name)}}
    res = fedray.run(job, model_fn=model_fn, client_data=CLIENTS)
    run_dir = pathlib.Path(res.run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["vectorized"] is (vectorize == "on")
    return {k: v.double().numpy() for k, v in res.weights.items()}, run_dir


def stored(run_dir: pathlib.Path) -> dict[int, dict[str, torch.Tensor]]:
    """Every client's current state, as the run's final checkpoint locates it in the
    client state store."""
    store = ClientStateStore(f"{run_dir}/client_state")
    current = store.current(read_checkpoint(str(run_dir)).client_versions)
    return {cid: state for cid, (_, state) in current.items()}


def eval_losses(run_dir: pathlib.Path, r: int) -> dict[int, float]:
    """Round ``r``'s per-client mean test loss (client_eval/round_NNNNNN.arrow)."""
    from fedray.tracking.client_eval import read_table, table_name

    table = read_table((run_dir / table_name(r)).read_bytes()).to_pydict()
    assert sorted(table["client_id"]) == sorted(CLIENTS)  # every client, each with its test
    return dict(zip(table["client_id"], table["loss"], strict=True))


def loss_atol(residual: np.ndarray, x: np.ndarray, weight_atol: float, loss: float) -> float:
    """How far a client's float32 test loss may be from the float64 one when the weights it
    uses are within ``weight_atol`` of the reference's: the loss 1/2 mean(r^2) moves by at
    most mean(|r| |dr|) + mean(dr^2)/2 for a residual change |dr| <= (sum_j |x_j| + 1)
    weight_atol (for the two-layer model a product of two weights: twice that, taken as a
    factor 4 with the cross term), plus the float32 evaluation's own rounding, a few ulps of
    the loss (a 5-term mean of products of 3-term sums)."""
    dr = 4 * (np.abs(x).sum(1) + 1) * weight_atol
    return float(np.mean(np.abs(residual) * dr + dr ** 2 / 2)) + 16 * F32_EPS * loss


PER_ROUND = ULPS_PER_STEP * (STEPS + 1)  # a round's local steps and its delta (tolerance.py)


@pytest.mark.parametrize("vectorize", ["off", "on"])
def test_local_head_is_fedper_by_hand(tmp_path, vectorize):
    body, heads = fedper_numpy(ROUNDS)
    got, run_dir = run_linear(tmp_path, f"fedper-{vectorize}",
                              {"client": LOCAL_HEAD, "local_head": {"prefix": "1."}},
                              two_layer_fn(), vectorize)
    # The float32 runtime against the float64 reference: PER_ROUND ulps of the weights'
    # size a round (tolerance.py); the two-layer model's gradient is a product of the body
    # and the head, each within that of the reference, so twice it.
    atol = f32_atol(body, HEAD0, *heads.values(), ulps=2 * PER_ROUND * ROUNDS)
    np.testing.assert_allclose(got["0.weight"], body, rtol=0, atol=atol)
    # the global head is never averaged: it stays the initial one, bit for bit
    np.testing.assert_array_equal(got["1.weight"].reshape(-1), np.float32(HEAD0[:2]))
    np.testing.assert_array_equal(got["1.bias"], np.float32(HEAD0[2:]))
    state = stored(run_dir)
    assert sorted(state) == sorted(CLIENTS)
    for cid, head in heads.items():
        np.testing.assert_allclose(state[cid]["local"].double().numpy(), head, rtol=0,
                                   atol=atol)
    # the heads went their own ways, far beyond the tolerance
    assert min(np.abs(heads[a] - heads[b]).max() for a in heads for b in heads if a < b) > 1e-2
    assert np.abs(body - BODY0).max() > 1e-2
    # every client evaluated with the global body and its own head
    for cid, loss in eval_losses(run_dir, ROUNDS).items():
        x, y = f64(CLIENTS[cid]["test"])
        r = two_layer_predict(body, heads[cid], x) - y
        expected = 0.5 * np.mean(r ** 2)
        assert abs(loss - expected) <= loss_atol(r, x, atol, expected), (cid, loss, expected)
        global_r = two_layer_predict(body, HEAD0, x) - y
        assert abs(0.5 * np.mean(global_r ** 2) - expected) > 1e-3  # not the global head


@pytest.mark.parametrize("vectorize", ["off", "on"])
def test_personal_model_is_ditto_by_hand(tmp_path, vectorize):
    w, personal = ditto_numpy(ROUNDS)
    algorithm = {"client": DITTO, "ditto": {"lam": LAM, "steps": P_STEPS, "lr": P_LR}}
    got, run_dir = run_linear(tmp_path, f"ditto-{vectorize}", algorithm, linear_model_fn(),
                              vectorize)
    atol = f32_atol(w, *personal.values(), ulps=PER_ROUND * ROUNDS)
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
    # every client evaluated with its personal model
    for cid, loss in eval_losses(run_dir, ROUNDS).items():
        x, y = f64(CLIENTS[cid]["test"])
        r = x @ personal[cid] - y
        expected = 0.5 * np.mean(r ** 2)
        assert abs(loss - expected) <= loss_atol(r, x, atol, expected), (cid, loss, expected)
        assert abs(0.5 * np.mean((x @ w - y) ** 2) - expected) > 1e-3  # not the global one


def test_ditto_at_lambda_zero_trains_each_client_alone(tmp_path):
    """lam = 0: a personal model is the client's own local training, carried across rounds
    (its ROUNDS * P_STEPS steps of plain GD from the initial model), whatever the global."""
    algorithm = {"client": DITTO, "ditto": {"lam": 0.0, "steps": P_STEPS, "lr": P_LR}}
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


@pytest.mark.parametrize("algorithm, key, rule", [
    ({"client": LOCAL_HEAD, "local_head": {"prefix": " "}}, "local_head.prefix",
     "must name the head's parameters"),
    ({"client": DITTO, "ditto": {"lam": -1.0}}, "ditto.lam", "must be >= 0"),
    ({"client": DITTO, "ditto": {"steps": 0}}, "ditto.steps", "must be >= 1"),
    ({"client": DITTO, "ditto": {"steps": 2, "epochs": 1}}, "ditto.steps",
     "give steps or epochs, not both"),
    ({"client": DITTO, "ditto": {"lr": 0.0}}, "ditto.lr", "must be > 0")])
def test_their_parameters_are_checked_like_a_built_in_one(tmp_path, algorithm,
                                                          key, rule):
    from fedray.api import prepare

    job = {"algorithm": algorithm, "sampling": {"clients_per_round": 3},
           "output": {"dir": str(tmp_path / "run")}}
    with pytest.raises(ConfigError, match=rf"config key 'algorithm\.{key}': {rule}"):
        prepare(job, client_data=CLIENTS, model_fn=linear_model_fn())


def test_a_head_prefix_that_selects_nothing_or_everything_is_refused(tmp_path):
    """Either would run without complaint otherwise: as FedAvg (nothing local), or with
    nothing shared at all."""
    for prefix, model_fn, what in (("2.", two_layer_fn(), "no parameter"),
                                   ("weight", linear_model_fn(), "every parameter")):
        algorithm = {"client": LOCAL_HEAD, "local_head": {"prefix": prefix}}
        with pytest.raises(Exception, match=rf"algorithm\.local_head\.prefix': "
                                            rf"'{prefix}' selects {what}"):
            run_linear(tmp_path, f"bad-{what[:2]}", algorithm, model_fn, "off")


# -- the vectorized kernels on logistic regression and the MLP ----------------------------

SYNTHETIC = {"local_head": {"logreg": {"client": LOCAL_HEAD, "local_head": {"prefix": "1.bias"}},
                            "mlp": {"client": LOCAL_HEAD}},
             "ditto": {"logreg": {"client": DITTO}, "mlp": {"client": DITTO}}}


@pytest.mark.parametrize("model", ["logreg", "mlp"])
@pytest.mark.parametrize("example", ["local_head", "ditto"])
def test_vectorize_on_trains_them_in_the_batched_kernel(tmp_path, monkeypatch,
                                                        example, model):
    """`runtime.worker.vectorize: on` is accepted, and no client of theirs trains on the
    sequential path (which raises here: the in-process backend's workers are this
    process's objects): every phase runs batched."""
    from fedray.runtime.worker import ClientWorker

    def refuse(*args, **kwargs):
        raise AssertionError("a client trained one after another")

    monkeypatch.setattr(ClientWorker, "_train_client", refuse)
    job = tiny_job(example, SYNTHETIC[example][model], model=model, workers=1, vectorize="on")
    job["runtime"]["backend"] = "inline"
    job["output"]["dir"] = str(tmp_path / "run")
    res = fedray.run(job)
    assert json.loads(pathlib.Path(res.run_dir, "summary.json").read_text())["vectorized"]
    assert stored(pathlib.Path(res.run_dir))  # the clients' state was kept


# -- the CLI and a resume -----------------------------------------------------------------

CLI = {"local_head": [f"algorithm.client={LOCAL_HEAD}", "algorithm.local_head.prefix=1.bias"],
       "ditto": [f"algorithm.client={DITTO}", "algorithm.ditto.lam=0.5"]}
TINY = ["model.name=logreg", "data.synthetic.num_clients=40", "data.synthetic.min_examples=10",
        "data.synthetic.max_examples=30", "data.synthetic.test_writers=20",
        # 16 of 40 a round: over 4 rounds most clients come back with a stored state
        "sampling.clients_per_round=16", "runtime.num_workers=2", "runtime.worker.num_cpus=1",
        "runtime.worker.vectorize=off", "eval.every=0", "output.tensorboard=false",
        "runtime.backend=inline"]


@pytest.mark.parametrize("example", ["local_head", "ditto"])
def test_the_cli_runs_and_resumes_it_bit_for_bit(tmp_path, example):
    """`fedray run` from the repository root, then `--resume` with more rounds: the same
    weights and the same stored state of every client as a straight run."""
    from fedray.cli import main

    run_dir = tmp_path / "run"
    cli_run(run_dir, ["rounds=2", *TINY, *CLI[example]])
    main(["run", "--resume", str(run_dir), "rounds=4", "--allow-change", "rounds", "--quiet"])
    straight = fedray.run(str(REPO / "jobs" / "quickstart.yaml"),
                          overrides=["rounds=4", f"output.dir={tmp_path / 'straight'}", *TINY,
                                     *CLI[example]])
    resumed = load_weights(str(run_dir))
    assert all(torch.equal(resumed[k], straight.weights[k]) for k in resumed)
    got, want = stored(run_dir), stored(pathlib.Path(straight.run_dir))
    assert got.keys() == want.keys() and len(got) > 16  # more than one round's clients
    for cid in want:
        assert all(torch.equal(got[cid][k], want[cid][k]) for k in want[cid]), cid


# -- 1 against 3 Ray workers --------------------------------------------------------------

@pytest.mark.parametrize("example", ["local_head", "ditto"])
def test_one_vs_three_ray_workers(ray_cluster, tmp_path, example):
    """Three Ray worker processes reading and writing one client state store: each client's
    float32 arithmetic is the same as on one worker; only the driver's float64 merge of the
    partial sums is grouped otherwise (tolerance.merge_ulps: a last bit of the new global
    weights may flip in a round, and the later rounds, the states included, carry it)."""
    rounds = 3
    runs = {}
    for workers in (1, 3):
        job = tiny_job(example, SYNTHETIC[example]["logreg"], workers=workers)
        job["rounds"], job["sampling"]["clients_per_round"] = rounds, 16
        job["runtime"] = {"num_workers": workers, "worker": {"num_cpus": 0.5,
                                                             "vectorize": "off"}}
        job["output"]["dir"] = str(tmp_path / f"w{workers}")
        res = fedray.run(job)
        assert res.summary["num_workers"] == workers
        runs[workers] = ({k: v.double().numpy() for k, v in res.weights.items()},
                         stored(pathlib.Path(res.run_dir)))
    (one, one_state), (three, three_state) = runs[1], runs[3]
    for k in one:
        np.testing.assert_allclose(three[k], one[k], rtol=0,
                                   atol=f32_atol(one[k], ulps=merge_ulps(rounds)))
    assert one_state.keys() == three_state.keys() and len(one_state) > 16
    key = "local" if example == "local_head" else "personal"
    for cid, state in one_state.items():
        a, b = state[key].double().numpy(), three_state[cid][key].double().numpy()
        np.testing.assert_allclose(b, a, rtol=0, atol=f32_atol(a, ulps=merge_ulps(rounds)))


# -- a sweep and `fedray submit` ----------------------------------------------------------

SWEPT = {"local_head": {"algorithm.local_head.prefix": ["1.bias", "1.weight"]},
         "ditto": {"algorithm.ditto.lam": [0.0, 1.0]}}


@pytest.mark.parametrize("example", ["local_head", "ditto"])
def test_sweep_trials_import_it_where_the_callers_files_are_not(tmp_path, example):
    job = tiny_job(example, {"client": LOCAL_HEAD if example == "local_head" else DITTO})
    trials = sweep_elsewhere(tmp_path, job, SWEPT[example])
    assert len(trials) == 2
    key = "local" if example == "local_head" else "personal"
    states = []
    for trial in trials:
        summary = json.loads((trial / "summary.json").read_text())
        assert summary["rounds"] == 2 and summary["algorithm"]["client"] == job["algorithm"][
            "client"]
        states.append(stored(trial))
    some = sorted(set(states[0]) & set(states[1]))[0]
    # the swept value mattered: another head, or another pull toward the global model
    assert not torch.equal(states[0][some][key], states[1][some][key])


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.parametrize("example", ["local_head", "ditto"])
def test_submit_ships_it_to_the_cluster(tmp_path, example):
    algorithm = {"local_head": {"client": LOCAL_HEAD, "local_head": {"prefix": "1.bias"}},
                 "ditto": {"client": DITTO, "ditto": {"lam": 0.5}}}[example]
    out_dir = submit_to_local_head(tmp_path, tiny_job(example, algorithm, workers=1))
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["algorithm"]["client"] == algorithm["client"]
    assert stored(out_dir)  # the clients' state was written on the cluster
