"""Partition recipes: source -> partitioner -> store, as ``fedray partition RECIPE.yaml`` runs.

A recipe names a raw data set in its official format (``source``), how to split it into
clients (``partitioner`` and its parameters), a seed and where the store goes (``out``).
It is validated completely -- unknown keys, wrong types, parameters the partitioner does not
take, impossible values -- before any data is read, ``out`` is claimed (no other build writes
there while this one does), and the store is written to a temporary location first, so a
failed build leaves nothing behind.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from fedray.config import load_structured
from fedray.data import partitioners
from fedray.data.dataset import Dataset, hold_out_test
from fedray.data.partitioned import write, write_natural
from fedray.data.partitioners import PARAMS, check_params
from fedray.data.sources.spec import SourceSpec
from fedray.errors import ConfigError, key_error
from fedray.state.redact import mask_tree
from fedray.state.storage import RunClaim, absolute_url, filesystem


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
    # imported when used, not at the top: it loads h5py, pyarrow (start-up time)
    from fedray.data.sources.loaders import GENERATED, SOURCE_OPTIONS

    cfg = load_structured(Recipe, source, overrides, what="recipe", kind="recipe")
    sources = list(SOURCE_OPTIONS)
    if cfg.source.name not in sources:
        raise ConfigError(f"recipe key 'source.name': must be one of: {', '.join(sources)}, "
                          f"got {cfg.source.name!r}")
    if cfg.source.name not in GENERATED and not cfg.source.path:
        raise ConfigError(f"recipe key 'source.path': where the raw {cfg.source.name} files "
                          f"are, e.g. source.path=PATH/{cfg.source.name}")
    if cfg.source.name in GENERATED and cfg.source.path:
        raise key_error("source.path", f"source {cfg.source.name!r} is generated, not read "
                        "from files: leave source.path out", cfg.source.path, what="recipe")
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
    if s.dtype not in PIXEL_DTYPES or (s.dtype != "float32" and s.name != "synthetic"):
        raise key_error("source.dtype", "must be float32 or uint8, for source synthetic only",
                        s.dtype, what="recipe")
    _check_own_data_keys(s, pname)
    OmegaConf.set_readonly(cfg, True)
    return cfg


def _check_own_data_keys(s: DictConfig, partitioner: str) -> None:
    """Each source.* key set only for a source that reads it (SOURCE_OPTIONS), and the
    numpy/table/hf_disk keys' values and what the partitioner needs of them, all before any
    data is read."""
    # imported when used, not at the top: they load h5py, pyarrow (start-up time)
    from fedray.data.sources.columns import SOURCE_KEYS, check_keys
    from fedray.data.sources.loaders import SOURCE_OPTIONS, check_options

    reads = SOURCE_OPTIONS.get(s.name, ())
    defaults = SourceSpec()
    for key in sorted(set().union(*SOURCE_OPTIONS.values())):
        if key not in reads and s[key] != getattr(defaults, key):
            users = [n for n, keys in SOURCE_OPTIONS.items() if key in keys]
            raise key_error(f"source.{key}", f"is read by source {' / '.join(users)} only, "
                            f"not {s.name!r}", s[key], what="recipe")
    check_options(s.name, **{k: s[k] for k in reads})
    reads = SOURCE_KEYS.get(s.name, ())
    if not reads:
        return
    keys = {k: OmegaConf.to_container(s[k]) if OmegaConf.is_config(s[k]) else s[k]
            for k in reads}
    check_keys(s.name, keys)
    if s.text is None and s.text_length != defaults.text_length:
        raise key_error("source.text_length", "goes with source.text", s.text_length,
                        what="recipe")
    if partitioner == "natural" and s.user is None:
        raise key_error("source.user", f"partitioner 'natural' makes one client per user: "
                        f"name the {s.name} source's user-id column", what="recipe")
    if partitioner == "pachinko":
        raise key_error("partitioner.name", f"'pachinko' needs coarse labels, which source "
                        f"{s.name!r} does not have", "pachinko", what="recipe")


def _partitioner_params(cfg: DictConfig) -> dict[str, Any]:
    """The partitioner's parameters; one set to null is left out (its default applies), so
    that a command line can switch a recipe to a partitioner that does not take one of its
    parameters (``partitioner.name=iid partitioner.min_examples=null``): an override can
    set a key, never remove one."""
    return {k: v for k, v in OmegaConf.to_container(cfg.partitioner).items()
            if k != "name" and v is not None}


PIXEL_DTYPES = ("float32", "uint8")


def to_uint8(x: np.ndarray) -> np.ndarray:
    """Pixels in [0, 1] as bytes (model input = byte / 255): the nearest of 256 levels."""
    return np.rint(np.clip(x, 0.0, 1.0) * np.float32(255)).astype(np.uint8)


def synthetic_source(spec: DictConfig) -> Any:
    # imported when used, not at the top: it loads torch (start-up time)
    from fedray.data.sources.synthetic import SyntheticFEMNIST

    return SyntheticFEMNIST(num_clients=spec.num_writers, min_examples=spec.min_examples,
                            max_examples=spec.max_examples, seed=spec.seed)


def load_dataset(spec: DictConfig) -> Dataset:
    if spec.name == "synthetic":
        data = synthetic_source(spec).to_dataset()
        if spec.dtype == "uint8":
            data = replace(data, scale=1 / 255, train=replace(data.train, x=to_uint8(
                data.train.x)), test=replace(data.test, x=to_uint8(data.test.x)))
        return data
    # imported when used, not at the top: it loads h5py, pyarrow (start-up time)
    from fedray.data.sources.loaders import SOURCE_OPTIONS, load_source

    options: dict[str, Any] = {}
    for key in SOURCE_OPTIONS[spec.name]:
        value = spec[key]
        options[key] = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
    return load_source(spec.name, spec.path, **options)


def build(recipe: Any, overrides: list[str] | tuple = (),
          log: Callable[[str], None] = lambda s: None) -> tuple[str, dict]:
    """Run a recipe end to end; returns the store's URL and manifest."""
    # imported when used, not at the top: it loads pyarrow (start-up time)
    from fedray.data.store.writer import claim_store

    cfg = load_recipe(recipe, overrides)
    out = absolute_url(cfg.out)
    filesystem(out, "out", durable=True, what="recipe")
    # out is ours from now to the end, before any data is read: another build to it is
    # refused, and nothing it holds is removed (fedray.data.store.writer.claim_store)
    claim = claim_store(out)
    try:
        return out, _build_claimed(cfg, out, claim, log)
    finally:
        claim.vacate()


def _build_claimed(cfg: DictConfig, out: str, claim: RunClaim,
                   log: Callable[[str], None]) -> dict:
    t0 = time.perf_counter()
    if cfg.source.name == "synthetic" and cfg.partitioner.name == "natural":
        return _build_streamed(cfg, out, claim, log, t0)
    log(f"reading {cfg.source.name} from {cfg.source.path or '(generated)'}")
    dataset = load_dataset(cfg.source)
    if cfg.test_fraction > 0:
        dataset = hold_out_test(dataset, cfg.test_fraction, cfg.seed)
    test_n = len(dataset.test) if dataset.test is not None else 0
    log(f"  {len(dataset.train):,} train / {test_n:,} test examples, "
        f"{dataset.num_classes} classes ({time.perf_counter() - t0:.1f}s)")
    t1 = time.perf_counter()
    part = partitioners.partition(dataset, cfg.partitioner.name, cfg.seed,
                                  **_partitioner_params(cfg))
    log(f"partitioned into {part.num_clients:,} clients with '{cfg.partitioner.name}' "
        f"({time.perf_counter() - t1:.1f}s)")
    t2 = time.perf_counter()
    recipe_doc = mask_tree(OmegaConf.to_container(cfg, resolve=True))
    manifest = write(out, dataset, part, recipe_doc, cfg.shard_mb, log, claim=claim)
    log(f"wrote {len(manifest['shards'])} shards to {out} ({time.perf_counter() - t2:.1f}s; "
        f"{time.perf_counter() - t0:.1f}s in all)")
    return manifest


def _build_streamed(cfg: DictConfig, out: str, claim: RunClaim, log: Callable[[str], None],
                    t0: float) -> dict:
    """Generated writers, one client each (``natural``): streamed writer by writer into the
    store, never gathered, so a million writers build in bounded memory. The store is the
    one the gathered data set would give, plus the generator's own central test set (the
    held-out examples of 200 writers spread over the population), so that evaluating on it
    costs the same at every population."""
    if cfg.test_fraction > 0:  # what hold_out_test says of a source with a test split
        raise ConfigError("recipe key 'test_fraction': source 'synthetic' already has a test "
                          "split; set test_fraction=0")
    source = synthetic_source(cfg.source)
    uint8 = cfg.source.dtype == "uint8"
    central = source.central_test()
    if central is not None and uint8:
        central = (to_uint8(central[0]), central[1])
    manifest = write_natural(out, source, _partitioner_params(cfg).get("min_examples", 0),
                             mask_tree(OmegaConf.to_container(cfg, resolve=True)), cfg.shard_mb,
                             log, transform=to_uint8 if uint8 else None,
                             scale=1 / 255 if uint8 else 1.0, central_test=central, claim=claim)
    log(f"wrote {len(manifest['shards'])} shards to {out} ({time.perf_counter() - t0:.1f}s "
        "in all)")
    return manifest
