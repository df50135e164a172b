"""Verifying a partition store before a run (``data.verify``) and for ``--describe``: every
file's size and sha256 against the manifest, the client index's own checks, and every
client's rows against its shard.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np

from fedray.data.examples import first_nonfinite
from fedray.data.store.client_index import (
    numpy_view,
    sparse_histograms,
)
from fedray.data.store.format import join_path, read_manifest
from fedray.data.store.reader import StoreSource
from fedray.errors import FedrayError
from fedray.state.storage import filesystem


def _digest(fs: Any, p: str) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    with fs.open(p, "rb") as f:
        while chunk := f.read(8 * 2**20):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def verify_store(url: str, manifest: dict | None = None) -> None:
    """Check the whole store: the client index file's size and sha256, then every client
    against the shards (``ClientIndex.check``), then every shard's size and sha256, then its
    contents -- its columns (``shard_schema``), the rows it really holds, every input finite
    as a model input (``float32(x) * scale``), and every label within ``num_classes`` and in
    its client's label histogram. Reads every shard twice: to hash it, then its inputs and
    labels (from the page cache, on a local disk)."""
    m = manifest or read_manifest(url)
    fs, path = filesystem(url, "data.partition")
    source = StoreSource(url, m, max_open_shards=1)
    entry = m.get("client_index")
    if entry is not None:
        p = join_path(path, entry["file"])
        if not fs.exists(p):
            raise FedrayError(f"{url}: {entry['file']} is missing")
        if _digest(fs, p) != (entry["bytes"], entry["sha256"]):
            raise FedrayError(f"{url}: {entry['file']} is corrupt (checksum mismatch)")
    label_size = int(np.prod(source.label_shape)) if source.label_shape else 1
    source.index.check(source._files, label_size)
    for shard in m["shards"]:
        p = join_path(path, shard["file"])
        if not fs.exists(p):
            raise FedrayError(f"{url}: shard {shard['file']} is missing")
        if _digest(fs, p) != (shard.get("bytes"), shard.get("sha256")):
            raise FedrayError(f"{url}: shard {shard['file']} is corrupt (checksum mismatch)")
    _verify_contents(url, m, source)


def _shard_owner(source: StoreSource, split: str, shard: int, row: int) -> str:
    """Who holds a shard's row, for a message: a client, or the central test set."""
    if split == "central_test":
        return "the central test set"
    ix = source.index
    shards, offsets, counts = ix.shards(split), ix.offsets(split), ix.counts(split)
    held = np.flatnonzero((shards == shard) & (offsets <= row) & (row < offsets + counts))
    return f"client {int(held[0])} ({ix.name(int(held[0]))!r})" if len(held) else "no client"


def _verify_contents(url: str, m: dict, source: StoreSource) -> None:
    classes = int(m["num_classes"])
    labels: dict[str, list[np.ndarray]] = {}
    for split, files in source._files.items():
        for i, shard in enumerate(files):
            batch = source._batch(split, i)  # its columns checked against shard_schema
            if batch.num_rows != shard["rows"]:
                raise FedrayError(f"{url}: shard {shard['file']} holds {batch.num_rows} rows, "
                                  f"the manifest says {shard['rows']}")
            x = numpy_view(batch.column(0).flatten()).reshape(batch.num_rows,
                                                                math.prod(m["input_shape"]))
            bad_input = first_nonfinite(x, source.scale)  # as a worker will read it
            if bad_input is not None:
                row, why = bad_input
                raise FedrayError(f"{url}: shard {shard['file']} row {row} "
                                  f"({_shard_owner(source, split, i, row)}) has {why}: not a "
                                  f"finite model input")
            y = source._labels(batch)
            if y is None:
                raise FedrayError(f"{url}: shard {shard['file']} has labels of type "
                                  f"{batch.schema.field(1).type}; the manifest's label_shape "
                                  f"{source.label_shape} needs {source._label_type()}")
            bad = (y < 0) | (y >= classes)
            wrong = np.flatnonzero(bad.reshape(len(y), -1).any(axis=1))
            if len(wrong):
                row = y[wrong[0]].reshape(-1)
                label = int(row[(row < 0) | (row >= classes)][0])
                raise FedrayError(f"{url}: shard {shard['file']} row {int(wrong[0])} has label "
                                  f"{label}, outside 0..{classes - 1} "
                                  f"(num_classes {classes})")
            labels.setdefault(split, []).append(y)
    ix = source.index
    for split in ix.splits:
        starts = np.concatenate([[0], np.cumsum([len(y) for y in labels[split]])])
        first = starts[ix.shards(split)] + ix.offsets(split)  # each client's first row
        count = ix.counts(split)
        bounds = np.concatenate([[0], np.cumsum(count)])  # the clients' rows, in client order
        rows = np.repeat(first - bounds[:-1], count) + np.arange(bounds[-1])
        lengths, got_labels, got_counts = sparse_histograms(np.concatenate(labels[split])[rows],
                                                            count, classes)
        have_starts, have_labels, have_counts = ix.sparse(split)
        differ = np.flatnonzero(lengths != np.diff(have_starts))
        first_bad = int(differ[0]) if len(differ) else ix.num_clients
        aligned = int(have_starts[first_bad])  # entries before it line up one to one
        entry = np.flatnonzero((got_labels[:aligned] != have_labels[:aligned])
                               | (got_counts[:aligned] != have_counts[:aligned]))
        if len(entry):
            first_bad = int(np.searchsorted(have_starts, entry[0], side="right")) - 1
        if first_bad < ix.num_clients:
            raise FedrayError(f"{url}: client {first_bad} ({ix.name(first_bad)!r}): its {split} "
                              "labels differ from the label histogram in its client index")
