"""inner_dirichlet (fedray.data.partitioners.inner_dirichlet): exact client sizes, each
client's class mix ~ Dirichlet(alpha), no example twice, deterministic from (data, seed,
params). Pure numpy except the store test, which builds the shipped recipe twice."""

from __future__ import annotations

import filecmp
import importlib
import json
import pathlib
import pickle

import numpy as np
import pytest

from fedray.data.dataset import Dataset
from fedray.data.examples import Split
from fedray.data.partitioners import PARAMS, partition
from fedray.data.partitioners.inner_dirichlet import _class_counts
from fedray.data.recipe import build
from fedray.errors import FedrayError

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _data(per_class: int = 500, classes: int = 10, seed: int = 0) -> Dataset:
    g = np.random.default_rng(seed)
    y = np.repeat(np.arange(classes), per_class)
    x = g.integers(0, 256, (len(y), 12), dtype=np.uint8)  # distinct rows
    return Dataset("toy", Split(x, y), None, num_classes=classes)


def _mixes(ds: Dataset, p) -> np.ndarray:
    y = np.asarray(ds.train.y)
    return np.stack([np.bincount(y[t], minlength=ds.num_classes) / len(t) for t in p.train])


def test_parameters_are_exactly_these():
    assert PARAMS["inner_dirichlet"] == {"num_clients", "alpha", "examples_per_client"}


def test_sizes_exact_and_no_example_twice():
    ds = _data()  # 5,000 examples
    p = partition(ds, "inner_dirichlet", seed=3, num_clients=90, alpha=0.1,
                  examples_per_client=50)
    assert [len(t) for t in p.train] == [50] * 90 and p.client_names == [str(i) for i in range(90)]
    used = np.concatenate(p.train)
    assert len(np.unique(used)) == len(used) == 4500 and p.info["unassigned"] == 500
    assert p.test is None
    # None: the train set divided equally, every example once (first n % K one more)
    q = partition(ds, "inner_dirichlet", seed=3, num_clients=7, alpha=0.5)
    assert [len(t) for t in q.train] == [715] * 2 + [714] * 5
    assert np.array_equal(np.sort(np.concatenate(q.train)), np.arange(5000))


def test_whole_set_used_when_sizes_add_up_even_for_tiny_alpha():
    """1,000 x 50 of 10 x 5,000, as pfl-research's CIFAR-10: the last clients take whatever
    classes are left, and every example is used once."""
    ds = _data(per_class=5000)
    p = partition(ds, "inner_dirichlet", seed=0, num_clients=1000, alpha=0.001,
                  examples_per_client=50)
    used = np.concatenate(p.train)
    assert np.array_equal(np.sort(used), np.arange(50_000))


def test_small_alpha_concentrates_large_alpha_is_near_uniform():
    ds = _data(per_class=2000)  # 20,000 examples; clients use a quarter, so few run out
    small = _mixes(ds, partition(ds, "inner_dirichlet", seed=1, num_clients=100, alpha=0.05,
                                 examples_per_client=50))
    large = _mixes(ds, partition(ds, "inner_dirichlet", seed=1, num_clients=100, alpha=1000.0,
                                 examples_per_client=50))
    assert np.median(small.max(axis=1)) > 0.8  # most clients: mostly one class
    assert np.median((small > 0).sum(axis=1)) <= 2
    assert large.max() < 0.35 and np.abs(large - 0.1).mean() < 0.05  # ~ multinomial noise
    assert (large > 0).sum(axis=1).min() >= 7


def test_class_counts_follow_the_client_proportions():
    """Before anything runs out, a client's counts are Multinomial(size, p)."""
    g = np.random.default_rng(0)
    p = np.array([0.7, 0.2, 0.1, 0.0])
    draws = np.stack([_class_counts(100, p, np.full(4, 10_000), g) for _ in range(400)])
    assert (draws.sum(axis=1) == 100).all() and (draws[:, 3] == 0).all()
    np.testing.assert_allclose(draws.mean(axis=0) / 100, p, atol=0.01)


def test_an_exhausted_class_is_replaced_from_the_renormalized_rest():
    g = np.random.default_rng(0)
    p = np.array([0.9, 0.1, 0.0])
    draws = np.stack([_class_counts(50, p, np.array([5, 1000, 1000]), g) for _ in range(50)])
    assert (draws[:, 0] == 5).all() and (draws[:, 1] == 45).all()  # class 2 has p = 0
    # all proportion on classes that are gone: uniform over the classes left
    c = _class_counts(40, np.array([1.0, 0.0, 0.0]), np.array([0, 30, 30]), g)
    assert c.sum() == 40 and c[0] == 0 and c[1] > 0 and c[2] > 0


def test_deterministic_seeded_and_independent_of_input_order():
    ds = _data()
    args = dict(num_clients=40, alpha=0.3, examples_per_client=60)
    a = partition(ds, "inner_dirichlet", seed=5, **args)
    b = partition(ds, "inner_dirichlet", seed=5, **args)
    assert all(np.array_equal(s, t) for s, t in zip(a.train, b.train, strict=True))
    c = partition(ds, "inner_dirichlet", seed=6, **args)
    assert not all(np.array_equal(s, t) for s, t in zip(a.train, c.train, strict=True))
    perm = np.random.default_rng(9).permutation(len(ds.train))
    shuffled = Dataset("toy", ds.train.take(perm), None, num_classes=10)
    d = partition(shuffled, "inner_dirichlet", seed=5, **args)
    for s, t in zip(a.train, d.train, strict=True):  # same examples, as contents
        assert {ds.train.x[i].tobytes() for i in s} == \
            {shuffled.train.x[i].tobytes() for i in t}


_MODULE = importlib.import_module("fedray.data.partitioners.inner_dirichlet")


def _runs_out() -> Dataset:
    """Unequal classes (30 to 300 examples) so that classes run out well before the end."""
    g = np.random.default_rng(4)
    y = np.repeat(np.arange(10), np.arange(1, 11) * 30)
    x = g.integers(0, 256, (len(y), 12), dtype=np.uint8)
    return Dataset("toy", Split(x, y), None, num_classes=10)


@pytest.mark.parametrize("args", [dict(num_clients=160, alpha=0.05, examples_per_client=10),
                                  dict(num_clients=33, alpha=0.3),
                                  dict(num_clients=1650, alpha=0.001)])
def test_the_partition_does_not_depend_on_the_block_size(monkeypatch, args):
    """The multinomial draws are made _BLOCK clients per numpy call; any _BLOCK gives the
    same clients, bit for bit (here with several classes running out mid-client)."""
    ds = _runs_out()  # 1,650 examples
    runs = []
    for block in (1, 7, _MODULE._BLOCK):
        monkeypatch.setattr(_MODULE, "_BLOCK", block)
        runs.append(partition(ds, "inner_dirichlet", seed=11, **args))
    for other in runs[1:]:
        assert len(other.train) == len(runs[0].train)
        assert all(np.array_equal(s, t) for s, t in zip(runs[0].train, other.train, strict=True))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_clients_take_only_classes_with_examples_left(seed):
    """Replayed client by client from the result: sizes exact, no example twice, and every
    class a client holds still had examples when its turn came (and gave no more than it
    had left), with classes running out mid-way."""
    ds = _runs_out()
    y = np.asarray(ds.train.y)
    p = partition(ds, "inner_dirichlet", seed=seed, num_clients=160, alpha=0.05,
                  examples_per_client=10)
    assert [len(t) for t in p.train] == [10] * 160
    used = np.concatenate(p.train)
    assert len(np.unique(used)) == len(used) == 1600 and p.info["unassigned"] == 50
    left = np.bincount(y, minlength=10)
    ran_out = 0
    for t in p.train:
        took = np.bincount(y[t], minlength=10)
        assert (took[left == 0] == 0).all()  # nothing from a class already gone
        assert (took <= left).all()
        left = left - took
        ran_out += int(((left == 0) & (took > 0)).sum())
    assert ran_out >= 5  # the rule was exercised: classes ran out along the way
    assert left.sum() == 50


def test_class_counts_with_a_first_draw_over_a_superset():
    """A first draw that asks an exhausted class gets nothing there; the shortfall is drawn
    over the classes left."""
    g = np.random.default_rng(0)
    c = _class_counts(10, np.array([0.5, 0.5, 0.0]), np.array([0, 3, 100]), g,
                      draw=np.array([6, 4, 0]))
    assert c.tolist() == [0, 3, 7]  # p is 0 on class 2: the uniform rule over {2}


@pytest.mark.parametrize("params, pattern", [
    (dict(num_clients=0, alpha=1.0), r"'partitioner\.num_clients': must be >= 1"),
    (dict(num_clients=5001, alpha=1.0), r"'partitioner\.num_clients': must be <= the number"),
    (dict(num_clients=10, alpha=0.0), r"'partitioner\.alpha': must be > 0"),
    (dict(num_clients=10, alpha="x"), r"'partitioner\.alpha': must be a number"),
    (dict(num_clients=10, alpha=1.0, examples_per_client=0),
     r"'partitioner\.examples_per_client': must be >= 1"),
    (dict(num_clients=10, alpha=1.0, examples_per_client=2.5),
     r"'partitioner\.examples_per_client': must be an integer"),
    (dict(num_clients=100, alpha=1.0, examples_per_client=51),
     r"'partitioner\.examples_per_client': 100 clients x 51 examples > 5000 train examples"),
    (dict(num_clients=10), r"'partitioner\.alpha': is required by 'inner_dirichlet'"),
    (dict(num_clients=10, alpha=1.0, sigma=0.5),
     r"'partitioner\.sigma': is not used by 'inner_dirichlet'"),
])
def test_errors_name_the_key(params, pattern):
    with pytest.raises(FedrayError, match=pattern) as info:
        partition(_data(), "inner_dirichlet", seed=0, **params)
    assert "\n" not in str(info.value)


def _write_cifar10(folder: pathlib.Path, per_batch: int) -> None:
    g = np.random.default_rng(0)
    folder.mkdir(parents=True)
    for name in [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]:
        doc = {b"batch_label": name.encode(),
               b"labels": [int(v) for v in g.integers(0, 10, per_batch)],
               b"data": g.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
               b"filenames": [f"{name}_{i}.png".encode() for i in range(per_batch)]}
        (folder / name).write_bytes(pickle.dumps(doc, protocol=2))


def test_recipe_builds_byte_identical_stores(tmp_path):
    _write_cifar10(tmp_path / "raw", per_batch=40)  # 200 train images
    args = [f"source.path={tmp_path / 'raw'}", "partitioner.num_clients=20",
            "partitioner.examples_per_client=10"]
    recipe = ROOT / "partitions" / "cifar10_dirichlet.yaml"
    _, m = build(recipe, [f"out={tmp_path / 'a'}", *args])
    _, again = build(recipe, [f"out={tmp_path / 'b'}", *args])
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*")
                   if p.is_file() and p.name != ".fedray.lock")
    assert files and m["num_clients"] == 20
    same, differ, errors = filecmp.cmpfiles(tmp_path / "a", tmp_path / "b",
                                            [str(f) for f in files], shallow=False)
    assert differ == ["manifest.json"] and not errors  # every shard byte for byte
    a, b = (json.loads((tmp_path / d / "manifest.json").read_text()) for d in "ab")
    assert a["recipe"].pop("out").endswith("/a") and b["recipe"].pop("out").endswith("/b")
    assert a == b  # the manifest differs only in the recipe's out
    _, other = build(recipe, [f"out={tmp_path / 'c'}", *args, "seed=1"])
    assert other["client_index"] != m["client_index"]
