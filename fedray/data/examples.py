"""Examples in memory: one split of a data set (``Split``: inputs, labels, and per example
its coarse label and owner) and the one check every path applies to model inputs
(``first_nonfinite``).

Why apart from ``Dataset``: sources, partitioners, the store's writer and reader and the
workers all handle splits; a Dataset (fedray.data.dataset) also knows how to partition
itself and write a store, which sit above them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# The most classes a data set or a store may have. Far beyond any real label set (ImageNet-21k
# has 21,841, a large vocabulary a few 100,000), and small enough that what is sized by the
# classes -- a model's output layer, a store's label histograms, --describe's picture -- fits
# in memory: a stray label of 1e9 must be an error, not a billion-class store.
MAX_CLASSES = 1_000_000


@dataclass
class Split:
    """One split (train or test) of a data set."""

    x: np.ndarray  # [n, C, H, W] images or [n, d] features; uint8 or float32
    # [n] int64 labels (fine labels for CIFAR-100), or [n, L] int64 label sequences (the
    # next-character targets of Shakespeare, fedray.data.sources.shakespeare)
    y: np.ndarray
    coarse: np.ndarray | None = None  # [n] int64 coarse labels (CIFAR-100), else None
    owner: np.ndarray | None = None  # [n] int64 index into Dataset.owners (e.g. the writer)

    def __post_init__(self) -> None:
        if len(self.x) != len(self.y):
            raise ValueError(f"x has {len(self.x)} rows but y has {len(self.y)}")
        for name in ("coarse", "owner"):
            v = getattr(self, name)
            if v is not None and len(v) != len(self.y):
                raise ValueError(f"{name} has {len(v)} rows but y has {len(self.y)}")

    def __len__(self) -> int:
        return len(self.y)

    def take(self, idx: np.ndarray) -> Split:
        """The rows ``idx`` of this split, in that order."""
        return Split(self.x[idx], self.y[idx],
                     None if self.coarse is None else self.coarse[idx],
                     None if self.owner is None else self.owner[idx])


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def first_nonfinite(x: np.ndarray, scale: float = 1.0) -> tuple[int, str] | None:
    """The first row of ``x`` whose model input is not finite, and why (NaN, an infinite
    value, a value beyond float32's range, or one that overflows when scaled); None when
    every one is finite.

    Why here: a model input is ``float32(x) * scale`` (how a store's reader makes it), so a
    finite float64 of 1e300, or a finite pixel times an absurd ``scale``, is as useless as a
    NaN -- every update it touches is dropped as non-finite, and a run ends with nothing
    learnt and exit 0. Sources, the store writer, ``data.verify`` and a worker's read of a
    client all ask this one question. It costs two passes over ``x`` (its min and max: the
    extremes overflow first, and NaN propagates through both); the rows are searched, a block
    at a time, only when one fails."""
    if x.size == 0 or x.dtype.kind not in "iuf":
        return None
    s = np.float32(scale)
    with np.errstate(over="ignore", invalid="ignore"):
        ends = np.asarray([x.min(), x.max()])
        if np.isfinite(ends).all() and np.isfinite(ends.astype(np.float32) * s).all():
            return None
        rows = x.reshape(len(x), -1)
        block = max(1, 2**22 // max(1, rows.shape[1]))  # about 16 MB of float32 at a time
        for start in range(0, len(rows), block):
            part = rows[start:start + block]
            scaled = part.astype(np.float32) * s
            bad = np.flatnonzero(~np.isfinite(scaled).all(axis=1))
            if len(bad):
                r = int(bad[0])
                raw = part[r][~np.isfinite(scaled[r])][0].item()
                return start + r, _why_nonfinite(raw, scale)
    return None  # pragma: no cover -- the extremes said one row fails


def _why_nonfinite(raw: float, scale: float) -> str:
    if raw != raw:
        return "NaN"
    if raw in (float("inf"), float("-inf")):
        return f"an infinite value ({raw})"
    if abs(raw) > _FLOAT32_MAX:
        return f"{raw:g}, beyond float32's range (±3.4e38)"
    return f"{raw:g}, which times scale {scale:g} overflows float32 (±3.4e38)"
