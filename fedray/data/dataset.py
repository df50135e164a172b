"""A raw data set in memory: what a loader returns and a partitioner splits.

Loaders (LEAF, TFF h5, CIFAR-100 pickles, MNIST IDX, ...) read an official on-disk format
into this one shape, so every partitioner works on every source (those that split by class
label need one label per example; sequence labels go with ``natural``, ``iid``, ``size`` or
``grouped_natural``). Images are channel-first ([n, C, H, W]); pixels keep their stored
dtype (uint8 or float32) and ``scale`` says how to turn them into model inputs (1/255 for
uint8 pixels, 1.0 for floats already in [0, 1]).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from fedray.core.seeding import TAG_TEST_HOLDOUT, rng
from fedray.data.examples import Split
from fedray.data.partitioned import PartitionedDataset
from fedray.data.partitioners import partition
from fedray.errors import ConfigError, key_error


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
        return PartitionedDataset(self, partition(self, name, seed, **params), name, seed,
                                  dict(params))


def hold_out_test(dataset: Dataset, fraction: float, seed: int) -> Dataset:
    """Carve a central test set out of a train-only source, stratified by label.

    Why stratified: a test set whose label mix drifts from the train set's would blur the very
    accuracy comparisons the reproductions make. Which rows go to test depends on the recipe's
    seed only, so a store rebuilt from the same recipe is the same store.
    """
    if dataset.test is not None:
        raise ConfigError(f"recipe key 'test_fraction': source {dataset.name!r} already has a "
                          f"test split; set test_fraction=0")
    g = rng(seed, TAG_TEST_HOLDOUT)
    test_rows = []
    for label in np.unique(dataset.train.y):
        rows = np.flatnonzero(dataset.train.y == label)
        test_rows.append(g.choice(rows, size=int(round(fraction * len(rows))), replace=False))
    is_test = np.zeros(len(dataset.train), dtype=bool)
    is_test[np.concatenate(test_rows)] = True
    return replace(dataset, train=dataset.train.take(np.flatnonzero(~is_test)),
                   test=dataset.train.take(np.flatnonzero(is_test)))
