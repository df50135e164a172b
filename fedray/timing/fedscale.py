"""FedScale's published device traces, converted to fedray's trace tables.

FedScale (benchmark/dataset/data/device_info/README.md) ships two pickled dicts keyed by
client id: ``client_device_capacity`` ({id: {'computation': ms per sample, 'communication':
kbit/s}}) and ``client_behave_trace`` ({id: {'active': [s], 'inactive': [s], 'finish_time':
s, 'duration': s, 'model': str}}). docs/time.md maps them field by field; in short:

- compute: FedScale's 'computation' is a model's inference latency in ms per sample, and a
  training sample costs ``augmentation_factor = 3`` of them (forward + backward,
  fedscale/cloud/internal/client_metadata.py, ``get_completion_time``), so
  ``compute_s_per_example = 3 * computation / 1000``;
- network: FedScale sizes a model in kbit as ``bytes / 1024 * 8`` and divides the sum of
  its download and upload by 'communication' (fedscale/cloud/aggregation/aggregator.py,
  ``run`` and ``tictak_client_tasks``): one bandwidth, in kbit/s, both ways, so
  ``down_bytes_per_s = up_bytes_per_s = communication * 1024 / 8``;
- availability: client online when ``t % finish_time`` lies in some ``[active[i],
  inactive[i]]`` (client_metadata.py, ``is_active``): intervals ``[active[i],
  inactive[i])`` repeating with ``period_s = finish_time``.

Row order (``order``): "fedscale" lays rows out so that fedray's ``client c -> row c % n``
gives client c what FedScale gives its client c + 1 (FedScale numbers clients from 1): the
device profile under key ``(c + 1) % n``, or FedScale's fallback of 1 ms and 1 kbit/s when
no entry has that key (aggregator.py, ``client_register_handler``), and the availability
entry at position ``(c + 1) % n`` in the file's order (client_manager.py,
``register_client``). "keys" gives row r the r-th smallest key, with no fallback. Each row
keeps its FedScale key in a ``source_key`` column (empty for a fallback row).

A pickle can run code when read. These files are plain data, so they are read by an
unpickler that resolves no global at all: dicts, lists, tuples, numbers and strings load,
and anything that names a class or a function (a numpy scalar included) is refused before
it can run.
"""

from __future__ import annotations

import math
import pickle
from typing import Any

import numpy as np
import pyarrow as pa

from fedray.errors import FedrayError, one_line
from fedray.state.storage import filesystem

TRAIN_FACTOR = 3.0  # FedScale's augmentation_factor: a training sample = 3 inference passes
KBIT_BYTES = 1024 / 8  # bytes per FedScale kbit (its model size is bytes / 1024 * 8)
FALLBACK = {"computation": 1.0, "communication": 1.0}  # FedScale's profile for a missing key
ORDERS = ("fedscale", "keys")


class _PlainUnpickler(pickle.Unpickler):
    """Resolves no global: only the pickle opcodes of plain Python data can succeed."""

    def find_class(self, module: str, name: str) -> Any:
        raise FedrayError(f"pickle refers to {module}.{name}, but a FedScale trace holds only "
                          f"dicts, lists, numbers and strings (refused, nothing was run)")

    def persistent_load(self, pid: Any) -> Any:
        raise FedrayError("pickle uses persistent ids, which a FedScale trace never does")


def load_plain_pickle(url: str) -> Any:
    """The plain data in a pickle file (fsspec URL), through ``_PlainUnpickler``."""
    fs, path = filesystem(url, "FedScale trace", what=None)
    try:
        with fs.open(path, "rb") as f:
            return _PlainUnpickler(f, encoding="latin1").load()
    except FileNotFoundError:
        raise FedrayError(f"{url}: no such FedScale trace file") from None
    except FedrayError as exc:
        raise FedrayError(f"{url}: {exc}") from None
    except Exception as exc:  # any failure to decode means "not a FedScale trace"
        raise FedrayError(f"{url}: not a FedScale trace pickle ({type(exc).__name__}: "
                          f"{one_line(exc)})") from None


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _entries(url: str, doc: Any, order: str) -> tuple[list[Any], list[Any]]:
    """(rows' keys, rows' entries) in the row order asked for; a key may be None (fallback)."""
    if order not in ORDERS:
        raise FedrayError(f"FedScale conversion: order must be one of {', '.join(ORDERS)}, "
                          f"got {order!r}")
    if not isinstance(doc, dict):
        raise FedrayError(f"{url}: expected a pickled dict of client id -> entry, got "
                          f"{type(doc).__name__}")
    if not doc:
        raise FedrayError(f"{url}: the FedScale trace has no entries")
    for key, entry in doc.items():
        if not isinstance(key, int) or isinstance(key, bool):
            raise FedrayError(f"{url}: key {key!r}: FedScale client ids are integers")
        if not isinstance(entry, dict):
            raise FedrayError(f"{url}: entry {key!r}: expected a dict, got "
                              f"{type(entry).__name__}")
    keys = sorted(doc) if order == "keys" else list(doc)
    return keys, [doc[k] for k in keys]


def _field(url: str, key: Any, entry: dict, name: str) -> Any:
    if name not in entry:
        raise FedrayError(f"{url}: entry {key!r}: missing field {name!r}")
    return entry[name]


def _positive(url: str, key: Any, entry: dict, name: str) -> float:
    v = _field(url, key, entry, name)
    if not (_is_number(v) and v > 0):
        raise FedrayError(f"{url}: entry {key!r}: {name!r} must be a number > 0, got {v!r}")
    return float(v)


def from_fedscale_devices(url: str, *, order: str = "fedscale",
                          train_factor: float = TRAIN_FACTOR) -> pa.Table:
    """A fedray device table from FedScale's ``client_device_capacity`` pickle."""
    doc = load_plain_pickle(url)
    keys, entries = _entries(url, doc, order)
    if not (math.isfinite(train_factor) and train_factor > 0):
        raise FedrayError(f"FedScale conversion: train_factor must be > 0, got {train_factor!r}")
    n = len(keys)
    if order == "fedscale":  # row r: what FedScale gives its client r + 1
        wanted = [(r + 1) % n for r in range(n)]
        keys = [k if k in doc else None for k in wanted]
        entries = [doc.get(k, FALLBACK) for k in wanted]
    compute = np.empty(n)
    bandwidth = np.empty(n)
    for r, (key, entry) in enumerate(zip(keys, entries, strict=True)):
        compute[r] = _positive(url, key, entry, "computation")
        bandwidth[r] = _positive(url, key, entry, "communication")
    return pa.table({
        "client_id": np.arange(n, dtype=np.int64),
        "compute_s_per_example": train_factor * compute / 1000.0,
        "down_bytes_per_s": bandwidth * KBIT_BYTES,
        "up_bytes_per_s": bandwidth * KBIT_BYTES,
        "source_key": pa.array(keys, type=pa.int64()),
    })


def _intervals(url: str, key: Any, entry: dict) -> tuple[list[tuple[float, float]], float]:
    """An entry's online intervals within one period, sorted and merged, and the period."""
    active = _field(url, key, entry, "active")
    inactive = _field(url, key, entry, "inactive")
    period = _positive(url, key, entry, "finish_time")
    for name, v in (("active", active), ("inactive", inactive)):
        if not isinstance(v, (list, tuple)) or not all(_is_number(x) for x in v):
            raise FedrayError(f"{url}: entry {key!r}: {name!r} must be a list of numbers")
    if len(active) != len(inactive):
        raise FedrayError(f"{url}: entry {key!r}: 'active' has {len(active)} times, "
                          f"'inactive' {len(inactive)}")
    spans = []
    for i, (a, b) in enumerate(zip(active, inactive, strict=True)):
        if a < 0 or b < a:
            raise FedrayError(f"{url}: entry {key!r}: interval {i} [{a!r}, {b!r}] must have "
                              f"0 <= active <= inactive")
        # FedScale reads t % finish_time, so time at or past finish_time is never reached
        a, b = float(a), min(float(b), period)
        if a < b:
            spans.append((a, b))
    merged: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged, period


def from_fedscale_availability(url: str, *, order: str = "fedscale") -> pa.Table:
    """A fedray availability table (periodic) from FedScale's ``client_behave_trace``."""
    doc = load_plain_pickle(url)
    keys, entries = _entries(url, doc, order)
    n = len(keys)
    if order == "fedscale":  # row r: the entry at position (r + 1) % n, as FedScale's c + 1
        keys = [keys[(r + 1) % n] for r in range(n)]
        entries = [entries[(r + 1) % n] for r in range(n)]
    ids: list[int] = []
    starts: list[float | None] = []
    ends: list[float | None] = []
    periods: list[float] = []
    sources: list[int] = []
    for r, (key, entry) in enumerate(zip(keys, entries, strict=True)):
        spans, period = _intervals(url, key, entry)
        for a, b in spans or [(None, None)]:
            ids.append(r)
            starts.append(a)
            ends.append(b)
            periods.append(period)
            sources.append(key)
    return pa.table({
        "client_id": pa.array(ids, type=pa.int64()),
        "start_s": pa.array(starts, type=pa.float64()),
        "end_s": pa.array(ends, type=pa.float64()),
        "period_s": pa.array(periods, type=pa.float64()),
        "source_key": pa.array(sources, type=pa.int64()),
    })
