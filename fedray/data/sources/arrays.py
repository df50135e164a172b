"""numpy: a data set given as arrays, in memory (``from_arrays``) or in an .npz file (the
``numpy`` source of ``fedray partition``, ``load_npz``).

Both go through ``_dataset``, so an .npz file of the same arrays gives the same Dataset, and
the same store, as the Python call. An .npz file is read without pickle: an array of Python
objects (rows of different lengths, a list of strings saved as objects) is refused rather
than unpickled, because unpickling a file can run any code in it.
"""

from __future__ import annotations

import os
import zipfile
from typing import Any

import numpy as np

from fedray.data.dataset import Dataset
from fedray.data.sources.columns import (
    DEFAULT_LABEL,
    Column,
    Part,
    assemble,
    check_keys,
    finite_inputs,
    labels,
    missing_column,
    numbers,
    source_doc,
    split_flags,
    user_ids,
)
from fedray.errors import FedrayError, one_line


def from_arrays(x: Any, y: Any, *, user_ids: Any = None, split: Any = None,
                num_classes: int | None = None, channels_last: bool = False,
                scale: float | None = None) -> Dataset:
    """A Dataset from arrays in memory: ``x`` [n, ...] inputs, ``y`` [n] integer labels
    >= 0, and optionally ``user_ids`` [n] (integers or strings: ``natural`` makes one client
    per user) and ``split`` [n] ("train"/"test" or 0/1: the test rows).

    Inputs: uint8 stays uint8 with ``scale`` 1/255 (pixels), anything else becomes float32
    with scale 1 (``scale`` overrides either); [n, H, W] gets one channel ([n, 1, H, W]),
    and ``channels_last`` reads [n, H, W, C] images as [n, C, H, W]. ``num_classes``:
    default the largest label + 1. Bad input raises a one-line FedrayError naming the
    argument and the row. The store records ``source.name: python``."""
    keys = {"num_classes": num_classes, "channels_last": channels_last, "scale": scale}
    check_keys("numpy", keys)
    names = {"x": "x", "label": "y", "user": "user_ids", "split": "split"}
    given = {"x": x, "label": y, "user": user_ids, "split": split}
    return _dataset("from_arrays", "argument", names, given, name="python",
                    source=source_doc("python", None, **keys), **keys)


def load_npz(path: str, x: str = "x", label: str | None = None, user: str | None = None,
             split: str | None = None, num_classes: int | None = None,
             channels_last: bool = False, scale: float | None = None) -> Dataset:
    """The ``numpy`` source: arrays ``x``, ``label`` (default "y") and optionally ``user``
    and ``split`` of the .npz file ``path`` (``np.savez``), read as ``from_arrays`` reads
    them."""
    keys = {"num_classes": num_classes, "channels_last": channels_last, "scale": scale}
    names = {"x": x, "label": DEFAULT_LABEL["numpy"] if label is None else label, "user": user,
             "split": split}
    check_keys("numpy", {**names, **keys})
    where = os.fspath(path)
    try:
        npz = np.load(where, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise FedrayError(f"{where}: not a readable .npz file ({one_line(exc)})") from None
    if not isinstance(npz, np.lib.npyio.NpzFile):
        raise FedrayError(f"{where}: one .npy array, not an .npz archive of named arrays "
                          f"(np.savez(path, x=..., y=...))")
    with npz:
        given = {}
        for key, name in names.items():
            if name is None:
                given[key] = None
                continue
            if name not in npz.files:
                raise missing_column(where, name, key, npz.files, kind="array")
            try:
                given[key] = npz[name]
            except ValueError as exc:
                if "allow_pickle" not in str(exc):
                    raise FedrayError(f"{where}: array {name!r}: {one_line(exc)}") from None
                raise FedrayError(f"{where}: array {name!r} holds Python objects, which only "
                                  f"pickle reads, and fedray does not unpickle files (pickle can "
                                  f"run code): save rows of one length as a numeric array and "
                                  f"ids as a str array") from None
    return _dataset(where, "array", names, given, name="numpy",
                    source=source_doc("numpy", where, **names, **keys), **keys)


def _dataset(where: str, kind: str, names: dict[str, str | None], given: dict[str, Any], *,
             name: str, source: dict, num_classes: int | None, channels_last: bool,
             scale: float | None) -> Dataset:
    cols = {k: Column(where, n, kind) for k, n in names.items() if n is not None}
    n = _rows(given["x"])
    for key in ("label", "user", "split"):
        if given[key] is not None and _rows(given[key]) != n:
            raise FedrayError(f"{where}: {kind} {names[key]!r} has {_rows(given[key])} rows but "
                              f"{kind} {names['x']!r} has {n}")
    if n == 0:
        raise cols["x"].error("has no rows (a data set needs at least one example)")
    x = numbers(cols["x"], given["x"])
    if channels_last:
        if x.ndim != 4:
            raise cols["x"].error(f"source.channels_last needs [n, H, W, C] images, got shape "
                                  f"{x.shape}")
        x = x.transpose(0, 3, 1, 2)
    elif x.ndim == 3:
        x = x[:, None]  # [n, H, W]: grey images
    elif x.ndim == 1:
        x = x[:, None]  # one number per row
    pixels = x.dtype == np.uint8
    if scale is None:
        scale = 1.0 / 255.0 if pixels else 1.0
    finite_inputs(cols["x"], x, float(scale))  # before the cast: 1e300 is inf in float32
    x = np.ascontiguousarray(x if pixels else x.astype(np.float32))
    part = Part(where, x, labels(cols["label"], given["label"]), cols["label"],
                None if given["user"] is None else user_ids(cols["user"], given["user"]),
                False if given["split"] is None else split_flags(cols["split"], given["split"]))
    return assemble(name, [part], scale=float(scale), num_classes=num_classes, source=source)


def _rows(values: Any) -> int:
    shape = np.shape(values) if not isinstance(values, (list, tuple)) else (len(values),)
    return int(shape[0]) if shape else 0
