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
