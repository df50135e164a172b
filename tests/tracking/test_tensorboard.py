"""TensorBoard events of a run: TensorBoard's own reader sees exactly metrics.jsonl.

The events file is written by a callback in the caller's process (TensorBoardCallback);
tests/runtime/test_inline.py checks it across a killed and resumed run."""

import json

import fsspec
import pytest
from conftest import tiny_job

import fedray
from fedray.config import load_config
from fedray.tracking.callbacks import RunInfo
from fedray.tracking.tensorboard import EVENTS_FILE, TensorBoardCallback, read_scalars


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


def test_a_run_writes_what_tensorboard_reads(tmp_path):
    # the caller writes the events whichever backend runs the rounds: inline, as no Ray is
    # needed (tests/cluster/test_sweep.py finds them in Ray-run trials)
    result = fedray.run(tiny_job(tmp_path, rounds=4, eval__every=2, runtime__backend="inline"))
    run = tmp_path / "run"
    lines = (run / "metrics.jsonl").read_text().splitlines()
    expected = _from_metrics(lines)
    assert [s for s, _ in expected["test_accuracy"]] == [2, 4]
    _close(_tensorboard_scalars(run), expected)
    _close(read_scalars(str(run / EVENTS_FILE)), expected)
    assert len(result.metrics) == 4


def _start(url: str, resumed_from: int | None = None,
           past: list[dict] = ()) -> TensorBoardCallback:
    tb = TensorBoardCallback()
    tb.on_run_start(RunInfo(load_config({}), url, resumed_from, list(past)))
    return tb


@pytest.mark.parametrize("url", ["local", "memory://tb-run"])
def test_a_resumed_run_rewrites_the_events(tmp_path, url):
    """A resumed run's events are those of its checkpoint's rounds, then its own: on a local
    disk (appended round by round) and on an object store (rewritten whole)."""
    url = str(tmp_path / "run") if url == "local" else url
    fs, path = fsspec.core.url_to_fs(url)
    fs.makedirs(path, exist_ok=True)
    rounds = [{"round": r, "train_loss": 1.0 / r, "clients": 8} for r in (1, 2, 3)]
    tb = _start(url)
    for m in rounds:
        tb.on_round_end(m["round"], m, None)
    events = f"{url}/{EVENTS_FILE}"
    assert [s for s, _ in read_scalars(events)["train_loss"]] == [1, 2, 3]
    # killed after round 3; its checkpoint was after round 2: round 3 runs again
    tb = _start(url, resumed_from=2, past=rounds[:2])
    tb.on_round_end(3, {"round": 3, "train_loss": 0.25, "clients": 8}, None)
    scalars = read_scalars(events)
    assert [s for s, _ in scalars["train_loss"]] == [1, 2, 3]
    assert [v for _, v in scalars["train_loss"]] == pytest.approx([1.0, 0.5, 0.25])
    assert scalars["clients"] == [(1, 8.0), (2, 8.0), (3, 8.0)]
    assert [p.rsplit("/", 1)[-1] for p in fs.ls(path, detail=False)] == [EVENTS_FILE]


def test_a_corrupt_record_is_refused(tmp_path):
    tb = _start(str(tmp_path))
    tb.on_round_end(1, {"round": 1, "train_loss": 0.5}, None)
    path = tmp_path / EVENTS_FILE
    data = bytearray(path.read_bytes())
    data[-6] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="corrupt record"):
        read_scalars(str(path))
