"""Client sampling: which virtual clients take part in a round.

Uniform without replacement within a round and independently across rounds (so with
replacement across rounds), from a stream seeded by (seed, round) alone: the same job
samples the same clients whatever the cluster looks like.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedray.seeding import TAG_FED_EVAL, TAG_SAMPLE, rng


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


def federated_eval_clients(seed: int, population: int, k: int) -> np.ndarray:
    """A fixed set of k clients whose held-out data is evaluated every eval round."""
    ids = rng(seed, TAG_FED_EVAL).choice(population, size=k, replace=False)
    return np.sort(ids).astype(np.int64)
