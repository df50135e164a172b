import itertools

import numpy as np

from fedray.core.assignment import assign_balanced


def _loads(groups, size_of):
    return [sum(size_of[c] for c in g) for g in groups]


def test_every_client_once_and_deterministic():
    ids = np.arange(100, 150)
    sizes = np.random.default_rng(0).integers(30, 90, size=50)
    groups = assign_balanced(ids, sizes, 4)
    assert sorted(c for g in groups for c in g) == list(ids)
    assert groups == assign_balanced(ids, sizes, 4)


def test_balanced_by_example_count():
    rng = np.random.default_rng(1)
    ids = np.arange(200)
    sizes = rng.integers(30, 90, size=200)
    size_of = dict(zip(ids.tolist(), sizes.tolist(), strict=True))
    loads = _loads(assign_balanced(ids, sizes, 8), size_of)
    assert max(loads) - min(loads) <= sizes.max()  # LPT: within one job of each other
    assert max(loads) <= 1.02 * sizes.sum() / 8


def test_lpt_within_four_thirds_of_optimal():
    rng = np.random.default_rng(2)
    for _ in range(20):
        sizes = rng.integers(1, 50, size=7)
        ids = np.arange(7)
        size_of = dict(enumerate(sizes.tolist()))
        lpt = max(_loads(assign_balanced(ids, sizes, 3), size_of))
        best = min(max(sum(int(s) for s, a in zip(sizes, assign, strict=True) if a == w)
                       for w in range(3))
                   for assign in itertools.product(range(3), repeat=7))
        assert lpt <= 4 / 3 * best


def test_more_workers_than_clients_leaves_some_idle():
    groups = assign_balanced(np.array([5, 6]), np.array([10, 10]), 4)
    assert sum(1 for g in groups if g) == 2
