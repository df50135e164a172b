"""CIFAR-10's python pickles (fedray.data.sources.cifar10), on files written here exactly as
the official ones are: cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta}, each a
protocol-2 pickle of a dict with byte-string keys, and the .tar.gz holding that folder."""

from __future__ import annotations

import os
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest

from fedray.data.sources.cifar10 import load_cifar10
from fedray.data.sources.loaders import load_source
from fedray.errors import FedrayError

BATCHES = [f"data_batch_{i}" for i in range(1, 6)]
PER_BATCH = 4


def _batch(name: str, n: int, seed: int) -> dict:
    g = np.random.default_rng(seed)
    data = g.integers(0, 256, (n, 3072), dtype=np.uint8)
    # image 1, pixel (row 5, col 7): R=200, G=100, B=50 in the R/G/B planes of the row
    data[1, 5 * 32 + 7], data[1, 1024 + 5 * 32 + 7], data[1, 2048 + 5 * 32 + 7] = 200, 100, 50
    labels = [int(v) for v in g.integers(0, 10, n)]
    label = b"testing batch 1 of 1" if name == "test_batch" else \
        f"training batch {name[-1]} of 5".encode()
    return {b"batch_label": label, b"labels": labels, b"data": data,
            b"filenames": [f"img_{seed}_{i}.png".encode() for i in range(n)]}


def _meta(per_batch: int = PER_BATCH) -> dict:
    names = [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog", b"horse",
             b"ship", b"truck"]
    return {b"label_names": names, b"num_cases_per_batch": per_batch, b"num_vis": 3072}


def _write(folder: Path) -> dict[str, dict]:
    folder.mkdir(parents=True, exist_ok=True)
    docs = {name: _batch(name, PER_BATCH, i) for i, name in enumerate([*BATCHES, "test_batch"])}
    docs["batches.meta"] = _meta()
    for name, doc in docs.items():
        (folder / name).write_bytes(pickle.dumps(doc, protocol=2))
    return docs


def _check(ds, docs) -> None:
    assert ds.name == "cifar10" and ds.num_classes == 10 and ds.scale == pytest.approx(1 / 255)
    assert ds.owners is None and ds.num_coarse is None
    train_data = np.concatenate([docs[b][b"data"] for b in BATCHES])
    train_y = sum((docs[b][b"labels"] for b in BATCHES), [])
    for split, data, y in ((ds.train, train_data, train_y),
                           (ds.test, docs["test_batch"][b"data"], docs["test_batch"][b"labels"])):
        assert split.x.shape == (len(data), 3, 32, 32) and split.x.dtype == np.uint8
        np.testing.assert_array_equal(split.x.reshape(len(split), -1), data)
        np.testing.assert_array_equal(split.y, y)
        assert split.y.dtype == np.int64 and split.owner is None and split.coarse is None
    assert list(ds.train.x[1, :, 5, 7]) == [200, 100, 50]  # R, G, B planes in order
    assert list(ds.test.x[1, :, 5, 7]) == [200, 100, 50]


def test_folder_parent_and_registry(tmp_path):
    docs = _write(tmp_path / "cifar-10-batches-py")
    _check(load_cifar10(str(tmp_path / "cifar-10-batches-py")), docs)
    _check(load_cifar10(str(tmp_path)), docs)
    _check(load_source("cifar10", str(tmp_path)), docs)


def test_tar_gz_read_in_place(tmp_path):
    docs = _write(tmp_path / "src" / "cifar-10-batches-py")
    (tmp_path / "src" / "cifar-10-batches-py" / "readme.html").write_text("<html></html>")
    archive = tmp_path / "dl" / "cifar-10-python.tar.gz"
    archive.parent.mkdir()
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tmp_path / "src" / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    _check(load_cifar10(str(archive)), docs)
    _check(load_cifar10(str(archive.parent)), docs)  # a folder holding the archive
    assert sorted(os.listdir(archive.parent)) == ["cifar-10-python.tar.gz"]  # nothing unpacked


def test_meta_is_optional(tmp_path):
    docs = _write(tmp_path)
    (tmp_path / "batches.meta").unlink()
    _check(load_cifar10(str(tmp_path)), docs)


class _RunsCommand:
    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def test_hostile_pickle_is_refused_and_not_run(tmp_path):
    _write(tmp_path)
    marker = tmp_path / "pwned"
    doc = _batch("data_batch_3", PER_BATCH, 0)
    doc[b"batch_label"] = _RunsCommand(f"touch {marker}")
    (tmp_path / "data_batch_3").write_bytes(pickle.dumps(doc, protocol=2))
    with pytest.raises(FedrayError, match=r"data_batch_3: pickle refers to \w+\.system, "
                       r"which a CIFAR-10 file never does \(refused, nothing was run\)$"):
        load_cifar10(str(tmp_path))
    assert not marker.exists()


def _labels_as(value):
    def edit(doc):
        doc[b"labels"] = value
    return edit


@pytest.mark.parametrize("name, edit, pattern", [
    ("data_batch_2", None, r"data_batch_2: CIFAR-10 file not found$"),
    ("test_batch", None, r"test_batch: CIFAR-10 file not found$"),
    ("data_batch_1", "html", r"data_batch_1: not a CIFAR-10 pickle \("),
    ("data_batch_4", lambda d: d.pop(b"labels"), r"data_batch_4: missing key b'labels'$"),
    ("data_batch_5", lambda d: d.update({b"data": d[b"data"].reshape(-1, 3, 32, 32)}),
     r"data_batch_5: b'data' must be a uint8 array \[n, 3072\], got uint8 \(4, 3, 32, 32\)$"),
    ("data_batch_1", lambda d: d.update({b"data": d[b"data"][:, :3000]}),
     r"data_batch_1: b'data' must be a uint8 array \[n, 3072\]"),
    ("data_batch_2", lambda d: d.update({b"data": d[b"data"].astype(np.float32)}),
     r"data_batch_2: b'data' must be a uint8 array \[n, 3072\], got float32"),
    ("data_batch_3", _labels_as([0, 1, 10, 2]),
     r"data_batch_3: b'labels' has labels outside 0\.\.9$"),
    ("test_batch", _labels_as([0, 1, -1, 2]), r"test_batch: b'labels' has labels outside 0\.\.9$"),
    ("data_batch_4", _labels_as([0, 1, 2]),
     r"data_batch_4: b'labels' must be 4 integers \(one per image\), got int64 \(3,\)$"),
    ("data_batch_5", _labels_as(["cat"] * 4), r"data_batch_5: b'labels' must be 4 integers"),
    ("test_batch", lambda d: d.update({b"data": d[b"data"][:0], b"labels": []}),
     r"test_batch: b'data' holds no images \(0 rows\)$"),
    ("batches.meta", lambda d: d.update({b"label_names": [b"cat"] * 9}),
     r"batches\.meta: b'label_names' must list 10 names$"),
    ("batches.meta", lambda d: d.update({b"num_vis": 1024}),
     r"batches\.meta: b'num_vis' must be 3072 \(values per image\), got 1024$"),
    ("batches.meta", lambda d: d.pop(b"num_cases_per_batch"),
     r"batches\.meta: missing key b'num_cases_per_batch'$"),
    ("data_batch_2", lambda d: d.update({b"data": d[b"data"][:3], b"labels": d[b"labels"][:3]}),
     r"data_batch_2: b'data' holds 3 images, but .*batches\.meta says "
     r"b'num_cases_per_batch' is 4 \(a truncated batch\?\)$"),
])
def test_malformed_files_are_one_line_naming_file_and_field(tmp_path, name, edit, pattern):
    docs = _write(tmp_path)
    file = tmp_path / name
    if edit is None:
        file.unlink()
    elif edit == "html":
        file.write_bytes(b"<html>404 Not Found</html>")
    else:
        edit(docs[name])
        # protocol 4: Python 3 writes an empty array's bytes in protocol 2 as a call of
        # builtins.bytes, which the unpickler refuses (the real files never hold one)
        file.write_bytes(pickle.dumps(docs[name], protocol=4))
    with pytest.raises(FedrayError, match=pattern) as info:
        load_cifar10(str(tmp_path))
    assert "\n" not in str(info.value)


def test_archive_missing_a_batch(tmp_path):
    _write(tmp_path / "src" / "cifar-10-batches-py")
    (tmp_path / "src" / "cifar-10-batches-py" / "data_batch_5").unlink()
    archive = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tmp_path / "src" / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    with pytest.raises(FedrayError, match=r"cifar-10-python\.tar\.gz: member "
                       r"cifar-10-batches-py/data_batch_5 not found$"):
        load_cifar10(str(archive))


def test_no_data_there(tmp_path):
    with pytest.raises(FedrayError, match=r"no CIFAR-10 data \(expected data_batch_1\.\.5 and "
                       r"test_batch pickles, a cifar-10-batches-py/ folder or "
                       r"cifar-10-python\.tar\.gz\)$"):
        load_cifar10(str(tmp_path))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["iid", "dirichlet"])
def test_recipe_and_job_end_to_end(tmp_path, kind):
    """The shipped recipe on official-format batches, then one round of the shipped job."""
    import fedray
    from fedray.data.recipe import build

    root = Path(__file__).resolve().parents[2]
    _write(tmp_path / "raw")  # 20 train images, 4 test
    url, m = build(root / "partitions" / f"cifar10_{kind}.yaml",
                   [f"source.path={tmp_path / 'raw'}", f"out={tmp_path / 'store'}",
                    "partitioner.num_clients=5",
                    *(["partitioner.examples_per_client=4"] if kind == "dirichlet" else [])])
    assert m["num_clients"] == 5
    res = fedray.run(root / "jobs" / "cifar10" / f"pfl_{kind}.yaml",
                     overrides=[f"data.partition={url}", "rounds=1", "sampling.clients_per_round=3",
                                "runtime.worker.num_cpus=1", f"output.dir={tmp_path / 'run'}"])
    last = res.metrics[-1]
    assert last["updates"] == 3 and last["examples"] == 12 and "test_accuracy" in last
