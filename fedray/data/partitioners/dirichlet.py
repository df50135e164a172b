"""dirichlet: label shares per client from Dir(alpha), client sizes log-normal (sigma)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fedray.core.seeding import rng
from fedray.data.partition import Partition
from fedray.data.partitioners.common import (
    DIRICHLET_MAX_ATTEMPTS,
    TAG_DIRICHLET,
    _assigned,
    _bad,
    _int,
    _names,
    _num_clients,
    _number,
    _positive,
    _seed,
    canonical_order,
)

if TYPE_CHECKING:  # a Dataset (fedray.data.dataset) uses this module: its type only
    from fedray.data.dataset import Dataset


def _top_up(client: np.ndarray, k: int, min_examples: int) -> int:
    """Give every client ``min_examples`` by moving examples from the largest clients.

    Clients short of the minimum, in id order, take examples from the largest clients (in
    decreasing size, ties by id), each donor keeping at least the minimum; a donor gives its
    examples that come last in canonical order. Returns how many examples moved.
    """
    counts = np.bincount(client, minlength=k)
    short = np.flatnonzero(counts < min_examples)
    need = int((min_examples - counts[short]).sum())
    if need == 0:
        return 0
    donors = np.lexsort((np.arange(k), -counts))  # largest first, ties by id
    spare = np.maximum(counts[donors] - min_examples, 0)
    before = np.cumsum(spare) - spare  # what the donors ahead of each one gave
    take = np.clip(need - before, 0, spare)  # all of its spare until the need is met
    donors, take = donors[take > 0], take[take > 0]
    # each donor's last ``take`` positions, donor after donor: one pass over every client's
    # positions (stable: ascending within a client), not one per donor
    srt = np.argsort(client, kind="stable")
    end = np.cumsum(counts)[donors]
    first = np.repeat(end - take - (np.cumsum(take) - take), take)
    pool = srt[first + np.arange(int(take.sum()))]
    receivers = np.repeat(short, min_examples - counts[short])
    client[pool] = receivers
    return need


def _dirichlet_positions(y: np.ndarray, k: int, alpha: float, sigma: float, min_examples: int,
                         g: np.random.Generator) -> tuple[np.ndarray, int, int]:
    """The label-Dirichlet split of labels ``y`` (canonical order).

    Returns each position's client, the draws used and how many examples were moved to
    top up short clients."""
    n = len(y)
    classes = np.unique(y)
    members = [np.flatnonzero(y == c) for c in classes]
    for attempt in range(1, DIRICHLET_MAX_ATTEMPTS + 1):
        if sigma > 0:
            target = g.lognormal(0.0, sigma, size=k)
            target *= n / target.sum()
        else:
            target = np.full(k, n / k)
        client = np.empty(n, dtype=np.int64)
        for pos in members:
            w = g.dirichlet(np.full(k, alpha)) * target
            if not (np.isfinite(w).all() and w.sum() > 0):
                w = target.copy()
            cuts = np.floor(np.cumsum(w / w.sum())[:-1] * len(pos)).astype(np.int64)
            cuts = np.clip(cuts, 0, len(pos))
            counts = np.diff(np.concatenate([[0], cuts, [len(pos)]]))
            client[g.permutation(pos)] = np.repeat(np.arange(k), counts)
        if np.bincount(client, minlength=k).min() >= min_examples:
            return client, attempt, 0
    moved = _top_up(client, k, min_examples)
    return client, DIRICHLET_MAX_ATTEMPTS, moved


def dirichlet(dataset: Dataset, seed: int, num_clients: int, alpha: float, sigma: float = 0.0,
              min_examples: int = 1) -> Partition:
    """Label-Dirichlet split (Hsu et al., "Measuring the Effects of Non-Identical Data
    Distribution for Federated Visual Classification"; the common "label Dirichlet" split).

    "For each class, split that class's examples among clients with proportions drawn from
    Dirichlet(alpha)": small ``alpha`` gives each client few classes, large ``alpha``
    approaches an i.i.d. split. Exact procedure, on the canonical order, with the stream
    ``rng(seed, TAG_DIRICHLET)``:

    1. target sizes t_k: with ``sigma > 0``, t_k ~ LogNormal(0, sigma) for k = 1..K, scaled
       to sum to n (the number of train examples); with ``sigma == 0``, t_k = n / K (no draw);
    2. for each class c in increasing label order: p ~ Dirichlet(alpha * 1_K), weights
       w_k = p_k * t_k / sum_j p_j t_j, the class's examples are shuffled and cut at
       floor(cumsum(w) * n_c), client k getting the k-th piece (so client sizes follow the
       targets in expectation, and sigma > 0 makes them unbalanced);
    3. if some client has fewer than ``min_examples`` examples, steps 1-2 are redone with the
       next draws of the same stream, at most DIRICHLET_MAX_ATTEMPTS (10) times in all;
    4. if the last draw still leaves clients short (likely with very many small clients, e.g.
       100,000 clients of ~5 examples), they are topped up: each short client, in id order,
       takes examples from the largest clients (largest first, each keeping at least
       ``min_examples``). ``info["topped_up_examples"]`` records how many moved (0 when a
       draw succeeded).

    Every train example goes to exactly one client. The test split stays central
    (``Partition.test`` is None). ``info["attempts"]`` records the attempt used.
    """
    seed = _seed(seed)
    n = len(dataset.train)
    k = _num_clients(num_clients, n)
    a = _positive("alpha", alpha)
    s = _number("sigma", sigma)
    if s < 0:
        raise _bad("sigma", "must be >= 0", sigma)
    m = _int("min_examples", min_examples, 0)
    if m * k > n:
        raise _bad("min_examples", f"cannot give every client {m} examples: {k} clients x {m} "
                   f"> {n} train examples", m)
    order = canonical_order(dataset.train)
    y = np.asarray(dataset.train.y, dtype=np.int64)[order]
    client, attempts, moved = _dirichlet_positions(y, k, a, s, m, rng(seed, TAG_DIRICHLET))
    train = _assigned(order, client, k)
    sizes = train.counts
    return Partition(_names(k), train,
                     info={"attempts": attempts, "topped_up_examples": moved,
                           "min_size": int(sizes.min()), "max_size": int(sizes.max())})
