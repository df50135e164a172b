"""runtime.backend=auto (fedray.runtime.handover): a run starts in the caller's process and,
when the rounds left are projected long, goes on on Ray from a checkpoint.

The hand-over must change no number: a handed-over run's weights, metrics, server state and
client state equal a run on Ray alone bit for bit (same workers, same slot order, and a
resume from a checkpoint is exact). The rule and the choice of where to start are pure and
tested without Ray."""

from __future__ import annotations

import os
import sys
import types

import pytest
import torch
from conftest import fixed_linear
from test_inline import CLIENTS, TEST, _files, _same_metrics, job

import fedray
from fedray.api import prepare
from fedray.config import load_config, typed
from fedray.errors import ConfigError, PartError
from fedray.runtime import handover
from fedray.runtime.handover import HandOver, local_resources, ray_from_the_start
from fedray.state.run_dir import SERVER_STATE_FILE, load_tensors
from fedray.tracking.callbacks import Callback


class _Seen(Callback):
    """What the run's callbacks were told, in order."""

    def __init__(self):
        self.events: list = []

    def on_run_start(self, info):
        self.events.append("start")

    def on_round_end(self, round, metrics, weights):
        self.events.append(round)

    def on_run_end(self, summary):
        self.events.append("end")

    def on_run_failed(self, exc):
        self.events.append(f"failed: {exc}")


def _auto(tmp_path, name: str, limit_s: float, callbacks=(), **kw) -> fedray.RunResult:
    j = job(tmp_path, name, "auto", **kw)
    j["runtime"]["auto_inline_s"] = limit_s
    return fedray.run(j, model_fn=fixed_linear()[0], client_data=CLIENTS, test_data=TEST,
                      callbacks=list(callbacks))


def _runtime(**runtime):
    return typed(load_config({"runtime": runtime})).runtime


def test_the_rule_projects_the_rounds_left_at_the_pace_so_far():
    said: list[str] = []
    rule = HandOver(rounds=10, limit_s=20.0, note=said.append)
    assert not rule.due(1, 2.0)  # 9 rounds left at 2.0 s: 18 s, within 20
    assert said == []
    assert rule.due(2, 4.0)  # 8 left at the mean 3.0 s: 24 s
    assert said == ["runtime.backend=auto: rounds took 3.0 s each in this process; the 8 "
                    "left (about 24 s at that pace, more than runtime.auto_inline_s=20) go "
                    "to Ray's workers"]
    # the last round leaves nothing to hand over, however slow
    assert not HandOver(rounds=3, limit_s=0.0).due(3, 100.0)
    assert HandOver(rounds=3, limit_s=0.0).due(1, 0.001)


def test_auto_starts_on_ray_where_ray_is_the_point(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(is_initialized=lambda: False))

    def why(**runtime) -> str | None:
        return ray_from_the_start(_runtime(**runtime))

    assert why() is None
    assert why(address="10.0.0.1:6379") == "runtime.address names a cluster"
    assert why(worker={"num_gpus": 0.5}) == "runtime.worker.num_gpus asks for GPU workers"
    assert why(dashboard=True) == "runtime.dashboard asks for Ray's dashboard"
    assert why(worker_timeout_s=60) == "runtime.worker_timeout_s times out Ray workers"
    monkeypatch.setenv("RAY_ADDRESS", "local")  # a private Ray: as if unset
    assert why() is None
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")  # Ray Jobs' entrypoint
    assert why() == "RAY_ADDRESS names a cluster"
    monkeypatch.delenv("RAY_ADDRESS")
    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(is_initialized=lambda: True))
    assert why() == "Ray is already running in this process"
    monkeypatch.delitem(sys.modules, "ray")  # never imported: not running
    assert why() is None


def test_the_first_rounds_have_the_workers_a_private_ray_would():
    assert local_resources(_runtime(num_cpus=6)) == {"CPU": 6.0, "GPU": 0.0}
    assert local_resources(_runtime()) == {"CPU": float(os.cpu_count()), "GPU": 0.0}


@pytest.mark.parametrize("algorithm", [{"name": "fedavg"}, {"name": "scaffold"}],
                         ids=["fedavg", "scaffold"])
def test_a_handed_over_run_equals_a_run_on_ray_bit_for_bit(ray_cluster, tmp_path, monkeypatch,
                                                            algorithm):
    on_ray = fedray.run(job(tmp_path, "ray", "ray", algorithm=algorithm, rounds=4),
                        model_fn=fixed_linear()[0], client_data=CLIENTS, test_data=TEST)
    # as in a process where Ray is not running yet: the run starts here, then joins the
    # session's Ray (as it would start its own)
    monkeypatch.setattr(handover, "ray_from_the_start", lambda runtime: None)
    seen = _Seen()
    auto = _auto(tmp_path, "auto", 0.0, [seen], algorithm=algorithm, rounds=4)
    assert auto.summary["handed_over_after_round"] == 1
    assert auto.summary["resumed_from_round"] is None
    assert on_ray.summary["handed_over_after_round"] is None
    assert os.getpid() not in {w["pid"] for w in auto.summary["workers"]}  # Ray's workers
    assert auto.summary["total_s"] >= sum(m["wall_s"] for m in auto.metrics)
    assert seen.events == ["start", 1, 2, 3, 4, "end"]  # one run, as the callbacks see it
    for k in on_ray.weights:
        assert torch.equal(auto.weights[k], on_ray.weights[k]), k
    assert not torch.equal(on_ray.weights["weight"],
                           torch.from_numpy(fixed_linear()[1]).float())  # the model moved
    _same_metrics(auto.metrics, on_ray.metrics)
    assert [m["round"] for m in auto.metrics] == [1, 2, 3, 4]
    a, b = (load_tensors(r.run_dir, SERVER_STATE_FILE) for r in (auto, on_ray))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    if algorithm["name"] == "scaffold":
        files = [_files(os.path.join(r.run_dir, "client_state")) for r in (auto, on_ray)]
        assert files[0] == files[1] != {}  # every client's every state version


def test_a_short_run_stays_in_this_process(tmp_path, monkeypatch):
    monkeypatch.setattr(handover, "ray_from_the_start", lambda runtime: None)
    import ray

    def refuse(*args, **kwargs):
        raise AssertionError("a short auto run called Ray")

    for name in ("init", "put", "get", "remote"):
        monkeypatch.setattr(ray, name, refuse)
    result = _auto(tmp_path, "short", 3600.0, rounds=2)
    assert {w["pid"] for w in result.summary["workers"]} == {os.getpid()}
    assert result.summary["num_workers"] == 2 and result.summary["handed_over_after_round"] is None


def test_a_part_error_is_one_line_as_on_ray(tmp_path, monkeypatch):
    """Only ``inline``, the debugging backend, lets a part's exception out as itself."""
    monkeypatch.setattr(handover, "ray_from_the_start", lambda runtime: None)
    part = tmp_path / "boom.py"
    part.write_text("from fedray.algorithms.base import ClientWork\n\n\n"
                    "class Boom(ClientWork):\n"
                    "    def terms(self, env, ctx):\n"
                    "        raise ValueError('boom')\n")
    with pytest.raises(PartError, match="boom"):
        _auto(tmp_path, "boom", 3600.0, algorithm={"name": "fedavg", "client": f"{part}:Boom"})


def test_a_hand_over_that_fails_tells_the_callbacks_once(tmp_path, monkeypatch):
    import fedray.api

    monkeypatch.setattr(handover, "ray_from_the_start", lambda runtime: None)

    def no_ray(*args, **kwargs):
        raise RuntimeError("Ray did not start")

    monkeypatch.setattr(fedray.api, "_run_ray", no_ray)
    seen = _Seen()
    with pytest.raises(RuntimeError, match="Ray did not start"):
        _auto(tmp_path, "cut", 0.0, [seen], rounds=3)
    assert seen.events == ["start", 1, "failed: Ray did not start"]


def test_bad_backend_keys_are_one_line(tmp_path):
    with pytest.raises(ConfigError) as info:
        prepare(job(tmp_path, "x", "local"), client_data=CLIENTS)
    assert str(info.value) == ("config key 'runtime.backend': must be auto, ray or inline, "
                               "got 'local'")
    j = job(tmp_path, "x", "auto")
    j["runtime"]["auto_inline_s"] = -1
    with pytest.raises(ConfigError) as info:
        prepare(j, client_data=CLIENTS)
    assert str(info.value) == "config key 'runtime.auto_inline_s': must be >= 0, got -1.0"
