"""Per-client feature shift (``data.per_client``): each client's inputs moved into a domain
of their own -- rotated, re-contrasted, brightened, made noisy -- the same way in every round.

Why: FedBN (Li et al., ICLR 2021) studies clients whose *inputs* come from different domains
(the same digits scanned by other devices, drawn by other people) while the task stays the
same: feature shift, not label shift. A store holds one domain; this section makes it many,
at run time, on top of any store. A client's shift is a property of the client: it applies
to its training data in every round and to its own held-out test split (what federated and
personalized evaluation score it on), so a client is always evaluated in the domain it
trains in. The central test set is never shifted: it stays the source's own distribution.

The shift is a pure function of (seed, client_id) and the client's stored data: the same on
any worker, at any worker count, in any order and in every round. The worker applies it as
it reads a client's split, before ``data.per_round`` (fedray.data.transforms.per_round), whose draws
then pick among, or relabel, already shifted examples.

Each option is off at its default, and each is drawn from its own stream, so switching one
on does not move another's draws. With ``domains: 0`` a client draws its own values from
``rng(seed, TAG_PER_CLIENT, 0, client_id, k)``; with ``domains: K`` client c belongs to
domain c % K (round robin, whatever the seed) and every client of a domain shares the
values of ``rng(seed, TAG_PER_CLIENT, 1, domain, k)`` -- FedBN's setting of a few domains.
k is 0 for rotation, 1 for contrast, 2 for brightness and 3 for the noise's std. The noise
itself is per client and split, never per domain: ``rng(seed, TAG_PER_CLIENT, 0, client_id,
4, split)`` with split 0 for train and 1 for test.

Applied in this order to every example (float32 throughout):

1. rotation: the image turned by the client's angle (uniform in [-rotation, rotation]
   degrees, counter-clockwise) about its centre, bilinear, each output pixel reading the
   nearest edge pixel where it falls outside (MNIST's black and FEMNIST's white backgrounds
   both extend without a seam). Only for (channels, height, width) inputs.
2. contrast: x -> (x - m) * c + m, c uniform in [lo, hi], m the mean of the example's own
   values (all channels): each example keeps its average brightness. A mean over the
   client's data would tie a test example's shift to the training examples beside it and
   make the two splits' shifts differ; the example's own mean is torchvision's convention.
3. brightness: b added to every value, b uniform in [-brightness, brightness].
4. noise: s * z added, s uniform in [0, noise] per client (or domain), z standard normal,
   drawn per example: example i of a split always gets the i-th draw of its client's
   stream (the draws fill the examples in order, so that row depends on (seed, client,
   split, i) only). Fixed per example, not redrawn each round: a domain's sensor noise is
   part of its images, and noise redrawn every round would be augmentation (a regularizer
   the other clients do not get), not a shift.
5. clip: with ``clip: [lo, hi]``, every value clipped into that range ([0, 1] for stores of
   pixels, which hand models x * 1/255). Off by default: fedray cannot tell a pixel's range
   from a feature's.

Inputs that are token ids (a store of next-token targets, whose model casts inputs to ids)
are refused, as is a rotation of inputs that are not images (``check_data``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedray.core.seeding import rng
from fedray.errors import key_error
from fedray.section import plain

# Stream tag of the per-client shift: fixed forever (fedray.core.seeding's tags are 1..19,
# the partitioners' 101..106, data.per_round's 201).
TAG_PER_CLIENT = 202
_ROTATION, _CONTRAST, _BRIGHTNESS, _NOISE_STD, _NOISE = 0, 1, 2, 3, 4
_CLIENT, _DOMAIN = 0, 1
SPLITS = {"train": 0, "test": 1}
MAX_ROTATION = 180.0


@dataclass(frozen=True)
class PerClient:
    """The parsed ``data.per_client`` section (see docs/config.md)."""

    rotation: float = 0.0  # max |angle| in degrees; 0: off
    contrast: tuple[float, float] = (1.0, 1.0)  # range of the factor; (1, 1): off
    brightness: float = 0.0  # max |shift|; 0: off
    noise: float = 0.0  # max std; 0: off
    domains: int = 0  # 0: a shift per client; K: K shared shifts, client c in domain c % K
    clip: tuple[float, float] | None = None  # the range outputs are clipped into

    @property
    def active(self) -> bool:
        return bool(self.keys_on())

    def keys_on(self) -> list[str]:
        """The options switched on, as their config keys (for messages)."""
        on = {"rotation": self.rotation > 0, "contrast": self.contrast != (1.0, 1.0),
              "brightness": self.brightness > 0, "noise": self.noise > 0}
        return [f"data.per_client.{k}" for k, v in on.items() if v]


@dataclass(frozen=True)
class Shift:
    """What one client draws: its angle (degrees), contrast factor, brightness offset and
    noise std; the identity at (0, 1, 0, 0)."""

    angle: float = 0.0
    contrast: float = 1.0
    brightness: float = 0.0
    noise_std: float = 0.0


def _pair(section: Any, key: str, rule: str, ok) -> tuple[float, float] | None:
    value = section.get(key)
    if value is None:
        return None
    try:
        pair = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        pair = ()
    if len(pair) != 2 or not all(math.isfinite(v) for v in pair) or not ok(*pair):
        raise key_error(f"data.per_client.{key}", rule,
                        value if isinstance(value, (str, int, float)) else list(value))
    return pair


def _number(section: Any, key: str, default: float, rule: str, ok) -> float:
    value = section.get(key, default)
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number) or not ok(number):
        raise key_error(f"data.per_client.{key}", rule, value)
    return number


def parse_per_client(section: Any, per_round: Any = None) -> PerClient | None:
    """``data.per_client`` checked and parsed, or None when no option is switched on.
    Every impossible value is one line naming its key. ``per_round``: the parsed
    ``data.per_round`` (fedray.data.transforms.per_round.PerRound), whose ``pool: all`` cannot be
    combined with a shift (a round's examples would come from other clients' stored data,
    which has no index in this client's noise stream)."""
    if section is None:
        return None
    section = plain(section)  # typed, an omegaconf node or a dict
    rotation = _number(section, "rotation", 0.0, f"must be in [0, {MAX_ROTATION:g}] degrees",
                       lambda v: 0.0 <= v <= MAX_ROTATION)
    contrast = _pair(section, "contrast", "must be [lo, hi] with 0 <= lo <= hi",
                     lambda lo, hi: 0.0 <= lo <= hi) or (1.0, 1.0)
    brightness = _number(section, "brightness", 0.0, "must be >= 0", lambda v: v >= 0)
    noise = _number(section, "noise", 0.0, "must be >= 0", lambda v: v >= 0)
    domains = section.get("domains", 0)
    if isinstance(domains, bool) or not isinstance(domains, int) or domains < 0:
        raise key_error("data.per_client.domains",
                        "must be an integer >= 0 (0: every client its own shift)", domains)
    clip = _pair(section, "clip", "must be null or [lo, hi] with lo < hi",
                 lambda lo, hi: lo < hi)
    out = PerClient(rotation, contrast, brightness, noise, domains, clip)
    if not out.active:
        return None
    if per_round is not None and getattr(per_round, "resamples", False) \
            and getattr(per_round, "pool", "client") == "all":
        raise key_error(out.keys_on()[0], "cannot be combined with "
                        "data.per_round.imbalance.pool: all (a round's examples come from "
                        "other clients); use pool: client")
    return out


def check_data(spec: PerClient | None, input_shape: tuple[int, ...],
               label_shape: tuple[int, ...] = (), data: str = "the data") -> None:
    """Refuse, in one line naming the key, a shift the data cannot take: a rotation of
    inputs that are not (channels, height, width) images, and any shift of token ids (data
    with a sequence of labels per example: next-token targets, whose model casts its inputs
    to ids). Class-labelled inputs that are token ids (a text column) cannot be told from
    numbers here; shifting them is the job's mistake (docs/partitions.md)."""
    if spec is None:
        return
    if label_shape:
        key = spec.keys_on()[0]
        raise key_error(key, f"shifts inputs, but {data} has a sequence of labels per "
                        "example: its inputs are token ids, which a shift would turn into "
                        "other tokens")
    if spec.rotation > 0 and len(input_shape) != 3:
        raise key_error("data.per_client.rotation", f"rotates (channels, height, width) "
                        f"images; the inputs of {data} have shape {tuple(input_shape)}",
                        spec.rotation)


def draw_shift(spec: PerClient, seed: int, client_id: int) -> Shift:
    """Client ``client_id``'s shift: its own draws, or its domain's (``domains`` > 0). An
    option that is off draws nothing and stays at the identity."""
    owner = (_DOMAIN, client_id % spec.domains) if spec.domains else (_CLIENT, client_id)

    def uniform(k: int, lo: float, hi: float) -> float:
        return float(rng(seed, TAG_PER_CLIENT, *owner, k).uniform(lo, hi))

    return Shift(
        angle=uniform(_ROTATION, -spec.rotation, spec.rotation) if spec.rotation else 0.0,
        contrast=uniform(_CONTRAST, *spec.contrast) if spec.contrast != (1.0, 1.0) else 1.0,
        brightness=(uniform(_BRIGHTNESS, -spec.brightness, spec.brightness)
                    if spec.brightness else 0.0),
        noise_std=uniform(_NOISE_STD, 0.0, spec.noise) if spec.noise else 0.0,
    )


def rotate(x: np.ndarray, degrees: float) -> np.ndarray:
    """Images [n, C, H, W] turned ``degrees`` counter-clockwise about their centre, bilinear,
    reading the nearest edge pixel outside the image (float32 out).

    Output pixel (i, j) reads the input at the point rotated back onto it, in float64;
    cos and sin are rounded to 12 decimals so that a multiple of 90 degrees samples exact
    pixel centres and reproduces np.rot90 bit for bit."""
    n, c, h, w = x.shape
    t = math.radians(degrees)
    cos, sin = round(math.cos(t), 12), round(math.sin(t), 12)
    cy, cx = (h - 1) / 2.0, (w - 1) / 2.0
    ii, jj = np.meshgrid(np.arange(h, dtype=np.float64) - cy,
                         np.arange(w, dtype=np.float64) - cx, indexing="ij")
    sy = np.clip(cy + cos * ii + sin * jj, 0.0, h - 1.0)
    sx = np.clip(cx - sin * ii + cos * jj, 0.0, w - 1.0)
    y0, x0 = np.floor(sy).astype(np.int64), np.floor(sx).astype(np.int64)
    y1, x1 = np.minimum(y0 + 1, h - 1), np.minimum(x0 + 1, w - 1)
    wy, wx = (sy - y0).astype(np.float32), (sx - x0).astype(np.float32)
    src = np.asarray(x, dtype=np.float32)
    top = src[:, :, y0, x0] * (1 - wx) + src[:, :, y0, x1] * wx
    bottom = src[:, :, y1, x0] * (1 - wx) + src[:, :, y1, x1] * wx
    return (top * (1 - wy) + bottom * wy).astype(np.float32, copy=False)


def noise_draws(seed: int, client_id: int, split: str, shape: tuple[int, ...]) -> np.ndarray:
    """The standard normal draws of a client's split, one row per example, float32: row i
    is the same whatever the number of rows (the stream fills rows in order)."""
    g = rng(seed, TAG_PER_CLIENT, _CLIENT, client_id, _NOISE, SPLITS[split])
    return g.standard_normal(shape, dtype=np.float32)


def shift_inputs(spec: PerClient, seed: int, client_id: int, split: str,
                 x: np.ndarray) -> np.ndarray:
    """Client ``client_id``'s stored inputs ``x`` [n, ...] of ``split`` ("train" or
    "test") moved into its domain: a new float32 array (``x`` is not changed), or ``x``
    itself when the client's draws are all the identity."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
    s = draw_shift(spec, seed, client_id)
    out = np.asarray(x, dtype=np.float32)
    if s == Shift() and spec.clip is None or not len(out):
        return out
    if s.angle:
        out = rotate(out, s.angle)
    if s.contrast != 1.0:
        mean = out.reshape(len(out), -1).mean(axis=1, dtype=np.float64)
        mean = mean.astype(np.float32).reshape((-1,) + (1,) * (out.ndim - 1))
        out = (out - mean) * np.float32(s.contrast) + mean
    if s.brightness:
        out = out + np.float32(s.brightness)
    if s.noise_std:
        out = out + np.float32(s.noise_std) * noise_draws(seed, client_id, split, out.shape)
    if spec.clip is not None:
        out = np.clip(out, np.float32(spec.clip[0]), np.float32(spec.clip[1]))
    return np.ascontiguousarray(out, dtype=np.float32)
