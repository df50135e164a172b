"""Partition store: write/read round trip, zero-copy reads, integrity checks, atomic writes."""

import json

import numpy as np
import pytest

from fedray.data.dataset import Dataset, Split
from fedray.data.partition import Partition
from fedray.data.store import StoreSource, read_manifest, verify_store, write_store
from fedray.errors import FedrayError


def _dataset(n=300, dtype=np.uint8, test=True):
    g = np.random.default_rng(0)
    if dtype == np.uint8:
        x = g.integers(0, 256, size=(n, 1, 4, 4), dtype=np.uint8)
    else:
        x = g.random((n, 1, 4, 4), dtype=np.float32)
    y = g.integers(0, 5, size=n)
    tsplit = Split(x[:50].copy(), y[:50].copy()) if test else None
    return Dataset("toy", Split(x, y), tsplit, num_classes=5,
                   scale=1 / 255 if dtype == np.uint8 else 1.0)


def _partition(n=300, k=7, test=False):
    idx = np.random.default_rng(1).permutation(n)
    parts = np.array_split(idx, k)
    tparts = np.array_split(np.arange(50), k) if test else None
    return Partition([f"c{i}" for i in range(k)], parts, tparts, info={"note": "toy"})


def _write(tmp_path, ds=None, part=None, name="s", **kw):
    url = str(tmp_path / name)
    write_store(url, ds or _dataset(), part or _partition(), recipe={"source": {"name": "toy"},
                "seed": 0, "partitioner": {"name": "toy"}}, **kw)
    return url


def test_round_trip_and_manifest(tmp_path):
    ds, part = _dataset(), _partition()
    url = _write(tmp_path, ds, part, shard_mb=0.002)  # tiny shards: many per split
    m = read_manifest(url)
    assert m["num_clients"] == 7 and m["clients"]["names"][0] == "c0"
    assert len([s for s in m["shards"] if s["split"] == "train"]) > 2
    assert m["central_test"]["rows"] == 50 and m["info"] == {"note": "toy"}
    src = StoreSource(url)
    assert list(src.train_sizes()) == [len(p) for p in part.train]
    for k, idx in enumerate(part.train):
        x, y = src.client(k)
        np.testing.assert_array_equal(y, ds.train.y[idx])
        np.testing.assert_allclose(x, ds.train.x[idx].astype(np.float32) / 255)
        hist = np.bincount(ds.train.y[idx], minlength=5).tolist()
        assert m["clients"]["train"]["label_histogram"][k] == hist
    tx, ty = src.central_test()
    np.testing.assert_array_equal(ty, ds.test.y)
    verify_store(url)


def test_float_store_reads_are_zero_copy_views(tmp_path):
    url = _write(tmp_path, _dataset(dtype=np.float32))
    x, y = StoreSource(url).client(3)
    assert not x.flags.owndata and not x.flags.writeable  # a view into the mapped shard
    assert x.dtype == np.float32 and x.shape[1:] == (1, 4, 4)


def test_per_client_test_split_and_label_override(tmp_path):
    ds, part = _dataset(), _partition(test=True)
    flipped = [(ds.train.y[i] + 1) % 5 for i in part.train]
    part = Partition(part.client_names, part.train, part.test, train_labels=flipped)
    url = _write(tmp_path, ds, part)
    src = StoreSource(url)
    assert src.has_client_test and read_manifest(url)["central_test"] is None
    for k in range(7):
        np.testing.assert_array_equal(src.client(k)[1], flipped[k])
        np.testing.assert_array_equal(src.client(k, "test")[1], ds.test.y[part.test[k]])
    assert len(src.central_test()[1]) == 50  # the union of the clients' test data


def test_client_never_spans_shards_and_open_shards_are_bounded(tmp_path):
    url = _write(tmp_path, shard_mb=0.001)
    m = read_manifest(url)
    src = StoreSource(url, max_open_shards=2)
    for k in range(7):
        shard = m["clients"]["train"]["shard"][k]
        rows = next(s for s in m["shards"] if s["file"] == f"train-{shard:05d}.arrow")["rows"]
        assert m["clients"]["train"]["offset"][k] + m["clients"]["train"]["count"][k] <= rows
        src.client(k)
        assert len(src._open) <= 2


def test_memory_filesystem(tmp_path):
    url = f"memory://fedray-store-test/{tmp_path.name}"
    write_store(url, _dataset(), _partition(), recipe={"source": {"name": "toy"}})
    src = StoreSource(url)
    assert src.client(2)[0].shape[0] == len(_partition().train[2])
    verify_store(url)


def test_existing_target_refused_and_failed_write_leaves_nothing(tmp_path):
    url = _write(tmp_path)
    with pytest.raises(FedrayError, match="already exists"):
        _write(tmp_path)
    bad = _partition(test=True)  # per-client test data, but the source has no test split
    with pytest.raises(FedrayError, match="no test split"):
        _write(tmp_path, _dataset(test=False), bad, name="t")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]  # no 't', no temp dir
    assert StoreSource(url).population == 7


def test_corrupt_missing_and_truncated_shards(tmp_path):
    url = _write(tmp_path)
    shard = tmp_path / "s" / "train-00000.arrow"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(FedrayError, match="train-00000.arrow is corrupt"):
        verify_store(url)
    shard.write_bytes(bytes(data[:100]))
    with pytest.raises(FedrayError, match="train-00000.arrow has 100 bytes"):
        StoreSource(url).client(0)
    shard.unlink()
    with pytest.raises(FedrayError, match="train-00000.arrow is missing"):
        verify_store(url)
    with pytest.raises(FedrayError, match="missing"):
        StoreSource(url).client(0)


def test_bad_manifest(tmp_path):
    url = _write(tmp_path)
    mpath = tmp_path / "s" / "manifest.json"
    m = json.loads(mpath.read_text())
    mpath.write_text(json.dumps(dict(m, format_version=99)))
    with pytest.raises(FedrayError, match="format version 99"):
        read_manifest(url)
    mpath.write_text("{not json")
    with pytest.raises(FedrayError, match="not valid JSON"):
        read_manifest(url)
    with pytest.raises(FedrayError, match="no partition store"):
        read_manifest(str(tmp_path / "nothing"))


def _edit_manifest(tmp_path, change) -> str:
    url = _write(tmp_path)  # one train shard
    mpath = tmp_path / "s" / "manifest.json"
    m = json.loads(mpath.read_text())
    change(m)
    mpath.write_text(json.dumps(m))
    return url


@pytest.mark.parametrize("change, message", [
    (lambda m: m["clients"]["train"]["count"].__setitem__(6, 10_000),
     r"client 6 \('c6'\) has train rows \d+\.\.\d+, past the 300 rows of train-00000.arrow"),
    (lambda m: m["clients"]["train"]["offset"].__setitem__(1, 1),
     r"clients 0 \('c0'\) and 1 \('c1'\) share train rows \d+\.\.\d+ of train-00000.arrow"),
    (lambda m: m["clients"]["train"]["shard"].__setitem__(2, 99),
     r"client 2 \('c2'\) has train shard 99, .*: the train split has 1 shards"),
    (lambda m: m["clients"]["train"]["count"].pop(),
     r"clients.train.count must list 7 clients"),
    (lambda m: m["clients"]["train"]["offset"].__setitem__(0, "x"),
     r"clients.train.offset must be whole numbers"),
    (lambda m: m.__setitem__("num_clients", 0), r"num_clients must be a whole number >= 1"),
])
def test_manifest_structure_is_checked_on_open(tmp_path, change, message):
    """A manifest whose clients do not fit its shards is refused when the store is opened
    (fedray run, fedray partition --describe), not in a worker mid-round: before, a count
    past its shard crashed a worker with a reshape error, and overlapping clients trained
    silently on shared rows. Checked by reverting: these opened without a word."""
    url = _edit_manifest(tmp_path, change)
    with pytest.raises(FedrayError, match=message):
        read_manifest(url)


def test_verify_reads_labels_rows_and_histograms(tmp_path):
    import hashlib

    import pyarrow as pa

    url = _write(tmp_path)
    shard = tmp_path / "s" / "train-00000.arrow"
    with pa.memory_map(str(shard)) as source:
        batch = pa.ipc.open_file(source).get_batch(0)

    def rewrite(y, x=None) -> None:
        cols = [x if x is not None else batch.column(0), pa.array(y, pa.int64())]
        new = pa.record_batch(cols, schema=batch.schema if x is None else
                              pa.schema([pa.field("x", x.type), batch.schema.field(1)]))
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, new.schema) as writer:
            writer.write_batch(new)
        data = sink.getvalue().to_pybytes()
        shard.write_bytes(data)
        mpath = tmp_path / "s" / "manifest.json"
        m = json.loads(mpath.read_text())
        for sh in m["shards"]:
            if sh["file"] == shard.name:
                sh.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
        mpath.write_text(json.dumps(m))

    y = batch.column(1).to_numpy().copy()
    bad = y.copy()
    bad[5] = 7  # outside the 5 classes; checksums made to match
    rewrite(bad)
    with pytest.raises(FedrayError, match=r"shard train-00000.arrow row 5 has label 7, outside "
                       r"0\.\.4 \(num_classes 5\)"):
        verify_store(url)
    with pytest.raises(FedrayError, match=r"client \d+ \('c\d'\) has train label 7, outside "
                       r"0\.\.4"):  # data.verify off: the worker reading it says which client
        src = StoreSource(url)
        for c in range(src.population):
            src.client(c)
    swapped = y.copy()
    swapped[[0, 1]] = (y[0] + 1) % 5, (y[1] + 1) % 5  # in range, but not what the manifest
    rewrite(swapped)  # counted for these clients
    with pytest.raises(FedrayError, match="labels differ from the manifest's label histogram"):
        verify_store(url)
    rewrite(y)
    verify_store(url)  # the original labels pass again
