"""The client-data contract between the driver, the workers and a data set.

A client is virtual: an integer id in [0, population) plus a way to read its examples. The
driver only needs example counts (to sample, balance and weight); a worker reads a client's
arrays when it trains it and keeps recently used ones in a bounded cache. A source object is
small and picklable -- it is shipped once to every worker, never per client.

Counts are read through ``sizes_of(source, ids)``, for the clients a round uses only: a
source whose counts are computed rather than stored (the synthetic population) offers
``train_sizes_of(ids)`` / ``test_sizes_of(ids)`` in O(len(ids)), so a population of 10^8
costs nothing until its clients are sampled; any other source's ``train_sizes()`` (a
stored array, or a zero-copy view of a store's manifest) is indexed instead.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
import torch

from fedray.config import DataConfig
from fedray.core.tensors import readonly_tensor
from fedray.data.examples import first_nonfinite
from fedray.data.sources.synthetic import SyntheticFEMNIST
from fedray.errors import FedrayError
from fedray.section import section_tree

Arrays = tuple[np.ndarray, np.ndarray]


class ClientSource(Protocol):
    population: int
    num_classes: int
    input_shape: tuple[int, ...]
    has_client_test: bool
    cacheable: bool  # False when reading a client is already free (zero-copy views)

    # every client's count; optional beside them, and preferred by sizes_of:
    # train_sizes_of(ids) / test_sizes_of(ids), the counts of exactly ``ids`` in O(len(ids))
    def train_sizes(self) -> np.ndarray: ...

    def test_sizes(self) -> np.ndarray: ...

    def client(self, cid: int, split: str = "train") -> Arrays: ...

    def central_test(self) -> Arrays | None: ...


def sizes_of(source: ClientSource, ids: Any, split: str = "train") -> np.ndarray:
    """The ``split`` example counts of clients ``ids`` (int64, in their order): the
    source's ``{split}_sizes_of`` where it has one (O(len(ids))), else its
    ``{split}_sizes()`` indexed."""
    ids = np.asarray(ids, dtype=np.int64)
    per_id = getattr(source, f"{split}_sizes_of", None)
    if per_id is not None:
        return np.asarray(per_id(ids), dtype=np.int64)
    every = source.train_sizes() if split == "train" else source.test_sizes()
    return np.asarray(every[ids], dtype=np.int64)


def _as_xy(x: Any, y: Any, what: str) -> Arrays:
    given = np.asarray(x)
    bad = first_nonfinite(given) if given.dtype.kind in "iuf" else None
    if bad is not None:  # every update of the client would be non-finite, and dropped
        raise FedrayError(f"{what}: x row {bad[0]} has {bad[1]}: not a finite model input")
    x = np.ascontiguousarray(np.asarray(given, dtype=np.float32))
    y = np.asarray(y)
    # real-valued targets (regression, model.loss: mse) stay real; class labels are int64
    y = np.ascontiguousarray(y, dtype=np.float32 if y.dtype.kind == "f" else np.int64)
    # class labels [n, L], L > 1: a sequence of targets per example (next-character
    # prediction, model.loss: sequence_cross_entropy); anything else is one label each
    if not (y.ndim == 2 and y.dtype.kind == "i" and y.shape[1] > 1):
        y = y.reshape(-1)
    if x.ndim < 2 or len(x) != len(y):
        raise FedrayError(f"{what}: x must be [n, ...] with one label per example, or a "
                          f"[n, L] sequence of class labels (got x {x.shape}, y {y.shape})")
    return x, y


def client_splits(value: Any, key: Any) -> tuple[Any, Any | None]:
    """One client of ``client_data``: ``(x, y)`` (train only), or ``{"train": (x, y),
    "test": (x, y)}`` (a client that also holds out its own test data); returns the train
    pair and the test pair or None."""
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - {"train", "test"}, key=str)
        if unknown or "train" not in value:
            raise FedrayError(f"client_data[{key!r}]: give (x, y) or {{'train': (x, y), "
                              f"'test': (x, y)}} (got keys {sorted(value, key=str)})")
        return value["train"], value.get("test")
    return value, None


class MemorySource:
    """Client data given in memory (fedray.run's client_data): ``{client_id: (x, y)}``, or
    ``{client_id: {"train": (x, y), "test": (x, y)}}`` where clients keep their own test
    data, so federated evaluation (eval.federated_clients) works on it as on a store.

    Each split of all clients is concatenated into one array pair that goes into Ray's
    object store once; every worker on a node maps the same shared-memory copy, so reading
    a client is a slice. ``in_process`` (runtime.backend=inline, no Ray): the pairs are
    kept in this object.
    """

    cacheable = False

    def __init__(self, client_data: Mapping[Any, Any],
                 test_data: tuple[Any, Any] | None = None, in_process: bool = False):
        self.in_process = in_process
        if not client_data:
            raise FedrayError("client_data is empty: give at least one client")
        xs, ys, txs, tys = [], [], [], []
        self.client_ids = list(client_data)
        for key in self.client_ids:
            train, test = client_splits(client_data[key], key)
            x, y = _as_xy(*train, what=f"client_data[{key!r}]")
            if len(y) == 0:
                raise FedrayError(f"client_data[{key!r}] has no examples")
            xs.append(x)
            ys.append(y)
            if test is not None:
                tx, ty = _as_xy(*test, what=f"client_data[{key!r}]['test']")
                txs.append(tx)
                tys.append(ty)
            else:
                txs.append(None)
                tys.append(None)
        self.has_client_test = any(t is not None for t in tys)
        shapes = {x.shape[1:] for x in xs + [t for t in txs if t is not None]}
        if len(shapes) != 1:
            raise FedrayError(f"client_data: clients have different example shapes {shapes}")
        label_shapes = {y.shape[1:] for y in ys + [t for t in tys if t is not None]}
        if len(label_shapes) != 1:
            raise FedrayError(f"client_data: clients have different label shapes "
                              f"{label_shapes}")
        self.input_shape = tuple(int(d) for d in xs[0].shape[1:])
        self.label_shape = tuple(int(d) for d in ys[0].shape[1:])  # (): one label each
        if self.has_client_test:  # a client given no test split holds out nothing
            txs = [np.zeros((0, *self.input_shape), np.float32) if t is None else t
                   for t in txs]
            tys = [np.zeros((0, *self.label_shape), ys[0].dtype) if t is None else t
                   for t in tys]
        self._sizes = np.asarray([len(y) for y in ys], dtype=np.int64)
        self._offsets = np.concatenate([[0], np.cumsum(self._sizes)])
        self._test_sizes = np.asarray([0 if t is None else len(t) for t in tys], np.int64)
        self._test_offsets = np.concatenate([[0], np.cumsum(self._test_sizes)])
        labels = np.concatenate(ys + ([np.concatenate(tys)] if self.has_client_test else []))
        self._test = None
        if test_data is not None:
            tx, ty = _as_xy(*test_data, what="test_data")
            if tx.shape[1:] != self.input_shape or ty.shape[1:] != self.label_shape:
                raise FedrayError(f"test_data: examples of shape {tx.shape[1:]} with labels "
                                  f"of shape {ty.shape[1:]}, clients have "
                                  f"{self.input_shape} and {self.label_shape}")
            self._test = self._put((tx, ty))
            labels = np.concatenate([labels, ty])
        if labels.dtype.kind == "f":  # regression targets: one output per example
            labels = labels.astype(np.float32)
            self.num_classes = 1
        else:
            if labels.min() < 0:
                raise FedrayError("client_data: labels must be >= 0")
            self.num_classes = int(labels.max()) + 1
        self.population = len(ys)
        n, tn = self._offsets[-1], self._test_offsets[-1]
        self._data = self._put((np.concatenate(xs), labels[:n]))
        self._client_test = self._put((np.concatenate(txs), labels[n:n + tn])) \
            if self.has_client_test else None
        self._arrays: dict[str, Arrays] = {}

    def _put(self, arrays: Arrays) -> Any:
        if self.in_process:
            return arrays
        import ray

        return ray.put(arrays)

    def _get(self, ref: Any) -> Arrays:
        if self.in_process:
            return ref
        import ray

        return ray.get(ref)

    def train_sizes(self) -> np.ndarray:
        return self._sizes

    def test_sizes(self) -> np.ndarray:
        return self._test_sizes

    def client(self, cid: int, split: str = "train") -> Arrays:
        if split != "train" and not self.has_client_test:
            raise FedrayError("in-memory client_data has no per-client test split: give "
                              "clients as {'train': (x, y), 'test': (x, y)}")
        if split not in self._arrays:
            self._arrays[split] = self._get(self._data if split == "train"
                                            else self._client_test)
        offsets = self._offsets if split == "train" else self._test_offsets
        a, b = offsets[cid], offsets[cid + 1]
        x, y = self._arrays[split]
        return x[a:b], y[a:b]

    def central_test(self) -> Arrays | None:
        if self._test is None:
            return None
        return self._get(self._test)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_arrays"] = {}  # every process maps the object store itself
        state["client_ids"] = None  # names stay with the caller
        return state


def build_source(data: DataConfig, client_data: Mapping | None = None,
                 test_data: tuple | None = None, manifest: dict | None = None, *,
                 in_process: bool = False) -> ClientSource:
    """The source the ``data`` section names ('synthetic' or a store URL), or in-memory
    client data (``in_process``: the inline backend's, read where it was given)."""
    if client_data is not None:
        return MemorySource(client_data, test_data, in_process=in_process)
    if data.partition != "synthetic":
        # imported when used, not at the top: it loads pyarrow (start-up time)
        from fedray.data.store.reader import StoreSource

        return StoreSource(data.partition, manifest, max_open_shards=data.open_shards)

    return SyntheticFEMNIST(**section_tree(data.synthetic))


class ClientCache:
    """A worker's bounded LRU of client tensors, measured in bytes.

    Clients are sampled with replacement across rounds, so a worker often meets a client it
    has read before; the cache turns those re-reads into a dictionary lookup.
    """

    def __init__(self, source: ClientSource, max_bytes: int):
        self.source = source
        self.max_bytes = max_bytes if source.cacheable else 0
        self._items: OrderedDict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = \
            OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, cid: int, split: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
        key = (cid, split)
        item = self._items.get(key)
        if item is not None:
            self._items.move_to_end(key)
            self.hits += 1
            return item
        self.misses += 1
        x, y = self.source.client(cid, split)
        item = (readonly_tensor(x), readonly_tensor(y))
        size = x.nbytes + y.nbytes
        if size <= self.max_bytes:
            self._items[key] = item
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, (ox, oy) = self._items.popitem(last=False)
                self._bytes -= ox.numel() * ox.element_size() + oy.numel() * oy.element_size()
        return item

