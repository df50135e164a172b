"""Stream derivation (fedray.core.seeding): every stream is a hash of (seed, tag, parts),
with tags that never change and never collide.

Pinned values: a tag or a hash that changes changes every result fedray has produced (a
resumed run, a reproduced figure), so a change must fail here rather than pass silently.
Mutation testing (tools/mutation.py) showed that the older tests could not see a colliding
tag, a stream reusing another's tag, a sum in place of the hash, or a 32-bit seed."""

from __future__ import annotations

import numpy as np

from fedray.core import seeding
from fedray.core.seeding import client_seed, derive_seed, personalize_seed, rng

TAGS = {"TAG_TRAIN": 1, "TAG_SAMPLE": 2, "TAG_FED_EVAL": 3, "TAG_INIT": 4, "TAG_HOLDOUT": 5,
        "TAG_CONTROL": 6, "TAG_TEST_HOLDOUT": 7, "TAG_DROPOUT": 8, "TAG_SPEED": 9,
        "TAG_PERSONALIZE": 10, "TAG_DEVICE": 11, "TAG_AVAILABILITY": 12,
        "TAG_ONLINE_SAMPLE": 13, "TAG_BUFFERED": 14, "TAG_DP_NOISE": 15, "TAG_DP_LOCAL": 16,
        "TAG_QUANTIZE": 17, "TAG_PHASE": 18, "TAG_ADAPT": 19, "TAG_ADVERSARY": 20,
        "TAG_ATTACK": 21, "TAG_SELECT": 22, "TAG_CLUSTER": 23}


def test_tags_are_fixed_and_distinct():
    found = {k: v for k, v in vars(seeding).items() if k.startswith("TAG_")}
    assert found == TAGS  # fixed forever: a renumbered tag changes every result using it
    assert len(set(found.values())) == len(found)  # two streams never share a tag


def test_derived_seeds_are_pinned():
    """The exact values: a hash of the parts in order, 63 bits of SeedSequence's output."""
    assert derive_seed(0, 1, 2, 3) == 8371474695566353183
    assert derive_seed(3, 2, 1, 0) == 3781414858717725601
    assert derive_seed(7) == 4474668370826950401
    assert client_seed(7, 3, 5) == derive_seed(7, 1, 3, 5) == 7689015523557439393
    assert personalize_seed(7, 3, 5) == derive_seed(7, 10, 3, 5) == 7723642275514781810
    assert rng(7, 2, 1).integers(0, 1000, size=5).tolist() == [203, 523, 296, 116, 515]


def test_parts_are_hashed_not_added():
    """A sum (or any symmetric mix) of the parts would give these pairs one seed."""
    for a, b in (((1, 2), (2, 1)), ((0, 3), (1, 2)), ((5, 1, 3), (5, 3, 1)), ((2, 2), (1, 3))):
        assert derive_seed(*a) != derive_seed(*b), (a, b)
        assert not np.array_equal(rng(*a).random(4), rng(*b).random(4)), (a, b)
    # round and client are not interchangeable: client 3 in round 5 is not client 5 in round 3
    assert client_seed(0, 5, 3) != client_seed(0, 3, 5)
    assert personalize_seed(0, 5, 3) != personalize_seed(0, 3, 5)
    # training and personalization are separate streams of one (seed, round, client)
    assert client_seed(0, 5, 3) != personalize_seed(0, 5, 3)


def test_seeds_use_63_bits():
    """Every seed fits torch.manual_seed (< 2^63) and uses its whole range: a 32-bit seed
    would collide after about 2^16 clients (the birthday bound) in million-client runs."""
    seeds = np.array([derive_seed(0, 1, r, c) for r in range(4) for c in range(500)],
                     dtype=np.uint64)
    assert len(np.unique(seeds)) == len(seeds)
    assert int(seeds.max()) < 2**63 and int(seeds.max()) >= 2**62
    assert (seeds >= np.uint64(2**32)).mean() > 0.99
    low = seeds & np.uint64(2**31 - 1)
    high = seeds >> np.uint64(31)
    assert len(np.unique(low)) == len(seeds) and len(np.unique(high)) == len(seeds)
