"""Per-client state that persists across rounds (e.g. SCAFFOLD's control variates c_i).

Clients are virtual and any worker may train any client in any round, so their state cannot
live in one process: 100,000 clients of a 1.2M-parameter model would be 480 GB. It lives on
disk under the run directory (any fsspec URL), one safetensors file per client that has taken
part (a client never seen has no file; callers treat it as zeros):

    {url}/{client_id // 1000:06d}/{client_id}.safetensors

so no directory holds more than 1,000 files. Each process keeps only a small LRU cache,
bounded in bytes, so no process's memory grows with the population.

Concurrency assumption: a client is written by at most one worker per round (the driver
assigns each sampled client to one worker), so there is no write-write race. Writes go to a
temporary name in the same directory and are moved into place, so a reader never sees a
half-written file. Across rounds a client may move to another worker, so a cached value is
trusted only while the file's stat stamp (size plus mtime, inode, ETag, generation... as the
filesystem reports them) is the one seen when it was cached; each cache hit costs one stat,
no read. A filesystem that reports no such field disables the cache's reuse (every get
re-reads), and one whose only field is a coarse mtime could miss a same-size rewrite within
one tick; local disks (inode, ns mtime), memory://, s3, gcs and azure are all precise.
"""

from __future__ import annotations

import operator
import posixpath
import re
import threading
import uuid
from collections import OrderedDict
from typing import Any

import fsspec
import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from fedray.errors import FedrayError
from fedray.run_dir import absolute_url

SHARD_SIZE = 1000
SUFFIX = ".safetensors"
_NAME = re.compile(r"^(\d+)\.safetensors$")
# info() fields that change whenever a file is replaced, across fsspec implementations
# (local: mtime/ino/created; memory: created; s3: ETag/LastModified/VersionId; gcs:
# generation/md5Hash/mtime; azure: etag/last_modified).
_STAMP_KEYS = ("mtime", "ino", "created", "ETag", "etag", "LastModified", "last_modified",
               "VersionId", "version_id", "generation", "md5Hash")

Tensors = dict[str, torch.Tensor]


def _stamp(info: dict[str, Any]) -> tuple | None:
    """What identifies one version of a file, or None if the filesystem gives nothing."""
    parts = tuple((k, info[k]) for k in _STAMP_KEYS if info.get(k) is not None)
    return (info.get("size"), *parts) if parts else None


def _nbytes(tensors: Tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _check_id(client_id: int) -> int:
    cid = operator.index(client_id)
    if cid < 0:
        raise ValueError(f"client_id must be >= 0, got {cid}")
    return cid


class ClientStateStore:
    """Disk-backed per-client tensors with a bounded per-process LRU cache.

    ``get`` returns CPU tensors the caller owns (mutating them does not touch the store);
    ``put`` writes through to disk. ``hits``/``misses`` count gets served from the cache or
    not (a get of a client with no state is a miss). Picklable: a copy starts with an empty
    cache and opens the filesystem lazily.
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
        self._cache: OrderedDict[int, tuple[tuple, Tensors, int]] = OrderedDict()
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

    def _file(self, cid: int) -> str:
        return posixpath.join(self._dir(cid), f"{cid}{SUFFIX}")

    def file_url(self, client_id: int) -> str:
        """Where the state of ``client_id`` is (or would be) stored."""
        return self._fs.unstrip_protocol(self._file(_check_id(client_id)))

    # -- cache ---------------------------------------------------------------------------

    @property
    def cache_bytes(self) -> int:
        """Tensor bytes held by this process's cache (never more than ``cache_mb``)."""
        return self._cache_bytes

    def _drop(self, cid: int) -> None:
        with self._lock:
            entry = self._cache.pop(cid, None)
            if entry is not None:
                self._cache_bytes -= entry[2]

    def _remember(self, cid: int, stamp: tuple | None, tensors: Tensors) -> bool:
        """Cache ``tensors`` (owned by the cache from now on); False if they do not fit."""
        size = _nbytes(tensors)
        with self._lock:
            old = self._cache.pop(cid, None)
            if old is not None:
                self._cache_bytes -= old[2]
            if stamp is None or size > self._budget:
                return False
            while self._cache and self._cache_bytes + size > self._budget:
                _, (_, _, freed) = self._cache.popitem(last=False)
                self._cache_bytes -= freed
            self._cache[cid] = (stamp, tensors, size)
            self._cache_bytes += size
            return True

    # -- public API ----------------------------------------------------------------------

    def get(self, client_id: int) -> Tensors | None:
        """The state of ``client_id`` as CPU tensors, or None if it has none yet."""
        cid = _check_id(client_id)
        fs = self._fs
        path = self._file(cid)
        stamp = None
        if self._budget > 0:
            try:
                # stat before reading: if the file is replaced in between, the cached
                # content is newer than its stamp and the next get simply re-reads it
                stamp = _stamp(fs.info(path))
            except FileNotFoundError:
                self._drop(cid)
                self.misses += 1
                return None
            except OSError as exc:
                raise FedrayError(f"client state file {fs.unstrip_protocol(path)} is "
                                  f"unreadable: {exc}") from None
            with self._lock:
                entry = self._cache.get(cid)
                if entry is not None and stamp is not None and entry[0] == stamp:
                    self._cache.move_to_end(cid)
                    self.hits += 1
                    return {k: t.clone() for k, t in entry[1].items()}
        self.misses += 1
        try:
            data = fs.cat_file(path)
        except FileNotFoundError:
            self._drop(cid)
            return None
        except OSError as exc:
            raise FedrayError(f"client state file {fs.unstrip_protocol(path)} is "
                              f"unreadable: {exc}") from None
        try:
            tensors = load_safetensors(data)
        except Exception as exc:  # safetensors raises its own SafetensorError
            self._drop(cid)
            raise FedrayError(f"client state file {fs.unstrip_protocol(path)} is corrupt: "
                              f"{exc}") from None
        if self._budget > 0 and self._remember(cid, stamp, tensors):
            return {k: t.clone() for k, t in tensors.items()}
        return tensors

    def put(self, client_id: int, tensors: Tensors) -> None:
        """Replace the state of ``client_id`` (atomically on disk; write-through cache)."""
        cid = _check_id(client_id)
        if not isinstance(tensors, dict) or not all(
                isinstance(k, str) and isinstance(t, torch.Tensor) for k, t in tensors.items()):
            raise TypeError("tensors must be a dict of str -> torch.Tensor")
        # own contiguous CPU copies: saved, then kept by the cache, immune to the caller
        owned = {k: t.detach().to("cpu", memory_format=torch.contiguous_format, copy=True)
                 for k, t in tensors.items()}
        data = save_safetensors(owned)
        fs = self._fs
        path = self._file(cid)
        tmp = posixpath.join(self._dir(cid), f".{cid}{SUFFIX}.{uuid.uuid4().hex}.tmp")
        fs.makedirs(self._dir(cid), exist_ok=True)
        try:
            fs.pipe_file(tmp, data)
            fs.mv(tmp, path)
        except BaseException:
            try:
                if fs.exists(tmp):
                    fs.rm(tmp)
            except OSError:
                pass
            self._drop(cid)
            raise
        if self._budget > 0 and _nbytes(owned) <= self._budget:
            self._remember(cid, _stamp(fs.info(path)), owned)
        else:
            self._drop(cid)

    def has(self, client_id: int) -> bool:
        """Whether ``client_id`` has state (one stat)."""
        return bool(self._fs.isfile(self._file(_check_id(client_id))))

    def clients(self) -> list[int]:
        """Sorted ids of the clients that have state. Lists every file: for tests and reports,
        not for the training loop."""
        fs, root = self._fs_and_root()
        try:
            paths = fs.find(root)
        except FileNotFoundError:
            return []
        ids = []
        for p in paths:
            shard, name = posixpath.split(str(p).rstrip("/"))
            m = _NAME.match(name)
            if m is None:
                continue
            cid = int(m.group(1))
            if posixpath.basename(shard) == f"{cid // SHARD_SIZE:06d}":
                ids.append(cid)
        return sorted(ids)
