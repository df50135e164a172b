"""Per-client state that persists across rounds (e.g. SCAFFOLD's control variates c_i).

Clients are virtual and any worker may train any client in any round, so their state cannot
live in one process: 100,000 clients of a 1.2M-parameter model would be 480 GB. It lives on
disk under the run directory (any fsspec URL), one immutable safetensors file per client and
version -- the round that wrote it:

    {url}/{client_id // 1000:06d}/{client_id}.r{version}.safetensors

so no directory holds more than 1,000 clients' files.

Why versions: a worker that dies mid-round may already have written some of its clients'
new c_i; their re-run must read the c_i the first run read, not the new one. A run resumed
from a checkpoint must read c_i as of the checkpoint, not as of the round it was killed in.
So a round never overwrites a client's state; it writes version r beside the old one. The
driver keeps the index -- per client that has state, the version that is current (0: none
yet; ``ClientVersions``) -- in its checkpoint, tells each worker the versions of its
clients, and deletes versions once neither a re-run nor the last checkpoint can need them
(fedray.runtime.driver), so the store holds about one file per client.

Concurrency: a (client, version) is written by one worker (the driver gives each sampled
client to one worker); a re-run after a crash writes identical bytes. Writes go to a
temporary name in the same directory and are moved into place, so a reader never sees a
half-written file. Because files are immutable, a process's cache entry for (client,
version) is always valid: no stat, no read on a hit. The cache is an LRU bounded in bytes, so
no process's memory grows with the population.
"""

from __future__ import annotations

import contextlib
import operator
import os
import posixpath
import re
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import fsspec
import numpy as np
import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from fedray.errors import FedrayError
from fedray.state.run_dir import absolute_url
from fedray.state.storage import is_local, write_atomic

SHARD_SIZE = 1000
SUFFIX = ".safetensors"
_NAME = re.compile(r"^(\d+)\.r(\d+)\.safetensors$")

Tensors = dict[str, torch.Tensor]
Key = tuple[int, int]  # (client id, version)


def _nbytes(tensors: Tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _check_id(client_id: int) -> int:
    cid = operator.index(client_id)
    if cid < 0:
        raise ValueError(f"client_id must be >= 0, got {cid}")
    return cid


def _check_version(version: int, least: int) -> int:
    v = operator.index(version)
    if v < least:
        raise ValueError(f"version must be >= {least}, got {v}")
    return v


class ClientStateStore:
    """Disk-backed, versioned per-client tensors with a bounded per-process LRU cache.

    ``get`` returns CPU tensors the caller owns (mutating them does not touch the store);
    ``put`` writes through to disk. ``hits``/``misses`` count gets served from the cache or
    from a file. Picklable: a copy starts with an empty cache and opens the filesystem
    lazily.
    """

    def __init__(self, url: str, cache_mb: float = 64.0):
        if not cache_mb >= 0:
            raise ValueError(f"cache_mb must be >= 0, got {cache_mb}")
        self.url = absolute_url(url)
        self.cache_mb = float(cache_mb)
        self._budget = int(self.cache_mb * 2**20)
        self._init_process_state()

    def _init_process_state(self) -> None:
        self._fs_path: tuple[fsspec.AbstractFileSystem, str] | None = None
        self._local: bool | None = None  # a local filesystem: plain os calls (_write, _read)
        self._made: set[str] = set()  # shard directories this process has created
        self._writer: ThreadPoolExecutor | None = None  # put_async's one thread
        self._pending: list[Future] = []
        self._cache: OrderedDict[Key, tuple[Tensors, int]] = OrderedDict()
        self._cache_bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "cache_mb": self.cache_mb, "_budget": self._budget}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_process_state()

    def __repr__(self) -> str:
        return f"ClientStateStore({self.url!r}, cache_mb={self.cache_mb})"

    # -- paths ---------------------------------------------------------------------------

    @property
    def _fs(self) -> fsspec.AbstractFileSystem:
        return self._fs_and_root()[0]

    def _fs_and_root(self) -> tuple[fsspec.AbstractFileSystem, str]:
        if self._fs_path is None:
            fs, path = fsspec.core.url_to_fs(self.url)
            self._fs_path = (fs, path.rstrip("/") or "/")
        return self._fs_path

    def _dir(self, cid: int) -> str:
        return posixpath.join(self._fs_and_root()[1], f"{cid // SHARD_SIZE:06d}")

    def _file(self, cid: int, version: int) -> str:
        return posixpath.join(self._dir(cid), f"{cid}.r{version}{SUFFIX}")

    def file_url(self, client_id: int, version: int) -> str:
        """Where version ``version`` of the state of ``client_id`` is (or would be) stored."""
        return self._fs.unstrip_protocol(
            self._file(_check_id(client_id), _check_version(version, 1)))

    # -- cache ---------------------------------------------------------------------------

    @property
    def cache_bytes(self) -> int:
        """Tensor bytes held by this process's cache (never more than ``cache_mb``)."""
        return self._cache_bytes

    def _drop(self, key: Key) -> None:
        with self._lock:
            entry = self._cache.pop(key, None)
            if entry is not None:
                self._cache_bytes -= entry[1]

    def _remember(self, key: Key, tensors: Tensors) -> bool:
        """Cache ``tensors`` (owned by the cache from now on); False if they do not fit."""
        size = _nbytes(tensors)
        self._drop(key)
        if size > self._budget:
            return False
        with self._lock:
            while self._cache and self._cache_bytes + size > self._budget:
                _, (_, freed) = self._cache.popitem(last=False)
                self._cache_bytes -= freed
            self._cache[key] = (tensors, size)
            self._cache_bytes += size
            return True

    # -- public API ----------------------------------------------------------------------

    def get(self, client_id: int, version: int) -> Tensors | None:
        """Version ``version`` of the state of ``client_id`` as CPU tensors; None for
        version 0 (the client has no state yet), without touching the disk."""
        cid, v = _check_id(client_id), _check_version(version, 0)
        if v == 0:
            return None
        key = (cid, v)
        with self._lock:
            entry = self._cache.get(key)
            if entry is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                return {k: t.clone() for k, t in entry[0].items()}
        self.misses += 1
        fs = self._fs
        path = self._file(cid, v)
        try:
            data = self._read(fs, path)
        except FileNotFoundError:
            raise FedrayError(f"client state file {fs.unstrip_protocol(path)} is missing: the "
                              "run directory was modified") from None
        except OSError as exc:
            raise FedrayError(f"client state file {fs.unstrip_protocol(path)} is "
                              f"unreadable: {exc}") from None
        try:
            tensors = load_safetensors(data)
        except Exception as exc:  # safetensors raises its own SafetensorError
            raise FedrayError(f"client state file {fs.unstrip_protocol(path)} is corrupt: "
                              f"{exc}") from None
        if self._remember(key, tensors):
            return {k: t.clone() for k, t in tensors.items()}
        return tensors

    def put(self, client_id: int, version: int, tensors: Tensors) -> None:
        """Write version ``version`` (>= 1) of the state of ``client_id``, atomically; the
        cache keeps a copy. Writing an existing version replaces it (a re-run's identical
        bytes)."""
        cid, v, data = self._encode(client_id, version, tensors)
        self._write_or_forget(cid, v, data)

    def _write_or_forget(self, cid: int, version: int, data: bytes) -> None:
        """Write the file (a temporary file, then a rename); if that fails, the cache must
        not serve a version the disk does not hold."""
        try:
            self._write(cid, version, data)
        except BaseException:
            self._drop((cid, version))
            raise

    def _encode(self, client_id: int, version: int, tensors: Tensors) -> tuple[int, int, bytes]:
        """Check a put's arguments, encode the tensors and cache own copies of them (the
        caller's may change right after); the file is still to be written."""
        cid, v = _check_id(client_id), _check_version(version, 1)
        if not isinstance(tensors, dict) or not all(
                isinstance(k, str) and isinstance(t, torch.Tensor) for k, t in tensors.items()):
            raise TypeError("tensors must be a dict of str -> torch.Tensor")
        # own contiguous CPU copies: saved, then kept by the cache, immune to the caller
        owned = {k: t.detach().to("cpu", memory_format=torch.contiguous_format, copy=True)
                 for k, t in tensors.items()}
        data = save_safetensors(owned)
        self._drop((cid, v))
        self._remember((cid, v), owned)
        return cid, v, data

    def put_async(self, client_id: int, version: int, tensors: Tensors) -> None:
        """``put``, with the file written on this process's writer thread: the tensors are
        copied and encoded now (the caller may reuse its buffers at once) and the cache
        serves them at once; ``flush`` waits for the files. Why: creating a file is the
        slow part of a put (several ms when two workers create files in one shard folder,
        most of a small client's round: docs/performance.md, "Algorithm API v2
        examples"), and it waits on the filesystem, not the CPU, so the next clients train
        meanwhile."""
        cid, v, data = self._encode(client_id, version, tensors)
        if self._writer is None:
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="fedray-state-writer")
        self._pending.append(self._writer.submit(self._write_or_forget, cid, v, data))

    def flush(self) -> None:
        """Wait for every ``put_async`` file; raise the first write's error, if any (the
        others are waited for all the same, so none is still being written)."""
        pending, self._pending = self._pending, []
        error = None
        for future in pending:
            exc = future.exception()
            if exc is not None and error is None:
                error = exc
        if error is not None:
            raise error

    def _is_local(self, fs: fsspec.AbstractFileSystem) -> bool:
        if self._local is None:
            self._local = is_local(fs)
        return self._local

    def _read(self, fs: fsspec.AbstractFileSystem, path: str) -> bytes:
        if self._is_local(fs):
            with open(path, "rb") as f:
                return f.read()
        return fs.cat_file(path)

    def _write(self, cid: int, version: int, data: bytes) -> None:
        """One client's file, whole or not at all. On a local disk with plain os calls:
        a stateful client's round (a local head, a personal model) writes one small file,
        and fsspec's path handling, existence checks and move cost several times the write
        itself (about 1 ms against 0.3 ms per client; docs/performance.md, "Algorithm API
        v2 examples"). Elsewhere through fsspec (write_atomic)."""
        fs = self._fs
        folder, path = self._dir(cid), self._file(cid, version)
        if not self._is_local(fs):
            fs.makedirs(folder, exist_ok=True)
            write_atomic(fs, [(path, data)])
            return
        if folder not in self._made:
            os.makedirs(folder, exist_ok=True)
            self._made.add(folder)
        tmp = f"{folder}/.{cid}.r{version}.{uuid.uuid4().hex}.tmp"
        try:
            try:
                f = open(tmp, "wb")  # noqa: SIM115 -- closed below
            except FileNotFoundError:  # the folder went since this process made it
                os.makedirs(folder, exist_ok=True)
                f = open(tmp, "wb")  # noqa: SIM115
            with f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:  # an interrupt too: no temporary file stays behind
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def delete(self, items: Iterable[tuple[int, int]]) -> int:
        """Remove these (client id, version) files; missing ones are skipped. Returns how
        many were removed."""
        fs = self._fs
        paths = []
        for cid, v in items:
            key = (_check_id(cid), _check_version(v, 1))
            self._drop(key)
            paths.append(self._file(*key))
        present = [p for p in paths if fs.exists(p)]
        if present:
            fs.rm(present)
        return len(present)

    def _listing(self) -> tuple[dict[int, list[int]], list[str]]:
        """(client id -> sorted versions, temporary files) under the root."""
        fs, root = self._fs_and_root()
        try:
            paths = fs.find(root)
        except FileNotFoundError:
            return {}, []
        found: dict[int, list[int]] = {}
        temporaries = []
        for p in paths:
            shard, name = posixpath.split(str(p).rstrip("/"))
            if name.startswith(".") and name.endswith(".tmp"):
                temporaries.append(str(p))
                continue
            m = _NAME.match(name)
            if m is None:
                continue
            cid, v = int(m.group(1)), int(m.group(2))
            if posixpath.basename(shard) == f"{cid // SHARD_SIZE:06d}" and v >= 1:
                found.setdefault(cid, []).append(v)
        return {c: sorted(vs) for c, vs in sorted(found.items())}, temporaries

    def versions(self) -> dict[int, list[int]]:
        """Every client with state -> its versions present. Lists every file: for tests,
        resuming and reports, not for the training loop."""
        return self._listing()[0]

    def clients(self) -> list[int]:
        """Sorted ids of the clients that have state (any version)."""
        return list(self.versions())

    def sweep(self, keep: Callable[[int], int]) -> int:
        """Delete every version other than ``keep(client_id)`` (0: keep none) and every
        temporary file a killed writer left; returns how many files went. Resuming from a
        checkpoint uses it to drop what was written after it."""
        found, temporaries = self._listing()
        stale = [(c, v) for c, vs in found.items() for v in vs if v != keep(c)]
        removed = self.delete(stale)
        if temporaries:
            self._fs.rm(temporaries)
        return removed + len(temporaries)


class ClientVersions:
    """The driver's index of per-client state: for each client, the version (round) of its
    stored state that is current; 0 for a client with none yet.

    Sparse, over the clients that ever stored state: a run touches at most rounds x k
    clients, while one int32 per client of a population of 10^8 would hold 400 MB on the
    driver, and a Python dict costs about 100 bytes an entry. Held as sorted ids with their
    versions (12 bytes a client) plus the clients first seen since the last merge in a small
    dict, merged in once it outgrows an eighth of the arrays: a lookup is a binary search,
    and a round's update costs O(k log n), amortized.
    """

    MERGE_AT = 4096  # the recent dict's size that always triggers a merge

    def __init__(self, population: int):
        self.population = int(population)
        self._ids = np.zeros(0, np.int64)
        self._versions = np.zeros(0, np.int32)
        self._recent: dict[int, int] = {}

    @classmethod
    def from_arrays(cls, population: int, ids: Any, versions: Any) -> ClientVersions:
        """From sorted, distinct ids in [0, population) and their versions (>= 1)."""
        out = cls(population)
        ids = np.array(ids, dtype=np.int64).reshape(-1)
        versions = np.array(versions, dtype=np.int32).reshape(-1)
        if len(ids) != len(versions):
            raise ValueError(f"{len(ids)} client ids for {len(versions)} versions")
        if len(ids) and (ids[0] < 0 or ids[-1] >= out.population
                         or not (np.diff(ids) > 0).all() or versions.min() < 1):
            raise ValueError(f"client ids must be sorted, distinct and in [0, "
                             f"{out.population}), with versions >= 1")
        out._ids, out._versions = ids, versions
        return out

    @classmethod
    def from_dense(cls, dense: Any) -> ClientVersions:
        """From one version per client (0: none), as checkpoints before the sparse index
        stored it."""
        dense = np.asarray(dense).reshape(-1)
        if len(dense) and dense.min() < 0:
            raise ValueError("client state versions must be >= 0")
        have = np.flatnonzero(dense)
        return cls.from_arrays(len(dense), have, dense[have])

    def __len__(self) -> int:
        """Clients that have state."""
        return len(self._ids) + len(self._recent)

    def __getitem__(self, client_id: int) -> int:
        return int(self.get([client_id])[0])

    def _positions(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Where each id is in the sorted arrays, and whether it is there."""
        if not len(self._ids):
            return np.zeros(len(ids), np.int64), np.zeros(len(ids), bool)
        pos = np.minimum(np.searchsorted(self._ids, ids), len(self._ids) - 1)
        return pos, self._ids[pos] == ids

    def get(self, ids: Any) -> np.ndarray:
        """The current version of each of ``ids`` (int32, 0: no state yet)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        pos, hit = self._positions(ids)
        out = np.zeros(len(ids), np.int32)
        out[hit] = self._versions[pos[hit]]
        if self._recent:
            for i, cid in enumerate(ids.tolist()):
                v = self._recent.get(cid)
                if v is not None:
                    out[i] = v
        return out

    def record(self, ids: Any, version: int) -> tuple[np.ndarray, np.ndarray]:
        """Make ``version`` current for clients ``ids``; returns those clients (sorted,
        distinct) and the versions they had (0: none)."""
        version = _check_version(version, 1)
        ids = np.unique(np.asarray(ids, dtype=np.int64).reshape(-1))
        if len(ids) and (ids[0] < 0 or ids[-1] >= self.population):
            raise ValueError(f"client ids must be in [0, {self.population})")
        old = self.get(ids)
        pos, hit = self._positions(ids)
        self._versions[pos[hit]] = version
        for cid in ids[~hit].tolist():
            self._recent[cid] = version
        if len(self._recent) > max(self.MERGE_AT, len(self._ids) // 8):
            self._merge()
        return ids, old

    def _merge(self) -> None:
        if not self._recent:
            return
        new = np.fromiter(self._recent, np.int64, len(self._recent))
        order = np.argsort(new)
        new = new[order]
        vs = np.fromiter(self._recent.values(), np.int32, len(self._recent))[order]
        at = np.searchsorted(self._ids, new)
        self._ids = np.insert(self._ids, at, new)
        self._versions = np.insert(self._versions, at, vs)
        self._recent = {}

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The clients with state (sorted ids, int64) and their versions (int32)."""
        self._merge()
        return self._ids, self._versions

    def dense(self) -> np.ndarray:
        """One version per client of the population (int32): for small populations."""
        out = np.zeros(self.population, np.int32)
        ids, vs = self.arrays()
        out[ids] = vs
        return out

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ClientVersions):
            return NotImplemented
        a, b = self.arrays(), other.arrays()
        return (self.population == other.population and np.array_equal(a[0], b[0])
                and np.array_equal(a[1], b[1]))

    def __repr__(self) -> str:
        return f"ClientVersions({len(self)} of {self.population} clients with state)"
