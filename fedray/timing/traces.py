"""fedray's trace files: device profiles and availability intervals, as CSV or Arrow tables.

Two table layouts (docs/time.md lists them field by field):

- a device trace, one row per device: ``client_id`` (0..n-1, each once),
  ``compute_s_per_example``, ``down_bytes_per_s``, ``up_bytes_per_s``;
- an availability trace, one row per online interval: ``client_id`` (0..n-1, each at least
  once), ``start_s``, ``end_s`` (``[start, end)`` in seconds; both empty for a client never
  online) and an optional ``period_s`` (the client's intervals repeat with that period;
  empty: absolute times).

Client ``c`` of a simulation takes trace row ``c % n``. Other columns are allowed and
ignored (a converted FedScale trace keeps its source key). A file is CSV (optionally
compressed, e.g. ``.csv.gz``), an Arrow IPC file (``.arrow``/``.feather``) or parquet,
recognised by its first bytes when read and by its name when written; never pickle, which
can run code when read. Paths are fsspec URLs. Bad input is one line naming the file, the
column and the row (from 0; a CSV's header is not a row). A file is written whole or not at
all (written beside, then moved into place).

The generators write the seeded models of fedray.timing.devices and .availability into
these layouts, so a run can be repeated, inspected or shared with the trace it used.
"""

from __future__ import annotations

import math
import posixpath
import uuid

import numpy as np
import pyarrow as pa

from fedray.errors import FedrayError, one_line
from fedray.state.storage import filesystem
from fedray.timing.availability import Diurnal, TraceAvailability
from fedray.timing.devices import DeviceTrace, LogNormalDevices

DEVICE_COLUMNS = ("client_id", "compute_s_per_example", "down_bytes_per_s", "up_bytes_per_s")
AVAILABILITY_COLUMNS = ("client_id", "start_s", "end_s")
PERIOD_COLUMN = "period_s"

_PARQUET, _ARROW = b"PAR1", b"ARROW1"
_CSV_TYPES = {"client_id": pa.int64(), **{c: pa.float64() for c in DEVICE_COLUMNS[1:]},
              "start_s": pa.float64(), "end_s": pa.float64(), PERIOD_COLUMN: pa.float64()}


# --- files -------------------------------------------------------------------------------

def read_table(url: str) -> pa.Table:
    """The table in a trace file (CSV, Arrow IPC file or parquet, by its first bytes)."""
    fs, path = filesystem(url, "trace file", what=None)
    try:
        with fs.open(path, "rb", compression="infer") as f:
            data = f.read()
    except FileNotFoundError:
        raise FedrayError(f"{url}: no such trace file") from None
    except (OSError, EOFError, ValueError) as exc:
        raise FedrayError(f"{url}: cannot read ({one_line(exc)})") from None
    buf = pa.BufferReader(data)
    try:
        if data[:len(_PARQUET)] == _PARQUET:
            import pyarrow.parquet as pq

            return pq.read_table(buf)
        if data[:len(_ARROW)] == _ARROW:
            return pa.ipc.open_file(buf).read_all()
    except (pa.ArrowException, OSError) as exc:
        kind = "parquet" if data[:4] == _PARQUET else "Arrow IPC"
        raise FedrayError(f"{url}: not a readable {kind} file ({one_line(exc)})") from None
    import pyarrow.csv as pcsv

    try:
        convert = pcsv.ConvertOptions(column_types=_CSV_TYPES)
        table = pcsv.read_csv(buf, convert_options=convert)
    except pa.ArrowException as exc:
        raise FedrayError(f"{url}: not a readable CSV trace ({one_line(exc)})") from None
    try:
        table.column_names  # noqa: B018  (pyarrow decodes a CSV header only when asked)
    except UnicodeDecodeError:
        raise FedrayError(f"{url}: not a readable CSV trace (its header is not UTF-8 "
                          "text)") from None
    return table


def file_format(url: str) -> tuple[str, str | None]:
    from fsspec.utils import infer_compression

    name = url.lower()
    compression = infer_compression(name)
    if compression:
        name = name.rsplit(".", 1)[0]
    if name.endswith(".csv"):
        return "csv", compression
    if compression is None and name.endswith(".parquet"):
        return "parquet", None
    if compression is None and name.endswith((".arrow", ".feather", ".ipc")):
        return "arrow", None
    raise FedrayError(f"{url}: unknown trace format; name it *.csv (or *.csv.gz), "
                      f"*.parquet or *.arrow")


def write_table(table: pa.Table, url: str) -> None:
    """Write ``table`` whole in the format its name says (no validation: see the
    ``write_*_trace`` functions)."""
    fmt, compression = file_format(url)
    out = pa.BufferOutputStream()
    if fmt == "csv":
        import pyarrow.csv as pcsv

        pcsv.write_csv(table, out)
    elif fmt == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, out)
    else:
        with pa.ipc.new_file(out, table.schema) as writer:
            writer.write_table(table)
    data = out.getvalue().to_pybytes()
    fs, path = filesystem(url, "trace file", what=None)
    parent = posixpath.dirname(path.rstrip("/"))
    tmp = posixpath.join(parent, f".{posixpath.basename(path)}.{uuid.uuid4().hex}.tmp")
    try:
        if parent:
            fs.makedirs(parent, exist_ok=True)
        with fs.open(tmp, "wb", compression=compression) as f:
            f.write(data)
        fs.mv(tmp, path)
    except OSError as exc:
        try:
            if fs.exists(tmp):
                fs.rm(tmp)
        except OSError:
            pass
        raise FedrayError(f"{url}: cannot write ({exc.strerror or one_line(exc)})") from None


# --- columns -----------------------------------------------------------------------------

def _column(table: pa.Table, name: str, where: str, *, integer: bool = False
            ) -> tuple[np.ndarray, np.ndarray]:
    """(values, null mask) of a numeric column, as int64 or float64."""
    if name not in table.column_names:
        raise FedrayError(f"{where}: no column {name!r}; it has: "
                          f"{', '.join(table.column_names) or 'none'}")
    col = table.column(name)
    t = col.type
    ok = pa.types.is_integer(t) or (not integer and pa.types.is_floating(t)) \
        or pa.types.is_null(t)
    if not ok:
        kind = "integers" if integer else "numbers"
        raise FedrayError(f"{where}: column {name!r} must hold {kind}, it holds {t}")
    null = col.is_null().to_numpy(zero_copy_only=False).astype(bool) if len(col) else \
        np.zeros(0, dtype=bool)
    filled = col.fill_null(0) if col.null_count else col
    if pa.types.is_null(t):
        values = np.zeros(len(col), dtype=np.int64 if integer else np.float64)
    else:
        values = np.asarray(filled.to_numpy(zero_copy_only=False),
                            dtype=np.int64 if integer else np.float64)
    return values, null


def _bad(where: str, name: str, row: int, problem: str) -> FedrayError:
    return FedrayError(f"{where}: column {name!r}, row {row}: {problem}")


def _ids(table: pa.Table, where: str) -> np.ndarray:
    ids, null = _column(table, "client_id", where, integer=True)
    if null.any():
        raise _bad(where, "client_id", int(np.argmax(null)), "missing value")
    if len(ids) and ids.min() < 0:
        row = int(np.argmax(ids < 0))
        raise _bad(where, "client_id", row, f"must be >= 0, got {int(ids[row])}")
    return ids


def _missing_id(ids: np.ndarray) -> int | None:
    """The smallest id in 0..max(ids) that no row has, or None (without allocating max(ids):
    a stray id of 10^12 must not exhaust memory)."""
    u = np.unique(ids)
    if u[-1] == len(u) - 1:
        return None
    return int(np.argmax(u != np.arange(len(u))))


# --- device traces -----------------------------------------------------------------------

def device_trace(table: pa.Table, where: str = "device trace") -> DeviceTrace:
    """A DeviceTrace from a table in the device layout, checked row by row."""
    if table.num_rows == 0:
        raise FedrayError(f"{where}: no rows")
    ids = _ids(table, where)
    values = {}
    for name in DEVICE_COLUMNS[1:]:
        v, null = _column(table, name, where)
        bad = null | ~np.isfinite(v) | ~(v > 0)
        if bad.any():
            row = int(np.argmax(bad))
            got = "a missing value" if null[row] else repr(float(v[row]))
            raise _bad(where, name, row, f"must be > 0 and finite, got {got}")
        values[name] = v
    order = np.argsort(ids, kind="stable")
    s = ids[order]
    dup = np.flatnonzero(s[1:] == s[:-1])
    if dup.size:
        row = int(order[dup[0] + 1])
        raise _bad(where, "client_id", row, f"client id {int(ids[row])} appears twice")
    if s[-1] != len(s) - 1:
        raise FedrayError(f"{where}: column 'client_id': client ids must be 0..{len(s) - 1}, "
                          f"each once; {_missing_id(ids)} is missing")
    return DeviceTrace(*(values[name][order] for name in DEVICE_COLUMNS[1:]))


def device_table(trace: DeviceTrace) -> pa.Table:
    """The device layout of a DeviceTrace (row r = client id r)."""
    return pa.table({"client_id": np.arange(trace.rows, dtype=np.int64),
                     "compute_s_per_example": trace.compute_s_per_example,
                     "down_bytes_per_s": trace.down_bytes_per_s,
                     "up_bytes_per_s": trace.up_bytes_per_s})


def read_device_trace(url: str) -> DeviceTrace:
    return device_trace(read_table(url), url)


def write_device_trace(trace: DeviceTrace | pa.Table, url: str) -> None:
    """Write a device trace (a table is checked first: nothing invalid is written)."""
    if isinstance(trace, pa.Table):
        device_trace(trace, url)
        write_table(trace, url)
    else:
        write_table(device_table(trace), url)


def generate_device_trace(n: int, seed: int, *,
                          compute_s_per_example: float = LogNormalDevices.compute_s_per_example,
                          compute_sigma: float = LogNormalDevices.compute_sigma,
                          down_bytes_per_s: float = LogNormalDevices.down_bytes_per_s,
                          down_sigma: float = LogNormalDevices.down_sigma,
                          up_bytes_per_s: float = LogNormalDevices.up_bytes_per_s,
                          up_sigma: float = LogNormalDevices.up_sigma) -> pa.Table:
    """``n`` devices drawn from LogNormalDevices(seed, ...): row c is exactly the profile
    that model gives client c, so a run on the trace equals a run on the model for the
    first ``n`` clients."""
    if n < 1:
        raise FedrayError(f"generate_device_trace: n must be >= 1, got {n}")
    model = LogNormalDevices(seed, compute_s_per_example, compute_sigma, down_bytes_per_s,
                             down_sigma, up_bytes_per_s, up_sigma)
    p = model.profiles(np.arange(n, dtype=np.int64))
    return device_table(DeviceTrace(p.compute_s_per_example, p.down_bytes_per_s,
                                    p.up_bytes_per_s))


# --- availability traces -----------------------------------------------------------------

def availability_trace(table: pa.Table, where: str = "availability trace"
                       ) -> TraceAvailability:
    """A TraceAvailability from a table in the availability layout, checked row by row;
    touching intervals of one client become one."""
    if table.num_rows == 0:
        raise FedrayError(f"{where}: no rows")
    ids = _ids(table, where)
    start, s_null = _column(table, "start_s", where)
    end, e_null = _column(table, "end_s", where)
    if PERIOD_COLUMN in table.column_names:
        period, p_null = _column(table, PERIOD_COLUMN, where)
    else:
        period, p_null = np.zeros(len(ids)), np.ones(len(ids), dtype=bool)
    half = s_null != e_null
    if half.any():
        row = int(np.argmax(half))
        name = "start_s" if s_null[row] else "end_s"
        raise _bad(where, name, row, "missing value (leave both start_s and end_s empty "
                   "for a client never online)")
    empty = s_null
    for name, v in (("start_s", start), ("end_s", end)):
        bad = ~empty & (~np.isfinite(v) | (v < 0))
        if bad.any():
            row = int(np.argmax(bad))
            raise _bad(where, name, row, f"must be >= 0 and finite, got {float(v[row])!r}")
    bad = ~empty & (end <= start)
    if bad.any():
        row = int(np.argmax(bad))
        raise _bad(where, "end_s", row, f"must be > start_s ({float(start[row])!r}), got "
                   f"{float(end[row])!r}")
    bad = ~p_null & (~np.isfinite(period) | ~(period > 0))
    if bad.any():
        row = int(np.argmax(bad))
        raise _bad(where, PERIOD_COLUMN, row, f"must be > 0 and finite, got "
                   f"{float(period[row])!r}")
    bad = ~p_null & ~empty & (end > period)
    if bad.any():
        row = int(np.argmax(bad))
        raise _bad(where, "end_s", row, f"must be <= period_s ({float(period[row])!r}), got "
                   f"{float(end[row])!r}")
    period = np.where(p_null, np.nan, period)

    missing = _missing_id(ids)
    if missing is not None:
        raise FedrayError(f"{where}: column 'client_id': client id {missing} has no row "
                          f"(ids must be 0..{int(ids.max())}; give a client never online a "
                          f"row with empty start_s and end_s)")
    order = np.lexsort((start, ~empty, ids))  # per client: empty rows first, then by start
    cid, st, en, per, emp = ids[order], start[order], end[order], period[order], empty[order]
    same = cid[1:] == cid[:-1]
    if np.any(same & emp[:-1]):
        row = int(order[np.argmax(same & emp[:-1])])
        raise _bad(where, "start_s", row, f"client {int(ids[row])} has online intervals, so it "
                   "cannot also have an empty (never online) row")
    per_key = np.where(np.isnan(per), -1.0, per)
    differ = same & (per_key[1:] != per_key[:-1])
    if differ.any():
        row = int(order[np.argmax(differ) + 1])
        raise _bad(where, PERIOD_COLUMN, row, f"client {int(ids[row])}'s rows must share one "
                   "period_s")
    overlap = same & (st[1:] < en[:-1])
    if overlap.any():
        i = int(np.argmax(overlap))
        raise _bad(where, "start_s", int(order[i + 1]), f"client {int(cid[i])}'s interval "
                   f"[{float(st[i + 1])!r}, {float(en[i + 1])!r}) overlaps the one in row "
                   f"{int(order[i])}")
    rows = int(cid[-1]) + 1
    row_period = np.full(rows, np.nan)
    row_period[cid] = per  # one value per client (checked above)
    keep = ~emp
    cid, st, en = cid[keep], st[keep], en[keep]
    # merge touching intervals: a new interval begins where the client changes or a gap opens
    begins = np.ones(len(cid), dtype=bool)
    begins[1:] = (cid[1:] != cid[:-1]) | (st[1:] > en[:-1])
    first = np.flatnonzero(begins)
    last = np.append(first[1:] - 1, len(cid) - 1).astype(np.int64)
    cid, st, en = cid[first], st[first], en[last]
    offsets = np.zeros(rows + 1, dtype=np.int64)
    np.add.at(offsets, cid + 1, 1)
    return TraceAvailability(np.cumsum(offsets), st, en, row_period)


def availability_table(trace: TraceAvailability) -> pa.Table:
    """The availability layout of a TraceAvailability (rows sorted by client and start)."""
    counts = np.diff(trace.offsets)
    cid = np.repeat(np.arange(trace.rows, dtype=np.int64), counts)
    never = np.flatnonzero(counts == 0)
    ids = np.concatenate([cid, never])
    starts = np.concatenate([trace.starts, np.full(len(never), np.nan)])
    ends = np.concatenate([trace.ends, np.full(len(never), np.nan)])
    order = np.lexsort((starts, ids))
    return _availability_columns(ids[order], starts[order], ends[order],
                                 trace.periods[ids[order]])


def _availability_columns(ids: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                          periods: np.ndarray) -> pa.Table:
    def col(a: np.ndarray) -> pa.Array:
        return pa.array(a, type=pa.float64(), mask=np.isnan(a))

    cols = {"client_id": pa.array(ids, type=pa.int64()), "start_s": col(starts),
            "end_s": col(ends)}
    if not np.all(np.isnan(periods)):
        cols[PERIOD_COLUMN] = col(periods)
    return pa.table(cols)


def read_availability_trace(url: str) -> TraceAvailability:
    return availability_trace(read_table(url), url)


def write_availability_trace(trace: TraceAvailability | pa.Table, url: str) -> None:
    """Write an availability trace (a table is checked first: nothing invalid is written)."""
    if isinstance(trace, pa.Table):
        availability_trace(trace, url)
        write_table(trace, url)
    else:
        write_table(availability_table(trace), url)


def generate_availability_trace(n: int, seed: int, *,
                                period_s: float = Diurnal.period_s,
                                online_s: float = Diurnal.online_s,
                                phase_spread_s: float | None = None,
                                jitter_s: float = Diurnal.jitter_s,
                                horizon_s: float | None = None) -> pa.Table:
    """The windows Diurnal(seed, ...) gives clients 0..n-1, as an availability table.

    horizon_s None: one period, repeating (``period_s`` column); the model repeats only
    without jitter, so jitter_s must be 0. horizon_s given: every window in ``[0,
    horizon_s)`` in absolute seconds, jitter included; a client with none there gets an
    empty row. Either way the trace answers exactly as the model does (on ``[0,
    horizon_s)`` for the second)."""
    if n < 1:
        raise FedrayError(f"generate_availability_trace: n must be >= 1, got {n}")
    model = Diurnal(seed, period_s, online_s, phase_spread_s, jitter_s)
    c = np.arange(n, dtype=np.int64)
    phase = model.phase(c)
    if horizon_s is None:
        if jitter_s:
            raise FedrayError("generate_availability_trace: jitter changes every period, so "
                              "a repeating trace cannot hold it; give horizon_s")
        if model.always:
            return _availability_columns(c, np.zeros(n), np.full(n, period_s),
                                         np.full(n, period_s))
        end = phase + online_s
        wraps = end > period_s
        ids = np.concatenate([c, c[wraps]])
        starts = np.concatenate([phase, np.zeros(int(wraps.sum()))])
        ends = np.concatenate([np.minimum(end, period_s), end[wraps] - period_s])
    else:
        if not (math.isfinite(horizon_s) and horizon_s > 0):
            raise FedrayError(f"generate_availability_trace: horizon_s must be > 0, got "
                              f"{horizon_s!r}")
        q = np.arange(-1, math.ceil(horizon_s / period_s) + 1, dtype=np.int64)
        cc, qq = np.broadcast_arrays(c[:, None], q[None, :])
        s = model.window_start(cc, qq, phase[:, None])
        e = s + online_s
        s, e = np.maximum(s, 0.0), np.minimum(e, horizon_s)
        keep = e > s
        ids, starts, ends = cc[keep], s[keep], e[keep]
        never = np.setdiff1d(c, ids)
        ids = np.concatenate([ids, never])
        starts = np.concatenate([starts, np.full(len(never), np.nan)])
        ends = np.concatenate([ends, np.full(len(never), np.nan)])
    order = np.lexsort((starts, ids))
    periods = np.full(len(ids), np.nan if horizon_s is not None else period_s)
    return _availability_columns(ids[order], starts[order], ends[order], periods)
