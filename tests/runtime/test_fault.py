"""Faults: a worker killed mid-round, the retry budget, and the `fedray run` process killed
and resumed. Every check is against an unfaulted run of the same job: bit-identical."""

from __future__ import annotations

import contextlib
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


def suicidal_model_fn(sentinel: str | None, at_call: int = 5, sig: int = signal.SIGKILL):
    """Logistic regression for the synthetic 28x28 writers whose process SIGKILLs itself (or
    sends itself ``sig``: SIGSTOP freezes it) at its ``at_call``-th training forward pass --
    once per test: the first worker to get there claims ``sentinel``. With
    ``sentinel=None`` it is the same model, never killed."""
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
            os.kill(os.getpid(), sig)

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
def test_frozen_worker_times_out_and_its_clients_rerun_bit_identically(tmp_path):
    """A worker that freezes mid-round (SIGSTOP: no error, no exit) is, past
    runtime.worker_timeout_s, killed and treated as dead: its clients re-run elsewhere, and
    the run ends with the unfaulted weights. Without the timeout the round waits forever."""
    sentinel = tmp_path / "froze"  # not "frozen": the run directory
    clean = fedray.run(_job(tmp_path, "clean", runtime__backend="inline"),
                       model_fn=suicidal_model_fn(None))
    frozen = fedray.run(_job(tmp_path, "frozen", runtime__worker_timeout_s=8.0),
                        model_fn=suicidal_model_fn(str(sentinel), at_call=7, sig=signal.SIGSTOP))
    assert sentinel.exists()  # a worker really froze mid-round
    assert frozen.summary["worker_failures"] >= 1  # >1 only if a loaded machine was slow too
    for k, v in clean.weights.items():
        assert torch.equal(v, frozen.weights[k]), k
    assert [m["updates"] for m in frozen.metrics] == [m["clients"] for m in clean.metrics]


def test_a_timed_out_worker_past_the_retry_budget_is_named(monkeypatch):
    from fedray.runtime import pool

    p = pool.WorkerPool.__new__(pool.WorkerPool)
    p.workers, p.max_retries, p.timeout_s = ["a", "b"], 0, 2.5
    p.failures = p.round_failures = 0
    with pytest.raises(FedrayError, match=r"^round 3: clients \[4, 1\]: worker 1 gave no result "
                       r"within runtime.worker_timeout_s=2.5s and runtime.max_retries=0 "
                       r"re-runs this round are spent$"):
        p._failed(p._timeout(), 1, "round 3: clients [4, 1]")


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
    if algorithm == "scaffold":  # what is left: the packs that hold a current state, and
        # exactly the uninterrupted run's (a pack goes once none of its states is current)
        store = ClientStateStore(str(killed / "client_state"))
        versions, final = store.versions(), read_checkpoint(str(killed)).client_versions
        assert versions and all(int(final[c]) in vs for c, vs in versions.items())
        live = final.live_packs()
        assert store.packs() == sorted(live) and sum(live.values()) == len(versions)
        other = ClientStateStore(str(whole / "client_state"))
        assert versions == other.versions() and store.packs() == other.packs()


@pytest.mark.usefixtures("ray_cluster")
def test_a_finished_run_extended_with_allow_change_equals_a_longer_run(tmp_path):
    # the longer run inline (Ray's bit for bit at the same worker count:
    # tests/runtime/test_inline.py); the short one and its extension on Ray
    long = fedray.run(_job(tmp_path, "long", rounds=5, algorithm__name="scaffold",
                           runtime__backend="inline"))
    short = _job(tmp_path, "short", rounds=3, algorithm__name="scaffold")
    fedray.run(short)
    with pytest.raises(FedrayError, match=r"differs from the run.s checkpoint \(after round "
                       r"3\) in rounds \(3 -> 5\)"):
        fedray.run(resume=str(tmp_path / "short"), overrides=["rounds=5"])
    more = fedray.run(resume=str(tmp_path / "short"), overrides=["rounds=5"],
                      allow_changes=["rounds"])
    assert more.summary["resumed_from_round"] == 3 and [m["round"] for m in more.metrics] == [4, 5]
    assert all(torch.equal(long.weights[k], more.weights[k]) for k in long.weights)
    assert "rounds: 5" in (tmp_path / "short" / "config.yaml").read_text()


def _ray_processes(pid: int) -> dict[int, str]:
    """pid: program (or Ray's process title) of process ``pid``'s descendants."""
    import psutil

    out = {}
    for p in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.Error, IndexError):
            out[p.pid] = p.cmdline()[0]
    return out


def _until_rounds(proc: subprocess.Popen, run, rounds: int) -> None:
    metrics = run / "metrics.jsonl"
    deadline = time.monotonic() + 180
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= rounds):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)


def _one_error_line(proc: subprocess.Popen, killed_at: float) -> tuple[str, float]:
    """The one `fedray: error: ...` line a faulted run ends with, and its exit's delay."""
    out, err = proc.communicate(timeout=120)
    took = time.monotonic() - killed_at
    assert proc.returncode == 2, (out, err)
    assert "Traceback" not in err, err
    errors = [ln for ln in err.splitlines() if ln.startswith("fedray: error:")]
    assert len(errors) == 1 and err.rstrip().splitlines()[-1] == errors[0], err
    return errors[0], took


# what is killed: the program (Ray's process title) of the process, and what the line says
RAY_PARTS = {"raylet": ("raylet", "fedray's private Ray failed: its raylet (process "),
             "gcs": ("gcs_server", "fedray's private Ray failed: its GCS server (process ")}


@pytest.mark.cluster
@pytest.mark.parametrize("part", sorted(RAY_PARTS))
def test_private_ray_dying_under_a_run_ends_it_in_one_line(tmp_path, part):
    """SIGKILL of the private Ray's raylet or GCS server during `fedray run`: within seconds
    one line naming what died, the checkpoint that is intact and the command that continues
    from it; no traceback, nothing of that Ray left running. Before, a dead raylet surfaced
    a quarter of a minute later as a raw ActorDiedError after pages of its log, and a dead
    GCS left the run going until the raylet gave up on it."""
    program, says = RAY_PARTS[part]
    # backend ray: the private Ray whose part is killed must exist; under auto a fast
    # machine could finish these tiny rounds in the CLI's process without ever starting it
    job = tiny_job(tmp_path, name=part, rounds=400, eval__every=0, checkpoint__every=1,
                   runtime__num_cpus=1, runtime__num_workers=1, runtime__backend="ray")
    path, run = tmp_path / "job.yaml", tmp_path / "run"
    path.write_text(yaml.safe_dump(job))
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen([sys.executable, "-m", "fedray.cli", "run", str(path), "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        _until_rounds(proc, run, 2)
        ray_procs = _ray_processes(proc.pid)
        target = next(pid for pid, prog in ray_procs.items() if prog.endswith(f"/{program}"))
        os.kill(target, signal.SIGKILL)
        killed_at = time.monotonic()
        line, took = _one_error_line(proc, killed_at)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    ckpt = read_checkpoint(str(run))
    assert ckpt is not None
    assert line == (f"fedray: error: {says}{target}) died; its checkpoint after round "
                    f"{ckpt.round} is intact; continue with: fedray run --resume {run}"), line
    assert took < 30, took  # about 3 s on an idle 2-core machine (docs/fault_tolerance.md)
    deadline = time.monotonic() + 15  # the rest of that Ray ended with it
    while any(_alive(pid) for pid in ray_procs):
        assert time.monotonic() < deadline, {p: ray_procs[p] for p in ray_procs if _alive(p)}
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.mark.cluster
def test_driver_actor_killed_under_a_run_ends_it_in_one_line(ray_cluster, tmp_path):
    """SIGKILL of the driver actor's process (as Ray's memory monitor or the kernel's OOM
    killer would) during `fedray run` on a cluster it joined (this session's Ray): one line
    naming it, the intact checkpoint and the resume command; before, a raw RayActorError
    traceback."""
    import psutil

    gcs = ray_cluster.get_runtime_context().gcs_address
    job = tiny_job(tmp_path, name="driver", rounds=400, eval__every=0, checkpoint__every=1,
                   runtime__address=gcs, runtime__num_workers=1)
    path, run = tmp_path / "job.yaml", tmp_path / "run"
    path.write_text(yaml.safe_dump(job))
    proc = subprocess.Popen([sys.executable, "-m", "fedray.cli", "run", str(path), "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _until_rounds(proc, run, 2)
        # this session's Ray runs the CLI's actors: its driver is among this process's
        driver = next(pid for pid, prog in _ray_processes(os.getpid()).items()
                      if prog.startswith("ray::Driver"))
        psutil.Process(driver).kill()
        line, took = _one_error_line(proc, time.monotonic())
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    ckpt = read_checkpoint(str(run))
    assert ckpt is not None
    assert line.startswith("fedray: error: the driver actor died (ActorDiedError: "), line
    assert line.endswith(f"; its checkpoint after round {ckpt.round} is intact; continue "
                         f"with: fedray run --resume {run}"), line
    assert took < 30, took


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
