"""A raw data set in memory: what a loader returns and a partitioner splits.

Loaders (LEAF, TFF h5, CIFAR-100 pickles, MNIST IDX, ...) read an official on-disk format
into this one shape, so every partitioner works on every source (those that split by class
label need one label per example; sequence labels go with ``natural`` or ``iid``). Images
are channel-first ([n, C, H, W]); pixels keep their stored dtype (uint8 or float32) and
``scale`` says how to turn them into model inputs (1/255 for uint8 pixels, 1.0 for floats
already in [0, 1]).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from fedray.data.partitioned import PartitionedDataset

# The most classes a data set or a store may have. Far beyond any real label set (ImageNet-21k
# has 21,841, a large vocabulary a few 100,000), and small enough that what is sized by the
# classes -- a model's output layer, a store's label histograms, --describe's picture -- fits
# in memory: a stray label of 1e9 must be an error, not a billion-class store.
MAX_CLASSES = 1_000_000


@dataclass
class Split:
    """One split (train or test) of a data set."""

    x: np.ndarray  # [n, C, H, W] images or [n, d] features; uint8 or float32
    # [n] int64 labels (fine labels for CIFAR-100), or [n, L] int64 label sequences (the
    # next-character targets of Shakespeare, fedray.data.shakespeare)
    y: np.ndarray
    coarse: np.ndarray | None = None  # [n] int64 coarse labels (CIFAR-100), else None
    owner: np.ndarray | None = None  # [n] int64 index into Dataset.owners (e.g. the writer)

    def __post_init__(self) -> None:
        if len(self.x) != len(self.y):
            raise ValueError(f"x has {len(self.x)} rows but y has {len(self.y)}")
        for name in ("coarse", "owner"):
            v = getattr(self, name)
            if v is not None and len(v) != len(self.y):
                raise ValueError(f"{name} has {len(v)} rows but y has {len(self.y)}")

    def __len__(self) -> int:
        return len(self.y)

    def take(self, idx: np.ndarray) -> Split:
        """The rows ``idx`` of this split, in that order."""
        return Split(self.x[idx], self.y[idx],
                     None if self.coarse is None else self.coarse[idx],
                     None if self.owner is None else self.owner[idx])


@dataclass
class Dataset:
    name: str  # e.g. "leaf_femnist", "mnist", "cifar100", "tff_emnist", "tff_cifar100"
    train: Split
    test: Split | None
    num_classes: int
    owners: list[str] | None = None  # natural client ids (writers), shared by both splits
    num_coarse: int | None = None  # number of coarse labels (CIFAR-100: 20)
    scale: float = 1.0  # model input = x * scale (1/255 for uint8 pixels)
    # how it was read, as a recipe's ``source`` section (JSON-safe): what a store written by
    # ``partition(...).write_store(...)`` records; None for the recipe path, which records
    # its whole recipe instead
    source: dict | None = None
    # {"fraction", "seed"} of hold_out_test, recorded as the recipe's test_fraction
    holdout: dict | None = None

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.train.x.shape[1:])

    def hold_out_test(self, fraction: float, seed: int = 0) -> Dataset:
        """This data set with ``fraction`` of its train rows, stratified by label and drawn
        from ``seed``, as its test split: a recipe's ``test_fraction`` (same rows for the
        same seed), for data that comes without a test split."""
        from fedray.data.recipe import hold_out_test
        from fedray.errors import key_error

        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) \
                or not 0.0 < fraction < 1.0:
            raise key_error("test_fraction", "must be in (0, 1)", fraction, what="recipe")
        held = hold_out_test(self, float(fraction), seed)
        return replace(held, holdout={"fraction": float(fraction), "seed": int(seed)})

    def partition(self, name: str, seed: int = 0, **params: object) -> PartitionedDataset:
        """Split this data set into clients with partitioner ``name`` (docs/partitions.md)
        and ``params``, from ``seed``; ``.write_store(url)`` on the result writes the store.

        The same call as a recipe's ``partitioner`` section, so a store made in Python and
        one made by ``fedray partition`` from the same data and settings are the same store."""
        from fedray.data.partitioned import PartitionedDataset
        from fedray.data.partitioners import partition

        return PartitionedDataset(self, partition(self, name, seed, **params), name, seed,
                                  dict(params))


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def first_nonfinite(x: np.ndarray, scale: float = 1.0) -> tuple[int, str] | None:
    """The first row of ``x`` whose model input is not finite, and why (NaN, an infinite
    value, a value beyond float32's range, or one that overflows when scaled); None when
    every one is finite.

    Why here: a model input is ``float32(x) * scale`` (how a store's reader makes it), so a
    finite float64 of 1e300, or a finite pixel times an absurd ``scale``, is as useless as a
    NaN -- every update it touches is dropped as non-finite, and a run ends with nothing
    learnt and exit 0. Sources, the store writer, ``data.verify`` and a worker's read of a
    client all ask this one question. It costs two passes over ``x`` (its min and max: the
    extremes overflow first, and NaN propagates through both); the rows are searched, a block
    at a time, only when one fails."""
    if x.size == 0 or x.dtype.kind not in "iuf":
        return None
    s = np.float32(scale)
    with np.errstate(over="ignore", invalid="ignore"):
        ends = np.asarray([x.min(), x.max()])
        if np.isfinite(ends).all() and np.isfinite(ends.astype(np.float32) * s).all():
            return None
        rows = x.reshape(len(x), -1)
        block = max(1, 2**22 // max(1, rows.shape[1]))  # about 16 MB of float32 at a time
        for start in range(0, len(rows), block):
            part = rows[start:start + block]
            scaled = part.astype(np.float32) * s
            bad = np.flatnonzero(~np.isfinite(scaled).all(axis=1))
            if len(bad):
                r = int(bad[0])
                raw = part[r][~np.isfinite(scaled[r])][0].item()
                return start + r, _why_nonfinite(raw, scale)
    return None  # pragma: no cover -- the extremes said one row fails


def _why_nonfinite(raw: float, scale: float) -> str:
    if raw != raw:
        return "NaN"
    if raw in (float("inf"), float("-inf")):
        return f"an infinite value ({raw})"
    if abs(raw) > _FLOAT32_MAX:
        return f"{raw:g}, beyond float32's range (±3.4e38)"
    return f"{raw:g}, which times scale {scale:g} overflows float32 (±3.4e38)"
