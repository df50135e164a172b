"""Client sampling: which virtual clients take part in a round.

Uniform without replacement within a round and independently across rounds (so with
replacement across rounds), from a stream seeded by (seed, round) alone: the same job
samples the same clients whatever the cluster looks like.
"""

from __future__ import annotations

import numpy as np

from fedray.seeding import TAG_FED_EVAL, TAG_SAMPLE, rng


def sample_clients(seed: int, round_idx: int, population: int, k: int) -> np.ndarray:
    ids = rng(seed, TAG_SAMPLE, round_idx).choice(population, size=k, replace=False)
    return np.sort(ids).astype(np.int64)


def federated_eval_clients(seed: int, population: int, k: int) -> np.ndarray:
    """A fixed set of k clients whose held-out data is evaluated every eval round."""
    ids = rng(seed, TAG_FED_EVAL).choice(population, size=k, replace=False)
    return np.sort(ids).astype(np.int64)
