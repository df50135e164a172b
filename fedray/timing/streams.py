"""Counter-based random numbers, vectorised over client ids: the timing model's randomness.

fedray derives every random stream from (seed, TAG, ...) through numpy's SeedSequence
(fedray.core.seeding). One SeedSequence per client costs tens of microseconds, and the
timing model asks for the device and availability of thousands of clients per simulated
moment out of populations of millions, so here a SeedSequence is built once per (seed,
tag) and each client's numbers are a hash of that key and the client id (SplitMix64's
finaliser, a bijection of 64-bit words): a pure function of (seed, tag, client id, ...),
computed for exactly the ids asked, in any order or subset, in one numpy pass.

The normal draws go through log and cos (Box-Muller), whose numpy kernels dispatch on the
CPU's SIMD features: values are bit-identical on one machine; on a CPU of another family
the last bit of a duration may differ (see docs/time.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedray.core.seeding import (  # noqa: F401  (the timing model's tags, registered there)
    TAG_AVAILABILITY,
    TAG_DEVICE,
    TAG_ONLINE_SAMPLE,
    derive_seed,
)
from fedray.errors import FedrayError

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S11 = (np.uint64(s) for s in (30, 27, 31, 11))
_TWO_PI = 2.0 * np.pi


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: a bijection that spreads every input bit over the output."""
    x = (x ^ (x >> _S30)) * _M1
    x = (x ^ (x >> _S27)) * _M2
    return x ^ (x >> _S31)


def client_ids(ids: Any) -> np.ndarray:
    """``ids`` as an int64 array, refused (one line) unless they are integers >= 0."""
    a = np.asarray(ids)
    if a.size and a.dtype.kind not in "iu":
        raise FedrayError(f"client ids must be integers, got an array of {a.dtype}")
    a = a.astype(np.int64, copy=False)
    if a.size and int(a.min()) < 0:
        raise FedrayError(f"client ids must be >= 0, got {int(a.min())}")
    return a


def _word(part: Any) -> np.ndarray:
    a = np.asarray(part)
    if a.dtype.kind not in "iu":
        raise FedrayError(f"a stream counter must be an integer, got {a.dtype}")
    return a.astype(np.int64, copy=False).view(np.uint64)  # negatives: two's complement


def stream_key(seed: int, tag: int, *parts: int) -> np.uint64:
    """The 64-bit key of the stream named by (seed, tag, parts), through SeedSequence."""
    return np.uint64(derive_seed(seed, tag, *parts))


def hash64(key: np.uint64, *parts: Any) -> np.ndarray:
    """A uint64 per element of the broadcast ``parts`` (integer arrays or scalars): distinct
    parts give independent-looking words, equal parts equal words."""
    words = np.broadcast_arrays(*(_word(p) for p in parts))
    shape = words[0].shape if words else ()
    # flat 1-d arrays throughout: numpy scalars would warn on the (intended) wrap-around
    h = np.full(int(np.prod(shape)), key, dtype=np.uint64)
    for w in words:
        h = _mix(h ^ _mix(w.ravel() + _GOLDEN))
    return h.reshape(shape)


def uniform(key: np.uint64, *parts: Any) -> np.ndarray:
    """Floats in the open interval (0, 1), 53 random bits each."""
    return ((hash64(key, *parts) >> _S11).astype(np.float64) + 0.5) * 2.0 ** -53


def standard_normal(key: np.uint64, *parts: Any) -> np.ndarray:
    """N(0, 1) draws by Box-Muller from two uniforms of their own (sub-counters 0 and 1)."""
    u1 = uniform(key, *parts, 0)
    u2 = uniform(key, *parts, 1)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(_TWO_PI * u2)
