"""TensorBoard events of a run: TensorBoard's own reader sees exactly metrics.jsonl."""

import json

import fsspec
import pytest
from conftest import tiny_job

import fedray
from fedray.run_dir import RunDir
from fedray.tensorboard import EVENTS_FILE, read_scalars


def _tensorboard_scalars(run_dir) -> dict[str, list[tuple[int, float]]]:
    accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator")
    acc = accumulator.EventAccumulator(str(run_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)]
            for tag in acc.Tags()["scalars"]}


def _from_metrics(lines) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for m in map(json.loads, lines):
        for k, v in m.items():
            if k != "round" and isinstance(v, int | float):
                out.setdefault(k, []).append((m["round"], float(v)))
    return out


def _close(a, b):
    assert a.keys() == b.keys()
    for tag in a:
        assert [s for s, _ in a[tag]] == [s for s, _ in b[tag]], tag
        # events hold float32
        assert [v for _, v in a[tag]] == pytest.approx([v for _, v in b[tag]], rel=1e-6,
                                                       abs=1e-6), tag


def test_a_run_writes_what_tensorboard_reads(ray_cluster, tmp_path):
    result = fedray.run(tiny_job(tmp_path, rounds=4, eval__every=2))
    run = tmp_path / "run"
    lines = (run / "metrics.jsonl").read_text().splitlines()
    expected = _from_metrics(lines)
    assert [s for s, _ in expected["test_accuracy"]] == [2, 4]
    _close(_tensorboard_scalars(run), expected)
    _close(read_scalars(str(run / EVENTS_FILE)), expected)
    assert len(result.metrics) == 4


@pytest.mark.parametrize("url", ["local", "memory://tb-run"])
def test_restored_metrics_rewrite_the_events(tmp_path, url):
    """A resumed run's events are those of its checkpoint's rounds, on a local disk (appended
    round by round) and on an object store (rewritten whole)."""
    url = str(tmp_path / "run") if url == "local" else url
    run = RunDir(url, tensorboard=True)
    fsspec.filesystem(run.fs.protocol[0] if isinstance(run.fs.protocol, tuple)
                      else run.fs.protocol).makedirs(run.path, exist_ok=True)
    for r in (1, 2, 3):
        run.append_metrics({"round": r, "train_loss": 1.0 / r, "clients": 8})
    assert [s for s, _ in read_scalars(run.url_of(EVENTS_FILE))["train_loss"]] == [1, 2, 3]
    run.restore_metrics(run.metrics_lines[:2])
    run.append_metrics({"round": 3, "train_loss": 0.25, "clients": 8})
    scalars = read_scalars(run.url_of(EVENTS_FILE))
    assert [s for s, _ in scalars["train_loss"]] == [1, 2, 3]
    assert [v for _, v in scalars["train_loss"]] == pytest.approx([1.0, 0.5, 0.25])
    assert scalars["clients"] == [(1, 8.0), (2, 8.0), (3, 8.0)]


def test_a_corrupt_record_is_refused(tmp_path):
    run = RunDir(str(tmp_path), tensorboard=True)
    run.append_metrics({"round": 1, "train_loss": 0.5})
    path = tmp_path / EVENTS_FILE
    data = bytearray(path.read_bytes())
    data[-6] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="corrupt record"):
        read_scalars(str(path))
