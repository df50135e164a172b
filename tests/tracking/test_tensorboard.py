"""TensorBoard events of a run: TensorBoard's own reader sees exactly metrics.jsonl, under
grouped tags, and its HParams plugin the runs' configs side by side.

The events file is written by a callback in the caller's process (TensorBoardCallback);
tests/runtime/test_inline.py checks it across a killed and resumed run."""

import json

import fsspec
import pytest
from conftest import tiny_job

import fedray
from fedray.config import load_config
from fedray.tracking.callbacks import RunInfo
from fedray.tracking.tags import metric_key, metric_tag
from fedray.tracking.tensorboard import (
    EVENTS_FILE,
    STATUS_FAILURE,
    STATUS_SUCCESS,
    TensorBoardCallback,
    file_header,
    read_hparams,
    read_scalars,
)


def _tensorboard_scalars(run_dir) -> dict[str, list[tuple[int, float]]]:
    accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator")
    acc = accumulator.EventAccumulator(str(run_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)]
            for tag in acc.Tags()["scalars"]}


def _from_metrics(lines, tag=lambda k: k) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for m in map(json.loads, lines):
        for k, v in m.items():
            if k != "round" and isinstance(v, int | float):
                out.setdefault(tag(k), []).append((m["round"], float(v)))
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
    tagged = _from_metrics(lines, metric_tag)
    assert {t.split("/")[0] for t in tagged} == {"train", "test", "system"}
    _close(_tensorboard_scalars(run), tagged)
    _close(read_scalars(str(run / EVENTS_FILE), tags=True), tagged)
    _close(read_scalars(str(run / EVENTS_FILE)), expected)  # by metrics.jsonl key
    assert len(result.metrics) == 4
    assert read_hparams(str(run / EVENTS_FILE))[1] == [STATUS_SUCCESS]


@pytest.mark.parametrize("key, tag", [
    ("train_loss", "train/train_loss"), ("elastic_boosted_share", "train/elastic_boosted_share"),
    ("test_accuracy", "test/test_accuracy"), ("fed_test_loss", "test/fed_test_loss"),
    ("clients_accuracy_p10", "clients/clients_accuracy_p10"),
    ("clients_personalized_accuracy_mean", "clients/clients_personalized_accuracy_mean"),
    ("clients_evaluated", "clients/clients_evaluated"),
    ("wall_s", "system/wall_s"), ("train_s", "system/train_s"),
    ("updates_per_s", "system/updates_per_s"), ("driver_mem_mb", "system/driver_mem_mb"),
    ("worker_failures", "system/worker_failures"), ("examples", "system/examples"),
    ("clients", "system/clients"), ("dropped_updates", "system/dropped_updates"),
])
def test_tags_are_grouped_by_what_they_measure(key, tag):
    assert metric_tag(key) == tag and metric_key(tag) == key


def test_an_event_file_from_before_the_groups_still_reads(tmp_path):
    """Files written before tags were grouped (``train_loss``) read by the same keys."""
    from tensorboardX.proto.event_pb2 import Event
    from tensorboardX.proto.summary_pb2 import Summary

    from fedray.tracking.tensorboard import _record

    event = Event(wall_time=1.0, step=3, summary=Summary(value=[
        Summary.Value(tag="train_loss", simple_value=0.5),
        Summary.Value(tag="test_accuracy", simple_value=0.25)]))
    path = tmp_path / EVENTS_FILE
    path.write_bytes(file_header(1.0) + _record(event.SerializeToString()))
    assert read_scalars(str(path)) == {"train_loss": [(3, 0.5)], "test_accuracy": [(3, 0.25)]}
    assert read_hparams(str(path)) == ({}, [])


def test_the_hparams_tab_shows_the_runs_side_by_side(tmp_path):
    """Two runs that differ in client.lr, read back by TensorBoard's HParams plugin itself
    (the backend of its HPARAMS tab): client.lr is the hyper-parameter that differs, listed
    first; each run is a finished session with its lr and the last value of its metrics."""
    pytest.importorskip("tensorboard.plugins.hparams")
    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider
    from tensorboard.backend.event_processing import plugin_event_multiplexer as pem
    from tensorboard.data import provider
    from tensorboard.plugins import base_plugin
    from tensorboard.plugins.hparams import api_pb2, backend_context, list_session_groups

    results = {}
    for lr in (0.05, 0.1):
        results[lr] = fedray.run(tiny_job(tmp_path, rounds=2, client__lr=lr,
                                          runtime__backend="inline",
                                          output__dir=str(tmp_path / "runs" / f"lr{lr}")))
    mux = pem.EventMultiplexer()
    mux.AddRunsFromDirectory(str(tmp_path / "runs"))
    mux.Reload()
    tb = base_plugin.TBContext(logdir=str(tmp_path / "runs"), multiplexer=mux,
                               data_provider=data_provider.MultiplexerDataProvider(
                                   mux, str(tmp_path / "runs")))
    backend = backend_context.Context(tb)
    request = context.RequestContext()
    content = backend.hparams_metadata(request, "")
    assert set(content) == {"lr0.05", "lr0.1"}
    experiment = backend.experiment_from_metadata(
        request, "", True, content, provider.ListHyperparametersResult(
            hyperparameters=[], session_groups=[]))
    infos = {h.name: h for h in experiment.hparam_infos}
    assert [h.name for h in experiment.hparam_infos if h.differs] == ["client.lr"]
    assert experiment.hparam_infos[0].name == "client.lr"
    assert infos["client.lr"].domain_interval.min_value == 0.05
    assert infos["algorithm.name"].domain_discrete.values[0].string_value == "fedavg"
    assert infos["eval.central"].type == api_pb2.DATA_TYPE_BOOL
    assert not any(name.startswith("output.") for name in infos)
    assert {"test/test_accuracy", "train/train_loss", "system/wall_s"} <= {
        m.name.tag for m in experiment.metric_infos}
    groups = list_session_groups.Handler(request, backend, "", api_pb2.ListSessionGroupsRequest(
        start_index=0, slice_size=10, allowed_statuses=[0, 1, 2, 3])).run().session_groups
    assert sorted(g.name for g in groups) == ["lr0.05", "lr0.1"]
    for g in groups:
        lr = g.hparams["client.lr"].number_value
        assert g.name == f"lr{lr}" and [s.status for s in g.sessions] == [STATUS_SUCCESS]
        values = {m.name.tag: m.value for m in g.metric_values}
        last = results[lr].metrics[-1]
        # events hold float32
        assert values["test/test_accuracy"] == pytest.approx(last["test_accuracy"], rel=1e-6)
        assert values["train/train_loss"] == pytest.approx(last["train_loss"], rel=1e-6)


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
    hparams, ends = read_hparams(events)
    assert hparams["client.lr"] == load_config({}).client.lr and ends == []  # still running
    tb.on_run_end({})
    assert read_hparams(events)[1] == [STATUS_SUCCESS]
    assert len(read_scalars(events)["train_loss"]) == 3


def test_a_failed_run_ends_its_hparams_session_failed(tmp_path):
    tb = _start(str(tmp_path))
    tb.on_round_end(1, {"round": 1, "train_loss": 0.5}, None)
    tb.on_run_failed(RuntimeError("boom"))
    assert read_hparams(str(tmp_path / EVENTS_FILE))[1] == [STATUS_FAILURE]
    TensorBoardCallback().on_run_failed(RuntimeError("before on_run_start"))  # nothing to end


def test_a_corrupt_record_is_refused(tmp_path):
    tb = _start(str(tmp_path))
    tb.on_round_end(1, {"round": 1, "train_loss": 0.5}, None)
    path = tmp_path / EVENTS_FILE
    data = bytearray(path.read_bytes())
    data[-6] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="corrupt record"):
        read_scalars(str(path))
