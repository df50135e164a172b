"""Partition store: a federated data set on disk, built once, read by any worker anywhere.

A store is a directory at any fsspec URL:
  manifest.json            what it holds: source, recipe, seed, clients (names, example
                           counts, label histograms, which shard and rows hold each client
                           per split), shard checksums, schema, fedray version
  train-00000.arrow ...    Arrow IPC files (Feather v2, uncompressed), one record batch each
  test-00000.arrow ...     per-client test data, when the partitioner gives clients their own
  central_test-00000.arrow the shared test set, when it does not
Clients' rows are contiguous and a client never spans two shards, so reading one client
touches one shard; on a local disk the shard is memory-mapped and the client's arrays are
views into it (no copy, no parsing). Many clients share a shard (``shard_mb``, ~64 MB), so a
million-client store is a few hundred files, not a million.

Writing goes to a temporary sibling directory that is renamed into place at the end, so an
interrupted or failed build never leaves a half-written store at the target URL.
"""

from __future__ import annotations

import hashlib
import json
import math
import posixpath
import uuid
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa

from fedray import __version__
from fedray.data.dataset import Dataset, Split
from fedray.data.partition import Partition
from fedray.errors import FedrayError, key_error
from fedray.state.storage import filesystem

MANIFEST = "manifest.json"
FORMAT = "fedray-partition-store"
FORMAT_VERSION = 1
SPLITS = ("train", "test", "central_test")


def _join(path: str, name: str) -> str:
    return posixpath.join(path.rstrip("/"), name)


def _schema(dtype: np.dtype, row_size: int, coarse: bool, label_size: int | None = None
            ) -> pa.Schema:
    """x: a fixed-size list per example; y: one int64 label, or a fixed-size list of
    ``label_size`` int64 labels per example (sequence targets: next-character prediction)."""
    y_type = pa.int64() if label_size is None else pa.list_(pa.int64(), label_size)
    fields = [pa.field("x", pa.list_(pa.from_numpy_dtype(dtype), row_size)),
              pa.field("y", y_type)]
    if coarse:
        fields.append(pa.field("coarse", pa.int64()))
    return pa.schema(fields)


def _label_size(y: np.ndarray) -> int | None:
    """Labels per example: None for one label each ([n]), L for sequences ([n, L])."""
    return None if y.ndim == 1 else int(np.prod(y.shape[1:]))


def _histograms(y: np.ndarray, bounds: np.ndarray, num_classes: int) -> np.ndarray:
    """Label histogram of each client whose rows are y[bounds[k]:bounds[k+1]]. With
    sequence labels ([n, L]) it counts every position's label, padding included: the
    histogram is then one of target tokens, and sums to L times the client's examples."""
    per_row = 1 if y.ndim == 1 else int(np.prod(y.shape[1:]))
    owner = np.repeat(np.arange(len(bounds) - 1), np.diff(bounds) * per_row)
    flat = np.bincount(owner * num_classes + y.reshape(-1),
                       minlength=(len(bounds) - 1) * num_classes)
    return flat.reshape(-1, num_classes)


class _SplitWriter:
    """Gathers one split's clients into shards of about ``shard_bytes`` and writes them."""

    def __init__(self, fs, tmp: str, split: str, dataset: Dataset, shard_bytes: int,
                 log: Callable[[str], None]):
        self.fs, self.tmp, self.split, self.log = fs, tmp, split, log
        self.dataset, self.shard_bytes = dataset, shard_bytes
        self.shards: list[dict] = []

    def write(self, source: Split, per_client: list[np.ndarray],
              labels: list[np.ndarray] | None = None) -> dict[str, Any]:
        counts = np.array([len(a) for a in per_client], dtype=np.int64)
        row_bytes = (int(np.prod(source.x.shape[1:])) * source.x.dtype.itemsize
                     + 8 * int(np.prod(source.y.shape[1:])) + 8)
        bounds = np.concatenate([[0], np.cumsum(counts)])
        shard_of = np.zeros(len(counts), dtype=np.int64)
        offset = np.zeros(len(counts), dtype=np.int64)
        start, rows, shard = 0, 0, 0
        groups: list[tuple[int, int]] = []  # client ranges [start, end) per shard
        for k, n in enumerate(counts):
            if rows > 0 and (rows + n) * row_bytes > self.shard_bytes:
                groups.append((start, k))
                start, rows, shard = k, 0, shard + 1
            shard_of[k], offset[k] = shard, rows
            rows += int(n)
        groups.append((start, len(counts)))
        written = []
        for i, (a, b) in enumerate(groups):
            idx = np.concatenate(per_client[a:b]) if b > a else np.zeros(0, dtype=np.int64)
            part = source.take(idx.astype(np.int64))
            y = part.y if labels is None or b == a else \
                np.concatenate(labels[a:b]).astype(np.int64)
            written.append(y)
            self._write_shard(i, part, y, len(groups))
        hist = _histograms(np.concatenate(written), bounds, self.dataset.num_classes)
        return {"shard": shard_of.tolist(), "offset": offset.tolist(), "count": counts.tolist(),
                "label_histogram": hist.tolist()}

    def write_whole(self, source: Split) -> int:
        """The split as it is, in shards (the central test set)."""
        rows_per = max(1, self.shard_bytes // (source.x[0].nbytes + source.y[0].nbytes + 8))
        n_shards = max(1, math.ceil(len(source) / rows_per))
        for i in range(n_shards):
            part = source.take(np.arange(i * rows_per, min(len(source), (i + 1) * rows_per)))
            self._write_shard(i, part, part.y, n_shards)
        return len(source)

    def _write_shard(self, i: int, part: Split, y: np.ndarray, total: int) -> None:
        name = f"{self.split}-{i:05d}.arrow"
        row_size = int(np.prod(part.x.shape[1:]))
        flat = pa.array(np.ascontiguousarray(part.x).reshape(-1))
        label_size = _label_size(self.dataset.train.y)
        y = np.ascontiguousarray(y, dtype=np.int64)
        y_col = pa.array(y, pa.int64()) if label_size is None else \
            pa.FixedSizeListArray.from_arrays(pa.array(y.reshape(-1), pa.int64()), label_size)
        cols = [pa.FixedSizeListArray.from_arrays(flat, row_size), y_col]
        if part.coarse is not None:
            cols.append(pa.array(part.coarse.astype(np.int64)))
        schema = _schema(part.x.dtype, row_size, part.coarse is not None, label_size)
        batch = pa.record_batch(cols, schema=schema)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, schema) as writer:
            writer.write_batch(batch)
        data = sink.getvalue().to_pybytes()
        with self.fs.open(_join(self.tmp, name), "wb") as f:
            f.write(data)
        self.shards.append({"file": name, "split": self.split, "rows": len(y),
                            "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
        self.log(f"  wrote {name} ({i + 1}/{total}, {len(y):,} rows, {len(data) / 2**20:.1f} MB)")


def check_new_store(url: str) -> None:
    """Stores are immutable: refuse a target that already holds anything."""
    fs, path = filesystem(url, "out", what="recipe")
    if fs.exists(path) and (not fs.isdir(path) or fs.ls(path)):
        raise key_error("out", f"{url} already exists; choose a new location or remove it",
                        what="recipe")


def write_store(url: str, dataset: Dataset, partition: Partition, *, recipe: dict,
                shard_mb: float = 64.0, log: Callable[[str], None] = lambda s: None) -> dict:
    """Write ``partition`` of ``dataset`` as a store at ``url``; returns the manifest."""
    check_new_store(url)
    fs, path = fsspec.core.url_to_fs(url)
    parent = posixpath.dirname(path.rstrip("/")) or "."
    tmp = _join(parent, f".{posixpath.basename(path.rstrip('/'))}.tmp-{uuid.uuid4().hex[:8]}")
    train, test = dataset.train, dataset.test
    if test is not None and _label_size(test.y) != _label_size(train.y):
        raise FedrayError(f"the source's train labels have shape {train.y.shape[1:]} but its "
                          f"test labels {test.y.shape[1:]}")
    fs.makedirs(tmp, exist_ok=True)
    try:
        shard_bytes = int(shard_mb * 2**20)
        writers = {s: _SplitWriter(fs, tmp, s, dataset, shard_bytes, log) for s in SPLITS}
        clients: dict[str, Any] = {"names": list(partition.client_names)}
        clients["train"] = writers["train"].write(dataset.train, partition.train,
                                                  partition.train_labels)
        central = None
        if partition.test is not None:
            if dataset.test is None:
                raise FedrayError("the partition gives clients test data but the source has "
                                  "no test split")
            clients["test"] = writers["test"].write(dataset.test, partition.test)
        elif dataset.test is not None and len(dataset.test) > 0:
            central = {"rows": writers["central_test"].write_whole(dataset.test)}
        train = dataset.train
        label_size = _label_size(train.y)
        manifest = {
            "format": FORMAT, "format_version": FORMAT_VERSION, "fedray_version": __version__,
            "recipe": recipe, "source": recipe.get("source"), "seed": recipe.get("seed"),
            "partitioner": recipe.get("partitioner"),
            "num_clients": partition.num_clients, "num_classes": dataset.num_classes,
            "num_coarse": dataset.num_coarse, "input_shape": list(dataset.input_shape),
            "dtype": str(train.x.dtype), "scale": dataset.scale,
            "schema": _schema(train.x.dtype, int(np.prod(train.x.shape[1:])),
                              train.coarse is not None, label_size).to_string(),
            "clients": clients, "central_test": central,
            "shards": [s for w in writers.values() for s in w.shards],
            "info": partition.info,
        }
        if label_size is not None:  # absent: one label per example (every older store)
            manifest["label_shape"] = list(train.y.shape[1:])
        with fs.open(_join(tmp, MANIFEST), "w") as f:
            json.dump(manifest, f)
        if fs.exists(path):
            fs.rm(path, recursive=True)  # an empty directory left by the caller
        fs.mv(tmp, path, recursive=True)
    except BaseException:
        if fs.exists(tmp):
            fs.rm(tmp, recursive=True)
        raise
    return manifest


def read_manifest(url: str) -> dict:
    """The store's manifest, checked for structure (``check_manifest``): what it says about
    every client must be possible in the shards it lists."""
    fs, path = filesystem(url, "data.partition")
    mpath = _join(path, MANIFEST)
    if not fs.exists(mpath):
        raise key_error("data.partition", f"no partition store at {url} ({MANIFEST} missing)")
    try:
        with fs.open(mpath, "r") as f:
            manifest = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FedrayError(f"{url}/{MANIFEST} is not valid JSON: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise FedrayError(f"{url}/{MANIFEST} is not a fedray partition store manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise FedrayError(f"{url}: store format version {manifest.get('format_version')} is not "
                          f"supported (this fedray reads version {FORMAT_VERSION})")
    check_manifest(url, manifest)
    return manifest


def _split_index(url: str, m: dict, split: str) -> tuple[list[dict], dict[str, np.ndarray]]:
    """A split's shard list and its clients' shard, offset and count arrays."""
    def bad(what: str) -> FedrayError:
        return FedrayError(f"{url}/{MANIFEST}: {what}")

    n = m["num_clients"]
    files = [sh for sh in m["shards"] if sh["split"] == split]
    entry = m["clients"][split]
    index = {}
    for key in ("shard", "offset", "count"):
        values = entry.get(key) if isinstance(entry, dict) else None
        if not isinstance(values, list) or len(values) != n:
            raise bad(f"clients.{split}.{key} must list {n} clients")
        try:
            index[key] = np.asarray(values, dtype=np.int64)
        except (TypeError, ValueError, OverflowError):
            raise bad(f"clients.{split}.{key} must be whole numbers") from None
        if index[key].ndim != 1:
            raise bad(f"clients.{split}.{key} must be whole numbers")
    return files, index


def check_manifest(url: str, m: dict) -> None:
    """Everything the manifest says about clients fits its shards: one entry per client,
    every client's rows inside the shard that holds them, no row owned by two clients.

    Checksums prove the shards are the ones the manifest was written with, not that the
    manifest itself is sound; a hand-edited or foreign manifest would otherwise crash a
    worker mid-round (a count past the end of its shard) or train clients on each other's
    rows without a word. Cheap: arrays of a few numbers per client, no shard is read."""
    def bad(what: str) -> FedrayError:
        return FedrayError(f"{url}/{MANIFEST}: {what}")

    n, classes = m.get("num_clients"), m.get("num_classes")
    if not isinstance(n, int) or n < 1:
        raise bad(f"num_clients must be a whole number >= 1, got {n!r}")
    if not isinstance(classes, int) or classes < 1:
        raise bad(f"num_classes must be a whole number >= 1, got {classes!r}")
    label_shape = m.get("label_shape", [])
    if not isinstance(label_shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in label_shape):
        raise bad(f"label_shape must list whole numbers >= 1, got {label_shape!r}")
    shards, clients = m.get("shards"), m.get("clients")
    if not isinstance(shards, list) or not all(
            isinstance(sh, dict) and isinstance(sh.get("rows"), int) and sh.get("split") in
            SPLITS and isinstance(sh.get("file"), str) for sh in shards):
        raise bad("shards must list objects with file, split and rows")
    if not isinstance(clients, dict) or not isinstance(clients.get("names"), list) \
            or len(clients["names"]) != n or "train" not in clients:
        raise bad(f"clients must hold {n} names and the train split")
    names = clients["names"]
    for split in ("train", "test"):
        if split not in clients:
            continue
        files, ix = _split_index(url, m, split)
        shard, offset, count = ix["shard"], ix["offset"], ix["count"]
        wrong = np.flatnonzero((shard < 0) | (shard >= len(files)) | (offset < 0) | (count < 0))
        if len(wrong):
            c = int(wrong[0])
            raise bad(f"client {c} ({names[c]!r}) has {split} shard {int(shard[c])}, offset "
                      f"{int(offset[c])}, count {int(count[c])}: the {split} split has "
                      f"{len(files)} shards")
        rows = np.asarray([sh["rows"] for sh in files], dtype=np.int64)
        end = offset + count
        past = np.flatnonzero(end > rows[shard])
        if len(past):
            c = int(past[0])
            raise bad(f"client {c} ({names[c]!r}) has {split} rows {int(offset[c])}.."
                      f"{int(end[c]) - 1}, past the {int(rows[shard[c]])} rows of "
                      f"{files[int(shard[c])]['file']}")
        held = np.flatnonzero(count > 0)
        order = held[np.lexsort((offset[held], shard[held]))]
        same = shard[order[1:]] == shard[order[:-1]]
        overlap = np.flatnonzero(same & (offset[order[1:]] < end[order[:-1]]))
        if len(overlap):
            a, b = int(order[overlap[0]]), int(order[overlap[0] + 1])
            raise bad(f"clients {a} ({names[a]!r}) and {b} ({names[b]!r}) share {split} rows "
                      f"{int(offset[b])}..{min(int(end[a]), int(end[b])) - 1} of "
                      f"{files[int(shard[a])]['file']}")


def verify_store(url: str, manifest: dict | None = None) -> None:
    """Check every shard against the manifest: size and sha256, then its contents -- the
    rows it really holds, the example width, and every label within ``num_classes`` and
    in the per-client label histograms the manifest records. Reads every shard twice: to
    hash it, then its contents (from the page cache, on a local disk)."""
    manifest = manifest or read_manifest(url)
    fs, path = filesystem(url, "data.partition")
    for shard in manifest["shards"]:
        p = _join(path, shard["file"])
        if not fs.exists(p):
            raise FedrayError(f"{url}: shard {shard['file']} is missing")
        digest = hashlib.sha256()
        size = 0
        with fs.open(p, "rb") as f:
            while chunk := f.read(8 * 2**20):
                digest.update(chunk)
                size += len(chunk)
        if size != shard["bytes"] or digest.hexdigest() != shard["sha256"]:
            raise FedrayError(f"{url}: shard {shard['file']} is corrupt (checksum mismatch)")
    _verify_contents(url, manifest, StoreSource(url, manifest, max_open_shards=1))


def _verify_contents(url: str, m: dict, source: StoreSource) -> None:
    classes = int(m["num_classes"])
    width = int(np.prod(m["input_shape"]))
    labels: dict[str, list[np.ndarray]] = {}
    for split, files in source._files.items():
        for i, shard in enumerate(files):
            batch = source._batch(split, i)
            if batch.num_rows != shard["rows"]:
                raise FedrayError(f"{url}: shard {shard['file']} holds {batch.num_rows} rows, "
                                  f"the manifest says {shard['rows']}")
            x_type = batch.schema.field(0).type
            if getattr(x_type, "list_size", width) != width:
                raise FedrayError(f"{url}: shard {shard['file']} has examples of "
                                  f"{x_type.list_size} values; input_shape "
                                  f"{tuple(m['input_shape'])} needs {width}")
            y = source._labels(batch)
            if y is None:
                raise FedrayError(f"{url}: shard {shard['file']} has labels of type "
                                  f"{batch.schema.field(1).type}; the manifest's label_shape "
                                  f"{source.label_shape} needs {source._label_type()}")
            bad = (y < 0) | (y >= classes)
            wrong = np.flatnonzero(bad.reshape(len(y), -1).any(axis=1))
            if len(wrong):
                row = y[wrong[0]].reshape(-1)
                label = int(row[(row < 0) | (row >= classes)][0])
                raise FedrayError(f"{url}: shard {shard['file']} row {int(wrong[0])} has label "
                                  f"{label}, outside 0..{classes - 1} "
                                  f"(num_classes {classes})")
            labels.setdefault(split, []).append(y)
    for split in ("train", "test"):
        hist = m["clients"].get(split, {}).get("label_histogram")
        if hist is None or split not in labels:
            continue
        ix = source._index[split]
        starts = np.concatenate([[0], np.cumsum([len(y) for y in labels[split]])])
        first = starts[ix["shard"]] + ix["offset"]  # each client's first row, all shards
        count = ix["count"]
        bounds = np.concatenate([[0], np.cumsum(count)])  # the clients' rows, in client order
        rows = np.repeat(first - bounds[:-1], count) + np.arange(bounds[-1])
        got = _histograms(np.concatenate(labels[split])[rows], bounds, classes)
        differ = np.flatnonzero((got != np.asarray(hist, dtype=np.int64)).any(axis=1))
        if len(differ):
            c = int(differ[0])
            raise FedrayError(f"{url}: client {c} ({source.client_names[c]!r}): its {split} "
                              "labels differ from the manifest's label histogram")


class StoreSource:
    """A partition store as a ClientSource (see fedray.data.source).

    Workers open shards lazily and keep at most ``max_open_shards`` of them (LRU); on a local
    filesystem a shard is memory-mapped, elsewhere it is read once into memory.
    """

    cacheable = True

    def __init__(self, url: str, manifest: dict | None = None, max_open_shards: int = 16):
        self.url = url
        m = manifest or read_manifest(url)
        self.population = int(m["num_clients"])
        self.num_classes = int(m["num_classes"])
        self.input_shape = tuple(m["input_shape"])
        self.label_shape = tuple(m.get("label_shape") or ())  # () one label, (L,) sequences
        self.scale = float(m["scale"])
        self.client_names: list[str] = m["clients"]["names"]
        self.has_client_test = "test" in m["clients"]
        self._index = {s: {k: np.asarray(m["clients"][s][k], dtype=np.int64)
                           for k in ("shard", "offset", "count")}
                       for s in ("train", "test") if s in m["clients"]}
        self._files = {s: [sh for sh in m["shards"] if sh["split"] == s] for s in SPLITS}
        self.max_open_shards = max_open_shards
        self._open: OrderedDict[tuple[str, int], pa.RecordBatch] = OrderedDict()
        self._fs = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_open"] = OrderedDict()  # each process maps shards itself
        state["_fs"] = None
        return state

    def train_sizes(self) -> np.ndarray:
        return self._index["train"]["count"]

    def test_sizes(self) -> np.ndarray:
        if not self.has_client_test:
            return np.zeros(self.population, dtype=np.int64)
        return self._index["test"]["count"]

    def _batch(self, split: str, i: int) -> pa.RecordBatch:
        key = (split, i)
        batch = self._open.get(key)
        if batch is not None:
            self._open.move_to_end(key)
            return batch
        shard = self._files[split][i]
        if self._fs is None:
            self._fs = fsspec.core.url_to_fs(self.url)
        fs, path = self._fs
        p = _join(path, shard["file"])
        try:
            protocols = (fs.protocol,) if isinstance(fs.protocol, str) else fs.protocol
            if "file" in protocols:
                if fs.size(p) != shard["bytes"]:
                    raise FedrayError(f"{self.url}: shard {shard['file']} has "
                                      f"{fs.size(p)} bytes, the manifest says {shard['bytes']}")
                source = pa.memory_map(p, "r")
            else:
                source = pa.BufferReader(fs.cat_file(p))
            batch = pa.ipc.open_file(source).get_batch(0)
        except FileNotFoundError:
            raise FedrayError(f"{self.url}: shard {shard['file']} is missing") from None
        except pa.ArrowInvalid as exc:
            raise FedrayError(f"{self.url}: shard {shard['file']} is corrupt: {exc}") from None
        self._open[key] = batch
        while len(self._open) > self.max_open_shards:
            self._open.popitem(last=False)
        return batch

    def _label_type(self) -> pa.DataType:
        return pa.int64() if not self.label_shape else \
            pa.list_(pa.int64(), int(np.prod(self.label_shape)))

    def _labels(self, batch: pa.RecordBatch) -> np.ndarray | None:
        """A batch's labels as [rows, *label_shape] int64 (a view), or None when the shard's
        label column is not what the manifest's label_shape says."""
        column = batch.column(1)
        if column.type != self._label_type():
            return None
        if not self.label_shape:
            return column.to_numpy(zero_copy_only=True)
        flat = column.flatten().to_numpy(zero_copy_only=True)
        return flat.reshape((batch.num_rows, *self.label_shape))

    def _rows(self, split: str, shard: int, lo: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        batch = self._batch(split, shard).slice(lo, n)
        x = batch.column(0).flatten().to_numpy(zero_copy_only=True)
        x = x.reshape((n, *self.input_shape))
        y = self._labels(batch)
        if y is None:
            raise FedrayError(f"{self.url}: {split} shard {shard} has labels of type "
                              f"{batch.column(1).type}, not {self._label_type()}")
        if self.scale != 1.0 or x.dtype != np.float32:
            x = x.astype(np.float32) * np.float32(self.scale)
        return x, y

    def client(self, cid: int, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
        if split not in self._index:
            raise FedrayError(f"{self.url} has no per-client {split} data")
        ix = self._index[split]
        x, y = self._rows(split, int(ix["shard"][cid]), int(ix["offset"][cid]),
                          int(ix["count"][cid]))
        if len(y) and not 0 <= int(y.min()) <= int(y.max()) < self.num_classes:
            # verify_store finds these before a run; with data.verify off, say it here
            bad = int(y.min()) if y.min() < 0 else int(y.max())
            raise FedrayError(f"{self.url}: client {cid} ({self.client_names[cid]!r}) has "
                              f"{split} label {bad}, outside 0..{self.num_classes - 1}")
        return x, y

    def central_test(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The shared test set, or the union of every client's test data."""
        split = "central_test" if self._files["central_test"] else "test"
        parts = [self._rows(split, i, 0, sh["rows"]) for i, sh in enumerate(self._files[split])
                 if sh["rows"] > 0]
        if not parts:
            return None
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
