"""Loaders for the official on-disk formats: real files where we have them, exact replicas
written here (same names, layouts and dtypes) where we cannot download them.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import struct
import tarfile
import types
from pathlib import Path

import h5py
import numpy as np
import pytest

from fedray.data.sources.cifar100 import load_cifar100
from fedray.data.sources.leaf import load_leaf_femnist
from fedray.data.sources.loaders import LOADERS, load_source
from fedray.data.sources.mnist import load_mnist
from fedray.data.sources.tff import load_tff_cifar100, load_tff_emnist
from fedray.errors import FedrayError

# --- LEAF FEMNIST ------------------------------------------------------------------------


def test_leaf_real(shared_data):
    ds = load_leaf_femnist(str(shared_data / "femnist-leaf-sample"))
    assert ds.name == "leaf_femnist" and ds.num_classes == 62 and ds.scale == 1.0
    assert len(ds.owners) == 105 and ds.owners == sorted(ds.owners)
    assert len(ds.train) == 14_708 and len(ds.test) == 1_685
    for split in (ds.train, ds.test):
        assert split.x.shape == (len(split), 1, 28, 28) and split.x.dtype == np.float32
        assert split.y.dtype == np.int64 and split.owner.dtype == np.int64
        assert 0.0 <= split.x.min() and split.x.max() <= 1.0
        assert set(np.unique(split.owner)) == set(range(105))  # every writer in both splits
        assert np.count_nonzero(np.diff(split.owner)) == 104  # one block per writer
    assert np.unique(np.concatenate([ds.train.y, ds.test.y])).size == 62
    assert np.median(ds.train.x) == 1.0  # white background


def _leaf_shard(users: dict[str, tuple[list, list]], counts: dict[str, int] | None = None
                ) -> dict:
    counts = counts or {}
    return {"users": list(users),
            "num_samples": [counts.get(u, len(users[u][1])) for u in users],
            "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()}}


def _write_leaf(root: Path, train: dict[str, dict], test: dict[str, dict]) -> Path:
    for split, shards in (("train", train), ("test", test)):
        (root / split).mkdir(parents=True, exist_ok=True)
        for name, doc in shards.items():
            (root / split / name).write_text(json.dumps(doc))
    return root


def _rows(n: int, fill: float) -> list[list[float]]:
    return [[fill] * 784 for _ in range(n)]


def test_leaf_order_owners_and_values(tmp_path):
    a = _rows(2, 1.0)
    a[1][28 * 3 + 5] = 0.25  # pixel (row 3, col 5) of the second example of writer "w_b"
    train = {
        # listed out of order on purpose; written in reverse name order too
        "all_data_1_niid_0_keep_0_train_9.json": _leaf_shard({"w_c": (_rows(1, 0.5), [61])}),
        "all_data_0_niid_0_keep_0_train_9.json": _leaf_shard(
            {"w_b": (a, [3, 4]), "w_a": (_rows(3, 0.0), [0, 1, 2])}),
    }
    test = {"all_data_0_niid_0_keep_0_test_9.json": _leaf_shard(
        {"w_z": (_rows(1, 1.0), [9]), "w_a": (_rows(1, 0.0), [7])})}
    ds = load_leaf_femnist(str(_write_leaf(tmp_path, train, test)))
    assert ds.owners == ["w_a", "w_b", "w_c", "w_z"]  # union of both splits, sorted
    np.testing.assert_array_equal(ds.train.y, [0, 1, 2, 3, 4, 61])
    np.testing.assert_array_equal(ds.train.owner, [0, 0, 0, 1, 1, 2])
    np.testing.assert_array_equal(ds.test.y, [7, 9])
    np.testing.assert_array_equal(ds.test.owner, [0, 3])
    assert ds.train.x.shape == (6, 1, 28, 28) and ds.train.x.dtype == np.float32
    assert ds.train.x[4, 0, 3, 5] == 0.25 and ds.train.x[4, 0, 3, 6] == 1.0
    assert ds.train.x[5].min() == ds.train.x[5].max() == 0.5
    assert ds.train.coarse is None and ds.num_coarse is None


@pytest.mark.parametrize("case, pattern", [
    ("count", r"train_9\.json: writer 'w1': num_samples says 3 but x has 2 rows"),
    ("row", r"train_9\.json: writer 'w1': every x row must have 784 values"),
    ("ragged", r"train_9\.json: writer 'w1': x must be a list of 784-value rows"),
    ("label", r"train_9\.json: writer 'w1': labels must be in 0\.\.61"),
    ("json", r"train_9\.json: invalid JSON"),
    ("missing_key", r"train_9\.json: missing key 'num_samples'"),
])
def test_leaf_bad_shards(tmp_path, case, pattern):
    good = _leaf_shard({"w1": (_rows(2, 1.0), [1, 2])})
    test = {"all_data_0_x_test_9.json": good}
    name = "all_data_0_x_train_9.json"
    if case == "count":
        doc = _leaf_shard({"w1": (_rows(2, 1.0), [1, 2])}, counts={"w1": 3})
    elif case == "row":
        doc = _leaf_shard({"w1": ([[1.0] * 783, [1.0] * 783], [1, 2])})
    elif case == "ragged":
        doc = _leaf_shard({"w1": ([[1.0] * 784, [1.0] * 783], [1, 2])})
    elif case == "label":
        doc = _leaf_shard({"w1": (_rows(2, 1.0), [1, 62])})
    else:
        doc = good
    _write_leaf(tmp_path, {name: doc}, test)
    if case == "json":
        (tmp_path / "train" / name).write_text('{"users": ["w1"], "num_')
    if case == "missing_key":
        del doc["num_samples"]
        (tmp_path / "train" / name).write_text(json.dumps(doc))
    with pytest.raises(FedrayError, match=pattern) as err:
        load_leaf_femnist(str(tmp_path))
    assert "\n" not in str(err.value)


def test_leaf_missing_dirs_and_files(tmp_path):
    (tmp_path / "train").mkdir()
    with pytest.raises(FedrayError, match=r"train: no LEAF files matching"):
        load_leaf_femnist(str(tmp_path))
    (tmp_path / "train" / "all_data_0_train_9.json").write_text(
        json.dumps(_leaf_shard({"w": (_rows(1, 1.0), [0])})))
    with pytest.raises(FedrayError, match=r"test: LEAF test/ directory not found"):
        load_leaf_femnist(str(tmp_path))


# --- MNIST IDX -----------------------------------------------------------------------------


def test_mnist_real(shared_data):
    ds = load_mnist(str(shared_data / "mnist-t10k"))
    assert ds.name == "mnist" and ds.num_classes == 10 and ds.scale == pytest.approx(1 / 255)
    assert ds.test is None  # only t10k is shipped: it becomes the train split
    assert ds.train.x.shape == (10_000, 1, 28, 28) and ds.train.x.dtype == np.uint8
    assert ds.train.y.dtype == np.int64 and ds.train.y[0] == 7
    assert np.bincount(ds.train.y).size == 10 and np.bincount(ds.train.y).min() > 0
    assert ds.train.x.max() == 255 and ds.train.x[0].sum() > 0 and ds.owners is None


def _idx(arr: np.ndarray, magic: int) -> bytes:
    return struct.pack(f">I{arr.ndim}I", magic, *arr.shape) + arr.astype(np.uint8).tobytes()


def _write_mnist(root: Path, prefix: str, images: np.ndarray, labels: np.ndarray,
                 gz: bool = True) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for stem, data in ((f"{prefix}-images-idx3-ubyte", _idx(images, 0x803)),
                       (f"{prefix}-labels-idx1-ubyte", _idx(labels, 0x801))):
        if gz:
            (root / f"{stem}.gz").write_bytes(gzip.compress(data))
        else:
            (root / stem).write_bytes(data)


def test_mnist_roundtrip_gzip_and_plain(tmp_path):
    g = np.random.default_rng(0)
    tr_x, tr_y = g.integers(0, 256, (5, 28, 28), dtype=np.uint8), np.array([3, 1, 4, 1, 5])
    te_x, te_y = g.integers(0, 256, (3, 28, 28), dtype=np.uint8), np.array([9, 2, 6])
    _write_mnist(tmp_path, "train", tr_x, tr_y, gz=True)
    _write_mnist(tmp_path, "t10k", te_x, te_y, gz=False)
    ds = load_mnist(str(tmp_path))
    assert ds.train.x.shape == (5, 1, 28, 28) and ds.test.x.shape == (3, 1, 28, 28)
    np.testing.assert_array_equal(ds.train.x[:, 0], tr_x)
    np.testing.assert_array_equal(ds.test.x[:, 0], te_x)
    np.testing.assert_array_equal(ds.train.y, tr_y)
    np.testing.assert_array_equal(ds.test.y, te_y)
    assert ds.train.x.flags.writeable


@pytest.mark.parametrize("case, pattern", [
    ("truncated", r"t10k-images-idx3-ubyte\.gz: truncated: header says 2x28x28 = 1568 bytes"),
    ("magic", r"t10k-images-idx3-ubyte\.gz: IDX magic number is 0x00000801, expected 0x00000803"),
    ("count", r"t10k-labels-idx1-ubyte\.gz: 3 labels but t10k-images-idx3-ubyte\.gz has 2"),
    ("half", r"t10k-labels-idx1-ubyte\[\.gz\] not found"),
    ("gzip", r"t10k-images-idx3-ubyte\.gz: cannot read"),
    ("label", r"t10k-labels-idx1-ubyte\.gz: labels must be in 0\.\.9"),
])
def test_mnist_bad_files(tmp_path, case, pattern):
    images, labels = np.zeros((2, 28, 28), np.uint8), np.array([1, 2])
    _write_mnist(tmp_path, "t10k", images, labels)
    img, lab = tmp_path / "t10k-images-idx3-ubyte.gz", tmp_path / "t10k-labels-idx1-ubyte.gz"
    if case == "truncated":
        img.write_bytes(gzip.compress(_idx(images, 0x803)[:-10]))
    elif case == "magic":
        img.write_bytes(gzip.compress(_idx(images, 0x801)))
    elif case == "count":
        lab.write_bytes(gzip.compress(_idx(np.array([1, 2, 3]), 0x801)))
    elif case == "half":
        lab.unlink()
    elif case == "gzip":
        img.write_bytes(img.read_bytes()[:30])  # a cut-off download
    elif case == "label":
        lab.write_bytes(gzip.compress(_idx(np.array([1, 10]), 0x801)))
    with pytest.raises(FedrayError, match=pattern):
        load_mnist(str(tmp_path))


def test_mnist_empty_dir(tmp_path):
    with pytest.raises(FedrayError, match="no MNIST IDX files"):
        load_mnist(str(tmp_path))


# --- CIFAR-100 python pickles --------------------------------------------------------------


def _cifar_doc(n: int, seed: int) -> tuple[dict, np.ndarray]:
    g = np.random.default_rng(seed)
    data = g.integers(0, 256, (n, 3072), dtype=np.uint8)
    # image 1, pixel (row 5, col 7): R=200, G=100, B=50 in the R/G/B planes of the row
    data[1, 5 * 32 + 7], data[1, 1024 + 5 * 32 + 7], data[1, 2048 + 5 * 32 + 7] = 200, 100, 50
    fine = [int(v) for v in g.integers(0, 100, n)]
    fine[0] = 99
    doc = {b"filenames": [f"img_{i}.png".encode() for i in range(n)],
           b"batch_label": b"training batch 1 of 1",
           b"fine_labels": fine,
           b"coarse_labels": [v // 5 for v in fine],
           b"data": data}
    return doc, data


_META = {b"fine_label_names": [f"fine{i}".encode() for i in range(100)],
         b"coarse_label_names": [f"coarse{i}".encode() for i in range(20)]}


def _write_cifar(folder: Path, dump=None) -> dict[str, dict]:
    """The three pickles, written by Python 3 with protocol 2 (``dump`` overrides that)."""
    folder.mkdir(parents=True, exist_ok=True)
    docs = {"train": _cifar_doc(6, 0)[0], "test": _cifar_doc(4, 1)[0], "meta": _META}
    for name, doc in docs.items():
        with open(folder / name, "wb") as f:
            if dump is None:
                pickle.dump(doc, f, protocol=2)
            else:
                f.write(dump(doc))
    return docs


class _Py2Pickler(pickle._Pickler):
    """Writes byte strings and ASCII text the way Python 2's cPickle did (BINSTRING), and
    numpy's array constructor under its numpy 1 name, like the files on the CIFAR site."""

    dispatch = pickle._Pickler.dispatch.copy()

    def save_bytes(self, obj):
        raw = obj.encode("latin1") if isinstance(obj, str) else obj
        if len(raw) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(raw)]) + raw)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(raw)) + raw)
        self.memoize(obj)

    dispatch[bytes] = save_bytes
    dispatch[str] = save_bytes

    def save_global(self, obj, name=None):
        if getattr(obj, "__name__", None) == "_reconstruct":
            self.write(pickle.GLOBAL + b"numpy.core.multiarray\n_reconstruct\n")
            self.memoize(obj)
        else:
            super().save_global(obj, name)

    dispatch[types.BuiltinFunctionType] = save_global


def _py2_dumps(obj) -> bytes:
    import io

    buf = io.BytesIO()
    _Py2Pickler(buf, protocol=2).dump(obj)
    return buf.getvalue()


def _check_cifar(ds, docs) -> None:
    assert ds.name == "cifar100" and ds.num_classes == 100 and ds.num_coarse == 20
    assert ds.scale == pytest.approx(1 / 255) and ds.owners is None
    for split, name in ((ds.train, "train"), (ds.test, "test")):
        doc = docs[name]
        assert split.x.shape == (len(doc[b"data"]), 3, 32, 32) and split.x.dtype == np.uint8
        np.testing.assert_array_equal(split.x.reshape(len(split), -1), doc[b"data"])
        np.testing.assert_array_equal(split.y, doc[b"fine_labels"])
        np.testing.assert_array_equal(split.coarse, doc[b"coarse_labels"])
        assert split.y.dtype == split.coarse.dtype == np.int64 and split.owner is None
        assert list(split.x[1, :, 5, 7]) == [200, 100, 50]  # R, G, B planes in order
    assert ds.train.y[0] == 99 and ds.train.coarse[0] == 19


def test_cifar100_folder_and_parent(tmp_path):
    docs = _write_cifar(tmp_path / "cifar-100-python")
    _check_cifar(load_cifar100(str(tmp_path / "cifar-100-python")), docs)
    _check_cifar(load_cifar100(str(tmp_path)), docs)


def test_cifar100_python2_pickles(tmp_path):
    docs = _write_cifar(tmp_path, dump=_py2_dumps)
    assert b"numpy.core.multiarray" in (tmp_path / "train").read_bytes()
    assert b"_codecs" not in (tmp_path / "train").read_bytes()
    _check_cifar(load_cifar100(str(tmp_path)), docs)


def test_cifar100_tar_gz(tmp_path):
    docs = _write_cifar(tmp_path / "src" / "cifar-100-python")
    archive = tmp_path / "dl" / "cifar-100-python.tar.gz"
    archive.parent.mkdir()
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tmp_path / "src" / "cifar-100-python", arcname="cifar-100-python")
    _check_cifar(load_cifar100(str(archive)), docs)
    _check_cifar(load_cifar100(str(archive.parent)), docs)  # a folder holding the archive


class _RunsCommand:
    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def test_cifar100_malicious_pickle_is_refused_and_not_run(tmp_path):
    _write_cifar(tmp_path)
    marker = tmp_path / "pwned"
    doc, _ = _cifar_doc(2, 0)
    doc[b"batch_label"] = _RunsCommand(f"touch {marker}")
    (tmp_path / "train").write_bytes(pickle.dumps(doc, protocol=2))
    with pytest.raises(FedrayError, match=r"train: pickle refers to \w+\.system.*refused"):
        load_cifar100(str(tmp_path))
    assert not marker.exists()


def test_cifar100_object_array_is_refused(tmp_path):
    _write_cifar(tmp_path)
    doc, _ = _cifar_doc(2, 0)
    doc[b"data"] = np.array([b"x", 1], dtype=object)
    (tmp_path / "test").write_bytes(pickle.dumps(doc, protocol=2))
    with pytest.raises(FedrayError, match=r"test: .*(objects|refused)"):
        load_cifar100(str(tmp_path))


@pytest.mark.parametrize("case, pattern", [
    ("not_pickle", r"train: not a CIFAR-100 pickle"),
    ("missing_key", r"train: missing key b'coarse_labels'"),
    ("columns", r"train: b'data' must be a uint8 array \[n, 3072\]"),
    ("fine_range", r"train: b'fine_labels' has labels outside 0\.\.99"),
    ("coarse_count", r"train: b'coarse_labels' must be 6 integers"),
    ("meta", r"meta: b'coarse_label_names' must list 20 names"),
    ("no_test", r"test: CIFAR-100 file not found"),
])
def test_cifar100_bad_files(tmp_path, case, pattern):
    _write_cifar(tmp_path)
    doc, data = _cifar_doc(6, 0)
    if case == "not_pickle":
        (tmp_path / "train").write_bytes(b"<html>404 Not Found</html>")
    elif case == "meta":
        (tmp_path / "meta").write_bytes(pickle.dumps(
            {**_META, b"coarse_label_names": [b"a"] * 10}, protocol=2))
    elif case == "no_test":
        (tmp_path / "test").unlink()
    else:
        if case == "missing_key":
            del doc[b"coarse_labels"]
        elif case == "columns":
            doc[b"data"] = data[:, :3000]
        elif case == "fine_range":
            doc[b"fine_labels"][2] = 100
        elif case == "coarse_count":
            doc[b"coarse_labels"] = doc[b"coarse_labels"][:5]
        (tmp_path / "train").write_bytes(pickle.dumps(doc, protocol=2))
    with pytest.raises(FedrayError, match=pattern):
        load_cifar100(str(tmp_path))


# --- TFF h5 ------------------------------------------------------------------------------


def _write_h5(file: Path, clients: dict[str, dict[str, np.ndarray]]) -> None:
    with h5py.File(file, "w") as f:
        examples = f.create_group("examples")
        for cid, fields in clients.items():
            group = examples.create_group(cid)
            for key, value in fields.items():
                group.create_dataset(key, data=value)


def _emnist_client(n: int, seed: int, classes: int = 62) -> dict[str, np.ndarray]:
    g = np.random.default_rng(seed)
    return {"pixels": g.random((n, 28, 28), dtype=np.float32),
            "label": g.integers(0, classes, n).astype(np.int32)}


def test_tff_emnist_roundtrip(tmp_path):
    train = {"f0001_41": _emnist_client(3, 1), "f0000_14": _emnist_client(2, 0)}
    test = {"f0000_14": _emnist_client(1, 2), "f0002_07": _emnist_client(2, 3)}
    _write_h5(tmp_path / "fed_emnist_train.h5", train)
    _write_h5(tmp_path / "fed_emnist_test.h5", test)
    ds = load_tff_emnist(str(tmp_path))
    assert ds.name == "tff_emnist" and ds.num_classes == 62 and ds.scale == 1.0
    assert ds.owners == ["f0000_14", "f0001_41", "f0002_07"]
    assert ds.train.x.shape == (5, 1, 28, 28) and ds.train.x.dtype == np.float32
    np.testing.assert_array_equal(ds.train.x[:2, 0], train["f0000_14"]["pixels"])
    np.testing.assert_array_equal(ds.train.x[2:, 0], train["f0001_41"]["pixels"])
    np.testing.assert_array_equal(
        ds.train.y, np.concatenate([train["f0000_14"]["label"], train["f0001_41"]["label"]]))
    assert ds.train.y.dtype == np.int64
    np.testing.assert_array_equal(ds.train.owner, [0, 0, 1, 1, 1])
    np.testing.assert_array_equal(ds.test.owner, [0, 2, 2])
    np.testing.assert_array_equal(ds.test.x[0, 0], test["f0000_14"]["pixels"][0])


def test_tff_emnist_digitsonly_fallback(tmp_path):
    _write_h5(tmp_path / "fed_emnist_digitsonly_train.h5", {"a": _emnist_client(2, 0, 10)})
    _write_h5(tmp_path / "fed_emnist_digitsonly_test.h5", {"b": _emnist_client(1, 1, 10)})
    ds = load_tff_emnist(str(tmp_path))
    assert ds.num_classes == 10 and ds.owners == ["a", "b"] and len(ds.train) == 2
    # a label that is fine for 62 classes is out of range for the digits-only set
    _write_h5(tmp_path / "fed_emnist_digitsonly_test.h5",
              {"b": {"pixels": np.ones((1, 28, 28), np.float32), "label": np.array([12])}})
    with pytest.raises(FedrayError, match=r"digitsonly_test\.h5: 'examples/b/label' has labels"):
        load_tff_emnist(str(tmp_path))


def _cifar_client(n: int, seed: int) -> dict[str, np.ndarray]:
    g = np.random.default_rng(seed)
    fine = g.integers(0, 100, n).astype(np.int64)
    return {"image": g.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8),
            "label": fine, "coarse_label": fine // 5}


def test_tff_cifar100_roundtrip(tmp_path):
    train = {"0": _cifar_client(2, 0), "10": _cifar_client(1, 1), "1": _cifar_client(2, 2)}
    train["1"]["image"][1, 4, 6] = [10, 20, 30]  # (row 4, col 6) of the 2nd image of "1"
    test = {"0": _cifar_client(2, 3), "3": _cifar_client(1, 4)}
    _write_h5(tmp_path / "fed_cifar100_train.h5", train)
    _write_h5(tmp_path / "fed_cifar100_test.h5", test)
    ds = load_tff_cifar100(str(tmp_path))
    assert ds.name == "tff_cifar100" and ds.num_classes == 100 and ds.num_coarse == 20
    assert ds.scale == pytest.approx(1 / 255)
    assert ds.owners == ["0", "1", "10", "3"]  # union of the ids of both splits, sorted
    assert ds.train.x.shape == (5, 3, 32, 32) and ds.train.x.dtype == np.uint8
    assert ds.train.x.flags.c_contiguous
    order = ["0", "1", "10"]
    images = np.concatenate([train[c]["image"] for c in order])
    np.testing.assert_array_equal(ds.train.x, images.transpose(0, 3, 1, 2))
    assert list(ds.train.x[3, :, 4, 6]) == [10, 20, 30]  # R, G, B
    np.testing.assert_array_equal(ds.train.y, np.concatenate([train[c]["label"] for c in order]))
    np.testing.assert_array_equal(
        ds.train.coarse, np.concatenate([train[c]["coarse_label"] for c in order]))
    np.testing.assert_array_equal(ds.train.owner, [0, 0, 1, 1, 2])
    np.testing.assert_array_equal(ds.test.owner, [0, 0, 3])
    assert ds.test.coarse.dtype == np.int64


def test_tff_missing_key_and_file(tmp_path):
    bad = _cifar_client(2, 0)
    del bad["coarse_label"]
    _write_h5(tmp_path / "fed_cifar100_train.h5", {"0": _cifar_client(1, 1), "7": bad})
    _write_h5(tmp_path / "fed_cifar100_test.h5", {"0": _cifar_client(1, 2)})
    with pytest.raises(FedrayError,
                       match=r"fed_cifar100_train\.h5: missing key 'examples/7/coarse_label'"):
        load_tff_cifar100(str(tmp_path))
    (tmp_path / "fed_cifar100_test.h5").unlink()
    with pytest.raises(FedrayError, match=r"fed_cifar100_test\.h5: file not found"):
        load_tff_cifar100(str(tmp_path))
    with h5py.File(tmp_path / "fed_emnist_train.h5", "w") as f:
        f.create_group("clients")
    _write_h5(tmp_path / "fed_emnist_test.h5", {"a": _emnist_client(1, 0)})
    with pytest.raises(FedrayError, match=r"fed_emnist_train\.h5: missing key 'examples'"):
        load_tff_emnist(str(tmp_path))
    (tmp_path / "fed_emnist_train.h5").write_bytes(b"not hdf5")
    with pytest.raises(FedrayError, match=r"fed_emnist_train\.h5: not a readable HDF5 file"):
        load_tff_emnist(str(tmp_path))


# --- registry ----------------------------------------------------------------------------


def test_registry_and_load_source(tmp_path):
    assert set(LOADERS) == {"leaf_femnist", "tff_emnist", "tff_cifar100", "cifar100",
                            "cifar10", "mnist", "leaf_shakespeare", "tff_shakespeare",
                            "shakespeare_folio", "tff_stackoverflow", "leaf_sent140",
                            "leaf_celeba", "leaf_reddit"}
    with pytest.raises(FedrayError,
                       match=r"recipe key 'source\.name': must be one of: leaf_femnist, "):
        load_source("femnist", str(tmp_path))
    with pytest.raises(FedrayError, match=r"recipe key 'source\.path': .*nowhere does not exist"):
        load_source("mnist", str(tmp_path / "nowhere"))
    _write_mnist(tmp_path, "t10k", np.full((1, 28, 28), 7, np.uint8), np.array([4]))
    ds = load_source("mnist", str(tmp_path))
    assert ds.train.y.tolist() == [4] and ds.train.x[0, 0, 27, 27] == 7


# --- degenerate files of the official formats: one line naming the file (issue 39, 7) ------


def _empty_leaf(root: Path, users: bool) -> None:
    shard = _leaf_shard({"w1": ([], [])}) if users else _leaf_shard({})
    _write_leaf(root, {"all_data_0_x_train_9.json": shard}, {"all_data_0_x_test_9.json": shard})
    load_leaf_femnist(str(root))


def _empty_mnist(root: Path) -> None:
    _write_mnist(root, "t10k", np.zeros((0, 28, 28), np.uint8), np.zeros(0, np.int64))
    load_mnist(str(root))


def _empty_cifar(root: Path) -> None:
    docs = _write_cifar(root)
    docs["train"][b"data"] = np.zeros((0, 3072), np.uint8)
    docs["train"][b"fine_labels"] = docs["train"][b"coarse_labels"] = []
    (root / "train").write_bytes(_py2_dumps(docs["train"]))  # as the real files were written
    load_cifar100(str(root))


@pytest.mark.parametrize("make, message", [
    (lambda p: _empty_leaf(p, users=True), r"train: its 1 LEAF file\(s\) hold no examples "
     r"\(1 writers, num_samples all 0\)$"),
    (lambda p: _empty_leaf(p, users=False), r"train: its 1 LEAF file\(s\) list no writers$"),
    (_empty_mnist, r"t10k-images-idx3-ubyte\.gz: its IDX header says 0 images$"),
    (_empty_cifar, r"train: b'data' holds no images \(0 rows\)$"),
])
def test_empty_official_files_are_one_line(tmp_path, make, message):
    """A LEAF, MNIST or CIFAR-100 file of no examples: one line naming it. Checked by
    reverting: each loaded as a data set of 0 train rows, and `fedray partition` then ended
    in a traceback (hold_out_test's "need at least one array to concatenate") or in "a store
    needs at least one client", which names no file."""
    with pytest.raises(FedrayError, match=message) as info:
        make(tmp_path)
    assert "\n" not in str(info.value)


def test_load_source_refuses_a_source_of_no_train_examples(tmp_path, monkeypatch):
    """Whatever a loader returns, a data set of no train examples stops at load_source,
    naming the path, rather than in a partitioner."""
    from fedray.data.dataset import Dataset
    from fedray.data.examples import Split
    from fedray.data.sources import loaders

    empty = Dataset("mnist", Split(np.zeros((0, 1, 28, 28), np.uint8), np.zeros(0, np.int64)),
                    None, num_classes=10)
    monkeypatch.setitem(loaders.LOADERS, "mnist", lambda path: empty)
    with pytest.raises(FedrayError, match=r": source mnist found no train examples there$"):
        load_source("mnist", str(tmp_path))
