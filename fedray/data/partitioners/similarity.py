"""similarity: SCAFFOLD's split, a share s of the examples i.i.d. and the rest sorted by
label."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fedray.core.seeding import rng
from fedray.data.partition import Partition
from fedray.data.partitioners.common import (
    TAG_SIMILARITY,
    _fraction,
    _names,
    _num_clients,
    _seed,
    _to_original,
    canonical_order,
)

if TYPE_CHECKING:  # a Dataset (fedray.data.dataset) uses this module: its type only
    from fedray.data.dataset import Dataset


def similarity(dataset: Dataset, seed: int, num_clients: int, similarity: float) -> Partition:
    """SCAFFOLD's similarity split (Karimireddy et al., Sec. 7): "each client gets s% i.i.d.
    data and the remaining (100 - s)% by sorting according to label".

    ``similarity`` is s as a fraction in [0, 1]. round(s * n) train examples, chosen at
    random, form the i.i.d. pool, which is shuffled and dealt into ``num_clients`` near-equal
    parts (the first ``a % K`` parts one larger); the other examples are sorted by label
    (then by canonical order) and cut into ``num_clients`` contiguous near-equal chunks (the
    last ``b % K`` chunks one larger, so every client gets at least one example); client k
    gets i.i.d. part k and sorted chunk k. Client sizes differ by at most one. s = 1 is an
    i.i.d. split, s = 0 gives each client a narrow band of labels. Every train example is
    assigned; the test split stays central.
    """
    seed = _seed(seed)
    n = len(dataset.train)
    k = _num_clients(num_clients, n)
    s = _fraction("similarity", similarity)
    order = canonical_order(dataset.train)  # canonical positions are sorted by label
    perm = rng(seed, TAG_SIMILARITY).permutation(n)
    n_iid = round(s * n)
    iid_parts = np.array_split(perm[:n_iid], k)
    rest = np.sort(perm[n_iid:])
    b = len(rest)
    sizes = np.full(k, b // k)
    sizes[k - b % k:] += 1  # empty slice when b % k == 0
    sorted_parts = np.split(rest, np.cumsum(sizes)[:-1])
    parts = [np.concatenate([p, q]) for p, q in zip(iid_parts, sorted_parts, strict=True)]
    return Partition(_names(k), _to_original(order, parts),
                     info={"iid_examples": int(n_iid), "sorted_examples": int(b)})
