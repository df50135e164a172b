"""A FEMNIST-shaped synthetic federated data set, generated lazily per client.

Why synthetic: the quickstart, the benchmarks and the scale tests need a population of
100,000+ writers without any download. Each client is a "writer": 28x28 grey images of
62 character classes in LEAF's convention (floats in [0, 1], 1.0 = white background), drawn
from 62 fixed stroke glyphs through the writer's own handwriting style (slant, size, shear,
offset, stroke weight, contrast) and label mix, with per-example jitter and pixel noise.
Client sizes vary between ``min_examples`` and ``max_examples``: ``min + rint(u * span)``
with u ~ Beta(1.5, 1.5), drawn per client from a counter-based hash of (data seed, client
id) (fedray.timing.streams), so the sizes of the clients a round samples cost O(clients),
never O(population).

Everything derives from (data seed, client id), so any process can regenerate any client in
about a millisecond and nothing is stored: memory does not grow with the population.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
import torch.nn.functional as F

from fedray.core.seeding import rng
from fedray.data.dataset import Dataset
from fedray.data.examples import Split
from fedray.timing.streams import stream_key, uniform

NUM_CLASSES = 62
SIDE = 28
_TAG_WRITER, _TAG_GLYPHS = 12, 13
_SPLIT_TAGS = {"train": 21, "test": 22}
# client sizes, hashed per client id; not 11 (sizes' former single stream), which is also
# the clock's device tag (fedray.core.seeding.TAG_DEVICE): a data seed equal to the job's
# would otherwise tie a writer's size to its simulated speed
_TAG_SIZES = 23
_CHUNK = 1 << 20  # ids per pass of train_sizes(): bounds its temporaries at a few MB


@functools.lru_cache(maxsize=4)
def glyphs(seed: int) -> torch.Tensor:
    """62 ink images [62, 1, 28, 28] in [0, 1]: three quadratic Bezier strokes per class."""
    g = rng(seed, _TAG_GLYPHS)
    ctrl = g.uniform(0.2, 0.8, size=(NUM_CLASSES, 3, 3, 2))  # class, stroke, control pt, xy
    t = np.linspace(0.0, 1.0, 40)[None, None, :, None]
    p0, p1, p2 = ctrl[:, :, 0:1], ctrl[:, :, 1:2], ctrl[:, :, 2:3]
    pts = ((1 - t) ** 2 * p0 + 2 * (1 - t) * t * p1 + t**2 * p2).reshape(NUM_CLASSES, -1, 2)
    centers = (np.arange(SIDE) + 0.5) / SIDE
    grid = np.stack(np.meshgrid(centers, centers, indexing="xy"), -1).reshape(-1, 2)
    # a pixel's ink is its nearest stroke point's Gaussian, max_k exp(-d2_k / c), taken
    # as exp(-min_k d2_k / c): the same floats wherever exp is monotone (bit-identical on
    # the development machine; tests/data/test_synthetic_glyphs.py allows one float32 ulp
    # elsewhere), one exp per pixel instead of one per stroke point, which cut a run's
    # start-up by about 0.3 s
    dx = pts[:, :, None, 0] - grid[None, None, :, 0]
    dy = pts[:, :, None, 1] - grid[None, None, :, 1]
    d2 = (dx * dx + dy * dy).min(axis=1) * SIDE**2
    ink = np.exp(-d2 / (2 * 1.1**2)).reshape(NUM_CLASSES, 1, SIDE, SIDE)
    return torch.from_numpy(ink.astype(np.float32))


def beta15_cdf(x: float) -> float:
    """Beta(1.5, 1.5)'s CDF in closed form: with x = sin^2(t), its density
    (8 / pi) sqrt(x (1 - x)) dx is (2 / pi)(1 - cos 4t) dt, whose integral from 0 is
    (2t - sin(4t) / 2) / pi."""
    t = math.asin(math.sqrt(min(1.0, max(0.0, x))))
    return (2.0 * t - math.sin(4.0 * t) / 2.0) / math.pi


@functools.lru_cache(maxsize=16)
def size_cdf(span: int) -> np.ndarray:
    """P(rint(u * span) <= k) for k = 0..span, u ~ Beta(1.5, 1.5): the integer CDF a
    client's hashed uniform is looked up in. rint(u * span) = k exactly when u is in
    [(k - 1/2) / span, (k + 1/2) / span) (the interval ends have probability 0), so this is
    the distribution the former ``min + rint(beta(1.5, 1.5) * span)`` draws had.

    Computed with Python's math module, in float64, once per span: a size changes from one
    machine to another only if a client's uniform falls within an ulp of a table entry."""
    if span <= 0:
        return np.ones(1)
    cdf = np.array([beta15_cdf((k + 0.5) / span) for k in range(span + 1)])
    cdf[-1] = 1.0  # every uniform (< 1) lands in the table
    return cdf


def _class_prior() -> np.ndarray:
    """Digits are about half of FEMNIST; the 52 letters share the rest."""
    prior = np.full(NUM_CLASSES, 0.5 / 52)
    prior[:10] = 0.05
    return prior


class SyntheticFEMNIST:
    """A lazily generated population of FEMNIST-like writers (a ClientSource)."""

    num_classes = NUM_CLASSES
    input_shape = (1, SIDE, SIDE)
    has_client_test = True
    cacheable = True

    def __init__(self, num_clients: int = 1000, min_examples: int = 30, max_examples: int = 90,
                 test_fraction: float = 0.1, test_writers: int = 200, seed: int = 0):
        self.population = int(num_clients)
        self.min_examples = int(min_examples)
        self.max_examples = int(max_examples)
        self.test_fraction = float(test_fraction)
        self.test_writers = int(test_writers)
        self.seed = int(seed)
        self._sizes: np.ndarray | None = None
        self._key = stream_key(self.seed, _TAG_SIZES)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_sizes"] = None  # recomputed on first use: cheaper than shipping N ints
        return state

    def train_sizes_of(self, ids: np.ndarray | list[int]) -> np.ndarray:
        """The train sizes of exactly these clients (any order, repeats allowed), in
        O(len(ids)): what the driver, the workers and the clock ask for."""
        a = np.asarray(ids)
        if a.size and a.dtype.kind not in "iu":
            raise TypeError(f"client ids must be integers, got an array of {a.dtype}")
        a = a.astype(np.int64, copy=False)
        if a.size and not (0 <= int(a.min()) and int(a.max()) < self.population):
            bad = int(a.min()) if int(a.min()) < 0 else int(a.max())
            raise IndexError(f"client {bad} is outside the population of {self.population}")
        cdf = size_cdf(self.max_examples - self.min_examples)
        u = uniform(self._key, a)
        return self.min_examples + np.searchsorted(cdf, u, side="right").astype(np.int64)

    def test_sizes_of(self, ids: np.ndarray | list[int]) -> np.ndarray:
        return self._test_size(self.train_sizes_of(ids))

    def train_sizes(self) -> np.ndarray:
        """Every client's train size (O(population), cached): for callers that need all of
        them, e.g. ``to_dataset``; equal to ``train_sizes_of`` bit for bit."""
        if self._sizes is None:
            sizes = np.empty(self.population, np.int64)
            for lo in range(0, self.population, _CHUNK):
                hi = min(self.population, lo + _CHUNK)
                sizes[lo:hi] = self.train_sizes_of(np.arange(lo, hi, dtype=np.int64))
            self._sizes = sizes
        return self._sizes

    def test_sizes(self) -> np.ndarray:
        return self._test_size(self.train_sizes())

    def _test_size(self, train: np.ndarray) -> np.ndarray:
        """Held-out examples for writers with ``train`` examples: LEAF's 90/10 split."""
        f = self.test_fraction
        if f == 0:
            return np.zeros(np.shape(train), dtype=np.int64)
        return np.maximum(1, np.rint(train * f / (1 - f))).astype(np.int64)

    def _style(self, cid: int) -> tuple[np.ndarray, np.ndarray, float, float]:
        g = rng(self.seed, _TAG_WRITER, cid)
        label_p = g.dirichlet(20.0 * _class_prior())
        angle = g.normal(0.0, math.radians(10))
        scale = g.uniform(0.85, 1.15)
        shear = g.normal(0.0, 0.15)
        shift = g.normal(0.0, 0.06, size=2)
        c, s = math.cos(angle), math.sin(angle)
        theta = np.array([[c / scale, (-s + shear) / scale, shift[0]],
                          [s / scale, c / scale, shift[1]]])
        weight = g.uniform(0.5, 1.5)  # ink ** weight: < 1 thick strokes, > 1 thin ones
        contrast = g.uniform(0.7, 1.0)
        return label_p, theta, weight, contrast

    def client(self, cid: int, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
        if not 0 <= cid < self.population:
            raise IndexError(f"client {cid} is outside the population of {self.population}")
        # one writer's count, not the population's
        n = int((self.train_sizes_of if split == "train" else self.test_sizes_of)([cid])[0])
        if n == 0:  # no held-out examples (test_fraction: 0)
            return np.zeros((0, 1, SIDE, SIDE), np.float32), np.zeros(0, np.int64)
        label_p, theta, weight, contrast = self._style(cid)
        g = rng(self.seed, _SPLIT_TAGS[split], cid)
        y = g.choice(NUM_CLASSES, size=n, p=label_p)
        thetas = theta[None] + g.normal(0.0, 0.04, size=(n, 2, 3))
        noise = g.normal(0.0, 0.05, size=(n, 1, SIDE, SIDE)).astype(np.float32)
        with torch.no_grad():
            grid = F.affine_grid(torch.from_numpy(thetas.astype(np.float32)), [n, 1, SIDE, SIDE],
                                 align_corners=False)
            ink = F.grid_sample(glyphs(self.seed)[torch.from_numpy(y)], grid,
                                align_corners=False)
            ink = ink.clamp_(0, 1).pow_(weight).mul_(contrast).add_(torch.from_numpy(noise))
            x = (1.0 - ink.clamp_(0, 1)).numpy()
        return x, y.astype(np.int64)

    def central_test(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The held-out examples of ``test_writers`` writers spread over the population."""
        k = min(self.test_writers, self.population)
        if k == 0 or self.test_fraction == 0:
            return None
        writers = np.unique(np.linspace(0, self.population - 1, k).astype(np.int64))
        parts = [self.client(int(c), "test") for c in writers]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def to_dataset(self) -> Dataset:
        """Every writer's examples as one raw data set (writers become natural owners).

        Lets the partition recipes treat the generator like any real source, e.g. to build a
        large Dirichlet store without a download.
        """
        parts = {split: [self.client(c, split) for c in range(self.population)]
                 for split in ("train", "test")}
        sizes = {"train": self.train_sizes(), "test": self.test_sizes()}
        splits = {}
        for split, arrays in parts.items():
            splits[split] = Split(
                x=np.concatenate([a[0] for a in arrays]), y=np.concatenate([a[1] for a in arrays]),
                owner=np.repeat(np.arange(self.population, dtype=np.int64), sizes[split]))
        return Dataset(name="synthetic", train=splits["train"], test=splits["test"],
                       num_classes=NUM_CLASSES, owners=[str(c) for c in range(self.population)])
