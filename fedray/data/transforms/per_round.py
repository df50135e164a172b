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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedray.core.seeding import rng
from fedray.data.partitioners.common import derangement, largest_remainder
from fedray.errors import key_error
from fedray.section import plain

# Stream tag of the per-round transforms: fixed forever (fedray.core.seeding's tags are
# 1..9, the partitioners' 101..106).
TAG_PER_ROUND = 201
_IMBALANCE, _LABEL_FLIP = 0, 1
POOLS = ("client", "all")


@dataclass(frozen=True)
class PerRound:
    """The parsed ``data.per_round`` section (see docs/config.md)."""

    ratios: tuple[float, ...] = ()  # imbalance: off when empty
    size: int | None = None  # imbalance: examples per client and round (None: its own count)
    pool: str = "client"  # imbalance: where the examples come from
    corruption: float = 0.0  # label_flip: off at 0
    flip_ratio: float = 1.0  # label_flip: share of classes flipped

    @property
    def active(self) -> bool:
        return bool(self.ratios) or self.corruption > 0

    @property
    def resamples(self) -> bool:
        return bool(self.ratios)


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
    corruption = float(flip.get("corruption", 0.0))
    if not 0.0 <= corruption <= 1.0:
        raise key_error(base + "label_flip.corruption", "must be in [0, 1]", corruption)
    flip_ratio = float(flip.get("flip_ratio", 1.0))
    if not 0.0 < flip_ratio <= 1.0:
        raise key_error(base + "label_flip.flip_ratio", "must be in (0, 1]", flip_ratio)
    out = PerRound(ratios, None if size is None else int(size), pool, corruption, flip_ratio)
    return out if out.active else None


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
) -> tuple[np.ndarray, float]:
    """Indices into the pool of the client's examples for the round (class by class, each
    class's in pool order) and the ratio drawn: the ``imbalance`` transform."""
    g = rng(seed, TAG_PER_ROUND, round_idx, client_id, _IMBALANCE)
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
) -> np.ndarray | None:
    """The client's label map for the round (``new = map[old]``), or None when it is not
    corrupted: the ``label_flip`` transform. Classes outside the flipped ones map to
    themselves."""
    g = rng(seed, TAG_PER_ROUND, round_idx, client_id, _LABEL_FLIP)
    if not g.random() < corruption or num_classes < 2:
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
) -> tuple[np.ndarray, np.ndarray, dict]:
    """The client's training data for round ``round_idx`` under ``spec``: a pure function of
    (seed, round, client_id), the client's own data (``x``, ``y``) and, with ``pool: all``,
    the pool (every client's training data in client-id order; ``x`` and ``y`` are then not
    read and may be None, with ``own_size`` or ``spec.size`` giving the size). Returns the new
    arrays (copies where anything changed) and what was drawn: ``{"ratio": rho}`` and/or
    ``{"flipped": True/False}``."""
    info: dict = {}
    if spec.resamples:
        px, py = pool if spec.pool == "all" and pool is not None else (x, y)
        size = (
            spec.size if spec.size is not None else (own_size if own_size is not None else len(y))
        )
        idx, rho = draw_imbalanced(
            seed, round_idx, client_id, np.asarray(py), num_classes, spec.ratios, size
        )
        x, y = px[idx], py[idx]
        info["ratio"] = rho
    if spec.corruption > 0:
        m = flip_map(seed, round_idx, client_id, num_classes, spec.corruption, spec.flip_ratio)
        info["flipped"] = m is not None
        if m is not None:
            y = m[np.asarray(y)]
    return x, y, info
