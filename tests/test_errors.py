"""docs/errors.md, the catalogue of bad inputs, stays true: every row's command, run through
the real `fedray` entry point, fails with the documented one-line message and exit code, with
no traceback, and creates or changes no file."""

import concurrent.futures
import hashlib
import json
import os
import pathlib
import re
import shlex
import shutil
import socket
import struct
import subprocess
import sys

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet  # noqa: F401  (pa.parquet: the empty parquet file of a data row)
import pytest

from fedray.config import load_config, to_yaml
from fedray.data.recipe import build
from fedray.state.storage import LOCK_FILE

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "errors.md"
ROW = re.compile(r"^\| `([a-z0-9-]+)` \| (.+?) \| `(fedray [^`]*)` \| `([^`]+)` \| (\d+) \|$",
                 flags=re.M)
PY_ROW = re.compile(r"^\| `(python-[a-z0-9-]+)` \| (.+?) \| `(fedray\.run\(.*\))` \| `([^`]+)` \|$",
                    flags=re.M)


def _catalogue() -> tuple[dict[str, tuple[str, str, int]], dict[str, tuple[str, str]]]:
    """{id: (command, message, exit code)} from the doc's command table, and
    {id: (call, message)} from its Python table."""
    text = DOC.read_text()
    rows = {m[0]: (m[2], m[3], int(m[4])) for m in ROW.findall(text)}
    calls = {m[0]: (m[2], m[3]) for m in PY_ROW.findall(text)}
    table_lines = [ln for ln in text.splitlines() if ln.startswith("| `")]
    assert len(rows) + len(calls) == len(table_lines), "a row of docs/errors.md does not parse"
    return rows, calls


CATALOGUE, CALLS = _catalogue()


def _sweep_dirs(runs: pathlib.Path) -> None:
    """Sweep directories of jobs/sweeps/participation.yaml whose trials.json is not what
    its sweep.yaml gives: another trial (runs/sweep-edited), or not JSON (sweep-badrecord)."""
    from omegaconf import OmegaConf

    from fedray.cluster.sweep import load_sweep

    sweep, _ = load_sweep(str(ROOT / "jobs" / "sweeps" / "participation.yaml"))
    for name, record in (("sweep-edited", '{"trials": [{"trial": "seed=7", "params": '
                                          '{"seed": 7}, "status": "finished"}]}\n'),
                         ("sweep-badrecord", "{not json\n")):
        (runs / name).mkdir(parents=True)
        (runs / name / "sweep.yaml").write_text(OmegaConf.to_yaml(sweep))
        (runs / name / "trials.json").write_text(record)


def _template(base: pathlib.Path) -> None:
    """The directory every row's command runs in (a fresh copy each): the job and recipe
    files, and the stores, runs, reports and raw files the rows' preconditions name."""
    shutil.copytree(ROOT / "jobs", base / "jobs")
    shutil.copytree(ROOT / "partitions", base / "partitions")
    stores = base / "stores"
    build(ROOT / "partitions" / "synthetic_dirichlet.yaml",
          [f"out={stores / 'tiny'}", "source.num_writers=5", "partitioner.num_clients=10"])
    build(ROOT / "partitions" / "synthetic_dirichlet.yaml",  # clients 3 and 6 are empty
          [f"out={stores / 'sparse'}", "source.num_writers=5", "partitioner.num_clients=20",
           "partitioner.min_examples=0", "partitioner.alpha=0.01"])
    for name in ("nomanifest", "badjson", "corrupt"):
        shutil.copytree(stores / "tiny", stores / name)
    (stores / "nomanifest" / "manifest.json").unlink()
    (stores / "badjson" / "manifest.json").write_text("{not json\n")
    shard = stores / "corrupt" / "train-00000.arrow"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    run = base / "runs" / "old"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("name: old\nseed: 0\n")
    (run / "metrics.jsonl").write_text('{"round": 1, "test_accuracy": 0.5}\n')
    (run / "summary.json").write_text('{"rounds": 1}\n')
    prev = base / "runs" / "prev"  # a run to resume: its config.yaml as fedray wrote it
    prev.mkdir()
    cfg = load_config(ROOT / "jobs" / "quickstart.yaml", [f"output.dir={prev}"])
    (prev / "config.yaml").write_text(to_yaml(cfg))
    _checkpointed_runs(base / "runs")
    (base / "runs" / "envcfg").mkdir()  # the same, edited to read the environment
    (base / "runs" / "envcfg" / "config.yaml").write_text(
        to_yaml(cfg).replace("name: quickstart\n", "name: ${oc.env:HOME}\n", 1))
    (base / "reports" / "old").mkdir(parents=True)
    (base / "reports" / "old" / "report.md").write_text("| method |\n")
    (base / "notarun").mkdir()
    (base / "sweeps").mkdir()
    (base / "sweeps" / "typo.yaml").write_text(
        "job: ../jobs/quickstart.yaml\nparameters:\n  sampling.clients_per_rnd: [10, 20]\n")
    _sweep_dirs(base / "runs")
    _bad_stores(stores)
    _bad_data(base, stores)
    busy = base / "runs" / "busy"  # a run another process is writing: pid 1 holds its lock
    busy.mkdir()
    (busy / "config.yaml").write_text(to_yaml(cfg))
    (busy / LOCK_FILE).write_text(json.dumps({
        "host": socket.gethostname(), "pid": 1, "pid_started": psutil.Process(1).create_time(),
        "started": 0.0, "token": "another run"}))
    for target, command in ((stores / "busy", "fedray partition"),
                            (base / "runs" / "sweeping", "fedray sweep")):
        target.mkdir()  # what process 1 holds: a store it builds, a sweep it runs
        (target / LOCK_FILE).write_text(json.dumps({
            "host": socket.gethostname(), "pid": 1,
            "pid_started": psutil.Process(1).create_time(), "started": 0.0,
            "token": "another command", "command": command}))
    (base / "runs" / "badyaml").mkdir()
    (base / "runs" / "badyaml" / "config.yaml").write_text("name: x\nrounds: [1\n")
    for method in ("fedavg", "fedprox"):  # two methods that share a name
        run = base / "runs" / method
        run.mkdir()
        (run / "config.yaml").write_text(f"name: baseline\nseed: 0\nalgorithm:\n"
                                         f"  name: {method}\n")
        (run / "metrics.jsonl").write_text('{"round": 1, "test_accuracy": 0.5}\n')
    bad = base / "bad"
    bad.mkdir()
    (bad / "flow.yaml").write_text("name: x\nrounds: [1\nseed: 2\n")
    (bad / "dup.yaml").write_text("name: x\nseed: 1\nrounds: 2\nrounds: 3\n")
    (bad / "empty.yaml").write_text("# nothing but a comment\n")
    (bad / "ctl.yaml").write_text('name: "run\\x1b[2J"\nrounds: 2\n')  # an escape sequence
    (base / "ro" / "run").mkdir(parents=True)  # mounted read-only for the rows that need it
    (base / "small").mkdir()  # a 320 KiB file system for the full-disk row
    mnist = base / "raw" / "mnist"
    mnist.mkdir(parents=True)
    (mnist / "t10k-images-idx3-ubyte").write_bytes(struct.pack(">IIII", 0x803, 10000, 28, 28)
                                                   + bytes(4984))
    (mnist / "t10k-labels-idx1-ubyte").write_bytes(struct.pack(">II", 0x801, 10000)
                                                   + bytes(range(10)) * 1000)
    _leaf_shakespeare(base / "raw" / "leaf_shakespeare", short=False)
    _leaf_shakespeare(base / "raw" / "leaf_shakespeare_short", short=True)
    build(ROOT / "partitions" / "shakespeare.yaml",
          ["source.name=leaf_shakespeare", f"source.path={base / 'raw' / 'leaf_shakespeare'}",
           f"out={stores / 'shakespeare'}"])


def _checkpointed_runs(runs: pathlib.Path) -> None:
    """Two runs of jobs/quickstart.yaml with a checkpoint after round 1 (a header that
    records the run id and config, and a one-weight model: --resume refuses these before it
    reads any weights): ``edited``, whose config.yaml was changed by hand to client.lr=0.2,
    and ``foreign``, whose checkpoint was written by another run (another run id)."""
    import torch

    from fedray.api import with_algorithm
    from fedray.state.checkpoint import (
        CHECKPOINT_FILE,
        RUN_ID_LINE,
        Checkpoint,
        encode,
        recorded_config,
    )

    for name, run_id, writer, edits in (("edited", "a1" * 8, "a1" * 8, ["client.lr=0.2"]),
                                        ("foreign", "b2" * 8, "c3" * 8, [])):
        run = runs / name
        run.mkdir()
        job, out = ROOT / "jobs" / "quickstart.yaml", f"output.dir={run}"
        (run / "config.yaml").write_text(RUN_ID_LINE.format(run_id)
                                         + to_yaml(load_config(job, [out, *edits])))
        (run / CHECKPOINT_FILE).write_bytes(encode(Checkpoint(
            round=1, weights=torch.zeros(1), server_state={}, client_versions=None,
            metrics_lines=['{"round": 1}\n'], run_id=writer,
            config=recorded_config(with_algorithm(load_config(job, [out]))))))


def _leaf_shakespeare(root: pathlib.Path, short: bool) -> None:
    """LEAF's Shakespeare JSON for two roles (80-character windows and the next character);
    ``short``: HAMLET's second window is one character short."""
    text = "To be, or not to be, that is the Question: Whether 'tis Nobler in the minde to "
    text += "suffer the Slings and Arrowes of outragious Fortune"
    for split in ("train", "test"):
        users = {u: ([text[i:i + 80] for i in range(3)], [text[i + 80] for i in range(3)])
                 for u in ("HAMLET", "OPHELIA")}
        if short and split == "train":
            users["HAMLET"][0][1] = users["HAMLET"][0][1][:79]
        doc = {"users": list(users), "num_samples": [3, 3],
               "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()}}
        (root / split).mkdir(parents=True)
        (root / split / f"all_data_niid_0_keep_0_{split}_9.json").write_text(json.dumps(doc))


def _rewrite_shard(store: pathlib.Path, name: str, y: np.ndarray) -> None:
    """Replace the labels of a store's shard, and its checksum in the manifest: a store
    written with bad labels by something other than fedray, whose checksums still hold."""
    path = store / name
    with pa.memory_map(str(path)) as source:
        batch = pa.ipc.open_file(source).get_batch(0)
    batch = pa.record_batch([batch.column(0), pa.array(y, pa.int64())], schema=batch.schema)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, batch.schema) as writer:
        writer.write_batch(batch)
    data = sink.getvalue().to_pybytes()
    path.write_bytes(data)
    manifest = json.loads((store / "manifest.json").read_text())
    for shard in manifest["shards"]:
        if shard["file"] == name:
            shard.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    (store / "manifest.json").write_text(json.dumps(manifest))


def _bad_stores(stores: pathlib.Path) -> None:
    """Copies of the tiny store (10 clients, one train shard) whose client index or labels
    lie, with checksums made to match (written wrong by something other than fedray)."""
    def edit(name: str, column: str, change) -> None:
        shutil.copytree(stores / "tiny", stores / name)
        path = stores / name / "clients.arrow"
        with pa.memory_map(str(path)) as source:
            batch = pa.ipc.open_file(source).get_batch(0)
        values = batch.column(column).to_numpy().copy()
        change(values)
        cols = [pa.array(values) if n == column else c
                for n, c in zip(batch.schema.names, batch.columns, strict=True)]
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, batch.schema) as writer:
            writer.write_batch(pa.record_batch(cols, schema=batch.schema))
        data = sink.getvalue().to_pybytes()
        path.write_bytes(data)
        manifest = json.loads((stores / name / "manifest.json").read_text())
        manifest["client_index"].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
        (stores / name / "manifest.json").write_text(json.dumps(manifest))

    edit("pastshard", "train_count", lambda count: count.__setitem__(9, count[9] + 50))
    edit("overlap", "train_offset", lambda offset: offset.__setitem__(3, offset[2] + 1))
    shutil.copytree(stores / "tiny", stores / "badlabels")
    with pa.memory_map(str(stores / "tiny" / "train-00000.arrow")) as source:
        y = pa.ipc.open_file(source).get_batch(0).column(1).to_numpy().copy()
    y[[0, 1]] = (100, -5)
    _rewrite_shard(stores / "badlabels", "train-00000.arrow", y)


def _bad_data(base: pathlib.Path, stores: pathlib.Path) -> None:
    """Stores whose manifest or shards are wrong in one field (written by something other
    than fedray, checksums made to match), and raw files that hold nothing or hold what no
    store should: docs/errors.md's data rows (issue 39, items 3, 6 and 7)."""
    def manifest(name: str, change) -> None:
        shutil.copytree(stores / "tiny", stores / name)
        path = stores / name / "manifest.json"
        m = json.loads(path.read_text())
        change(m)
        path.write_text(json.dumps(m))

    def shard(name: str, x: pa.Array) -> None:
        shutil.copytree(stores / "tiny", stores / name)
        path = stores / name / "train-00000.arrow"
        with pa.memory_map(str(path)) as source:
            y = pa.ipc.open_file(source).get_batch(0).column(1)
        batch = pa.RecordBatch.from_arrays([x, y], names=["x", "y"])
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, batch.schema) as writer:
            writer.write_batch(batch)
        data = sink.getvalue().to_pybytes()
        path.write_bytes(data)
        m = json.loads((stores / name / "manifest.json").read_text())
        m["shards"][0].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
        (stores / name / "manifest.json").write_text(json.dumps(m))

    with pa.memory_map(str(stores / "tiny" / "train-00000.arrow")) as source:
        x = pa.ipc.open_file(source).get_batch(0).column(0)
    flat = x.values.to_numpy().copy()
    flat[784 * 40 + 100] = np.nan  # row 40: client 2's
    shard("nan", pa.FixedSizeListArray.from_arrays(pa.array(flat), 784))
    shard("strings", pa.array([f"{i}" for i in range(len(x))]))
    manifest("nanscale", lambda m: m.__setitem__("scale", float("nan")))
    manifest("escape", lambda m: m["shards"][0].__setitem__("file", "../tiny/train-00000.arrow"))
    manifest("manyclasses", lambda m: m.__setitem__("num_classes", 10**9))
    raw = base / "raw"
    raw.mkdir(exist_ok=True)
    header = "f0,f1,f2,label,user,split\n"
    rows = "".join(f"0.{i},0.5,1.5,{i % 4},u{i % 3},train\n" for i in range(12))
    (raw / "header.csv").write_text(header)
    (raw / "far.csv").write_text(header + rows + "0.7,0.5,1.5,500,u1,train\n")
    (raw / "stray.csv").write_text(header + rows + "0.7,0.5,1.5,1e9,u1,train\n")
    (raw / "huge.csv").write_text(header + rows + "0.7,1e300,1.5,1,u1,train\n")
    (raw / "fake.parquet").write_text(header + rows)  # a CSV file under a parquet name
    empty = {**{f"f{j}": pa.array([], pa.float32()) for j in range(3)},
             "label": pa.array([], pa.int64()), "user": pa.array([], pa.string()),
             "split": pa.array([], pa.string())}
    pa.parquet.write_table(pa.table(empty), raw / "empty.parquet")
    np.savez(raw / "empty.npz", x=np.zeros((0, 3), np.float32), y=np.zeros(0, np.int64))


def _snapshot(base: pathlib.Path) -> dict[str, tuple[int, str] | None]:
    """Every file under base with its size and checksum, and every directory (a refused run
    may create and remove a directory of its own, which touches its parent's mtime, but
    must leave exactly the files and directories that were there, unchanged)."""
    snap: dict[str, tuple[int, str] | None] = {}
    for dirpath, dirnames, filenames in os.walk(base):
        for name in dirnames:
            snap[str((pathlib.Path(dirpath) / name).relative_to(base))] = None
        for name in filenames:
            p = pathlib.Path(dirpath) / name
            data = p.read_bytes()
            snap[str(p.relative_to(base))] = (len(data), hashlib.sha256(data).hexdigest())
    return snap


# rows whose precondition is a mount: made in a private mount namespace (unshare) that ends
# with the command, so nothing stays mounted however the test ends
MOUNTS = {"read-only-output-dir": "mount --bind ro ro && mount -o remount,bind,ro ro",
          "partition-read-only": "mount --bind ro ro && mount -o remount,bind,ro ro",
          "disk-full": "mount -t tmpfs -o size=320k tmpfs small",
          "partition-disk-full": "mount -t tmpfs -o size=320k tmpfs small",
          "report-disk-full": "mount -t tmpfs -o size=16k tmpfs small"}


def _unshare() -> list[str] | None:
    """How to run a command in its own mount namespace here: as root, or as a user mapped
    to root in a new user namespace; None where neither is allowed."""
    for prefix in (["unshare", "-m"], ["unshare", "-r", "-m"]):
        try:
            if subprocess.run([*prefix, "true"], capture_output=True, timeout=30).returncode == 0:
                return prefix
        except (OSError, subprocess.TimeoutExpired):
            continue
    return None


UNSHARE = _unshare()


def _env() -> dict[str, str]:
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", TZ="UTC")
    env.pop("RAY_ADDRESS", None)
    env.pop("FEDRAY_DEBUG", None)
    return env


def _run_mount_row(work: pathlib.Path, rid: str, command: str):
    """A row whose precondition is a mount: `python -m fedray.cli` inside `unshare`, and
    the mounted directory's contents after the command, listed from inside the namespace
    (outside it the mount is gone)."""
    args = [sys.executable, "-m", "fedray.cli", *shlex.split(command)[1:]]  # drop "fedray"
    listing = work.with_name(f"{rid}.listing")
    script = (f"{MOUNTS[rid]} && {shlex.join(args)}; rc=$?; "
              f"find {shlex.split(MOUNTS[rid])[-1]} > {shlex.quote(str(listing))}; exit $rc")
    return subprocess.run([*UNSHARE, "sh", "-c", script], cwd=work, env=_env(),
                          capture_output=True, text=True, timeout=180)


# The other rows are forks of one process that has imported fedray and torch once (torch:
# what a row whose error comes after the model's check imports). Each is still a process of
# its own, in its own copy of the template, running fedray.cli as `python -m fedray.cli`
# does (runpy, with the row's arguments, working directory and sys.path[0] as `-m` sets
# them), and ending through the interpreter's exit steps (non-daemon threads joined, atexit
# handlers, streams flushed) but for the teardown of every module, which with torch loaded
# costs about a second of CPU. A fresh interpreter per row took about 80 s of CPU for the
# 85 rows (2 s for each of the 26 that import torch); the forks take about 15 s.
# A row that hangs gets SIGALRM after 180 s; one the server cannot start exits 70.
FORK_SERVER = r"""
import atexit, gc, json, os, runpy, signal, sys, threading, traceback

import fedray.api, fedray.core.losses, fedray.core.models  # noqa: F401

def row(cwd, out, err, argv):
    signal.alarm(180)
    os.chdir(cwd)
    for fd, path in ((1, out), (2, err)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    sys.path[0] = cwd
    sys.argv = [sys.argv[0], *argv]
    try:
        runpy.run_module("fedray.cli", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:  # read as the interpreter reads it
        code = exc.code
        if code is None:
            code = 0
        elif not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    threading._shutdown()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code & 0xFF)

rows = json.loads(open(sys.argv[1]).read())
gc.freeze()  # the collector leaves the parent's objects alone: no copy-on-write of them
running = {}

def reap():
    pid, status = os.wait()
    print(json.dumps([running.pop(pid), os.waitstatus_to_exitcode(status)]), flush=True)

for i, spec in enumerate(rows):
    while len(running) >= 2:
        reap()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        try:
            row(*spec)
        finally:  # never back into this loop
            os._exit(70)
    running[pid] = i
while running:
    reap()
"""


def _run_forked(base: pathlib.Path, rows: dict[str, str]) -> dict[str, subprocess.CompletedProcess]:
    """Every row of ``rows`` as a fork of FORK_SERVER, two at a time."""
    work = base / "work"
    specs = [[str(work / rid), str(work / f"{rid}.stdout"), str(work / f"{rid}.stderr"),
              shlex.split(cmd)[1:]] for rid, cmd in rows.items()]
    (base / "rows.json").write_text(json.dumps(specs))
    server = subprocess.run([sys.executable, "-c", FORK_SERVER, str(base / "rows.json")],
                            env=_env(), stdin=subprocess.DEVNULL, capture_output=True,
                            text=True, timeout=900)
    assert server.returncode == 0, server.stderr[-3000:]
    codes = dict(json.loads(line) for line in server.stdout.splitlines())
    return {rid: subprocess.CompletedProcess(argv, codes[i], pathlib.Path(out).read_text(),
                                             pathlib.Path(err).read_text())
            for i, (rid, (_, out, err, argv)) in enumerate(zip(rows, specs, strict=True))}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Every row run once (each in its own copy of the template): the forks two at a time,
    and meanwhile the rows that need a mount, two at a time."""
    base = tmp_path_factory.mktemp("errors")
    template = base / "template"
    _template(template)
    work = base / "work"
    mounted = {rid: CATALOGUE[rid][0] for rid in MOUNTS if UNSHARE is not None}
    forked = {rid: cmd for rid, (cmd, _, _) in CATALOGUE.items() if rid not in MOUNTS}
    before = {}

    def copy(rid: str) -> None:
        shutil.copytree(template, work / rid, copy_function=shutil.copy2)
        before[rid] = _snapshot(work / rid)

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        futures = {}
        for rid, cmd in mounted.items():  # first: disk-full (a run on Ray) is the longest row
            copy(rid)
            futures[rid] = pool.submit(_run_mount_row, work / rid, rid, cmd)
        for rid in forked:
            copy(rid)
        outs = _run_forked(base, forked)
        outs.update({rid: f.result() for rid, f in futures.items()})
    return {rid: (work / rid, outs[rid], before[rid], _snapshot(work / rid),
                  work / f"{rid}.listing") for rid in outs}


def test_catalogue_is_complete():
    assert len(CATALOGUE) >= 47
    assert all(code != 0 for _, _, code in CATALOGUE.values())


@pytest.mark.parametrize("rid", sorted(CATALOGUE))
def test_bad_input(rid, results):
    if rid not in results:
        pytest.skip(f"{rid} needs a mount, and this machine allows no mount namespace")
    command, message, code = CATALOGUE[rid]
    work, out, before, after, listing = results[rid]
    message = message.replace("$PWD", str(work)).replace("$HOST", socket.gethostname())
    assert out.returncode == code, (command, out.returncode, out.stderr[-2000:])
    assert "Traceback" not in out.stderr + out.stdout, command
    assert message in out.stderr.splitlines(), (command, out.stderr[-2000:])
    assert out.stderr.splitlines()[-1] == message  # the error is the last line, and one line
    assert before == after, (command, set(after) ^ set(before))
    if rid in ("partition-disk-full", "report-disk-full"):  # temporary files gone with it
        assert listing.read_text().split() == ["small"], listing.read_text()
    if rid == "disk-full":  # a checkpoint, no temporary file, no lock: ready to resume
        names = {pathlib.Path(line.strip()).name for line in listing.read_text().splitlines()}
        assert "checkpoint.safetensors" in names and "config.yaml" in names, names
        assert not [n for n in names if n.endswith(".tmp") or n == LOCK_FILE], names


@pytest.mark.parametrize("rid", sorted(CALLS))
def test_bad_python_call(rid, ray_cluster, tmp_path, monkeypatch):
    """Each call of the Python table raises FedrayError with exactly its message, and
    leaves the directory it ran in empty (no run directory, not even a refused one)."""
    from torch import nn

    import fedray
    from fedray.errors import FedrayError

    call, message = CALLS[rid]

    def clipped():  # a closure: shipped to the driver and workers by value
        import torch

        model = nn.Sequential(nn.Linear(8, 8))
        for p in model.parameters():
            p.register_hook(lambda g: torch.clamp(g, -0.01, 0.01))
        return model

    class Branching(nn.Module):  # a forward pass that branches on a tensor's value
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            return self.fc(x) if x.sum() > 0 else self.fc(-x)

    g = np.random.default_rng(0)
    clients = {c: (g.normal(size=(10, 8)).astype(np.float32), g.integers(0, 8, size=10))
               for c in range(6)}
    clients[0][1][0] = 7  # the largest label is 7: eight classes
    job = {"rounds": 2, "sampling": {"clients_per_round": 3}, "output": {"dir": "runs/a"}}
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FedrayError) as info:
        eval(call, {"fedray": fedray, "nn": nn, "JOB": job, "CLIENTS": clients,  # noqa: S307
                    "clipped": clipped, "Branching": Branching})
    assert str(info.value) == message
    assert list(tmp_path.iterdir()) == []
