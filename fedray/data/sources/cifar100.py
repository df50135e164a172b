"""CIFAR-100, python version: the official ``train``/``test``/``meta`` pickles.

The official distribution is a set of pickles, read with the restricted unpickler of
fedray.data.sources.cifar_pickle (shared with CIFAR-10), so a malicious file cannot run code;
the archive is read in place, so a 161 MB download never has to be unpacked to disk.
"""

from __future__ import annotations

from fedray.data.dataset import Dataset
from fedray.data.examples import Split
from fedray.data.sources.cifar_pickle import field, images, label_array, locate
from fedray.errors import FedrayError

ARCHIVE = "cifar-100-python.tar.gz"
FOLDER = "cifar-100-python"
NUM_CLASSES = 100
NUM_COARSE = 20
WHAT = "CIFAR-100"  # the data set, as error lines name it
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
    docs = locate(path, ARCHIVE, FOLDER, ("train", "test", "meta"), ("meta",), WHAT,
                  "train/test pickles")
    if "meta" in docs:
        _check_meta(*docs["meta"])
    train = _to_split(*docs["train"])
    test = _to_split(*docs["test"])
    return Dataset(name="cifar100", train=train, test=test, num_classes=NUM_CLASSES,
                   owners=None, num_coarse=NUM_COARSE, scale=1.0 / 255.0)


def _to_split(doc: dict, where: str) -> Split:
    x = images(doc, where)
    y = label_array(doc, b"fine_labels", len(x), NUM_CLASSES, where)
    coarse = label_array(doc, b"coarse_labels", len(x), NUM_COARSE, where)
    return Split(x, y, coarse=coarse)


def _check_meta(doc: dict, where: str) -> None:
    for key, count in ((b"fine_label_names", NUM_CLASSES), (b"coarse_label_names", NUM_COARSE)):
        names = field(doc, key, where)
        if not isinstance(names, list) or len(names) != count:
            raise FedrayError(f"{where}: {key!r} must list {count} names")


