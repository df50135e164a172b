"""Federated partitioners: split one Dataset into many clients, reproducibly.

Why a module of its own: published federated results depend on exactly how the data were
split among clients, so every split here is a seeded, documented function of (the data set's
*contents*, the seed, the parameters) and of nothing else: not of the order in which a loader
happened to read the files, and not of global random state. Every partitioner first puts the
examples in their canonical order (``canonical_order``: by label, then by a fingerprint of
the example's bytes), draws all its randomness from ``fedray.seeding.rng(seed, TAG, ...)``
with its own tag, and maps the result back to indices into the caller's arrays. Within each
client, indices are listed in canonical order, so two runs on reordered copies of a data set
give the same clients example for example.

``partition(dataset, name, seed, **params)`` is the entry point recipes use; ``PARAMS`` lists
the keyword parameters each partitioner accepts, so a recipe can be checked before anything
runs. Every user-facing problem is a one-line ``FedrayError`` naming ``partitioner.<key>``.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence

import numpy as np

from fedray.data.dataset import Dataset, Split
from fedray.data.partition import Partition
from fedray.errors import FedrayError, key_error
from fedray.seeding import rng

# Stream tags: fixed forever, changing one changes every partition that uses it.
TAG_PACHINKO = 101
TAG_DIRICHLET = 102
TAG_IID = 103
TAG_SIMILARITY = 104
TAG_IMBALANCE = 105
TAG_LABEL_FLIP = 106

DIRICHLET_MAX_ATTEMPTS = 10  # draws of the dirichlet split before short clients are topped up

# ---------------------------------------------------------------------------------------------
# Canonical order
# ---------------------------------------------------------------------------------------------

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
    """The permutation that sorts ``split`` by (label, content fingerprint, coarse, owner).

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
    keys += [fingerprints(split.x), np.asarray(split.y)]
    return np.lexsort(keys).astype(np.int64)


# ---------------------------------------------------------------------------------------------
# Argument checks (one-line FedrayErrors naming partitioner.<key>)
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# Shared helpers
# ---------------------------------------------------------------------------------------------


def _groups(assignment: np.ndarray, k: int) -> list[np.ndarray]:
    """Positions 0..n-1 grouped by their client in ``assignment`` (-1: nobody), ascending."""
    srt = np.argsort(assignment, kind="stable")
    bounds = np.searchsorted(assignment[srt], np.arange(k + 1))
    return [srt[bounds[i]:bounds[i + 1]] for i in range(k)]


def _to_original(order: np.ndarray, parts: list[np.ndarray]) -> list[np.ndarray]:
    """Canonical positions -> indices into the caller's split, kept in canonical order."""
    return [order[np.sort(p)].astype(np.int64) for p in parts]


def _names(k: int) -> list[str]:
    return [str(i) for i in range(k)]


# ---------------------------------------------------------------------------------------------
# pachinko (TFF Fed-CIFAR100)
# ---------------------------------------------------------------------------------------------


def _fine_to_coarse(splits: list[tuple[str, Split]]) -> dict[int, int]:
    """Each fine label's coarse label, read from the data; FedrayError if not a function."""
    y = np.concatenate([np.asarray(s.y, dtype=np.int64) for _, s in splits])
    c = np.concatenate([np.asarray(s.coarse, dtype=np.int64) for _, s in splits])
    pairs = np.unique(np.stack([y, c], axis=1), axis=0)
    fines, counts = np.unique(pairs[:, 0], return_counts=True)
    if (counts > 1).any():
        f = int(fines[np.argmax(counts > 1)])
        seen = sorted(int(v) for v in pairs[pairs[:, 0] == f, 1])
        raise FedrayError(f"partitioner 'pachinko' needs one coarse label per fine label, but "
                          f"fine label {f} appears with coarse labels {seen}")
    return {int(f): int(cc) for f, cc in pairs}


def _pachinko_split(y: np.ndarray, f2c: dict[int, int], num_clients: int, per_client: int,
                    coarse_alpha: float, fine_alpha: float,
                    g: np.random.Generator) -> list[np.ndarray]:
    """Pachinko allocation of one split (labels ``y`` in canonical order): canonical positions.

    Layout: coarse labels are rows, their fine labels are slots of that row (padded). Each
    fine label's examples are shuffled once; "a random example of that label, without
    replacement" is then the next one of its shuffled queue. A client's multinomials are
    fixed arrays; removal of exhausted labels is a mask of what is still available, applied
    at each draw and renormalized. Draws are batched: the draws of one client are i.i.d.
    until a label runs out, so the client's remaining draws are sampled at once (coarse by
    inverse CDF, then fine by inverse CDF within the drawn coarse row) and accepted up to and
    including the first draw that takes a label's last example; the rest are redrawn with the
    updated masks. This is distributionally identical to drawing one by one, and costs
    O(clients + labels) small numpy steps instead of one per example.
    """
    fines = np.unique(y)
    coarses = sorted({f2c[int(f)] for f in fines})
    rows = {c: [int(f) for f in fines if f2c[int(f)] == c] for c in coarses}
    n_rows, width = len(coarses), max(len(v) for v in rows.values())
    valid = np.zeros((n_rows, width), dtype=bool)
    slot_of = {}
    for i, c in enumerate(coarses):
        for j, f in enumerate(rows[c]):
            valid[i, j] = True
            slot_of[f] = i * width + j
    # Shuffled queue of each fine label, laid out slot by slot in one array.
    by_label = np.argsort(y, kind="stable")
    sizes = np.zeros(n_rows * width, dtype=np.int64)
    labels, counts = np.unique(y, return_counts=True)
    for f, cnt in zip(labels, counts, strict=True):
        sizes[slot_of[int(f)]] = cnt
    start = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    queue = np.empty(len(y), dtype=np.int64)
    label_start = np.concatenate([[0], np.cumsum(counts)[:-1]])
    for f, a, cnt in zip(labels, label_start, counts, strict=True):
        s = slot_of[int(f)]
        queue[start[s]:start[s] + cnt] = g.permutation(by_label[a:a + cnt])
    remaining = sizes.copy()
    taken = np.zeros_like(sizes)

    clients = []
    for _ in range(num_clients):
        p_coarse = g.dirichlet(np.full(n_rows, coarse_alpha))
        q_fine = g.gamma(fine_alpha, size=(n_rows, width)) * valid  # rows ~ Dirichlet(fine)
        got: list[np.ndarray] = []
        need = per_client
        while need:
            avail = (remaining > 0).reshape(n_rows, width)
            row_avail = avail.any(axis=1)
            q = np.where(avail, q_fine, 0.0)
            empty = row_avail & ~(q.sum(axis=1) > 0)  # underflow guard: uniform over what's left
            q[empty] = avail[empty]
            p = np.where(row_avail, p_coarse, 0.0)
            if not p.sum() > 0:
                p = row_avail.astype(float)
            u = g.random((need, 2))
            cum = np.cumsum(p)
            ci = np.minimum(np.searchsorted(cum, u[:, 0] * cum[-1], side="right"), n_rows - 1)
            qcum = np.cumsum(q[ci], axis=1)
            fj = np.minimum((qcum <= (u[:, 1] * qcum[:, -1])[:, None]).sum(axis=1), width - 1)
            slots = ci * width + fj
            # occurrence number of each draw among earlier draws of the same slot
            srt = np.argsort(slots, kind="stable")
            ss = slots[srt]
            first = np.searchsorted(ss, ss, side="left")
            occ = np.empty(need, dtype=np.int64)
            occ[srt] = np.arange(need) - first
            hit = occ + 1 >= remaining[slots]
            stop = int(np.argmax(hit)) + 1 if hit.any() else need
            slots, occ = slots[:stop], occ[:stop]
            got.append(queue[start[slots] + taken[slots] + occ])
            used = np.bincount(slots, minlength=len(sizes))
            taken += used
            remaining -= used
            need -= stop
        clients.append(np.concatenate(got))
    return clients


def pachinko(dataset: Dataset, seed: int, num_clients: int | None = None,
             examples_per_client: int = 100, coarse_alpha: float = 0.1,
             fine_alpha: float = 10.0) -> Partition:
    """Fed-CIFAR100's Pachinko Allocation Method (TFF; Reddi et al., "Adaptive Federated
    Optimization").

    TFF describes it as a "hierarchical Latent Dirichlet Allocation (LDA) process": every
    client has a multinomial over the coarse labels, drawn from a symmetric Dirichlet with
    parameter 0.1 (``coarse_alpha``), and, for each coarse label, a coarse-to-fine multinomial
    over the fine labels under it, drawn from a symmetric Dirichlet with parameter 10
    (``fine_alpha``). Each client has 100 examples (``examples_per_client``); each one is
    made by drawing a coarse label from the client's coarse multinomial, then a fine label
    from that coarse label's coarse-to-fine multinomial, then "randomly draw[ing] a sample
    ... with that label (without replacement)". When a fine label runs out of examples it is
    removed from every client's coarse-to-fine multinomial, which is renormalized; a coarse
    label left with no fine labels is likewise removed from the coarse multinomials.

    The train split and the test split are partitioned independently (streams
    ``rng(seed, TAG_PACHINKO, 0)`` and ``(..., 1)``), clients one after the other, each
    getting exactly ``examples_per_client`` examples. The fine -> coarse mapping is read
    from the data (``coarse`` labels are required, and each fine label must have exactly one
    coarse label); the Dirichlets range over the coarse labels present in the split and, per
    coarse label, over its fine labels present in the split.

    Client counts: by default ``len(train) // examples_per_client`` train clients and
    ``len(test) // examples_per_client`` test clients (CIFAR-100: 500 and 100). With
    ``num_clients`` given, that many train clients and ``min(num_clients,
    len(test) // examples_per_client)`` test clients. Test clients are other people than the
    train clients (as in TFF), but the Partition indexes both by client position: it has
    ``max(train clients, test clients)`` clients named "0".."N-1", and a client beyond a
    split's count has an empty array there (TFF: "0".."99" have train and test data,
    "100".."499" train data only). Examples beyond ``clients * examples_per_client`` in a
    split are not assigned (``info["unassigned_train"]``/``["unassigned_test"]``; zero with
    the defaults on CIFAR-100). With no test split, ``Partition.test`` is None.
    """
    seed = _seed(seed)
    per = _int("examples_per_client", examples_per_client, 1)
    ca = _positive("coarse_alpha", coarse_alpha)
    fa = _positive("fine_alpha", fine_alpha)
    splits = [("train", dataset.train)]
    if dataset.test is not None and len(dataset.test):
        splits.append(("test", dataset.test))
    for split_name, split in splits:
        if split.coarse is None:
            raise FedrayError(f"partitioner 'pachinko' needs coarse labels, but the {split_name} "
                              f"split of {dataset.name!r} has none")
    n_train = len(dataset.train)
    if n_train < per:
        raise _bad("examples_per_client",
                   f"must be <= the number of train examples ({n_train})", examples_per_client)
    if num_clients is None:
        k_train = n_train // per
    else:
        k_train = _int("num_clients", num_clients, 1)
        if k_train * per > n_train:
            raise _bad("num_clients", f"times examples_per_client ({per}) must be <= the "
                       f"number of train examples ({n_train})", num_clients)
    f2c = _fine_to_coarse(splits)
    counts = {"train": k_train}
    if len(splits) == 2:
        n_test = len(dataset.test)
        if n_test < per:
            raise _bad("examples_per_client",
                       f"must be <= the number of test examples ({n_test})", examples_per_client)
        counts["test"] = n_test // per if num_clients is None else min(k_train, n_test // per)
    total = max(counts.values())
    out: dict[str, list[np.ndarray]] = {}
    info: dict = {"train_clients": k_train}
    for tag, (split_name, split) in enumerate(splits):
        order = canonical_order(split)
        y = np.asarray(split.y, dtype=np.int64)[order]
        parts = _pachinko_split(y, f2c, counts[split_name], per, ca, fa,
                                rng(seed, TAG_PACHINKO, tag))
        lists = _to_original(order, parts)
        lists += [np.zeros(0, dtype=np.int64)] * (total - len(lists))
        out[split_name] = lists
        info[f"{split_name}_clients"] = counts[split_name]
        info[f"unassigned_{split_name}"] = len(split) - counts[split_name] * per
    test = out.get("test")
    if test is None and dataset.test is not None:  # an empty test split: nothing to share
        test = [np.zeros(0, dtype=np.int64)] * total
    return Partition(_names(total), out["train"], test, info=info)


# ---------------------------------------------------------------------------------------------
# natural
# ---------------------------------------------------------------------------------------------


def _by_owner(split: Split, k: int, what: str) -> list[np.ndarray]:
    owner = np.asarray(split.owner, dtype=np.int64)
    if len(owner) and (owner.min() < 0 or owner.max() >= k):
        bad = int(owner[(owner < 0) | (owner >= k)][0])
        raise FedrayError(f"partitioner 'natural': {what} owner id {bad} is outside the "
                          f"{k} owners of the data set")
    order = canonical_order(split)
    return [order[p] for p in _groups(owner[order], k)]


def natural(dataset: Dataset, seed: int, min_examples: int = 0) -> Partition:
    """One client per natural id (the writer, the user, ...): the source's own federation.

    Client k is ``dataset.owners[k]``; its train examples are those with ``train.owner == k``
    and its test examples those with ``test.owner == k`` (the source's own train/test split
    is kept; a client with no examples in a split gets an empty array there). If the data set
    has no test split, or its test split has no owners, ``Partition.test`` is None (the test
    split, if any, stays one central test set).

    Drop rule: clients with fewer than ``min_examples`` train examples are dropped, together
    with their test examples; ``info["dropped_clients"]`` counts them and
    ``info["dropped_train_examples"]`` / ``["dropped_test_examples"]`` count their examples.
    With the default 0 every owner is kept, even one with no examples at all. ``seed`` is
    unused: the split is deterministic.
    """
    _seed(seed)
    m = _int("min_examples", min_examples, 0)
    if dataset.owners is None or dataset.train.owner is None:
        raise FedrayError(f"partitioner 'natural' needs natural client ids (owners), but "
                          f"{dataset.name!r} has none")
    owners = [str(o) for o in dataset.owners]
    if len(set(owners)) != len(owners):
        raise FedrayError(f"partitioner 'natural': the owners of {dataset.name!r} are not unique")
    k = len(owners)
    train = _by_owner(dataset.train, k, "train")
    test = None
    if dataset.test is not None and dataset.test.owner is not None:
        test = _by_owner(dataset.test, k, "test")
    keep = [i for i in range(k) if len(train[i]) >= m]
    dropped = [i for i in range(k) if len(train[i]) < m]
    info = {"min_examples": m, "dropped_clients": len(dropped),
            "dropped_train_examples": int(sum(len(train[i]) for i in dropped)),
            "dropped_test_examples": int(sum(len(test[i]) for i in dropped)) if test else 0}
    return Partition([owners[i] for i in keep], [train[i].astype(np.int64) for i in keep],
                     None if test is None else [test[i].astype(np.int64) for i in keep],
                     info=info)


# ---------------------------------------------------------------------------------------------
# dirichlet
# ---------------------------------------------------------------------------------------------


def _top_up(client: np.ndarray, k: int, min_examples: int) -> int:
    """Give every client ``min_examples`` by moving examples from the largest clients.

    Clients short of the minimum, in id order, take examples from the largest clients (in
    decreasing size, ties by id), each donor keeping at least the minimum; a donor gives its
    examples that come last in canonical order. Returns how many examples moved.
    """
    counts = np.bincount(client, minlength=k)
    short = np.flatnonzero(counts < min_examples)
    need = int((min_examples - counts[short]).sum())
    if need == 0:
        return 0
    moved: list[np.ndarray] = []
    got = 0
    for d in np.lexsort((np.arange(k), -counts)):
        spare = int(counts[d]) - min_examples
        if spare <= 0 or got >= need:
            break
        take = min(spare, need - got)
        moved.append(np.flatnonzero(client == d)[-take:])
        got += take
    pool = np.concatenate(moved)
    receivers = np.repeat(short, min_examples - counts[short])
    client[pool] = receivers
    return need


def _dirichlet_positions(y: np.ndarray, k: int, alpha: float, sigma: float, min_examples: int,
                         g: np.random.Generator) -> tuple[list[np.ndarray], int, int]:
    """The label-Dirichlet split of labels ``y`` (canonical order).

    Returns the positions per client, the draws used and how many examples were moved to
    top up short clients."""
    n = len(y)
    classes = np.unique(y)
    members = [np.flatnonzero(y == c) for c in classes]
    for attempt in range(1, DIRICHLET_MAX_ATTEMPTS + 1):
        if sigma > 0:
            target = g.lognormal(0.0, sigma, size=k)
            target *= n / target.sum()
        else:
            target = np.full(k, n / k)
        client = np.empty(n, dtype=np.int64)
        for pos in members:
            w = g.dirichlet(np.full(k, alpha)) * target
            if not (np.isfinite(w).all() and w.sum() > 0):
                w = target.copy()
            cuts = np.floor(np.cumsum(w / w.sum())[:-1] * len(pos)).astype(np.int64)
            cuts = np.clip(cuts, 0, len(pos))
            counts = np.diff(np.concatenate([[0], cuts, [len(pos)]]))
            client[g.permutation(pos)] = np.repeat(np.arange(k), counts)
        if np.bincount(client, minlength=k).min() >= min_examples:
            return _groups(client, k), attempt, 0
    moved = _top_up(client, k, min_examples)
    return _groups(client, k), DIRICHLET_MAX_ATTEMPTS, moved


def dirichlet(dataset: Dataset, seed: int, num_clients: int, alpha: float, sigma: float = 0.0,
              min_examples: int = 1) -> Partition:
    """Label-Dirichlet split (Hsu et al., "Measuring the Effects of Non-Identical Data
    Distribution for Federated Visual Classification"; the common "label Dirichlet" split).

    "For each class, split that class's examples among clients with proportions drawn from
    Dirichlet(alpha)": small ``alpha`` gives each client few classes, large ``alpha``
    approaches an i.i.d. split. Exact procedure, on the canonical order, with the stream
    ``rng(seed, TAG_DIRICHLET)``:

    1. target sizes t_k: with ``sigma > 0``, t_k ~ LogNormal(0, sigma) for k = 1..K, scaled
       to sum to n (the number of train examples); with ``sigma == 0``, t_k = n / K (no draw);
    2. for each class c in increasing label order: p ~ Dirichlet(alpha * 1_K), weights
       w_k = p_k * t_k / sum_j p_j t_j, the class's examples are shuffled and cut at
       floor(cumsum(w) * n_c), client k getting the k-th piece (so client sizes follow the
       targets in expectation, and sigma > 0 makes them unbalanced);
    3. if some client has fewer than ``min_examples`` examples, steps 1-2 are redone with the
       next draws of the same stream, at most DIRICHLET_MAX_ATTEMPTS (10) times in all;
    4. if the last draw still leaves clients short (likely with very many small clients, e.g.
       100,000 clients of ~5 examples), they are topped up: each short client, in id order,
       takes examples from the largest clients (largest first, each keeping at least
       ``min_examples``). ``info["topped_up_examples"]`` records how many moved (0 when a
       draw succeeded).

    Every train example goes to exactly one client. The test split stays central
    (``Partition.test`` is None). ``info["attempts"]`` records the attempt used.
    """
    seed = _seed(seed)
    n = len(dataset.train)
    k = _num_clients(num_clients, n)
    a = _positive("alpha", alpha)
    s = _number("sigma", sigma)
    if s < 0:
        raise _bad("sigma", "must be >= 0", sigma)
    m = _int("min_examples", min_examples, 0)
    if m * k > n:
        raise _bad("min_examples", f"cannot give every client {m} examples: {k} clients x {m} "
                   f"> {n} train examples", m)
    order = canonical_order(dataset.train)
    y = np.asarray(dataset.train.y, dtype=np.int64)[order]
    parts, attempts, moved = _dirichlet_positions(y, k, a, s, m, rng(seed, TAG_DIRICHLET))
    train = _to_original(order, parts)
    sizes = [len(t) for t in train]
    return Partition(_names(k), train,
                     info={"attempts": attempts, "topped_up_examples": moved,
                           "min_size": min(sizes), "max_size": max(sizes)})


# ---------------------------------------------------------------------------------------------
# iid
# ---------------------------------------------------------------------------------------------


def iid(dataset: Dataset, seed: int, num_clients: int) -> Partition:
    """An i.i.d. split: shuffle the train examples and cut them into ``num_clients`` parts.

    Sizes differ by at most one (the first ``n % num_clients`` clients get the extra one).
    Every train example goes to exactly one client; the test split stays central.
    """
    seed = _seed(seed)
    n = len(dataset.train)
    k = _num_clients(num_clients, n)
    order = canonical_order(dataset.train)
    perm = rng(seed, TAG_IID).permutation(n)
    return Partition(_names(k), _to_original(order, np.array_split(perm, k)))


# ---------------------------------------------------------------------------------------------
# similarity
# ---------------------------------------------------------------------------------------------


def similarity(dataset: Dataset, seed: int, num_clients: int, similarity: float) -> Partition:
    """SCAFFOLD's similarity split (Karimireddy et al., Sec. 7): "each client gets s% i.i.d.
    data and the remaining (100 - s)% by sorting according to label".

    ``similarity`` is s as a fraction in [0, 1]. round(s * n) train examples, chosen at
    random, form the i.i.d. pool, which is shuffled and dealt into ``num_clients`` near-equal
    parts (the first ``a % K`` parts one larger); the other examples are sorted by label
    (then by canonical order) and cut into ``num_clients`` contiguous near-equal chunks (the
    last ``b % K`` chunks one larger, so every client gets at least one example); client k
    gets i.i.d. part k and sorted chunk k. Client sizes differ by at most one. s = 1 is an
    i.i.d. split, s = 0 gives each client a narrow band of labels. Every train example is
    assigned; the test split stays central.
    """
    seed = _seed(seed)
    n = len(dataset.train)
    k = _num_clients(num_clients, n)
    s = _fraction("similarity", similarity)
    order = canonical_order(dataset.train)  # canonical positions are sorted by label
    perm = rng(seed, TAG_SIMILARITY).permutation(n)
    n_iid = round(s * n)
    iid_parts = np.array_split(perm[:n_iid], k)
    rest = np.sort(perm[n_iid:])
    b = len(rest)
    sizes = np.full(k, b // k)
    sizes[k - b % k:] += 1  # empty slice when b % k == 0
    sorted_parts = np.split(rest, np.cumsum(sizes)[:-1])
    parts = [np.concatenate([p, q]) for p, q in zip(iid_parts, sorted_parts, strict=True)]
    return Partition(_names(k), _to_original(order, parts),
                     info={"iid_examples": int(n_iid), "sorted_examples": int(b)})


# ---------------------------------------------------------------------------------------------
# imbalance
# ---------------------------------------------------------------------------------------------


def _largest_remainder(shares: np.ndarray, total: int) -> np.ndarray:
    """Integers proportional to ``shares`` summing to ``total`` (ties: lower index first)."""
    raw = shares / shares.sum() * total
    out = np.floor(raw).astype(np.int64)
    short = total - int(out.sum())
    if short > 0:
        out[np.argsort(-(raw - out), kind="stable")[:short]] += 1
    return out


def imbalance(dataset: Dataset, seed: int, num_clients: int,
              ratios: Sequence[float] = (1.0, 0.5, 0.1, 0.05, 0.01, 0.005, 0.001)) -> Partition:
    """Exponential class imbalance per client (the Exp-alpha style split).

    Each client draws an imbalance ratio rho uniformly from ``ratios`` and a random order of
    the C classes present in the train split; the class in position c (c = 0..C-1) gets a
    share proportional to rho^(c / (C - 1)), so the first class is the client's majority and
    the last has rho times as many examples (rho = 1: balanced). The client's budget is
    B = n // num_clients examples, so n_max = B / sum_c rho^(c / (C - 1)) and its target class
    sizes n_c = n_max * rho^(c / (C - 1)) are rounded to integers summing to B (largest
    remainder). Clients are served in order 0..K-1 from one shared pool (each class's examples
    shuffled once), without replacement, so every example is used at most once.

    Drop rules: (1) a client whose target exceeds what is left of a class gets what is left,
    and the shortfall is not refilled from other classes (that would flatten the client's
    imbalance profile); (2) examples nobody takes are not assigned to any client:
    ``info["unassigned"]`` counts them (at least n - K * B). Exception to (1): a client left
    with no example at all takes one of the class with the most examples left (the pool never
    runs dry, since each earlier client took at most B), so every client has >= 1 example.
    ``info["client_ratios"]`` records each client's rho. The test split stays central.
    """
    seed = _seed(seed)
    n = len(dataset.train)
    k = _num_clients(num_clients, n)
    rhos = _ratio_list("ratios", ratios)
    order = canonical_order(dataset.train)
    y = np.asarray(dataset.train.y, dtype=np.int64)[order]
    g = rng(seed, TAG_IMBALANCE)
    classes = np.unique(y)
    c_count = len(classes)
    pools = [g.permutation(np.flatnonzero(y == c)) for c in classes]
    used = np.zeros(c_count, dtype=np.int64)
    left = np.array([len(p) for p in pools], dtype=np.int64)
    budget = n // k
    expo = np.arange(c_count) / (c_count - 1) if c_count > 1 else np.zeros(1)
    parts, client_ratios = [], []
    for _ in range(k):
        rho = rhos[int(g.integers(len(rhos)))]
        rank = g.permutation(c_count)  # rank[c]: position of class c in this client's order
        target = _largest_remainder(rho ** expo[rank], budget)
        take = np.minimum(target, left)
        if take.sum() == 0:
            take[int(np.argmax(left))] = 1
        got = [pools[c][used[c]:used[c] + take[c]] for c in np.flatnonzero(take)]
        used += take
        left -= take
        parts.append(np.concatenate(got))
        client_ratios.append(rho)
    return Partition(_names(k), _to_original(order, parts),
                     info={"unassigned": int(left.sum()), "budget": budget,
                           "client_ratios": client_ratios})


# ---------------------------------------------------------------------------------------------
# label_flip
# ---------------------------------------------------------------------------------------------


def _derangement(c: int, g: np.random.Generator) -> np.ndarray:
    """A uniformly random permutation of 0..c-1 without fixed points (rejection sampling)."""
    ident = np.arange(c)
    while True:
        perm = g.permutation(c)
        if (perm != ident).all():
            return perm


def label_flip(dataset: Dataset, seed: int, num_clients: int, corruption: float = 1 / 3,
               flip_ratio: float = 1.0, base: str = "iid", alpha: float = 0.5) -> Partition:
    """Label-flipping corruption on top of an iid or dirichlet split.

    First the train split is partitioned with ``base`` ("iid", or "dirichlet" with ``alpha``
    and the defaults sigma = 0, min_examples = 1) under the same seed. Then, with the stream
    ``rng(seed, TAG_LABEL_FLIP)``: round(corruption * num_clients) clients (Python's round)
    are picked at random as corrupted; for each of them, in client order, a permutation of
    the classes without fixed points (a uniformly random derangement, so class c -> perm[c]
    != c) is drawn, and round(flip_ratio * size) of its train examples, chosen at random,
    get label perm[y]. ``Partition.train_labels`` holds every client's labels (unchanged
    copies for clean clients). ``info``: "flipped_clients" (names), "flip_maps" (name ->
    perm as a list), "flipped_examples" (total relabelled), plus "base" and "base_info". A
    corrupted client with round(flip_ratio * size) == 0 is listed but keeps its labels.
    """
    seed = _seed(seed)
    n = len(dataset.train)
    k = _num_clients(num_clients, n)
    corrupt = _fraction("corruption", corruption)
    ratio = _fraction("flip_ratio", flip_ratio)
    a = _positive("alpha", alpha)
    if _base("base", base) == "iid":
        part = iid(dataset, seed, k)
    else:
        part = dirichlet(dataset, seed, k, a)
    y = np.asarray(dataset.train.y, dtype=np.int64)
    c_count = max(int(dataset.num_classes), int(y.max()) + 1 if n else 0)
    if c_count < 2:
        raise FedrayError("partitioner 'label_flip' needs at least 2 classes")
    g = rng(seed, TAG_LABEL_FLIP)
    bad = np.sort(g.choice(k, size=round(corrupt * k), replace=False))
    labels = [y[idx].copy() for idx in part.train]
    flip_maps: dict[str, list[int]] = {}
    flipped = 0
    for i in bad:
        perm = _derangement(c_count, g)
        sel = g.choice(len(labels[i]), size=round(ratio * len(labels[i])), replace=False)
        labels[i][sel] = perm[labels[i][sel]]
        flip_maps[part.client_names[i]] = [int(v) for v in perm]
        flipped += len(sel)
    info = {"base": base, "base_info": part.info,
            "flipped_clients": [part.client_names[i] for i in bad],
            "flip_maps": flip_maps, "flipped_examples": int(flipped)}
    return Partition(part.client_names, part.train, part.test, train_labels=labels, info=info)


# ---------------------------------------------------------------------------------------------
# Registry and dispatch
# ---------------------------------------------------------------------------------------------

PARTITIONERS: dict[str, Callable[..., Partition]] = {
    "pachinko": pachinko,
    "natural": natural,
    "dirichlet": dirichlet,
    "iid": iid,
    "similarity": similarity,
    "imbalance": imbalance,
    "label_flip": label_flip,
}


def _params(fn: Callable[..., Partition]) -> tuple[set[str], set[str]]:
    """(all keyword parameters, required ones) of a partitioner, from its signature."""
    sig = list(inspect.signature(fn).parameters.values())[2:]  # skip dataset, seed
    return ({p.name for p in sig},
            {p.name for p in sig if p.default is inspect.Parameter.empty})


PARAMS: dict[str, set[str]] = {name: _params(fn)[0] for name, fn in PARTITIONERS.items()}
_REQUIRED: dict[str, set[str]] = {name: _params(fn)[1] for name, fn in PARTITIONERS.items()}


def check_params(name: str, seed: int, params: dict) -> None:
    """Everything about a partitioner call that can be checked without the data.

    Recipes call this before reading any source, so a typo'd key or ``alpha: 0`` fails in
    a second rather than after loading CIFAR-100.
    """
    if name not in PARTITIONERS:
        raise key_error("partitioner.name", f"must be one of: {', '.join(PARTITIONERS)}", name,
                        what="recipe")
    for key in params:
        if key not in PARAMS[name]:
            takes = ", ".join(sorted(PARAMS[name])) or "no parameters"
            raise key_error(f"partitioner.{key}", f"is not used by {name!r} (it takes: {takes})",
                            what="recipe")
    missing = sorted(_REQUIRED[name] - params.keys())
    if missing:
        raise key_error(f"partitioner.{missing[0]}", f"is required by {name!r}", what="recipe")
    _seed(seed)
    for key, value in params.items():
        if key in _RULES and value is not None:
            _RULES[key](key, value)


def partition(dataset: Dataset, name: str, seed: int, **params: object) -> Partition:
    """Partition ``dataset`` with the partitioner ``name`` (a key of PARTITIONERS).

    Unknown names, parameters the partitioner does not take, missing required parameters and
    invalid values are FedrayErrors naming the partitioner or ``partitioner.<key>``.
    """
    check_params(name, seed, params)
    return PARTITIONERS[name](dataset, seed, **params)
