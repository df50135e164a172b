"""iid: a uniform random split into near-equal clients."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fedray.core.seeding import rng
from fedray.data.partition import Partition
from fedray.data.partitioners.common import (
    TAG_IID,
    _assigned,
    _names,
    _num_clients,
    _seed,
    canonical_order,
)

if TYPE_CHECKING:  # a Dataset (fedray.data.dataset) uses this module: its type only
    from fedray.data.dataset import Dataset


def iid(dataset: Dataset, seed: int, num_clients: int) -> Partition:
    """An i.i.d. split: shuffle the train examples and cut them into ``num_clients`` parts.

    Sizes differ by at most one (the first ``n % num_clients`` clients get the extra one).
    Every train example goes to exactly one client; the test split stays central.
    """
    seed = _seed(seed)
    n = len(dataset.train)
    k = _num_clients(num_clients, n)
    order = canonical_order(dataset.train)
    perm = rng(seed, TAG_IID).permutation(n)
    client = np.empty(n, dtype=np.int64)  # the parts of np.array_split(perm, k)
    client[perm] = np.repeat(np.arange(k), np.full(k, n // k) + (np.arange(k) < n % k))
    return Partition(_names(k), _assigned(order, client, k))
