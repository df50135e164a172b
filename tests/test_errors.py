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


def _template(base: pathlib.Path) -> None:
    """The directory every row's command runs in (a fresh copy each): the job and recipe
    files, and the stores, runs, reports and raw files the rows' preconditions name."""
    shutil.copytree(ROOT / "jobs", base / "jobs")
    shutil.copytree(ROOT / "partitions", base / "partitions")
    stores = base / "stores"
    build(ROOT / "partitions" / "synthetic_dirichlet.yaml",
          [f"out={stores / 'tiny'}", "source.num_writers=5", "partitioner.num_clients=10"])
    build(ROOT / "partitions" / "synthetic_dirichlet.yaml",  # clients 2 and 8 are empty
          [f"out={stores / 'sparse'}", "source.num_writers=5", "partitioner.num_clients=20",
           "partitioner.min_examples=0", "partitioner.alpha=0.05"])
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
    (base / "reports" / "old").mkdir(parents=True)
    (base / "reports" / "old" / "report.md").write_text("| method |\n")
    (base / "notarun").mkdir()
    (base / "sweeps").mkdir()
    (base / "sweeps" / "typo.yaml").write_text(
        "job: ../jobs/quickstart.yaml\nparameters:\n  sampling.clients_per_rnd: [10, 20]\n")
    _bad_stores(stores)
    busy = base / "runs" / "busy"  # a run another process is writing: pid 1 holds its lock
    busy.mkdir()
    (busy / "config.yaml").write_text(to_yaml(cfg))
    (busy / LOCK_FILE).write_text(json.dumps({
        "host": socket.gethostname(), "pid": 1, "pid_started": psutil.Process(1).create_time(),
        "started": 0.0, "token": "another run"}))
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
    """Copies of the tiny store (10 clients, one train shard) whose manifest or labels lie."""
    def edit(name: str, change) -> None:
        shutil.copytree(stores / "tiny", stores / name)
        manifest = json.loads((stores / name / "manifest.json").read_text())
        change(manifest["clients"]["train"])
        (stores / name / "manifest.json").write_text(json.dumps(manifest))

    edit("pastshard", lambda train: train["count"].__setitem__(9, train["count"][9] + 50))
    edit("overlap", lambda train: train["offset"].__setitem__(3, train["offset"][2] + 1))
    shutil.copytree(stores / "tiny", stores / "badlabels")
    with pa.memory_map(str(stores / "tiny" / "train-00000.arrow")) as source:
        y = pa.ipc.open_file(source).get_batch(0).column(1).to_numpy().copy()
    y[[0, 1]] = (100, -5)
    _rewrite_shard(stores / "badlabels", "train-00000.arrow", y)


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
          "partition-disk-full": "mount -t tmpfs -o size=320k tmpfs small"}


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


def _run_row(template: pathlib.Path, work: pathlib.Path, rid: str, command: str):
    shutil.copytree(template, work, copy_function=shutil.copy2)
    before = _snapshot(work)
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", TZ="UTC")
    env.pop("RAY_ADDRESS", None)
    env.pop("FEDRAY_DEBUG", None)
    args = [sys.executable, "-m", "fedray.cli", *shlex.split(command)[1:]]  # drop "fedray"
    listing = work.with_name(f"{rid}.listing")
    if rid in MOUNTS:  # the mounted directory's contents after the command, listed from
        # inside the namespace (outside it the mount is gone)
        script = (f"{MOUNTS[rid]} && {shlex.join(args)}; rc=$?; "
                  f"find {shlex.split(MOUNTS[rid])[-1]} > {shlex.quote(str(listing))}; exit $rc")
        args = [*UNSHARE, "sh", "-c", script]
    out = subprocess.run(args, cwd=work, env=env, capture_output=True, text=True, timeout=180)
    return out, before, _snapshot(work), listing


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Every row run once, several at a time (each in its own copy of the template)."""
    base = tmp_path_factory.mktemp("errors")
    template = base / "template"
    _template(template)
    rows = {rid: cmd for rid, (cmd, _, _) in CATALOGUE.items()
            if rid not in MOUNTS or UNSHARE is not None}
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        futures = {rid: pool.submit(_run_row, template, base / "work" / rid, rid, cmd)
                   for rid, cmd in rows.items()}
        return {rid: (base / "work" / rid, *f.result()) for rid, f in futures.items()}


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
    if rid == "partition-disk-full":  # the store's temporary copy is gone with it
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

    g = np.random.default_rng(0)
    clients = {c: (g.normal(size=(10, 8)).astype(np.float32), g.integers(0, 8, size=10))
               for c in range(6)}
    clients[0][1][0] = 7  # the largest label is 7: eight classes
    job = {"rounds": 2, "sampling": {"clients_per_round": 3}, "output": {"dir": "runs/a"}}
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FedrayError) as info:
        eval(call, {"fedray": fedray, "nn": nn, "JOB": job, "CLIENTS": clients,  # noqa: S307
                    "clipped": clipped})
    assert str(info.value) == message
    assert list(tmp_path.iterdir()) == []
