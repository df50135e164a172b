"""TensorBoard event files for a run's per-round metrics and hyper-parameters, at any fsspec URL.

``tensorboard --logdir RUN_DIR`` (or a sweep's directory, for all its trials) plots every
numeric key of metrics.jsonl against the round, under a tag grouped by what it measures
(``train/``, ``test/``, ``clients/``, ``system/``: fedray.tracking.tags.metric_tag), and its
HPARAMS tab shows the runs side by side: each run's config as hyper-parameters, with the
last value of every metric. ``TensorBoardCallback`` writes them (``output.tensorboard``), in
the process that called fedray.run. The events are a pure function of the config and the
metrics lines, so a resumed run rewrites the file from its checkpoint's rounds and shows no
duplicate or orphaned points (nor does a run killed between the driver's metrics line and
the callback's event: the resume rewrites both from the checkpoint).
The file is TensorFlow's record format -- length, masked
CRC-32C, a serialized ``Event`` protobuf, its CRC -- encoded with tensorboardX's protobuf
classes (a dependency of Ray Tune), because TensorBoard's own writers only reach local
disks and S3, while a run directory can be any fsspec URL.
"""

from __future__ import annotations

import json
import struct
import time
import uuid
from collections.abc import Iterable

import fsspec

from fedray.state.storage import filesystem, is_local
from fedray.tracking.callbacks import Callback, RunInfo
from fedray.tracking.tags import hparams, metric_key, numeric_metrics, tagged_metrics

__all__ = ["EVENTS_FILE", "TensorBoardCallback", "numeric_metrics", "read_hparams",
           "read_scalars"]

# TensorBoard reads every file whose name contains "tfevents"; one fixed name per run
# directory lets a resumed run replace it
EVENTS_FILE = "events.out.tfevents.fedray"

# the HParams plugin's summaries (tensorboard.plugins.hparams.metadata)
HPARAMS_PLUGIN = "hparams"
SESSION_START_TAG = "_hparams_/session_start_info"
SESSION_END_TAG = "_hparams_/session_end_info"
STATUS_SUCCESS, STATUS_FAILURE = 1, 2  # tensorboard.plugins.hparams.api_pb2.Status


def _tbx():
    """tensorboardX's ``Event`` and ``Summary`` classes and its CRC, imported when first
    used: the tensorboardX package imports torch, and `fedray run` checks a run
    directory, and reports a bad config, before anything needs either."""
    from tensorboardX.proto.event_pb2 import Event
    from tensorboardX.proto.summary_pb2 import Summary
    from tensorboardX.record_writer import masked_crc32c

    return Event, Summary, masked_crc32c


def _record(data: bytes) -> bytes:
    masked_crc32c = _tbx()[2]
    header = struct.pack("<Q", len(data))
    return (header + struct.pack("<I", masked_crc32c(header)) + data
            + struct.pack("<I", masked_crc32c(data)))


def file_header(wall_time: float | None = None) -> bytes:
    """The version event every event file starts with."""
    Event = _tbx()[0]
    event = Event(wall_time=time.time() if wall_time is None else wall_time,
                  file_version="brain.Event:2")
    return _record(event.SerializeToString())


def scalar_events(metrics: dict, wall_time: float | None = None) -> bytes:
    """One event holding every numeric metric of a round under its tag (step = the round).
    """
    Event, Summary, _ = _tbx()
    values = [Summary.Value(tag=k, simple_value=v) for k, v in tagged_metrics(metrics).items()]
    event = Event(wall_time=time.time() if wall_time is None else wall_time,
                  step=int(metrics["round"]), summary=Summary(value=values))
    return _record(event.SerializeToString())


def _hparams_event(tag: str, plugin_data, wall_time: float | None) -> bytes:
    """A summary of the HParams plugin, laid out as TensorBoard's own hparams writer lays
    it out (its data in the metadata's plugin content, an empty float tensor as value)."""
    from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData
    from tensorboardX.proto.summary_pb2 import SummaryMetadata
    from tensorboardX.proto.tensor_pb2 import TensorProto
    from tensorboardX.proto.tensor_shape_pb2 import TensorShapeProto
    from tensorboardX.proto.types_pb2 import DT_FLOAT

    Event, Summary, _ = _tbx()
    content = HParamsPluginData(version=0, **plugin_data).SerializeToString()
    metadata = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(
        plugin_name=HPARAMS_PLUGIN, content=content))
    null = TensorProto(dtype=DT_FLOAT, tensor_shape=TensorShapeProto(
        dim=[TensorShapeProto.Dim(size=0)]))
    event = Event(wall_time=time.time() if wall_time is None else wall_time, step=0,
                  summary=Summary(value=[Summary.Value(tag=tag, metadata=metadata,
                                                       tensor=null)]))
    return _record(event.SerializeToString())


def session_start(cfg, wall_time: float | None = None) -> bytes:
    """The run's hyper-parameters (fedray.tracking.tags.hparams) as the HParams plugin's
    session start. No experiment summary is written: TensorBoard then builds the
    experiment from every run's session start -- each hyper-parameter's values over all
    the runs it shows, those that differ listed first, and every scalar tag as a metric --
    where one run's experiment summary would be taken for all runs."""
    from google.protobuf.struct_pb2 import Value
    from tensorboardX.proto.plugin_hparams_pb2 import SessionStartInfo

    info = SessionStartInfo(start_time_secs=time.time() if wall_time is None else wall_time)
    for name, value in hparams(cfg).items():
        if isinstance(value, bool):
            info.hparams[name].CopyFrom(Value(bool_value=value))
        elif isinstance(value, float):
            info.hparams[name].CopyFrom(Value(number_value=value))
        else:
            info.hparams[name].CopyFrom(Value(string_value=value))
    return _hparams_event(SESSION_START_TAG, {"session_start_info": info}, wall_time)


def session_end(status: int, wall_time: float | None = None) -> bytes:
    """The end of the run's HParams session: STATUS_SUCCESS or STATUS_FAILURE."""
    from tensorboardX.proto.plugin_hparams_pb2 import SessionEndInfo

    end = time.time() if wall_time is None else wall_time
    return _hparams_event(SESSION_END_TAG, {
        "session_end_info": SessionEndInfo(status=status, end_time_secs=end)}, wall_time)


def events_from_lines(lines: Iterable[str], cfg=None) -> bytes:
    """A whole event file from metrics.jsonl lines (and the run's config: hparams)."""
    return events_from_metrics((json.loads(s) for s in lines if s.strip()), cfg)


def events_from_metrics(records: Iterable[dict], cfg=None) -> bytes:
    """A whole event file from rounds' metrics, after the hparams of ``cfg`` when given."""
    start = b"" if cfg is None else session_start(cfg)
    return file_header() + start + b"".join(scalar_events(m) for m in records)


class TensorBoardCallback(Callback):
    """``output.tensorboard``: the run's events file, kept equal to its config and
    metrics.jsonl.

    At the start it is written whole from the config and the rounds already run (none, or a
    resumed run's checkpoint's), replacing whatever a killed run had left; then each
    round's event is appended (on a local disk) or the file rewritten (object stores cannot
    append), and the end of the run (or its failure) closes the HParams session."""

    def on_run_start(self, run: RunInfo) -> None:
        self.fs, path = filesystem(run.run_dir, "output.dir")
        self.path = f"{path.rstrip('/')}/{EVENTS_FILE}"
        self.local = is_local(self.fs)
        self.start = session_start(run.config)
        self.records = list(run.past_metrics)
        self._write(self._events())

    def _events(self, end: bytes = b"") -> bytes:
        return file_header() + self.start + b"".join(scalar_events(m) for m in self.records) \
            + end

    def _add(self, data: bytes, end: bytes = b"") -> None:
        """``data`` appended on a local disk; elsewhere the file rewritten, with ``end``."""
        if self.local:
            with self.fs.open(self.path, "ab") as f:
                f.write(data)
        else:
            self._write(self._events(end))

    def on_round_end(self, round: int, metrics: dict, weights: dict | None) -> None:
        self.records.append(metrics)
        self._add(scalar_events(metrics))

    def on_run_end(self, summary: dict) -> None:
        end = session_end(STATUS_SUCCESS)
        self._add(end, end)

    def on_run_failed(self, error: BaseException) -> None:
        if hasattr(self, "start"):  # on_run_start itself may have failed
            end = session_end(STATUS_FAILURE)
            self._add(end, end)

    def _write(self, data: bytes) -> None:
        """The whole file, replaced atomically: a reader never sees half of it."""
        # a dot name without "tfevents": TensorBoard never reads it, and a killed run's one
        # goes with the run directory's other temporaries (RunDir.remove_temporaries)
        tmp = f"{self.path.rsplit('/', 1)[0]}/.events.{uuid.uuid4().hex}.tmp"
        with self.fs.open(tmp, "wb") as f:
            f.write(data)
        self.fs.mv(tmp, self.path)


def _events(url: str):
    """Every ``Event`` of an event file, checking every record's CRCs."""
    Event, _, masked_crc32c = _tbx()
    with fsspec.open(url, "rb") as f:
        data = f.read()
    pos = 0
    while pos < len(data):
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        body = data[pos + 12:pos + 12 + length]
        (body_crc,) = struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])
        if header_crc != masked_crc32c(header) or body_crc != masked_crc32c(body):
            raise ValueError(f"{url}: corrupt record at byte {pos}")
        yield Event.FromString(body)
        pos += 16 + length


def read_scalars(url: str, tags: bool = False) -> dict[str, list[tuple[int, float]]]:
    """``{metric: [(step, value), ...]}`` of an event file, checking every record's CRCs
    (the tests read fedray's files back with this; TensorBoard reads them the same way).
    Keyed by the metrics.jsonl key, whether the file groups its tags (``train/train_loss``)
    or was written before it did (``train_loss``); ``tags=True``: by the tags as written."""
    out: dict[str, list[tuple[int, float]]] = {}
    for event in _events(url):
        for v in event.summary.value:
            if v.WhichOneof("value") == "simple_value":
                name = v.tag if tags else metric_key(v.tag)
                out.setdefault(name, []).append((event.step, v.simple_value))
    return out


def read_hparams(url: str) -> tuple[dict[str, bool | float | str], list[int]]:
    """The hyper-parameters of an event file's HParams session start, and the statuses of
    its session ends (``[STATUS_SUCCESS]`` after a run that ended)."""
    from google.protobuf.json_format import MessageToDict
    from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData

    found: dict[str, bool | float | str] = {}
    ends: list[int] = []
    for event in _events(url):
        for v in event.summary.value:
            if v.metadata.plugin_data.plugin_name != HPARAMS_PLUGIN:
                continue
            data = HParamsPluginData.FromString(v.metadata.plugin_data.content)
            if v.tag == SESSION_START_TAG:
                found = {k: MessageToDict(val) for k, val in
                         data.session_start_info.hparams.items()}
            elif v.tag == SESSION_END_TAG:
                ends.append(data.session_end_info.status)
    return found, ends
