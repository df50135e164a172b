"""fedray sweep: Tune trials that are fedray runs, early stopping, results, resuming."""

import csv
import glob
import itertools
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml
from conftest import tiny_job
from omegaconf import OmegaConf

import fedray
from fedray.cluster.sweep import check_trials, load_sweep, run_sweep
from fedray.errors import ConfigError, FedrayError
from fedray.state.run_dir import load_weights, read_metrics
from fedray.tracking.tensorboard import EVENTS_FILE


def _sweep(tmp_path, **over) -> dict:
    # tiny_job's sequential workers (runtime.worker.vectorize=off): a trial's worker would
    # otherwise import torch._dynamo for its first vectorized step, about 1 s each
    job = tiny_job(tmp_path, rounds=6, runtime__worker__num_cpus=1)
    del job["output"]
    return {"name": "t", "job": job, "parameters": {"seed": [0, 1]},
            "output": str(tmp_path / "sweep"), **over}


def test_nested_and_dotted_parameters_are_the_same(tmp_path):
    a, _ = load_sweep(_sweep(tmp_path, parameters={"client.lr": [0.1, 0.2], "seed": [0]}))
    b, _ = load_sweep(_sweep(tmp_path, parameters={"client": {"lr": [0.1, 0.2]}, "seed": [0]}))
    assert dict(a.parameters) == dict(b.parameters) == {"client.lr": [0.1, 0.2], "seed": [0]}
    assert check_trials(*load_sweep(_sweep(tmp_path, num_samples=3, parameters={
        "client.lr": [0.1, 0.2], "seed": [0, 1, 2]}))) == 18


def test_a_job_file_is_found_beside_the_sweep_and_inlined(tmp_path):
    job = tiny_job(tmp_path)
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({"job": "job.yaml",
                                                     "overrides": ["rounds=7"],
                                                     "parameters": {"seed": [1]}}))
    sweep, cfg = load_sweep(str(tmp_path / "s.yaml"))
    assert cfg.rounds == 7 and sweep.job["rounds"] == 7 and sweep.job["name"] == "tiny"


@pytest.mark.parametrize("over, message", [
    ({"parameters": {"client.lr": {"uniform": [0.1, 0.2]}}},
     "sweep key 'parameters.client.lr': a distribution needs search: random"),
    ({"search": "random", "parameters": {"seed": {"randint": [0, 2.5]}}},
     "randint needs whole numbers"),
    ({"search": "random", "parameters": {"client.lr": {"loguniform": [0, 1]}}},
     "low > 0"),
    ({"parameters": {"output.dir": ["a", "b"]}}, "is set by the sweep for each trial"),
    ({"parameters": {}}, "sweep key 'parameters': must name at least one config key"),
    ({"scheduler": {"name": "hyperband"}}, "sweep key 'scheduler.name': must be null or asha"),
    ({"search": "bayes"}, "sweep key 'search': must be grid or random"),
])
def test_bad_sweeps_are_refused(tmp_path, over, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        load_sweep(_sweep(tmp_path, **over))


@pytest.mark.parametrize("params, message", [
    ({"sampling.clients_per_round": [8, 41]},
     "sweep setting sampling.clients_per_round=41: config key 'sampling.clients_per_round': "
     "must be <= the population of 40 clients"),
    ({"client.batch_sise": [8]}, "unknown config key 'client.batch_sise'"),
    ({"client.batch_size": {"uniform": [4, 16]}}, "client.batch_size=10.0: config key "
     "'client.batch_size': Value '10.0' of type 'float' could not be converted to Integer"),
])
def test_every_value_a_sweep_can_draw_is_checked_first(tmp_path, params, message):
    sweep = _sweep(tmp_path, search="random", parameters=params)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("'", "'")):
        check_trials(*load_sweep(sweep))
    assert not (tmp_path / "sweep").exists()


def test_asha_stops_poor_trials_and_the_results_cover_every_trial(ray_cluster, tmp_path):
    """Four trials share the session's Ray (2 CPUs: two at a time); ASHA, comparing the
    train loss every round, stops some after 2 rounds. Every trial has its run directory with
    TensorBoard events, results.csv a row, and the report a curve per learning rate.

    The train loss, not the test accuracy: 62 classes, a few hundred examples and 2 rounds
    leave the accuracy of several trials at exactly 0.0, and ASHA stops no trial among ties."""
    sweep = _sweep(tmp_path, parameters={"client.lr": [0.001, 0.3], "seed": [0, 1]},
                   scheduler={"name": "asha", "grace_period": 2, "reduction_factor": 2},
                   metric="train_loss", mode="min")
    result = run_sweep(sweep, log=lambda s: None)
    rows = result.rows
    assert len(rows) == 4
    assert {r["status"] for r in rows} <= {"finished", "stopped early"}
    assert any(r["status"] == "stopped early" for r in rows), rows
    assert any(r["status"] == "finished" for r in rows), rows
    for row in rows:
        metrics = read_metrics(row["run_dir"])
        assert len(metrics) == row["rounds"] >= 2
        assert os.path.exists(os.path.join(row["run_dir"], EVENTS_FILE))
        assert row["final_train_loss"] == metrics[-1]["train_loss"]
    with open(tmp_path / "sweep" / "results.csv") as f:
        table = list(csv.DictReader(f))
    assert [t["trial"] for t in table] == [r["trial"] for r in rows]
    assert {t["client.lr"] for t in table} == {"0.001", "0.3"}
    assert (tmp_path / "sweep" / "report" / "train_loss.png").stat().st_size > 10_000
    report = (tmp_path / "sweep" / "report" / "report.md").read_text()
    for row in rows:  # the means are over finished trials; a stopped one is named
        if row["status"] == "finished":
            assert f"client.lr={row['client.lr']}" in report
        else:
            assert f"`{row['trial']}`: stopped early after round {row['rounds']}" in report
    with pytest.raises(Exception, match="already holds files"):
        run_sweep(sweep, log=lambda s: None)


def test_an_interrupted_sweep_resumes_its_trials_from_their_checkpoints(tmp_path):
    """`fedray sweep` is SIGKILLed (with the Ray it started) once a trial has checkpointed;
    `fedray sweep --resume` finishes every trial, the cut one from its checkpoint, with the
    weights an uninterrupted run of its config gives (run inline, in this process: Ray's
    bit for bit at the same worker count, tests/runtime/test_inline.py)."""
    spec = _sweep(tmp_path, parameters={"seed": [0, 1]})
    spec["job"].update(rounds=24, checkpoint={"every": 3})
    spec["job"]["runtime"]["num_cpus"] = 2
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    cli = [sys.executable, "-m", "fedray.cli", "sweep"]
    proc = subprocess.Popen(cli + [str(tmp_path / "s.yaml")], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    trials = tmp_path / "sweep" / "trials"
    deadline = time.monotonic() + 300  # Ray's and the trials' start take minutes on 2 busy cores
    while time.monotonic() < deadline:  # a checkpoint after round 6, not yet finished
        cut = [d for d in glob.glob(str(trials / "*"))
               if not os.path.exists(os.path.join(d, "summary.json"))
               and len(_lines(os.path.join(d, "metrics.jsonl"))) >= 7]
        if cut:
            break
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert cut, "no trial reached round 7 in time"
    out = subprocess.run(cli + ["--resume", str(tmp_path / "sweep")], env=env,
                         capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "done: 2 trials" in out.stdout
    rows = list(csv.DictReader(open(tmp_path / "sweep" / "results.csv")))
    assert [r["status"] for r in rows] == ["finished"] * 2
    resumed = [r for r in rows if _summary(r["run_dir"])["resumed_from_round"]]
    assert resumed, "no trial continued from a checkpoint"
    for row in resumed:
        assert [m["round"] for m in read_metrics(row["run_dir"])] == list(range(1, 25))
    row = resumed[0]  # one uninterrupted run to compare with: the trials differ only by seed
    cfg = yaml.safe_load(open(os.path.join(row["run_dir"], "config.yaml")))
    cfg["output"]["dir"] = str(tmp_path / "fresh")
    cfg["runtime"]["backend"] = "inline"
    fresh = fedray.run(cfg)
    got = load_weights(row["run_dir"])
    assert all(torch.equal(got[k], fresh.weights[k]) for k in got)


def _lines(path: str) -> list[str]:
    try:
        with open(path) as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


def _summary(run_dir: str) -> dict:
    import json

    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f)


def test_a_sweep_whose_saved_file_lost_credentials_is_not_resumed(tmp_path):
    spec = _sweep(tmp_path)
    spec["job"]["data"]["partition"] = "s3://KEY:***@bucket/stores/x"
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "sweep.yaml").write_text(yaml.safe_dump(spec))
    with pytest.raises(FedrayError, match=r"sweep.yaml has masked credentials in "
                                          r"job.data.partition; pass credentials through"):
        run_sweep(resume=str(tmp_path / "sweep"))


def test_a_trial_that_fails_at_run_time_is_an_error_row(ray_cluster, tmp_path):
    """Validation reads a store's manifest, not its shards (data.verify off): a cut shard
    passes it and fails the trial. The sweep still writes every row and says which failed."""
    from fedray.data.recipe import build

    root = pathlib.Path(__file__).resolve().parents[2]
    store = tmp_path / "store"
    build(root / "partitions" / "synthetic_dirichlet.yaml",
          [f"out={store}", "source.num_writers=5", "partitioner.num_clients=10"])
    shard = store / "train-00000.arrow"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    spec = _sweep(tmp_path, parameters={"seed": [0]})
    spec["job"].update(data={"partition": str(store), "verify": False},
                       sampling={"clients_per_round": 5})
    result = run_sweep(spec, log=lambda s: None)
    (row,) = result.rows
    assert row["status"].startswith("error: ") and result.failed == [row["trial"]]
    assert row["rounds"] == 0 and row["final_test_accuracy"] is None
    assert result.report_table is None  # no trial has the metric: no report
    text = (tmp_path / "sweep" / "results.csv").read_text()
    assert row["trial"] in text and "error: " in text


def test_resume_takes_neither_a_sweep_file_nor_overrides(tmp_path, capsys):
    from fedray.cli import main

    assert main(["sweep", "--resume", str(tmp_path), "seed=1"]) == 2
    assert capsys.readouterr().err.strip() == (
        "fedray: error: --resume takes no key=value overrides: a sweep resumes as it started")
    assert main(["sweep", "--resume", str(tmp_path), "s.yaml"]) == 2
    assert "not both" in capsys.readouterr().err


def _times(run_dir: str) -> tuple[float, float]:
    """When a trial's run started (its config.yaml, written as it claims the directory) and
    ended (its summary.json, written after its last round)."""
    return (os.stat(os.path.join(run_dir, "config.yaml")).st_mtime,
            os.stat(os.path.join(run_dir, "summary.json")).st_mtime)


def test_max_concurrent_trials_one_runs_one_trial_at_a_time(ray_cluster, tmp_path):
    """The session's Ray fits two 1-worker trials at once; max_concurrent_trials=1 must still
    run them one after another (Tune ignored it, with only a log warning, when the search
    algorithm was a generator: three trials ran two at a time). Each trial's start and end
    are read from its run directory, and agree with trials.json's record."""
    spec = _sweep(tmp_path, parameters={"seed": [0, 1, 2]}, max_concurrent_trials=1)
    spec["job"]["rounds"] = 2
    result = run_sweep(spec, log=lambda s: None)
    assert [r["status"] for r in result.rows] == ["finished"] * 3
    spans = sorted(_times(r["run_dir"]) for r in result.rows)
    for (_, end), (begin, _) in itertools.pairwise(spans):
        assert end <= begin, spans
    record = json.loads((tmp_path / "sweep" / "trials.json").read_text())["trials"]
    assert [t["status"] for t in record] == ["finished"] * 3
    spans = sorted((t["started"], t["ended"]) for t in record)
    assert all(end <= begin for (_, end), (begin, _) in itertools.pairwise(spans)), spans


KILLER = """
import os
from fedray.tracking.callbacks import Callback

class KillSeedOne(Callback):
    def on_run_start(self, run):
        self.seed = run.config.seed

    def on_round_end(self, round, metrics, weights):
        if self.seed == 1 and round == 2:
            os._exit(1)  # the trial's process dies, as an OOM kill or a lost node would
"""


def test_a_killed_trial_is_labelled_and_left_out_of_the_report(ray_cluster, tmp_path):
    """A trial whose process dies after round 2 of 3 has metrics, but it is not a result:
    results.csv labels it (error), and the report averages only the finished trials and
    names the one it left out (it was averaged with them as if complete)."""
    (tmp_path / "killer.py").write_text(KILLER)
    spec = _sweep(tmp_path, parameters={"seed": [0, 1]}, metric="train_loss", mode="min")
    spec["job"].update(rounds=3, output={"callbacks": [f"{tmp_path / 'killer.py'}:KillSeedOne"]})
    result = run_sweep(spec, log=lambda s: None)
    by_seed = {r["seed"]: r for r in result.rows}
    assert by_seed[0]["status"] == "finished"
    assert by_seed[1]["status"].startswith("error: ") and by_seed[1]["rounds"] == 2
    assert by_seed[1]["final_train_loss"] is not None
    assert result.failed == [by_seed[1]["trial"]]
    report = json.loads((tmp_path / "sweep" / "report" / "report.json").read_text())
    assert [r["run_dir"] for r in report["runs"]] == [by_seed[0]["run_dir"]]
    md = (tmp_path / "sweep" / "report" / "report.md").read_text()
    assert "left out of the means: 1 of 2 trials" in md
    assert f"`{by_seed[1]['trial']}`: error: " in md


def _pickle_bomb(marker) -> bytes:
    """A pickle that, when loaded, creates ``marker`` (as a crafted one would run anything)."""
    import pickle

    class Bomb:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    return pickle.dumps(Bomb())


def test_resume_reads_no_pickle_from_the_sweep_directory(ray_cluster, tmp_path):
    """A sweep directory on shared storage can be written by others: every pickle Tune would
    load on a restore (tuner.pkl, trainable.pkl, its experiment state's pickled objects, a
    trial's params.pkl and error.pkl) is replaced by one that would create a marker file;
    `fedray sweep --resume` finishes the sweep from fedray's own files and the marker is
    never created (Tuner.restore unpickled tuner.pkl)."""
    spec = _sweep(tmp_path, parameters={"seed": [0, 1]})
    spec["job"]["rounds"] = 2
    first = run_sweep(spec, log=lambda s: None)
    done = _summary(first.rows[0]["run_dir"])
    os.remove(os.path.join(first.rows[1]["run_dir"], "summary.json"))  # as if cut at the end
    marker = tmp_path / "PWNED"
    bomb = _pickle_bomb(marker)
    tune_dir = tmp_path / "sweep" / "tune"
    for name in ("tuner.pkl", "trainable.pkl"):
        (tune_dir / name).write_bytes(bomb)
    for state in tune_dir.glob("experiment_state-*.json"):
        state.write_text(json.dumps({"_type": "CLOUDPICKLE_FALLBACK", "value": bomb.hex()}))
    for trial in tune_dir.iterdir():
        if trial.is_dir():
            (trial / "params.pkl").write_bytes(bomb)
            (trial / "error.pkl").write_bytes(bomb)
    result = run_sweep(resume=str(tmp_path / "sweep"), log=lambda s: None)
    assert not marker.exists()
    assert [r["status"] for r in result.rows] == ["finished"] * 2
    assert _summary(result.rows[0]["run_dir"]) == done  # a finished trial is not run again


def test_resume_refuses_a_plan_its_sweep_file_no_longer_gives(tmp_path):
    spec = _sweep(tmp_path, parameters={"seed": [0, 1]})
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "sweep.yaml").write_text(yaml.safe_dump(spec))
    (tmp_path / "sweep" / "trials.json").write_text(json.dumps({"trials": [
        {"trial": "seed=7", "params": {"seed": 7}, "status": "finished"}]}))
    with pytest.raises(FedrayError, match=r"its sweep.yaml no longer gives the trials listed "
                                          r"in trials.json"):
        run_sweep(resume=str(tmp_path / "sweep"))
    (tmp_path / "sweep" / "trials.json").write_text("[1, 2")
    with pytest.raises(FedrayError, match=r"trials.json is not fedray's record of the sweep's "
                                          r"trials \(JSONDecodeError"):
        run_sweep(resume=str(tmp_path / "sweep"))


def test_ctrl_c_ends_a_sweep_in_one_line_and_it_resumes(tmp_path):
    """Ctrl-C (SIGINT to the terminal's process group) during a trial: `fedray sweep` stops
    in order and says in one line how to continue -- no traceback, exit 130; results.csv
    labels the cut trial interrupted and the other not started; `--resume` finishes both."""
    spec = _sweep(tmp_path, parameters={"seed": [0, 1]}, max_concurrent_trials=1)
    spec["job"].update(rounds=12, checkpoint={"every": 2})
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    cli = [sys.executable, "-m", "fedray.cli", "sweep"]
    proc = subprocess.Popen(cli + [str(tmp_path / "s.yaml")], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not any(
            len(_lines(os.path.join(d, "metrics.jsonl"))) >= 3
            for d in glob.glob(str(tmp_path / "sweep" / "trials" / "*"))):
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)
    err = proc.communicate(timeout=120)[1]
    where = str(tmp_path / "sweep")
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == (
        "fedray: interrupted; 2 of 2 trials did not end (results.csv lists them, report/ "
        f"leaves them out); continue with: fedray sweep --resume {where}")
    rows = list(csv.DictReader(open(tmp_path / "sweep" / "results.csv")))
    assert sorted(r["status"] for r in rows) == ["interrupted", "not started"]
    out = subprocess.run(cli + ["--resume", where], env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = list(csv.DictReader(open(tmp_path / "sweep" / "results.csv")))
    assert [r["status"] for r in rows] == ["finished"] * 2
    assert any(_summary(r["run_dir"])["resumed_from_round"] for r in rows)


def test_the_trials_are_planned_from_the_sweep_alone(tmp_path):
    """A resume recomputes the trials from sweep.yaml: the same names and values every time
    (random search draws from the sweep's seed), each name unique, each value in its range."""
    from fedray.cluster.sweep import plan_trials

    grid, _ = load_sweep(_sweep(tmp_path, parameters={"client.lr": [0.1, 0.05], "seed": [0, 1]}))
    assert plan_trials(grid) == [("lr=0.1,seed=0", {"client.lr": 0.1, "seed": 0}),
                                 ("lr=0.1,seed=1", {"client.lr": 0.1, "seed": 1}),
                                 ("lr=0.05,seed=0", {"client.lr": 0.05, "seed": 0}),
                                 ("lr=0.05,seed=1", {"client.lr": 0.05, "seed": 1})]
    twice, _ = load_sweep(_sweep(tmp_path, num_samples=2))
    assert [n for n, _ in plan_trials(twice)] == ["seed=0,trial=0", "seed=1,trial=1",
                                                   "seed=0,trial=2", "seed=1,trial=3"]
    spec = _sweep(tmp_path, search="random", num_samples=20, seed=5, parameters={
        "client.lr": {"loguniform": [0.01, 0.1]}, "seed": {"randint": [0, 3]},
        "client.batch_size": [4, 8]})
    drawn = plan_trials(load_sweep(spec)[0])
    assert drawn == plan_trials(load_sweep(spec)[0])
    assert drawn != plan_trials(load_sweep({**spec, "seed": 6})[0])
    assert len({n for n, _ in drawn}) == 20
    for _, p in drawn:
        assert 0.01 <= p["client.lr"] < 0.1 and p["seed"] in (0, 1, 2)
        assert p["client.batch_size"] in (4, 8)
    assert {p["seed"] for _, p in drawn} == {0, 1, 2}


def test_a_choice_gives_each_method_its_own_settings(tmp_path):
    """A parameter whose values are settings (a choice): FedProx's `mu` is swept within its
    own option only, trial names read as the study does, and results.csv has a column for
    the choice and one per config key, empty where a trial's option does not set it."""
    from fedray.cluster.sweep import TrialRecord, _rows, plan_trials, swept_keys

    spec = _sweep(tmp_path, parameters={
        "method": [{"algorithm.name": "fedavg"},
                   {"algorithm": {"name": "fedprox", "fedprox": {"mu": [0.01, 1.0]}}}],
        "sampling.clients_per_round": [10, 5], "seed": [0]})
    sweep, job = load_sweep(spec)
    assert check_trials(sweep, job) == 6
    plan = plan_trials(sweep)
    assert [n for n, _ in plan] == [
        "method=fedavg,clients_per_round=10,seed=0", "method=fedavg,clients_per_round=5,seed=0",
        "method=fedprox,mu=0.01,clients_per_round=10,seed=0",
        "method=fedprox,mu=0.01,clients_per_round=5,seed=0",
        "method=fedprox,mu=1,clients_per_round=10,seed=0",
        "method=fedprox,mu=1,clients_per_round=5,seed=0"]
    assert plan[3][1] == {"algorithm.name": "fedprox", "algorithm.fedprox.mu": 0.01,
                          "sampling.clients_per_round": 5, "seed": 0}
    assert swept_keys(sweep) == ["algorithm.name", "algorithm.fedprox.mu",
                                 "sampling.clients_per_round", "seed"]
    rows = _rows(sweep, TrialRecord(sweep.output, plan))
    assert [(r["method"], r["algorithm.fedprox.mu"], r["sampling.clients_per_round"])
            for r in rows] == [("fedavg", None, 5), ("fedavg", None, 10), ("fedprox", 0.01, 5),
                               ("fedprox", 0.01, 10), ("fedprox", 1.0, 5), ("fedprox", 1.0, 10)]
    # a choice named after a config section sets keys inside it; resuming re-reads the
    # normalised sweep.yaml into the same trials
    sec, _ = load_sweep(_sweep(tmp_path, parameters={"algorithm": [
        {"name": "fedavg"}, {"name": "fedprox", "fedprox.mu": 0.1}]}))
    assert plan_trials(sec) == [("algorithm=fedavg", {"algorithm.name": "fedavg"}),
                                ("algorithm=fedprox,mu=0.1", {"algorithm.name": "fedprox",
                                                              "algorithm.fedprox.mu": 0.1})]
    again, _ = load_sweep(yaml.safe_load(OmegaConf.to_yaml(sweep)))
    assert plan_trials(again) == plan


@pytest.mark.parametrize("params, message", [
    ({"method": [{"algorithm.name": "fedavg"}, {"algorithm.name": "fedprox",
                                                 "algorithm.fedprox.muu": 0.1}]},
     "sweep setting algorithm.name='fedprox', algorithm.fedprox.muu=0.1: unknown config key "
     "'algorithm.fedprox.muu'"),
    ({"method": [{"algorithm.name": "fedavg"}], "algorithm.name": ["fedprox"]},
     "sweep key 'parameters.algorithm.name': sets algorithm.name, which parameters.method "
     "sets too"),
    ({"method": [{"algorithm.name": "fedavg"}, {"algorithm.name": ["fedavg", "fedprox"]}]},
     "sweep key 'parameters.method': two options give the same setting"),
    ({"seed": [{"client.lr": 0.1}]}, "sweep key 'parameters.seed': is a config value"),
    ({"method": [{"output.dir": "x"}]},
     "sweep key 'parameters.method': sets output.dir, which the sweep sets for each trial"),
])
def test_bad_choices_are_refused_in_one_line(tmp_path, params, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_trials(*load_sweep(_sweep(tmp_path, parameters=params)))
    assert not (tmp_path / "sweep").exists()


def test_random_search_draws_an_option_then_its_values(tmp_path):
    from fedray.cluster.sweep import plan_trials

    spec = _sweep(tmp_path, search="random", num_samples=30, parameters={"method": [
        {"algorithm.name": "fedavg"}, {"algorithm.name": "fedprox",
                                       "algorithm.fedprox.mu": [0.01, 0.1]}]})
    drawn = [p for _, p in plan_trials(load_sweep(spec)[0])]
    assert {json.dumps(p, sort_keys=True) for p in drawn} == {
        '{"algorithm.name": "fedavg"}',
        '{"algorithm.fedprox.mu": 0.01, "algorithm.name": "fedprox"}',
        '{"algorithm.fedprox.mu": 0.1, "algorithm.name": "fedprox"}'}


def test_a_trial_tune_ends_after_ctrl_c_is_interrupted_not_stopped(tmp_path):
    """Tune's loop ends trials the same way for its scheduler and for a Ctrl-C (both reach
    on_trial_complete): the progress callback wraps Tune's Ctrl-C handler to tell them apart.
    Here the callback's hooks are called as Tune calls them, in this process, with a stand-in
    for Tune's handler installed, and a real SIGINT delivered to it."""
    from types import SimpleNamespace

    from fedray.cluster.sweep import (
        INTERRUPTED,
        STOPPED,
        TrialRecord,
        _progress_callback,
        plan_trials,
    )

    sweep, _ = load_sweep(_sweep(tmp_path))
    plan = plan_trials(sweep)
    tune_got = []
    previous = signal.signal(signal.SIGINT, lambda s, f: tune_got.append(s))  # "Tune's"
    try:
        statuses = []
        for ctrl_c in (False, True):
            record = TrialRecord(sweep.output, plan)
            os.makedirs(sweep.output, exist_ok=True)
            progress = _progress_callback(sweep, len(plan), lambda line: None, record)
            progress.setup()
            if ctrl_c:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.1)  # the handler runs between bytecodes of this thread
            trial = SimpleNamespace(config={"trial": plan[0][0]}, trial_id="t0")
            progress.on_trial_start(0, [], trial)
            progress.on_trial_complete(0, [], trial)
            statuses.append(record.entries[plan[0][0]]["status"])
        assert statuses == [STOPPED, INTERRUPTED]
        assert tune_got == [signal.SIGINT]  # Tune's handler still got the Ctrl-C
        # a resumed sweep counts on from the trials that had ended before it
        lines: list[str] = []
        progress = _progress_callback(sweep, 5, lines.append, TrialRecord(sweep.output, plan),
                                      ended=3)
        trial = SimpleNamespace(config={"trial": plan[1][0]}, trial_id="t1")
        progress.on_trial_complete(0, [], trial)
        assert lines[-1].endswith("[4/5 ended]"), lines
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupt_sweep(tmp_path, trials: int, ready) -> tuple[subprocess.Popen, str]:
    """`fedray sweep` of ``trials`` trials (two run at a time on the Ray it starts), Ctrl-C
    once ``ready(sweep_dir)``; returns the process, ended, and its stderr."""
    spec = _sweep(tmp_path, parameters={"seed": list(range(trials))})
    spec["job"].update(rounds=200, checkpoint={"every": 2})
    spec["job"]["runtime"]["num_cpus"] = 2
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.Popen([sys.executable, "-m", "fedray.cli", "sweep", str(tmp_path / "s.yaml")],
                            env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not ready(tmp_path / "sweep"):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    return proc, proc.communicate(timeout=180)[1]


def _without_ray_sigterm_noise(err: str) -> str:
    """stderr without the lines of a trial process whose Ray worker printed "Exception
    ignored in ..." from its own SIGTERM handler (ray/_private/worker.py sigterm_handler
    raising SystemExit inside a weakref callback while the process dies: a race in Ray's
    shutdown, forwarded as "(_trial pid=N) ..." lines, seen once in a full run). Any other
    traceback, a trial's included, still fails the test."""
    lines = err.splitlines()
    pid = re.compile(r"^\(_trial pid=(\d+)\) ")
    noisy = {m.group(1) for line in lines if (m := pid.match(line))
             and "sigterm_handler" in line}
    noisy &= {m.group(1) for line in lines if (m := pid.match(line))
              and "Exception ignored in" in line}
    return "\n".join(line for line in lines
                     if not ((m := pid.match(line)) and m.group(1) in noisy))


@pytest.mark.parametrize("when", ["before any trial started", "with every trial running"])
def test_ctrl_c_at_any_point_writes_results_and_says_resume(tmp_path, when):
    """Ctrl-C while Ray and Tune are still starting (no trial has started), and while every
    trial runs (none pending): exit 130, no traceback, results.csv with a row per trial --
    not started, or interrupted, never "stopped early" (the scheduler's label) -- and the
    --resume command as the last line."""
    def started(sweep_dir) -> bool:
        if when.startswith("before"):
            return (sweep_dir / "trials.json").exists()
        return sum(len(_lines(os.path.join(d, "metrics.jsonl"))) >= 2
                   for d in glob.glob(str(sweep_dir / "trials" / "*"))) == 2

    proc, err = _interrupt_sweep(tmp_path, 2, started)
    where = str(tmp_path / "sweep")
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in _without_ray_sigterm_noise(err), err[-3000:]
    assert err.strip().splitlines()[-1].endswith(f"continue with: fedray sweep --resume {where}")
    rows = list(csv.DictReader(open(tmp_path / "sweep" / "results.csv")))
    expect = "not started" if when.startswith("before") else "interrupted"
    assert [r["status"] for r in rows] == [expect] * 2


def test_a_sweep_says_its_client_state_disk_first_and_refuses_a_trial_over_budget(tmp_path):
    """Before Ray starts: the stateful trials' estimates summed (each as its driver makes
    it), and a trial whose own estimate is over runtime.client_state_mb refused in one line
    naming its setting."""
    from fedray.cluster.sweep import client_state_disk, plan_trials
    from fedray.state.client_state_disk import estimate, size_text

    spec = _sweep(tmp_path, parameters={"method": [{"algorithm.name": "fedavg"},
                                                   {"algorithm.name": "scaffold"}],
                                        "seed": [0, 1]})
    sweep, job = load_sweep(spec)
    d = 28 * 28 * 62 + 62  # tiny_job's logistic regression on 28 x 28 images, 62 classes
    one = estimate(40, 8, 6, d)  # rounds=6, 8 of 40 clients a round, one state key
    line = client_state_disk(sweep, job, plan_trials(sweep))
    assert line.startswith(f"client state on disk: about {size_text(2 * one.expected)} for "
                           "the 2 trials that keep it (the largest, method=scaffold,seed=")
    assert f", about {size_text(one.expected)}; each trial's log" in line
    spec["job"]["runtime"]["client_state_mb"] = 0.0001
    sweep, job = load_sweep(spec)
    with pytest.raises(ConfigError, match=re.escape(
            "sweep setting algorithm.name='scaffold', seed=0: config key "
            "'runtime.client_state_mb': the run's client state is expected to take")):
        client_state_disk(sweep, job, plan_trials(sweep))
    assert client_state_disk(*load_sweep(_sweep(tmp_path)), plan_trials(load_sweep(
        _sweep(tmp_path))[0])) is None  # FedAvg keeps none


def test_a_job_key_set_on_the_command_line_keeps_the_job_file(tmp_path):
    """`fedray sweep s.yaml job.rounds=9` on a sweep whose job is a file: the file's keys
    stay (merging job.rounds into the path used to replace the whole job with one key, its
    data silently back to the synthetic default)."""
    job = tiny_job(tmp_path, rounds=7)
    job["data"] = {"partition": "synthetic", "synthetic": {**job["data"]["synthetic"],
                                                           "num_clients": 50}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({"job": "job.yaml",
                                                     "parameters": {"seed": [1]}}))
    sweep, cfg = load_sweep(str(tmp_path / "s.yaml"), ["job.rounds=9", "name=x"])
    assert cfg.rounds == 9 and cfg.name == "tiny" and cfg.data.synthetic.num_clients == 50
    assert sweep.name == "x"
