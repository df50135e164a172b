"""inner_dirichlet: clients of given sizes, each client's class mix ~ Dirichlet(alpha).

The split of pfl-research's CIFAR-10 benchmark (apple/pfl-research,
pfl/data/partition.py ``partition_by_dirichlet_class_distribution``, called from
benchmarks/dataset/cifar10/numpy.py ``make_federated_dataset`` with 50 examples per user
and alpha 0.1). Unlike ``dirichlet``, which splits each *class* among the clients, this
fixes each *client's* size and draws its class proportions: sizes are exact, and it is the
classes that run out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fedray.core.seeding import rng
from fedray.data.partition import Partition
from fedray.data.partitioners.common import (
    TAG_INNER_DIRICHLET,
    _bad,
    _int,
    _names,
    _num_clients,
    _positive,
    _seed,
    _to_original,
    canonical_order,
)

if TYPE_CHECKING:  # a Dataset (fedray.data.dataset) uses this module: its type only
    from fedray.data.dataset import Dataset


def _class_counts(size: int, p: np.ndarray, left: np.ndarray,
                  g: np.random.Generator) -> np.ndarray:
    """How many examples of each class one client of ``size`` takes, with proportions ``p``
    and ``left`` examples still unassigned per class (``left.sum() >= size``).

    Draws Multinomial(size, p restricted to the classes with examples left, renormalized);
    a class drawn more often than it has examples gives all it has, and the shortfall is
    drawn again the same way over the classes still left, until the client is full. This
    has the distribution of drawing the client's examples one at a time from p and
    rejecting a class that has run out (pfl-research's loop), at a few numpy calls per
    client instead of one per example. Proportions that are all 0 on the classes left
    (Dirichlet draws underflow for very small alpha) become uniform over those classes.
    """
    counts = np.zeros(len(p), dtype=np.int64)
    need = size
    while need > 0:
        open_ = left > counts
        q = np.where(open_, p, 0.0)
        total = q.sum()
        q = q / total if total > 0 else open_ / open_.sum()
        draw = g.multinomial(need, q)
        take = np.minimum(draw, left - counts)
        counts += take
        need -= int(take.sum())
    return counts


def inner_dirichlet(dataset: Dataset, seed: int, num_clients: int, alpha: float,
                    examples_per_client: int | None = None) -> Partition:
    """Clients of fixed sizes whose class proportions are drawn from Dirichlet(alpha).

    The split pfl-research uses for CIFAR-10 (Hsu et al. 2019's label skew, per client):
    small ``alpha`` gives each client one or two classes, large ``alpha`` approaches the
    overall class mix. Exact procedure, on the canonical order, with the stream
    ``rng(seed, TAG_INNER_DIRICHLET)``:

    1. sizes: ``examples_per_client`` for every client, or, when it is None, the n train
       examples divided equally (n // K each, the first n % K clients one more, so every
       example is assigned); K * examples_per_client must not exceed n;
    2. each class's examples are shuffled once (classes in increasing label order); "an
       example of class c, without replacement" is the next one of that queue;
    3. for each client k = 0..K-1 in turn: p_k ~ Dirichlet(alpha * 1_C) over the C classes
       of the train split, then its class counts ~ Multinomial(size_k, p_k), where a class
       that has run out is excluded and p_k renormalized over the classes left
       (``_class_counts``), and it takes that many examples from each class's queue.

    When a class runs out: pfl-research draws each example's class from p_k and, if that
    class is exhausted, draws again (pfl/data/partition.py); rejection sampling, so the
    class is drawn from p_k renormalized over the classes left, which is what fedray
    draws. pfl-research also adds 0.02 to every class's probability (and renormalizes)
    after each size * 20 draws of one client, so that a client whose remaining mass is tiny
    still finishes; fedray does not (its draw over the renormalized classes always
    finishes), so the clients built last, when few classes are left, can differ in
    distribution from pfl-research's. Either way the last clients get the classes the
    earlier ones left, and so are more alike than the first ones.

    No example goes to two clients; with ``examples_per_client`` set, n - K * size train
    examples stay unassigned (``info["unassigned"]``). The test split stays central.
    """
    seed = _seed(seed)
    n = len(dataset.train)
    k = _num_clients(num_clients, n)
    a = _positive("alpha", alpha)
    if examples_per_client is None:
        sizes = np.full(k, n // k, dtype=np.int64)
        sizes[:n % k] += 1
    else:
        m = _int("examples_per_client", examples_per_client, 1)
        if k * m > n:
            raise _bad("examples_per_client", f"{k} clients x {m} examples > {n} train "
                       f"examples", examples_per_client)
        sizes = np.full(k, m, dtype=np.int64)
    order = canonical_order(dataset.train)
    y = np.asarray(dataset.train.y, dtype=np.int64)[order]
    g = rng(seed, TAG_INNER_DIRICHLET)
    classes = np.unique(y)
    queues = [g.permutation(np.flatnonzero(y == c)) for c in classes]
    left = np.array([len(q) for q in queues], dtype=np.int64)
    used = np.zeros(len(classes), dtype=np.int64)
    concentration = np.full(len(classes), a)
    parts: list[np.ndarray] = []
    for size in sizes:
        counts = _class_counts(int(size), g.dirichlet(concentration), left - used, g)
        parts.append(np.concatenate([queues[c][used[c]:used[c] + counts[c]]
                                     for c in np.flatnonzero(counts)]))
        used += counts
    train = _to_original(order, parts)
    return Partition(_names(k), train, info={"unassigned": int(n - sizes.sum()),
                                              "min_size": int(sizes.min()),
                                              "max_size": int(sizes.max())})
