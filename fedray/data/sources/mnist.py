"""MNIST in its original IDX files (gzipped or not), parsed by hand to catch bad copies.

IDX is a tiny format (a magic number, big-endian dimensions, raw bytes), so it is read here
without torchvision. The header is checked exactly and the payload must have exactly the
announced size: a truncated download or an images/labels pair from different sets is
an error, not a silently shorter data set. Files are recognised as gzip by their content,
not their name, since browsers often unpack ``.gz`` downloads without renaming them.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from pathlib import Path

import numpy as np

from fedray.data.dataset import Dataset
from fedray.data.examples import Split
from fedray.errors import FedrayError

IMAGES_MAGIC = 0x00000803  # unsigned byte, 3 dimensions
LABELS_MAGIC = 0x00000801  # unsigned byte, 1 dimension
NUM_CLASSES = 10


def load_mnist(path: str) -> Dataset:
    """Read ``{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]`` from directory ``path``.

    x is uint8 [n, 1, 28, 28] (scale 1/255), y int64 in 0..9. Either pair may be missing,
    not both; when only the t10k pair is there it becomes the train split (test is None).
    """
    root = Path(path)
    if not root.is_dir():
        raise FedrayError(f"{root}: not a directory")
    train = _read_pair(root, "train")
    test = _read_pair(root, "t10k")
    if train is None:
        if test is None:
            raise FedrayError(f"{root}: no MNIST IDX files (expected "
                              f"train-images-idx3-ubyte[.gz] and train-labels-idx1-ubyte[.gz], "
                              f"or the t10k-* pair)")
        train, test = test, None
    if test is not None and test.x.shape[1:] != train.x.shape[1:]:
        raise FedrayError(f"{root}: train images are {train.x.shape[2:]} but t10k images are "
                          f"{test.x.shape[2:]}")
    return Dataset(name="mnist", train=train, test=test, num_classes=NUM_CLASSES,
                   scale=1.0 / 255.0)


def _find(root: Path, stem: str) -> Path | None:
    # "-idx3-ubyte" is the official name; some mirrors spell it ".idx3-ubyte"
    dotted = stem.replace("-idx", ".idx")
    for name in (stem, stem + ".gz", dotted, dotted + ".gz"):
        if (root / name).is_file():
            return root / name
    return None


def _read_pair(root: Path, prefix: str) -> Split | None:
    images_file = _find(root, f"{prefix}-images-idx3-ubyte")
    labels_file = _find(root, f"{prefix}-labels-idx1-ubyte")
    if images_file is None and labels_file is None:
        return None
    if images_file is None or labels_file is None:
        missing = "images-idx3" if images_file is None else "labels-idx1"
        raise FedrayError(f"{root}: {prefix}-{missing}-ubyte[.gz] not found "
                          f"(its other half is there)")
    images = _read_idx(images_file, IMAGES_MAGIC, 3)
    labels = _read_idx(labels_file, LABELS_MAGIC, 1)
    if len(images) != len(labels):
        raise FedrayError(f"{labels_file}: {len(labels)} labels but {images_file.name} "
                          f"has {len(images)} images")
    if len(labels) and labels.max() >= NUM_CLASSES:
        raise FedrayError(f"{labels_file}: labels must be in 0..{NUM_CLASSES - 1} "
                          f"(found {int(labels.max())})")
    return Split(images[:, None], labels.astype(np.int64))


def _read_idx(file: Path, magic: int, ndim: int) -> np.ndarray:
    try:
        raw = file.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as e:
        raise FedrayError(f"{file}: cannot read ({type(e).__name__}: {e})") from None
    header = 4 + 4 * ndim
    if len(raw) < 4:
        raise FedrayError(f"{file}: too short for an IDX file ({len(raw)} bytes)")
    (found,) = struct.unpack(">I", raw[:4])
    if found != magic:
        raise FedrayError(f"{file}: IDX magic number is 0x{found:08x}, expected 0x{magic:08x}")
    if len(raw) < header:
        raise FedrayError(f"{file}: truncated IDX header ({len(raw)} bytes)")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    if dims[0] == 0:
        raise FedrayError(f"{file}: its IDX header says 0 {'images' if ndim == 3 else 'labels'}")
    expected = int(np.prod(dims, dtype=np.int64))
    got = len(raw) - header
    if got != expected:
        what = "truncated" if got < expected else "too long"
        raise FedrayError(f"{file}: {what}: header says {'x'.join(map(str, dims))} = "
                          f"{expected} bytes of data, file has {got}")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims).copy()
