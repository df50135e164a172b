"""Every algorithm through the whole runtime on deterministic full-batch linear-regression
clients (f_i(w) = 1/2 ||X_i w - y_i||^2 / n_i), against an independent NumPy
re-implementation of the paper's formulas written out here, or a closed form.

The runs use the inline backend (runtime.backend=inline: the driver and its workers in this
process), bit-identical to Ray's at the same worker count (tests/runtime/test_inline.py), so each
takes milliseconds; test_one_vs_three_workers keeps one comparison across Ray processes."""

from __future__ import annotations

import functools
import json
import pathlib

import numpy as np
import pytest
from linear_regression import W0, D, linear_model_fn, regression_clients
from tolerance import ULPS_PER_STEP, f32_atol, merge_ulps

import fedray
from fedray.algorithms.elastic import holdout_seed, holdout_split
from fedray.core.sampling import sample_clients
from fedray.state.client_state import ClientStateStore
from fedray.state.run_dir import read_metrics

SEED = 1


def make_clients(num: int = 3, seed: int = 0) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Heterogeneous regression clients: own feature scale, own true weights, own size."""
    return regression_clients([8 + 3 * i for i in range(num)], seed)


CLIENTS = make_clients()


def run_job(tmp_path, name: str, *, rounds: int, clients=CLIENTS, workers: int = 1,
            algorithm: dict, server: dict | None = None, lr: float = 0.1, steps: int = 3,
            per_round: int | None = None, client: dict | None = None,
            test_data=None, extra: dict | None = None, vectorize: str = "off",
            backend: str = "inline") -> tuple[np.ndarray, str]:
    """One run, its final weights and run directory: by default in this process
    (runtime.backend=inline), one worker training its clients one after another. The
    worker count, vectorizing and Ray are varied where they are the subject:
    test_one_vs_three_workers here, tests/kernels/test_vectorized.py and
    tests/runtime/test_session.py."""
    job = {"name": name, "seed": SEED, "rounds": rounds, "model": {"loss": "mse"},
           "algorithm": algorithm, "server": server or {},
           "client": {"lr": lr, "batch_size": 64, "local_steps": steps, **(client or {})},
           "sampling": {"clients_per_round": per_round or len(clients)},
           "runtime": {"backend": backend, "num_workers": workers,
                       "worker": {"num_cpus": 0.5, "vectorize": vectorize}},
           "eval": {"central": test_data is not None},
           "output": {"dir": str(tmp_path / name)}, **(extra or {})}
    res = fedray.run(job, model_fn=linear_model_fn(), client_data=clients, test_data=test_data)
    return res.weights["weight"].double().numpy().reshape(-1), res.run_dir


# -- the NumPy reference ------------------------------------------------------------------

def data(i, clients=CLIENTS):
    x, y = clients[i]
    return x.astype(np.float64), y.astype(np.float64)


def grad(i, w, clients=CLIENTS):
    x, y = data(i, clients)
    return x.T @ (x @ w - y) / len(y)


def risk(i, w):
    x, y = data(i)
    return 0.5 * np.mean((x @ w - y) ** 2)


def local(i, x0, steps, lr, corr=0.0, mu=0.0, clients=CLIENTS):
    w = x0.copy()
    for _ in range(steps):
        w = w - lr * (grad(i, w, clients) + corr + mu * (w - x0))
    return w


def sizes(clients=CLIENTS):
    return np.array([len(clients[i][1]) for i in sorted(clients)], dtype=float)


def fedavg_delta(x, steps, lr, mu=0.0, weights=None):
    n = sizes() if weights is None else weights
    deltas = [local(i, x, steps, lr, mu=mu) - x for i in sorted(CLIENTS)]
    return sum(w * d for w, d in zip(n, deltas, strict=True)) / n.sum()


def ref_atol(expected: np.ndarray, rounds: int, steps: int = 3) -> float:
    """The float32 runtime against the float64 reference above: every local step of every
    round rounds differently on the two sides (tolerance.ULPS_PER_STEP), and each round's
    float32 weights once more; ulps of the weights' size (the reference's)."""
    return f32_atol(expected, ulps=ULPS_PER_STEP * (steps + 1) * rounds)


# -- FedAvg, FedProx, server optimizers ---------------------------------------------------

def test_fedavg_and_fedprox(tmp_path):
    x = W0.copy()
    for _ in range(4):
        x = x + fedavg_delta(x, 3, 0.1)
    got, run_dir = run_job(tmp_path, "fedavg", rounds=4, algorithm={"name": "fedavg"},
                           test_data=CLIENTS[0])
    np.testing.assert_allclose(got, x, atol=ref_atol(x, rounds=4))
    last = read_metrics(run_dir)[-1]  # regression: a test loss (the same f_0), no accuracy
    assert last["test_loss"] == pytest.approx(risk(0, x), rel=1e-4)
    assert "test_accuracy" not in last

    x = W0.copy()
    for _ in range(3):
        x = x + fedavg_delta(x, 3, 0.1, mu=0.5)
    got, _ = run_job(tmp_path, "fedprox", rounds=3,
                     algorithm={"name": "fedprox", "fedprox": {"mu": 0.5}})
    np.testing.assert_allclose(got, x, atol=ref_atol(x, rounds=3))


def test_steps_per_epoch_one_is_full_batch(tmp_path):
    """client.steps_per_epoch=1: each client's batch is all its data, so 3 epochs are 3
    full-batch steps whatever client.batch_size says."""
    x = W0.copy()
    for _ in range(2):
        x = x + fedavg_delta(x, 3, 0.1)
    got, _ = run_job(tmp_path, "spe", rounds=2, algorithm={"name": "fedavg"}, steps=None,
                     client={"batch_size": 2, "steps_per_epoch": 1, "local_epochs": 3})
    np.testing.assert_allclose(got, x, atol=ref_atol(x, rounds=2))


def test_server_momentum(tmp_path):
    # momentum 0 is FedAvg bit for bit: tests/algorithms/test_algorithms.py
    beta, eta = 0.7, 0.8
    for name in ("fedavgm", "fednesterov"):
        x, m = W0.copy(), np.zeros(D)
        for _ in range(3):
            d = fedavg_delta(x, 3, 0.05)
            m = beta * m + d
            x = x + eta * (d + beta * m if name == "fednesterov" else m)
        got, _ = run_job(tmp_path, name, rounds=3, algorithm={"name": name},
                         server={"momentum": beta, "lr": eta}, lr=0.05)
        np.testing.assert_allclose(got, x, atol=ref_atol(x, rounds=3))


@pytest.mark.parametrize("name", ["fedadam", "fedyogi", "fedadagrad"])
def test_adaptive_server_two_steps(tmp_path, name):
    eta, b1, b2, tau = 0.05, 0.9, 0.99, 1e-2
    x, m, v = W0.copy(), np.zeros(D), np.full(D, tau ** 2)
    for _ in range(2):  # Reddi et al., Alg. 2, by hand
        d = fedavg_delta(x, 3, 0.1)
        m = b1 * m + (1 - b1) * d
        if name == "fedadam":
            v = b2 * v + (1 - b2) * d * d
        elif name == "fedyogi":
            v = v - (1 - b2) * d * d * np.sign(v - d * d)
        else:
            v = v + d * d
        x = x + eta * m / (np.sqrt(v) + tau)
    got, _ = run_job(tmp_path, name, rounds=2, algorithm={"name": name},
                     server={"lr": eta, "beta1": b1, "beta2": b2, "tau": tau})
    np.testing.assert_allclose(got, x, atol=ref_atol(x, rounds=2))


# -- SCAFFOLD -----------------------------------------------------------------------------

def scaffold_numpy(rounds, steps, lr, option, server_lr=1.0, clients=CLIENTS,
                   population=None):
    ids = sorted(clients)
    x, c = W0.copy(), np.zeros(D)
    ci = {i: np.zeros(D) for i in ids}
    for _ in range(rounds):
        dys, dcs = [], []
        for i in ids:
            y = local(i, x, steps, lr, corr=c - ci[i], clients=clients)
            new = grad(i, x, clients) if option == 1 else ci[i] - c + (x - y) / (steps * lr)
            dys.append(y - x)
            dcs.append(new - ci[i])
            ci[i] = new
        x = x + server_lr * np.mean(dys, axis=0)
        c = c + np.sum(dcs, axis=0) / (population or len(ids))  # N: the population
    return x


@pytest.mark.parametrize("option", [1, 2])
def test_scaffold_matches_numpy(tmp_path, option):
    got, run_dir = run_job(tmp_path, f"scaffold{option}", rounds=4, lr=0.05,
                           algorithm={"name": "scaffold", "scaffold": {"option": option}})
    expected = scaffold_numpy(4, 3, 0.05, option)
    np.testing.assert_allclose(got, expected, atol=ref_atol(expected, rounds=4))
    assert ClientStateStore(f"{run_dir}/client_state").clients() == [0, 1, 2]


def test_scaffold_with_zero_control_variates_is_fedavg(tmp_path):
    """Round 1 starts from c = c_i = 0: SCAFFOLD's step is FedAvg's (uniform mean)."""
    scaf, _ = run_job(tmp_path, "s", rounds=1, algorithm={"name": "scaffold"})
    avg, _ = run_job(tmp_path, "a", rounds=1,
                     algorithm={"name": "fedavg", "aggregator": "uniform"})
    # bit for bit: the same kernels on the same data, SCAFFOLD's gradients plus a correction
    # c - c_i of exact zeros (g + 0 == g in any rounding), summed with weight 1 in the same order
    np.testing.assert_array_equal(scaf, avg)
    expected = W0 + fedavg_delta(W0, 3, 0.1, weights=np.ones(3))
    np.testing.assert_allclose(avg, expected, atol=ref_atol(expected, rounds=1))


def test_scaffold_reaches_the_global_optimum_where_fedavg_drifts(tmp_path):
    """Heterogeneous quadratics, full participation, K = 10: the fixed point of SCAFFOLD
    is argmin (1/N) sum f_i (closed form); FedAvg's is not."""
    a = sum(data(i)[0].T @ data(i)[0] / len(data(i)[1]) for i in CLIENTS)
    b = sum(data(i)[0].T @ data(i)[1] / len(data(i)[1]) for i in CLIENTS)
    optimum = np.linalg.solve(a, b)
    common = {"rounds": 60, "lr": 0.05, "steps": 10}
    scaf, _ = run_job(tmp_path, "scaffold", algorithm={"name": "scaffold"}, **common)
    avg, _ = run_job(tmp_path, "fedavg", algorithm={"name": "fedavg", "aggregator": "uniform"},
                     **common)
    assert np.linalg.norm(scaf - optimum) < 1e-3
    assert np.linalg.norm(avg - optimum) > 0.05


# -- Elastic aggregation ------------------------------------------------------------------

def test_elastic_by_hand(tmp_path):
    """Chen et al. Alg. 1 (FedAvgM backbone) on a 3-parameter model, two rounds: B_k drawn
    once from (seed, client id) and left out of D_k in both rounds (seed 000 lines 94-95),
    the damped momentum m <- beta m + (1 - beta) Delta (line 130), and the boosted share
    (zeta > 1) in each round's metrics."""
    tau, mu, share, beta, lr = 0.4, 0.9, 0.3, 0.5, 2.0
    x, m = W0.copy(), np.zeros(D)
    splits = {i: [t.numpy() for t in holdout_split(len(CLIENTS[i][1]), share,
                                                   holdout_seed(SEED, i))] for i in CLIENTS}
    boosted = []
    for _ in (1, 2):
        deltas, omegas, weights = [], [], []
        for i in sorted(CLIENTS):
            xi, yi = data(i)
            held, keep = splits[i]
            xh = xi[held]  # one batch: d ||w.x||^2 / dw = 2 (w.x) x, batch-averaged
            omegas.append((1 - mu) * np.abs((2 * (xh @ x)[:, None] * xh).mean(0)))
            sub = {0: (xi[keep], yi[keep])}
            deltas.append(local(0, x, 3, 0.1, clients=sub) - x)
            weights.append(len(keep))
        w = np.array(weights, dtype=float) / sum(weights)
        omega = sum(wk * o for wk, o in zip(w, omegas, strict=True))
        zeta = 1 + tau - omega / omega.max()
        assert zeta.min() == pytest.approx(tau) and (zeta <= 1 + tau).all()
        boosted.append(float((zeta > 1).mean()))
        update = zeta * sum(wk * d for wk, d in zip(w, deltas, strict=True))
        m = beta * m + (1 - beta) * update
        x = x + lr * m
    got, run_dir = run_job(tmp_path, "elastic", rounds=2,
                           algorithm={"name": "elastic_fedavgm",
                                      "elastic": {"tau": tau, "mu": mu, "holdout": share}},
                           server={"momentum": beta, "dampening": beta, "lr": lr})
    np.testing.assert_allclose(got, x, atol=ref_atol(x, rounds=2))
    # a share of 3 parameters: k / 3 exactly, unless an Omega_i / max sits on tau itself
    assert [r["elastic_boosted_share"] for r in read_metrics(run_dir)] == boosted


# -- Exp-alpha ----------------------------------------------------------------------------

def expalpha_numpy(rounds, alpha):
    x = W0.copy()
    for _ in range(rounds):
        ys = [local(i, x, 3, 0.1) for i in sorted(CLIENTS)]
        s = np.array([(risk(i, y) - risk(i, x)) / alpha for i, y in zip(sorted(CLIENTS), ys,
                                                                        strict=True)])
        rho = np.exp(s - s.max())
        rho /= rho.sum()
        x = x + sum(r * (y - x) for r, y in zip(rho, ys, strict=True))
    return x


def test_expalpha_by_hand_and_its_limits(tmp_path):
    # exp(score / alpha) amplifies a risk's rounding by 1 / alpha, but these clients' scores
    # differ by tens (risks of about 10, alpha = 0.2): the softmax puts all the weight on one
    # client, whose rho moves far less than an ulp, so the steps' rounding is all there is
    expected = expalpha_numpy(2, 0.2)
    got, _ = run_job(tmp_path, "exp", rounds=2, algorithm={"name": "expalpha", "alpha": 0.2})
    np.testing.assert_allclose(got, expected, atol=ref_atol(expected, rounds=2))
    # alpha -> infinity: uniform weights. The clients train alike; the weights rho_k differ
    # from 1 by ~1e-11, far below float32's resolution, but the float64 mean they weight is
    # another computation than the uniform one: a last bit may flip in a round
    big, _ = run_job(tmp_path, "big", rounds=2, algorithm={"name": "expalpha", "alpha": 1e12})
    uni, _ = run_job(tmp_path, "uni", rounds=2,
                     algorithm={"name": "fedavg", "aggregator": "uniform"})
    np.testing.assert_allclose(big, uni, rtol=0, atol=f32_atol(uni, ulps=merge_ulps(2)))
    # a tiny alpha: scores of order 1e4 do not overflow; the weight goes to one client
    expected = expalpha_numpy(2, 1e-4)
    tiny, _ = run_job(tmp_path, "tiny", rounds=2, algorithm={"name": "expalpha", "alpha": 1e-4})
    assert np.isfinite(tiny).all()
    np.testing.assert_allclose(tiny, expected, atol=ref_atol(expected, rounds=2))


# -- partial sums: the worker count never changes the update --------------------------------

# FedAvg's partial sums across 1, 2 and 4 workers: tests/runtime/test_session.py; here the
# aggregators that carry more than a weighted sum (client state, extra sums, log-scales).
# SCAFFOLD's three workers are Ray's, three processes writing and reading one client state
# store; the others' are inline (the same merge, bit for bit: tests/runtime/test_inline.py)
@pytest.mark.parametrize("algorithm, backend", [
    ({"name": "scaffold"}, "ray"), ({"name": "elastic_fedprox"}, "inline"),
    ({"name": "expalpha"}, "inline")], ids=["scaffold-ray", "elastic_fedprox", "expalpha"])
def test_one_vs_three_workers(request, tmp_path, algorithm, backend):
    if backend == "ray":
        request.getfixturevalue("ray_cluster")
    clients = make_clients(9, seed=5)
    rounds, steps = 3, 3
    run = functools.partial(run_job, tmp_path, rounds=rounds, steps=steps, clients=clients,
                            algorithm=algorithm, per_round=6)
    one, _ = run("w1", workers=1)
    three, _ = run("w3", workers=3, backend=backend)
    assert np.abs(one - W0).max() > 1e-3  # the model moved
    # the worker count: both sequential, so every client's float32 arithmetic is the same;
    # only the driver's float64 merge of the workers' partial sums is grouped otherwise
    np.testing.assert_allclose(three, one, rtol=0, atol=f32_atol(one, ulps=merge_ulps(rounds)))

    # vectorized workers (auto: this linear model vectorizes) at another worker count: the
    # batched products round otherwise than sequential training's, at every local step of
    # every round. Two clients (lr * lambda_max 2.5 and 3.0) diverge, and the weights (up to
    # 60) grow with the rounding errors: relative to the weights these add up, step by step
    vec, vec_dir = run("v3", workers=3, vectorize="auto")
    assert json.loads(pathlib.Path(vec_dir, "summary.json").read_text())["vectorized"]
    np.testing.assert_allclose(vec, one, rtol=0,
                               atol=f32_atol(one, ulps=ULPS_PER_STEP * (steps + 1) * rounds))


def test_scaffold_state_only_for_participants(tmp_path):
    clients = make_clients(30, seed=2)
    _, run_dir = run_job(tmp_path, "part", rounds=3, clients=clients,
                         algorithm={"name": "scaffold"}, per_round=4)
    took_part = set()
    for r in (1, 2, 3):
        took_part.update(int(c) for c in sample_clients(SEED, r, 30, 4))
    assert ClientStateStore(f"{run_dir}/client_state").clients() == sorted(took_part)


# -- the guard: non-finite or oversized client updates never reach the model ---------------

def test_guard_drops_a_nonfinite_client(tmp_path):
    """A client whose update has a NaN is left out of every sum, and of the client state,
    but stays in the population (SCAFFOLD's c averages over all N clients)."""
    x, y = make_clients(4)[3]
    poisoned = {**CLIENTS, 3: (x, np.where(np.arange(len(y)) == 0, np.nan, y).astype(np.float32))}
    for name in ("fedavg", "scaffold"):
        w, run_dir = run_job(tmp_path, name, rounds=3, clients=poisoned, algorithm={"name": name})
        if name == "fedavg":  # the same clients' float32 updates, summed in another order
            expected, _ = run_job(tmp_path, "without", rounds=3, algorithm={"name": name})
            atol = f32_atol(expected, ulps=merge_ulps(3))
        else:
            expected = scaffold_numpy(3, 3, 0.1, option=2, population=4)
            atol = ref_atol(expected, rounds=3)
            assert ClientStateStore(f"{run_dir}/client_state").clients() == [0, 1, 2]
        assert np.isfinite(w).all()
        np.testing.assert_allclose(w, expected, rtol=0, atol=atol)
        assert [m["dropped_updates"] for m in read_metrics(run_dir)] == [1, 1, 1]
        assert all(np.isfinite(m["train_loss"]) for m in read_metrics(run_dir))
        summary = json.loads(pathlib.Path(run_dir, "summary.json").read_text())
        assert summary["dropped_updates"] == 3


def test_guard_norm_bound(tmp_path):
    def run(name: str, bound: float | None) -> tuple[np.ndarray, list[int]]:
        w, run_dir = run_job(tmp_path, name, rounds=2, algorithm={"name": "fedavgm"},
                             server={"momentum": 0.9},
                             extra={"guard": {"max_update_norm": bound}})
        return w, [m["dropped_updates"] for m in read_metrics(run_dir)]

    free, free_dropped = run("free", None)
    tight, tight_dropped = run("tight", 1e-6)
    loose, loose_dropped = run("loose", 1e6)
    assert not np.allclose(free, W0) and free_dropped == [0, 0]
    assert np.array_equal(tight, W0.astype(np.float32)) and tight_dropped == [3, 3]
    assert np.array_equal(loose, free) and loose_dropped == [0, 0]


def test_dropout_and_over_selection_through_the_runtime(tmp_path):
    """The round's survivors train; the result does not depend on the number of workers."""
    clients = make_clients(12, seed=3)
    extra = {"sampling": {"clients_per_round": 4, "dropout": 0.3, "over_selection": 0.5}}
    runs = [run_job(tmp_path, f"drop{n}", rounds=4, clients=clients, workers=n,
                    algorithm={"name": "fedavg"}, extra=extra) for n in (1, 3)]
    # both sequential: the same float32 client updates, merged in float64 in another grouping
    np.testing.assert_allclose(runs[1][0], runs[0][0], rtol=0,
                               atol=f32_atol(runs[0][0], ulps=merge_ulps(4)))
    metrics = read_metrics(runs[0][1])
    assert all(m["clients"] + m["dropped_out"] + m["late"] == 6 for m in metrics)
    assert all(m["clients"] <= 4 for m in metrics)
    assert sum(m["dropped_out"] for m in metrics) > 0 and sum(m["late"] for m in metrics) > 0


@pytest.mark.parametrize("option", [1, 2])
def test_scaffold_client_control_variate_by_hand(option):
    """ScaffoldClient.finish on its own: option I measures c_i+ as the full gradient at the
    global model with dropout masks from (client seed, TAG_CONTROL) -- a model with dropout,
    so the stream matters; option II is c_i - c + (x - y_i) / (K lr). dc = c_i+ - c_i."""
    import torch
    from torch import nn

    from fedray.algorithms.base import ClientContext, LocalUpdate, WorkerEnv
    from fedray.algorithms.reduction import PartialSum
    from fedray.algorithms.scaffold import ScaffoldClient, ScaffoldParams
    from fedray.core.flat_model import FlatModel
    from fedray.core.seeding import TAG_CONTROL, derive_seed
    from fedray.kernels.sequential import full_gradient

    torch.manual_seed(0)
    model = FlatModel(nn.Sequential(nn.Linear(4, 6), nn.Dropout(0.5), nn.Linear(6, 3)))
    n, w = model.num_params, model.flat.clone()
    x, y = torch.randn(9, 4), torch.randint(0, 3, (9,))
    c, ci = torch.randn(n), torch.randn(n)
    env = WorkerEnv(model=model, device=torch.device("cpu"), lr=0.25, loss="cross_entropy",
                    eval_batch_size=9, batch_size_for=lambda m: 4, global_weights=w,
                    broadcast={"c": c})
    part = ScaffoldClient(ScaffoldParams(option=option))
    part.setup(env)
    ctx = ClientContext(cid=2, round=3, seed=12345, x=x, y=y, batch_size=4,
                        state={"c": ci.clone()})
    assert torch.equal(part.terms(env, ctx).linear, c - ci)
    delta = torch.randn(n)
    update = LocalUpdate(delta=delta, num_examples=9, loss_sum=0.0, examples_seen=12, steps=3)
    acc = PartialSum(n, extras={"dc": n})
    new = part.finish(env, ctx, update, acc)["c"].clone()
    if option == 1:
        want = full_gradient(model, w, x, y, batch_size=4, out=torch.empty(n),
                             seed=derive_seed(12345, TAG_CONTROL), loss="cross_entropy")
        other = full_gradient(model, w, x, y, batch_size=4, out=torch.empty(n),
                              seed=derive_seed(TAG_CONTROL, 12345), loss="cross_entropy")
        assert not torch.allclose(want, other)  # the seed reaches the dropout masks
    else:
        want = ci - c - delta / (3 * 0.25)
    torch.testing.assert_close(new, want)
    torch.testing.assert_close(acc.extras["dc"].float(), new - ci)
    assert torch.equal(part.terms(env, ClientContext(cid=5, round=3, seed=1, x=x, y=y,
                                                     batch_size=4)).linear, c)  # c_i = 0


def test_scaffold_option_must_be_1_or_2():
    """The check names the key and the rule: an option other than 1 or 2 would silently
    run option II's update (finish only tests for 1)."""
    from fedray.algorithms.base import ParamError
    from fedray.algorithms.scaffold import ScaffoldClient, ScaffoldParams

    for option in (0, 3, -1):
        with pytest.raises(ParamError, match=r"^option: must be 1 or 2, got") as e:
            ScaffoldClient(ScaffoldParams(option=option))
        assert (e.value.key, e.value.value) == ("option", option)
    for option in (1, 2):
        assert ScaffoldClient(ScaffoldParams(option=option)).params.option == option


def test_scaffold_server_step_by_hand():
    """ScaffoldAggregator on its own, with as many parameters (5) as clients in no test
    above (the population, 7): c starts at 0 of the model's size, c += sum(dc) / N -- N the
    population, not the round's clients -- and the model step is the unweighted mean."""
    import torch

    from fedray.algorithms.base import LocalUpdate
    from fedray.algorithms.reduction import PartialSum
    from fedray.algorithms.scaffold import ScaffoldAggregator

    agg = ScaffoldAggregator()
    agg.init_server(5, 7)
    assert agg.population == 7 and torch.equal(agg.broadcast()["c"], torch.zeros(5))
    assert agg.broadcast()["c"].dtype == torch.float32
    deltas = [torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]), torch.tensor([3.0, 0.0, -1.0, 2.0, 1.0])]
    dcs = [torch.tensor([7.0, -14.0, 0.0, 3.5, 1.0]), torch.tensor([0.0, 7.0, 7.0, 0.0, 2.5])]
    for step in (1, 2):
        acc = PartialSum(5, extras={"dc": 5})
        for i, (d, dc) in enumerate(zip(deltas, dcs, strict=True)):
            assert agg.weight(LocalUpdate(delta=d, num_examples=3 + 10 * i, loss_sum=0.0,
                                          examples_seen=3, steps=1)) == 1.0
            acc.add(d, 1.0)
            acc.add_extra("dc", dc)
        torch.testing.assert_close(agg.finish(acc), (deltas[0] + deltas[1]).double() / 2)
        torch.testing.assert_close(agg.broadcast()["c"], step * (dcs[0] + dcs[1]) / 7)
