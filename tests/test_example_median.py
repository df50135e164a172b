"""examples/median.py, a user's aggregator over individual client updates
(``Aggregator.individual``) and a user's attack stage, run by import path like a built-in
part: its numbers (a coordinate-wise median against NumPy in float64), resume and worker
counts bit for bit, a sweep, ``fedray submit``; and what the runtime refuses before round 1
for such an aggregator (the memory budget, sums-only combinations, no ``aggregate``).

The CLI, sweep and submit tests follow tests/test_examples.py (q-FedAvg's) and use the
helpers it shares with the other examples' tests (tests/example_runs.py)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import yaml
from example_runs import (
    importable,  # noqa: F401 -- a fixture
    submit_to_local_head,
    sweep_elsewhere,
    tiny_job,
    trial_weights,
)
from linear_regression import W0, D, linear_model_fn, regression_clients
from tolerance import ULPS_PER_STEP, f32_atol, merge_ulps

import fedray
from fedray.algorithms.base import (
    Aggregator,
    ClientRows,
    ClientWork,
    PartialSum,
    RoundPlan,
    UpdateStage,
)
from fedray.core.sampling import select_round
from fedray.errors import ConfigError, FedrayError
from fedray.runtime.driver import POISSON_TAIL, most_clients
from fedray.state.run_dir import load_weights, read_metrics

MEDIAN, SIGNFLIP = "examples.median:Median", "examples.median:SignFlip"
HERE = "test_example_median"  # this module, importable as the tests' directory is
pytestmark = pytest.mark.usefixtures("importable")  # examples.median from the repository


# -- the median itself ---------------------------------------------------------------------

@pytest.mark.parametrize("k", [1, 2, 5, 6])
def test_median_is_numpys_float64_median_bit_for_bit(k):
    """Each value is one float32 row's, or the float64 mean of two, which float64 holds
    exactly: NumPy's float64 median of the same rows is the same number. A chunk of 3
    columns makes the sort run over several slices of the rows, the last one short."""
    from examples.median import Median

    g = np.random.default_rng(k)
    rows = g.normal(size=(k, 11)).astype(np.float32)
    rows[:, 4] = 1.5  # ties
    agg = Median()
    agg.chunk_values = 3 * k
    got = agg.aggregate(torch.from_numpy(rows), _rows(k), PartialSum(11))
    assert got.dtype == torch.float64
    np.testing.assert_array_equal(got.numpy(), np.median(rows.astype(np.float64), axis=0))


def _rows(k: int) -> ClientRows:
    return ClientRows(torch.arange(k), torch.ones(k, dtype=torch.int64),
                      torch.zeros(k, dtype=torch.float64))


# -- the numbers: deterministic full-batch linear regression ------------------------------

LR, STEPS, SCALE, FRACTION, SEED = 0.1, 3, 4.0, 0.2, 3
CLIENTS = regression_clients([8, 11, 14, 9, 12, 10, 13], scale_step=0.2)


def _linear_job(tmp_path, name: str, algorithm: dict, rounds: int, **runtime) -> dict:
    """Full participation, K full-batch steps (batch 64 > every client's size), MSE."""
    return {"name": name, "seed": SEED, "rounds": rounds, "model": {"loss": "mse"},
            "algorithm": algorithm, "client": {"lr": LR, "batch_size": 64, "local_steps": STEPS},
            "sampling": {"clients_per_round": len(CLIENTS)},
            "runtime": {"num_workers": 1, "backend": "inline",
                        "worker": {"num_cpus": 1, "vectorize": "off"}} | runtime,
            "eval": {"central": False}, "output": {"dir": str(tmp_path / name)}}


def _run_linear(tmp_path, name: str, algorithm: dict, rounds: int, **runtime) -> np.ndarray:
    res = fedray.run(_linear_job(tmp_path, name, algorithm, rounds, **runtime),
                     model_fn=linear_model_fn(), client_data=CLIENTS)
    return res.weights["weight"].double().numpy().reshape(-1)


def median_numpy(rounds: int, median: bool = True) -> tuple[np.ndarray, float]:
    """Yin et al.'s coordinate-wise median in float64: every client trains K full-batch GD
    steps from w, the sign-flip clients send -SCALE d_k, w <- w + median_k d_k (the mean of
    the two middle values for an even count; ``median=False``: the plain mean). Also the
    largest |value| it met (the tolerance's scale)."""
    from examples.median import malicious

    w, biggest = W0.copy(), float(np.abs(W0).max())
    for _ in range(rounds):
        deltas = []
        for cid, (x, y) in CLIENTS.items():
            x, y = x.astype(np.float64), y.astype(np.float64)
            local = w.copy()
            for _ in range(STEPS):
                local = local - LR * x.T @ (x @ local - y) / len(y)
            d = local - w
            deltas.append(-SCALE * d if malicious(SEED, cid, FRACTION) else d)
            biggest = max(biggest, float(np.abs(local).max()), float(np.abs(deltas[-1]).max()))
        w = w + (np.median(deltas, axis=0) if median else np.mean(deltas, axis=0))
    return w, biggest


def test_median_under_attack_matches_numpy(tmp_path):
    from examples.median import malicious

    rounds = 3
    flipped = [c for c in CLIENTS if malicious(SEED, c, FRACTION)]
    assert 0 < len(flipped) < len(CLIENTS) / 2  # attacked, and the median can resist
    expected, biggest = median_numpy(rounds)
    got = _run_linear(tmp_path, "med", {"aggregator": MEDIAN, "stages": [SIGNFLIP],
                                        "signflip": {"fraction": FRACTION, "scale": SCALE}},
                      rounds)
    # how far the median is from the attacked mean: the comparison could not miss it
    assert np.abs(expected - median_numpy(rounds, median=False)[0]).max() > 1e-2
    # float32 training against float64: each local step rounds differently on the two sides
    # (ULPS_PER_STEP a step, one more for the delta), scaled by SCALE for a flipped update,
    # one more for the flip; the median selects values, so its error is its rows' (it is
    # 1-Lipschitz per coordinate), and the server's float32 add rounds once more.
    per_round = SCALE * ULPS_PER_STEP * (STEPS + 1) + 2
    np.testing.assert_allclose(got, expected, rtol=0,
                               atol=f32_atol(biggest, ulps=per_round * rounds))
    assert np.abs(got - W0).max() > 1e-2  # the model moved


# -- what the aggregator is given --------------------------------------------------------

class Recorder(Aggregator):
    """The plain mean of the rows, keeping what it was given (inline: the driver's object)."""

    individual = True
    seen: list = []  # noqa: RUF012

    def aggregate(self, updates, clients, acc):
        Recorder.seen.append((updates.clone(), clients, {k: v.clone() for k, v in
                                                         acc.extras.items()}))
        total = torch.zeros(updates.shape[1], dtype=torch.float64)
        for row in updates:
            total.add_(row)
        return total / len(updates)


class Counted(ClientWork):
    """Adds 1 and its client's id to two extra sums: they reach aggregate's ``acc``."""

    extras = {"count": 1, "ids": 1}  # noqa: RUF012

    def finish(self, env, ctx, update, acc):
        acc.add_extra("count", torch.ones(1))
        acc.add_extra("ids", torch.tensor([float(ctx.cid)]))


def test_rows_come_in_the_sampled_order_with_ids_sizes_losses_and_extras(tmp_path):
    """Two workers, 5 of 7 clients a round: the rows are the round's sampled clients in the
    driver's order (not the workers'), each with its example count and a finite mean
    training loss; the client part's extras are summed as ever; and the mean of the rows
    is the built-in uniform mean up to float64 rounding (its sums run in another order)."""
    Recorder.seen = []
    job = _linear_job(tmp_path, "rec", {"aggregator": f"{HERE}:Recorder",
                                        "client": f"{HERE}:Counted"}, 2, num_workers=2)
    job["sampling"]["clients_per_round"] = 5
    got = fedray.run(job, model_fn=linear_model_fn(), client_data=CLIENTS)
    uniform = _linear_job(tmp_path, "uni", {"aggregator": "uniform"}, 2, num_workers=2)
    uniform["sampling"]["clients_per_round"] = 5
    ref = fedray.run(uniform, model_fn=linear_model_fn(), client_data=CLIENTS)
    assert len(Recorder.seen) == 2
    sizes = {c: len(y) for c, (_, y) in CLIENTS.items()}
    for r, (updates, clients, extras) in enumerate(Recorder.seen, start=1):
        sampled = select_round(SEED, r, len(CLIENTS), 5, sizes=lambda ids: np.array(
            [sizes[int(c)] for c in ids])).participants
        assert clients.ids.tolist() == [int(c) for c in sampled]
        assert updates.shape == (5, D) and updates.dtype == torch.float32
        assert clients.num_examples.tolist() == [sizes[int(c)] for c in sampled]
        assert clients.losses.dtype == torch.float64
        assert torch.isfinite(clients.losses).all() and (clients.losses > 0).all()
        assert extras["count"].item() == 5 and extras["ids"].item() == sum(sampled)
    # the same float32 updates, summed in float64 in another order: merge_ulps apart
    want = ref.weights["weight"].numpy()
    np.testing.assert_allclose(got.weights["weight"].numpy(), want, rtol=0,
                               atol=f32_atol(want, ulps=merge_ulps(2)))
    assert np.abs(want.reshape(-1) - W0).max() > 1e-2


def test_a_round_whose_updates_are_all_dropped_leaves_the_model(tmp_path):
    """guard.max_update_norm below every update: no row reaches the driver, and the round
    is one without examples, as with a partial sum: the model stays as it was."""
    job = _linear_job(tmp_path, "drop", {"aggregator": MEDIAN}, 2)
    job["guard"] = {"max_update_norm": 1e-9}
    res = fedray.run(job, model_fn=linear_model_fn(), client_data=CLIENTS)
    np.testing.assert_array_equal(res.weights["weight"].double().numpy().reshape(-1),
                                  W0.astype(np.float32))
    assert [m["dropped_updates"] for m in read_metrics(res.run_dir)] == [7, 7]


# -- refused before round 1 --------------------------------------------------------------

def _refused(tmp_path, algorithm: dict, **over) -> str:
    job = _linear_job(tmp_path, "no", algorithm, 1)
    for key, value in over.items():
        section, name = key.split("__")
        job.setdefault(section, {})[name] = value
    with pytest.raises(FedrayError) as err:
        fedray.run(job, model_fn=linear_model_fn(), client_data=CLIENTS)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "no" / "metrics.jsonl").exists()
    return str(err.value)


def test_the_memory_budget_refuses_a_job_before_round_1(tmp_path):
    # 7 clients x 3 float32 = 84 bytes = 8.0e-05 MiB
    msg = _refused(tmp_path, {"aggregator": MEDIAN}, runtime__individual_updates_mb=5e-5)
    assert msg == ("config key 'runtime.individual_updates_mb': aggregator " + MEDIAN +
                   " needs every client's update: 7 x 3 float32 = 8e-05 MB > 5e-05 MB; raise "
                   "it or sample fewer clients")
    _run_linear(tmp_path, "fits", {"aggregator": MEDIAN}, 1, individual_updates_mb=9e-5)
    # a partial-sum aggregator never needs it
    _run_linear(tmp_path, "sum", {"aggregator": "uniform"}, 1, individual_updates_mb=1e-9)
    with pytest.raises(ConfigError, match=r"config key 'runtime.individual_updates_mb': "
                                          r"must be > 0, got 0"):
        _run_linear(tmp_path, "zero", {"aggregator": MEDIAN}, 1, individual_updates_mb=0)


def _binomial_tail(n: int, q: float, above: int) -> float:
    """P(Binomial(n, q) > above), summed over the 5000 counts past it (the rest is nil)."""
    j = np.arange(above + 1, min(n, above + 5000) + 1)
    logpmf = (np.array([math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                        for i in j]) + j * math.log(q) + (n - j) * math.log1p(-q))
    return float(np.exp(logpmf).sum())


@pytest.mark.parametrize("population, k", [(1000, 100), (10**6, 100), (10**5, 5), (300, 280)])
def test_most_clients_bounds_a_poisson_round(population, k):
    plan = RoundPlan(seed=0, population=population, clients_per_round=k, sampling="poisson",
                     rounds=1, num_params=1)
    bound = most_clients(plan)
    assert k < bound <= population
    if bound < population:
        assert _binomial_tail(population, k / population, bound) < POISSON_TAIL
        # and not much looser than needed: the exact tail 8 sigma below it is far larger
        assert _binomial_tail(population, k / population,
                              bound - int(2 * math.sqrt(k)) - 3) > POISSON_TAIL
    fixed = RoundPlan(seed=0, population=population, clients_per_round=k, sampling="fixed",
                      rounds=1, num_params=1)
    assert most_clients(fixed) == k


class SumNoise(UpdateStage):
    """A stage that changes the round's sum, as central DP's noise does."""

    name = "sumnoise"

    def finish_sum(self, acc, round_idx):
        acc.total.add_(1.0)


class NoAggregate(Aggregator):
    individual = True


class WrongLength(Aggregator):
    individual = True

    def aggregate(self, updates, clients, acc):
        return updates.double().median(dim=0).values[:-1]


def test_a_wrong_length_result_names_the_aggregator(tmp_path):
    with pytest.raises(FedrayError, match=rf"aggregator {HERE}:WrongLength.*: aggregate\(\) "
                                          r"returned .*must be a flat float tensor of 3 "):
        _run_linear(tmp_path, "wrong", {"aggregator": f"{HERE}:WrongLength"}, 1)


def test_what_works_on_sums_only_is_refused(tmp_path):
    msg = _refused(tmp_path, {"aggregator": MEDIAN}, runtime__reduce={"group_size": 2})
    assert msg.startswith("config key 'runtime.reduce.group_size': aggregator "
                          f"{MEDIAN} needs every client's update, which a reduction tree's")
    msg = _refused(tmp_path, {"aggregator": MEDIAN, "stages": [f"{HERE}:SumNoise"]})
    assert msg == ("config key 'algorithm.stages': the update stage sumnoise works on the "
                   f"round's sum (finish_sum), which aggregator {MEDIAN} does not make (it "
                   f"needs every client's update): use one of them, got ['{HERE}:SumNoise']")
    msg = _refused(tmp_path, {"aggregator": MEDIAN, "stages": ["secagg"]})
    assert "the update stage secagg works on the round's sum (merge, close, finish_sum)" in msg
    msg = _refused(tmp_path, {"aggregator": f"{HERE}:NoAggregate"})
    assert msg == (f"config key 'algorithm.aggregator': aggregator {HERE}:NoAggregate sets "
                   "individual (it needs every client's update) but defines no aggregate(), "
                   f"got '{HERE}:NoAggregate'")


# -- worker counts (Ray) and resume (the CLI) --------------------------------------------

def _tiny(tmp_path, name: str, workers: int, backend: str = "ray") -> dict:
    return {"name": name, "seed": 5, "rounds": 3,
            "data": {"synthetic": {"num_clients": 40, "min_examples": 10, "max_examples": 30,
                                   "test_writers": 20}},
            "model": {"name": "logreg"}, "client": {"lr": 0.05, "batch_size": 8},
            "sampling": {"clients_per_round": 9}, "eval": {"every": 0},
            "algorithm": {"aggregator": MEDIAN, "stages": [SIGNFLIP]},
            "runtime": {"num_workers": workers, "backend": backend,
                        "worker": {"num_cpus": 0.5, "vectorize": "off"}},
            "output": {"dir": str(tmp_path / name), "tensorboard": False}}


def test_one_and_three_ray_workers_give_the_same_bits(ray_cluster, tmp_path):
    """The driver orders the rows as the round sampled its clients, whichever worker
    trained them: the median's input, and so the weights, do not depend on the split."""
    one = fedray.run(_tiny(tmp_path, "one", 1))
    three = fedray.run(_tiny(tmp_path, "three", 3))
    assert len(three.summary["workers"]) == 3
    assert one.weights.keys() == three.weights.keys()
    assert all(torch.equal(one.weights[k], three.weights[k]) for k in one.weights)
    start = fedray.run(_tiny(tmp_path, "zero", 1, "inline") | {"rounds": 1}).weights
    assert not all(torch.equal(one.weights[k], start[k]) for k in start)  # it trained


def test_the_cli_resumes_it_bit_for_bit(tmp_path):
    """`fedray run` for 2 rounds, then `--resume` to 4: the weights of a straight 4-round
    run, bit for bit; config.yaml records the import paths."""
    from fedray.cli import main

    job = _tiny(tmp_path, "run", 2, "inline")
    job["rounds"] = 2
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    assert main(["run", str(tmp_path / "job.yaml"), "--quiet"]) == 0
    run_dir = tmp_path / "run"
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert cfg["algorithm"]["aggregator"] == MEDIAN
    assert cfg["algorithm"]["stages"] == [SIGNFLIP]
    assert cfg["algorithm"]["signflip"] == {"fraction": 0.2, "scale": 4.0}
    two = load_weights(str(run_dir))
    assert main(["run", "--resume", str(run_dir), "rounds=4", "--allow-change", "rounds",
                 "--quiet"]) == 0
    assert [m["round"] for m in read_metrics(str(run_dir))] == [1, 2, 3, 4]
    straight = fedray.run(job | {"rounds": 4, "output": {"dir": str(tmp_path / "straight"),
                                                         "tensorboard": False}})
    resumed = load_weights(str(run_dir))
    assert all(torch.equal(resumed[k], straight.weights[k]) for k in resumed)
    assert not all(torch.equal(resumed[k], two[k]) for k in resumed)  # rounds 3-4 moved it


# -- a sweep and `fedray submit` ---------------------------------------------------------

def _job(**over) -> dict:
    return tiny_job("median", {"aggregator": MEDIAN, "stages": [SIGNFLIP]}) | over


def test_a_sweep_ships_it_to_its_trials(tmp_path):
    """`fedray sweep` over the attackers' fraction, run from a directory without the
    examples: the trials import examples.median because the sweep ships its files."""
    trials = sweep_elsewhere(tmp_path, _job(), {"algorithm.signflip.fraction": [0.0, 0.4]})
    assert len(trials) == 2
    finals = trial_weights(trials, 2, MEDIAN)
    assert not all(torch.equal(finals[0][k], finals[1][k]) for k in finals[0])  # it mattered


@pytest.mark.cluster
@pytest.mark.slow
def test_submit_ships_it_to_the_cluster(tmp_path):
    """`fedray submit` from the repository root to a local test head: the job's working
    directory holds only job.yaml, so it imports examples.median only because submit ships
    the user's package."""
    job = _job(runtime={"num_workers": 1, "worker": {"num_cpus": 1, "vectorize": "off"}})
    job["algorithm"]["signflip"] = {"fraction": 0.4}
    out_dir = submit_to_local_head(tmp_path, job)
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["rounds"] == 2 and summary["algorithm"]["aggregator"] == MEDIAN
    cfg = yaml.safe_load((out_dir / "config.yaml").read_text())
    assert cfg["algorithm"]["stages"] == [SIGNFLIP]
    assert cfg["algorithm"]["signflip"]["fraction"] == 0.4
