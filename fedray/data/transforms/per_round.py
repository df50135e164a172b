"""Per-round client data (``data.per_round``): a client's training examples re-drawn, or
its labels corrupted, afresh in every round.

Why: some protocols do not have a fixed population of clients with fixed data. Seed 003
(Exp-alpha) creates the round's clients anew at the start of every round, each with its own
freshly drawn class imbalance or label corruption; a static partition store cannot express
that. Here the worker applies the job's transforms to a client's training data when it loads
it for a round, so the data a client trains on in round r is a pure function of
(seed, r, client_id) and of the store: it does not depend on the number of workers, on which
worker trains the client, on the other clients of the round or on the order in which they
are trained. The sequential and the vectorized kernels both train on the transformed data
(the worker prepares a client's round the same way for both). The runtime applies the
transforms without knowing any algorithm; an aggregator that measures a client's data (Exp-
alpha's risks) measures the round's transformed data.

Two transforms, applied in this order when switched on:

1. ``imbalance`` (``ratios`` non-empty): the client's examples for the round are drawn,
   without replacement, from a pool -- its own training examples (``pool: client``) or the
   union of every client's training examples in client-id order (``pool: all``: a client is
   then a fresh sample of the whole training set each round, independent of the other
   clients of the round, so two clients may share examples). A ratio rho is drawn uniformly
   from ``ratios`` and a random order of the C classes; the class in position c gets a share
   proportional to rho^(c / (C - 1)) of ``size`` examples (largest remainder), so the
   smallest class has rho times the largest (rho = 1: class-balanced). A class with fewer
   examples in the pool than its share gives what it has; the shortfall is not refilled
   (refilling would flatten the profile), as the static ``imbalance`` partitioner does.
2. ``label_flip`` (``corruption`` > 0): with probability ``corruption`` the client is
   corrupted for the round: round(flip_ratio * C) classes, chosen at random, are relabelled
   through a random derangement of the classes (class c -> perm[c] != c), so every example
   of a flipped class carries a wrong label; the other classes keep theirs.

Each transform draws from its own stream ``rng(seed, TAG_PER_ROUND, round, client_id, k)``
(k = 0 for imbalance, 1 for label_flip), so switching one on does not change the other's
draws. The central test set and the clients' held-out data are never transformed.

Fixed compositions. Seed 003's controlled experiments (Fig. 2, Tables 8-9) do not draw each
client's condition independently: every round has exactly four balanced clients and six at
ratio 0.1, or exactly four of six clients corrupted. ``imbalance.composition`` (one ratio
per client of the round) and ``label_flip.corrupted`` (how many of the round's clients are
corrupted) say so. The round's invited clients, sorted by id, take the places 0..n-1 (their
*rank*); a permutation of the places drawn from ``rng(seed, TAG_PER_ROUND_COHORT, round,
k)`` -- the round alone, not a client -- deals the conditions to them, so which client gets
which is random, and how many get each is exact. The cohort is itself a function of
(seed, round) (fixed sampling), so a client's data still do not depend on the worker count,
on placement or on training order; the driver sends each client's rank with its task.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedray.core.seeding import rng
from fedray.data.partitioners.common import derangement, largest_remainder
from fedray.errors import key_error
from fedray.section import plain

# Stream tags of the per-round transforms: fixed forever (fedray.core.seeding's tags are
# 1..23, the partitioners' 101..111, data.per_client's 202). 203: the deal of a fixed
# composition's places, per round.
TAG_PER_ROUND = 201
TAG_PER_ROUND_COHORT = 203
_IMBALANCE, _LABEL_FLIP = 0, 1
POOLS = ("client", "all")


@dataclass(frozen=True)
class PerRound:
    """The parsed ``data.per_round`` section (see docs/config.md)."""

    ratios: tuple[float, ...] = ()  # imbalance: off when empty (and no composition)
    size: int | None = None  # imbalance: examples per client and round (None: its own count)
    pool: str = "client"  # imbalance: where the examples come from
    corruption: float = 0.0  # label_flip: off at 0 (and no corrupted count)
    flip_ratio: float = 1.0  # label_flip: share of classes flipped
    composition: tuple[float, ...] = ()  # imbalance: one ratio per client of the round
    corrupted: int | None = None  # label_flip: exactly this many of the round's clients

    @property
    def active(self) -> bool:
        return self.resamples or self.flips

    @property
    def resamples(self) -> bool:
        return bool(self.ratios) or bool(self.composition)

    @property
    def flips(self) -> bool:
        return self.corruption > 0 or self.corrupted is not None

    @property
    def ranked(self) -> bool:
        """A fixed composition: a client's condition depends on its rank in the round."""
        return bool(self.composition) or self.corrupted is not None

    def check_cohort(self, n: int, where: str) -> None:
        """A fixed composition needs rounds of exactly ``n`` = len(composition) clients
        (and at least ``corrupted``): refused in one line otherwise. ``where`` says where
        ``n`` comes from."""
        base = "data.per_round."
        if self.composition and len(self.composition) != n:
            raise key_error(base + "imbalance.composition",
                            f"has {len(self.composition)} ratios, one per client of a round; "
                            f"{where} {n}", list(self.composition))
        if self.corrupted is not None and self.corrupted > n:
            raise key_error(base + "label_flip.corrupted",
                            f"must be <= the clients of a round: {where} {n}", self.corrupted)


def parse_per_round(section: Any) -> PerRound | None:
    """``data.per_round`` checked and parsed, or None when no transform is switched on.
    Every impossible value is one line naming its key."""
    if section is None:
        return None
    section = plain(section)  # typed, an omegaconf node or a dict
    imb, flip = section.get("imbalance") or {}, section.get("label_flip") or {}
    base = "data.per_round."
    ratios = tuple(float(r) for r in (imb.get("ratios") or ()))
    for r in ratios:
        if not 0.0 < r <= 1.0:
            raise key_error(
                base + "imbalance.ratios", "every ratio must be in (0, 1]", list(ratios)
            )
    size = imb.get("size")
    if size is not None and int(size) < 1:
        raise key_error(
            base + "imbalance.size",
            "must be >= 1 or null (the client's own number of examples)",
            size,
        )
    pool = imb.get("pool", "client")
    if pool not in POOLS:
        raise key_error(base + "imbalance.pool", "must be client or all", pool)
    composition = tuple(float(r) for r in (imb.get("composition") or ()))
    for r in composition:
        if not 0.0 < r <= 1.0:
            raise key_error(base + "imbalance.composition", "every ratio must be in (0, 1]",
                            list(composition))
    if composition and ratios:
        raise key_error(base + "imbalance.composition", "cannot be combined with "
                        "data.per_round.imbalance.ratios (a fixed composition of the round, "
                        "or a ratio drawn per client: one of them)", list(composition))
    corruption = float(flip.get("corruption", 0.0))
    if not 0.0 <= corruption <= 1.0:
        raise key_error(base + "label_flip.corruption", "must be in [0, 1]", corruption)
    flip_ratio = float(flip.get("flip_ratio", 1.0))
    if not 0.0 < flip_ratio <= 1.0:
        raise key_error(base + "label_flip.flip_ratio", "must be in (0, 1]", flip_ratio)
    corrupted = flip.get("corrupted")
    if corrupted is not None:
        try:  # a dict passed to fedray.run is not typed by the config schema
            whole = (not isinstance(corrupted, bool) and int(corrupted) == corrupted
                     and corrupted >= 0)
        except (TypeError, ValueError):
            whole = False
        if not whole:
            raise key_error(base + "label_flip.corrupted",
                            "must be a whole number >= 0 or null", corrupted)
        if corruption > 0:
            raise key_error(base + "label_flip.corrupted", "cannot be combined with "
                            "data.per_round.label_flip.corruption (an exact count per round, "
                            "or a chance per client: one of them)", corrupted)
        corrupted = int(corrupted)
    out = PerRound(ratios, None if size is None else int(size), pool, corruption, flip_ratio,
                   composition, corrupted)
    return out if out.active else None


# what the transforms drew for a client (apply_per_round's info), as the round's
# participants table names the columns (fedray.runtime.participation.row_columns)
COLUMNS = {"ratio": "imbalance_ratio", "flipped": "label_flipped"}


def drawn_columns(spec: PerRound | None) -> tuple[str, ...]:
    """The participants-table columns ``spec``'s draws fill (none without per_round)."""
    if spec is None:
        return ()
    return tuple(COLUMNS[k] for k, on in (("ratio", spec.resamples), ("flipped", spec.flips))
                 if on)


@functools.lru_cache(maxsize=4)
def cohort_places(seed: int, round_idx: int, n: int, k: int) -> np.ndarray:
    """The deal of a fixed composition: ``places[rank]`` is the place (index into the
    composition; for label flips, corrupted while < ``corrupted``) of the round's client of
    that rank among the ``n`` invited. One permutation per (seed, round, transform k),
    cached: every client of a round asks for the same one, and a permutation of n for each
    of n clients would be quadratic in the round's size (read-only, as it is shared)."""
    places = rng(seed, TAG_PER_ROUND_COHORT, round_idx, k).permutation(n)
    places.flags.writeable = False
    return places


def class_profile(rho: float, rank: np.ndarray, total: int) -> np.ndarray:
    """Class sizes summing to ``total``, the class in position ``rank[c]`` getting a share
    proportional to rho^(rank[c] / (C - 1)) (largest remainder; ties: lower class first)."""
    c_count = len(rank)
    expo = rank / (c_count - 1) if c_count > 1 else np.zeros(c_count)
    return largest_remainder(float(rho) ** expo, total)


def draw_imbalanced(
    seed: int,
    round_idx: int,
    client_id: int,
    pool_y: np.ndarray,
    num_classes: int,
    ratios: Sequence[float],
    size: int,
    rho: float | None = None,
) -> tuple[np.ndarray, float]:
    """Indices into the pool of the client's examples for the round (class by class, each
    class's in pool order) and the ratio drawn: the ``imbalance`` transform. ``rho``: the
    client's ratio fixed by a composition (nothing drawn for it), else drawn from ``ratios``."""
    g = rng(seed, TAG_PER_ROUND, round_idx, client_id, _IMBALANCE)
    if rho is None:
        rho = float(ratios[int(g.integers(len(ratios)))])
    rank = g.permutation(num_classes)
    target = class_profile(rho, rank, size)
    parts = []
    for c in range(num_classes):
        have = np.flatnonzero(pool_y == c)
        take = min(int(target[c]), len(have))
        if take:
            parts.append(np.sort(g.choice(have, size=take, replace=False)))
    idx = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return idx.astype(np.int64), rho


def flip_map(
    seed: int,
    round_idx: int,
    client_id: int,
    num_classes: int,
    corruption: float,
    flip_ratio: float,
    chosen: bool | None = None,
) -> np.ndarray | None:
    """The client's label map for the round (``new = map[old]``), or None when it is not
    corrupted: the ``label_flip`` transform. Classes outside the flipped ones map to
    themselves. ``chosen``: whether a fixed count made the client corrupted (the chance is
    then not read; its draw is still taken, so a corrupted client's classes and derangement
    are the same whichever way it was chosen)."""
    g = rng(seed, TAG_PER_ROUND, round_idx, client_id, _LABEL_FLIP)
    coin = g.random() < corruption
    if not (coin if chosen is None else chosen) or num_classes < 2:
        return None
    k = max(1, round(flip_ratio * num_classes))
    perm = derangement(num_classes, g)
    flipped = g.choice(num_classes, size=k, replace=False)
    out = np.arange(num_classes)
    out[flipped] = perm[flipped]
    return out


def apply_per_round(
    spec: PerRound,
    seed: int,
    round_idx: int,
    client_id: int,
    x: np.ndarray | None,
    y: np.ndarray | None,
    num_classes: int,
    pool: tuple[np.ndarray, np.ndarray] | None = None,
    own_size: int | None = None,
    rank: tuple[int, int] | None = None,
) -> tuple[np.ndarray, np.ndarray, dict]:
    """The client's training data for round ``round_idx`` under ``spec``: a pure function of
    (seed, round, client_id), the client's own data (``x``, ``y``) and, with ``pool: all``,
    the pool (every client's training data in client-id order; ``x`` and ``y`` are then not
    read and may be None, with ``own_size`` or ``spec.size`` giving the size). ``rank``:
    (the client's rank among the round's invited clients, how many were invited), which a
    fixed composition (``spec.ranked``) needs. Returns the new arrays (copies where anything
    changed) and what was drawn: ``{"ratio": rho}`` and/or ``{"flipped": True/False}``."""
    info: dict = {}
    if spec.ranked:
        if rank is None:
            raise ValueError("a fixed composition (data.per_round) needs the client's rank "
                             "in the round")
        spec.check_cohort(rank[1], "this round invited")
    if spec.resamples:
        px, py = pool if spec.pool == "all" and pool is not None else (x, y)
        size = (
            spec.size if spec.size is not None else (own_size if own_size is not None else len(y))
        )
        fixed = (spec.composition[cohort_places(seed, round_idx, rank[1], _IMBALANCE)[rank[0]]]
                 if spec.composition else None)
        idx, rho = draw_imbalanced(
            seed, round_idx, client_id, np.asarray(py), num_classes, spec.ratios, size, fixed
        )
        x, y = px[idx], py[idx]
        info["ratio"] = rho
    if spec.flips:
        chosen = (bool(cohort_places(seed, round_idx, rank[1], _LABEL_FLIP)[rank[0]]
                       < spec.corrupted) if spec.corrupted is not None else None)
        m = flip_map(seed, round_idx, client_id, num_classes, spec.corruption, spec.flip_ratio,
                     chosen)
        info["flipped"] = m is not None
        if m is not None:
            y = m[np.asarray(y)]
    return x, y, info
