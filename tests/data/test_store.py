"""Partition store: write/read round trip, zero-copy reads, integrity checks, atomic writes."""

import hashlib
import json
import pickle

import numpy as np
import pyarrow as pa
import pytest

from fedray.data.dataset import Dataset
from fedray.data.examples import Split
from fedray.data.partition import Partition
from fedray.data.store.client_index import index_schema
from fedray.data.store.format import read_manifest
from fedray.data.store.reader import StoreSource, client_index
from fedray.data.store.verify import verify_store
from fedray.data.store.writer import write_store
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
    assert m["num_clients"] == 7 and m["format_version"] == 2 and "clients" not in m
    assert len([s for s in m["shards"] if s["split"] == "train"]) > 2
    assert m["central_test"]["rows"] == 50 and m["info"] == {"note": "toy"}
    src = StoreSource(url)
    assert src.name(0) == "c0" and src.index.names() == part.client_names
    assert list(src.train_sizes()) == [len(p) for p in part.train]
    hists = []
    for k, idx in enumerate(part.train):
        x, y = src.client(k)
        np.testing.assert_array_equal(y, ds.train.y[idx])
        np.testing.assert_allclose(x, ds.train.x[idx].astype(np.float32) / 255)
        hists.append(np.bincount(ds.train.y[idx], minlength=5))
        np.testing.assert_array_equal(src.index.histogram(k), hists[-1])
    np.testing.assert_array_equal(src.index.histograms("train"), hists)
    np.testing.assert_array_equal(src.index.histograms("train", [5, 1]), [hists[5], hists[1]])
    np.testing.assert_array_equal(src.index.class_totals("train"), np.sum(hists, axis=0))
    starts, labels, counts = src.index.sparse("train")  # only the labels a client holds
    assert starts[-1] == np.count_nonzero(hists) and counts.min() >= 1
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
    ix = src.index
    for k in range(7):
        shard = ix.shards()[k]
        rows = next(s for s in m["shards"] if s["file"] == f"train-{shard:05d}.arrow")["rows"]
        assert ix.offsets()[k] + ix.counts()[k] <= rows
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


def _rewrite_index(store, change=None, batch=None, checksum=True) -> None:
    """Replace the store's clients.arrow with ``change(columns)`` of its columns (a dict of
    numpy arrays and Arrow arrays) or with ``batch``; and, with ``checksum``, its size and
    sha256 in the manifest: an index written wrong by something other than fedray."""
    path = store / "clients.arrow"
    with pa.memory_map(str(path)) as source:
        old = pa.ipc.open_file(source).read_all().combine_chunks().to_batches()[0]
    if batch is None:
        cols = {name: (col.to_numpy().copy() if pa.types.is_integer(col.type) else col)
                for name, col in zip(old.schema.names, old.columns, strict=True)}
        change(cols)
        batch = pa.RecordBatch.from_arrays([pa.array(c) if isinstance(c, np.ndarray) else c
                                            for c in cols.values()], names=list(cols))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, batch.schema) as writer:
        writer.write_batch(batch)
    data = sink.getvalue().to_pybytes()
    path.write_bytes(data)
    if checksum:
        mpath = store / "manifest.json"
        m = json.loads(mpath.read_text())
        m["client_index"].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
        mpath.write_text(json.dumps(m))


def _set(name, i, value):
    return lambda cols: cols[name].__setitem__(i, value)


@pytest.mark.parametrize("change, message, on_read", [
    (_set("train_count", 6, 10_000),
     r"client 6 \('c6'\) has train rows \d+\.\.\d+, past the 300 rows of train-00000.arrow", 6),
    (_set("train_offset", 1, 1),
     r"clients 0 \('c0'\) and 1 \('c1'\) share train rows \d+\.\.\d+ of train-00000.arrow",
     None),
    (_set("train_shard", 2, 99),
     r"client 2 \('c2'\) has train shard 99, .*: the train split has 1 shards", 2),
    (_set("train_offset", 3, -5), r"client 3 \('c3'\) has train shard 0, offset -5", 3),
])
def test_index_structure_is_checked_by_verify_and_on_read(tmp_path, change, message, on_read):
    """An index whose clients do not fit the shards (a foreign or hand-edited store whose
    checksums were made to match) is refused by verify_store, naming clients.arrow: before
    the first round with data.verify on, and by ``fedray partition --describe``. Opening does
    not pass over every client any more (that is what made a million clients slow); a worker
    still checks the client it reads, so with data.verify off a count past its shard is one
    line, not a reshape error. Checked by reverting: verify_store passed these."""
    url = _write(tmp_path)  # one train shard
    _rewrite_index(tmp_path / "s", change)
    src = StoreSource(url)  # opens: the per-client checks are not done here
    with pytest.raises(FedrayError, match=r"s/clients.arrow: " + message):
        verify_store(url)
    if on_read is not None:
        with pytest.raises(FedrayError, match=r"s/clients.arrow: " + message):
            src.client(on_read)


@pytest.mark.parametrize("change, message", [
    (lambda c: [c.__setitem__(k, v[:-1]) for k, v in list(c.items())],
     r"holds 6 clients, the manifest says 7"),
    (lambda c: c.__setitem__("train_offset", pa.array([str(v) for v in range(7)],
                                                      pa.large_string())),
     r"column 2 must be train_offset: int64, found train_offset: large_string"),
    (lambda c: c.pop("train_histogram"), r"column 4 must be train_histogram: .*found nothing"),
    (lambda c: c.__setitem__("extra", c["train_count"]), r"has 6 columns, expected 5"),
    (lambda c: c.__setitem__("train_count", pa.array([1, 2, None, 4, 5, 6, 7], pa.int64())),
     r"column train_count has missing values"),
])
def test_index_file_is_checked_on_open(tmp_path, change, message):
    url = _write(tmp_path)
    _rewrite_index(tmp_path / "s", change)
    with pytest.raises(FedrayError, match=r"s/clients.arrow: " + message):
        StoreSource(url).train_sizes()


def test_index_file_missing_truncated_or_changed(tmp_path):
    url = _write(tmp_path)
    path = tmp_path / "s" / "clients.arrow"
    data = path.read_bytes()
    _rewrite_index(tmp_path / "s", _set("train_count", 0, 1), checksum=False)
    with pytest.raises(FedrayError, match=r"s: clients.arrow is corrupt \(checksum mismatch\)"):
        verify_store(url)
    path.write_bytes(data[:200])
    with pytest.raises(FedrayError, match=rf"s/clients.arrow: has 200 bytes, the manifest says "
                       rf"{len(data)}"):
        StoreSource(url).train_sizes()
    path.unlink()
    with pytest.raises(FedrayError, match=r"s/clients.arrow: is missing"):
        StoreSource(url).client(0)
    with pytest.raises(FedrayError, match=r"s: clients.arrow is missing"):
        verify_store(url)


def _pop(key):
    return lambda m: m.pop(key)


def _put(key, value):
    return lambda m: m.__setitem__(key, value)


def _shard0(key, value):
    return lambda m: m["shards"][0].__setitem__(key, value)


@pytest.mark.parametrize("change, message", [
    (_put("num_clients", 0), r"num_clients must be a whole number >= 1, got 0$"),
    (lambda m: m["client_index"].__setitem__("splits", ["test"]),
     r"client_index\.splits must be \['train'\] or \['train', 'test'\], got \['test'\]$"),
    (lambda m: m["client_index"].pop("sha256"),
     r"client_index\.sha256 is missing \(it must be 64 lowercase hex digits\)$"),
    # every field a reader relies on, missing or malformed: one line naming it
    (_pop("num_classes"), r"num_classes is missing \(it must be a whole number from 1 to "
     r"1,000,000\)$"),
    (_put("num_classes", 10**9), r"num_classes must be a whole number from 1 to 1,000,000, "
     r"got 1000000000$"),
    (_put("num_classes", "5"), r"num_classes must be .*, got '5'$"),
    (_put("num_classes", 5.0), r"num_classes must be .*, got 5\.0$"),
    (_pop("input_shape"), r"input_shape is missing"),
    (_put("input_shape", []), r"input_shape must be a list of 1 to 8 whole numbers >= 1"),
    (_put("input_shape", [1, 0, 4]), r"input_shape must be .*, got \[1, 0, 4\]$"),
    (_put("input_shape", "1x4x4"), r"input_shape must be .*, got '1x4x4'$"),
    (_put("input_shape", [2**20, 2**20]), r"input_shape must be .*at most 2\*\*31 values"),
    (_put("label_shape", [0]), r"label_shape must be a list of up to 8 whole numbers >= 1"),
    (_pop("scale"), r"scale is missing \(it must be a finite number > 0"),
    (_put("scale", float("nan")), r"scale must be a finite number > 0 .*, got nan$"),
    (_put("scale", float("inf")), r"scale must be a finite number > 0 .*, got inf$"),
    (_put("scale", -1.0), r"scale must be a finite number > 0 .*, got -1\.0$"),
    (_put("scale", "0.5"), r"scale must be .*, got '0\.5'$"),
    (_put("dtype", "object"), r"dtype must be one of uint8, .*float64, got 'object'$"),
    (_pop("dtype"), r"dtype is missing"),
    (_put("num_coarse", 0), r"num_coarse must be null or a whole number"),
    (_put("central_test", {"rows": -1}), r"central_test must be null or"),
    (_put("shards", {}), r"shards must be a list of shards, got \{\}$"),
    (lambda m: m["shards"].__setitem__(0, "train-00000.arrow"),
     r"shards\[0\]\. must be an object|shards\[0\] must be an object"),
    (_shard0("rows", -3), r"shards\[0\]\.rows must be a whole number >= 0, got -3$"),
    (_shard0("split", "valid"), r"shards\[0\]\.split must be one of train, test, central_test"),
    (lambda m: m["shards"][0].pop("bytes"), r"shards\[0\]\.bytes is missing"),
    (_shard0("sha256", "abc"), r"shards\[0\]\.sha256 must be 64 lowercase hex digits"),
    # shard and index paths that would leave the store's directory: refused on open
    (_shard0("file", "../other/train-00000.arrow"), r"shards\[0\]\.file must be a file name "
     r"in the store's directory .*, got '\.\./other/train-00000\.arrow'$"),
    (_shard0("file", "/etc/passwd"), r"shards\[0\]\.file must be a file name"),
    (_shard0("file", "s3://bucket/train-00000.arrow"), r"shards\[0\]\.file must be a file name"),
    (_shard0("file", "file:train-00000.arrow"), r"shards\[0\]\.file must be a file name"),
    (_shard0("file", ".."), r"shards\[0\]\.file must be a file name"),
    (_shard0("file", "sub/train-00000.arrow"), r"shards\[0\]\.file must be a file name"),
    (_shard0("file", "..\\train-00000.arrow"), r"shards\[0\]\.file must be a file name"),
    (lambda m: m["client_index"].__setitem__("file", "../s2/clients.arrow"),
     r"client_index\.file must be a file name"),
    (lambda m: m["shards"].append(dict(m["shards"][0])),
     r"shards\[\d+\]\.file 'train-00000\.arrow' is named twice"),
    (_shard0("file", "clients.arrow"), r"shards\[0\]\.file 'clients\.arrow' is named twice"),
    (_shard0("file", "manifest.json"), r"shards\[0\]\.file 'manifest\.json' is named twice"),
    (_put("source", "toy"), r"source must be an object, got 'toy'$"),
])
def test_manifest_structure_is_checked_on_open(tmp_path, change, message):
    """One schema (fedray.data.store.format.MANIFEST_SCHEMA and its shard and index tables) is
    checked when a store is opened, and a bad field is one line naming manifest.json and
    the field. Checked by reverting to the scattered checks: a NaN or negative scale, a
    missing dtype, input_shape or num_classes, a billion classes and every path case
    opened (the paths were read from outside the store), and the missing ones ended in
    KeyError tracebacks."""
    url = _write(tmp_path)
    mpath = tmp_path / "s" / "manifest.json"
    m = json.loads(mpath.read_text())
    change(m)
    mpath.write_text(json.dumps(m))
    with pytest.raises(FedrayError, match=r"s/manifest\.json: " + message) as info:
        read_manifest(url)
    assert "\n" not in str(info.value)


def _rewrite_shard(store, cols, name="train-00000.arrow", fields=None) -> None:
    """Replace a shard with ``cols`` (Arrow arrays; ``fields`` their names), its size and
    sha256 made to match in the manifest: a shard written wrong by something else."""
    batch = pa.RecordBatch.from_arrays(cols, names=fields or ["x", "y", "coarse"][:len(cols)])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, batch.schema) as writer:
        writer.write_batch(batch)
    data = sink.getvalue().to_pybytes()
    (store / name).write_bytes(data)
    mpath = store / "manifest.json"
    m = json.loads(mpath.read_text())
    for sh in m["shards"]:
        if sh["file"] == name:
            sh.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    mpath.write_text(json.dumps(m))


def _shard_columns(store, name="train-00000.arrow"):
    with pa.memory_map(str(store / name)) as source:
        batch = pa.ipc.open_file(source).get_batch(0)
    return batch.column(0), batch.column(1)


def _fixed(values, width):
    return pa.FixedSizeListArray.from_arrays(values, width)


@pytest.mark.parametrize("make, message", [
    (lambda x, y: [pa.array([str(v) for v in range(len(y))]), y],
     r"column 0 \(x\) is string; the manifest \(dtype uint8, input_shape \[1, 4, 4\]\) "
     r"needs fixed_size_list<item: uint8>\[16\]$"),
    (lambda x, y: [_fixed(pa.array(x.values.to_numpy().astype(np.float64)), 16), y],
     r"column 0 \(x\) is fixed_size_list<item: double>\[16\]; the manifest \(dtype uint8, "),
    (lambda x, y: [_fixed(x.values.slice(0, 8 * len(y)), 8), y],
     r"column 0 \(x\) is fixed_size_list<item: uint8>\[8\]; the manifest \(dtype uint8, "
     r"input_shape \[1, 4, 4\]\)"),
    (lambda x, y: [x, pa.array(y.to_numpy().astype(np.int32))],
     r"column 1 \(y\) is int32; the manifest \(label_shape \[\]\) needs int64$"),
    (lambda x, y: [x], r"has columns \['x'\]; the manifest needs x: fixed_size_list"),
    (lambda x, y: [x, y, y, y], r"has columns \['x', 'y', 'coarse', 'extra'\]"),
    (lambda x, y: [x, pa.array([None] + y.to_pylist()[1:], pa.int64())],
     r"column 1 \(y\) has missing values \(nulls\)$"),
])
def test_shard_columns_are_checked(tmp_path, make, message):
    """A shard whose columns are not what the manifest says (strings for x, another dtype
    or width, int32 labels, a missing or extra column, nulls), its checksum made to match:
    refused in one line naming the shard by data.verify and, as it is opened, by a worker
    reading a client. Checked by reverting: verify_store passed the wrong dtype and width
    wrongly or with a reshape error, and the worker read strings as a reshape ValueError."""
    url = _write(tmp_path)
    x, y = _shard_columns(tmp_path / "s")
    cols = make(x, y)
    _rewrite_shard(tmp_path / "s", cols,
                   fields=["x", "y", "coarse", "extra"][:len(cols)])
    pattern = r"s: shard train-00000\.arrow " + message
    with pytest.raises(FedrayError, match=pattern):
        verify_store(url)
    with pytest.raises(FedrayError, match=pattern):
        StoreSource(url).client(0)


def _float_store(tmp_path, name="f"):
    return _write(tmp_path, _dataset(dtype=np.float32), name=name)


@pytest.mark.parametrize("value, why", [
    (np.nan, "NaN"), (np.inf, r"an infinite value \(inf\)"),
    (-np.inf, r"an infinite value \(-inf\)")])
def test_nonfinite_features_are_found_naming_client_and_shard(tmp_path, value, why):
    """A NaN or infinite feature in a shard (checksums made to match) made every update of
    its client non-finite, each dropped by the guard: a useless run that exited 0. Now
    data.verify names the shard, row and client, and with it off the worker reading the
    client does. Checked by reverting both checks: verify_store passed and client() returned
    the NaN."""
    url = _float_store(tmp_path)
    store = tmp_path / "f"
    src = StoreSource(url)
    cid = 3
    row = int(src.index.offsets()[cid]) + 2  # the client's third example
    x, y = _shard_columns(store)
    flat = x.values.to_numpy().copy()
    flat[row * 16 + 5] = value
    _rewrite_shard(store, [_fixed(pa.array(flat), 16), y])
    with pytest.raises(FedrayError, match=rf"f: shard train-00000\.arrow row {row} \(client "
                       rf"{cid} \('c{cid}'\)\) has {why}: not a finite model input$"):
        verify_store(url)
    src = StoreSource(url)
    src.client(cid - 1)  # its neighbour is fine
    with pytest.raises(FedrayError, match=rf"f: client {cid} \('c{cid}'\): train shard "
                       rf"train-00000\.arrow row {row} has {why}: not a finite model input$"):
        src.client(cid)


def test_features_that_overflow_once_scaled_are_found(tmp_path):
    """Finite bytes times a finite but huge scale overflow float32 when a worker reads them
    (255 * 1e37 = inf): the same useless run. The scale is in the manifest, so opening
    accepts it; data.verify and the worker refuse the inputs."""
    url = _write(tmp_path)  # uint8 pixels, scale 1/255
    mpath = tmp_path / "s" / "manifest.json"
    m = json.loads(mpath.read_text())
    m["scale"] = 1e37
    mpath.write_text(json.dumps(m))
    with pytest.raises(FedrayError, match=r"s: shard train-00000\.arrow row \d+ \(client \d+ "
                       r"\('c\d'\)\) has \d+, which times scale 1e\+37 overflows float32"):
        verify_store(url)
    src = StoreSource(url)
    with pytest.raises(FedrayError, match=r"client 0 \('c0'\): train shard train-00000\.arrow "
                       r"row \d+ has \d+, which times scale 1e\+37 overflows float32"):
        for c in range(src.population):
            src.client(c)


def test_writer_refuses_nonfinite_inputs_and_absurd_facts(tmp_path):
    """The store writer is the last place every source passes (official loaders, a Dataset
    built in Python): a non-finite input is refused naming the client, nothing is left at
    the target, and a data set whose num_classes, scale or dtype the manifest's schema
    would refuse is not written."""
    ds = _dataset(dtype=np.float32)
    ds.train.x[17, 0, 1, 1] = np.nan
    part = _partition()
    owner = next(c for c, idx in enumerate(part.train) if 17 in idx)
    with pytest.raises(FedrayError, match=rf"client 'c{owner}' has train example \d+ with NaN: "
                       r"not a finite model input"):
        _write(tmp_path, ds, part, name="nan")
    assert not (tmp_path / "nan").exists()
    ds = _dataset(dtype=np.float32)
    ds.test.x[3, 0, 0, 0] = 1e38
    ds.scale = 10.0
    with pytest.raises(FedrayError, match=r"has 1e\+38, which times scale 10 overflows float32"):
        _write(tmp_path, ds, name="big")
    for field, value, message in [
            ("num_classes", 10**9, r"num_classes must be a whole number from 1 to 1,000,000, "
             r"got 1000000000"),
            ("scale", float("nan"), r"scale must be a finite number > 0 .*, got nan")]:
        ds = _dataset()
        setattr(ds, field, value)
        with pytest.raises(FedrayError, match=r"the data set's " + message):
            _write(tmp_path, ds, name=field)
        assert not (tmp_path / field).exists()


def test_describe_of_many_classes_allocates_by_what_clients_hold(tmp_path):
    """--describe's picture of a store with 1,000,000 classes (the most a manifest may
    say) draws the labels the clients hold, not 400 clients x a million classes."""
    from fedray.data.store.describe import _shown_histograms

    url = _write(tmp_path)
    ix = StoreSource(url).index
    ix.num_classes = 1_000_000
    h, labels = _shown_histograms(ix, np.arange(7))
    assert h.shape == (7, len(labels)) and list(labels) == [0, 1, 2, 3, 4]
    ix.num_classes = 5
    dense, none = _shown_histograms(ix, np.arange(7))
    assert none is None and (dense == h).all()


def _histogram(cols, rows):
    entries = [e for r in rows for e in r]
    starts = np.concatenate([[0], np.cumsum([len(r) for r in rows])])
    struct = pa.StructArray.from_arrays([pa.array([e[0] for e in entries], pa.int32()),
                                         pa.array([e[1] for e in entries], pa.int32())],
                                        names=["label", "count"])
    cols["train_histogram"] = pa.LargeListArray.from_arrays(pa.array(starts, pa.int64()), struct)


@pytest.mark.parametrize("edit, message", [
    (lambda rows: rows[0].__setitem__(0, (9, rows[0][0][1])),
     r"client 0 \('c0'\) has train label 9 \d+ times in its histogram; labels are 0\.\.4"),
    (lambda rows: rows[1].__setitem__(0, (rows[1][0][0], rows[1][0][1] + 1)),
     r"client 1 \('c1'\): its train histogram counts \d+ labels, but it has 43 examples"),
    (lambda rows: rows[2].reverse(),
     r"client 2 \('c2'\): its train histogram lists labels out of order or twice"),
])
def test_index_histograms_are_checked_by_verify(tmp_path, edit, message):
    url = _write(tmp_path)
    ix = StoreSource(url).index
    rows = [[(int(lab), int(n)) for lab, n in enumerate(ix.histogram(c)) if n]
            for c in range(7)]
    edit(rows)
    _rewrite_index(tmp_path / "s", lambda cols: _histogram(cols, rows))
    with pytest.raises(FedrayError, match=r"s/clients.arrow: " + message):
        verify_store(url)


def _as_v1(store) -> None:
    """Rewrite a store as format version 1 wrote it: manifest.json with the per-client
    JSON lists (names; per split shard, offset, count and the dense label_histogram), no
    client_index and no clients.arrow. The shards are the same in both versions."""
    mpath = store / "manifest.json"
    m = json.loads(mpath.read_text())
    ix = client_index(str(store), m)
    clients = {"names": ix.names()}
    for split in ix.splits:
        clients[split] = {"shard": ix.shards(split).tolist(),
                          "offset": ix.offsets(split).tolist(),
                          "count": ix.counts(split).tolist(),
                          "label_histogram": ix.histograms(split).tolist()}
    v1 = {"format": m["format"], "format_version": 1, "fedray_version": m["fedray_version"],
          "recipe": m["recipe"], "source": m["source"], "seed": m["seed"],
          "partitioner": m["partitioner"], "num_clients": m["num_clients"],
          "num_classes": m["num_classes"], "num_coarse": m["num_coarse"],
          "input_shape": m["input_shape"], "dtype": m["dtype"], "scale": m["scale"],
          "schema": m["schema"], "clients": clients, "central_test": m["central_test"],
          "shards": m["shards"], "info": m["info"]}
    mpath.write_text(json.dumps(v1))
    (store / "clients.arrow").unlink()


@pytest.mark.parametrize("test", [False, True])
def test_version_1_store_reads_as_version_2(tmp_path, test):
    """A store written before the client index (format 1) opens, verifies and reads
    exactly like the same store written now."""
    ds, part = _dataset(), _partition(test=test)
    v2 = StoreSource(_write(tmp_path, ds, part, name="v2", shard_mb=0.002))
    v1_url = _write(tmp_path, ds, part, name="v1", shard_mb=0.002)
    _as_v1(tmp_path / "v1")
    v1 = StoreSource(v1_url)
    assert read_manifest(v1_url)["format_version"] == 1
    assert v1.index.names() == v2.index.names() and v1.has_client_test == v2.has_client_test
    for split in v2.index.splits:
        for col in ("counts", "shards", "offsets"):
            np.testing.assert_array_equal(getattr(v1.index, col)(split),
                                          getattr(v2.index, col)(split))
        np.testing.assert_array_equal(v1.index.histograms(split), v2.index.histograms(split))
        for c in range(7):
            for a, b in zip(v1.client(c, split), v2.client(c, split), strict=True):
                np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(v1.test_sizes(), v2.test_sizes())
    np.testing.assert_array_equal(v1.central_test()[1], v2.central_test()[1])
    verify_store(v1_url)
    m = json.loads((tmp_path / "v1" / "manifest.json").read_text())
    m["clients"]["train"]["offset"][1] = m["clients"]["train"]["offset"][0] + 1
    m["clients"]["train"]["count"].pop()
    (tmp_path / "v1" / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(FedrayError, match=r"v1/manifest.json: clients.train.count must list 7 "
                       r"clients"):
        StoreSource(v1_url)


def test_open_reads_nothing_per_client(tmp_path):
    """Opening a store costs the same at any population: the manifest does not grow with
    the clients, the index is not read when a source is made (it is mapped on first use),
    and the sizes the driver samples from are views of the mapped file, not copies."""
    def store(name, k):
        ds = Dataset("toy", Split(np.zeros((k, 1), np.float32), np.arange(k) % 3), None, 3)
        part = Partition([str(i) for i in range(k)], list(np.arange(k).reshape(k, 1)))
        return _write(tmp_path, ds, part, name=name)

    small, big = store("small", 10), store("big", 20_000)
    sizes = [len((tmp_path / n / "manifest.json").read_bytes()) for n in ("small", "big")]
    assert sizes[1] - sizes[0] < 40  # digits of num_clients, bytes and checksums, not lists
    src = StoreSource(big)
    assert src.index._batch is None  # nothing read yet
    counts = src.train_sizes()
    assert counts.dtype == np.int64 and not counts.flags.owndata and not counts.flags.writeable
    assert src.train_sizes() is counts  # one view, not one copy per call
    assert len(pickle.dumps(src)) < 4_000  # what goes to every worker: no per-client data
    again = pickle.loads(pickle.dumps(src))
    assert again.index._batch is None and again.name(19_999) == "19999"
    assert again.test_sizes().strides == (0,)  # no per-client test data: no memory either
    assert StoreSource(small).index.names() == [str(i) for i in range(10)]


def test_index_schema_is_the_documented_one():
    assert index_schema(["train", "test"]).names == [
        "name", "train_shard", "train_offset", "train_count", "train_histogram",
        "test_shard", "test_offset", "test_count", "test_histogram"]


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
    with pytest.raises(FedrayError, match="labels differ from the label histogram in its "
                       "client index"):
        verify_store(url)
    rewrite(y)
    verify_store(url)  # the original labels pass again


@pytest.mark.parametrize("version", [True, 1.0, "2", None])
def test_format_version_must_be_a_whole_number(tmp_path, version):
    """``true`` and ``1.0`` equal 1 in Python: they were read as format 1. Checked by
    reverting: read_manifest accepted both."""
    url = _write(tmp_path)
    mpath = tmp_path / "s" / "manifest.json"
    mpath.write_text(json.dumps(dict(json.loads(mpath.read_text()), format_version=version)))
    with pytest.raises(FedrayError, match=r"store format version .* is not supported"):
        read_manifest(url)
