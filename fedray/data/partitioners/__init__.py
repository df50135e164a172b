"""Federated partitioners: split one Dataset into many clients, reproducibly.

One module per partitioner (common.py holds what they share). Why they are apart from the
loaders: published federated results depend on exactly how the data were
split among clients, so every split here is a seeded, documented function of (the data set's
*contents*, the seed, the parameters) and of nothing else: not of the order in which a loader
happened to read the files, and not of global random state. Every partitioner first puts the
examples in their canonical order (``canonical_order``: by label, then by a fingerprint of
the example's bytes), draws all its randomness from ``fedray.core.seeding.rng(seed, TAG, ...)``
with its own tag, and maps the result back to indices into the caller's arrays. Within each
client, indices are listed in canonical order, so two runs on reordered copies of a data set
give the same clients example for example.

``partition(dataset, name, seed, **params)`` is the entry point recipes use; ``PARAMS`` lists
the keyword parameters each partitioner accepts, so a recipe can be checked before anything
runs. Every user-facing problem is a one-line ``FedrayError`` naming ``partitioner.<key>``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from fedray.data.partition import Partition
from fedray.data.partitioners.common import _RULES, _seed, canonical_order, fingerprints
from fedray.data.partitioners.continuous import continuous
from fedray.data.partitioners.dirichlet import dirichlet
from fedray.data.partitioners.grouped_natural import grouped_natural
from fedray.data.partitioners.iid import iid
from fedray.data.partitioners.imbalance import imbalance
from fedray.data.partitioners.inner_dirichlet import inner_dirichlet
from fedray.data.partitioners.label_flip import label_flip
from fedray.data.partitioners.natural import natural
from fedray.data.partitioners.pachinko import pachinko
from fedray.data.partitioners.shard import shard
from fedray.data.partitioners.similarity import similarity
from fedray.data.partitioners.size import check_size_params, size
from fedray.errors import key_error

if TYPE_CHECKING:  # a Dataset (fedray.data.dataset) uses this module: its type only
    from fedray.data.dataset import Dataset

__all__ = ["PARAMS", "PARTITIONERS", "canonical_order", "check_params", "fingerprints",
           "partition"]

PARTITIONERS: dict[str, Callable[..., Partition]] = {
    "pachinko": pachinko,
    "natural": natural,
    "dirichlet": dirichlet,
    "iid": iid,
    "similarity": similarity,
    "imbalance": imbalance,
    "label_flip": label_flip,
    "shard": shard,
    "size": size,
    "continuous": continuous,
    "grouped_natural": grouped_natural,
    "inner_dirichlet": inner_dirichlet,
}

# what a partitioner refuses of its parameters together, still without the data
_JOINT_CHECKS: dict[str, Callable[[dict], None]] = {"size": check_size_params}


def _params(fn: Callable[..., Partition]) -> tuple[set[str], set[str]]:
    """(all keyword parameters, required ones) of a partitioner, from its signature."""
    sig = list(inspect.signature(fn).parameters.values())[2:]  # skip dataset, seed
    return ({p.name for p in sig},
            {p.name for p in sig if p.default is inspect.Parameter.empty})


# the partitioners that never read a label as a class: they take sequence labels as they are
SEQUENCE_LABEL_PARTITIONERS = ("natural", "iid", "size", "grouped_natural")

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
    if name in _JOINT_CHECKS:
        _JOINT_CHECKS[name]({k: v for k, v in params.items() if v is not None})


def partition(dataset: Dataset, name: str, seed: int, **params: object) -> Partition:
    """Partition ``dataset`` with the partitioner ``name`` (a key of PARTITIONERS).

    Unknown names, parameters the partitioner does not take, missing required parameters and
    invalid values are FedrayErrors naming the partitioner or ``partitioner.<key>``.
    """
    check_params(name, seed, params)
    if np.asarray(dataset.train.y).ndim > 1 and name not in SEQUENCE_LABEL_PARTITIONERS:
        raise key_error("partitioner.name", f"{dataset.name!r} has a sequence of labels per "
                        f"example, which {name!r} cannot split by class; use one of: "
                        f"{', '.join(SEQUENCE_LABEL_PARTITIONERS)}", name, what="recipe")
    return PARTITIONERS[name](dataset, seed, **params)
