"""What every partitioner shares: the stream tags, the canonical order of a data set's
examples, the one-line checks of ``partitioner.<key>`` values, and small helpers."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from fedray.data.examples import Split
from fedray.data.partition import NumberedNames, Ragged
from fedray.errors import FedrayError, key_error

# Stream tags: fixed forever, changing one changes every partition that uses it.
TAG_PACHINKO = 101
TAG_DIRICHLET = 102
TAG_IID = 103
TAG_SIMILARITY = 104
TAG_IMBALANCE = 105
TAG_LABEL_FLIP = 106
TAG_SHARD = 107
TAG_SIZE = 108
TAG_CONTINUOUS = 109
TAG_GROUPED_NATURAL = 110
TAG_INNER_DIRICHLET = 111

DIRICHLET_MAX_ATTEMPTS = 10  # draws of the dirichlet split before short clients are topped up


# Canonical order

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_FINGERPRINT_ROWS = 2048  # rows hashed per block: bounds the temporary memory


def _mix64(z: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer, element-wise on uint64 (wraparound arithmetic)."""
    z = z ^ (z >> np.uint64(30))
    z = z * _MIX1
    z = z ^ (z >> np.uint64(27))
    z = z * _MIX2
    return z ^ (z >> np.uint64(31))


def fingerprints(x: np.ndarray) -> np.ndarray:
    """A 64-bit fingerprint of each row's bytes ([n] uint64), vectorized.

    Each row's bytes are zero-padded to a multiple of 8 and read as little-endian uint64
    words; word i is xor-ed with a fixed odd constant c_i, mixed (splitmix64), multiplied by
    c_i and the words are summed with wraparound; the sum is mixed once more. The constants
    are fixed, so a fingerprint depends only on the row's bytes (and the row length).
    """
    n = len(x)
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    rows = np.ascontiguousarray(x).reshape(n, -1).view(np.uint8)
    nbytes = rows.shape[1]
    words = max(1, -(-nbytes // 8))
    consts = _mix64((np.arange(words, dtype=np.uint64) + np.uint64(1)) * _GOLDEN) | np.uint64(1)
    out = np.empty(n, dtype=np.uint64)
    for start in range(0, n, _FINGERPRINT_ROWS):
        block = rows[start:start + _FINGERPRINT_ROWS]
        buf = np.zeros((len(block), words * 8), dtype=np.uint8)
        buf[:, :nbytes] = block
        w = buf.view("<u8").astype(np.uint64, copy=False)
        h = (_mix64(w ^ consts) * consts).sum(axis=1, dtype=np.uint64)
        out[start:start + len(block)] = _mix64(h ^ np.uint64(nbytes))
    return out


def canonical_order(split: Split) -> np.ndarray:
    """The permutation that sorts ``split`` by (label, content fingerprint, coarse, owner);
    a sequence of labels counts by its fingerprint.

    Partitioners work on ``split.take(canonical_order(split))`` and map back, so a data set
    whose examples arrive in another order gives the same clients as sets of examples.
    Examples equal in all four keys are byte-identical duplicates; they keep their input
    order (the sort is stable), which changes indices but never contents.
    """
    keys: list[np.ndarray] = []
    if split.owner is not None:
        keys.append(np.asarray(split.owner))
    if split.coarse is not None:
        keys.append(np.asarray(split.coarse))
    y = np.asarray(split.y)
    # sequence labels ([n, L], next-character targets) sort by their fingerprint
    keys += [fingerprints(split.x), y if y.ndim == 1 else fingerprints(y)]
    return np.lexsort(keys).astype(np.int64)


# Argument checks (one-line FedrayErrors naming partitioner.<key>)

def _bad(key: str, rule: str, value: object) -> FedrayError:
    return key_error(f"partitioner.{key}", rule, value, what="recipe")


def _int(key: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise _bad(key, "must be an integer", value)
    if value < low:
        raise _bad(key, f"must be >= {low}", value)
    return int(value)


def _number(key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise _bad(key, "must be a number", value)
    if not math.isfinite(float(value)):
        raise _bad(key, "must be finite", value)
    return float(value)


def _positive(key: str, value: object) -> float:
    v = _number(key, value)
    if v <= 0:
        raise _bad(key, "must be > 0", value)
    return v


def _fraction(key: str, value: object) -> float:
    v = _number(key, value)
    if not 0.0 <= v <= 1.0:
        raise _bad(key, "must be in [0, 1]", value)
    return v


def _ratio_list(key: str, value: object) -> list[float]:
    rule = "must be a non-empty list of numbers in (0, 1]"
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray)) \
            or len(value) == 0:
        raise _bad(key, rule, value)
    rhos = [_number(key, r) for r in value]
    if any(not 0 < r <= 1 for r in rhos):
        raise _bad(key, rule, list(value))
    return rhos


def _base(key: str, value: object) -> str:
    if value not in ("iid", "dirichlet"):
        raise _bad(key, "must be 'iid' or 'dirichlet'", value)
    return str(value)


def _nonnegative(key: str, value: object) -> float:
    v = _number(key, value)
    if v < 0:
        raise _bad(key, "must be >= 0", value)
    return v


def _choice(key: str, value: object, choices: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise _bad(key, f"must be one of: {', '.join(choices)}", value)
    return value


def _flag(key: str, value: object) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise _bad(key, "must be true or false", value)
    return bool(value)


SIZE_LAWS = ("linear", "square", "exponential")
GROUP_MODES = ("allow-smaller", "allow-bigger", "drop-remainder", "strict")


# What can be checked of each parameter without the data (bounds such as num_clients <= n
# need the data and stay in the partitioners). Same helpers as the partitioners use.
_RULES: dict[str, Callable[[str, object], object]] = {
    "num_clients": lambda k, v: _int(k, v, 1),
    "examples_per_client": lambda k, v: _int(k, v, 1),
    "min_examples": lambda k, v: _int(k, v, 0),
    "alpha": _positive, "coarse_alpha": _positive, "fine_alpha": _positive,
    "sigma": _nonnegative,
    "similarity": _fraction, "corruption": _fraction, "flip_ratio": _fraction,
    "ratios": _ratio_list, "base": _base,
    "shards_per_client": lambda k, v: _int(k, v, 1),
    "law": lambda k, v: _choice(k, v, SIZE_LAWS), "rate": _positive,
    "strictness": _fraction, "feature": lambda k, v: _int(k, v, 0),
    "group_size": lambda k, v: _int(k, v, 1),
    "mode": lambda k, v: _choice(k, v, GROUP_MODES), "shuffle": _flag,
}


def _seed(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise key_error("seed", "must be a whole number >= 0", seed, what="recipe")
    return int(seed)


def _num_clients(value: object, n: int) -> int:
    k = _int("num_clients", value, 1)
    if k > n:
        raise _bad("num_clients", f"must be <= the number of train examples ({n})", value)
    return k


# Shared helpers

def _groups(assignment: np.ndarray, k: int) -> list[np.ndarray]:
    """Positions 0..n-1 grouped by their client in ``assignment`` (-1: nobody), ascending."""
    srt = np.argsort(assignment, kind="stable")
    bounds = np.searchsorted(assignment[srt], np.arange(k + 1))
    return [srt[bounds[i]:bounds[i + 1]] for i in range(k)]


def _to_original(order: np.ndarray, parts: list[np.ndarray]) -> list[np.ndarray]:
    """Canonical positions -> indices into the caller's split, kept in canonical order."""
    return [order[np.sort(p)].astype(np.int64) for p in parts]


def _assigned(order: np.ndarray, client: np.ndarray, k: int) -> Ragged:
    """Each canonical position's client (``client``, -1: nobody) -> every client's indices
    into the caller's split, in canonical order: what ``_to_original(order, _groups(client,
    k))`` gives, as one array and offsets, without a loop over clients (a million of them
    in a second or two)."""
    client = np.asarray(client, dtype=np.int64)
    srt = np.argsort(client, kind="stable")
    counts = np.bincount(client[client >= 0], minlength=k)[:k]
    start = len(client) - int(counts.sum())  # the unassigned (-1) sort first
    return Ragged.from_counts(order[srt[start:]].astype(np.int64, copy=False), counts)


def _names(k: int) -> NumberedNames:
    """The names "0".."k-1", made as they are read (fedray.data.partition.NumberedNames)."""
    return NumberedNames(k)


def largest_remainder(shares: np.ndarray, total: int) -> np.ndarray:
    """Integers proportional to ``shares`` summing to ``total`` (ties: lower index first):
    class sizes from shares, for the static partitioners and the per-round transforms."""
    raw = shares / shares.sum() * total
    out = np.floor(raw).astype(np.int64)
    short = total - int(out.sum())
    if short > 0:
        out[np.argsort(-(raw - out), kind="stable")[:short]] += 1
    return out


def derangement(c: int, g: np.random.Generator) -> np.ndarray:
    """A uniformly random permutation of 0..c-1 without fixed points (rejection sampling):
    a flipped client's label map, where no flipped class keeps its label."""
    ident = np.arange(c)
    while True:
        perm = g.permutation(c)
        if (perm != ident).all():
            return perm
