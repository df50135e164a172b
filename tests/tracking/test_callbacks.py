"""fedray.tracking.callbacks: hooks called in the caller's process, a custom metric, early stopping,
callbacks named in the config. On the inline backend (no Ray) except where the weights'
trip from the driver actor is the subject."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import yaml
from conftest import blobs, fixed_linear, tiny_job

import fedray
from fedray.api import prepare
from fedray.errors import ConfigError, FedrayError
from fedray.state.checkpoint import read_checkpoint
from fedray.state.run_dir import load_weights, read_metrics
from fedray.tracking.callbacks import STOP, Callback, Callbacks, RunInfo

CLIENTS = blobs(10, seed=1)
TEST = blobs(1, seed=8)[0]


def job(tmp_path, name: str, backend: str = "inline", rounds: int = 4, **extra) -> dict:
    return {"name": name, "seed": 5, "rounds": rounds,
            "client": {"lr": 0.1, "batch_size": 4, "local_steps": 2},
            "sampling": {"clients_per_round": 5}, "eval": {"every": 2},
            "runtime": {"backend": backend, "num_workers": 2,
                        "worker": {"num_cpus": 0.5, "vectorize": "off"}},
            "output": {"dir": str(tmp_path / name), "tensorboard": False}, **extra}


def run(tmp_path, name: str, callbacks=(), backend: str = "inline", **kw):
    return fedray.run(job(tmp_path, name, backend, **kw), model_fn=fixed_linear()[0],
                      client_data=CLIENTS, test_data=TEST, callbacks=list(callbacks))


def norm(state: dict[str, torch.Tensor]) -> float:
    return float(torch.linalg.vector_norm(torch.cat([v.flatten() for v in state.values()])))


class Recorder(Callback):
    def __init__(self):
        self.calls: list[tuple] = []

    def on_run_start(self, run):
        self.calls.append(("start", run))

    def on_evaluation(self, round, metrics):
        self.calls.append(("evaluation", round, metrics))

    def on_round_end(self, round, metrics, weights):
        self.calls.append(("round", round, metrics, weights))

    def on_run_end(self, summary):
        self.calls.append(("end", summary))

    def on_run_failed(self, error):
        self.calls.append(("failed", error))

    def hooks(self) -> list[tuple]:
        return [c[:2] if c[0] in ("round", "evaluation") else c[:1] for c in self.calls]


class WeightNorm(Recorder):
    """A metric fedray does not compute: the global model's L2 norm after each round."""

    needs_weights = True

    def __init__(self):
        super().__init__()
        self.norms: list[float] = []
        self.last: dict | None = None

    def on_round_end(self, round, metrics, weights):
        super().on_round_end(round, metrics, weights)
        self.norms.append(norm(weights))
        self.last = weights


def test_a_custom_metric_and_the_hooks_in_order(tmp_path):
    custom, plain = WeightNorm(), Recorder()
    result = run(tmp_path, "norm", [plain, custom])
    assert plain.hooks() == custom.hooks() == [
        ("start",), ("round", 1), ("evaluation", 2), ("round", 2), ("round", 3),
        ("evaluation", 4), ("round", 4), ("end",)]
    start = plain.calls[0][1]
    assert isinstance(start, RunInfo) and start.run_dir == result.run_dir
    assert start.resumed_from is None and start.past_metrics == []
    assert start.config.rounds == 4
    rounds = [c for c in plain.calls if c[0] == "round"]
    assert [c[2] for c in rounds] == result.metrics  # the records of metrics.jsonl
    assert all(c[3] is None for c in rounds)  # no needs_weights: no model shipped
    evaluations = [c[2] for c in plain.calls if c[0] == "evaluation"]
    assert evaluations[-1] == {k: v for k, v in result.metrics[-1].items()
                               if k.startswith("test_")} and "test_loss" in evaluations[-1]
    assert plain.calls[-1] == ("end", result.summary)
    # the last round's model is the saved one; the norm is a new number every round
    assert custom.norms[-1] == norm(load_weights(result.run_dir))
    assert len(set(custom.norms)) == 4
    assert all(torch.equal(custom.last[k], result.weights[k]) for k in result.weights)


def test_weights_come_from_the_driver_actor_only_when_asked(ray_cluster, tmp_path):
    plain, custom = Recorder(), WeightNorm()
    result = run(tmp_path, "ray", [plain, custom], backend="ray", rounds=2)
    assert all(c[3] is None for c in plain.calls if c[0] == "round")
    assert [c[1] for c in custom.calls if c[0] == "round"] == [1, 2]
    assert all(torch.equal(custom.last[k], result.weights[k]) for k in result.weights)
    assert custom.norms[0] != custom.norms[1]


class StopAfter(Callback):
    def __init__(self, at: int, answer=STOP):
        self.at, self.answer = at, answer

    def on_round_end(self, round, metrics, weights):
        return self.answer if round == self.at else None


def test_early_stop_then_resume(tmp_path):
    whole = run(tmp_path, "whole", rounds=5, checkpoint={"every": 10})
    result = run(tmp_path, "stop", [StopAfter(2)], rounds=5, checkpoint={"every": 10})
    run_dir = result.run_dir
    assert [m["round"] for m in read_metrics(run_dir)] == [1, 2]
    assert read_checkpoint(run_dir).round == 2  # not due (every 10): written for the stop
    summary = json.loads(open(os.path.join(run_dir, "summary.json")).read())
    assert summary["stopped_early_after_round"] == 2 == result.summary[
        "stopped_early_after_round"]
    assert all(torch.equal(load_weights(run_dir)[k], result.weights[k]) for k in result.weights)
    # rounds unchanged: the resume continues to 5, as if never stopped
    resumed = fedray.run(resume=run_dir, model_fn=fixed_linear()[0], client_data=CLIENTS,
                         test_data=TEST)
    assert [m["round"] for m in read_metrics(run_dir)] == [1, 2, 3, 4, 5]
    assert resumed.summary["stopped_early_after_round"] is None
    assert resumed.summary["resumed_from_round"] == 2
    assert all(torch.equal(resumed.weights[k], whole.weights[k]) for k in whole.weights)
    assert whole.summary["stopped_early_after_round"] is None
    # True stops as STOP does; a stop asked after the last round is no early stop
    assert run(tmp_path, "true", [StopAfter(1, True)], rounds=3).summary[
        "stopped_early_after_round"] == 1
    assert run(tmp_path, "last", [StopAfter(2)], rounds=2).summary[
        "stopped_early_after_round"] is None


class Fails(Callback):
    def on_round_end(self, round, metrics, weights):
        if round == 2:
            raise RuntimeError("callback bug")


def test_a_failing_callback_fails_the_run_and_the_others_are_told(tmp_path):
    rec = Recorder()
    with pytest.raises(RuntimeError, match="callback bug"):
        run(tmp_path, "fails", [rec, Fails()])
    assert rec.hooks()[-2:] == [("round", 2), ("failed",)]
    assert isinstance(rec.calls[-1][1], RuntimeError)
    assert len(read_metrics(str(tmp_path / "fails"))) == 2  # kept: it can be resumed


def test_a_failure_is_told_once_and_only_to_started_callbacks():
    """fedray.run may see a run's error at two depths (the round loop, then the code that
    started Ray for a hand-over): the callbacks hear of it once, and only after their start."""
    rec = Recorder()
    hooks = Callbacks([rec])
    hooks.run_failed(RuntimeError("before the start"))
    assert rec.hooks() == []
    hooks.run_start(RunInfo(None, "u", None, []))
    error = RuntimeError("boom")
    hooks.run_failed(error)
    hooks.run_failed(error)
    assert rec.hooks() == [("start",), ("failed",)] and rec.calls[-1][1] is error


def test_progress_still_takes_a_function(tmp_path):
    seen = []
    fedray.run(job(tmp_path, "p", rounds=2), model_fn=fixed_linear()[0], client_data=CLIENTS,
               test_data=TEST, progress=lambda m: seen.append(m["round"]))
    assert seen == [1, 2]


MODULE = """from fedray.tracking.callbacks import Callback

EVENTS = []


class Log(Callback):
    def on_run_start(self, run):
        EVENTS.append(("config", "start"))

    def on_round_end(self, round, metrics, weights):
        EVENTS.append(("config", round))


class NeedsArgument(Callback):
    def __init__(self, x):
        self.x = x
"""


class ArgLog(Callback):
    def __init__(self, events: list):
        self.events = events

    def on_run_start(self, run):
        self.events.append(("argument", "start"))

    def on_round_end(self, round, metrics, weights):
        self.events.append(("argument", round))


def test_callbacks_from_the_config_then_the_arguments(tmp_path, monkeypatch):
    name = "fedray_test_callbacks_mod"
    (tmp_path / f"{name}.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        import importlib

        module = importlib.import_module(name)
        result = run(tmp_path, "cfg", [ArgLog(module.EVENTS)], rounds=2,
                     output={"dir": str(tmp_path / "cfg"), "callbacks": [f"{name}:Log"]})
        assert module.EVENTS == [("config", "start"), ("argument", "start"), ("config", 1),
                                 ("argument", 1), ("config", 2), ("argument", 2)]
        saved = yaml.safe_load(open(os.path.join(result.run_dir, "config.yaml")))
        assert saved["output"]["callbacks"] == [f"{name}:Log"]
    finally:
        sys.modules.pop(name, None)


def test_bad_callbacks_are_one_line_naming_the_key(tmp_path):
    def refused(ref: str) -> str:
        with pytest.raises(ConfigError) as info:
            prepare(job(tmp_path, "bad", output={"dir": str(tmp_path / "bad"),
                                                 "callbacks": [ref]}), client_data=CLIENTS)
        text = str(info.value)
        assert text.startswith("config key 'output.callbacks': ") and "\n" not in text
        return text

    assert "cannot import fedray_no_such_module: ModuleNotFoundError" in refused(
        "fedray_no_such_module:Log")
    assert "no such file" in refused(f"{tmp_path}/missing.py:Log")
    assert "module fedray.tracking.callbacks has no Nope" in refused(
        "fedray.tracking.callbacks:Nope")
    assert "must name a subclass of fedray.tracking.callbacks.Callback" in refused(
        "fedray.tracking.callbacks:RunInfo")
    assert "must be module:Name" in refused("Log")
    # a class that cannot be made without arguments: refused before anything is written
    (tmp_path / "cbs.py").write_text(MODULE)
    with pytest.raises(ConfigError, match=r"^config key 'output.callbacks': NeedsArgument\(\) "
                                          r"failed: TypeError: .*missing 1 required"):
        run(tmp_path, "args", output={"dir": str(tmp_path / "args"),
                                      "callbacks": [f"{tmp_path}/cbs.py:NeedsArgument"]})
    assert not (tmp_path / "args").exists()
    with pytest.raises(FedrayError, match=r"callbacks\[1\] is a class, not an instance"):
        run(tmp_path, "cls", [Recorder(), Recorder])
    assert not (tmp_path / "cls").exists()


STOPPER = """from fedray.tracking.callbacks import Callback


class StopAtTwo(Callback):
    def on_round_end(self, round, metrics, weights):
        return round == 2
"""


def test_cli_early_stop_exits_0_and_resumes(tmp_path):
    """A callback from the job file, by a .py path, stops `fedray run` after round 2: the
    command succeeds and says how to continue; --resume (rounds unchanged) finishes."""
    (tmp_path / "stopper.py").write_text(STOPPER)
    j = tiny_job(tmp_path, rounds=4, runtime__backend="inline",
                 output__callbacks=[f"{tmp_path}/stopper.py:StopAtTwo"])
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(j))
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    cli = [sys.executable, "-m", "fedray.cli", "run"]
    out = subprocess.run([*cli, str(path)], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    run_dir = str(tmp_path / "run")
    assert "done: 2 of 4 rounds (a callback stopped the run; fedray run --resume " in out.stdout
    assert "round 2/4" in out.stderr  # the progress line, a callback too
    assert len(read_metrics(run_dir)) == 2 and read_checkpoint(run_dir).round == 2
    out = subprocess.run([*cli, "--resume", run_dir, "--quiet"], capture_output=True,
                         text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "done: 4 rounds" in out.stdout
    assert [m["round"] for m in read_metrics(run_dir)] == [1, 2, 3, 4]
