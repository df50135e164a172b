"""Named loaders for the on-disk data sets, so a job config can say which one it reads.

A config names a source (``source.name``) and a local path (``source.path``); this registry
turns that pair into a Dataset and reports a wrong name or a missing path as a one-line
FedrayError before any loader starts reading. ``LOADERS`` read the official formats of
published data sets; ``GENERIC_LOADERS`` read a user's own data, and take the recipe's
column keys as options (``fedray.data.sources.columns.SOURCE_KEYS``).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from fedray.data.dataset import Dataset
from fedray.data.sources.arrays import load_npz
from fedray.data.sources.cifar100 import load_cifar100
from fedray.data.sources.hf_disk import from_hf_disk
from fedray.data.sources.leaf import load_leaf_femnist
from fedray.data.sources.mnist import load_mnist
from fedray.data.sources.shakespeare import (
    load_leaf_shakespeare,
    load_shakespeare_folio,
    load_tff_shakespeare,
)
from fedray.data.sources.table import from_table
from fedray.data.sources.tff import load_tff_cifar100, load_tff_emnist
from fedray.errors import FedrayError, key_error

LOADERS: dict[str, Callable[[str], Dataset]] = {
    "leaf_femnist": load_leaf_femnist,
    "tff_emnist": load_tff_emnist,
    "tff_cifar100": load_tff_cifar100,
    "cifar100": load_cifar100,
    "mnist": load_mnist,
    "leaf_shakespeare": load_leaf_shakespeare,
    "tff_shakespeare": load_tff_shakespeare,
    "shakespeare_folio": load_shakespeare_folio,
}

# your own data: an .npz of arrays, a CSV / parquet table, a Hugging Face save_to_disk directory
GENERIC_LOADERS: dict[str, Callable[..., Dataset]] = {
    "numpy": load_npz,
    "table": from_table,  # the Python calls themselves: one implementation
    "hf_disk": from_hf_disk,
}


def load_source(name: str, path: str, **options: object) -> Dataset:
    """Load data set ``name`` (a key of LOADERS or GENERIC_LOADERS) from the local path
    ``path``; ``options`` go to the loader (``shakespeare_folio``'s ``test_fraction``, the
    column keys of numpy, table and hf_disk)."""
    loader = LOADERS.get(name) or GENERIC_LOADERS.get(name)
    if loader is None:
        raise key_error("source.name", f"must be one of: {', '.join([*LOADERS, *GENERIC_LOADERS])}",
                        name, what="recipe")
    path = os.path.expanduser(os.fspath(path))
    if not os.path.exists(path):
        raise key_error("source.path", f"{path} does not exist", what="recipe")
    dataset = loader(path, **options)
    if len(dataset.train) == 0:  # each loader says it naming its file; this is for any other
        raise FedrayError(f"{path}: source {name} found no train examples there")
    return dataset
