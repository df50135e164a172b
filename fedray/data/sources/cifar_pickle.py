"""The official CIFAR python pickles (CIFAR-10's batches, CIFAR-100's train/test/meta), read
without running code.

Both archives at https://www.cs.toronto.edu/~kriz/cifar.html are pickles of dicts of numpy
arrays, lists and byte strings, and a pickle can run arbitrary code when it is loaded. Data
sets get copied from shared drives and mirrors, so the files are treated as untrusted: a
restricted unpickler admits only the few numpy/codecs callables that the real files use
(with their arguments checked), and anything else is refused before it can run. An archive
is read in place (members in archive order), so a 160 MB download never has to be unpacked.

One module for both data sets, so a fix to the unpickler or to a check reaches both; the
data set's name (``what``) only enters the error lines.
"""

from __future__ import annotations

import pickle
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import numpy as np

from fedray.errors import FedrayError, one_line

PIXELS = 3 * 32 * 32  # one row of b'data': 1024 R, then 1024 G, then 1024 B values

# --- restricted unpickling ---------------------------------------------------------------


def _reconstruct_impl() -> Callable[..., Any]:
    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy < 1.26 has no numpy._core
        from numpy.core.multiarray import _reconstruct
    return _reconstruct


_RECONSTRUCT = _reconstruct_impl()


class _NdarrayToken:
    """Stands for numpy.ndarray inside a pickle: usable by _reconstruct, not callable."""


_NDARRAY = _NdarrayToken()


def _safe_reconstruct(subtype: Any, shape: Any, dtype: Any) -> np.ndarray:
    if subtype is not _NDARRAY:
        raise FedrayError("pickle reconstructs something other than a numpy array")
    return _RECONSTRUCT(np.ndarray, shape, dtype)


def _safe_dtype(spec: Any, align: Any = False, copy: Any = False) -> np.dtype:
    if not isinstance(spec, (str, bytes)):
        raise FedrayError(f"pickle asks for an unsupported numpy dtype {spec!r}")
    dt = np.dtype(spec.decode("ascii") if isinstance(spec, bytes) else spec, bool(align))
    if dt.hasobject:
        raise FedrayError("pickle holds a numpy array of Python objects")
    return dt


def _safe_encode(obj: Any, encoding: Any = "utf-8", errors: Any = "strict") -> bytes:
    # Python 3 writes bytes into protocol-2 pickles as _codecs.encode(text, "latin1").
    if not isinstance(obj, str) or encoding not in ("latin1", "latin-1") or errors != "strict":
        raise FedrayError("pickle uses _codecs.encode for something other than latin1 bytes")
    return obj.encode("latin1")


_ALLOWED: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _safe_reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _safe_reconstruct,
    ("numpy", "ndarray"): _NDARRAY,
    ("numpy", "dtype"): _safe_dtype,
    ("_codecs", "encode"): _safe_encode,
}


class _RestrictedUnpickler(pickle.Unpickler):
    """Resolves only the globals that a numpy array in a CIFAR pickle needs."""

    def __init__(self, f: IO[bytes], what: str):
        super().__init__(f, encoding="bytes")
        self.what = what

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise FedrayError(f"pickle refers to {module}.{name}, which a {self.what} file "
                              f"never does (refused, nothing was run)") from None

    def persistent_load(self, pid: Any) -> Any:
        raise FedrayError(f"pickle uses persistent ids, which a {self.what} file never does")


def unpickle(f: IO[bytes], where: str, what: str) -> dict:
    """The dict pickled in ``f`` (``where`` names it in errors, ``what`` is the data set)."""
    try:
        doc = _RestrictedUnpickler(f, what).load()
    except FedrayError as e:
        raise FedrayError(f"{where}: {e}") from None
    except Exception as e:  # any failure to decode means "not a CIFAR pickle"
        raise FedrayError(f"{where}: not a {what} pickle ({type(e).__name__}: "
                          f"{one_line(e)})") from None
    if not isinstance(doc, dict):
        raise FedrayError(f"{where}: expected a pickled dict, got {type(doc).__name__}")
    return doc


# --- locating the files ------------------------------------------------------------------

Doc = tuple[dict, str]  # (unpickled dict, where it came from for messages)


def read_folder(folder: Path, names: tuple[str, ...], optional: tuple[str, ...],
                what: str) -> dict[str, Doc]:
    """Unpickle ``folder/<name>`` for each name; a missing one is an error unless optional."""
    docs: dict[str, Doc] = {}
    for name in names:
        file = folder / name
        if not file.is_file():
            if name in optional:
                continue
            raise FedrayError(f"{file}: {what} file not found")
        with open(file, "rb") as f:
            docs[name] = (unpickle(f, str(file), what), str(file))
    return docs


def read_archive(archive: Path, folder: str, names: tuple[str, ...],
                 optional: tuple[str, ...], what: str) -> dict[str, Doc]:
    """Unpickle the members ``folder/<name>`` (or ``<name>``) of a tar archive, in place."""
    try:
        tar = tarfile.open(archive, "r:*")
    except (tarfile.TarError, OSError, EOFError) as e:
        raise FedrayError(f"{archive}: not a readable tar archive ({one_line(e)})") from None
    with tar:
        try:
            members = {m.name: m for m in tar.getmembers() if m.isfile()}
        except (tarfile.TarError, OSError, EOFError) as e:
            raise FedrayError(f"{archive}: corrupt tar archive ({one_line(e)})") from None
        wanted: dict[str, tarfile.TarInfo] = {}
        for name in names:
            member = members.get(f"{folder}/{name}") or members.get(name)
            if member is not None:
                wanted[name] = member
            elif name not in optional:
                raise FedrayError(f"{archive}: member {folder}/{name} not found")
        docs: dict[str, Doc] = {}
        # in archive order: a gzip stream is cheap to read forwards, costly to seek back
        for name, member in sorted(wanted.items(), key=lambda kv: kv[1].offset_data):
            where = f"{archive}:{member.name}"
            f = tar.extractfile(member)
            if f is None:
                raise FedrayError(f"{where}: not a regular file")
            with f:
                docs[name] = (unpickle(f, where, what), where)
    return docs


def locate(path: str, archive: str, folder: str, names: tuple[str, ...],
           optional: tuple[str, ...], what: str, expected: str) -> dict[str, Doc]:
    """The pickles of a data set from the folder of pickles (holding ``names[0]``), its
    parent, the archive, or a folder holding the archive; ``expected`` says what was looked
    for when none is there."""
    p = Path(path)
    if p.is_file():
        return read_archive(p, folder, names, optional, what)
    if (p / names[0]).is_file():
        return read_folder(p, names, optional, what)
    if (p / folder).is_dir():
        return read_folder(p / folder, names, optional, what)
    if (p / archive).is_file():
        return read_archive(p / archive, folder, names, optional, what)
    raise FedrayError(f"{p}: no {what} data (expected {expected}, a {folder}/ folder or "
                      f"{archive})")


# --- validation --------------------------------------------------------------------------

def field(doc: dict, key: bytes, where: str) -> Any:
    if key not in doc:
        raise FedrayError(f"{where}: missing key {key!r}")
    return doc[key]


def label_array(doc: dict, key: bytes, n: int, limit: int, where: str) -> np.ndarray:
    """``doc[key]`` as int64 [n] labels in 0..limit-1."""
    try:
        a = np.asarray(field(doc, key, where))
    except (ValueError, TypeError):
        raise FedrayError(f"{where}: {key!r} must be a list of integers") from None
    if a.ndim != 1 or len(a) != n or (n and a.dtype.kind not in "iu"):
        raise FedrayError(f"{where}: {key!r} must be {n} integers (one per image), "
                          f"got {a.dtype} {a.shape}")
    if n and (a.min() < 0 or a.max() >= limit):
        raise FedrayError(f"{where}: {key!r} has labels outside 0..{limit - 1}")
    return a.astype(np.int64)


def images(doc: dict, where: str) -> np.ndarray:
    """``doc[b'data']`` as uint8 [n, 3, 32, 32] (R, G, B planes, as stored), n >= 1."""
    data = field(doc, b"data", where)
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 \
            or data.shape[1] != PIXELS:
        shape = getattr(data, "shape", None)
        raise FedrayError(f"{where}: b'data' must be a uint8 array [n, {PIXELS}], got "
                          f"{getattr(data, 'dtype', type(data).__name__)} {shape}")
    n = len(data)
    if n == 0:
        raise FedrayError(f"{where}: b'data' holds no images (0 rows)")
    # each row is 1024 R, then 1024 G, then 1024 B values, each plane row-major 32x32
    return np.ascontiguousarray(data.reshape(n, 3, 32, 32))
