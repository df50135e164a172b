"""TensorFlow Federated's h5 exports of EMNIST and CIFAR-100, read without TensorFlow.

TFF publishes its federated data sets as plain HDF5 (``examples/<client>/<field>``), and
those files define the client splits that published baselines use. Reading them with h5py
gives the same clients without pulling TensorFlow into the workers. Clients are read in
sorted id order so the arrays never depend on how HDF5 happens to list its groups.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from fedray.data.dataset import Dataset
from fedray.data.examples import Split
from fedray.errors import FedrayError, one_line

_EMNIST_PAIRS = (("fed_emnist_train.h5", "fed_emnist_test.h5", 62),
                 ("fed_emnist_digitsonly_train.h5", "fed_emnist_digitsonly_test.h5", 10))


def load_tff_emnist(path: str) -> Dataset:
    """Read ``fed_emnist_{train,test}.h5`` (62 classes) from directory ``path``.

    When neither file of that pair is there, the ``fed_emnist_digitsonly_*`` pair (10 classes)
    is read instead. x is float32 [n, 1, 28, 28] in [0, 1], as stored.
    """
    train_file, test_file, num_classes = _emnist_pair(Path(path))
    parts = [_read_emnist(f, num_classes) for f in _require(train_file, test_file)]
    return _dataset("tff_emnist", parts, num_classes, None, 1.0)


def load_tff_cifar100(path: str) -> Dataset:
    """Read ``fed_cifar100_{train,test}.h5`` from directory ``path``.

    x is uint8 [n, 3, 32, 32] (stored as [n, 32, 32, 3]), y the fine label (100 classes),
    coarse the coarse label (20). Train and test clients are different people whose ids
    overlap ("0".."99"); ``owners`` holds the union of the id strings, as they are natural ids
    within a split, not a join key across splits.
    """
    root = Path(path)
    files = _require(root / "fed_cifar100_train.h5", root / "fed_cifar100_test.h5")
    parts = [_read_cifar100(f) for f in files]
    return _dataset("tff_cifar100", parts, 100, 20, 1.0 / 255.0)


# one split as read: (client ids in order, x, y, coarse or None, examples per client)
_Part = tuple[list[str], np.ndarray, np.ndarray, np.ndarray | None, np.ndarray]


def _emnist_pair(root: Path) -> tuple[Path, Path, int]:
    """The first EMNIST pair with at least one file present (a lone half is reported later)."""
    for train_name, test_name, num_classes in _EMNIST_PAIRS:
        if (root / train_name).exists() or (root / test_name).exists():
            return root / train_name, root / test_name, num_classes
    names = ", ".join(f"{a} + {b}" for a, b, _ in _EMNIST_PAIRS)
    raise FedrayError(f"{root}: no TFF EMNIST files (expected {names})")


def _require(*files: Path) -> tuple[Path, ...]:
    for f in files:
        if not f.is_file():
            raise FedrayError(f"{f}: file not found")
    return files


def _read_clients(file: Path, keys: tuple[str, ...]) -> tuple[list[str], list[list[np.ndarray]]]:
    """Every ``examples/<client>/<key>`` of ``file``, clients sorted, one list per key."""
    try:
        f = h5py.File(file, "r")
    except OSError as e:
        raise FedrayError(f"{file}: not a readable HDF5 file ({one_line(e)})") from None
    with f:
        examples = f.get("examples")
        if not isinstance(examples, h5py.Group):
            raise FedrayError(f"{file}: missing key 'examples'")
        clients = sorted(examples.keys())
        if not clients:
            raise FedrayError(f"{file}: 'examples' has no clients")
        columns: list[list[np.ndarray]] = [[] for _ in keys]
        for cid in clients:
            group = examples.get(cid)
            if not isinstance(group, h5py.Group):
                raise FedrayError(f"{file}: 'examples/{cid}' is not a group")
            for col, key in zip(columns, keys, strict=True):
                ds = group.get(key)
                if not isinstance(ds, h5py.Dataset):
                    raise FedrayError(f"{file}: missing key 'examples/{cid}/{key}'")
                col.append(ds[()])
            lengths = [len(np.atleast_1d(c[-1])) for c in columns]
            if len(set(lengths)) != 1:
                sizes = ", ".join(f"{k} {n}" for k, n in zip(keys, lengths, strict=True))
                raise FedrayError(f"{file}: client {cid!r} has different lengths ({sizes})")
    return clients, columns


def _read_emnist(file: Path, num_classes: int) -> _Part:
    clients, (pixels, labels) = _read_clients(file, ("pixels", "label"))
    for cid, px in zip(clients, pixels, strict=True):
        if px.ndim != 3 or px.shape[1:] != (28, 28) or px.dtype.kind != "f":
            raise FedrayError(f"{file}: 'examples/{cid}/pixels' must be float [n, 28, 28] "
                              f"(got {px.dtype} {px.shape})")
    x = np.concatenate(pixels).astype(np.float32, copy=False).reshape(-1, 1, 28, 28)
    if len(x) and not (x.min() >= 0.0 and x.max() <= 1.0):  # also false for NaN
        raise FedrayError(f"{file}: pixels must be in [0, 1]")
    y = _labels(file, clients, labels, "label", num_classes)
    return clients, x, y, None, _sizes(labels)


def _read_cifar100(file: Path) -> _Part:
    clients, (images, labels, coarse) = _read_clients(file, ("image", "label", "coarse_label"))
    for cid, im in zip(clients, images, strict=True):
        if im.ndim != 4 or im.shape[1:] != (32, 32, 3) or im.dtype != np.uint8:
            raise FedrayError(f"{file}: 'examples/{cid}/image' must be uint8 [n, 32, 32, 3] "
                              f"(got {im.dtype} {im.shape})")
    x = np.ascontiguousarray(np.concatenate(images).transpose(0, 3, 1, 2))
    y = _labels(file, clients, labels, "label", 100)
    c = _labels(file, clients, coarse, "coarse_label", 20)
    return clients, x, y, c, _sizes(labels)


def _labels(file: Path, clients: list[str], arrays: list[np.ndarray], key: str,
            num_classes: int) -> np.ndarray:
    for cid, a in zip(clients, arrays, strict=True):
        if a.ndim != 1 or a.dtype.kind not in "iu":
            raise FedrayError(f"{file}: 'examples/{cid}/{key}' must be a 1-d integer array "
                              f"(got {a.dtype} {a.shape})")
        if len(a) and (a.min() < 0 or a.max() >= num_classes):
            raise FedrayError(f"{file}: 'examples/{cid}/{key}' has labels outside "
                              f"0..{num_classes - 1}")
    return np.concatenate(arrays).astype(np.int64)


def _sizes(arrays: list[np.ndarray]) -> np.ndarray:
    return np.array([len(a) for a in arrays], dtype=np.int64)


def _dataset(name: str, parts: list[_Part], num_classes: int, num_coarse: int | None,
             scale: float) -> Dataset:
    owners = sorted({cid for clients, *_ in parts for cid in clients})
    index = {cid: i for i, cid in enumerate(owners)}
    splits = []
    for clients, x, y, coarse, sizes in parts:
        owner = np.repeat(np.array([index[c] for c in clients], dtype=np.int64), sizes)
        splits.append(Split(x, y, coarse=coarse, owner=owner))
    return Dataset(name=name, train=splits[0], test=splits[1], num_classes=num_classes,
                   owners=owners, num_coarse=num_coarse, scale=scale)


