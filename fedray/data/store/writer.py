"""Writing a partition store: ``StoreWriter`` streams clients into shards in bounded memory,
into a temporary sibling directory renamed into place at the end; ``claim_store`` holds the
target first; ``write_store`` writes a Dataset's partition held in memory.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import posixpath
import shutil
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fedray.data.examples import Split, first_nonfinite
from fedray.data.partition import Partition, counts_of, span_of
from fedray.data.store.client_index import (
    CLIENTS_FILE,
    ClientIndex,
    histogram_array,
    sparse_histograms,
)
from fedray.data.store.format import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    MANIFEST_SCHEMA,
    SPLITS,
    columns_schema,
    join_path,
    short_repr,
)
from fedray.errors import FedrayError, key_error
from fedray.state.storage import LOCK_FILE, RunClaim, filesystem, is_local
from fedray.version import __version__

if TYPE_CHECKING:  # a Dataset (fedray.data.dataset) uses this module: its type only
    from fedray.data.dataset import Dataset

_BLOCK_CLIENTS = 4096  # clients per block when a partition in memory is written


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
        self.schema = columns_schema(self.dtype, int(np.prod(self.input_shape)), coarse,
                              label_size if self.label_shape else None)
        self.fs, path = fsspec.core.url_to_fs(url)
        self.path = path
        parent = posixpath.dirname(path.rstrip("/")) or "."
        self.tmp = join_path(parent, f".{posixpath.basename(path.rstrip('/'))}.tmp-"
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
        size, sha = _write_ipc(self.fs, join_path(self.tmp, name), batch)
        self.shards.append({"file": name, "split": split, "rows": len(y),
                            "bytes": size, "sha256": sha})
        self.log(f"  wrote {name} ({len(y):,} rows, {size / 2**20:.1f} MB)")

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
        size, sha = _write_ipc(self.fs, join_path(self.tmp, CLIENTS_FILE), index.batch)
        self.log(f"  wrote {CLIENTS_FILE} ({self.num_clients:,} clients, "
                 f"{size / 2**20:.1f} MB)")
        manifest = {
            "format": FORMAT, "format_version": FORMAT_VERSION, "fedray_version": __version__,
            "recipe": recipe, "source": recipe.get("source"), "seed": recipe.get("seed"),
            "partitioner": recipe.get("partitioner"),
            "num_clients": self.num_clients, "num_classes": self.num_classes,
            "num_coarse": self.num_coarse, "input_shape": list(self.input_shape),
            "dtype": str(self.dtype), "scale": self.scale, "schema": self.schema.to_string(),
            "client_index": {"file": CLIENTS_FILE, "splits": list(self.splits),
                             "bytes": size, "sha256": sha},
            "central_test": central, "shards": shards, "info": info,
        }
        if self.label_shape:  # absent: one label per example (every older store)
            manifest["label_shape"] = list(self.label_shape)
        with self.fs.open(join_path(self.tmp, MANIFEST), "w") as f:
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
            aside = join_path(posixpath.dirname(path) or ".",
                          f".{posixpath.basename(path)}.old-{uuid.uuid4().hex[:8]}")
            try:
                os.rename(path, aside)
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    raise self._lost() from None
                return self._place_files()  # a mount point, say: file by file
            found = sorted(os.listdir(aside))
            foreign = [n for n in found if n != LOCK_FILE]
            if foreign or not self._ours(join_path(aside, LOCK_FILE)):
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
            os.unlink(join_path(aside, LOCK_FILE))
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
        if not fs.exists(path) or not self._ours(join_path(path, LOCK_FILE)):
            raise self._lost()
        foreign = sorted(e.rstrip("/").rsplit("/", 1)[-1] for e in fs.ls(path, detail=False))
        foreign = [n for n in foreign if n != LOCK_FILE]
        if foreign:
            raise self._gained(foreign, "left as they were")
        files = sorted(fs.find(self.tmp), key=lambda f: f.rsplit("/", 1)[-1] == MANIFEST)
        for src in files:
            dst = join_path(path, src.rstrip("/").rsplit("/", 1)[-1])
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


class _Hashing:
    """A write-only file that hashes what passes through it on its way to ``f``."""

    def __init__(self, f: Any):
        self.f, self.sha, self.size, self.closed = f, hashlib.sha256(), 0, False

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self.sha.update(view)
        self.f.write(view)
        self.size += view.nbytes
        return view.nbytes

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self.f.flush()

    def close(self) -> None:
        self.closed = True


def _write_ipc(fs: Any, path: str, batch: pa.RecordBatch) -> tuple[int, str]:
    """Write the batch as an Arrow IPC file to ``path``, streamed: returns its size and
    sha256. Why not in memory first: the growing buffer of a 64 MB shard, or of a million
    clients' index, held up to three times its size while it grew and then once more as
    ``bytes``; these are the same bytes, hashed as they are written."""
    with fs.open(path, "wb") as f:
        sink = _Hashing(f)
        with pa.ipc.new_file(sink, batch.schema) as writer:
            writer.write_batch(batch)
    return sink.size, sink.sha.hexdigest()


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
                              f"{short_repr(value)}")


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
        counts = counts_of(partition.train)
        tcounts_all = None if partition.test is None else counts_of(partition.test)
        for a, b in _blocks(counts, writer.row_bytes, writer.shard_bytes):
            part = train.take(span_of(partition.train, a, b).astype(np.int64, copy=False))
            if partition.train_labels is not None:
                part = Split(part.x, span_of(partition.train_labels, a, b)
                             .astype(np.int64).reshape(part.y.shape), part.coarse)
            tpart = tcounts = None
            if partition.test is not None:
                assert test is not None and tcounts_all is not None
                tcounts = tcounts_all[a:b]
                tpart = test.take(span_of(partition.test, a, b).astype(np.int64, copy=False))
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
