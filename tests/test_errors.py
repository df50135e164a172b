"""docs/errors.md, the catalogue of bad inputs, stays true: every row's command, run through
the real `fedray` entry point, fails with the documented one-line message and exit code, with
no traceback, and creates or changes no file."""

import concurrent.futures
import os
import pathlib
import re
import shlex
import shutil
import struct
import subprocess
import sys

import pytest

from fedray.config import load_config, to_yaml
from fedray.recipe import build

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "errors.md"
ROW = re.compile(r"^\| `([a-z0-9-]+)` \| (.+?) \| `(fedray [^`]*)` \| `([^`]+)` \| (\d+) \|$",
                 flags=re.M)


def _catalogue() -> dict[str, tuple[str, str, int]]:
    """{id: (command, message, exit code)} from the doc's table."""
    rows = {m[0]: (m[2], m[3], int(m[4])) for m in ROW.findall(DOC.read_text())}
    table_lines = [ln for ln in DOC.read_text().splitlines() if ln.startswith("| `")]
    assert len(rows) == len(table_lines), "a table row of docs/errors.md does not parse"
    return rows


CATALOGUE = _catalogue()


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
    mnist = base / "raw" / "mnist"
    mnist.mkdir(parents=True)
    (mnist / "t10k-images-idx3-ubyte").write_bytes(struct.pack(">IIII", 0x803, 10000, 28, 28)
                                                   + bytes(4984))
    (mnist / "t10k-labels-idx1-ubyte").write_bytes(struct.pack(">II", 0x801, 10000)
                                                   + bytes(range(10)) * 1000)


def _snapshot(base: pathlib.Path) -> dict[str, tuple[int, int]]:
    """Every file and directory under base, with its mtime and size."""
    snap = {}
    for dirpath, dirnames, filenames in os.walk(base):
        for name in dirnames + filenames:
            p = pathlib.Path(dirpath) / name
            st = p.stat()
            snap[str(p.relative_to(base))] = (st.st_mtime_ns, st.st_size)
    return snap


def _run_row(template: pathlib.Path, work: pathlib.Path, command: str):
    shutil.copytree(template, work, copy_function=shutil.copy2)
    before = _snapshot(work)
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    env.pop("FEDRAY_DEBUG", None)
    args = shlex.split(command)[1:]  # drop "fedray"
    out = subprocess.run([sys.executable, "-m", "fedray.cli", *args], cwd=work, env=env,
                         capture_output=True, text=True, timeout=120)
    return out, before, _snapshot(work)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Every row run once, several at a time (each in its own copy of the template)."""
    base = tmp_path_factory.mktemp("errors")
    template = base / "template"
    _template(template)
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        futures = {rid: pool.submit(_run_row, template, base / rid, cmd)
                   for rid, (cmd, _, _) in CATALOGUE.items()}
        return {rid: (base / rid, *f.result()) for rid, f in futures.items()}


def test_catalogue_is_complete():
    assert len(CATALOGUE) >= 47
    assert all(code != 0 for _, _, code in CATALOGUE.values())


@pytest.mark.parametrize("rid", sorted(CATALOGUE))
def test_bad_input(rid, results):
    command, message, code = CATALOGUE[rid]
    work, out, before, after = results[rid]
    message = message.replace("$PWD", str(work))
    assert out.returncode == code, (command, out.returncode, out.stderr[-2000:])
    assert "Traceback" not in out.stderr + out.stdout, command
    assert message in out.stderr.splitlines(), (command, out.stderr[-2000:])
    assert out.stderr.splitlines()[-1] == message  # the error is the last line, and one line
    assert before == after, (command, set(after) ^ set(before))
