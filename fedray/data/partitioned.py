"""A data set split into clients, on its way to a store: the Python path to what
``fedray partition`` builds.

``from_arrays(x, y).partition("dirichlet", alpha=0.5, num_clients=100).write_store(url)``
ends a user's own preprocessing in a real store that ``fedray run``, sweeps and ``--resume``
treat like any other. ``write`` is also the last step of ``fedray.data.recipe.build``, so the
two paths write a store the same way, and fail the same way (nothing left at the target).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from fedray.data.examples import Split
from fedray.data.partition import Partition
from fedray.data.partitioners.natural import natural_blocks
from fedray.errors import FedrayError, key_error
from fedray.state.redact import mask_tree
from fedray.state.storage import RunClaim, absolute_url, filesystem, storage_failure

if TYPE_CHECKING:  # a Dataset (fedray.data.dataset) uses this module: its type only
    from fedray.data.dataset import Dataset


class WrittenStore(NamedTuple):
    url: str  # the store's absolute path or URL: data.partition=URL
    manifest: dict  # what it holds (manifest.json)


def _json_safe(value: Any, key: str) -> Any:
    """``value`` as JSON types (NumPy scalars and arrays as numbers and lists)."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, dict):
        return {str(k): _json_safe(v, f"{key}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v, key) for v in value]
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        raise key_error(key, "must be a number, string, boolean or list of them, to be "
                        "recorded in the manifest", value, what="recipe") from None
    return value


def recipe_doc(dataset: Dataset, partitioner: str, seed: int, params: dict, url: str,
               shard_mb: float) -> dict:
    """The recipe a store written from Python records: a recipe file's shape, so
    ``fedray partition --describe`` reads it, and so does a person who wants to rebuild
    the store (``source.name: python`` says the data came from memory, not a file)."""
    source = dict(dataset.source or {"name": "python", "path": None})
    params = {k: _json_safe(v, f"partitioner.{k}") for k, v in params.items()}
    held = dataset.holdout or {"fraction": 0.0, "seed": seed}
    doc = {"name": dataset.name, "seed": int(seed), "source": source,
           "partitioner": {"name": partitioner, **params}, "out": url,
           "shard_mb": float(shard_mb), "test_fraction": held["fraction"]}
    if held["seed"] != seed:  # a recipe draws both from its one seed; here they differ
        doc["test_fraction_seed"] = held["seed"]
    return mask_tree(doc)


@contextmanager
def _storage_errors(url: str) -> Iterator[None]:
    """A full disk or a refused write as one line naming ``out`` (the store writer has
    removed its temporary copy by then: nothing is left)."""
    try:
        yield
    except OSError as exc:
        failure = storage_failure(exc)
        if failure is None:
            raise
        raise key_error("out", f"writing the store failed: {failure.strerror}; nothing was "
                        f"left at {url}", what="recipe") from None


def write(url: str, dataset: Dataset, part: Partition, recipe: dict, shard_mb: float,
          log: Callable[[str], None], claim: RunClaim | None = None) -> dict:
    """Write the store (``fedray.data.store.writer.write_store``); returns the manifest.
    claim: the caller's hold on ``url`` (fedray.data.store.writer.claim_store)."""
    # imported when used, not at the top: it loads pyarrow (start-up time)
    from fedray.data.store.writer import write_store

    with _storage_errors(url):
        return write_store(url, dataset, part, recipe=recipe, shard_mb=shard_mb, log=log,
                           claim=claim)


# below this many clients, spawning generator processes costs more than it saves
PARALLEL_MIN_CLIENTS = 20_000


def write_natural(url: str, source: Any, min_examples: int, recipe: dict, shard_mb: float,
                  log: Callable[[str], None], *,
                  transform: Callable[[np.ndarray], np.ndarray] | None = None,
                  scale: float = 1.0, central_test: tuple[np.ndarray, np.ndarray] | None = None,
                  processes: int | None = None, claim: RunClaim | None = None) -> dict:
    """Write ``natural`` over the lazy client source ``source`` (a generated population)
    as a store, streamed: clients are generated block by block (in ``processes`` processes;
    None: every core for a large population) and each shard is written when full, so
    memory stays flat however many clients there are. The same store as ``write`` of
    ``natural`` on the whole population gathered into memory, with ``transform`` applied
    to every input array; ``central_test`` (already transformed) is kept beside the
    clients' own test data; ``claim``: the caller's hold on ``url`` (None: the writer's
    own). Returns the manifest."""
    import os
    import time

    # imported when used, not at the top: it loads pyarrow (start-up time)
    from fedray.data.store.writer import StoreWriter

    n = int(source.population)
    if processes is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
            else (os.cpu_count() or 1)
        processes = min(cores, 8) if n >= PARALLEL_MIN_CLIENTS else 1
    log(f"generating {n:,} clients in {processes} process{'es' if processes > 1 else ''}, "
        "streaming them into shards")
    t0 = last = time.perf_counter()
    done, dropped = 0, np.zeros(3, dtype=np.int64)
    writer: Any = None
    with _storage_errors(url):
        try:
            for block in natural_blocks(source, min_examples, transform=transform,
                                        processes=processes):
                if writer is None:
                    writer = StoreWriter(
                        url, num_classes=source.num_classes, input_shape=source.input_shape,
                        dtype=block.train.x.dtype, label_shape=block.train.y.shape[1:],
                        scale=scale, client_test=block.test is not None, shard_mb=shard_mb,
                        log=log, claim=claim)
                writer.add(block.names, block.train, block.train_counts, block.test,
                           block.test_counts)
                done += len(block.names) + block.dropped[0]
                dropped += block.dropped
                now = time.perf_counter()
                if now - last >= 30 or done == n:
                    last = now
                    log(f"  {done:,} of {n:,} clients ({100 * done / n:.0f}%) in "
                        f"{now - t0:.0f}s, ~{(now - t0) * (n - done) / done:.0f}s to go")
            assert writer is not None
            info = {"min_examples": int(min_examples), "dropped_clients": int(dropped[0]),
                    "dropped_train_examples": int(dropped[1]),
                    "dropped_test_examples": int(dropped[2])}
            central = None if central_test is None else Split(*central_test)
            return writer.finish(recipe=recipe, info=info, central_test=central)
        except BaseException:
            if writer is not None:
                writer.abort()
            raise


@dataclass
class PartitionedDataset:
    """What ``Dataset.partition`` returns: the data set, its clients, and how they were made."""

    dataset: Dataset
    partition: Partition
    partitioner: str
    seed: int
    params: dict

    @property
    def num_clients(self) -> int:
        return self.partition.num_clients

    def write_store(self, url: str, shard_mb: float = 64.0,
                    log: Callable[[str], None] = lambda s: None) -> WrittenStore:
        """Write the store at ``url`` (a new local path or fsspec URL) in shards of about
        ``shard_mb`` MB; returns its absolute URL and manifest. An existing store is never
        overwritten, and a failed write leaves nothing behind."""
        # imported when used, not at the top: it loads pyarrow (start-up time)
        from fedray.data.store.writer import claim_store

        if isinstance(shard_mb, bool) or not isinstance(shard_mb, (int, float)) \
                or not shard_mb > 0:
            raise key_error("shard_mb", "must be > 0", shard_mb, what="recipe")
        if not isinstance(url, str) or not url:
            raise FedrayError(f"write_store needs the store's path or URL, got {url!r}")
        out = absolute_url(url)
        filesystem(out, "out", durable=True, what="recipe")
        claim = claim_store(out)  # as fedray partition: out is this call's until it returns
        try:
            doc = recipe_doc(self.dataset, self.partitioner, self.seed, self.params, out,
                             shard_mb)
            return WrittenStore(out, write(out, self.dataset, self.partition, doc, shard_mb,
                                           log, claim))
        finally:
            claim.vacate()
