"""label_flip: an iid or dirichlet split with some clients' labels permuted (corrupted
clients)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fedray.core.seeding import rng
from fedray.data.partition import Partition
from fedray.data.partitioners.common import (
    TAG_LABEL_FLIP,
    _base,
    _fraction,
    _num_clients,
    _positive,
    _seed,
    derangement,
)
from fedray.data.partitioners.dirichlet import dirichlet
from fedray.data.partitioners.iid import iid
from fedray.errors import FedrayError

if TYPE_CHECKING:  # a Dataset (fedray.data.dataset) uses this module: its type only
    from fedray.data.dataset import Dataset


def label_flip(
    dataset: Dataset,
    seed: int,
    num_clients: int,
    corruption: float = 1 / 3,
    flip_ratio: float = 1.0,
    base: str = "iid",
    alpha: float = 0.5,
) -> Partition:
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

    Static: the corruption holds for the whole run, and ``flip_ratio`` is a share of the
    client's *examples*. Seed 003's protocol re-draws the corruption every round and counts
    its flip ratio in *classes* (seed 003 lines 156, 173): the job key
    ``data.per_round.label_flip`` (fedray.data.transforms.per_round).
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
        perm = derangement(c_count, g)
        sel = g.choice(len(labels[i]), size=round(ratio * len(labels[i])), replace=False)
        labels[i][sel] = perm[labels[i][sel]]
        flip_maps[part.client_names[i]] = [int(v) for v in perm]
        flipped += len(sel)
    info = {
        "base": base,
        "base_info": part.info,
        "flipped_clients": [part.client_names[i] for i in bad],
        "flip_maps": flip_maps,
        "flipped_examples": int(flipped),
    }
    return Partition(part.client_names, part.train, part.test, train_labels=labels, info=info)
