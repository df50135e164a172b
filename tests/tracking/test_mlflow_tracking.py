"""output.mlflow: the config as params and every round's metrics, in the calling process.

MLflow is an optional extra and not installed for the tests; a stand-in module records what
fedray sends through MLflow's tracking API (start_run, log_params, set_tag, log_metrics)."""

import contextlib
import importlib.util
import sys
import types

import pytest
from conftest import tiny_job

import fedray
from fedray.api import prepare
from fedray.errors import FedrayError
from fedray.tracking.callbacks import Callback
from fedray.tracking.tensorboard import EVENTS_FILE


@pytest.mark.skipif(importlib.util.find_spec("mlflow") is not None, reason="mlflow installed")
def test_missing_mlflow_is_refused_before_anything_starts(tmp_path):
    with pytest.raises(FedrayError, match=r"output.mlflow': MLflow is not installed; pip "
                                          r"install 'fedray\[mlflow\]'"):
        prepare(tiny_job(tmp_path, output__mlflow=True))
    assert not (tmp_path / "run").exists()


@pytest.fixture
def fake_mlflow(monkeypatch):
    calls: dict = {"runs": [], "params": {}, "tags": {}, "metrics": [], "status": []}

    @contextlib.contextmanager
    def start_run(run_name=None):  # as MLflow's: FAILED when the block raises
        calls["runs"].append(run_name)
        try:
            yield types.SimpleNamespace(info=types.SimpleNamespace(run_id="r1"))
        except BaseException:
            calls["status"].append("FAILED")
            raise
        calls["status"].append("FINISHED")

    module = types.ModuleType("mlflow")
    module.start_run = start_run
    module.log_params = lambda params: calls["params"].update(params)
    module.set_tag = lambda k, v: calls["tags"].__setitem__(k, v)
    module.log_metrics = lambda metrics, step: calls["metrics"].append((step, metrics))
    monkeypatch.setitem(sys.modules, "mlflow", module)
    return calls


def test_params_and_every_rounds_metrics_reach_mlflow(ray_cluster, tmp_path, fake_mlflow):
    job = tiny_job(tmp_path, rounds=3, output__mlflow=True, output__tensorboard=False)
    job["storage_key"] = None  # not a key: refused, nothing logged
    with pytest.raises(FedrayError, match="storage_key"):
        fedray.run(job)
    assert fake_mlflow["runs"] == []
    del job["storage_key"]
    job["data"]["partition"] = "synthetic"
    result = fedray.run(job)
    assert fake_mlflow["runs"] == ["tiny"]
    params = fake_mlflow["params"]
    assert params["client.lr"] == "0.05" and params["sampling.clients_per_round"] == "8"
    assert params["output.mlflow"] == "True"
    assert fake_mlflow["tags"]["fedray.state.run_dir"] == result.run_dir
    steps = [step for step, _ in fake_mlflow["metrics"]]
    assert steps == [1, 2, 3]
    for (_, logged), m in zip(fake_mlflow["metrics"], result.metrics, strict=True):
        assert logged["train_loss"] == m["train_loss"] and "round" not in logged
    assert logged["test_accuracy"] == result.metrics[-1]["test_accuracy"]
    assert fake_mlflow["status"] == ["FINISHED"]
    assert not (tmp_path / "run" / EVENTS_FILE).exists()  # output.tensorboard=false


class _Fails(Callback):
    def on_round_end(self, round, metrics, weights):
        if round == 2:
            raise RuntimeError("a user's callback fails")


def test_a_failed_run_ends_its_mlflow_run_failed(tmp_path, fake_mlflow):
    """fedray's writers come before the user's callbacks: round 2 is logged before the
    user's callback fails the run, and the MLflow run ends FAILED."""
    job = tiny_job(tmp_path, rounds=3, output__mlflow=True, runtime__backend="inline")
    with pytest.raises(RuntimeError, match="a user's callback fails"):
        fedray.run(job, callbacks=[_Fails()])
    assert fake_mlflow["runs"] == ["tiny"] and fake_mlflow["status"] == ["FAILED"]
    assert [step for step, _ in fake_mlflow["metrics"]] == [1, 2]
