"""imbalance: exponential class imbalance per client, its ratio drawn from ``ratios``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from fedray.core.seeding import rng
from fedray.data.partition import Partition
from fedray.data.partitioners.common import (
    TAG_IMBALANCE,
    _names,
    _num_clients,
    _ratio_list,
    _seed,
    _to_original,
    canonical_order,
    largest_remainder,
)

if TYPE_CHECKING:  # a Dataset (fedray.data.dataset) uses this module: its type only
    from fedray.data.dataset import Dataset


def imbalance(
    dataset: Dataset,
    seed: int,
    num_clients: int,
    ratios: Sequence[float] = (1.0, 0.5, 0.1, 0.05, 0.01, 0.005, 0.001),
) -> Partition:
    """Exponential class imbalance per client (the Exp-alpha style split).

    Each client draws an imbalance ratio rho uniformly from ``ratios`` and a random order of
    the C classes present in the train split; the class in position c (c = 0..C-1) gets a
    share proportional to rho^(c / (C - 1)), so the first class is the client's majority and
    the last has rho times as many examples (rho = 1: balanced). The client's budget is
    B = n // num_clients examples, so n_max = B / sum_c rho^(c / (C - 1)) and its target class
    sizes n_c = n_max * rho^(c / (C - 1)) are rounded to integers summing to B (largest
    remainder). Clients are served in order 0..K-1 from one shared pool (each class's examples
    shuffled once), without replacement, so every example is used at most once.

    Drop rules: (1) a client whose target exceeds what is left of a class gets what is left,
    and the shortfall is not refilled from other classes (that would flatten the client's
    imbalance profile); (2) examples nobody takes are not assigned to any client:
    ``info["unassigned"]`` counts them (at least n - K * B). Exception to (1): a client left
    with no example at all takes one of the class with the most examples left (the pool never
    runs dry, since each earlier client took at most B), so every client has >= 1 example.
    ``info["client_ratios"]`` records each client's rho. The test split stays central.
    Static: a client keeps its ratio for the whole run; seed 003 re-draws clients and ratios
    every round (seed 003 line 136), which is the job key ``data.per_round.imbalance``
    (fedray.data.transforms.per_round).
    """
    seed = _seed(seed)
    n = len(dataset.train)
    k = _num_clients(num_clients, n)
    rhos = _ratio_list("ratios", ratios)
    order = canonical_order(dataset.train)
    y = np.asarray(dataset.train.y, dtype=np.int64)[order]
    g = rng(seed, TAG_IMBALANCE)
    classes = np.unique(y)
    c_count = len(classes)
    pools = [g.permutation(np.flatnonzero(y == c)) for c in classes]
    used = np.zeros(c_count, dtype=np.int64)
    left = np.array([len(p) for p in pools], dtype=np.int64)
    budget = n // k
    expo = np.arange(c_count) / (c_count - 1) if c_count > 1 else np.zeros(1)
    parts, client_ratios = [], []
    for _ in range(k):
        rho = rhos[int(g.integers(len(rhos)))]
        rank = g.permutation(c_count)  # rank[c]: position of class c in this client's order
        target = largest_remainder(rho ** expo[rank], budget)
        take = np.minimum(target, left)
        if take.sum() == 0:
            take[int(np.argmax(left))] = 1
        got = [pools[c][used[c] : used[c] + take[c]] for c in np.flatnonzero(take)]
        used += take
        left -= take
        parts.append(np.concatenate(got))
        client_ratios.append(rho)
    return Partition(
        _names(k),
        _to_original(order, parts),
        info={"unassigned": int(left.sum()), "budget": budget, "client_ratios": client_ratios},
    )
