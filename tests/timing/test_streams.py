"""The counter-based streams: pure functions of (seed, tag, parts), whatever the batch."""

import numpy as np
import pytest

from fedray.errors import FedrayError
from fedray.timing.streams import (
    TAG_AVAILABILITY,
    TAG_DEVICE,
    TAG_ONLINE_SAMPLE,
    client_ids,
    hash64,
    standard_normal,
    stream_key,
    uniform,
)


def test_tags_are_distinct_from_every_other_stream():
    # fedray.core.seeding may register these tags under the same names (and values): any
    # other tag there must not reuse a timing tag's number
    from fedray.core import seeding

    ours = {"TAG_DEVICE": TAG_DEVICE, "TAG_AVAILABILITY": TAG_AVAILABILITY,
            "TAG_ONLINE_SAMPLE": TAG_ONLINE_SAMPLE}
    assert len(set(ours.values())) == 3
    for name, value in vars(seeding).items():
        if name.startswith("TAG_"):
            assert value == ours[name] if name in ours else value not in ours.values(), name


def test_values_depend_on_the_id_not_on_the_batch():
    key = stream_key(5, TAG_DEVICE)
    ids = np.array([0, 7, 123456789, 2**40, 3])
    whole = uniform(key, ids, 2)
    one_by_one = np.array([uniform(key, np.array([i]), 2)[0] for i in ids])
    scalar = np.array([uniform(key, int(i), 2) for i in ids])
    assert np.array_equal(whole, one_by_one) and np.array_equal(whole, scalar)
    assert np.array_equal(uniform(key, ids[::-1], 2), whole[::-1])
    assert np.array_equal(uniform(stream_key(5, TAG_DEVICE), ids, 2), whole)  # bit for bit


def test_streams_differ_by_seed_tag_and_part():
    ids = np.arange(1000)
    a = hash64(stream_key(1, TAG_DEVICE), ids, 0)
    assert len(np.unique(a)) == 1000  # distinct ids, distinct words (a bijection per stage)
    for other in (hash64(stream_key(2, TAG_DEVICE), ids, 0),
                  hash64(stream_key(1, TAG_AVAILABILITY), ids, 0),
                  hash64(stream_key(1, TAG_DEVICE), ids, 1)):
        assert not np.any(other == a)


def test_uniform_and_normal_have_their_moments():
    # 200k draws: the mean of U(0,1) has sd 0.29/sqrt(2e5) = 6.5e-4 and a N(0,1)'s sample
    # mean sd 2.2e-3, its variance's sd sqrt(2/2e5) = 3.2e-3: 5-sigma bounds, fixed seed
    key = stream_key(0, TAG_DEVICE)
    u = uniform(key, np.arange(200_000), 0)
    assert 0 < u.min() and u.max() < 1
    assert abs(u.mean() - 0.5) < 5 * 6.5e-4
    z = standard_normal(key, np.arange(200_000), 0)
    assert abs(z.mean()) < 5 * 2.2e-3 and abs(z.var() - 1) < 5 * 3.2e-3
    assert abs(np.mean(z < -1.6448536) - 0.05) < 5 * np.sqrt(0.05 * 0.95 / 2e5)


def test_client_ids_are_checked():
    assert client_ids([3, 1]).dtype == np.int64
    with pytest.raises(FedrayError, match="must be >= 0, got -1"):
        client_ids([1, -1])
    with pytest.raises(FedrayError, match="must be integers"):
        client_ids([1.5])
