"""Reading a partition store: ``StoreSource``, the ClientSource a worker reads clients from
(shards memory-mapped on a local disk, opened lazily, a bounded LRU of them), and
``client_index``, the per-client columns opened from the manifest.
"""

from __future__ import annotations

from collections import OrderedDict

import fsspec
import numpy as np
import pyarrow as pa

from fedray.data.examples import first_nonfinite
from fedray.data.store.client_index import (
    INDEX_SPLITS,
    ClientIndex,
    numpy_view,
    row_problem,
)
from fedray.data.store.format import SPLITS, join_path, read_manifest, shard_schema
from fedray.errors import FedrayError


def client_index(url: str, manifest: dict) -> ClientIndex:
    """The store's per-client columns (opened on first use)."""
    return ClientIndex.from_manifest(url, manifest)



class StoreSource:
    """A partition store as a ClientSource (see fedray.data.client_source).

    Small to pickle (it is shipped to every worker): the manifest's shard list and where
    the client index is; each process maps the index and the shards itself, lazily, and keeps
    at most ``max_open_shards`` shards (LRU). On a local filesystem files are memory-mapped,
    elsewhere read once into memory.
    """

    cacheable = True

    def __init__(self, url: str, manifest: dict | None = None, max_open_shards: int = 16):
        self.url = url
        m = manifest or read_manifest(url)
        self.population = int(m["num_clients"])
        self.num_classes = int(m["num_classes"])
        self.input_shape = tuple(m["input_shape"])
        self.label_shape = tuple(m.get("label_shape") or ())  # () one label, (L,) sequences
        self.scale = float(m["scale"])
        self.dtype = str(m["dtype"])
        self.schema = shard_schema(m)  # what every shard must hold (checked as it is opened)
        self.index = client_index(url, m)
        self.has_client_test = "test" in self.index.splits
        self._files = {s: [sh for sh in m["shards"] if sh["split"] == s] for s in SPLITS}
        self.max_open_shards = max_open_shards
        self._open: OrderedDict[tuple[str, int], pa.RecordBatch] = OrderedDict()
        self._fs = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_open"] = OrderedDict()  # each process maps shards itself
        state["_fs"] = None
        return state

    def train_sizes(self) -> np.ndarray:
        return self.index.counts("train")

    def test_sizes(self) -> np.ndarray:
        if not self.has_client_test:
            return np.broadcast_to(np.int64(0), (self.population,))  # no memory per client
        return self.index.counts("test")

    def name(self, cid: int) -> str:
        """Client ``cid``'s name (a writer id, a user id, or its number)."""
        return self.index.name(cid)

    def _batch(self, split: str, i: int) -> pa.RecordBatch:
        key = (split, i)
        batch = self._open.get(key)
        if batch is not None:
            self._open.move_to_end(key)
            return batch
        shard = self._files[split][i]
        if self._fs is None:
            self._fs = fsspec.core.url_to_fs(self.url)
        fs, path = self._fs
        p = join_path(path, shard["file"])
        try:
            protocols = (fs.protocol,) if isinstance(fs.protocol, str) else fs.protocol
            if "file" in protocols:
                if fs.size(p) != shard["bytes"]:
                    raise FedrayError(f"{self.url}: shard {shard['file']} has "
                                      f"{fs.size(p)} bytes, the manifest says {shard['bytes']}")
                source = pa.memory_map(p, "r")
            else:
                source = pa.BufferReader(fs.cat_file(p))
            batch = pa.ipc.open_file(source).get_batch(0)
            batch.validate()  # buffer sizes (cheap): a short buffer is not read past its end
        except FileNotFoundError:
            raise FedrayError(f"{self.url}: shard {shard['file']} is missing") from None
        except (pa.ArrowInvalid, OSError) as exc:
            raise FedrayError(f"{self.url}: shard {shard['file']} is corrupt: "
                              f"{str(exc).splitlines()[0]}") from None
        problem = self._schema_problem(batch)
        if problem is not None:
            raise FedrayError(f"{self.url}: shard {shard['file']} {problem}")
        self._open[key] = batch
        while len(self._open) > self.max_open_shards:
            self._open.popitem(last=False)
        return batch

    def _schema_problem(self, batch: pa.RecordBatch) -> str | None:
        """What is wrong with a shard's columns (``shard_schema``), or None: checked every
        time a shard is opened -- its schema and null counts are metadata, so the cost is
        the same for ten rows or a million -- so a foreign or hand-edited shard (strings
        for x, int32 labels, float64 where the manifest says uint8, a missing column) is one
        line naming it, not a reshape error or a misread buffer in a worker."""
        want = [f.type for f in self.schema][:2] + [pa.int64()]  # x, y, coarse
        names = batch.schema.names
        if not len(self.schema) <= batch.num_columns <= 3:  # coarse: where num_coarse is set
            return (f"has columns {names}; the manifest needs "
                    f"{', '.join(f'{f.name}: {f.type}' for f in self.schema)}")
        for i, got in enumerate(batch.schema):
            if not got.type.equals(want[i]):
                need = (f"dtype {self.dtype}, input_shape {list(self.input_shape)}" if i == 0
                        else f"label_shape {list(self.label_shape)}" if i == 1 else "coarse")
                return (f"column {i} ({got.name}) is {got.type}; the manifest ({need}) "
                        f"needs {want[i]}")
            column = batch.column(i)
            if column.null_count or (isinstance(column, pa.FixedSizeListArray)
                                     and column.values.null_count):
                return f"column {i} ({got.name}) has missing values (nulls)"
        return None

    def _label_type(self) -> pa.DataType:
        return pa.int64() if not self.label_shape else \
            pa.list_(pa.int64(), int(np.prod(self.label_shape)))

    def _labels(self, batch: pa.RecordBatch) -> np.ndarray | None:
        """A batch's labels as [rows, *label_shape] int64 (a view), or None when the shard's
        label column is not what the manifest's label_shape says."""
        column = batch.column(1)
        if column.type != self._label_type():
            return None
        if not self.label_shape:
            return numpy_view(column)
        flat = numpy_view(column.flatten())
        return flat.reshape((batch.num_rows, *self.label_shape))

    def _rows(self, split: str, shard: int, lo: int, n: int, cid: int | None = None
              ) -> tuple[np.ndarray, np.ndarray]:
        """Rows lo..lo+n-1 of a shard as model inputs (float32, scaled) and labels; client
        ``cid`` is named, with the shard and row, if an input is not finite."""
        batch = self._batch(split, shard).slice(lo, n)
        raw = numpy_view(batch.column(0).flatten())
        raw = raw.reshape((n, *self.input_shape))
        y = self._labels(batch)
        if y is None:
            raise FedrayError(f"{self.url}: {split} shard {shard} has labels of type "
                              f"{batch.column(1).type}, not {self._label_type()}")
        x = raw
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is reported below
            if self.scale != 1.0 or x.dtype != np.float32:
                x = x.astype(np.float32) * np.float32(self.scale)
            finite = bool(np.isfinite(x).all())  # one pass over the rows just read
        if not finite:
            # data.verify finds these before a run; with it off, a worker says it here,
            # rather than train on it and drop every update it touches as non-finite
            row, why = first_nonfinite(raw, self.scale) or (0, "a non-finite value")
            who = "" if cid is None else f"client {cid} ({self.index.name(cid)!r}): "
            raise FedrayError(f"{self.url}: {who}{split} shard "
                              f"{self._files[split][shard]['file']} row {lo + row} has {why}: "
                              f"not a finite model input")
        return x, y

    def client(self, cid: int, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
        if split not in INDEX_SPLITS or split not in self.index.splits:
            raise FedrayError(f"{self.url} has no per-client {split} data")
        if not 0 <= cid < self.population:
            raise FedrayError(f"{self.url}: client {cid} is outside 0..{self.population - 1}")
        ix = self.index
        shard, lo, n = (int(ix.shards(split)[cid]), int(ix.offsets(split)[cid]),
                        int(ix.counts(split)[cid]))
        problem = row_problem(split, shard, lo, n, self._files[split])
        if problem is not None:  # a foreign or edited index: say so, not a reshape error
            raise FedrayError(f"{ix.where}: client {cid} ({ix.name(cid)!r}) {problem}")
        x, y = self._rows(split, shard, lo, n, cid)
        if len(y) and not 0 <= int(y.min()) <= int(y.max()) < self.num_classes:
            # verify_store finds these before a run; with data.verify off, say it here
            bad = int(y.min()) if y.min() < 0 else int(y.max())
            raise FedrayError(f"{self.url}: client {cid} ({ix.name(cid)!r}) has "
                              f"{split} label {bad}, outside 0..{self.num_classes - 1}")
        return x, y

    def central_test(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The shared test set, or the union of every client's test data."""
        split = "central_test" if self._files["central_test"] else "test"
        parts = [self._rows(split, i, 0, sh["rows"]) for i, sh in enumerate(self._files[split])
                 if sh["rows"] > 0]
        if not parts:
            return None
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
