"""Partition store: a federated data set on disk, built once, read by any worker anywhere.

A store is a directory at any fsspec URL (format version 2):
  manifest.json            what it holds, store-wide: source, recipe, seed, number of clients
                           and classes, shapes, schema, fedray version, every shard with its
                           rows, bytes and sha256, and the client index file with its own
  clients.arrow            the client index: one row per client -- name, and per split the
                           shard and rows that hold it, its example count and a sparse label
                           histogram (fedray.data.store.client_index, which documents the columns)
  train-00000.arrow ...    Arrow IPC files (Feather v2, uncompressed), one record batch each
  test-00000.arrow ...     per-client test data, when the partitioner gives clients their own
  central_test-00000.arrow the shared test set: when clients have no test data of their own,
                           or a fixed set beside it (the synthetic writers' 200 held-out sets)
Clients' rows are contiguous and a client never spans two shards, so reading one client
touches one shard; on a local disk the shard is memory-mapped and the client's arrays are
views into it (no copy, no parsing). Many clients share a shard (``shard_mb``, ~64 MB), so a
million-client store is a few hundred files, not a million.

Why the client index is not in the manifest: format 1 listed every client's numbers in
manifest.json, which every open parsed (200 MB at a million clients). Now opening a store
reads a manifest of a few kilobytes and maps the index, whatever the population; format 1
stores still open (their lists become the same index).

Writing (``StoreWriter``) streams: clients arrive in blocks, each split's shard is written
as soon as it is full, and what the writer keeps per client is a few numbers in arrays, so a
store of any size is built in bounded memory. It writes to a temporary sibling directory
that is renamed into place at the end, so an interrupted or failed build never leaves a
half-written store at the target URL.

The target is claimed first (``claim_store``: the lock ``fedray run`` puts on its output
directory, fedray.state.storage.RunClaim), so two builds to one place cannot both write it,
and the writer never deletes anything at the target: a store goes only to a new or empty
location, and the final move refuses rather than replace a file it did not write
(``StoreWriter._place``).
"""

from fedray.data.store.format import MANIFEST, read_manifest
from fedray.data.store.reader import StoreSource, client_index
from fedray.data.store.verify import verify_store
from fedray.data.store.writer import StoreWriter, claim_store, write_store

__all__ = ["MANIFEST", "StoreSource", "StoreWriter", "claim_store", "client_index",
           "read_manifest", "verify_store", "write_store"]
