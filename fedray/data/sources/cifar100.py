"""CIFAR-100, python version: the official ``train``/``test``/``meta`` pickles.

The official distribution is a set of pickles, and a pickle can run arbitrary code when it is
loaded. Data sets get copied from shared drives and mirrors, so the files are treated as
untrusted: a restricted unpickler admits only the few numpy/codecs callables that the real
files use (with their arguments checked), and anything else is refused before it can run.
The archive is read in place, so a 161 MB download never has to be unpacked to disk.
"""

from __future__ import annotations

import pickle
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import numpy as np

from fedray.data.dataset import Dataset
from fedray.data.examples import Split
from fedray.errors import FedrayError, one_line

ARCHIVE = "cifar-100-python.tar.gz"
FOLDER = "cifar-100-python"
NUM_CLASSES = 100
NUM_COARSE = 20
# The official mapping of the real files' ``coarse_labels``: FINE_TO_COARSE[fine] is the coarse
# label of fine label ``fine`` (fine labels alphabetical: 0 apple -> 4 fruit_and_vegetables).
FINE_TO_COARSE: tuple[int, ...] = (
    4, 1, 14, 8, 0, 6, 7, 7, 18, 3, 3, 14, 9, 18, 7, 11, 3, 9, 7, 11,
    6, 11, 5, 10, 7, 6, 13, 15, 3, 15, 0, 11, 1, 10, 12, 14, 16, 9, 11, 5,
    5, 19, 8, 8, 15, 13, 14, 17, 18, 10, 16, 4, 17, 4, 2, 0, 17, 4, 18, 17,
    10, 3, 2, 12, 12, 16, 12, 1, 9, 19, 2, 10, 0, 1, 16, 12, 9, 13, 15, 13,
    16, 19, 2, 4, 6, 19, 5, 5, 8, 19, 18, 1, 2, 15, 6, 0, 17, 8, 14, 13,
)


def load_cifar100(path: str) -> Dataset:
    """Read CIFAR-100 from ``cifar-100-python/``, its parent, or ``cifar-100-python.tar.gz``.

    x is uint8 [n, 3, 32, 32] (R, G, B planes, as stored), y the fine label (100 classes),
    coarse the coarse label (20). ``meta`` is checked when present but not required.
    """
    p = Path(path)
    if p.is_file():
        docs = _read_archive(p)
    elif (p / "train").is_file():
        docs = _read_folder(p)
    elif (p / FOLDER).is_dir():
        docs = _read_folder(p / FOLDER)
    elif (p / ARCHIVE).is_file():
        docs = _read_archive(p / ARCHIVE)
    else:
        raise FedrayError(f"{p}: no CIFAR-100 data (expected train/test pickles, a {FOLDER}/ "
                          f"folder or {ARCHIVE})")
    if "meta" in docs:
        _check_meta(*docs["meta"])
    train = _to_split(*docs["train"])
    test = _to_split(*docs["test"])
    return Dataset(name="cifar100", train=train, test=test, num_classes=NUM_CLASSES,
                   owners=None, num_coarse=NUM_COARSE, scale=1.0 / 255.0)


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

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise FedrayError(f"pickle refers to {module}.{name}, which a CIFAR-100 file "
                              f"never does (refused, nothing was run)") from None

    def persistent_load(self, pid: Any) -> Any:
        raise FedrayError("pickle uses persistent ids, which a CIFAR-100 file never does")


def _unpickle(f: IO[bytes], where: str) -> dict:
    try:
        doc = _RestrictedUnpickler(f, encoding="bytes").load()
    except FedrayError as e:
        raise FedrayError(f"{where}: {e}") from None
    except Exception as e:  # any failure to decode means "not a CIFAR-100 pickle"
        raise FedrayError(f"{where}: not a CIFAR-100 pickle ({type(e).__name__}: "
                          f"{one_line(e)})") from None
    if not isinstance(doc, dict):
        raise FedrayError(f"{where}: expected a pickled dict, got {type(doc).__name__}")
    return doc


# --- locating the files ------------------------------------------------------------------

_Doc = tuple[dict, str]  # (unpickled dict, where it came from for messages)


def _read_folder(folder: Path) -> dict[str, _Doc]:
    docs: dict[str, _Doc] = {}
    for name in ("train", "test", "meta"):
        file = folder / name
        if not file.is_file():
            if name == "meta":
                continue
            raise FedrayError(f"{file}: CIFAR-100 file not found")
        with open(file, "rb") as f:
            docs[name] = (_unpickle(f, str(file)), str(file))
    return docs


def _read_archive(archive: Path) -> dict[str, _Doc]:
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
        for name in ("train", "test", "meta"):
            member = members.get(f"{FOLDER}/{name}") or members.get(name)
            if member is not None:
                wanted[name] = member
            elif name != "meta":
                raise FedrayError(f"{archive}: member {FOLDER}/{name} not found")
        docs: dict[str, _Doc] = {}
        # in archive order: a gzip stream is cheap to read forwards, costly to seek back
        for name, member in sorted(wanted.items(), key=lambda kv: kv[1].offset_data):
            where = f"{archive}:{member.name}"
            f = tar.extractfile(member)
            if f is None:
                raise FedrayError(f"{where}: not a regular file")
            with f:
                docs[name] = (_unpickle(f, where), where)
    return docs


# --- validation --------------------------------------------------------------------------

def _field(doc: dict, key: bytes, where: str) -> Any:
    if key not in doc:
        raise FedrayError(f"{where}: missing key {key!r}")
    return doc[key]


def _label_array(doc: dict, key: bytes, n: int, limit: int, where: str) -> np.ndarray:
    try:
        a = np.asarray(_field(doc, key, where))
    except (ValueError, TypeError):
        raise FedrayError(f"{where}: {key!r} must be a list of integers") from None
    if a.ndim != 1 or len(a) != n or (n and a.dtype.kind not in "iu"):
        raise FedrayError(f"{where}: {key!r} must be {n} integers (one per image), "
                          f"got {a.dtype} {a.shape}")
    if n and (a.min() < 0 or a.max() >= limit):
        raise FedrayError(f"{where}: {key!r} has labels outside 0..{limit - 1}")
    return a.astype(np.int64)


def _to_split(doc: dict, where: str) -> Split:
    data = _field(doc, b"data", where)
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 \
            or data.shape[1] != 3 * 32 * 32:
        shape = getattr(data, "shape", None)
        raise FedrayError(f"{where}: b'data' must be a uint8 array [n, 3072], got "
                          f"{getattr(data, 'dtype', type(data).__name__)} {shape}")
    n = len(data)
    if n == 0:
        raise FedrayError(f"{where}: b'data' holds no images (0 rows)")
    y = _label_array(doc, b"fine_labels", n, NUM_CLASSES, where)
    coarse = _label_array(doc, b"coarse_labels", n, NUM_COARSE, where)
    # each row is 1024 R, then 1024 G, then 1024 B values, each plane row-major 32x32
    x = np.ascontiguousarray(data.reshape(n, 3, 32, 32))
    return Split(x, y, coarse=coarse)


def _check_meta(doc: dict, where: str) -> None:
    for key, count in ((b"fine_label_names", NUM_CLASSES), (b"coarse_label_names", NUM_COARSE)):
        names = _field(doc, key, where)
        if not isinstance(names, list) or len(names) != count:
            raise FedrayError(f"{where}: {key!r} must list {count} names")


