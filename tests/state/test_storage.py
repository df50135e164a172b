"""fedray.state.storage: URLs a user gives, and a run's exclusive claim on its directory."""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import subprocess
import sys

import psutil
import pytest

from fedray.errors import ConfigError
from fedray.state.storage import LOCK_FILE, RunClaim, filesystem


def test_unknown_protocol_missing_package_and_memory_name_the_key():
    with pytest.raises(ConfigError, match=r"^config key 'output.dir': nosuchproto://b/r: fsspec "
                       r"knows no protocol 'nosuchproto'$"):
        filesystem("nosuchproto://b/r", "output.dir")
    with pytest.raises(ConfigError, match=r"^recipe key 'out': cannot open s3://b/x: Install "
                       r"s3fs"):
        filesystem("s3://b/x", "out", what="recipe")
    with pytest.raises(ConfigError, match=r"memory://x/y is in this process's memory"):
        filesystem("memory://x/y", "output.dir", durable=True)
    filesystem("memory://x/y", "output.dir")  # in-process use (tests, reports) is fine


def test_claim_creates_and_releases(tmp_path):
    url = str(tmp_path / "a" / "b" / "run")
    claim = RunClaim(url)
    claim.acquire(new=True)
    owner = json.loads((tmp_path / "a/b/run" / LOCK_FILE).read_text())
    assert owner["pid"] == os.getpid() and owner["host"] == socket.gethostname()
    with pytest.raises(ConfigError, match=r"is in use by another run \(pid \d+ on .*\); if that "
                       r"run is gone, delete .*/run/\.fedray\.lock"):
        RunClaim(url).acquire(new=True)
    with pytest.raises(ConfigError, match="is in use by another run"):
        RunClaim(url).acquire(new=False)  # a resume of a run that is still going
    claim.release()
    assert list((tmp_path / "a/b/run").iterdir()) == []


def test_discard_removes_what_the_claim_made_and_nothing_else(tmp_path):
    (tmp_path / "keep").mkdir()
    claim = RunClaim(str(tmp_path / "keep" / "x" / "run"))
    claim.acquire(new=True)
    (tmp_path / "keep" / "x" / "run" / "config.yaml").write_text("a: 1\n")
    claim.discard()
    assert list((tmp_path / "keep").iterdir()) == []  # x/ was made by the claim: gone too
    claim = RunClaim(str(tmp_path / "keep"))  # an existing, empty directory stays
    claim.acquire(new=True)
    claim.discard()
    assert (tmp_path / "keep").is_dir() and list((tmp_path / "keep").iterdir()) == []


def test_discard_never_removes_what_the_run_did_not_write(tmp_path):
    """A new run that fails removes its own files only: a file a user put into its
    directory stays (with the directory), and a parent the claim made stays while another
    run's directory is in it (before: removed recursively, the other run's files with it)."""
    a = RunClaim(str(tmp_path / "new" / "a"))
    a.acquire(new=True)  # made new/ and new/a/
    b = RunClaim(str(tmp_path / "new" / "b"))
    b.acquire(new=True)  # another run, beside it
    (tmp_path / "new" / "b" / "config.yaml").write_text("b: 1\n")
    for name in ("config.yaml", "events.out.tfevents.fedray", ".config.yaml.x1.tmp"):
        (tmp_path / "new" / "a" / name).write_text("a\n")
    (tmp_path / "new" / "a" / "client_state").mkdir()
    (tmp_path / "new" / "a" / "notes.txt").write_text("mine\n")  # the user's
    a.discard()
    assert sorted(os.listdir(tmp_path / "new" / "a")) == ["notes.txt"]
    assert sorted(os.listdir(tmp_path / "new" / "b")) == [LOCK_FILE, "config.yaml"]
    (tmp_path / "new" / "a" / "notes.txt").unlink()
    b.discard()
    assert sorted(os.listdir(tmp_path / "new")) == ["a"]  # b's own directory went with it
    assert (tmp_path / "new" / "a").is_dir()  # emptied by the user, not by a claim


def test_run_writes_are_the_names_runs_write():
    from fedray.state.checkpoint import CHECKPOINT_FILE, CONFIG_FILE
    from fedray.state.run_dir import (
        CLIENT_EVAL_DIR,
        CLIENT_STATE_DIR,
        SERVER_STATE_FILE,
        WEIGHTS_FILE,
    )
    from fedray.state.storage import RUN_WRITES
    from fedray.tracking.tensorboard import EVENTS_FILE

    assert {CHECKPOINT_FILE, CONFIG_FILE, CLIENT_EVAL_DIR, CLIENT_STATE_DIR, SERVER_STATE_FILE,
            WEIGHTS_FILE, EVENTS_FILE, "metrics.jsonl", "summary.json", "wandb"} == \
        set(RUN_WRITES)


def _lock(run, pid: int, started: float) -> None:
    run.mkdir(exist_ok=True)
    (run / LOCK_FILE).write_text(json.dumps({"host": socket.gethostname(), "pid": pid,
                                             "pid_started": started, "started": 0.0,
                                             "token": "other"}))


def test_a_killed_runs_lock_is_taken_over_on_resume_a_live_ones_is_not(tmp_path):
    run = tmp_path / "run"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    started = psutil.Process(dead.pid).create_time()
    dead.wait()
    _lock(run, dead.pid, started)
    (run / "config.yaml").write_text("a: 1\n")
    with pytest.raises(ConfigError, match="already holds files"):
        RunClaim(str(run)).acquire(new=True)
    claim = RunClaim(str(run))
    claim.acquire(new=False)  # the process is gone: the lock is stale
    assert json.loads((run / LOCK_FILE).read_text())["pid"] == os.getpid()
    claim.release()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        _lock(run, live.pid, psutil.Process(live.pid).create_time())
        with pytest.raises(ConfigError, match=f"in use by another run \\(pid {live.pid}"):
            RunClaim(str(run)).acquire(new=False)
    finally:
        live.kill()
        live.wait()
    assert (run / "config.yaml").read_text() == "a: 1\n"  # refusals change nothing


def _race(url: str, barrier, results) -> None:
    barrier.wait()
    try:
        RunClaim(url).acquire(new=True)
        results.put("won")
    except ConfigError as exc:
        results.put(str(exc))


def test_of_runs_started_together_exactly_one_claims_the_directory(tmp_path):
    """The claim is an exclusive create, not a check followed by a write: of eight processes
    released at the same instant, one wins and seven are told the directory is taken."""
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(8), ctx.Queue()
    url = str(tmp_path / "run")
    procs = [ctx.Process(target=_race, args=(url, barrier, results)) for _ in range(8)]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join()
    assert outcomes.count("won") == 1, outcomes
    assert all("in use by another run" in o or "already holds files" in o
               for o in outcomes if o != "won")
