"""Derivation of every random stream from (seed, round, client_id).

Rule 3 of the architecture: a client's batch order, dropout masks and augmentation depend
only on the job seed, the round and the client id, never on which worker trains it or in
which order. numpy's SeedSequence mixes the tuple into well-separated 64-bit seeds, and a tag
keeps streams that share a (seed, round) apart (sampling vs. training vs. evaluation).
"""

from __future__ import annotations

import numpy as np

# Stream tags: fixed forever, changing one changes every result that uses it.
TAG_TRAIN = 1
TAG_SAMPLE = 2
TAG_FED_EVAL = 3
TAG_INIT = 4
TAG_HOLDOUT = 5  # Elastic's held-out subset B_k, per (seed, client id): fixed for the run
TAG_CONTROL = 6  # SCAFFOLD option I's extra gradient pass, from a client's round seed
TAG_TEST_HOLDOUT = 7  # a recipe's central test set carved out of a train-only source
TAG_DROPOUT = 8  # whether a sampled client drops out of a round, per (round, client)
TAG_SPEED = 9  # a sampled client's simulated speed in a round (over-selection), per client
TAG_PERSONALIZE = 10  # an evaluated client's fine-tuning (eval.personalize), per round
# the timing model's streams (fedray.timing.streams hashes client ids under one key each)
TAG_DEVICE = 11  # a client's device profile, per (seed, client id): fixed for the run
TAG_AVAILABILITY = 12  # a client's diurnal phase, and its jitter per (client id, period)
TAG_ONLINE_SAMPLE = 13  # the candidates drawn to find k online clients, per (seed, draw)
TAG_BUFFERED = 14  # buffered asynchronous training's one stream of candidate clients
# update stages (fedray.algorithms.base.UpdateStage)
TAG_DP_NOISE = 15  # central DP's noise on the round's sum, per (seed, round)
TAG_DP_LOCAL = 16  # local DP's noise on a client's update, from its round seed
TAG_QUANTIZE = 17  # stochastic rounding of a client's update (quantize, secagg), ditto
TAG_PHASE = 18  # a client's training phase i > 0 (Phase), from its round seed and i
TAG_ADAPT = 19  # an evaluated client's adaptation (ClientWork.eval_phase), per round
TAG_ADVERSARY = 20  # whether a client is malicious (adversary.fraction), per (seed, client id)
TAG_ATTACK = 21  # an attack's draws for a malicious client, from its round seed
TAG_SELECT = 22  # a selector's own draws for a round (SelectionContext.rng), per (seed, round)
TAG_CLUSTER = 23  # IFCA's initial cluster models, per (seed, cluster)


def derive_seed(*parts: int) -> int:
    """A 63-bit seed from any tuple of non-negative ints (fits torch.manual_seed)."""
    state = np.random.SeedSequence([int(p) for p in parts]).generate_state(2, dtype=np.uint32)
    # 32 bits shifted by 31 over 32 bits: at most 63 bits, so no mask is needed (an
    # earlier ``& (2^63 - 1)`` masked nothing: tools/mutation.py's mutants of it survived)
    return (int(state[0]) << 31) ^ int(state[1])


def client_seed(seed: int, round_idx: int, client_id: int) -> int:
    """The seed of one client's local training in one round."""
    return derive_seed(seed, TAG_TRAIN, round_idx, client_id)


def personalize_seed(seed: int, round_idx: int, client_id: int) -> int:
    """The seed of one client's personalization (fine-tuning before it is evaluated) in an
    eval round: its own stream, so personalizing never shifts the training streams."""
    return derive_seed(seed, TAG_PERSONALIZE, round_idx, client_id)


def rng(*parts: int) -> np.random.Generator:
    """A numpy Generator for a named stream, e.g. rng(seed, TAG_SAMPLE, round)."""
    return np.random.default_rng(np.random.SeedSequence([int(p) for p in parts]))
