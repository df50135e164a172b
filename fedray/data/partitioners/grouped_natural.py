"""grouped_natural: several natural ids (writers, users) per client, each keeping its own
test data (flwr-datasets' GroupedNaturalIdPartitioner)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fedray.core.seeding import rng
from fedray.data.partition import Partition
from fedray.data.partitioners.common import (
    GROUP_MODES,
    TAG_GROUPED_NATURAL,
    _assigned,
    _bad,
    _choice,
    _flag,
    _int,
    _names,
    _seed,
    canonical_order,
)
from fedray.data.partitioners.natural import owner_ids, owner_names

if TYPE_CHECKING:  # a Dataset (fedray.data.dataset) uses this module: its type only
    from fedray.data.dataset import Dataset


def group_sizes(owners: int, group_size: int, mode: str) -> np.ndarray:
    """How many natural ids each group gets, in group order (the ids left over by
    ``drop-remainder`` are in no group). Refusals name ``partitioner.group_size``."""
    g, u = group_size, owners
    groups, rest = divmod(u, g)
    if mode == "allow-smaller":
        if groups == 0:
            return np.array([u], dtype=np.int64)
        return np.array([g] * groups + ([rest] if rest else []), dtype=np.int64)
    if g > u:
        raise _bad("group_size", f"is larger than the {u} natural ids of the data set (only "
                   f"mode allow-smaller then makes one group of all)", g)
    if mode == "strict" and rest:
        raise _bad("group_size", f"does not divide the {u} natural ids (remainder {rest}), "
                   f"which mode strict requires", g)
    if mode == "allow-bigger":
        # np.array_split of the ids into u // g groups: the first u mod (u // g) one larger
        return np.full(groups, u // groups, dtype=np.int64) + (np.arange(groups) < u % groups)
    return np.full(groups, g, dtype=np.int64)  # strict, or drop-remainder's whole groups


def grouped_natural(dataset: Dataset, seed: int, group_size: int,
                    mode: str = "allow-smaller", shuffle: bool = False) -> Partition:
    """Clients of ``group_size`` natural ids each: an organisation of users rather than a
    user (cross-silo from cross-device data), keeping the source's own train/test split.

    The definition of flwr-datasets' GroupedNaturalIdPartitioner (adap/flower,
    datasets/flwr_datasets/partitioner/grouped_natural_id_partitioner.py): the U natural
    ids, in order, form groups of consecutive ids; ``mode`` says what happens when
    ``group_size`` g does not divide U:
    - ``allow-smaller`` (default): U // g groups of g and a last group of the U mod g ids
      left (if any); g > U gives one group of all;
    - ``allow-bigger``: U // g groups, sizes differing by at most one (np.array_split: the
      first U mod (U // g) groups one larger, so no group is smaller than g);
    - ``drop-remainder`` (flwr spells it ``drop-reminder``): U // g groups of g; the last
      U mod g ids, their train and test examples, are in no client
      (``info["dropped_owners"]``, ``["dropped_train_examples"]``,
      ``["dropped_test_examples"]``);
    - ``strict``: U // g groups of g, and a remainder is an error.
    Except in allow-smaller, g > U is an error.

    The ids' order is ``dataset.owners``' (every source sorts them as text: flwr's
    ``sort_unique_ids: true``; flwr's default, the order in which ids first appear, would
    depend on the order of the rows); with ``shuffle: true`` they are put in a random order
    drawn from ``rng(seed, TAG_GROUPED_NATURAL)`` first, so that a group's members are not
    neighbours in id order (an extension; flwr has no such option). Client j ("j") holds the
    train examples of its group's ids, and their test examples as its own test data, as
    ``natural`` does (no owners on the test split: the test split stays central); its
    examples are listed in canonical order. ``info["group_sizes"]`` gives the smallest and
    largest number of ids in a group.
    """
    seed = _seed(seed)
    g = _int("group_size", group_size, 1)
    mode = _choice("mode", mode, GROUP_MODES)
    mix = _flag("shuffle", shuffle)
    owners = owner_names(dataset, "grouped_natural")
    u = len(owners)
    sizes = group_sizes(u, g, mode)
    k = len(sizes)
    ids = rng(seed, TAG_GROUPED_NATURAL).permutation(u) if mix else np.arange(u)
    group_of = np.full(u, -1, dtype=np.int64)  # each natural id's group (-1: dropped)
    placed = int(sizes.sum())
    group_of[ids[:placed]] = np.repeat(np.arange(k), sizes)

    def by_group(split_name: str) -> tuple:
        split = getattr(dataset, split_name)
        owner = owner_ids(split, u, split_name, "grouped_natural")
        order = canonical_order(split)
        client = group_of[owner[order]]
        return _assigned(order, client, k), int((client < 0).sum())

    train, dropped_train = by_group("train")
    test, dropped_test = None, 0
    if dataset.test is not None and dataset.test.owner is not None:
        test, dropped_test = by_group("test")
    return Partition(_names(k), train, test,
                     info={"group_size": g, "mode": mode, "shuffle": mix, "owners": u,
                           "group_sizes": [int(sizes.min()), int(sizes.max())],
                           "dropped_owners": u - placed,
                           "dropped_train_examples": dropped_train,
                           "dropped_test_examples": dropped_test})
