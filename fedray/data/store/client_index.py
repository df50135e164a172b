"""A partition store's per-client columns, read lazily: which shard and rows hold each
client, how many examples it has, its name and its label histogram.

Why a file of its own: a store describes each client with a few dozen numbers, and a million
clients make tens of millions of them. Store format 1 kept them as JSON lists in
manifest.json, so every open (the driver, ``fedray partition --describe``) parsed all of
them, about 200 MB at a million clients of 62 classes. Format 2 keeps them in
``clients.arrow``: one Arrow IPC file, uncompressed, one record batch, one row per client:

    name                 large_string
    {split}_shard        int64   the client's shard: an index into the split's shards, in
                                 the order manifest.json lists them
    {split}_offset       int64   its first row in that shard
    {split}_count        int64   its examples (rows)
    {split}_histogram    large_list<struct<label: int32, count: int32>>: the labels it
                         holds, ascending, each with how often (a sparse label histogram;
                         with sequence labels every position counts, padding included)

for ``split`` in ``train``, then ``test`` where clients hold their own test data. On a
local disk the file is memory-mapped and every column is a numpy view of it: opening it
reads its footer and schema whatever the population, ``counts("train")`` is a view, and a
client's name or histogram is one lookup; only the pages a caller touches are read. On any
other fsspec filesystem the file is read into memory once. A format 1 manifest's lists are
turned into the same record batch (``from_v1``), so no caller sees the version.

Opening checks what is cheap (size, schema, one row per client, no nulls); the checks that
cost a pass over every client (rows inside their shard, no row owned twice, histograms that
add up) are ``check``, run when a store is built and by ``verify_store``. A worker still
checks each client it reads against its shard (``row_problem``).
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa

from fedray.errors import FedrayError

CLIENTS_FILE = "clients.arrow"
INDEX_SPLITS = ("train", "test")  # the splits whose data belong to clients
HISTOGRAM_TYPE = pa.large_list(pa.struct([("label", pa.int32()), ("count", pa.int32())]))
_INT32_MAX = 2**31 - 1


def numpy_view(arr: pa.Array) -> np.ndarray:
    """A read-only numpy view of a numeric Arrow array without nulls: what
    ``to_numpy(zero_copy_only=True)`` gives, without that call's first use importing pandas
    into every process that opens a store or reads a client."""
    t = arr.type
    kind = "f" if pa.types.is_floating(t) else "i" if pa.types.is_signed_integer(t) else \
        "u" if pa.types.is_unsigned_integer(t) else None
    if kind is None or arr.null_count:
        return arr.to_numpy(zero_copy_only=True)
    dtype = np.dtype(f"<{kind}{t.bit_width // 8}")
    if len(arr) == 0:
        return np.zeros(0, dtype)
    return np.frombuffer(arr.buffers()[1], dtype=dtype, count=len(arr),
                         offset=arr.offset * dtype.itemsize)


def index_schema(splits: Sequence[str]) -> pa.Schema:
    fields = [pa.field("name", pa.large_string())]
    for s in splits:
        fields += [pa.field(f"{s}_shard", pa.int64()), pa.field(f"{s}_offset", pa.int64()),
                   pa.field(f"{s}_count", pa.int64()), pa.field(f"{s}_histogram", HISTOGRAM_TYPE)]
    return pa.schema(fields)


def sparse_histograms(y: np.ndarray, counts: np.ndarray, num_classes: int
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The label histograms of clients whose rows follow each other in ``y`` (``counts``
    rows each), sparse: (entries per client [k], labels [e] int32, counts [e] int32), each
    client's labels ascending. With sequence labels ([n, L]) every position counts."""
    per_row = 1 if y.ndim == 1 else int(np.prod(y.shape[1:]))
    flat = y.reshape(-1).astype(np.int64, copy=False)
    owner = np.repeat(np.arange(len(counts), dtype=np.int64), np.asarray(counts) * per_row)
    keys, n = np.unique(owner * num_classes + flat, return_counts=True)
    lengths = np.bincount(keys // num_classes, minlength=len(counts)).astype(np.int64)
    return lengths, (keys % num_classes).astype(np.int32), n.astype(np.int32)


def histogram_array(lengths: np.ndarray, labels: np.ndarray, counts: np.ndarray
                    ) -> pa.LargeListArray:
    starts = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    entries = pa.StructArray.from_arrays([pa.array(labels, pa.int32()),
                                          pa.array(counts, pa.int32())], names=["label", "count"])
    return pa.LargeListArray.from_arrays(pa.array(starts, pa.int64()), entries)


def row_problem(split: str, shard: int, offset: int, count: int, files: list[dict]
                ) -> str | None:
    """What is wrong with a client's place in its split's shards, or None."""
    if not 0 <= shard < len(files) or offset < 0 or count < 0:
        return (f"has {split} shard {shard}, offset {offset}, count {count}: the {split} "
                f"split has {len(files)} shards")
    rows = files[shard]["rows"]
    if offset + count > rows:
        return (f"has {split} rows {offset}..{offset + count - 1}, past the {rows} rows of "
                f"{files[shard]['file']}")
    return None


class ClientIndex:
    """The per-client columns of a store (see the module docstring), opened lazily.

    Picklable and small when pickled: a memory-mapped index ships its location, and each
    process maps the file again on first use."""

    def __init__(self, where: str, num_clients: int, num_classes: int, splits: Sequence[str],
                 batch: pa.RecordBatch | None = None, location: tuple[str, str, int] | None = None):
        self.where = where  # what error lines name: the side file, or a v1 manifest
        self.num_clients = int(num_clients)
        self.num_classes = int(num_classes)
        self.splits = tuple(splits)
        self._location = location  # (store url, file name, bytes): read lazily
        self._batch = batch
        self._views: dict[str, Any] = {}

    @classmethod
    def from_manifest(cls, url: str, m: dict) -> ClientIndex:
        """The index of the store at ``url`` whose manifest (version 1 or 2) is ``m``."""
        if m.get("format_version") == 1:
            return cls.from_v1(url, m)
        entry = m["client_index"]
        return cls(f"{url.rstrip('/')}/{entry['file']}", m["num_clients"], m["num_classes"],
                   entry["splits"], location=(url, entry["file"], int(entry["bytes"])))

    @classmethod
    def from_columns(cls, where: str, num_classes: int, names: pa.Array,
                     columns: dict[str, dict[str, Any]]) -> ClientIndex:
        """An index held in memory: ``columns[split]`` has ``shard``, ``offset``,
        ``count`` ([k] int64 each) and ``histogram`` (``histogram_array``)."""
        arrays = [names.cast(pa.large_string())]
        for c in columns.values():
            arrays += [pa.array(c["shard"], pa.int64()), pa.array(c["offset"], pa.int64()),
                       pa.array(c["count"], pa.int64()), c["histogram"]]
        batch = pa.RecordBatch.from_arrays(arrays, schema=index_schema(list(columns)))
        return cls(where, len(names), num_classes, list(columns), batch=batch)

    @classmethod
    def from_v1(cls, url: str, m: dict) -> ClientIndex:
        """A format 1 manifest's per-client JSON lists as an index (``read_manifest`` has
        checked that ``clients`` holds ``num_clients`` names and the train split)."""
        where = f"{url.rstrip('/')}/manifest.json"

        def bad(what: str) -> FedrayError:
            return FedrayError(f"{where}: {what}")

        n, classes = m["num_clients"], m["num_classes"]
        clients = m["clients"]
        try:
            names = pa.array(clients["names"], pa.large_string())
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            raise bad("clients.names must be strings") from None
        columns: dict[str, dict[str, Any]] = {}
        for split in INDEX_SPLITS:
            entry = clients.get(split)
            if entry is None:
                continue
            col: dict[str, Any] = {}
            for key in ("shard", "offset", "count", "label_histogram"):
                values = entry.get(key) if isinstance(entry, dict) else None
                if not isinstance(values, list) or len(values) != n:
                    raise bad(f"clients.{split}.{key} must list {n} clients")
                try:
                    col[key] = np.asarray(values, dtype=np.int64)
                except (TypeError, ValueError, OverflowError):
                    raise bad(f"clients.{split}.{key} must be whole numbers") from None
                shape = (n,) if key != "label_histogram" else (n, classes)
                if col[key].shape != shape:
                    what = "whole numbers" if key != "label_histogram" else \
                        f"{classes} whole numbers per client"
                    raise bad(f"clients.{split}.{key} must be {what}")
            hist = col.pop("label_histogram")
            if hist.size and (hist.min() < 0 or hist.max() > _INT32_MAX):
                raise bad(f"clients.{split}.label_histogram must be counts from 0 to "
                          f"{_INT32_MAX}")
            owner, label = np.nonzero(hist)
            col["histogram"] = histogram_array(np.bincount(owner, minlength=n), label,
                                               hist[owner, label])
            columns[split] = col
        return cls.from_columns(where, classes, names, columns)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_views"] = {}
        if self._location is not None:
            state["_batch"] = None  # every process maps the file itself
        return state

    # reading

    @property
    def batch(self) -> pa.RecordBatch:
        if self._batch is None:
            self._batch = self._open()
        return self._batch

    def _fail(self, what: str) -> FedrayError:
        return FedrayError(f"{self.where}: {what}")

    def _open(self) -> pa.RecordBatch:
        assert self._location is not None
        url, file, nbytes = self._location
        fs, path = fsspec.core.url_to_fs(url)
        p = posixpath.join(path.rstrip("/"), file)
        protocols = (fs.protocol,) if isinstance(fs.protocol, str) else fs.protocol
        try:
            if "file" in protocols:
                size = fs.size(p)
                source: Any = pa.memory_map(p, "r")
            else:
                data = fs.cat_file(p)
                size, source = len(data), pa.BufferReader(data)
            if size != nbytes:
                raise self._fail(f"has {size} bytes, the manifest says {nbytes}")
            reader = pa.ipc.open_file(source)
            if reader.num_record_batches != 1:
                raise self._fail(f"holds {reader.num_record_batches} record batches, not 1")
            batch = reader.get_batch(0)
            batch.validate()  # buffer sizes: cheap, unlike validate(full=True)
        except FileNotFoundError:
            raise self._fail("is missing") from None
        except (pa.ArrowInvalid, OSError) as exc:
            raise self._fail(f"is corrupt: {str(exc).splitlines()[0]}") from None
        expected = index_schema(self.splits)
        for i, field in enumerate(expected):
            got = batch.schema.field(i) if i < batch.num_columns else None
            if got is None or got.name != field.name or not got.type.equals(field.type):
                have = f"{got.name}: {got.type}" if got is not None else "nothing"
                raise self._fail(f"column {i} must be {field.name}: {field.type}, found {have}")
        if batch.num_columns != len(expected):
            raise self._fail(f"has {batch.num_columns} columns, expected {len(expected)}: "
                             f"{', '.join(expected.names)}")
        if batch.num_rows != self.num_clients:
            raise self._fail(f"holds {batch.num_rows} clients, the manifest says "
                             f"{self.num_clients}")
        for name, column in zip(batch.schema.names, batch.columns, strict=True):
            nested = [column]
            if isinstance(column, pa.LargeListArray):
                nested += [column.values, *column.values.flatten()]
            if any(a.null_count for a in nested):
                raise self._fail(f"column {name} has missing values")
        return batch

    def _view(self, column: str) -> np.ndarray:
        view = self._views.get(column)
        if view is None:
            view = self._views[column] = numpy_view(self.batch.column(column))
        return view

    def _split(self, split: str) -> str:
        if split not in self.splits:
            raise FedrayError(f"{self.where}: the store has no per-client {split} data")
        return split

    def counts(self, split: str = "train") -> np.ndarray:
        """Every client's examples in ``split`` ([num_clients] int64, a read-only view)."""
        return self._view(f"{self._split(split)}_count")

    def shards(self, split: str = "train") -> np.ndarray:
        return self._view(f"{self._split(split)}_shard")

    def offsets(self, split: str = "train") -> np.ndarray:
        return self._view(f"{self._split(split)}_offset")

    def name(self, cid: int) -> str:
        return self.batch.column(0)[int(cid)].as_py()

    def names(self) -> list[str]:
        """Every client's name: a list of ``num_clients`` strings (built on each call)."""
        return self.batch.column(0).to_pylist()

    def sparse(self, split: str = "train") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every client's label histogram as (starts [num_clients + 1] int64, labels [e]
        int32, counts [e] int32): client c's entries are ``starts[c]:starts[c + 1]``."""
        key = f"{self._split(split)}_histogram"
        got = self._views.get(key)
        if got is None:
            column = self.batch.column(key)
            entries = column.values
            got = self._views[key] = (numpy_view(column.offsets), numpy_view(entries.field(0)),
                                      numpy_view(entries.field(1)))
        return got

    def histogram(self, cid: int, split: str = "train") -> np.ndarray:
        """Client ``cid``'s label histogram, dense ([num_classes] int64)."""
        return self.histograms(split, [cid])[0]

    def histograms(self, split: str = "train", ids: Sequence[int] | np.ndarray | None = None
                   ) -> np.ndarray:
        """Dense label histograms ([len(ids), num_classes] int64) of the clients ``ids``
        (None: every client -- num_clients x num_classes numbers, for small stores)."""
        starts, labels, counts = self.sparse(split)
        ids = np.arange(self.num_clients) if ids is None else np.asarray(ids, dtype=np.int64)
        lo, hi = starts[ids], starts[ids + 1]
        lengths = hi - lo
        pos = np.repeat(lo - (np.cumsum(lengths) - lengths), lengths) \
            + np.arange(int(lengths.sum()))
        out = np.zeros((len(ids), self.num_classes), dtype=np.int64)
        rows = np.repeat(np.arange(len(ids)), lengths)
        out[rows, labels[pos]] = counts[pos]
        return out

    def class_totals(self, split: str = "train") -> np.ndarray:
        """Examples per class over every client ([num_classes] int64; sequence labels
        count every position)."""
        _, labels, counts = self.sparse(split)
        return np.bincount(labels, weights=counts, minlength=self.num_classes).astype(np.int64)

    def entry_owners(self, split: str = "train") -> np.ndarray:
        """The client of each histogram entry ([e] int64)."""
        starts = self.sparse(split)[0]
        return np.repeat(np.arange(self.num_clients, dtype=np.int64), np.diff(starts))

    # checking

    def check(self, shards: dict[str, list[dict]], label_size: int = 1) -> None:
        """Everything the index says fits the shards ``shards[split]`` (manifest order):
        every client's rows inside its shard, no row owned by two clients, and histograms
        of labels within ``num_classes``, listed once each, ascending, that add up to the
        client's examples (times ``label_size``, the labels per example).

        Checksums prove the files are the ones the manifest was written with, not that the
        index is sound; a hand-edited or foreign one would otherwise crash a worker mid-round
        or train clients on each other's rows without a word. A pass of array operations
        over every client: done when a store is built and by ``verify_store``, not on every
        open."""
        try:
            self.batch.validate(full=True)
        except pa.ArrowInvalid as exc:
            raise self._fail(f"is corrupt: {str(exc).splitlines()[0]}") from None
        for split in self.splits:
            self._check_rows(split, shards[split])
            self._check_histograms(split, label_size)

    def _client(self, c: int) -> str:
        return f"client {c} ({self.name(c)!r})"

    def _check_rows(self, split: str, files: list[dict]) -> None:
        shard, offset, count = self.shards(split), self.offsets(split), self.counts(split)
        rows = np.asarray([sh["rows"] for sh in files], dtype=np.int64)
        inside = (shard >= 0) & (shard < len(files)) & (offset >= 0) & (count >= 0)
        end = offset + count
        inside[inside] = end[inside] <= rows[shard[inside]]
        wrong = np.flatnonzero(~inside)
        if len(wrong):
            c = int(wrong[0])
            problem = row_problem(split, int(shard[c]), int(offset[c]), int(count[c]), files)
            raise self._fail(f"{self._client(c)} {problem}")
        held = np.flatnonzero(count > 0)
        order = held[np.lexsort((offset[held], shard[held]))]
        same = shard[order[1:]] == shard[order[:-1]]
        overlap = np.flatnonzero(same & (offset[order[1:]] < end[order[:-1]]))
        if len(overlap):
            a, b = int(order[overlap[0]]), int(order[overlap[0] + 1])
            raise self._fail(f"clients {a} ({self.name(a)!r}) and {b} ({self.name(b)!r}) share "
                             f"{split} rows {int(offset[b])}..{min(int(end[a]), int(end[b])) - 1}"
                             f" of {files[int(shard[a])]['file']}")

    def _check_histograms(self, split: str, label_size: int) -> None:
        starts, labels, counts = self.sparse(split)
        owner = self.entry_owners(split)
        bad = np.flatnonzero((labels < 0) | (labels >= self.num_classes) | (counts <= 0))
        if len(bad):
            e = int(bad[0])
            raise self._fail(f"{self._client(int(owner[e]))} has {split} label {int(labels[e])} "
                             f"{int(counts[e])} times in its histogram; labels are "
                             f"0..{self.num_classes - 1}, counts >= 1")
        repeat = np.flatnonzero((owner[1:] == owner[:-1]) & (labels[1:] <= labels[:-1]))
        if len(repeat):
            raise self._fail(f"{self._client(int(owner[repeat[0]]))}: its {split} histogram "
                             "lists labels out of order or twice")
        total = np.bincount(owner, weights=counts, minlength=self.num_clients)
        differ = np.flatnonzero(total != self.counts(split) * label_size)
        if len(differ):
            c = int(differ[0])
            raise self._fail(f"{self._client(c)}: its {split} histogram counts {int(total[c])} "
                             f"labels, but it has {int(self.counts(split)[c])} examples"
                             + (f" of {label_size} labels" if label_size > 1 else ""))
