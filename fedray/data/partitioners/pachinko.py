"""pachinko: Fed-CIFAR100's Pachinko Allocation (TFF; Reddi et al.), coarse then fine
labels per client."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fedray.core.seeding import rng
from fedray.data.examples import Split
from fedray.data.partition import Partition
from fedray.data.partitioners.common import (
    TAG_PACHINKO,
    _bad,
    _int,
    _names,
    _positive,
    _seed,
    _to_original,
    canonical_order,
)
from fedray.errors import FedrayError

if TYPE_CHECKING:  # a Dataset (fedray.data.dataset) uses this module: its type only
    from fedray.data.dataset import Dataset


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
