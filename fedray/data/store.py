"""Partition store: a federated data set on disk, built once, read by any worker anywhere.

A store is a directory at any fsspec URL (format version 2):
  manifest.json            what it holds, store-wide: source, recipe, seed, number of clients
                           and classes, shapes, schema, fedray version, every shard with its
                           rows, bytes and sha256, and the client index file with its own
  clients.arrow            the client index: one row per client -- name, and per split the
                           shard and rows that hold it, its example count and a sparse label
                           histogram (fedray.data.client_index, which documents the columns)
  train-00000.arrow ...    Arrow IPC files (Feather v2, uncompressed), one record batch each
  test-00000.arrow ...     per-client test data, when the partitioner gives clients their own
  central_test-00000.arrow the shared test set: when clients have no test data of their own,
                           or a fixed set beside it (the synthetic writers' 200 held-out sets)
Clients' rows are contiguous and a client never spans two shards, so reading one client
touches one shard; on a local disk the shard is memory-mapped and the client's arrays are
views into it (no copy, no parsing). Many clients share a shard (``shard_mb``, ~64 MB), so a
million-client store is a few hundred files, not a million.

Why the client index is not in the manifest: format 1 listed every client's numbers in
manifest.json, which every open parsed (200 MB at a million clients). Now opening a store
reads a manifest of a few kilobytes and maps the index, whatever the population; format 1
stores still open (their lists become the same index).

Writing (``StoreWriter``) streams: clients arrive in blocks, each split's shard is written
as soon as it is full, and what the writer keeps per client is a few numbers in arrays, so a
store of any size is built in bounded memory. It writes to a temporary sibling directory
that is renamed into place at the end, so an interrupted or failed build never leaves a
half-written store at the target URL.

The target is claimed first (``claim_store``: the lock ``fedray run`` puts on its output
directory, fedray.state.storage.RunClaim), so two builds to one place cannot both write it,
and the writer never deletes anything at the target: a store goes only to a new or empty
location, and the final move refuses rather than replace a file it did not write
(``StoreWriter._place``).
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import posixpath
import re
import shutil
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fedray.data.client_index import (
    CLIENTS_FILE,
    INDEX_SPLITS,
    ClientIndex,
    histogram_array,
    numpy_view,
    row_problem,
    sparse_histograms,
)
from fedray.data.dataset import MAX_CLASSES, Dataset, Split, first_nonfinite
from fedray.data.partition import Partition
from fedray.errors import FedrayError, key_error
from fedray.state.storage import LOCK_FILE, RunClaim, filesystem, is_local
from fedray.version import __version__

MANIFEST = "manifest.json"
FORMAT = "fedray-partition-store"
FORMAT_VERSION = 2
READS_VERSIONS = (1, 2)
SPLITS = ("train", "test", "central_test")
_BLOCK_CLIENTS = 4096  # clients per block when a partition in memory is written


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


def _rows(part: Split, a: int, b: int) -> Split:
    """Rows a..b-1 of ``part`` (views)."""
    return Split(part.x[a:b], part.y[a:b], None if part.coarse is None else part.coarse[a:b])


def _concat(parts: list[Split], like: Split) -> Split:
    if not parts:
        return _rows(like, 0, 0)
    if len(parts) == 1:
        return parts[0]
    return Split(np.concatenate([p.x for p in parts]), np.concatenate([p.y for p in parts]),
                 None if parts[0].coarse is None else np.concatenate([p.coarse for p in parts]))


class _SplitStream:
    """One split's clients, streamed into shards of about ``shard_bytes``: a shard is
    written as soon as the next client would not fit (a client never spans two shards)."""

    def __init__(self, writer: StoreWriter, split: str):
        self.w, self.split = writer, split
        self.pieces: list[Split] = []  # the open shard's rows, not yet written
        self.rows = 0  # rows in the open shard
        self.clients = 0  # clients placed in the open shard
        self.number = 0  # the open shard's number within the split
        self.shard: list[np.ndarray] = []
        self.offset: list[np.ndarray] = []
        self.count: list[np.ndarray] = []
        self.hist: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def add(self, part: Split, counts: np.ndarray, names: Sequence[str]) -> None:
        w = self.w
        counts = np.asarray(counts, dtype=np.int64)
        if int(counts.sum()) != len(part) or part.x.shape[1:] != w.input_shape \
                or part.x.dtype != w.dtype or part.y.shape[1:] != w.label_shape:
            raise ValueError(f"{self.split}: a block of {len(part)} rows {part.x.shape[1:]} "
                             f"{part.x.dtype} does not match its {int(counts.sum())} counted "
                             f"rows or the store's {w.input_shape} {w.dtype}")
        bad_input = first_nonfinite(part.x, w.scale)  # min and max: cheap next to writing
        if bad_input is not None:
            row, why = bad_input
            c = int(np.searchsorted(np.cumsum(counts), row, side="right"))
            own = row - int(counts[:c].sum())
            raise FedrayError(f"client {names[c]!r} has {self.split} example {own} with {why}: "
                              f"not a finite model input (x * scale {w.scale:g})")
        y = np.asarray(part.y)
        if len(y) and (int(y.min()) < 0 or int(y.max()) >= w.num_classes):
            row = int(np.flatnonzero(((y < 0) | (y >= w.num_classes))
                                     .reshape(len(y), -1).any(axis=1))[0])
            c = int(np.searchsorted(np.cumsum(counts), row, side="right"))
            label = int(y[row].reshape(-1)[0]) if y.ndim == 1 else \
                int(y[row][(y[row] < 0) | (y[row] >= w.num_classes)][0])
            raise FedrayError(f"client {names[c]!r} has {self.split} label {label}, outside "
                              f"0..{w.num_classes - 1} (num_classes {w.num_classes})")
        shard = np.empty(len(counts), dtype=np.int64)
        offset = np.empty(len(counts), dtype=np.int64)
        rows, cut, row = self.rows, 0, 0
        for j, n in enumerate(counts.tolist()):
            if rows > 0 and (rows + n) * w.row_bytes > w.shard_bytes:
                self.pieces.append(_rows(part, cut, row))
                self._flush(part)
                rows, cut = 0, row
            shard[j], offset[j] = self.number, rows
            rows += n
            row += n
            self.clients += 1
        self.pieces.append(_rows(part, cut, row))
        self.rows = rows
        self.shard.append(shard)
        self.offset.append(offset)
        self.count.append(counts)
        self.hist.append(sparse_histograms(y, counts, w.num_classes))

    def _flush(self, like: Split) -> None:
        part = _concat(self.pieces, like)
        self.w._write_shard(self.split, self.number, part)
        self.pieces, self.rows, self.clients = [], 0, 0
        self.number += 1

    def close(self, like: Split) -> dict[str, Any]:
        """Write the last shard (also when no client has a row: every split that has
        clients has a shard, so each client's shard number is valid); the columns."""
        if self.clients or self.number == 0:
            self._flush(like)
        def cat(parts: list[np.ndarray], dtype: type) -> np.ndarray:
            return np.concatenate(parts) if parts else np.zeros(0, dtype)

        return {"shard": cat(self.shard, np.int64), "offset": cat(self.offset, np.int64),
                "count": cat(self.count, np.int64),
                "histogram": histogram_array(cat([h[0] for h in self.hist], np.int64),
                                             cat([h[1] for h in self.hist], np.int32),
                                             cat([h[2] for h in self.hist], np.int32))}


class StoreWriter:
    """Writes a store client by client, in blocks: ``add`` a block of clients' rows (one
    ``Split`` per split, the clients' rows one after the other), then ``finish``. Used as a
    context manager, an exception removes everything written so far.

    Memory: the open shard of each split (about ``shard_mb``) and a few numbers per client;
    nothing else grows with the store."""

    def __init__(self, url: str, *, num_classes: int, input_shape: Sequence[int],
                 dtype: np.dtype | str, label_shape: Sequence[int] = (), coarse: bool = False,
                 num_coarse: int | None = None, scale: float = 1.0, client_test: bool = False,
                 shard_mb: float = 64.0, log: Callable[[str], None] = lambda s: None,
                 claim: RunClaim | None = None):
        # the caller's claim on ``url`` (fedray partition claims before it reads any data),
        # or one of the writer's own, dropped when it finishes or aborts
        self._own_claim = claim is None
        self.claim = claim_store(url) if claim is None else claim
        self._placed: list[str] = []  # files moved into ``url`` one by one (_place_files)
        self.url, self.log = url, log
        self.num_classes, self.num_coarse, self.scale = int(num_classes), num_coarse, scale
        self.input_shape = tuple(int(d) for d in input_shape)
        self.label_shape = tuple(int(d) for d in label_shape)
        self.dtype = np.dtype(dtype)
        self.coarse = coarse
        self.shard_bytes = int(shard_mb * 2**20)
        label_size = int(np.prod(self.label_shape)) if self.label_shape else 1
        self.row_bytes = int(np.prod(self.input_shape)) * self.dtype.itemsize + 8 * label_size + 8
        self.schema = _schema(self.dtype, int(np.prod(self.input_shape)), coarse,
                              label_size if self.label_shape else None)
        self.fs, path = fsspec.core.url_to_fs(url)
        self.path = path
        parent = posixpath.dirname(path.rstrip("/")) or "."
        self.tmp = _join(parent, f".{posixpath.basename(path.rstrip('/'))}.tmp-"
                                 f"{uuid.uuid4().hex[:8]}")
        self.splits = ("train", "test") if client_test else ("train",)
        self._streams = {s: _SplitStream(self, s) for s in self.splits}
        self._names: list[pa.Array] = []
        self._like: Split | None = None
        self.shards: list[dict] = []
        self.num_clients = 0
        try:
            self.fs.makedirs(self.tmp, exist_ok=True)
        except BaseException:
            self.abort()
            raise

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        if kind is not None:
            self.abort()

    def abort(self) -> None:
        """Remove what this writer wrote (its temporary directory, the files it had moved
        into the target), and drop its own claim; nothing else is touched."""
        try:
            if self.fs.exists(self.tmp):
                self.fs.rm(self.tmp, recursive=True)
            for placed in reversed(self._placed):
                if self.fs.exists(placed):
                    self.fs.rm(placed)
            self._placed = []
        finally:
            if self._own_claim:
                self.claim.vacate()

    def add(self, names: Sequence[str], train: Split, train_counts: np.ndarray,
            test: Split | None = None, test_counts: np.ndarray | None = None) -> None:
        """Clients ``names`` (in order): their train rows one client after the other
        (``train_counts`` each) and, for a store whose clients hold test data, their test
        rows likewise."""
        if len(names) != len(train_counts) or (test is None) != ("test" not in self.splits) \
                or (test is not None and len(np.asarray(test_counts)) != len(names)):
            raise ValueError("one count per client and split")
        self._like = self._like or _rows(train, 0, 0)
        self._streams["train"].add(train, train_counts, names)
        if test is not None:
            self._streams["test"].add(test, np.asarray(test_counts), names)
        self._names.append(pa.array(list(names), pa.large_string()))
        self.num_clients += len(names)

    def _write_shard(self, split: str, i: int, part: Split) -> None:
        name = f"{split}-{i:05d}.arrow"
        row_size = int(np.prod(self.input_shape))
        flat = pa.array(np.ascontiguousarray(part.x).reshape(-1))
        y = np.ascontiguousarray(part.y, dtype=np.int64)
        label_size = int(np.prod(self.label_shape)) if self.label_shape else None
        y_col = pa.array(y, pa.int64()) if label_size is None else \
            pa.FixedSizeListArray.from_arrays(pa.array(y.reshape(-1), pa.int64()), label_size)
        cols = [pa.FixedSizeListArray.from_arrays(flat, row_size), y_col]
        if self.coarse:
            cols.append(pa.array(np.asarray(part.coarse).astype(np.int64)))
        batch = pa.record_batch(cols, schema=self.schema)
        data = _ipc_bytes(batch)
        with self.fs.open(_join(self.tmp, name), "wb") as f:
            f.write(data)
        self.shards.append({"file": name, "split": split, "rows": len(y),
                            "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
        self.log(f"  wrote {name} ({len(y):,} rows, {len(data) / 2**20:.1f} MB)")

    def _write_whole(self, part: Split) -> int:
        """A split as it is, in shards (the central test set)."""
        bad_input = first_nonfinite(part.x, self.scale)
        if bad_input is not None:
            raise FedrayError(f"the central test set's example {bad_input[0]} has "
                              f"{bad_input[1]}: not a finite model input (x * scale "
                              f"{self.scale:g})")
        rows_per = max(1, self.shard_bytes // (part.x[0].nbytes + part.y[0].nbytes + 8))
        n_shards = max(1, math.ceil(len(part) / rows_per))
        for i in range(n_shards):
            self._write_shard("central_test", i,
                              _rows(part, i * rows_per, min(len(part), (i + 1) * rows_per)))
        return len(part)

    def finish(self, *, recipe: dict, info: dict, central_test: Split | None = None,
               name: str | None = None) -> dict:
        """Write the last shards, the central test set, the client index and the manifest,
        check the index against the shards, and move the store into place; returns the
        manifest."""
        if self.num_clients == 0:
            raise FedrayError(f"{self.url}: a store needs at least one client")
        like = self._like
        assert like is not None
        columns = {s: self._streams[s].close(like) for s in self.splits}
        names = pa.chunked_array(self._names, pa.large_string()).combine_chunks()
        if pc.count_distinct(names).as_py() != len(names):
            raise FedrayError(f"{self.url}: client names must be unique")
        central = None
        if central_test is not None and len(central_test) > 0:
            central = {"rows": self._write_whole(central_test)}
        index = ClientIndex.from_columns(f"{self.url}/{CLIENTS_FILE}", self.num_classes, names,
                                         columns)
        shards = [sh for s in SPLITS for sh in self.shards if sh["split"] == s]
        label_size = int(np.prod(self.label_shape)) if self.label_shape else 1
        index.check({s: [sh for sh in shards if sh["split"] == s] for s in self.splits},
                    label_size)  # by construction; cheap next to writing the shards
        data = _ipc_bytes(index.batch)
        with self.fs.open(_join(self.tmp, CLIENTS_FILE), "wb") as f:
            f.write(data)
        self.log(f"  wrote {CLIENTS_FILE} ({self.num_clients:,} clients, "
                 f"{len(data) / 2**20:.1f} MB)")
        manifest = {
            "format": FORMAT, "format_version": FORMAT_VERSION, "fedray_version": __version__,
            "recipe": recipe, "source": recipe.get("source"), "seed": recipe.get("seed"),
            "partitioner": recipe.get("partitioner"),
            "num_clients": self.num_clients, "num_classes": self.num_classes,
            "num_coarse": self.num_coarse, "input_shape": list(self.input_shape),
            "dtype": str(self.dtype), "scale": self.scale, "schema": self.schema.to_string(),
            "client_index": {"file": CLIENTS_FILE, "splits": list(self.splits),
                             "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()},
            "central_test": central, "shards": shards, "info": info,
        }
        if self.label_shape:  # absent: one label per example (every older store)
            manifest["label_shape"] = list(self.label_shape)
        with self.fs.open(_join(self.tmp, MANIFEST), "w") as f:
            json.dump(manifest, f)
        self._place()
        if self._own_claim:
            self.claim.vacate()
        return manifest

    def _error(self, problem: str) -> FedrayError:
        return key_error("out", f"{self.url} {problem}", what="recipe")

    def _place(self) -> None:
        """Put the finished store (``self.tmp``) at the target, which this command has
        claimed: there is nothing there but the claim's lock, unless someone put files
        there meanwhile, and those are never deleted.

        A local directory is renamed aside (atomic), and what it held is checked: our lock
        alone, and the store is renamed into its place (atomic; a rename onto a directory
        that is not empty fails, so nothing made there in between is replaced), then the
        lock and the empty directory aside are removed; anything else, and it is renamed
        back and the build refused, the store with it. Elsewhere (object stores, where a
        directory is a prefix and nothing renames atomically; a local mount point or a
        symlink, which must stay what they are), ``_place_files``."""
        fs, path = self.fs, self.path.rstrip("/")
        if is_local(fs) and not os.path.islink(path):
            aside = _join(posixpath.dirname(path) or ".",
                          f".{posixpath.basename(path)}.old-{uuid.uuid4().hex[:8]}")
            try:
                os.rename(path, aside)
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    raise self._lost() from None
                return self._place_files()  # a mount point, say: file by file
            found = sorted(os.listdir(aside))
            foreign = [n for n in found if n != LOCK_FILE]
            if foreign or not self._ours(_join(aside, LOCK_FILE)):
                where = "left as they were"
                try:
                    os.rename(aside, path)  # back, as it was (onto an empty directory too)
                except OSError:
                    where = f"moved aside to {aside}, as {path} was made again meanwhile"
                raise (self._gained(foreign, where) if foreign else self._lost())
            try:
                os.rename(self.tmp, path)
            except OSError as exc:  # made again, and filled, in between: theirs now
                raise self._error(f"was made again while the store was moved into place "
                                  f"({exc.strerror}); it was left as it was and the store "
                                  "was not written") from None
            finally:
                self._drop_aside(aside)
            self.claim.held = False  # the lock went aside with the empty directory
            return None
        return self._place_files()

    def _drop_aside(self, aside: str) -> None:
        """The directory renamed aside held our lock alone: remove the lock, then the
        directory only if it is empty (rmdir refuses otherwise, and it stays)."""
        try:
            os.unlink(_join(aside, LOCK_FILE))
            os.rmdir(aside)
        except OSError:
            self.log(f"  kept {aside}: it holds files fedray did not write")

    def _place_files(self) -> None:
        """The store's files moved into the claimed directory one by one, the manifest
        last (a reader sees no store until it is whole), never over a file that is there:
        local files are hard-linked (or copied) with exclusive creation; on an object
        store each name is checked just before its file is moved, the best it offers (a
        file written under the same name in that instant would be replaced). A directory
        that holds anything but our lock is refused before anything is moved."""
        fs, path = self.fs, self.path.rstrip("/")
        if not fs.exists(path) or not self._ours(_join(path, LOCK_FILE)):
            raise self._lost()
        foreign = sorted(e.rstrip("/").rsplit("/", 1)[-1] for e in fs.ls(path, detail=False))
        foreign = [n for n in foreign if n != LOCK_FILE]
        if foreign:
            raise self._gained(foreign, "left as they were")
        files = sorted(fs.find(self.tmp), key=lambda f: f.rsplit("/", 1)[-1] == MANIFEST)
        for src in files:
            dst = _join(path, src.rstrip("/").rsplit("/", 1)[-1])
            try:
                if is_local(fs):
                    _put_local(src, dst)
                elif fs.exists(dst):
                    raise FileExistsError(errno.EEXIST, "exists", dst)
                else:
                    fs.mv(src, dst)
            except FileExistsError:
                raise self._gained([posixpath.basename(dst)], "left as they were") from None
            self._placed.append(dst)
        self._placed = []  # the store is whole: its files are no longer undone
        if fs.exists(self.tmp):
            fs.rm(self.tmp, recursive=True)
        self.claim.release()  # the lock, out of the finished store

    def _ours(self, lock: str) -> bool:
        try:
            return json.loads(self.fs.cat_file(lock)).get("token") == self.claim.token
        except (OSError, ValueError, AttributeError):
            return False

    def _lost(self) -> FedrayError:
        return self._error(f"lost its lock ({LOCK_FILE}) while the store was built: removed "
                           "or replaced by someone else; the store was not moved into place")

    def _gained(self, names: list[str], where: str) -> FedrayError:
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        return self._error(f"received files while the store was built ({shown}); they were "
                           f"{where}, and the store was not written")


def _put_local(src: str, dst: str) -> None:
    """Move the file ``src`` to ``dst``, which must not exist (FileExistsError)."""
    try:
        os.link(src, dst)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EOPNOTSUPP):
            raise  # EEXIST: someone's file is there
        with open(src, "rb") as r, open(dst, "xb") as w:  # another file system: a copy
            shutil.copyfileobj(r, w)
    os.unlink(src)


def _ipc_bytes(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def claim_store(url: str) -> RunClaim:
    """Claim ``url`` for a new store, before any data is read: the lock ``fedray run`` puts
    on its output directory (fedray.state.storage.RunClaim), created in ``url``. Stores are
    immutable, so the target must be absent or an empty directory: an existing store, a
    file, or a directory of someone's files is refused (never removed), and one that
    another build holds is refused naming it. The caller ``vacate``s the claim when done:
    on success the lock is already gone with the move (``StoreWriter._place``); on failure
    the lock goes, and the directories the claim made while they are empty."""
    fs, path = filesystem(url, "out", what="recipe")
    # the words for an occupied target: a store (or a file) "already exists"; a directory
    # of other files is not a store, and is said to be kept; a lock alone is a killed
    # build's (a live build's is refused as in use, naming it)
    names = [e.rstrip("/").rsplit("/", 1)[-1] for e in fs.ls(path, detail=False)] \
        if fs.isdir(path) else []
    if names == [LOCK_FILE]:
        problem = (f"holds only the lock of a build that ended without removing it; if no "
                   f"fedray partition is writing there, delete {url.rstrip('/')}/{LOCK_FILE}")
    elif names and MANIFEST not in names:
        problem = ("already holds files that are not a partition store; choose a new or "
                   "empty location (fedray partition never removes files it did not write)")
    else:
        problem = "already exists; choose a new location or remove it"
    occupied = key_error("out", f"{url} {problem}", what="recipe")
    claim = RunClaim(url, "out", what="recipe", command="fedray partition", durable=False,
                     occupied=occupied)
    claim.acquire(new=True)
    return claim


def _check_dataset_facts(dataset: Dataset) -> None:
    """What the manifest's schema will require of a data set given from Python (a recipe's
    sources check it as they read): a store that could not be opened is not written."""
    facts = {"num_classes": dataset.num_classes, "scale": dataset.scale,
             "dtype": str(dataset.train.x.dtype)}
    for key, value in facts.items():
        if not MANIFEST_SCHEMA[key].ok(value):
            raise FedrayError(f"the data set's {key} must be {MANIFEST_SCHEMA[key].need}, got "
                              f"{_short_repr(value)}")


def write_store(url: str, dataset: Dataset, partition: Partition, *, recipe: dict,
                shard_mb: float = 64.0, log: Callable[[str], None] = lambda s: None,
                central_test: Split | None = None, claim: RunClaim | None = None) -> dict:
    """Write ``partition`` of ``dataset`` as a store at ``url``; returns the manifest.

    Clients without test data of their own share ``dataset.test`` as the central test set;
    clients with their own keep ``central_test`` (if given) beside it. claim: the caller's
    hold on ``url`` (``claim_store``); None: claimed here, and dropped at the end."""
    if claim is None:
        claim = claim_store(url)
        try:
            return write_store(url, dataset, partition, recipe=recipe, shard_mb=shard_mb,
                               log=log, central_test=central_test, claim=claim)
        finally:
            claim.vacate()
    train, test = dataset.train, dataset.test
    if test is not None and _label_size(test.y) != _label_size(train.y):
        raise FedrayError(f"the source's train labels have shape {train.y.shape[1:]} but its "
                          f"test labels {test.y.shape[1:]}")
    if partition.test is not None and test is None:
        raise FedrayError("the partition gives clients test data but the source has no test "
                          "split")
    _check_dataset_facts(dataset)
    with StoreWriter(url, num_classes=dataset.num_classes, input_shape=dataset.input_shape,
                     dtype=train.x.dtype, label_shape=train.y.shape[1:],
                     coarse=train.coarse is not None, num_coarse=dataset.num_coarse,
                     scale=dataset.scale, client_test=partition.test is not None,
                     shard_mb=shard_mb, log=log, claim=claim) as writer:
        names = partition.client_names
        counts = np.asarray([len(a) for a in partition.train], dtype=np.int64)
        for a, b in _blocks(counts, writer.row_bytes, writer.shard_bytes):
            idx = np.concatenate(partition.train[a:b]).astype(np.int64) if b > a else \
                np.zeros(0, np.int64)
            part = train.take(idx)
            if partition.train_labels is not None:
                part = Split(part.x, np.concatenate(partition.train_labels[a:b])
                             .astype(np.int64).reshape(part.y.shape), part.coarse)
            tpart = tcounts = None
            if partition.test is not None:
                assert test is not None
                tcounts = np.asarray([len(t) for t in partition.test[a:b]], dtype=np.int64)
                tpart = test.take(np.concatenate(partition.test[a:b]).astype(np.int64))
            writer.add(names[a:b], part, counts[a:b], tpart, tcounts)
        if partition.test is None:
            central_test = test
        return writer.finish(recipe=recipe, info=partition.info, central_test=central_test)


def _blocks(counts: np.ndarray, row_bytes: int, shard_bytes: int) -> list[tuple[int, int]]:
    """Client ranges of at most ``_BLOCK_CLIENTS`` clients and about a shard of rows: what
    is gathered from the data set at a time."""
    if len(counts) == 0:
        return []
    out, start, rows = [], 0, 0
    for k, n in enumerate(counts.tolist()):
        if k > start and (k - start >= _BLOCK_CLIENTS or (rows + n) * row_bytes > shard_bytes):
            out.append((start, k))
            start, rows = k, 0
        rows += n
    out.append((start, len(counts)))
    return out


def read_manifest(url: str) -> dict:
    """The store's manifest, checked for what is cheap to check: the store-wide facts and
    where the client index is. Its clients are checked against the shards when the store is
    built and by ``verify_store``; a worker checks each client it reads."""
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
    version = manifest.get("format_version")
    if type(version) is not int or version not in READS_VERSIONS:  # not true, not 1.0
        raise FedrayError(f"{url}: store format version {manifest.get('format_version')} is not "
                          f"supported (this fedray reads versions "
                          f"{' and '.join(map(str, READS_VERSIONS))})")
    check_manifest(url, manifest)
    return manifest


# --- the manifest's schema ---------------------------------------------------------------
# One table per object of manifest.json: every field a reader relies on, what a good value
# is, and whether it may be absent. ``check_manifest`` checks a manifest against them when a
# store is opened (a few dozen values, whatever the population); what needs the shards
# (their Arrow schema, rows, labels, finite inputs) is checked as a shard is opened and by
# ``verify_store``. A store is read on workers anywhere, so a manifest is as untrusted as
# any input: a shard path must not leave the store's directory, and no number may make a
# reader allocate without bound.

# the numeric dtypes a store's inputs may have (what numpy and Arrow share, byte order native)
STORE_DTYPES = ("uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64",
                "float16", "float32", "float64")
_MAX_DIMS = 8
_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,254}")  # no '/', '\\', ':', '..'
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Field:
    """One manifest field: ``ok(value)`` says whether a value is good, ``need`` what one
    is (for the message), ``required`` whether the field must be present."""

    ok: Callable[[Any], bool]
    need: str
    required: bool = True


def _whole(lo: int, hi: int | None = None) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= lo \
        and (hi is None or v <= hi)


def _dims(lo_len: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, list) and lo_len <= len(v) <= _MAX_DIMS \
        and all(_whole(1, 2**31)(d) for d in v) and math.prod(v) <= 2**31


def _file_name(v: Any) -> bool:
    """A file directly in the store's directory: not a path (``../x``, ``/etc/x``,
    ``sub/x``), not a URL (``s3://...``, ``file:...``), not hidden."""
    return isinstance(v, str) and _FILE_NAME.fullmatch(v) is not None


def _object_or_null(v: Any) -> bool:
    return v is None or isinstance(v, dict)


_FILE = Field(_file_name, "a file name in the store's directory (letters, digits, '_', '-', "
                          "'.'; no '/', '..' or ':')")
_BYTES = Field(_whole(0), "a whole number >= 0")
_HASH = Field(lambda v: isinstance(v, str) and _SHA256.fullmatch(v) is not None,
              "64 lowercase hex digits")

MANIFEST_SCHEMA: dict[str, Field] = {
    "num_clients": Field(_whole(1), "a whole number >= 1"),
    "num_classes": Field(_whole(1, MAX_CLASSES), f"a whole number from 1 to {MAX_CLASSES:,}"),
    "num_coarse": Field(lambda v: v is None or _whole(1, MAX_CLASSES)(v),
                        f"null or a whole number from 1 to {MAX_CLASSES:,}", required=False),
    "input_shape": Field(_dims(1), f"a list of 1 to {_MAX_DIMS} whole numbers >= 1 (at most "
                                   f"2**31 values per example)"),
    "label_shape": Field(_dims(0), f"a list of up to {_MAX_DIMS} whole numbers >= 1",
                         required=False),
    "dtype": Field(lambda v: v in STORE_DTYPES, f"one of {', '.join(STORE_DTYPES)}"),
    "scale": Field(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
                   and math.isfinite(v) and v > 0, "a finite number > 0 (model input = x * "
                   "scale)"),
    "shards": Field(lambda v: isinstance(v, list), "a list of shards"),
    "central_test": Field(lambda v: v is None or (isinstance(v, dict)
                                                  and _whole(0)(v.get("rows"))),
                          'null or {"rows": a whole number >= 0}', required=False),
    "source": Field(_object_or_null, "an object", required=False),
    "partitioner": Field(_object_or_null, "an object", required=False),
    "info": Field(_object_or_null, "an object", required=False),
}
SHARD_SCHEMA: dict[str, Field] = {
    "file": _FILE,
    "split": Field(lambda v: v in SPLITS, f"one of {', '.join(SPLITS)}"),
    "rows": Field(_whole(0), "a whole number >= 0"),
    "bytes": _BYTES,
    "sha256": _HASH,
}
INDEX_SCHEMA: dict[str, Field] = {  # format 2: manifest["client_index"]
    "file": _FILE,
    "bytes": _BYTES,
    "sha256": _HASH,
    "splits": Field(lambda v: v in (["train"], ["train", "test"]),
                    "['train'] or ['train', 'test']"),
}
V1_CLIENTS_SCHEMA: dict[str, Field] = {  # format 1: manifest["clients"] (the lists: from_v1)
    "names": Field(lambda v: isinstance(v, list), "a list of client names"),
    "train": Field(lambda v: isinstance(v, dict), "an object of per-client lists"),
}


def _short_repr(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _check_fields(where: str, prefix: str, obj: Any, schema: dict[str, Field]) -> None:
    if not isinstance(obj, dict):
        raise FedrayError(f"{where}: {prefix.rstrip('.') or 'the manifest'} must be an object, "
                          f"got {_short_repr(obj)}")
    for key, field in schema.items():
        if key not in obj:
            if field.required:
                raise FedrayError(f"{where}: {prefix}{key} is missing (it must be "
                                  f"{field.need})")
            continue
        if not field.ok(obj[key]):
            raise FedrayError(f"{where}: {prefix}{key} must be {field.need}, got "
                              f"{_short_repr(obj[key])}")


def check_manifest(url: str, m: dict) -> None:
    """The manifest against its schema (MANIFEST_SCHEMA, SHARD_SCHEMA for every shard,
    INDEX_SCHEMA or, in format 1, V1_CLIENTS_SCHEMA), then what ties its fields together:
    every file named once. One line names the file and the field."""
    where = f"{url.rstrip('/')}/{MANIFEST}"
    _check_fields(where, "", m, MANIFEST_SCHEMA)
    for i, shard in enumerate(m["shards"]):
        _check_fields(where, f"shards[{i}].", shard, SHARD_SCHEMA)
    if m["format_version"] == 1:
        _check_fields(where, "clients.", m.get("clients"), V1_CLIENTS_SCHEMA)
        if len(m["clients"]["names"]) != m["num_clients"]:
            raise FedrayError(f"{where}: clients.names must list {m['num_clients']} names "
                              f"(num_clients), got {len(m['clients']['names'])}")
        files = []
    else:
        _check_fields(where, "client_index.", m.get("client_index"), INDEX_SCHEMA)
        files = [("client_index.file", m["client_index"]["file"])]
    files += [(f"shards[{i}].file", sh["file"]) for i, sh in enumerate(m["shards"])]
    seen = {MANIFEST}
    for key, name in files:
        if name in seen:
            raise FedrayError(f"{where}: {key} {name!r} is named twice (every file of a "
                              f"store is named once)")
        seen.add(name)


def shard_schema(m: dict) -> pa.Schema:
    """The Arrow schema the manifest's shards must have (the writer's ``_schema``): x a
    fixed-size list of ``dtype`` per example, y int64 labels (or a fixed-size list of them),
    and a coarse int64 label where the store has coarse labels."""
    label_shape = m.get("label_shape") or []
    return _schema(np.dtype(m["dtype"]), math.prod(m["input_shape"]),
                   m.get("num_coarse") is not None,
                   math.prod(label_shape) if label_shape else None)


def client_index(url: str, manifest: dict) -> ClientIndex:
    """The store's per-client columns (opened on first use)."""
    return ClientIndex.from_manifest(url, manifest)


def _digest(fs: Any, p: str) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    with fs.open(p, "rb") as f:
        while chunk := f.read(8 * 2**20):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def verify_store(url: str, manifest: dict | None = None) -> None:
    """Check the whole store: the client index file's size and sha256, then every client
    against the shards (``ClientIndex.check``), then every shard's size and sha256, then its
    contents -- its columns (``shard_schema``), the rows it really holds, every input finite
    as a model input (``float32(x) * scale``), and every label within ``num_classes`` and in
    its client's label histogram. Reads every shard twice: to hash it, then its inputs and
    labels (from the page cache, on a local disk)."""
    m = manifest or read_manifest(url)
    fs, path = filesystem(url, "data.partition")
    source = StoreSource(url, m, max_open_shards=1)
    entry = m.get("client_index")
    if entry is not None:
        p = _join(path, entry["file"])
        if not fs.exists(p):
            raise FedrayError(f"{url}: {entry['file']} is missing")
        if _digest(fs, p) != (entry["bytes"], entry["sha256"]):
            raise FedrayError(f"{url}: {entry['file']} is corrupt (checksum mismatch)")
    label_size = int(np.prod(source.label_shape)) if source.label_shape else 1
    source.index.check(source._files, label_size)
    for shard in m["shards"]:
        p = _join(path, shard["file"])
        if not fs.exists(p):
            raise FedrayError(f"{url}: shard {shard['file']} is missing")
        if _digest(fs, p) != (shard.get("bytes"), shard.get("sha256")):
            raise FedrayError(f"{url}: shard {shard['file']} is corrupt (checksum mismatch)")
    _verify_contents(url, m, source)


def _shard_owner(source: StoreSource, split: str, shard: int, row: int) -> str:
    """Who holds a shard's row, for a message: a client, or the central test set."""
    if split == "central_test":
        return "the central test set"
    ix = source.index
    shards, offsets, counts = ix.shards(split), ix.offsets(split), ix.counts(split)
    held = np.flatnonzero((shards == shard) & (offsets <= row) & (row < offsets + counts))
    return f"client {int(held[0])} ({ix.name(int(held[0]))!r})" if len(held) else "no client"


def _verify_contents(url: str, m: dict, source: StoreSource) -> None:
    classes = int(m["num_classes"])
    labels: dict[str, list[np.ndarray]] = {}
    for split, files in source._files.items():
        for i, shard in enumerate(files):
            batch = source._batch(split, i)  # its columns checked against shard_schema
            if batch.num_rows != shard["rows"]:
                raise FedrayError(f"{url}: shard {shard['file']} holds {batch.num_rows} rows, "
                                  f"the manifest says {shard['rows']}")
            x = numpy_view(batch.column(0).flatten()).reshape(batch.num_rows,
                                                                math.prod(m["input_shape"]))
            bad_input = first_nonfinite(x, source.scale)  # as a worker will read it
            if bad_input is not None:
                row, why = bad_input
                raise FedrayError(f"{url}: shard {shard['file']} row {row} "
                                  f"({_shard_owner(source, split, i, row)}) has {why}: not a "
                                  f"finite model input")
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
    ix = source.index
    for split in ix.splits:
        starts = np.concatenate([[0], np.cumsum([len(y) for y in labels[split]])])
        first = starts[ix.shards(split)] + ix.offsets(split)  # each client's first row
        count = ix.counts(split)
        bounds = np.concatenate([[0], np.cumsum(count)])  # the clients' rows, in client order
        rows = np.repeat(first - bounds[:-1], count) + np.arange(bounds[-1])
        lengths, got_labels, got_counts = sparse_histograms(np.concatenate(labels[split])[rows],
                                                            count, classes)
        have_starts, have_labels, have_counts = ix.sparse(split)
        differ = np.flatnonzero(lengths != np.diff(have_starts))
        first_bad = int(differ[0]) if len(differ) else ix.num_clients
        aligned = int(have_starts[first_bad])  # entries before it line up one to one
        entry = np.flatnonzero((got_labels[:aligned] != have_labels[:aligned])
                               | (got_counts[:aligned] != have_counts[:aligned]))
        if len(entry):
            first_bad = int(np.searchsorted(have_starts, entry[0], side="right")) - 1
        if first_bad < ix.num_clients:
            raise FedrayError(f"{url}: client {first_bad} ({ix.name(first_bad)!r}): its {split} "
                              "labels differ from the label histogram in its client index")


class StoreSource:
    """A partition store as a ClientSource (see fedray.data.source).

    Small to pickle (it is shipped to every worker): the manifest's shard list and where
    the client index is; each process maps the index and the shards itself, lazily, and keeps
    at most ``max_open_shards`` shards (LRU). On a local filesystem files are memory-mapped,
    elsewhere read once into memory.
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
        self.dtype = str(m["dtype"])
        self.schema = shard_schema(m)  # what every shard must hold (checked as it is opened)
        self.index = client_index(url, m)
        self.has_client_test = "test" in self.index.splits
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
        return self.index.counts("train")

    def test_sizes(self) -> np.ndarray:
        if not self.has_client_test:
            return np.broadcast_to(np.int64(0), (self.population,))  # no memory per client
        return self.index.counts("test")

    def name(self, cid: int) -> str:
        """Client ``cid``'s name (a writer id, a user id, or its number)."""
        return self.index.name(cid)

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
            batch.validate()  # buffer sizes (cheap): a short buffer is not read past its end
        except FileNotFoundError:
            raise FedrayError(f"{self.url}: shard {shard['file']} is missing") from None
        except (pa.ArrowInvalid, OSError) as exc:
            raise FedrayError(f"{self.url}: shard {shard['file']} is corrupt: "
                              f"{str(exc).splitlines()[0]}") from None
        problem = self._schema_problem(batch)
        if problem is not None:
            raise FedrayError(f"{self.url}: shard {shard['file']} {problem}")
        self._open[key] = batch
        while len(self._open) > self.max_open_shards:
            self._open.popitem(last=False)
        return batch

    def _schema_problem(self, batch: pa.RecordBatch) -> str | None:
        """What is wrong with a shard's columns (``shard_schema``), or None: checked every
        time a shard is opened -- its schema and null counts are metadata, so the cost is
        the same for ten rows or a million -- so a foreign or hand-edited shard (strings
        for x, int32 labels, float64 where the manifest says uint8, a missing column) is one
        line naming it, not a reshape error or a misread buffer in a worker."""
        want = [f.type for f in self.schema][:2] + [pa.int64()]  # x, y, coarse
        names = batch.schema.names
        if not len(self.schema) <= batch.num_columns <= 3:  # coarse: where num_coarse is set
            return (f"has columns {names}; the manifest needs "
                    f"{', '.join(f'{f.name}: {f.type}' for f in self.schema)}")
        for i, got in enumerate(batch.schema):
            if not got.type.equals(want[i]):
                need = (f"dtype {self.dtype}, input_shape {list(self.input_shape)}" if i == 0
                        else f"label_shape {list(self.label_shape)}" if i == 1 else "coarse")
                return (f"column {i} ({got.name}) is {got.type}; the manifest ({need}) "
                        f"needs {want[i]}")
            column = batch.column(i)
            if column.null_count or (isinstance(column, pa.FixedSizeListArray)
                                     and column.values.null_count):
                return f"column {i} ({got.name}) has missing values (nulls)"
        return None

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
            return numpy_view(column)
        flat = numpy_view(column.flatten())
        return flat.reshape((batch.num_rows, *self.label_shape))

    def _rows(self, split: str, shard: int, lo: int, n: int, cid: int | None = None
              ) -> tuple[np.ndarray, np.ndarray]:
        """Rows lo..lo+n-1 of a shard as model inputs (float32, scaled) and labels; client
        ``cid`` is named, with the shard and row, if an input is not finite."""
        batch = self._batch(split, shard).slice(lo, n)
        raw = numpy_view(batch.column(0).flatten())
        raw = raw.reshape((n, *self.input_shape))
        y = self._labels(batch)
        if y is None:
            raise FedrayError(f"{self.url}: {split} shard {shard} has labels of type "
                              f"{batch.column(1).type}, not {self._label_type()}")
        x = raw
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is reported below
            if self.scale != 1.0 or x.dtype != np.float32:
                x = x.astype(np.float32) * np.float32(self.scale)
            finite = bool(np.isfinite(x).all())  # one pass over the rows just read
        if not finite:
            # data.verify finds these before a run; with it off, a worker says it here,
            # rather than train on it and drop every update it touches as non-finite
            row, why = first_nonfinite(raw, self.scale) or (0, "a non-finite value")
            who = "" if cid is None else f"client {cid} ({self.index.name(cid)!r}): "
            raise FedrayError(f"{self.url}: {who}{split} shard "
                              f"{self._files[split][shard]['file']} row {lo + row} has {why}: "
                              f"not a finite model input")
        return x, y

    def client(self, cid: int, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
        if split not in INDEX_SPLITS or split not in self.index.splits:
            raise FedrayError(f"{self.url} has no per-client {split} data")
        if not 0 <= cid < self.population:
            raise FedrayError(f"{self.url}: client {cid} is outside 0..{self.population - 1}")
        ix = self.index
        shard, lo, n = (int(ix.shards(split)[cid]), int(ix.offsets(split)[cid]),
                        int(ix.counts(split)[cid]))
        problem = row_problem(split, shard, lo, n, self._files[split])
        if problem is not None:  # a foreign or edited index: say so, not a reshape error
            raise FedrayError(f"{ix.where}: client {cid} ({ix.name(cid)!r}) {problem}")
        x, y = self._rows(split, shard, lo, n, cid)
        if len(y) and not 0 <= int(y.min()) <= int(y.max()) < self.num_classes:
            # verify_store finds these before a run; with data.verify off, say it here
            bad = int(y.min()) if y.min() < 0 else int(y.max())
            raise FedrayError(f"{self.url}: client {cid} ({ix.name(cid)!r}) has "
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
