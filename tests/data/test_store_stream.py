"""Streamed store builds: generated writers written block by block give the store the
gathered data set gives, byte for byte, whatever the blocks and processes."""

import hashlib
import importlib
import pathlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from fedray.data.examples import Split
from fedray.data.partitioners import partition
from fedray.data.recipe import build, load_dataset, load_recipe, synthetic_source, to_uint8
from fedray.data.sources.synthetic import SyntheticFEMNIST
from fedray.data.store.reader import StoreSource
from fedray.data.store.verify import verify_store
from fedray.data.store.writer import write_store
from fedray.errors import ConfigError

ROOT = pathlib.Path(__file__).resolve().parents[2]
MILLION = ROOT / "partitions" / "synthetic_million.yaml"
natural_mod = importlib.import_module("fedray.data.partitioners.natural")  # not the function


@pytest.fixture
def one_thread():
    """Generating tiny clients on several torch threads is slower, not faster."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _files(path: pathlib.Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


def test_streamed_build_equals_the_gathered_build(tmp_path, one_thread):
    """The million-writer recipe at 300 writers, streamed (as ``fedray partition`` builds
    it), against ``natural`` on every writer gathered into one uint8 data set and written by
    write_store, plus the generator's central test set: every file, manifest included, has
    the same bytes. Small shards and blocks: several of each, cut in different places."""
    over = ["source.num_writers=300", "shard_mb=0.1", f"out={tmp_path / 'streamed'}"]
    url, m = build(MILLION, over)
    cfg = load_recipe(MILLION, over)
    data = load_dataset(cfg.source)  # every writer in memory, pixels as bytes
    assert data.train.x.dtype == np.uint8 and data.scale == 1 / 255
    cx, cy = synthetic_source(cfg.source).central_test()
    write_store(str(tmp_path / "gathered"), data, partition(data, "natural", 0, min_examples=0),
                recipe=m["recipe"], shard_mb=0.1, central_test=Split(to_uint8(cx), cy))
    streamed, gathered = _files(tmp_path / "streamed"), _files(tmp_path / "gathered")
    assert streamed == gathered
    assert sum(n.startswith("train-") for n in streamed) > 3 and "central_test-00000.arrow" \
        in streamed and "test-00000.arrow" in streamed and "clients.arrow" in streamed
    verify_store(url)
    src = StoreSource(url)
    x, y = src.client(123)
    raw_x, raw_y = SyntheticFEMNIST(300, 2, 8).client(123)  # the writer, in canonical order
    assert sorted(y.tolist()) == sorted(raw_y.tolist()) and x.dtype == np.float32
    order = np.argsort(raw_y, kind="stable")
    # pixels rounded to bytes: within half a step of 1/255 of the generated floats
    assert np.abs(np.sort(x.reshape(len(y), -1).sum(1)) -
                  np.sort(raw_x[order].reshape(len(y), -1).sum(1))).max() < 784 * 0.5 / 255
    assert len(src.central_test()[1]) == len(cy)  # the 200 writers' set, not every client's


def test_blocks_come_back_in_order_from_a_pool(monkeypatch, one_thread):
    """Blocks generated concurrently, and writers dropped below min_examples, give the
    clients ``natural`` gives on the gathered data set, in the same order (a thread pool
    stands in for the spawned processes, which cost seconds to start)."""
    monkeypatch.setattr(natural_mod, "_executor", lambda n: ThreadPoolExecutor(n))
    source = SyntheticFEMNIST(num_clients=40, min_examples=2, max_examples=8, seed=3)
    pooled = list(natural_mod.natural_blocks(source, 5, block_clients=3, processes=2))
    alone = list(natural_mod.natural_blocks(source, 5, block_clients=40))
    data = source.to_dataset()
    want = partition(data, "natural", 0, min_examples=5)
    assert 0 < want.info["dropped_clients"] < 40
    names = [n for b in pooled for n in b.names]
    assert names == want.client_names == [n for b in alone for n in b.names]
    assert np.sum([b.dropped for b in pooled], axis=0).tolist() == \
        [want.info["dropped_clients"], want.info["dropped_train_examples"],
         want.info["dropped_test_examples"]]
    for split, idx in (("train", want.train), ("test", want.test)):
        rows = np.concatenate(idx)
        full = data.train if split == "train" else data.test
        for got in (pooled, alone):
            parts = [getattr(b, split) for b in got]
            np.testing.assert_array_equal(np.concatenate([p.x for p in parts]), full.x[rows])
            np.testing.assert_array_equal(np.concatenate([p.y for p in parts]), full.y[rows])


@pytest.mark.parametrize("override, match", [
    (["source.dtype=float16"], r"recipe key 'source.dtype': must be float32 or uint8, for "
                               r"source synthetic only, got 'float16'"),
    (["source.name=mnist", "source.path=x", "partitioner.name=iid",
      "partitioner.num_clients=2", "partitioner.min_examples=null"],
     r"recipe key 'source.dtype': .* got 'uint8'"),
    (["test_fraction=0.2"], r"'test_fraction': source 'synthetic' already has a test split"),
])
def test_million_recipe_refuses(tmp_path, override, match):
    with pytest.raises(ConfigError, match=match):
        build(MILLION, [f"out={tmp_path / 's'}", "source.num_writers=5", *override])
    assert not list(tmp_path.iterdir())


def test_recipe_builds_every_population_of_the_same_writers(tmp_path, one_thread):
    """num_writers picks the population; writer k is the same writer in each."""
    logs: list[str] = []
    small, _ = build(MILLION, ["source.num_writers=20", f"out={tmp_path / 'a'}"],
                     log=logs.append)
    large, m = build(MILLION, ["source.num_writers=50", f"out={tmp_path / 'b'}"])
    a, b = StoreSource(small), StoreSource(large)
    assert (a.population, b.population) == (20, 50) and m["dtype"] == "uint8"
    for c in (0, 7, 19):
        for s in ("train", "test"):
            np.testing.assert_array_equal(a.client(c, s)[0], b.client(c, s)[0])
    assert any("20 of 20 clients (100%)" in line for line in logs)
