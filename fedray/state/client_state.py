"""Per-client state that persists across rounds (e.g. SCAFFOLD's control variates c_i).

Clients are virtual and any worker may train any client in any round, so their state cannot
live in one process: 100,000 clients of a 1.2M-parameter model would be 480 GB. It lives on
disk under the run directory (any fsspec URL), in immutable safetensors files named by the
version -- the round that wrote it. A worker writes its round's clients into packs, one file
per task and round (more for large states: ``PACK_MB`` each):

    {url}/packs/r{version}/p{pack}.safetensors       tensors "{client_id}/{key}"

each client's tensors one byte range, so reading a client reads its range, not the pack.
Why packs: creating a file cost 0.1-1.5 ms on a local disk (and is a request to an object
store), as much as training a small client; a file per client and round made a stateful
algorithm (a local head, a personal model) 0.6x FedAvg's speed (docs/performance.md,
"Client state packs"). ``put`` (and ``put_async`` outside ``begin_packs``) still writes a
client's own file, as fedray did before packs, and every reader reads both:

    {url}/{client_id // 1000:06d}/{client_id}.r{version}.safetensors

so no directory holds more than 1,000 clients' files.

Why versions: a worker that dies mid-round may already have written some of its clients'
new c_i; their re-run must read the c_i the first run read, not the new one. A run resumed
from a checkpoint must read c_i as of the checkpoint, not as of the round it was killed in.
So a round never overwrites a client's state; it writes version r beside the old one. The
driver keeps the index -- per client that has state, the version that is current (0: none
yet) and its pack (``ClientVersions``) -- in its checkpoint, tells each worker where its
clients' state is, and deletes a client's file, or a pack once none of its clients' states
is current, when neither a re-run nor the last checkpoint can need it
(fedray.runtime.driver).

Concurrency: a (client, version) is written by one worker (the driver gives each sampled
client to one task); a re-run after a crash writes identical bytes, into the same pack
name (the task's). Writes go to a temporary name in the same directory and are moved into
place, so a reader never sees a half-written file. Because files are immutable, a process's
cache entry for (client, version) is always valid: no stat, no read on a hit. The cache is
an LRU bounded in bytes, so no process's memory grows with the population.
"""

from __future__ import annotations

import contextlib
import json
import math
import operator
import os
import posixpath
import re
import struct
import sys
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
PACKS = "packs"  # {url}/packs/r{version}/p{pack}.safetensors
_PACK_NAME = re.compile(r"^p(\d+)\.safetensors$")
_ROUND_DIR = re.compile(r"^r(\d+)$")
PACK_SEQ = 4096  # packs one task may write in a round: pack id = task * PACK_SEQ + seq
PACK_MB = 8.0  # a pack is written once the clients staged into it hold this much (MiB)
# safetensors' dtype names (its format's spec), for the packs fedray encodes itself
_DTYPE_NAMES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
                torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32",
                torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}
_DTYPES = {name: dtype for dtype, name in _DTYPE_NAMES.items()}

Tensors = dict[str, torch.Tensor]
Key = tuple[int, int]  # (client id, version)
# a pack's index: where each client's tensors are -- (first byte, end byte, [(key, dtype,
# shape, first byte, end byte)]) relative to the data section -- and where that begins
PackIndex = tuple[dict[int, tuple[int, int, list[tuple[str, torch.dtype, list[int], int, int]]]],
                  int]


def pack_parts(clients: list[tuple[int, Tensors]]) -> list[bytes | memoryview]:
    """Several clients' state as one safetensors file, tensor ``"{client}/{key}"``, each
    client's tensors one contiguous byte range, in the order given: a reader of one client
    reads its range (``ClientStateStore.get``), not the file. Encoded here rather than by
    safetensors' ``save``, which orders tensors by dtype and name (one client's bytes
    apart) and costs about 0.1 ms of Python per call; ``safetensors.torch.load`` reads the
    result as any other safetensors file (tests/state/test_client_state.py)."""
    if sys.byteorder != "little":  # safetensors is little-endian; so are x86 and ARM Linux
        raise RuntimeError("client state packs are written on little-endian machines only")
    header: dict[str, dict] = {}
    chunks: list[memoryview] = []
    offset = 0
    for cid, tensors in clients:
        for key in sorted(tensors):
            name = f"{cid}/{key}"
            if name in header:
                raise ValueError(f"client {cid} appears twice in one pack")
            t = tensors[key]
            dtype = _DTYPE_NAMES.get(t.dtype)
            if dtype is None:
                raise TypeError(f"client {cid}'s state {key!r} has dtype {t.dtype}, which a "
                                f"client state pack cannot hold")
            # the tensor's own memory, not a copy: the file is written from it
            raw = memoryview(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
                             .numpy())
            header[name] = {"dtype": dtype, "shape": list(t.shape),
                            "data_offsets": [offset, offset + raw.nbytes]}
            chunks.append(raw)
            offset += raw.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data section starts 8-byte aligned
    return [struct.pack("<Q", len(text)), text, *chunks]


def _pack_index(head: bytes, read_header: Callable[[int], bytes]) -> PackIndex:
    """A pack's index from its first 8 bytes and a reader of its JSON header; ValueError
    when the header does not describe a pack (each client's tensors one range)."""
    (n,) = struct.unpack("<Q", head)
    if n > 1 << 30:
        raise ValueError(f"a header of {n} bytes")
    header = json.loads(read_header(n))
    clients: dict[int, list] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        cid, _, key = name.partition("/")
        a, b = (int(x) for x in entry["data_offsets"])
        dtype, shape = _DTYPES[entry["dtype"]], [int(x) for x in entry["shape"]]
        if b - a != math.prod(shape) * torch.empty((), dtype=dtype).element_size() or a < 0:
            raise ValueError(f"tensor {name!r}: {b - a} bytes for shape {shape}")
        clients.setdefault(int(cid), []).append((key, dtype, shape, a, b))
    index = {}
    for cid, entries in clients.items():
        entries.sort(key=lambda e: e[3])
        lo, hi = entries[0][3], entries[-1][4]
        if sum(e[4] - e[3] for e in entries) != hi - lo:
            raise ValueError(f"client {cid}'s tensors are not one byte range")
        index[cid] = (lo, hi, entries)
    return index, 8 + n


def _decode_range(raw: bytes, lo: int, entries: list) -> Tensors:
    """A client's tensors from its byte range of a pack (``raw`` starts at ``lo``)."""
    buf = bytearray(raw)
    out = {}
    for key, dtype, shape, a, b in entries:
        flat = (torch.frombuffer(buf, dtype=torch.uint8, offset=a - lo, count=b - a)
                if b > a else torch.empty(0, dtype=torch.uint8))
        out[key] = flat.view(dtype).reshape(shape)
    return out


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

    def __init__(self, url: str, cache_mb: float = 64.0, half: bool = False):
        if not cache_mb >= 0:
            raise ValueError(f"cache_mb must be >= 0, got {cache_mb}")
        self.url = absolute_url(url)
        self.cache_mb = float(cache_mb)
        # float32 tensors stored (and cached) as float16, read back as float32: half the
        # disk; the cache holds what the disk holds, so a get is the same from either
        self.half = bool(half)
        self._budget = int(self.cache_mb * 2**20)
        self._init_process_state()

    def _init_process_state(self) -> None:
        self._fs_path: tuple[fsspec.AbstractFileSystem, str] | None = None
        self._local: bool | None = None  # a local filesystem: plain os calls (_write, _read)
        self._made: set[str] = set()  # shard directories this process has created
        self._writer: ThreadPoolExecutor | None = None  # put_async's one thread
        self._pending: list[Future] = []
        # begin_packs: (version, task) of the packs put_async stages into, the clients
        # staged in the open pack and their bytes, the packs sealed, and each put's pack
        self._packing: tuple[int, int] | None = None
        self._staged: list[tuple[int, Tensors]] = []
        self._staged_bytes = 0
        self._sealed = 0
        self._pack_bytes = PACK_MB * 2**20
        self._put_packs: list[int] = []
        self._indexes: OrderedDict[tuple[int, int], PackIndex] = OrderedDict()
        self._cache: OrderedDict[Key, tuple[Tensors, int]] = OrderedDict()
        self._cache_bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "cache_mb": self.cache_mb, "_budget": self._budget,
                "half": self.half}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_process_state()

    def __repr__(self) -> str:
        return f"ClientStateStore({self.url!r}, cache_mb={self.cache_mb}, half={self.half})"

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

    def _pack_dir(self, version: int) -> str:
        return posixpath.join(self._fs_and_root()[1], PACKS, f"r{version}")

    def _pack_file(self, version: int, pack: int) -> str:
        return posixpath.join(self._pack_dir(version), f"p{pack}{SUFFIX}")

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

    def get(self, client_id: int, version: int, pack: int = -1) -> Tensors | None:
        """Version ``version`` of the state of ``client_id`` as CPU tensors, from pack
        ``pack`` of that version (-1: the client's own file); None for version 0 (the client
        has no state yet), without touching the disk. A ``half`` store's float16 tensors
        come back as float32."""
        found = self._get(client_id, version, pack)
        if found is None:
            return None
        tensors, cached = found
        return {k: self._out(t, cached) for k, t in tensors.items()}

    def _out(self, t: torch.Tensor, cached: bool) -> torch.Tensor:
        """A tensor ``get`` returns: float32 again for a ``half`` store's float16 (a new
        tensor, so no other copy); a copy of one the cache holds; else the one read."""
        if self.half and t.dtype == torch.float16:
            return t.float()
        return t.clone() if cached else t

    def _get(self, client_id: int, version: int, pack: int
             ) -> tuple[Tensors, bool] | None:
        """The stored tensors, and whether the cache holds them (so the caller must copy)."""
        cid, v = _check_id(client_id), _check_version(version, 0)
        if v == 0:
            return None
        key = (cid, v)
        with self._lock:
            entry = self._cache.get(key)
            if entry is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                return entry[0], True
        self.misses += 1
        if pack >= 0:
            tensors = self._from_pack(cid, v, int(pack))
            return tensors, self._remember(key, tensors)
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
        return tensors, self._remember(key, tensors)

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

    def _own(self, tensors: Tensors) -> Tensors:
        """Own contiguous CPU copies of a put's tensors: saved, then kept by the cache,
        immune to the caller; float32 ones as float16 in a ``half`` store."""
        if not isinstance(tensors, dict) or not all(
                isinstance(k, str) and isinstance(t, torch.Tensor) for k, t in tensors.items()):
            raise TypeError("tensors must be a dict of str -> torch.Tensor")
        half = torch.float16 if self.half else None
        return {k: t.detach().to("cpu", dtype=half if t.dtype == torch.float32 else None,
                                 memory_format=torch.contiguous_format, copy=True)
                for k, t in tensors.items()}

    def _encode(self, client_id: int, version: int, tensors: Tensors) -> tuple[int, int, bytes]:
        """Check a put's arguments, encode the tensors and cache own copies of them (the
        caller's may change right after); the file is still to be written."""
        cid, v = _check_id(client_id), _check_version(version, 1)
        owned = self._own(tensors)
        data = save_safetensors(owned)
        self._remember((cid, v), owned)  # replacing what the cache held for (cid, v)
        return cid, v, data

    def begin_packs(self, version: int, task: int, pack_mb: float = PACK_MB) -> None:
        """From now until ``flush``, ``put_async`` stages clients' state of ``version`` into
        packs -- files of many clients each, ``packs/r{version}/p{pack}.safetensors`` --
        instead of a file per client: pack ``task * PACK_SEQ + k`` holds the k-th run of
        clients, closed once it holds ``pack_mb`` MiB (a client larger than that has a pack
        of its own). Why: creating a file costs 0.1-1.5 ms on a local disk
        and a request on an object store, as much as training a small client, so a worker
        writes one per round (docs/performance.md, "Client state packs"). ``task``
        identifies what the worker does in the round (the driver's task number): its re-run
        after a failure writes the same packs, byte for byte."""
        v = _check_version(version, 1)
        if task < 0 or (task + 1) * PACK_SEQ > 2**62:
            raise ValueError(f"task must be in [0, {2**62 // PACK_SEQ}), got {task}")
        if not (math.isfinite(pack_mb) and pack_mb > 0):
            raise ValueError(f"pack_mb must be a finite number > 0, got {pack_mb}")
        self._seal()
        self._packing = (v, int(task))
        self._pack_bytes = pack_mb * 2**20
        self._sealed = 0

    def put_async(self, client_id: int, version: int, tensors: Tensors) -> None:
        """``put``, with the file written on this process's writer thread: the tensors are
        copied now (the caller may reuse its buffers at once) and the cache serves them at
        once; ``flush`` waits for the files. Why: creating a file waits on the filesystem,
        not the CPU, so the next clients train meanwhile. Between ``begin_packs`` and
        ``flush``, the client goes into the open pack instead (its version must be the
        packs')."""
        if self._packing is None:
            cid, v, data = self._encode(client_id, version, tensors)
            self._submit(self._write_or_forget, cid, v, data)
            self._put_packs.append(-1)
            return
        cid, v = _check_id(client_id), _check_version(version, 1)
        if v != self._packing[0]:
            raise ValueError(f"client {cid}'s state of version {v} put into packs of "
                             f"version {self._packing[0]}")
        owned = self._own(tensors)
        self._remember((cid, v), owned)  # replacing what the cache held for (cid, v)
        self._staged.append((cid, owned))
        self._staged_bytes += _nbytes(owned)
        self._put_packs.append(self._packing[1] * PACK_SEQ + self._sealed)
        if self._staged_bytes >= self._pack_bytes:
            self._seal()

    def _seal(self) -> None:
        """Write the open pack (its clients staged so far) on the writer thread."""
        if not self._staged:
            return
        if self._sealed + 1 >= PACK_SEQ:
            raise ValueError(f"more than {PACK_SEQ} packs in one task")
        v, task = self._packing
        pack, staged = task * PACK_SEQ + self._sealed, self._staged
        self._staged, self._staged_bytes = [], 0
        self._sealed += 1
        self._submit(self._write_pack, v, pack, staged)

    def _write_pack(self, version: int, pack: int, staged: list[tuple[int, Tensors]]) -> None:
        try:
            self._write_file(self._pack_dir(version), self._pack_file(version, pack),
                             pack_parts(staged))
        except BaseException:  # the cache must not serve what the disk does not hold
            for cid, _ in staged:
                self._drop((cid, version))
            raise

    def _submit(self, fn: Callable, *args: Any) -> None:
        if self._writer is None:
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="fedray-state-writer")
        self._pending.append(self._writer.submit(fn, *args))

    def flush(self) -> list[int]:
        """Write the open pack, wait for every ``put_async`` file, and end ``begin_packs``;
        raise the first write's error, if any (the others are waited for all the same, so
        none is still being written). Returns the pack of each ``put_async`` since the last
        flush, in order (-1: the client's own file)."""
        try:
            self._seal()
        finally:
            self._packing, self._staged, self._staged_bytes = None, [], 0
            pending, self._pending = self._pending, []
            packs, self._put_packs = self._put_packs, []
        error = None
        for future in pending:
            exc = future.exception()
            if exc is not None and error is None:
                error = exc
        if error is not None:
            raise error
        return packs

    def _from_pack(self, cid: int, version: int, pack: int) -> Tensors:
        """Client ``cid``'s tensors from pack ``pack`` of ``version``: one read of its
        byte range (the pack's index is read once per process and kept)."""
        fs = self._fs
        path = self._pack_file(version, pack)
        where = fs.unstrip_protocol(path)
        try:
            index, base = self._index(fs, path, (version, pack))
            entry = index.get(cid)
            if entry is None:
                raise FedrayError(f"client state pack {where} holds no state of client "
                                  f"{cid}: the run directory was modified")
            lo, hi, entries = entry
            raw = self._read(fs, path, base + lo, base + hi)
            if len(raw) != hi - lo:
                raise ValueError(f"{len(raw)} of client {cid}'s {hi - lo} bytes")
            return _decode_range(raw, lo, entries)
        except FileNotFoundError:
            raise FedrayError(f"client state pack {where} is missing: the run directory "
                              "was modified") from None
        except OSError as exc:
            raise FedrayError(f"client state pack {where} is unreadable: {exc}") from None
        except (ValueError, KeyError, TypeError, struct.error, RuntimeError) as exc:
            raise FedrayError(f"client state pack {where} is corrupt: "
                              f"{type(exc).__name__}: {exc}") from None

    def _index(self, fs: fsspec.AbstractFileSystem, path: str, key: tuple[int, int]
               ) -> PackIndex:
        with self._lock:
            index = self._indexes.get(key)
            if index is not None:
                self._indexes.move_to_end(key)
                return index
        index = _pack_index(self._read(fs, path, 0, 8),
                            lambda n: self._read(fs, path, 8, 8 + n))
        with self._lock:
            self._indexes[key] = index
            while len(self._indexes) > 256:  # small: a few KB per pack
                self._indexes.popitem(last=False)
        return index

    def _is_local(self, fs: fsspec.AbstractFileSystem) -> bool:
        if self._local is None:
            self._local = is_local(fs)
        return self._local

    def _read(self, fs: fsspec.AbstractFileSystem, path: str, start: int | None = None,
              end: int | None = None) -> bytes:
        """A file, or its bytes [start, end)."""
        if self._is_local(fs):
            with open(path, "rb") as f:
                if start is None:
                    return f.read()
                f.seek(start)
                return f.read(end - start)
        return fs.cat_file(path, start, end)

    def _write(self, cid: int, version: int, data: bytes) -> None:
        self._write_file(self._dir(cid), self._file(cid, version), data)

    def _write_file(self, folder: str, path: str, data: bytes | list) -> None:
        """One file of the store (a client's, or a pack), whole or not at all. On a local
        disk with plain os calls: fsspec's path handling, existence checks and move cost
        several times the write of a small file (about 1 ms against 0.3 ms;
        docs/performance.md, "Algorithm API v2 examples"). Elsewhere through fsspec
        (write_atomic). ``data``: the bytes, or buffers written one after another (a pack's
        tensors from their own memory)."""
        fs = self._fs
        if not self._is_local(fs):
            fs.makedirs(folder, exist_ok=True)
            write_atomic(fs, [(path, data if isinstance(data, bytes) else b"".join(data))])
            return
        if folder not in self._made:
            os.makedirs(folder, exist_ok=True)
            self._made.add(folder)
        tmp = f"{folder}/.{posixpath.basename(path)}.{uuid.uuid4().hex}.tmp"
        try:
            try:
                f = open(tmp, "wb")  # noqa: SIM115 -- closed below
            except FileNotFoundError:  # the folder went since this process made it
                os.makedirs(folder, exist_ok=True)
                f = open(tmp, "wb")  # noqa: SIM115
            with f:
                if isinstance(data, bytes):
                    f.write(data)
                else:
                    f.writelines(data)
            os.replace(tmp, path)
        except BaseException:  # an interrupt too: no temporary file stays behind
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def delete(self, items: Iterable[tuple[int, int]]) -> int:
        """Remove these (client id, version) files; missing ones are skipped. Returns how
        many were removed."""
        paths = []
        for cid, v in items:
            key = (_check_id(cid), _check_version(v, 1))
            self._drop(key)
            paths.append(self._file(*key))
        return self._remove(paths)

    def delete_packs(self, items: Iterable[tuple[int, int]]) -> int:
        """Remove these (version, pack) packs (and a version's folder once it is empty);
        missing ones are skipped. The caller knows no client reads them any more: their
        clients' cache entries are not dropped (no process asks for them again). Returns
        how many were removed."""
        paths, folders = [], set()
        for v, pack in items:
            v = _check_version(v, 1)
            with self._lock:
                self._indexes.pop((v, int(pack)), None)
            paths.append(self._pack_file(v, int(pack)))
            folders.add(self._pack_dir(v))
        removed = self._remove(paths)
        if self._is_local(self._fs):
            for folder in folders:
                with contextlib.suppress(OSError):  # not empty, or gone
                    os.rmdir(folder)
                    self._made.discard(folder)
        return removed

    def _remove(self, paths: list[str]) -> int:
        """Remove the files that exist of ``paths``; how many there were. Locally one
        unlink each (the driver removes a round's superseded files between rounds)."""
        fs = self._fs
        if self._is_local(fs):
            removed = 0
            for path in paths:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                    removed += 1
            return removed
        present = [p for p in paths if fs.exists(p)]
        if present:
            fs.rm(present)
        return len(present)

    def _listing(self) -> tuple[dict[int, list[int]], list[tuple[int, int]], list[str]]:
        """(client id -> sorted versions of its own files, (version, pack) of every pack,
        temporary files) under the root."""
        fs, root = self._fs_and_root()
        try:
            paths = fs.find(root)
        except FileNotFoundError:
            return {}, [], []
        found: dict[int, list[int]] = {}
        packs = []
        temporaries = []
        for p in paths:
            folder, name = posixpath.split(str(p).rstrip("/"))
            if name.startswith(".") and name.endswith(".tmp"):
                temporaries.append(str(p))
                continue
            parent, shard = posixpath.split(folder)
            m, r = _PACK_NAME.match(name), _ROUND_DIR.match(shard)
            if m is not None and r is not None and posixpath.basename(parent) == PACKS \
                    and int(r.group(1)) >= 1:
                packs.append((int(r.group(1)), int(m.group(1))))
                continue
            m = _NAME.match(name)
            if m is None:
                continue
            cid, v = int(m.group(1)), int(m.group(2))
            if shard == f"{cid // SHARD_SIZE:06d}" and v >= 1:
                found.setdefault(cid, []).append(v)
        return ({c: sorted(vs) for c, vs in sorted(found.items())}, sorted(packs),
                temporaries)

    def versions(self) -> dict[int, list[int]]:
        """Every client with state -> its versions present, in its own files and in packs.
        Lists every file and reads every pack's index: for tests, resuming and reports, not
        for the training loop."""
        found, packs, _ = self._listing()
        fs = self._fs
        for v, pack in packs:
            index, _ = self._index(fs, self._pack_file(v, pack), (v, pack))
            for cid in index:
                found.setdefault(cid, []).append(v)
        return {c: sorted(set(vs)) for c, vs in sorted(found.items())}

    def current(self, index: ClientVersions) -> dict[int, tuple[int, Tensors]]:
        """Every client's current state as ``index`` (a checkpoint's ``client_versions``)
        locates it: client -> (version, tensors). Reads every client: for reports and
        tests, not for the training loop."""
        ids, versions = index.arrays()
        return {cid: (v, self.get(cid, v, pack)) for cid, v, pack in zip(
            ids.tolist(), versions.tolist(), index.packs().tolist(), strict=True)}

    def packs(self) -> list[tuple[int, int]]:
        """(version, pack) of every pack present, sorted."""
        return self._listing()[1]

    def clients(self) -> list[int]:
        """Sorted ids of the clients that have state (any version)."""
        return list(self.versions())

    def sweep(self, keep: Callable[[int], int],
              keep_packs: Iterable[tuple[int, int]] | None = None) -> int:
        """Delete every client's own file other than version ``keep(client_id)`` (0: keep
        none), every pack not in ``keep_packs`` (None: keep every pack) and every temporary
        file a killed writer left; returns how many files went. Resuming from a checkpoint
        uses it to drop what was written after it."""
        found, packs, temporaries = self._listing()
        stale = [(c, v) for c, vs in found.items() for v in vs if v != keep(c)]
        removed = self.delete(stale)
        if keep_packs is not None:
            live = set(keep_packs)
            removed += self.delete_packs([vp for vp in packs if vp not in live])
        if temporaries:
            self._fs.rm(temporaries)
        return removed + len(temporaries)


class ClientVersions:
    """The driver's index of per-client state: for each client, the version (round) of its
    stored state that is current, and the pack that holds it (``ClientStateStore``; -1: a
    file of its own); version 0 for a client with none yet.

    Sparse, over the clients that ever stored state: a run touches at most rounds x k
    clients, while one int32 per client of a population of 10^8 would hold 400 MB on the
    driver, and a Python dict costs about 100 bytes an entry. Held as sorted ids with their
    versions and packs (20 bytes a client) plus the clients first seen since the last merge
    in a small dict, merged in once it outgrows an eighth of the arrays: a lookup is a
    binary search, and a round's update costs O(k log n), amortized.
    """

    MERGE_AT = 4096  # the recent dict's size that always triggers a merge

    def __init__(self, population: int):
        self.population = int(population)
        self._ids = np.zeros(0, np.int64)
        self._versions = np.zeros(0, np.int32)
        self._packs = np.zeros(0, np.int64)
        self._recent: dict[int, tuple[int, int]] = {}

    @classmethod
    def from_arrays(cls, population: int, ids: Any, versions: Any,
                    packs: Any = None) -> ClientVersions:
        """From sorted, distinct ids in [0, population), their versions (>= 1) and packs
        (>= -1; None: all -1, each client's state in a file of its own, as fedray wrote
        it before packs)."""
        out = cls(population)
        ids = np.array(ids, dtype=np.int64).reshape(-1)
        versions = np.array(versions, dtype=np.int32).reshape(-1)
        packs = (np.full(len(ids), -1, np.int64) if packs is None
                 else np.array(packs, dtype=np.int64).reshape(-1))
        if not len(ids) == len(versions) == len(packs):
            raise ValueError(f"{len(ids)} client ids for {len(versions)} versions and "
                             f"{len(packs)} packs")
        if len(ids) and (ids[0] < 0 or ids[-1] >= out.population
                         or not (np.diff(ids) > 0).all() or versions.min() < 1
                         or packs.min() < -1):
            raise ValueError(f"client ids must be sorted, distinct and in [0, "
                             f"{out.population}), with versions >= 1 and packs >= -1")
        out._ids, out._versions, out._packs = ids, versions, packs
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

    def locate(self, ids: Any) -> tuple[np.ndarray, np.ndarray]:
        """The current version (int32, 0: no state yet) and pack (int64, -1: none, or a
        file of its own) of each of ``ids``."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        pos, hit = self._positions(ids)
        versions = np.zeros(len(ids), np.int32)
        packs = np.full(len(ids), -1, np.int64)
        versions[hit] = self._versions[pos[hit]]
        packs[hit] = self._packs[pos[hit]]
        if self._recent:
            for i, cid in enumerate(ids.tolist()):
                at = self._recent.get(cid)
                if at is not None:
                    versions[i], packs[i] = at
        return versions, packs

    def get(self, ids: Any) -> np.ndarray:
        """The current version of each of ``ids`` (int32, 0: no state yet)."""
        return self.locate(ids)[0]

    def record(self, ids: Any, version: int, packs: Any = None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Make ``version`` current for clients ``ids``, each in its pack of ``packs`` (one
        per id; None: all -1); returns those clients (sorted, distinct) with the versions
        and packs they had (0 and -1: none)."""
        version = _check_version(version, 1)
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        packs = (np.full(len(ids), -1, np.int64) if packs is None
                 else np.asarray(packs, dtype=np.int64).reshape(-1))
        if len(packs) != len(ids):
            raise ValueError(f"{len(ids)} client ids for {len(packs)} packs")
        ids, first = np.unique(ids, return_index=True)
        packs = packs[first]
        if len(ids) and (ids[0] < 0 or ids[-1] >= self.population):
            raise ValueError(f"client ids must be in [0, {self.population})")
        if len(packs) and packs.min() < -1:
            raise ValueError("packs must be >= -1")
        old, old_packs = self.locate(ids)
        pos, hit = self._positions(ids)
        self._versions[pos[hit]] = version
        self._packs[pos[hit]] = packs[hit]
        for cid, pack in zip(ids[~hit].tolist(), packs[~hit].tolist(), strict=True):
            self._recent[cid] = (version, pack)
        if len(self._recent) > max(self.MERGE_AT, len(self._ids) // 8):
            self._merge()
        return ids, old, old_packs

    def _merge(self) -> None:
        if not self._recent:
            return
        new = np.fromiter(self._recent, np.int64, len(self._recent))
        order = np.argsort(new)
        new = new[order]
        at_v = np.fromiter((v for v, _ in self._recent.values()), np.int32,
                           len(self._recent))[order]
        at_p = np.fromiter((p for _, p in self._recent.values()), np.int64,
                           len(self._recent))[order]
        at = np.searchsorted(self._ids, new)
        self._ids = np.insert(self._ids, at, new)
        self._versions = np.insert(self._versions, at, at_v)
        self._packs = np.insert(self._packs, at, at_p)
        self._recent = {}

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The clients with state (sorted ids, int64) and their versions (int32)."""
        self._merge()
        return self._ids, self._versions

    def packs(self) -> np.ndarray:
        """The pack of each client of ``arrays()`` (int64, -1: a file of its own)."""
        self._merge()
        return self._packs

    def live_packs(self) -> dict[tuple[int, int], int]:
        """(version, pack) -> how many clients' current state it holds, for every pack
        that holds any: what the driver counts down to delete a pack once no client reads
        it (fedray.runtime.driver)."""
        ids, versions = self.arrays()
        held = self._packs >= 0
        if not held.any():
            return {}
        pairs, counts = np.unique(np.stack([versions[held].astype(np.int64),
                                            self._packs[held]], 1), axis=0,
                                  return_counts=True)
        return {(int(v), int(p)): int(n) for (v, p), n in zip(pairs, counts, strict=True)}

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
                and np.array_equal(a[1], b[1]) and np.array_equal(self.packs(), other.packs()))

    def __repr__(self) -> str:
        return f"ClientVersions({len(self)} of {self.population} clients with state)"
