"""Recipes and `fedray partition`: validation, building stores, describing, real data."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from conftest import tiny_job

import fedray
from fedray.data.recipe import build, load_recipe
from fedray.data.sources.mnist import load_mnist
from fedray.data.store.format import read_manifest
from fedray.data.store.reader import StoreSource, client_index
from fedray.errors import ConfigError, FedrayError

ROOT = pathlib.Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "partitions").glob("*.yaml"))


def _synthetic(tmp_path, name="store", **over):
    args = [f"out={tmp_path / name}", "source.num_writers=30", "partitioner.num_clients=40",
            *[f"{k}={v}" for k, v in over.items()]]
    return build(ROOT / "partitions" / "synthetic_dirichlet.yaml", args)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_every_recipe_validates(recipe, tmp_path):
    from omegaconf import OmegaConf

    from fedray.data.sources.loaders import GENERATED

    generated = OmegaConf.load(recipe).source.name in GENERATED  # they take no path
    cfg = load_recipe(recipe, [f"out={tmp_path}/s"] +
                      ([] if generated else [f"source.path={tmp_path}"]))
    assert cfg.partitioner.name


@pytest.mark.parametrize("override, match", [
    (["sourc.name=mnist"], "unknown recipe key 'sourc"),
    (["partitioner.alpha=-1"], r"recipe key 'partitioner.alpha': must be > 0"),
    (["partitioner.similarity=0.5"], "'partitioner.similarity': is not used by 'dirichlet'"),
    (["partitioner.name=nope"], "partitioner.name"),
    (["source.name=imagenet"], "source.name"),
    (["out=null"], "recipe key 'out'"),
    (["partitioner.num_clients=10000000"], "num_clients"),
])
def test_bad_recipes(tmp_path, override, match):
    args = [f"out={tmp_path / 's'}", "source.num_writers=5", "partitioner.num_clients=10",
            *override]
    with pytest.raises((ConfigError, FedrayError), match=match):
        build(ROOT / "partitions" / "synthetic_dirichlet.yaml", args)
    assert not (tmp_path / "s").exists() and not list(tmp_path.glob(".s*"))


def test_missing_source_path_is_named(tmp_path):
    with pytest.raises(ConfigError, match="source.path"):
        load_recipe(ROOT / "partitions" / "dirichlet.yaml", [f"out={tmp_path}/s"])
    with pytest.raises(FedrayError, match="does not exist"):
        build(ROOT / "partitions" / "dirichlet.yaml",
              [f"out={tmp_path}/s", f"source.path={tmp_path}/nothing"])


def test_wrong_format_source_leaves_no_store(tmp_path):
    (tmp_path / "mnist").mkdir()
    (tmp_path / "mnist" / "t10k-images-idx3-ubyte").write_bytes(b"\x00\x00\x08\x01garbage")
    (tmp_path / "mnist" / "t10k-labels-idx1-ubyte").write_bytes(b"\x00\x00\x08\x01")
    with pytest.raises(FedrayError, match="t10k-"):
        build(ROOT / "partitions" / "dirichlet.yaml",
              [f"out={tmp_path}/s", f"source.path={tmp_path}/mnist"])
    assert not (tmp_path / "s").exists()


def test_synthetic_dirichlet_store_is_deterministic(tmp_path):
    url, a = _synthetic(tmp_path, "a")
    _, b = _synthetic(tmp_path, "b")
    assert a["client_index"] == b["client_index"] and a["shards"] == b["shards"]
    assert a["num_clients"] == 40 and a["central_test"]["rows"] > 0
    other, c = _synthetic(tmp_path, "c", seed=1)
    assert not np.array_equal(client_index(url, a).histograms(),
                              client_index(other, c).histograms())


def test_cli_partition_and_describe(tmp_path):
    env = dict(os.environ)
    cmd = [sys.executable, "-m", "fedray.cli", "partition"]
    recipe = str(ROOT / "partitions" / "synthetic_dirichlet.yaml")
    out = subprocess.run(cmd + [recipe, f"out={tmp_path}/s", "--quiet", "source.num_writers=20",
                                "partitioner.num_clients=30"],  # overrides after an option
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "done: 30 clients" in out.stdout and "wrote" not in out.stderr
    out = subprocess.run(cmd + ["--describe", f"{tmp_path}/s"], capture_output=True, text=True,
                         env=env, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "clients:      30" in out.stdout and "checksums ok" in out.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]  # no plot unless asked
    out = subprocess.run(cmd + ["--describe", f"{tmp_path}/s", "--plot", f"{tmp_path}/d.png"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "d.png").read_bytes()[:4] == b"\x89PNG"
    out = subprocess.run(cmd + [recipe, f"out={tmp_path}/s2", "partitioner.alpha=0"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "partitioner.alpha" in out.stderr and "Traceback" not in out.stderr


def test_run_on_a_store_with_federated_eval(ray_cluster, tmp_path):
    url, _ = _synthetic(tmp_path, "s", **{"source.min_examples": 10, "source.max_examples": 20})
    job = tiny_job(tmp_path, data={"partition": url}, rounds=2, eval={"every": 1})
    res = fedray.run(job)
    assert res.summary["population"] == 40 and "test_accuracy" in res.metrics[-1]
    (tmp_path / "s" / "train-00000.arrow").write_bytes(b"broken")
    with pytest.raises(FedrayError, match="train-00000.arrow"):
        fedray.run(job, overrides=[f"output.dir={tmp_path}/run2"])
    assert not (tmp_path / "run2").exists()


def test_real_leaf_femnist_store(shared_data, ray_cluster, tmp_path):
    url, m = build(ROOT / "partitions" / "femnist.yaml",
                   [f"source.path={shared_data / 'femnist-leaf-sample'}", f"out={tmp_path}/fem"])
    ix = client_index(url, m)
    assert m["num_clients"] == 105
    assert ix.counts("train").sum() == 14_708
    assert ix.counts("test").sum() == 1_685
    hist = ix.class_totals("train")
    assert (hist > 0).all() and len(hist) == 62
    src = StoreSource(url)
    x, y = src.client(0)
    assert x.shape == (ix.counts("train")[0], 1, 28, 28) and np.median(x) == 1.0
    res = fedray.run(ROOT / "jobs" / "femnist_leaf.yaml",
                     overrides=[f"data.partition={url}", "rounds=2", "eval.every=1",
                                f"output.dir={tmp_path}/run"])
    assert "fed_test_accuracy" in res.metrics[-1] and "test_accuracy" in res.metrics[-1]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["population"] == 105
    assert read_manifest(url)["partitioner"]["name"] == "natural"


def _write_cifar100(root: pathlib.Path, per_fine: int, seed: int) -> None:
    """cifar-100-python/{train,test,meta} exactly as the official archive lays them out."""
    import pickle

    from test_partitioners import CIFAR100_COARSE

    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    g = np.random.default_rng(seed)
    for split, n_per in (("train", per_fine), ("test", max(1, per_fine // 5))):
        fine = np.repeat(np.arange(100), n_per)
        doc = {b"data": g.integers(0, 256, size=(len(fine), 3072), dtype=np.uint8),
               b"fine_labels": fine.tolist(),
               b"coarse_labels": [CIFAR100_COARSE[f] for f in fine],
               b"filenames": [f"img_{i}.png".encode() for i in range(len(fine))],
               b"batch_label": f"{split} batch".encode()}
        with open(folder / split, "wb") as f:
            pickle.dump(doc, f, protocol=2)
    with open(folder / "meta", "wb") as f:
        pickle.dump({b"fine_label_names": [f"f{i}".encode() for i in range(100)],
                     b"coarse_label_names": [f"c{i}".encode() for i in range(20)]}, f,
                    protocol=2)


def test_fed_cifar100_recipe_end_to_end(tmp_path):
    """The shipped recipe on official-format pickles: Pachinko invariants hold in the store."""
    _write_cifar100(tmp_path / "raw", per_fine=10, seed=0)  # 1,000 train / 200 test
    url, m = build(ROOT / "partitions" / "fed_cifar100.yaml",
                   [f"source.path={tmp_path / 'raw'}", f"out={tmp_path / 'store'}",
                    "partitioner.examples_per_client=10"])
    ix = client_index(url, m)
    assert ix.names()[:3] == ["0", "1", "2"] and m["num_clients"] == 100
    train = ix.histograms("train")
    assert (train.sum(axis=1) == 10).all() and (train.sum(axis=0) == 10).all()
    test = ix.counts("test")
    assert (test[:20] == 10).all() and (test[20:] == 0).all()
    src = StoreSource(url)
    x, y = src.client(7)
    assert x.shape == (10, 3, 32, 32) and x.dtype == np.float32 and 0 <= x.min() <= x.max() <= 1
    assert src.num_classes == 100 and m["num_coarse"] == 20


def test_test_fraction_holds_out_a_stratified_central_test_set(shared_data, tmp_path):
    """MNIST t10k alone has no test split: test_fraction carves one out, by label and seed."""
    args = [f"source.path={shared_data / 'mnist-t10k'}", "partitioner.num_clients=50",
            "test_fraction=0.2"]
    _, m = build(ROOT / "partitions" / "dirichlet.yaml", [f"out={tmp_path / 'a'}", *args])
    _, again = build(ROOT / "partitions" / "dirichlet.yaml", [f"out={tmp_path / 'b'}", *args])
    assert m["central_test"]["rows"] == 2000 and m["client_index"] == again["client_index"]
    src = StoreSource(str(tmp_path / "a"))
    x_test, y_test = src.central_test()
    train = src.index.class_totals("train")
    test = np.bincount(y_test, minlength=10)
    assert train.sum() == 8000 and np.abs(test / 2000 - train / 8000).max() < 1e-3
    # nothing lost, nothing duplicated: train + test hold exactly the t10k images
    rows = [src.client(c)[0].reshape(-1, 784) for c in range(50)]
    seen = np.concatenate([*rows, x_test.reshape(-1, 784)])
    every = load_mnist(str(shared_data / "mnist-t10k")).train.x.reshape(-1, 784)
    assert len(np.unique(seen, axis=0)) == len(np.unique(every, axis=0))
    assert len(seen) == 10000
    with pytest.raises(ConfigError, match="test_fraction"):
        load_recipe(ROOT / "partitions" / "dirichlet.yaml",
                    [f"out={tmp_path / 'c'}", *args[:2], "test_fraction=1.0"])


def test_test_fraction_refuses_a_source_with_its_own_test_split(tmp_path):
    with pytest.raises(ConfigError, match="test_fraction.*already has a test split"):
        _synthetic(tmp_path, "s", test_fraction=0.2)
    assert not (tmp_path / "s").exists() and not list(tmp_path.glob(".s*"))
