"""TensorBoard event files for a run's per-round metrics, at any fsspec URL.

``tensorboard --logdir RUN_DIR`` (or a sweep's directory, for all its trials) plots every
numeric key of metrics.jsonl against the round. ``TensorBoardCallback`` writes them
(``output.tensorboard``), in the process that called fedray.run. The events are a pure
function of the metrics lines, so a resumed run rewrites the file from its checkpoint's
rounds and shows no duplicate or orphaned points (nor does a run killed between the driver's
metrics line and the callback's event: the resume rewrites both from the checkpoint).
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

# TensorBoard reads every file whose name contains "tfevents"; one fixed name per run
# directory lets a resumed run replace it
EVENTS_FILE = "events.out.tfevents.fedray"


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


def numeric_metrics(metrics: dict) -> dict[str, float]:
    """A round's metrics that can be plotted: the numbers, less the round itself (the step).
    TensorBoard and MLflow log the same ones."""
    return {k: float(v) for k, v in metrics.items()
            if k != "round" and isinstance(v, int | float) and not isinstance(v, bool)}


def scalar_events(metrics: dict, wall_time: float | None = None) -> bytes:
    """One event holding every numeric metric of a round (step = the round)."""
    Event, Summary, _ = _tbx()
    values = [Summary.Value(tag=k, simple_value=v) for k, v in numeric_metrics(metrics).items()]
    event = Event(wall_time=time.time() if wall_time is None else wall_time,
                  step=int(metrics["round"]), summary=Summary(value=values))
    return _record(event.SerializeToString())


def events_from_lines(lines: Iterable[str]) -> bytes:
    """A whole event file from metrics.jsonl lines."""
    return events_from_metrics(json.loads(s) for s in lines if s.strip())


def events_from_metrics(records: Iterable[dict]) -> bytes:
    """A whole event file from rounds' metrics."""
    return file_header() + b"".join(scalar_events(m) for m in records)


class TensorBoardCallback(Callback):
    """``output.tensorboard``: the run's events file, kept equal to metrics.jsonl.

    At the start it is written whole from the rounds already run (none, or a resumed run's
    checkpoint's), replacing whatever a killed run had left; then each round's event is
    appended (on a local disk) or the file rewritten (object stores cannot append)."""

    def on_run_start(self, run: RunInfo) -> None:
        self.fs, path = filesystem(run.run_dir, "output.dir")
        self.path = f"{path.rstrip('/')}/{EVENTS_FILE}"
        self.local = is_local(self.fs)
        self.records = list(run.past_metrics)
        self._write(events_from_metrics(self.records))

    def on_round_end(self, round: int, metrics: dict, weights: dict | None) -> None:
        self.records.append(metrics)
        if self.local:
            with self.fs.open(self.path, "ab") as f:
                f.write(scalar_events(metrics))
        else:
            self._write(events_from_metrics(self.records))

    def _write(self, data: bytes) -> None:
        """The whole file, replaced atomically: a reader never sees half of it."""
        # a dot name without "tfevents": TensorBoard never reads it, and a killed run's one
        # goes with the run directory's other temporaries (RunDir.remove_temporaries)
        tmp = f"{self.path.rsplit('/', 1)[0]}/.events.{uuid.uuid4().hex}.tmp"
        with self.fs.open(tmp, "wb") as f:
            f.write(data)
        self.fs.mv(tmp, self.path)


def read_scalars(url: str) -> dict[str, list[tuple[int, float]]]:
    """``{tag: [(step, value), ...]}`` of an event file, checking every record's CRCs (the
    tests read fedray's files back with this; TensorBoard reads them the same way)."""
    Event, _, masked_crc32c = _tbx()
    with fsspec.open(url, "rb") as f:
        data = f.read()
    out: dict[str, list[tuple[int, float]]] = {}
    pos = 0
    while pos < len(data):
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        body = data[pos + 12:pos + 12 + length]
        (body_crc,) = struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])
        if header_crc != masked_crc32c(header) or body_crc != masked_crc32c(body):
            raise ValueError(f"{url}: corrupt record at byte {pos}")
        event = Event.FromString(body)
        for v in event.summary.value:
            out.setdefault(v.tag, []).append((event.step, v.simple_value))
        pos += 16 + length
    return out
