"""natural: one client per natural id the source records (the writer, the user): its own
federation."""

from __future__ import annotations

import numpy as np

from fedray.data.dataset import Dataset, Split
from fedray.data.partition import Partition
from fedray.data.partitioners.common import _groups, _int, _seed, canonical_order
from fedray.errors import FedrayError


def _by_owner(split: Split, k: int, what: str) -> list[np.ndarray]:
    owner = np.asarray(split.owner, dtype=np.int64)
    if len(owner) and (owner.min() < 0 or owner.max() >= k):
        bad = int(owner[(owner < 0) | (owner >= k)][0])
        raise FedrayError(f"partitioner 'natural': {what} owner id {bad} is outside the "
                          f"{k} owners of the data set")
    order = canonical_order(split)
    return [order[p] for p in _groups(owner[order], k)]


def natural(dataset: Dataset, seed: int, min_examples: int = 0) -> Partition:
    """One client per natural id (the writer, the user, ...): the source's own federation.

    Client k is ``dataset.owners[k]``; its train examples are those with ``train.owner == k``
    and its test examples those with ``test.owner == k`` (the source's own train/test split
    is kept; a client with no examples in a split gets an empty array there). If the data set
    has no test split, or its test split has no owners, ``Partition.test`` is None (the test
    split, if any, stays one central test set).

    Drop rule: clients with fewer than ``min_examples`` train examples are dropped, together
    with their test examples; ``info["dropped_clients"]`` counts them and
    ``info["dropped_train_examples"]`` / ``["dropped_test_examples"]`` count their examples.
    With the default 0 every owner is kept, even one with no examples at all. ``seed`` is
    unused: the split is deterministic.
    """
    _seed(seed)
    m = _int("min_examples", min_examples, 0)
    if dataset.owners is None or dataset.train.owner is None:
        raise FedrayError(f"partitioner 'natural' needs natural client ids (owners), but "
                          f"{dataset.name!r} has none")
    owners = [str(o) for o in dataset.owners]
    if len(set(owners)) != len(owners):
        raise FedrayError(f"partitioner 'natural': the owners of {dataset.name!r} are not unique")
    k = len(owners)
    train = _by_owner(dataset.train, k, "train")
    test = None
    if dataset.test is not None and dataset.test.owner is not None:
        test = _by_owner(dataset.test, k, "test")
    keep = [i for i in range(k) if len(train[i]) >= m]
    dropped = [i for i in range(k) if len(train[i]) < m]
    info = {"min_examples": m, "dropped_clients": len(dropped),
            "dropped_train_examples": int(sum(len(train[i]) for i in dropped)),
            "dropped_test_examples": int(sum(len(test[i]) for i in dropped)) if test else 0}
    return Partition([owners[i] for i in keep], [train[i].astype(np.int64) for i in keep],
                     None if test is None else [test[i].astype(np.int64) for i in keep],
                     info=info)
