"""Faults: a worker killed mid-round, the retry budget, and the `fedray run` process killed
and resumed. Every check is against an unfaulted run of the same job: bit-identical."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml
from conftest import tiny_job

import fedray
from fedray.errors import FedrayError
from fedray.state.checkpoint import read_checkpoint
from fedray.state.client_state import ClientStateStore
from fedray.state.run_dir import load_weights, read_metrics


def suicidal_model_fn(sentinel: str | None, at_call: int = 5):
    """Logistic regression for the synthetic 28x28 writers whose process SIGKILLs itself at
    its ``at_call``-th training forward pass -- once per test: the first worker to get there
    claims ``sentinel``. With ``sentinel=None`` it is the same model, never killed."""
    def model_fn():  # a closure: shipped to the workers by value
        from torch import nn

        torch.manual_seed(0)
        model = nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 62))
        calls = [0]

        def hook(module, inputs):
            calls[0] += 1
            if sentinel is None or not module.training or calls[0] != at_call:
                return
            try:
                os.close(os.open(sentinel, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return
            os.kill(os.getpid(), signal.SIGKILL)

        model.register_forward_pre_hook(hook)
        return model
    return model_fn


def _job(tmp_path, name: str, **over) -> dict:
    return tiny_job(tmp_path, **{"name": name, "rounds": 4, "runtime__num_workers": 2,
                                 "output__dir": str(tmp_path / name), **over})


# buffered asynchronous training (FedBuff) on the simulated clock: a round's clients come
# in one task per (worker, start version), each re-run alone when its worker dies
BUFFERED = {"clock__enabled": True, "sampling__concurrency": 12,
            "algorithm__name": "fedbuff"}


@pytest.mark.usefixtures("ray_cluster")
@pytest.mark.parametrize("mode", [{}, BUFFERED], ids=["rounds", "buffered"])
def test_worker_killed_mid_round_gives_the_unfaulted_weights(tmp_path, mode):
    sentinel = tmp_path / "killed"
    # the unfaulted run inline, in this process: Ray's bit for bit at the same worker count
    # (tests/runtime/test_inline.py), without starting a driver and 2 workers for it
    clean = fedray.run(_job(tmp_path, "clean", runtime__backend="inline", **mode),
                       model_fn=suicidal_model_fn(None))
    faulted = fedray.run(_job(tmp_path, "faulted", **mode),
                         model_fn=suicidal_model_fn(str(sentinel), at_call=7))
    assert sentinel.exists()  # a worker really died mid-round
    failures = [m["worker_failures"] for m in faulted.metrics]
    assert sum(failures) == 1 and faulted.summary["worker_failures"] == 1
    assert [m["worker_failures"] for m in clean.metrics] == [0] * 4
    for k, v in clean.weights.items():
        assert torch.equal(v, faulted.weights[k]), k
    # no client update was lost: every participant's update was aggregated
    assert [m["updates"] for m in faulted.metrics] == [m["clients"] for m in clean.metrics]


@pytest.mark.usefixtures("ray_cluster")
def test_spent_retry_budget_names_the_clients_and_keeps_the_checkpoint(tmp_path):
    sentinel = tmp_path / "killed"
    # 8 clients per round on 2 workers of 1-2 forward passes per client: call 30 is in round 2
    job = _job(tmp_path, "spent", runtime__max_retries=0, checkpoint__every=1)
    with pytest.raises(FedrayError) as err:
        fedray.run(job, model_fn=suicidal_model_fn(str(sentinel), at_call=30))
    msg = str(err.value)
    assert sentinel.exists()
    assert "died" in msg and "runtime.max_retries=0" in msg and ": clients [" in msg
    failed_round = int(msg.split(":")[0].removeprefix("round "))
    assert failed_round >= 2
    ckpt = read_checkpoint(str(tmp_path / "spent"))
    assert ckpt is not None and ckpt.round == failed_round - 1
    assert [m["round"] for m in read_metrics(str(tmp_path / "spent"))] == list(
        range(1, failed_round))


def _cli(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "fedray.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kw)


def _finish(proc: subprocess.Popen) -> str:
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out
    return out


@pytest.mark.parametrize("algorithm", ["fedavg", "scaffold"])
def test_sigkilled_run_resumes_bit_identically(ray_cluster, tmp_path, algorithm):
    # the CLI runs join this session's Ray (saves starting one per run); killing the CLI
    # process kills its driver actor and the workers with it, as losing the head's driver would
    gcs = ray_cluster.get_runtime_context().gcs_address
    job = tiny_job(tmp_path, name=algorithm, rounds=40, checkpoint__every=4,
                   algorithm__name=algorithm, runtime__address=gcs, runtime__num_workers=2,
                   eval__every=0)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    # the uninterrupted run inline, in this process: 2 workers, as the CLI's run has, so the
    # same sums (inline is Ray's bit for bit at the same worker count:
    # tests/runtime/test_inline.py), without starting a driver and 2 workers for it
    fedray.run(str(path), overrides=[f"output.dir={whole}", "runtime.backend=inline"])
    proc = _cli("run", str(path), f"output.dir={killed}", "--quiet", start_new_session=True)
    metrics = killed / "metrics.jsonl"
    deadline = time.monotonic() + 180
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 6):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)  # the CLI process, mid-run
    proc.wait()
    assert not (killed / "summary.json").exists()
    ckpt = read_checkpoint(str(killed))
    assert ckpt is not None and 4 <= ckpt.round < 40
    out = _finish(_cli("run", "--resume", str(killed), "--quiet"))
    assert "done: 40 rounds" in out
    a, b = load_weights(str(whole)), load_weights(str(killed))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [m["round"] for m in read_metrics(str(killed))] == list(range(1, 41))
    if algorithm == "scaffold":  # one version per client left: the one the index points to
        versions = ClientStateStore(str(killed / "client_state")).versions()
        final = read_checkpoint(str(killed)).client_versions
        assert versions and all(vs == [int(final[c])] for c, vs in versions.items())
        assert versions == ClientStateStore(str(whole / "client_state")).versions()


@pytest.mark.usefixtures("ray_cluster")
def test_a_finished_run_extended_with_allow_change_equals_a_longer_run(tmp_path):
    # the longer run inline (Ray's bit for bit at the same worker count:
    # tests/runtime/test_inline.py); the short one and its extension on Ray
    long = fedray.run(_job(tmp_path, "long", rounds=5, algorithm__name="scaffold",
                           runtime__backend="inline"))
    short = _job(tmp_path, "short", rounds=3, algorithm__name="scaffold")
    fedray.run(short)
    with pytest.raises(FedrayError, match=r"config.yaml in rounds \(3 -> 5\)"):
        fedray.run(resume=str(tmp_path / "short"), overrides=["rounds=5"])
    more = fedray.run(resume=str(tmp_path / "short"), overrides=["rounds=5"],
                      allow_changes=["rounds"])
    assert more.summary["resumed_from_round"] == 3 and [m["round"] for m in more.metrics] == [4, 5]
    assert all(torch.equal(long.weights[k], more.weights[k]) for k in long.weights)
    assert "rounds: 5" in (tmp_path / "short" / "config.yaml").read_text()


def test_pool_gives_a_dead_slot_to_a_survivor_when_no_worker_can_start(monkeypatch):
    from fedray.runtime import pool

    def no_room(*args, **kwargs):
        raise FedrayError("only 0 of 1 workers started within 60s")

    monkeypatch.setattr(pool, "create_workers", no_room)
    p = pool.WorkerPool.__new__(pool.WorkerPool)
    p.workers, p._spec_ref, p._resources, p.replace_timeout_s = ["a", "b", "c"], None, (1, 0), 1
    p._replace(2)
    assert p.workers == ["a", "b", "a"]


def test_pool_info_reports_a_worker_lost_after_the_last_round(ray_cluster):
    """The summary asks every worker where it ran; one that died after the last round (the
    soak test's killer can land there) is reported dead, not raised as the run's failure."""
    from fedray.runtime import pool

    @ray_cluster.remote(num_cpus=0)
    class Worker:
        def info(self) -> dict:
            return {"pid": os.getpid()}

    alive, dead = Worker.remote(), Worker.remote()
    ray_cluster.get(dead.info.remote())
    ray_cluster.kill(dead)
    # ray.kill returns before the actor is gone (it answered once more under load): wait
    deadline = time.monotonic() + 30
    while True:
        try:
            ray_cluster.get(dead.info.remote(), timeout=10)
        except ray_cluster.exceptions.RayActorError:
            break
        assert time.monotonic() < deadline, "the killed actor still answers"
        time.sleep(0.1)
    p = pool.WorkerPool.__new__(pool.WorkerPool)
    p.workers = [alive, dead]
    got = p.info()
    assert "pid" in got[0] and got[1] == {"dead": True, "error": "ActorDiedError"}


def test_soak_script_counts_kills_reruns_and_lost_updates(ray_cluster, tmp_path, monkeypatch):
    """benchmarks/soak.py, short: it must kill workers and find every update aggregated.

    Its main() runs in this process on the session's Ray, the script's own ray.init and
    ray.shutdown made no-ops, rather than in a process of its own that starts a Ray: its
    killer finds the workers among this process's descendants all the same."""
    import importlib.util
    import json
    import pathlib

    script = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "soak.py"
    monkeypatch.setattr(sys, "path", list(sys.path))  # the script puts the repository first
    spec = importlib.util.spec_from_file_location("soak", script)
    soak = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(soak)
    monkeypatch.setattr(ray_cluster, "init", lambda **kwargs: None)
    monkeypatch.setattr(ray_cluster, "shutdown", lambda: None)
    out = tmp_path / "soak.json"
    assert soak.main(["--rounds", "20", "--kill-every", "6", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["kills"] >= 2 and r["worker_failures_rerun"] >= r["kills"]
    assert r["lost"] == 0 and r["client_updates"] == 20 * 8 and r["weights_bit_identical"]
