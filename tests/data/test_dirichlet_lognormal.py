"""The Dirichlet partitioner's log-normal client sizes (seed 000's appendix, lines 32-33):
with near-uniform label shares, each client's size is its own log-normal target, drawn first
from the partition's stream, up to the floor of each class's cuts. Pure numpy: milliseconds."""

from __future__ import annotations

import numpy as np

from fedray.core.seeding import rng
from fedray.data.dataset import Dataset
from fedray.data.examples import Split
from fedray.data.partitioners import partition
from fedray.data.partitioners.common import TAG_DIRICHLET


def _dataset(num_classes: int = 10, per_class: int = 300) -> Dataset:
    g = np.random.default_rng(0)
    y = g.permutation(np.repeat(np.arange(num_classes), per_class))
    x = g.integers(0, 256, size=(len(y), 4), dtype=np.uint8)
    return Dataset(name="labels", train=Split(x, y), test=None, num_classes=num_classes)


def test_sizes_follow_the_lognormal_targets():
    ds, k, sigma, seed = _dataset(), 20, 0.8, 5
    p = partition(ds, "dirichlet", seed=seed, num_clients=k, alpha=1e6, sigma=sigma, min_examples=0)
    sizes = np.array([len(t) for t in p.train])
    target = rng(seed, TAG_DIRICHLET).lognormal(0.0, sigma, size=k)
    target *= len(ds.train.y) / target.sum()
    # each of the 10 classes is cut at floor(cumsum(w) * n_c): a client's share of a class is
    # off its target by less than 2 examples, so by < 20 over the classes; alpha = 1e6 makes
    # the Dirichlet shares uniform to ~1e-3 relative (about 1 example of 300 per class)
    assert p.info["attempts"] == 1 and sizes.sum() == len(ds.train.y)
    np.testing.assert_allclose(sizes, target, rtol=0, atol=30)
    assert sizes.max() > 3 * sizes.min()  # unbalanced, as sigma = 0.8 should make them
    even = [
        len(t)
        for t in partition(
            ds, "dirichlet", seed=seed, num_clients=k, alpha=1e6, sigma=0.0, min_examples=0
        ).train
    ]
    assert max(even) - min(even) <= 20  # sigma = 0: n / K each, up to the same floors


class _DegenerateDraws:
    """A generator whose Dirichlet draws are ``bad`` (all zeros, or NaN: what underflowing
    gamma variates can give for a tiny alpha), everything else from a real stream."""

    def __init__(self, bad: float):
        self.bad, self.g = bad, np.random.default_rng(0)

    def dirichlet(self, alpha):
        return np.full(len(alpha), self.bad)

    def __getattr__(self, name):
        return getattr(self.g, name)


def test_a_degenerate_dirichlet_draw_falls_back_to_the_targets():
    """A class whose weights p * t are not finite or sum to 0 is cut by the targets alone
    (here equal: n / K each), never by 0 / 0."""
    from fedray.data.partitioners.dirichlet import _dirichlet_positions

    y = np.repeat(np.arange(3), 8)  # 3 classes of 8 examples, 4 clients
    for bad in (0.0, np.nan):
        client, attempts, moved = _dirichlet_positions(y, 4, 1.0, 0.0, 1,
                                                       _DegenerateDraws(bad))
        assert (attempts, moved) == (1, 0)
        for c in range(4):  # 2 of each class per client
            pos = np.flatnonzero(client == c)
            assert np.array_equal(np.bincount(y[pos], minlength=3), [2, 2, 2]), bad
