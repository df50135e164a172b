"""shard: McMahan et al.'s pathological non-IID split -- sort by label, cut into equal
shards, give each client a few shards at random."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fedray.core.seeding import rng
from fedray.data.partition import Partition
from fedray.data.partitioners.common import (
    TAG_SHARD,
    _assigned,
    _bad,
    _int,
    _names,
    _num_clients,
    _seed,
    canonical_order,
)

if TYPE_CHECKING:  # a Dataset (fedray.data.dataset) uses this module: its type only
    from fedray.data.dataset import Dataset


def shard(dataset: Dataset, seed: int, num_clients: int, shards_per_client: int = 2
          ) -> Partition:
    """The pathological non-IID split of McMahan et al. 2017 ("Communication-Efficient
    Learning of Deep Networks from Decentralized Data", Sec. 3: MNIST sorted by digit
    label, cut into 200 shards of 300, two shards to each of 100 clients), for any K and S.

    Why it exists beside ``dirichlet``: it is the split FedAvg's own non-IID results use,
    and most clients hold one or two labels exactly, however many examples there are.

    With n train examples, K = ``num_clients`` and S = ``shards_per_client``: the examples
    in canonical order (by label, then by content: fedray's "sorted by label") are cut into
    K * S shards of n // (K * S) consecutive examples; the last n mod (K * S) examples (the
    end of the largest label) belong to no shard and to no client (``info["unassigned"]``).
    A permutation of the K * S shards drawn from ``rng(seed, TAG_SHARD)`` deals them out:
    client k gets shards perm[k * S], ..., perm[k * S + S - 1]. Every client has exactly
    S * (n // (K * S)) examples; a shard straddling two labels gives its client both. The
    test split stays central.
    """
    seed = _seed(seed)
    n = len(dataset.train)
    k = _num_clients(num_clients, n)
    s = _int("shards_per_client", shards_per_client, 1)
    total = k * s
    if total > n:
        raise _bad("shards_per_client", f"{k} clients x {s} shards = {total} shards, more "
                   f"than the {n} train examples: a shard needs >= 1 example", s)
    size = n // total
    order = canonical_order(dataset.train)  # canonical positions are sorted by label
    shard_client = np.empty(total, dtype=np.int64)
    shard_client[rng(seed, TAG_SHARD).permutation(total)] = np.arange(total) // s
    client = np.full(n, -1, dtype=np.int64)
    client[:total * size] = np.repeat(shard_client, size)
    return Partition(_names(k), _assigned(order, client, k),
                     info={"shard_size": size, "shards": total,
                           "unassigned": n - total * size})
