"""The synthetic population's glyph tables: the ink of a pixel is taken from its nearest
stroke point (one exp per pixel), which must be the per-point maximum the generator was
defined by. Pure numpy, no Ray."""

import numpy as np
import pytest

from fedray.core.seeding import rng
from fedray.data.sources import synthetic


def _per_point_maximum(seed: int) -> np.ndarray:
    """The definition, written out: every stroke point's Gaussian, then the maximum."""
    g = rng(seed, synthetic._TAG_GLYPHS)
    n, side = synthetic.NUM_CLASSES, synthetic.SIDE
    ctrl = g.uniform(0.2, 0.8, size=(n, 3, 3, 2))
    t = np.linspace(0.0, 1.0, 40)[None, None, :, None]
    p0, p1, p2 = ctrl[:, :, 0:1], ctrl[:, :, 1:2], ctrl[:, :, 2:3]
    pts = ((1 - t) ** 2 * p0 + 2 * (1 - t) * t * p1 + t**2 * p2).reshape(n, -1, 2)
    centers = (np.arange(side) + 0.5) / side
    grid = np.stack(np.meshgrid(centers, centers, indexing="xy"), -1).reshape(-1, 2)
    d2 = ((pts[:, :, None, :] - grid[None, None]) ** 2).sum(-1) * side**2
    ink = np.exp(-d2 / (2 * 1.1**2)).max(axis=1).reshape(n, 1, side, side)
    return ink.astype(np.float32)


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_nearest_point_ink_is_the_per_point_maximum(seed):
    # min before exp equals max after it wherever exp is monotone; a libm that is not
    # (none known) could move a pixel by one float32 ulp of its value, never more, since
    # the float64 results would differ by an ulp of float64 at most before rounding
    synthetic.glyphs.cache_clear()
    fast = synthetic.glyphs(seed).numpy()
    slow = _per_point_maximum(seed)
    assert fast.shape == (62, 1, 28, 28) and fast.dtype == np.float32
    assert (np.abs(fast - slow) <= np.spacing(slow)).all()
    assert 0.0 <= fast.min() and fast.max() <= 1.0 and fast.max() > 0.99  # strokes are inked
