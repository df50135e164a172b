"""fedray partition claims ``out`` and never deletes what it did not write (issue 39, item 1).

Each race is made deterministic with a hook inside the first build: the second build, or
the user's file, arrives exactly while the first one is writing."""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys

import numpy as np
import pytest

from fedray import cli
from fedray.data.dataset import Dataset
from fedray.data.examples import Split
from fedray.data.partition import Partition
from fedray.data.store import writer
from fedray.data.store.reader import StoreSource
from fedray.data.store.writer import write_store
from fedray.errors import FedrayError
from fedray.state.storage import LOCK_FILE

ROOT = pathlib.Path(__file__).resolve().parents[2]
RECIPE = str(ROOT / "partitions" / "synthetic_dirichlet.yaml")
SMALL = ["source.num_writers=5", "partitioner.num_clients=10"]


def _partition(out, capsys) -> tuple[int, list[str]]:
    """`fedray partition` (the CLI's main, in this process): exit code and stderr lines."""
    capsys.readouterr()
    code = cli.main(["partition", RECIPE, *SMALL, f"out={out}", "--quiet"])
    return code, capsys.readouterr().err.splitlines()


def _during_build(monkeypatch, action) -> list:
    """Call ``action()`` once, while the first shard of the next build is being written
    (after ``out`` is claimed, before the store moves into place); returns its results."""
    seen: list = []
    real = writer.StoreWriter._write_shard

    def write_shard(self, *args, **kwargs):
        real(self, *args, **kwargs)
        if not seen:
            seen.append(None)
            seen.append(action())

    monkeypatch.setattr(writer.StoreWriter, "_write_shard", write_shard)
    return seen


def _siblings(tmp_path) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir())


def test_two_partitions_to_one_out_exactly_one_succeeds(tmp_path, capsys, monkeypatch):
    """The second build starts while the first is writing: it is refused in one line naming
    the first; the first's store is whole. (Before the claim both printed "done", and the
    first removed the second's store to put its own in place.)"""
    out = tmp_path / "x"
    second = _during_build(monkeypatch, lambda: _partition(out, capsys))
    code, err = _partition(out, capsys)
    assert code == 0, err
    code2, err2 = second[1]
    assert code2 == 2, err2
    assert err2 == [f"fedray: error: recipe key 'out': {out} is in use by another partition "
                    f"(pid {os.getpid()} on {socket.gethostname()}, since "
                    f"{err2[0].split('since ')[1].split(')')[0]}); if that partition is gone, "
                    f"delete {out}/{LOCK_FILE}"]
    assert StoreSource(str(out)).population == 10
    assert LOCK_FILE not in os.listdir(out)  # the lock went with the move
    assert _siblings(tmp_path) == ["x"]  # no temporary or set-aside directory left


def test_two_concurrent_cli_processes_exactly_one_succeeds(tmp_path):
    """Two real `fedray partition` processes started together: one exit 0, one exit 2 with
    one line (in use; already exists, if the first had finished before the second began; or,
    if the second claimed `out` in the instant between the first's two final renames, the
    first is the one refused: made again)."""
    out = tmp_path / "x"
    cmd = [sys.executable, "-m", "fedray.cli", "partition", RECIPE, *SMALL, f"out={out}",
           "--quiet"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    err = next(e for code, e in results if code == 2)
    assert err.count("\n") == 1 and err.startswith(f"fedray: error: recipe key 'out': {out} ")
    assert any(why in err for why in ("is in use by another partition", "already exists",
                                      "was made again")), err
    assert StoreSource(str(out)).population == 10
    assert _siblings(tmp_path) == ["x"]


def test_a_file_put_into_out_during_the_build_survives(tmp_path, capsys, monkeypatch):
    """The user's file is kept, byte for byte; the build is refused in one line and leaves
    nothing of its own (no lock, no temporary directory). Before: the writer removed `out`
    with the file in it before moving its store there."""
    out = tmp_path / "x"
    out.mkdir()  # an empty directory the user made for the store: allowed

    def drop():
        (out / "notes.txt").write_text("mine\n")

    _during_build(monkeypatch, drop)
    code, err = _partition(out, capsys)
    assert code == 2 and len(err) == 1, err
    assert err[0] == (f"fedray: error: recipe key 'out': {out} received files while the store "
                      "was built (notes.txt); they were left as they were, and the store was "
                      "not written")
    assert (out / "notes.txt").read_text() == "mine\n"
    assert os.listdir(out) == ["notes.txt"]
    assert _siblings(tmp_path) == ["x"]


@pytest.mark.parametrize("how", ["object-store", "symlink"])
def test_file_by_file_placement_keeps_a_users_file_too(tmp_path, capsys, monkeypatch, how):
    """Where the directory cannot be renamed aside (an object store: forced here on a local
    path; a symlink, which must stay a symlink), the store's files are moved in one by one,
    only when ``out`` holds nothing but the lock: a file that arrived is kept and the build
    refused; without one, the store is whole, manifest last."""
    if how == "object-store":
        monkeypatch.setattr(writer, "is_local", lambda fs: False)
        out = tmp_path / "x"
    else:
        (tmp_path / "real").mkdir()
        out = tmp_path / "x"
        out.symlink_to(tmp_path / "real")
    code, err = _partition(out, capsys)
    assert code == 0, err
    assert StoreSource(str(out)).population == 10 and LOCK_FILE not in os.listdir(out)
    if how == "symlink":
        assert out.is_symlink() and (tmp_path / "real" / "manifest.json").exists()
    out2 = tmp_path / "y"
    if how == "symlink":
        (tmp_path / "real2").mkdir()
        out2.symlink_to(tmp_path / "real2")
    _during_build(monkeypatch, lambda: (out2 / "notes.txt").write_text("mine\n"))
    code, err = _partition(out2, capsys)
    assert code == 2 and len(err) == 1 and "received files while the store was built " \
        "(notes.txt)" in err[0], err
    assert sorted(os.listdir(out2)) == ["notes.txt"]
    assert (out2 / "notes.txt").read_text() == "mine\n"


def test_out_holding_someone_elses_files_is_refused_and_kept(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "data.csv").write_text("a,b\n")
    code, err = _partition(out, capsys)
    assert code == 2
    assert err == [f"fedray: error: recipe key 'out': {out} already holds files that are not a "
                   "partition store; choose a new or empty location (fedray partition never "
                   "removes files it did not write)"]
    assert os.listdir(out) == ["data.csv"]
    code, err = _partition(tmp_path / "mine" / "data.csv", capsys)  # a file
    assert code == 2 and err[0].endswith("already exists; choose a new location or remove it")


def _dataset():
    g = np.random.default_rng(0)
    x = g.random((60, 1, 2, 2), dtype=np.float32)
    return Dataset("toy", Split(x, g.integers(0, 3, 60)), None, num_classes=3)


def test_python_writer_claims_and_a_failed_write_leaves_nothing(tmp_path):
    """write_store (the Python path) claims the same way: refused while another holds the
    target; a failure after the claim removes the lock and the directory it made."""
    from fedray.data.store.writer import claim_store

    part = Partition([f"c{i}" for i in range(3)], np.array_split(np.arange(60), 3))
    held = claim_store(str(tmp_path / "s"))
    with pytest.raises(FedrayError, match="is in use by another partition"):
        write_store(str(tmp_path / "s"), _dataset(), part, recipe={})
    held.vacate()
    assert _siblings(tmp_path) == []
    bad = Partition(part.client_names, part.train, part.train)  # test data, no test split
    with pytest.raises(FedrayError, match="no test split"):
        write_store(str(tmp_path / "s"), _dataset(), bad, recipe={})
    assert _siblings(tmp_path) == []
    write_store(str(tmp_path / "s"), _dataset(), part, recipe={})
    assert StoreSource(str(tmp_path / "s")).population == 3


def test_a_killed_builds_lock_is_named_not_removed(tmp_path, capsys):
    """A build killed with SIGKILL leaves its lock (a process that is gone): the next build
    says so in one line and leaves it; once it is deleted, the build runs."""
    import json

    import psutil

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    started = psutil.Process(dead.pid).create_time()
    dead.wait()
    out = tmp_path / "x"
    out.mkdir()
    (out / LOCK_FILE).write_text(json.dumps({
        "host": socket.gethostname(), "pid": dead.pid, "pid_started": started, "started": 0.0,
        "token": "killed", "command": "fedray partition"}))
    code, err = _partition(out, capsys)
    assert code == 2 and err == [
        f"fedray: error: recipe key 'out': {out} holds only the lock of a build that ended "
        f"without removing it; if no fedray partition is writing there, delete {out}/{LOCK_FILE}"]
    assert os.listdir(out) == [LOCK_FILE]
    (out / LOCK_FILE).unlink()
    code, err = _partition(out, capsys)
    assert code == 0 and StoreSource(str(out)).population == 10
