"""examples/qffl.py, a user's algorithm kept outside the package, run by import path exactly
like a built-in one: its numbers (against the paper's formula in NumPy), the CLI (record,
report, resume), a sweep whose trials cannot see the caller's files, and ``fedray submit``.

The user's module is named ``examples.qffl:QFedAvg``: importable from the repository root,
as a module beside a job is from the directory the job is run from."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
import torch
import yaml
from example_runs import (
    REPO,
    cli_run,
    importable,
    submit_to_local_head,
    sweep_elsewhere,
    tiny_job,
    trial_weights,
)
from linear_regression import W0, D, linear_model_fn, regression_clients
from tolerance import ULPS_PER_STEP, f32_atol

import fedray
from fedray.errors import ConfigError
from fedray.state.run_dir import load_weights, read_metrics

QFFL = "examples.qffl:QFedAvg"
__all__ = ["importable"]  # example_runs' fixture, requested by name below


# -- the numbers: deterministic full-batch linear regression ------------------------------

LR, STEPS = 0.1, 3


def make_clients() -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Three heterogeneous regression clients (own scale, own true weights, own size), and
    a fourth whose loss is exactly 0 at every model (all-zero features and targets): q-FFL's
    F_k = 0, where 0^(q-1) has no value for q < 1."""
    out = regression_clients([8, 11, 14])
    out[3] = (np.zeros((5, D), np.float32), np.zeros(5, np.float32))
    return out


CLIENTS = make_clients()


def run_linear(tmp_path, name: str, algorithm: dict, rounds: int) -> np.ndarray:
    """Full participation, one worker training its clients one after another, K full-batch
    steps (batch 64 > every client's size), MSE (f_k = 1/2 ||X_k w - y_k||^2 / n_k)."""
    job = {"name": name, "seed": 1, "rounds": rounds, "model": {"loss": "mse"},
           "algorithm": algorithm, "client": {"lr": LR, "batch_size": 64, "local_steps": STEPS},
           "sampling": {"clients_per_round": len(CLIENTS)},
           "runtime": {"num_workers": 1, "worker": {"num_cpus": 0.5, "vectorize": "off"}},
           "eval": {"central": False}, "output": {"dir": str(tmp_path / name)}}
    res = fedray.run(job, model_fn=linear_model_fn(), client_data=CLIENTS)
    summary = json.loads(pathlib.Path(res.run_dir, "summary.json").read_text())
    assert summary["algorithm"]["aggregator"] == algorithm.get("aggregator", "proportional")
    return res.weights["weight"].double().numpy().reshape(-1)


def qffl_numpy(q: float, lipschitz: float, rounds: int) -> np.ndarray:
    """Li et al. (ICLR 2020), Alg. 2, in float64: every client trains K full-batch GD steps
    from w; dw_k = L (w - y_k), Delta_k = F_k^q dw_k, h_k = q F_k^(q-1) ||dw_k||^2 + L F_k^q,
    w <- w - sum Delta_k / sum h_k. A client with F_k = 0 adds Delta_k = h_k = 0 (the limit)."""
    w = W0.copy()
    for _ in range(rounds):
        num, den = np.zeros(D), 0.0
        for x, y in CLIENTS.values():
            x, y = x.astype(np.float64), y.astype(np.float64)
            risk = 0.5 * np.mean((x @ w - y) ** 2)
            if risk == 0:
                continue
            local = w.copy()
            for _ in range(STEPS):
                local = local - LR * x.T @ (x @ local - y) / len(y)
            dw = lipschitz * (w - local)
            num += risk ** q * dw
            den += q * risk ** (q - 1) * dw @ dw + lipschitz * risk ** q
        w = w - num / den
    return w


def test_qffl_matches_the_paper_by_hand(ray_cluster, importable, tmp_path):
    rounds = 3
    expected = qffl_numpy(0.5, 10.0, rounds)
    got = run_linear(tmp_path, "q05", {"aggregator": QFFL,
                                       "qffl": {"q": 0.5, "lipschitz": 10.0}}, rounds)
    # how far q-FFL's step is from FedAvg's: the comparison below could not miss a lost term
    fedavg_like = qffl_numpy(0.0, 10.0, rounds)
    assert np.abs(expected - fedavg_like).max() > 1e-2
    # The float32 runtime against the float64 reference: each local step rounds differently
    # on the two sides (ULPS_PER_STEP a step, one more for the delta y - x), and so does the
    # risk F_k, a float32 sum of at most 14 squared residuals, each from a 3-term product:
    # at most (14 + 3) eps relative, and F_k enters the step through F_k^q, F_k^(q-1) and h_k.
    # Both are bounded in ulps of the weights' size, per round.
    per_round = ULPS_PER_STEP * (STEPS + 1) + 2 * (14 + 3)
    np.testing.assert_allclose(got, expected, rtol=0,
                               atol=f32_atol(expected, ulps=per_round * rounds))
    assert np.abs(got - W0).max() > 1e-2  # the model moved


@pytest.fixture(scope="module")
def uniform(ray_cluster, tmp_path_factory) -> np.ndarray:
    """Two rounds of the built-in uniform mean (FedAvg's deltas, each of weight 1)."""
    w = run_linear(tmp_path_factory.mktemp("uniform"), "uni", {"aggregator": "uniform"}, 2)
    assert np.abs(w - W0).max() > 1e-2  # the model moved
    return w


def test_q_zero_is_uniform_fedavg_bit_for_bit(uniform, importable, tmp_path):
    """q = 0: F_k^0 = 1 for every client (the F_k = 0 one included) and h_k = L: with L = 1
    each client adds its delta times exactly 1.0 with weight 1.0, as the uniform mean does,
    in the same order -- the same float64 sums."""
    qffl = run_linear(tmp_path, "q0", {"aggregator": QFFL, "qffl": {"q": 0.0}}, 2)
    np.testing.assert_array_equal(qffl, uniform)


@pytest.mark.parametrize("key, value, rule", [
    ("q", -1.0, "must be >= 0"), ("lipschitz", 0.0, "must be > 0")])
def test_its_parameters_are_checked_like_a_built_in_one(importable, tmp_path, key, value, rule):
    from fedray.api import prepare

    def job(section: dict) -> dict:
        return {"algorithm": {"aggregator": QFFL, "qffl": section},
                "sampling": {"clients_per_round": 4}, "output": {"dir": str(tmp_path / "run")}}

    with pytest.raises(ConfigError, match=rf"config key 'algorithm\.qffl\.{key}': {rule}"):
        prepare(job({key: value}), client_data=CLIENTS, model_fn=linear_model_fn())
    with pytest.raises(ConfigError, match=r"unknown config key 'algorithm\.qffl\.mu'"):
        prepare(job({"mu": 1.0}), client_data=CLIENTS, model_fn=linear_model_fn())
    assert prepare(job({}), client_data=CLIENTS).algorithm.qffl == {"q": 1.0, "lipschitz": 1.0}


def test_a_user_package_whose_module_imports_its_siblings(uniform, tmp_path, monkeypatch):
    """A part whose module uses another module of its package: the whole top-level package
    travels by value, so the driver and workers, which cannot import it by name (it is in no
    directory on their path), run it."""
    pkg = f"userpkg_{tmp_path.name.replace('-', '_')}"  # a name no process has imported
    (tmp_path / pkg).mkdir()
    (tmp_path / pkg / "helpers.py").write_text("def weight_of(update):\n    return 1.0\n")
    (tmp_path / pkg / "agg.py").write_text(
        "from fedray.algorithms.base import Aggregator\n"
        f"from {pkg}.helpers import weight_of\n\n\n"
        "class Uniform(Aggregator):\n"
        "    def weight(self, update):\n"
        "        return weight_of(update)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    got = run_linear(tmp_path, "sib", {"aggregator": f"{pkg}.agg:Uniform"}, 2)
    np.testing.assert_array_equal(got, uniform)  # the same sums, weight 1.0 each


# -- through the CLI ----------------------------------------------------------------------

TINY = ["model.name=logreg", "data.synthetic.num_clients=40", "data.synthetic.min_examples=10",
        "data.synthetic.max_examples=30", "data.synthetic.test_writers=20",
        "sampling.clients_per_round=8", "runtime.num_cpus=2", "runtime.num_workers=2",
        "runtime.worker.num_cpus=1", "runtime.worker.vectorize=off", "eval.every=0",
        "output.tensorboard=false", f"algorithm.aggregator={QFFL}", "algorithm.qffl.q=0.5",
        # in this process, no Ray start: the sweep and submit tests below run it on Ray
        "runtime.backend=inline"]


def test_the_cli_records_reports_and_resumes_it(ray_cluster, importable, tmp_path):
    """`fedray run` from the repository root, as a user runs it (a process of its own, with
    its own Ray): config.yaml and summary.json name the import path, `fedray report` groups
    by it, and `fedray run --resume` with more rounds ends on the weights of a straight run
    (bit for bit: the same computation, on the same number of workers)."""
    from fedray.cli import main

    run_dir = tmp_path / "run"
    cli_run(run_dir, ["rounds=2", *TINY])
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert cfg["algorithm"]["aggregator"] == QFFL
    assert cfg["algorithm"]["qffl"] == {"q": 0.5, "lipschitz": 1.0}
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["algorithm"] == {"name": "fedavg", "client": "local_sgd",
                                    "aggregator": QFFL, "server_opt": "sgd",
                                    "selector": "uniform"}

    assert main(["report", str(run_dir), "--out", str(tmp_path / "report"),
                 "--group-by", "algorithm.aggregator,algorithm.qffl.q"]) == 0
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    (group,) = report["groups"]
    assert group["algorithm.aggregator"] == QFFL and group["algorithm.qffl.q"] == 0.5
    assert group["method"] == f"algorithm.aggregator={QFFL}, algorithm.qffl.q=0.5"
    assert QFFL in (tmp_path / "report" / "report.md").read_text()

    two = load_weights(str(run_dir))
    # the command's own code, in this process: on the session's Ray, not a second new one
    assert main(["run", "--resume", str(run_dir), "rounds=4", "--allow-change", "rounds",
                 "--quiet"]) == 0
    assert [m["round"] for m in read_metrics(str(run_dir))] == [1, 2, 3, 4]
    straight = fedray.run(str(REPO / "jobs" / "quickstart.yaml"),
                          overrides=["rounds=4", f"output.dir={tmp_path / 'straight'}", *TINY])
    resumed = load_weights(str(run_dir))
    assert resumed.keys() == straight.weights.keys()
    assert all(torch.equal(resumed[k], straight.weights[k]) for k in resumed)
    assert not all(torch.equal(resumed[k], two[k]) for k in resumed)  # rounds 3-4 moved it


# -- through a sweep ----------------------------------------------------------------------

def test_sweep_trials_import_it_where_the_callers_files_are_not(tmp_path):
    """`fedray sweep` whose job names examples.qffl, run from a directory that does not hold
    it (the caller imports it through its own sys.path, as from a project on a laptop): the
    trials' processes, started by Ray with the caller's working directory on their path --
    not the repository -- import it only because the sweep ships its files with each trial,
    as it would to another node."""
    job = tiny_job("qffl", {"aggregator": QFFL})
    trials = sweep_elsewhere(tmp_path, job, {"algorithm.qffl.q": [0.0, 2.0]})
    assert len(trials) == 2
    finals = trial_weights(trials, 2, QFFL)
    assert not all(torch.equal(finals[0][k], finals[1][k]) for k in finals[0])  # q mattered


# -- through `fedray submit` --------------------------------------------------------------

@pytest.mark.cluster
@pytest.mark.slow
def test_submit_ships_it_to_the_cluster(tmp_path):
    """`fedray submit` from the repository root: the job runs on the head in a temporary
    working directory holding only job.yaml, so it imports examples.qffl only because submit
    ships the user's package (runtime_env py_modules, to every node)."""
    # one worker: what is checked is that the job's processes import it at all
    job = tiny_job("qffl", {"aggregator": QFFL, "qffl": {"q": 2.0}}) | {
        "runtime": {"num_workers": 1, "worker": {"num_cpus": 1, "vectorize": "off"}}}
    out_dir = submit_to_local_head(tmp_path, job)
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["rounds"] == 2 and summary["algorithm"]["aggregator"] == QFFL
    assert yaml.safe_load((out_dir / "config.yaml").read_text())["algorithm"]["qffl"]["q"] == 2.0


def test_a_package_reached_twice_on_sys_path_ships_once(monkeypatch):
    """A directory on sys.path twice under two spellings (``benchmarks/..`` and the working
    directory, as a script that puts the repository root on its path makes it) holds one
    package, shipped once: a namespace package's search locations list it under both."""
    from fedray.cluster.submit import user_modules

    monkeypatch.chdir(REPO)
    monkeypatch.syspath_prepend(str(REPO / "benchmarks" / ".."))
    found = user_modules([("algorithm.aggregator", QFFL)])
    assert [(m.key, m.path) for m in found] == [("algorithm.aggregator", str(REPO / "examples"))]


def test_what_submit_and_sweep_ship(tmp_path, monkeypatch):
    """Without a cluster: a module name ships its top-level package from the working
    directory (a sweep zips its source files for the trials), a relative .py path goes into
    a submitted job's working directory at that path (a sweep's trials get it made absolute),
    fedray and installed packages go nowhere, and a module that is not there fails before
    anything is sent, naming its key."""
    import dataclasses
    import io
    import zipfile

    from fedray.cluster.submit import _stage_file, algorithm_refs, job_refs, user_modules
    from fedray.cluster.sweep import load_sweep, pack_modules

    monkeypatch.chdir(REPO)
    refs = algorithm_refs({"name": "fedavg", "client": "fedray.algorithms.fedprox:FedProx",
                           "aggregator": QFFL, "server_opt": "yaml:SafeLoader"})
    assert refs == [("algorithm.client", "fedray.algorithms.fedprox:FedProx"),
                    ("algorithm.aggregator", QFFL), ("algorithm.server_opt", "yaml:SafeLoader")]
    # update stages are a list: each import path in it travels too
    assert algorithm_refs({"stages": ["dp", "my_stages.py:Sign", "pkg.mod:Clip"]}) == [
        ("algorithm.stages", "my_stages.py:Sign"), ("algorithm.stages", "pkg.mod:Clip")]
    assert job_refs({"algorithm": {"aggregator": QFFL},
                     "output": {"callbacks": ["my_callbacks:Log"]}}) == [
        ("algorithm.aggregator", QFFL), ("output.callbacks", "my_callbacks:Log")]
    (found,) = user_modules(refs)
    assert (found.key, found.path, found.by_file) == ("algorithm.aggregator",
                                                      str(REPO / "examples"), False)
    (by_file,) = user_modules([("algorithm.aggregator", "examples/qffl.py:QFedAvg")])
    assert by_file.by_file and by_file.path == str(REPO / "examples" / "qffl.py")
    _stage_file(by_file, str(tmp_path))
    assert (tmp_path / "examples" / "qffl.py").read_bytes() == (REPO / "examples" /
                                                                 "qffl.py").read_bytes()
    outside = dataclasses.replace(by_file, ref="../qffl.py")
    with pytest.raises(ConfigError, match=r"config key 'algorithm.aggregator': a job on a "
                                          r"cluster finds a \.py file inside the directory"):
        _stage_file(outside, str(tmp_path))
    with pytest.raises(ConfigError, match=r"config key 'algorithm.client': cannot find module "
                                          r"no_such_pkg"):
        user_modules([("algorithm.client", "no_such_pkg.mod:Client")])

    names = zipfile.ZipFile(io.BytesIO(pack_modules(refs))).namelist()
    assert "examples/qffl.py" in names and not any("__pycache__" in n for n in names)
    assert pack_modules([("algorithm.client", "fedray.algorithms.fedprox:FedProx")]) is None
    pkg = tmp_path / "proj" / "mypkg"  # only source travels: no caches, no hidden folders
    for rel in ("__init__.py", "sub/algos.py", "__pycache__/algos.cpython-311.pyc",
                ".git/config"):
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text("")
    monkeypatch.chdir(tmp_path / "proj")
    packed = pack_modules([("algorithm.aggregator", "mypkg.sub.algos:Agg")])
    assert sorted(zipfile.ZipFile(io.BytesIO(packed)).namelist()) == [
        "mypkg/__init__.py", "mypkg/sub/algos.py"]
    monkeypatch.chdir(REPO)
    sweep, job = load_sweep({"job": {"algorithm": {"aggregator": "examples/qffl.py:QFedAvg"}},
                             "parameters": {"seed": [0]}, "output": str(tmp_path / "s")})
    assert job.algorithm.aggregator == f"{REPO}/examples/qffl.py:QFedAvg"
    assert sweep.job["algorithm"]["aggregator"] == job.algorithm.aggregator
