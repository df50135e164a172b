"""CIFAR-10, python version: the official ``data_batch_1..5``, ``test_batch`` and
``batches.meta`` pickles (https://www.cs.toronto.edu/~kriz/cifar.html).

The pickles are read with the restricted unpickler of fedray.data.sources.cifar_pickle
(shared with CIFAR-100), so a malicious file cannot run code, and the 163 MB archive is read
in place. Each batch is a dict with ``b'batch_label'``, ``b'labels'`` (one label in 0..9 per
image), ``b'data'`` (uint8 [n, 3072]: 1024 R, then 1024 G, then 1024 B values per image,
each plane row-major 32x32) and ``b'filenames'``; ``batches.meta`` holds ``b'label_names'``
(10 names), ``b'num_cases_per_batch'`` and ``b'num_vis'`` (3072).
"""

from __future__ import annotations

import numpy as np

from fedray.data.dataset import Dataset
from fedray.data.examples import Split
from fedray.data.sources.cifar_pickle import PIXELS, field, images, label_array, locate
from fedray.errors import FedrayError

ARCHIVE = "cifar-10-python.tar.gz"
FOLDER = "cifar-10-batches-py"
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
META = "batches.meta"
NUM_CLASSES = 10
WHAT = "CIFAR-10"  # the data set, as error lines name it


def load_cifar10(path: str) -> Dataset:
    """Read CIFAR-10 from ``cifar-10-batches-py/``, its parent, or ``cifar-10-python.tar.gz``
    (or a folder holding it).

    x is uint8 [n, 3, 32, 32] (R, G, B planes, as stored; the store's scale 1/255 makes the
    model input [0, 1]), y the label (10 classes). The train split is data_batch_1..5 in that
    order; all five are required, so a partial download is an error, not a smaller data set.
    ``batches.meta`` is checked when present (10 label names, 3072 values per image, and
    every batch holding ``num_cases_per_batch`` images) but not required.
    """
    names = (*TRAIN_BATCHES, TEST_BATCH, META)
    docs = locate(path, ARCHIVE, FOLDER, names, (META,), WHAT,
                  f"{TRAIN_BATCHES[0]}..5 and {TEST_BATCH} pickles")
    parts = {name: _to_split(*docs[name]) for name in (*TRAIN_BATCHES, TEST_BATCH)}
    if META in docs:
        _check_meta(*docs[META], {docs[name][1]: len(parts[name]) for name in parts})
    train = Split(np.concatenate([parts[b].x for b in TRAIN_BATCHES]),
                  np.concatenate([parts[b].y for b in TRAIN_BATCHES]))
    return Dataset(name="cifar10", train=train, test=parts[TEST_BATCH],
                   num_classes=NUM_CLASSES, owners=None, scale=1.0 / 255.0)


def _to_split(doc: dict, where: str) -> Split:
    x = images(doc, where)
    y = label_array(doc, b"labels", len(x), NUM_CLASSES, where)
    return Split(x, y)


def _check_meta(doc: dict, where: str, rows: dict[str, int]) -> None:
    names = field(doc, b"label_names", where)
    if not isinstance(names, list) or len(names) != NUM_CLASSES:
        raise FedrayError(f"{where}: b'label_names' must list {NUM_CLASSES} names")
    vis = field(doc, b"num_vis", where)
    if isinstance(vis, bool) or not isinstance(vis, (int, np.integer)) or vis != PIXELS:
        raise FedrayError(f"{where}: b'num_vis' must be {PIXELS} (values per image), "
                          f"got {vis!r}")
    per_batch = field(doc, b"num_cases_per_batch", where)
    if isinstance(per_batch, bool) or not isinstance(per_batch, (int, np.integer)) \
            or per_batch < 1:
        raise FedrayError(f"{where}: b'num_cases_per_batch' must be a positive integer, "
                          f"got {per_batch!r}")
    for batch, n in rows.items():
        if n != per_batch:
            raise FedrayError(f"{batch}: b'data' holds {n} images, but {where} says "
                              f"b'num_cases_per_batch' is {per_batch} (a truncated batch?)")
