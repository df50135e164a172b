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
    _assigned,
    _bad,
    _int,
    _names,
    _num_clients,
    _positive,
    _seed,
    canonical_order,
)

if TYPE_CHECKING:  # a Dataset (fedray.data.dataset) uses this module: its type only
    from fedray.data.dataset import Dataset


# Clients whose multinomial draws are made at once, per numpy call: any value gives the same
# partition (the draws of a window are consumed in client order from its own stream).
_BLOCK = 4096

_WINDOW = 1  # sub-stream keys under TAG_INNER_DIRICHLET: a window's first draws,
_REDRAW = 2  # and a client's redraws of the examples a class it drew could not give


def _class_counts(size: int, p: np.ndarray, left: np.ndarray,
                  g: np.random.Generator, draw: np.ndarray | None = None) -> np.ndarray:
    """How many examples of each class one client of ``size`` takes, with proportions ``p``
    and ``left`` examples still unassigned per class (``left.sum() >= size``).

    Draws Multinomial(size, p restricted to the classes with examples left, renormalized);
    a class drawn more often than it has examples gives all it has, and the shortfall is
    drawn again the same way over the classes still left, until the client is full. This
    has the distribution of drawing the client's examples one at a time from p and
    rejecting a class that has run out (pfl-research's loop), at a few numpy calls per
    client instead of one per example. Proportions that are all 0 on the classes left
    (Dirichlet draws underflow for very small alpha) become uniform over those classes.

    ``draw``: the first Multinomial(size, .) draw, already made over p renormalized on a
    superset of the classes left (or uniform on it where p is 0 there); the same
    distribution, as rejecting a class with nothing left is what the truncation does.
    """
    counts = np.zeros(len(p), dtype=np.int64)
    need = size
    while need > 0:
        if draw is None:
            open_ = left > counts
            q = np.where(open_, p, 0.0)
            total = q.sum()
            q = q / total if total > 0 else open_ / open_.sum()
            draw = g.multinomial(need, q)
        take = np.minimum(draw, left - counts)
        counts += take
        need -= int(take.sum())
        draw = None
    return counts


def _first_draws(p: np.ndarray, sizes: np.ndarray, g: np.random.Generator) -> np.ndarray:
    """Multinomial(size_i, p_i renormalized) for each row (uniform where a row is all 0),
    drawn row after row from ``g``: a row's draw does not depend on the rows beside it."""
    total = np.zeros(len(p))
    for c in range(p.shape[1]):  # column by column: the same sums whatever the block
        total += p[:, c]
    zero = total == 0
    q = np.where(zero[:, None], 1.0, p) / np.where(zero, p.shape[1], total)[:, None]
    return g.multinomial(sizes, q)


def _all_counts(seed: int, p: np.ndarray, sizes: np.ndarray, left: np.ndarray) -> np.ndarray:
    """Every client's class counts ([K, C]), as ``_class_counts`` client after client would
    give them, in O(K + C * _BLOCK) rows of numpy work instead of K Python iterations.

    A window starts at client r = 0 and after each client where a class ran short: its
    classes S are those with examples left, and each client i >= r gets a first draw
    Multinomial(size_i, p_i renormalized on S) from the stream rng(seed, TAG, _WINDOW, r),
    row after row (``_BLOCK`` rows per numpy call, which changes nothing). While the
    cumulative draws fit every class's supply they are the clients' counts (a class of S
    that ran out exactly is drawn 0 times by a client that fits, and a multinomial given
    0 in a cell is the multinomial over the other cells renormalized). The first client j
    that asks a class for more than it has finishes with ``_class_counts`` from that draw
    (redraws from rng(seed, TAG, _REDRAW, j)), and a new window starts at j + 1: a class
    of S ran out there, so there are at most C windows. The draws of a window past j are
    not used.
    """
    k, classes = p.shape
    dtype = np.int32 if int(left.sum()) < 2 ** 31 else np.int64
    counts = np.zeros((k, classes), dtype=dtype)
    left = left.astype(np.int64)
    r = 0
    while r < k:
        s = np.flatnonzero(left > 0)
        g = rng(seed, TAG_INNER_DIRICHLET, _WINDOW, r)
        i = r
        while i < k:
            end = min(i + _BLOCK, k)
            draw = _first_draws(p[i:end][:, s], sizes[i:end], g)
            cum = np.cumsum(draw, axis=0)
            over = np.flatnonzero((cum > left[s]).any(axis=1))
            fit = int(over[0]) if len(over) else end - i
            counts[i:i + fit, s] = draw[:fit]
            if fit:
                left[s] -= cum[fit - 1]
            if fit < end - i:
                break
            i = end
        else:
            return counts
        j = i + fit
        first = np.zeros(classes, dtype=np.int64)
        first[s] = draw[fit]
        c = _class_counts(int(sizes[j]), p[j], left,
                          rng(seed, TAG_INNER_DIRICHLET, _REDRAW, j), draw=first)
        counts[j] = c
        left -= c
        r = j + 1
    return counts


def inner_dirichlet(dataset: Dataset, seed: int, num_clients: int, alpha: float,
                    examples_per_client: int | None = None) -> Partition:
    """Clients of fixed sizes whose class proportions are drawn from Dirichlet(alpha).

    The split pfl-research uses for CIFAR-10 (Hsu et al. 2019's label skew, per client):
    small ``alpha`` gives each client one or two classes, large ``alpha`` approaches the
    overall class mix. Exact procedure, on the canonical order (the queues and every p_k
    from the stream ``rng(seed, TAG_INNER_DIRICHLET)``, the multinomial draws from the
    sub-streams ``_all_counts`` describes):

    1. sizes: ``examples_per_client`` for every client, or, when it is None, the n train
       examples divided equally (n // K each, the first n % K clients one more, so every
       example is assigned); K * examples_per_client must not exceed n;
    2. each class's examples are shuffled once (classes in increasing label order); "an
       example of class c, without replacement" is the next one of that queue;
    3. for each client k = 0..K-1 in turn: p_k ~ Dirichlet(alpha * 1_C) over the C classes
       of the train split, then its class counts ~ Multinomial(size_k, p_k), where a class
       that has run out is excluded and p_k renormalized over the classes left
       (``_class_counts``), and it takes that many examples from each class's queue.
       All the p_k are drawn at once (one [K, C] draw) and the counts of the clients
       between two that find a class short in one vectorized pass (``_all_counts``): the
       same distribution, with no Python loop over the clients.

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
    p = g.dirichlet(np.full(len(classes), a), size=k)
    counts = _all_counts(seed, p, sizes, np.array([len(q) for q in queues], dtype=np.int64))
    del p
    # the first sum_k counts[k, c] examples of class c's queue go to the clients in order
    client = np.full(n, -1, dtype=np.int64)
    ids = np.arange(k, dtype=np.int64)
    for c, queue in enumerate(queues):
        column = counts[:, c]
        client[queue[:int(column.sum())]] = np.repeat(ids, column)
    return Partition(_names(k), _assigned(order, client, k),
                     info={"unassigned": int(n - sizes.sum()),
                           "min_size": int(sizes.min()), "max_size": int(sizes.max())})
