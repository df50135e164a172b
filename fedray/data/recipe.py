"""Partition recipes: source -> partitioner -> store, as ``fedray partition RECIPE.yaml`` runs.

A recipe names a raw data set in its official format (``source``), how to split it into
clients (``partitioner`` and its parameters), a seed and where the store goes (``out``).
It is validated completely -- unknown keys, wrong types, parameters the partitioner does not
take, impossible values -- before any data is read, and the store is written to a temporary
location first, so a failed build leaves nothing behind.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from fedray.config import load_structured
from fedray.core.seeding import TAG_TEST_HOLDOUT, rng
from fedray.data.dataset import Dataset
from fedray.errors import ConfigError, key_error
from fedray.state.redact import mask_tree
from fedray.state.storage import absolute_url, check_writable, filesystem, storage_failure


@dataclass
class SourceSpec:
    # leaf_femnist | tff_emnist | tff_cifar100 | cifar100 | mnist | leaf_shakespeare |
    # tff_shakespeare | shakespeare_folio | synthetic
    name: str = ""
    path: str | None = None  # where the raw files are (not used by 'synthetic')
    num_writers: int = 1000  # synthetic only: writers to generate
    min_examples: int = 30  # synthetic only
    max_examples: int = 90  # synthetic only
    seed: int = 0  # synthetic only: identity of the generated data
    # shakespeare_folio only: the share of each role's speeches (its last ones) held out as
    # that role's test data (fedray.data.shakespeare.load_shakespeare_folio)
    client_test_fraction: float = 0.2


@dataclass
class Recipe:
    name: str = "partition"
    seed: int = 0
    source: SourceSpec = field(default_factory=SourceSpec)
    partitioner: dict[str, Any] = field(default_factory=lambda: {"name": ""})
    out: str | None = None  # path or fsspec URL of the store to create
    shard_mb: float = 64.0  # target size of a shard file
    # hold out this fraction of the train split as the central test set, stratified by label
    # (for sources that ship no test split, e.g. MNIST's t10k files alone)
    test_fraction: float = 0.0


def load_recipe(source: Any, overrides: list[str] | tuple = ()) -> DictConfig:
    """Load and validate a recipe; reads no data."""
    from fedray.data.loaders import LOADERS
    from fedray.data.partitioners import PARAMS, check_params

    cfg = load_structured(Recipe, source, overrides, what="recipe", kind="recipe")
    sources = [*LOADERS, "synthetic"]
    if cfg.source.name not in sources:
        raise ConfigError(f"recipe key 'source.name': must be one of: {', '.join(sources)}, "
                          f"got {cfg.source.name!r}")
    if cfg.source.name != "synthetic" and not cfg.source.path:
        raise ConfigError(f"recipe key 'source.path': where the raw {cfg.source.name} files "
                          f"are, e.g. source.path=PATH/{cfg.source.name}")
    pname = cfg.partitioner.get("name", "")
    if pname not in PARAMS:
        raise ConfigError(f"recipe key 'partitioner.name': must be one of: {', '.join(PARAMS)}, "
                          f"got {pname!r}")
    check_params(pname, cfg.seed, _partitioner_params(cfg))
    if not cfg.out:
        raise ConfigError("recipe key 'out': where to write the store, e.g. out=stores/femnist")
    if cfg.shard_mb <= 0:
        raise ConfigError(f"recipe key 'shard_mb': must be > 0, got {cfg.shard_mb}")
    if not 0.0 <= cfg.test_fraction < 1.0:
        raise ConfigError(f"recipe key 'test_fraction': must be in [0, 1), got {cfg.test_fraction}")
    s = cfg.source
    if not 0.0 <= s.client_test_fraction < 1.0:
        raise ConfigError(f"recipe key 'source.client_test_fraction': must be in [0, 1), got "
                          f"{s.client_test_fraction}")
    if s.name == "synthetic" and not (1 <= s.min_examples <= s.max_examples and s.num_writers >= 1):
        raise ConfigError("recipe keys 'source.num_writers/min_examples/max_examples': need "
                          "num_writers >= 1 and 1 <= min_examples <= max_examples")
    OmegaConf.set_readonly(cfg, True)
    return cfg


def _partitioner_params(cfg: DictConfig) -> dict[str, Any]:
    return {k: v for k, v in OmegaConf.to_container(cfg.partitioner).items() if k != "name"}


def load_dataset(spec: DictConfig) -> Dataset:
    if spec.name == "synthetic":
        from fedray.data.synthetic import SyntheticFEMNIST

        src = SyntheticFEMNIST(num_clients=spec.num_writers, min_examples=spec.min_examples,
                               max_examples=spec.max_examples, seed=spec.seed)
        return src.to_dataset()
    from fedray.data.loaders import load_source

    options = {"test_fraction": spec.client_test_fraction} \
        if spec.name == "shakespeare_folio" else {}
    return load_source(spec.name, spec.path, **options)


def hold_out_test(dataset: Dataset, fraction: float, seed: int) -> Dataset:
    """Carve a central test set out of a train-only source, stratified by label.

    Why stratified: a test set whose label mix drifts from the train set's would blur the very
    accuracy comparisons the reproductions make. Which rows go to test depends on the recipe's
    seed only, so a store rebuilt from the same recipe is the same store.
    """
    if dataset.test is not None:
        raise ConfigError(f"recipe key 'test_fraction': source {dataset.name!r} already has a "
                          f"test split; set test_fraction=0")
    g = rng(seed, TAG_TEST_HOLDOUT)
    test_rows = []
    for label in np.unique(dataset.train.y):
        rows = np.flatnonzero(dataset.train.y == label)
        test_rows.append(g.choice(rows, size=int(round(fraction * len(rows))), replace=False))
    is_test = np.zeros(len(dataset.train), dtype=bool)
    is_test[np.concatenate(test_rows)] = True
    return replace(dataset, train=dataset.train.take(np.flatnonzero(~is_test)),
                   test=dataset.train.take(np.flatnonzero(is_test)))


def build(recipe: Any, overrides: list[str] | tuple = (),
          log: Callable[[str], None] = lambda s: None) -> tuple[str, dict]:
    """Run a recipe end to end; returns the store's URL and manifest."""
    from fedray.data.partitioners import partition
    from fedray.data.store import check_new_store, write_store

    cfg = load_recipe(recipe, overrides)
    out = absolute_url(cfg.out)
    fs, path = filesystem(out, "out", durable=True, what="recipe")
    check_new_store(out)  # before reading any data
    check_writable(fs, path, out, "out", what="recipe")
    t0 = time.perf_counter()
    log(f"reading {cfg.source.name} from {cfg.source.path or '(generated)'}")
    dataset = load_dataset(cfg.source)
    if cfg.test_fraction > 0:
        dataset = hold_out_test(dataset, cfg.test_fraction, cfg.seed)
    test_n = len(dataset.test) if dataset.test is not None else 0
    log(f"  {len(dataset.train):,} train / {test_n:,} test examples, "
        f"{dataset.num_classes} classes ({time.perf_counter() - t0:.1f}s)")
    t1 = time.perf_counter()
    part = partition(dataset, cfg.partitioner.name, cfg.seed, **_partitioner_params(cfg))
    log(f"partitioned into {part.num_clients:,} clients with '{cfg.partitioner.name}' "
        f"({time.perf_counter() - t1:.1f}s)")
    t2 = time.perf_counter()
    recipe_doc = mask_tree(OmegaConf.to_container(cfg, resolve=True))
    try:
        manifest = write_store(out, dataset, part, recipe=recipe_doc, shard_mb=cfg.shard_mb,
                               log=log)
    except OSError as exc:  # write_store removed its temporary copy: nothing is left
        failure = storage_failure(exc)
        if failure is None:
            raise
        raise key_error("out", f"writing the store failed: {failure.strerror}; nothing was "
                        f"left at {out}", what="recipe") from None
    log(f"wrote {len(manifest['shards'])} shards to {out} ({time.perf_counter() - t2:.1f}s; "
        f"{time.perf_counter() - t0:.1f}s in all)")
    return out, manifest
