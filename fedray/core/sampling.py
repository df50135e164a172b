"""Client sampling: which virtual clients take part in a round.

Uniform without replacement within a round and independently across rounds (so with
replacement across rounds), from a stream seeded by (seed, round) alone: the same job
samples the same clients whatever the cluster looks like.

Cross-device clients also vanish and straggle. ``select_round`` models both, still from
(seed, round, client) alone: a sampled client drops out with probability ``dropout``, and
with over-selection the server samples ``ceil(k * (1 + over_selection))`` clients (counted
exactly: ``over_selected``) and keeps the ``k`` survivors that would finish first. A
client's simulated finish time is its number of train examples times a log-normal speed
factor (sigma 1) of its own; the late ones are not trained at all, since a real server
would throw their work away.

A round costs O(k) whatever the population: numpy's ``Generator.choice`` without
replacement runs Floyd's algorithm (a hash set of about k) when k < population / 50, and
shuffles an arange of the population only when the population is at most 50 k (or 10,000);
example counts are asked of the source for the drawn ids alone (``sizes`` as a function of
ids).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from fedray.core.seeding import TAG_DROPOUT, TAG_FED_EVAL, TAG_SAMPLE, TAG_SPEED, rng


def poisson_clients(seed: int, round_idx: int, population: int, k: int) -> np.ndarray:
    """Poisson sampling: every client takes part independently with probability
    q = k / population, so a round has Binomial(population, q) clients, k on average.

    Drawn as the count, then that many distinct ids uniformly -- the same distribution as a
    coin per client, in O(count) rather than O(population) draws. User-level DP-FedAvg's
    accounting (McMahan et al. 2018) assumes this sampling: a client's presence in a round
    is independent of everyone else's."""
    g = rng(seed, TAG_SAMPLE, round_idx)
    count = int(g.binomial(population, k / population))
    return np.sort(g.choice(population, size=count, replace=False)).astype(np.int64)


def sample_clients(seed: int, round_idx: int, population: int, k: int,
                   always: Sequence[int] = ()) -> np.ndarray:
    """``k`` client indices for a round; the ``always`` clients are among them every round.

    Why ``always``: some experiments pin a client into every round (seed 001's toy keeps its
    outlier in every round and samples only the regular client). The other ``k - len(always)``
    are drawn uniformly from the rest; with no ``always`` the draw is exactly the plain one.
    """
    g = rng(seed, TAG_SAMPLE, round_idx)
    if not len(always):
        return np.sort(g.choice(population, size=k, replace=False)).astype(np.int64)
    pinned = np.unique(np.asarray(always, dtype=np.int64))
    # the i-th unpinned id, without materializing all of them (populations reach millions)
    x = g.choice(population - len(pinned), size=k - len(pinned), replace=False)
    drawn = x + np.searchsorted(pinned - np.arange(len(pinned)), x, side="right")
    return np.sort(np.concatenate([pinned, drawn])).astype(np.int64)


def over_selected(k: int, over_selection: float, population: int) -> int:
    """How many clients a round samples for ``k`` with over-selection ``o``: ``ceil(k * (1 +
    o))``, at most ``population`` (``k`` itself when ``o`` is 0). The one place that counts
    it: fedray.core.sampling and the simulated clock (fedray.timing.rounds) both ask here.

    Why not ``math.ceil(k * (1.0 + o))``: 0.1 is no double, and in floating point ``100 *
    1.1`` is 110.00000000000001, so k = 100, o = 0.1 sampled 111 clients, not the documented
    110 (one too many for 54 of the pairs k <= 1000, o in 0.1..0.9). Here ``o`` is taken as
    the decimal it stands for -- its value at 15 significant digits, as an exact Fraction --
    and the ceiling is integer arithmetic. 15 digits because that is what a double holds of
    any decimal (DBL_DIG): a value written with up to 15 significant digits (``0.1`` in a
    job file, a sweep's ``0.35``) comes back exactly as written, and the noise of float
    arithmetic (``0.1 + 0.2`` = 0.30000000000000004) is rounded away rather than costing a
    client. An infinite ``o`` samples the whole population."""
    if over_selection != over_selection or over_selection < 0:  # NaN or negative
        raise ValueError(f"over_selection must be >= 0, got {over_selection!r}")
    if not over_selection:
        return k
    if math.isinf(over_selection):
        return population
    o = Fraction(f"{float(over_selection):.15g}")
    n = k * (1 + o)
    return min(population, -(-n.numerator // n.denominator))  # the ceiling, exactly


@dataclass
class RoundSelection:
    participants: np.ndarray  # sorted ids that train this round
    sampled: int  # ids drawn (k, or more with over-selection)
    dropped_out: int  # sampled ids that dropped out
    late: int  # survivors beyond the first k to finish (over-selection), not trained


def select_round(seed: int, round_idx: int, population: int, k: int, *,
                 always: Sequence[int] = (), dropout: float = 0.0,
                 over_selection: float = 0.0,
                 sizes: np.ndarray | Callable[[np.ndarray], np.ndarray] | None = None,
                 mode: str = "fixed") -> RoundSelection:
    """The clients that train in a round, after dropout and over-selection; ``mode``
    ``poisson`` draws each client with probability k / population instead of exactly k.
    ``sizes`` (over-selection's work per client): every client's train count, or a
    function giving the counts of the ids it is passed (fedray.data.client_source.sizes_of)."""
    n = over_selected(k, over_selection, population)
    ids = (poisson_clients(seed, round_idx, population, k) if mode == "poisson" else
           sample_clients(seed, round_idx, population, n, always))
    return survivors(seed, round_idx, ids, k, dropout=dropout,
                     over_selection=over_selection, sizes=sizes)


def survivors(seed: int, round_idx: int, ids: np.ndarray, k: int, *, dropout: float = 0.0,
              over_selection: float = 0.0,
              sizes: np.ndarray | Callable[[np.ndarray], np.ndarray] | None = None
              ) -> RoundSelection:
    """Who of the invited ``ids`` (sorted) trains: those ``dropout`` leaves, then with
    over-selection the ``k`` that would finish first -- for any sample, a selector's
    (fedray.algorithms.selection) as well as the uniform one."""
    alive = stay(seed, round_idx, ids, dropout)
    late = 0
    if over_selection and len(alive) > k:  # poisson rounds may hold more than k
        speed = np.array([rng(seed, TAG_SPEED, round_idx, int(c)).lognormal(0.0, 1.0)
                          for c in alive])
        work = sizes(alive) if callable(sizes) else np.asarray(sizes)[alive]
        finish = np.asarray(work, dtype=np.float64) * speed
        late = len(alive) - k
        alive = np.sort(alive[np.argsort(finish, kind="stable")[:k]])
    return RoundSelection(alive, len(ids), len(ids) - len(alive) - late, late)


def stay(seed: int, round_idx: int, ids: np.ndarray, dropout: float) -> np.ndarray:
    """The ``ids`` that ``sampling.dropout`` leaves in round ``round_idx``: each drops out
    with probability ``dropout`` from its own (seed, round, client) draw, with or without
    the clock (fedray.timing.rounds)."""
    if dropout <= 0:
        return ids
    return ids[[rng(seed, TAG_DROPOUT, round_idx, int(c)).random() >= dropout for c in ids]]


def sorted_distinct(ids: Any) -> np.ndarray:
    """``ids`` as a sorted array of distinct int64 ids, without sorting ids that already are
    (a selector's known clients): what ``isin_sorted`` looks up in."""
    a = np.asarray(ids, dtype=np.int64).reshape(-1)
    if len(a) > 1 and not bool(np.all(a[1:] > a[:-1])):
        a = np.unique(a)
    return a


def isin_sorted(table: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Which ``values`` are in ``table`` (sorted, distinct), by bisection: O(len(values)
    log len(table)), with no sort or hash of the table (np.isin does one per call)."""
    values = np.asarray(values)
    if not len(table):
        return np.zeros(values.shape, dtype=bool)
    return table[np.minimum(np.searchsorted(table, values), len(table) - 1)] == values


def federated_eval_clients(seed: int, population: int, k: int) -> np.ndarray:
    """A fixed set of k clients whose held-out data is evaluated every eval round."""
    ids = rng(seed, TAG_FED_EVAL).choice(population, size=k, replace=False)
    return np.sort(ids).astype(np.int64)
