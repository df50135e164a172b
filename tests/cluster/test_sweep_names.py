"""Sweep trials named by their swept values: unique, safe as directory names, the same in
trials/, results.csv, the report and TensorBoard; and a sweep's log without escape codes."""

import csv
import os
import subprocess
import sys
from types import SimpleNamespace

import yaml
from conftest import tiny_job

from fedray.cluster.sweep import MAX_NAME, TrialNamer, load_sweep, namer, short_keys, trial_name
from fedray.tracking.tensorboard import EVENTS_FILE, read_hparams, read_scalars


def _sweep(tmp_path, **over) -> dict:
    job = tiny_job(tmp_path, rounds=2, runtime={"worker": {"num_cpus": 1}})
    del job["output"]
    return {"name": "t", "job": job, "parameters": {"seed": [0, 1]},
            "output": str(tmp_path / "sweep"), **over}


def _trial(config: dict, trial_id: str = "ab12c_00003"):
    return SimpleNamespace(config=config, trial_id=trial_id)


def test_names_say_the_swept_values():
    keys = ["client.lr", "algorithm.fedprox.mu", "seed"]
    assert short_keys(keys) == {"client.lr": "lr", "algorithm.fedprox.mu": "mu", "seed": "seed"}
    assert trial_name(keys, {"client.lr": 0.1, "algorithm.fedprox.mu": 1e-05, "seed": 0}) \
        == "lr=0.1,mu=1e-05,seed=0"
    # two keys that end alike keep their whole names
    assert short_keys(["client.lr", "server.lr"]) == {"client.lr": "client.lr",
                                                       "server.lr": "server.lr"}
    # an import path: only letters, digits and _ . , = + - are kept
    name = trial_name(["algorithm.aggregator"], {"algorithm.aggregator": "my/qffl.py:QFedAvg"})
    assert name == "aggregator=my_qffl.py_QFedAvg"
    assert len(trial_name(["a"], {"a": "x" * 500})) == MAX_NAME


def test_names_are_unique(tmp_path):
    """A grid run once has one setting per name; where settings may repeat (num_samples,
    random search) or read alike once made safe, the trial's number follows."""
    grid, _ = load_sweep(_sweep(tmp_path, parameters={"client.lr": [0.1, 0.05], "seed": [0, 1]}))
    names = namer(grid)
    assert names.unique
    assert names(_trial({"client.lr": 0.05, "seed": 1})) == "lr=0.05,seed=1"
    twice, _ = load_sweep(_sweep(tmp_path, num_samples=2))
    assert not namer(twice).unique
    assert namer(twice)(_trial({"seed": 1}, "ab12c_00003")) == "seed=1,trial=3"
    drawn, _ = load_sweep(_sweep(tmp_path, search="random", num_samples=4,
                                 parameters={"client.lr": {"loguniform": [0.01, 0.1]}}))
    assert not namer(drawn).unique
    alike = TrialNamer(["a"], unique=False)
    assert alike(_trial({"a": "x/y"}, "q_00001")) != alike(_trial({"a": "x:y"}, "q_00002"))
    clash, _ = load_sweep(_sweep(tmp_path, parameters={"client.lr": [0.1, 0.1000000001]}))
    assert not namer(clash).unique  # 6 significant digits read alike


def test_a_sweep_names_its_trials_and_logs_no_escape_codes(tmp_path):
    """`fedray sweep` with its output in a file, as a batch job's log: its trials are the
    run directories trials/clients_per_round=10,seed=0 and ...=8,seed=0, named so in
    results.csv (in the order of the values: 8 before 10) and the log, with their
    hyper-parameters in their TensorBoard events; the log has no escape codes (Ray's
    coloured prefixes are for terminals)."""
    spec = _sweep(tmp_path, parameters={"sampling.clients_per_round": [10, 8], "seed": [0]})
    spec["job"]["runtime"]["num_cpus"] = 2
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_COLOR_PREFIX")}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    with open(tmp_path / "log.txt", "w") as log:
        done = subprocess.run([sys.executable, "-m", "fedray.cli", "sweep",
                               str(tmp_path / "s.yaml")], stdout=log, stderr=subprocess.STDOUT,
                              env=env, timeout=400, cwd=tmp_path)
    text = (tmp_path / "log.txt").read_text()
    assert done.returncode == 0, text[-3000:]
    assert "\x1b[" not in text
    names = ["clients_per_round=8,seed=0", "clients_per_round=10,seed=0"]
    assert f"trial {names[0]} started" in text and "done: 2 trials" in text
    assert sorted(os.listdir(tmp_path / "sweep" / "trials")) == sorted(names)
    with open(tmp_path / "sweep" / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["trial"] for r in rows] == names
    assert [r["run_dir"] for r in rows] == [str(tmp_path / "sweep" / "trials" / n)
                                            for n in names]
    for name, cpr in zip(names, (8, 10), strict=True):
        events = str(tmp_path / "sweep" / "trials" / name / EVENTS_FILE)
        hparams, ends = read_hparams(events)
        assert hparams["sampling.clients_per_round"] == cpr and hparams["seed"] == 0
        assert ends == [1]  # the session ended SUCCESS
        assert read_scalars(events)["clients"] == [(1, cpr), (2, cpr)]
    report = (tmp_path / "sweep" / "report" / "report.md").read_text()
    assert "grouped by: sampling.clients_per_round (--group-by)" in report

