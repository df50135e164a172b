"""shard, size, continuous and grouped_natural: each one's defining property on a small data
set, its refusals (before the data where they can be), and the reproducibility every
partitioner owes: the same store byte for byte from the same seed, another partition from
another seed where the partitioner draws, the same store from a reordered copy of the data.
Also the compact per-client form (Ragged, NumberedNames) the store writer reads."""

from __future__ import annotations

import os

import numpy as np
import pytest

from fedray.data.dataset import Dataset
from fedray.data.examples import Split
from fedray.data.partition import NumberedNames, Partition, Ragged
from fedray.data.partitioners import check_params, partition
from fedray.data.partitioners.grouped_natural import group_sizes
from fedray.data.partitioners.size import client_sizes
from fedray.data.store import write_store
from fedray.errors import FedrayError


def labelled(classes: int = 10, per_class: int = 30, features: int = 4, seed: int = 0
             ) -> Dataset:
    """Distinct random rows, ``per_class`` of each label, in a shuffled order."""
    g = np.random.default_rng(seed)
    y = g.permutation(np.repeat(np.arange(classes), per_class)).astype(np.int64)
    x = g.standard_normal((len(y), features)).astype(np.float32)
    test = Split(g.standard_normal((20, features)).astype(np.float32),
                 g.integers(0, classes, 20).astype(np.int64))
    return Dataset("toy", Split(x, y), test, classes)


def owned(owners: int = 11, n: int = 400, seed: int = 0) -> Dataset:
    """Examples of ``owners`` users, each with train and test examples of its own."""
    g = np.random.default_rng(seed)
    train = Split(g.standard_normal((n, 3)).astype(np.float32),
                  g.integers(0, 5, n).astype(np.int64),
                  owner=np.arange(n) % owners)
    m = 3 * owners
    test = Split(g.standard_normal((m, 3)).astype(np.float32),
                 g.integers(0, 5, m).astype(np.int64), owner=np.arange(m) % owners)
    return Dataset("users", train, test, 5, owners=[f"u{i:02d}" for i in range(owners)])


def permuted(ds: Dataset, seed: int = 9) -> Dataset:
    """The same examples in another order (owners keep their names); a central test set
    (no owners) is written as it is, so it keeps its order."""
    def perm(s: Split | None) -> Split | None:
        if s is None:
            return None
        return s.take(np.random.default_rng(seed).permutation(len(s)))
    test = perm(ds.test) if ds.test is not None and ds.test.owner is not None else ds.test
    return Dataset(ds.name, perm(ds.train), test, ds.num_classes, owners=ds.owners)


def store_bytes(tmp_path, tag: str, ds: Dataset, part: Partition) -> dict[str, bytes]:
    url = str(tmp_path / tag)
    write_store(url, ds, part, recipe={"name": "same"}, shard_mb=0.002)  # several shards
    return {f: open(os.path.join(url, f), "rb").read() for f in sorted(os.listdir(url))}


# ---------------------------------------------------------------------------------------
# shard (McMahan et al. 2017, Sec. 3)
# ---------------------------------------------------------------------------------------


def test_shard_gives_each_client_its_shards_of_sorted_labels():
    ds = labelled(classes=10, per_class=30)  # 300 examples: 20 shards of 15
    p = partition(ds, "shard", 3, num_clients=10)
    assert p.info == {"shard_size": 15, "shards": 20, "unassigned": 0}
    assert list(p.train.counts) == [30] * 10
    for idx in p.train:
        labels, counts = np.unique(ds.train.y[idx], return_counts=True)
        assert len(labels) <= 2 and all(c % 15 == 0 for c in counts)  # whole shards of a label
    assert len(np.unique(np.concatenate(list(p.train)))) == 300


def test_shard_mcmahan_mnist_numbers_and_remainder():
    """MNIST's 60,000 into 100 clients: 200 shards of 300 (Sec. 3); 7 more examples are
    left out, at the end of the last label."""
    g = np.random.default_rng(1)
    y = g.integers(0, 10, 60_007).astype(np.int64)
    ds = Dataset("m", Split(g.standard_normal((len(y), 1)).astype(np.float32), y), None, 10)
    p = partition(ds, "shard", 0, num_clients=100)
    assert p.info == {"shard_size": 300, "shards": 200, "unassigned": 7}
    assert set(p.train.counts) == {600}
    used = np.zeros(len(y), bool)
    used[p.train.values] = True
    assert (y[~used] == 9).all()


def test_shard_refusals():
    with pytest.raises(FedrayError, match=r"^recipe key 'partitioner\.shards_per_client': "
                       r"must be >= 1, got 0$"):
        check_params("shard", 0, {"num_clients": 3, "shards_per_client": 0})
    with pytest.raises(FedrayError, match=r"partitioner\.shards_per_client': 200 clients x 2 "
                       r"shards = 400 shards, more than the 300 train examples"):
        partition(labelled(), "shard", 0, num_clients=200)


# ---------------------------------------------------------------------------------------
# size (flwr-datasets' Linear/Square/ExponentialPartitioner)
# ---------------------------------------------------------------------------------------


def flwr_sizes(n: int, k: int, fn) -> list[int]:
    """flwr-datasets' SizePartitioner, restated: f(1..k), floor of the shares, the rest to
    the last partition."""
    units = fn(np.linspace(1, k, k))
    sizes = np.array(units / units.sum() * n, dtype=np.int64)
    sizes[-1] += n - sizes.sum()
    return sizes.tolist()


@pytest.mark.parametrize("law, fn", [("linear", lambda i: i), ("square", np.square),
                                     ("exponential", np.exp)])
def test_size_laws_are_flwr_datasets_sizes(law, fn):
    ds = labelled()
    for k in (1, 4, 5):  # e^i gives client 1 of 6 or more less than one example of 300
        p = partition(ds, "size", 2, num_clients=k, law=law)
        assert p.train.counts.tolist() == flwr_sizes(300, k, fn)
    assert client_sizes(300, 7, law).tolist() == flwr_sizes(300, 7, fn)


def test_size_rate_and_min_examples():
    sizes = client_sizes(1000, 100, "exponential", rate=0.05, min_examples=3)
    units = np.exp(0.05 * np.arange(1, 101))
    expect = (units / units.sum() * 700).astype(np.int64) + 3
    expect[-1] += 1000 - expect.sum()
    assert sizes.tolist() == expect.tolist() and sizes.min() == 3
    ds = labelled()
    p = partition(ds, "size", 0, num_clients=100, law="linear", min_examples=2)
    assert p.train.counts.min() >= 2 and p.train.counts.sum() == 300
    assert p.info == {"law": "linear", "min_size": int(p.train.counts.min()),
                      "max_size": int(p.train.counts.max())}


def test_size_refusals():
    with pytest.raises(FedrayError, match=r"^recipe key 'partitioner\.law': must be one of: "
                       r"linear, square, exponential, got 'cubic'$"):
        check_params("size", 0, {"num_clients": 3, "law": "cubic"})
    with pytest.raises(FedrayError, match=r"^recipe key 'partitioner\.rate': is only used "
                       r"with law: exponential"):
        check_params("size", 0, {"num_clients": 3, "rate": 0.5})
    check_params("size", 0, {"num_clients": 3, "law": "exponential", "rate": 0.5})
    with pytest.raises(FedrayError, match=r"partitioner\.rate': must be > 0"):
        check_params("size", 0, {"num_clients": 3, "law": "exponential", "rate": 0})
    with pytest.raises(FedrayError, match=r"^recipe key 'partitioner\.num_clients': under "
                       r"law linear leaves clients 0\.\.\d+ without an example of the 300"):
        partition(labelled(), "size", 0, num_clients=100)


# ---------------------------------------------------------------------------------------
# continuous (flwr-datasets' ContinuousPartitioner)
# ---------------------------------------------------------------------------------------


def test_continuous_strict_follows_the_property():
    ds = labelled()
    p = partition(ds, "continuous", 0, num_clients=6, strictness=1.0, feature=2)
    values = [ds.train.x[idx, 2] for idx in p.train]
    assert p.train.counts.tolist() == [50] * 6
    assert all(a.max() <= b.min() for a, b in zip(values, values[1:], strict=False))
    by_label = partition(ds, "continuous", 0, num_clients=5, strictness=1.0)
    assert [sorted(set(ds.train.y[i].tolist())) for i in by_label.train] == \
        [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    assert by_label.info == {"property": "label", "strictness": 1.0}


def test_continuous_strictness_blends_noise():
    ds = labelled(per_class=200)
    spread = []
    for s in (0.0, 0.5, 1.0):
        p = partition(ds, "continuous", 4, num_clients=4, strictness=s, feature=0)
        means = [float(ds.train.x[idx, 0].mean()) for idx in p.train]
        spread.append(means[-1] - means[0])
    assert abs(spread[0]) < 0.3 < spread[1] < spread[2]  # iid, then ordered, then sorted


def test_continuous_refusals():
    with pytest.raises(FedrayError, match=r"^recipe key 'partitioner\.strictness': must be "
                       r"in \[0, 1\], got 1\.5$"):
        check_params("continuous", 0, {"num_clients": 3, "strictness": 1.5})
    with pytest.raises(FedrayError, match=r"partitioner\.feature': must be >= 0"):
        check_params("continuous", 0, {"num_clients": 3, "strictness": 1, "feature": -1})
    with pytest.raises(FedrayError, match=r"partitioner\.feature': must be < 4, the values "
                       r"per example of 'toy', got 4"):
        partition(labelled(), "continuous", 0, num_clients=3, strictness=1, feature=4)
    ds = labelled()
    flat = Dataset("flat", Split(np.ones_like(ds.train.x), ds.train.y), None, 10)
    with pytest.raises(FedrayError, match=r"partitioner\.strictness': is 0\.5 but input "
                       r"value 1 of 'flat' are \(nearly\) constant"):
        partition(flat, "continuous", 0, num_clients=3, strictness=0.5, feature=1)
    partition(flat, "continuous", 0, num_clients=3, strictness=0.0, feature=1)  # iid: fine


# ---------------------------------------------------------------------------------------
# grouped_natural (flwr-datasets' GroupedNaturalIdPartitioner)
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode, sizes", [
    ("allow-smaller", [3, 3, 3, 2]), ("allow-bigger", [4, 4, 3]),
    ("drop-remainder", [3, 3, 3]),
])
def test_grouped_natural_modes(mode, sizes):
    ds = owned(owners=11)
    p = partition(ds, "grouped_natural", 0, group_size=3, mode=mode)
    assert group_sizes(11, 3, mode).tolist() == sizes
    members = np.repeat(np.arange(len(sizes)), sizes)  # owner i -> group (in owner order)
    for j, (tr, te) in enumerate(zip(p.train, p.test, strict=True)):
        mine = np.flatnonzero(members == j)
        assert set(ds.train.owner[tr].tolist()) == set(mine.tolist())
        assert np.array_equal(np.sort(tr), np.flatnonzero(np.isin(ds.train.owner, mine)))
        assert np.array_equal(np.sort(te), np.flatnonzero(np.isin(ds.test.owner, mine)))
    dropped = 11 - sum(sizes)
    assert p.info["dropped_owners"] == dropped
    assert p.info["dropped_test_examples"] == 3 * dropped


def test_grouped_natural_edge_modes_and_refusals():
    assert group_sizes(5, 8, "allow-smaller").tolist() == [5]
    assert group_sizes(12, 4, "strict").tolist() == [4, 4, 4]
    with pytest.raises(FedrayError, match=r"^recipe key 'partitioner\.group_size': does not "
                       r"divide the 11 natural ids \(remainder 2\)"):
        partition(owned(11), "grouped_natural", 0, group_size=3, mode="strict")
    with pytest.raises(FedrayError, match=r"partitioner\.group_size': is larger than the 11 "
                       r"natural ids"):
        partition(owned(11), "grouped_natural", 0, group_size=12, mode="drop-remainder")
    with pytest.raises(FedrayError, match=r"^recipe key 'partitioner\.mode': must be one of: "
                       r"allow-smaller, allow-bigger, drop-remainder, strict, got "
                       r"'drop-reminder'$"):
        check_params("grouped_natural", 0, {"group_size": 2, "mode": "drop-reminder"})
    with pytest.raises(FedrayError, match=r"partitioner\.shuffle': must be true or false"):
        check_params("grouped_natural", 0, {"group_size": 2, "shuffle": "yes"})
    with pytest.raises(FedrayError, match="'grouped_natural' needs natural client ids"):
        partition(labelled(), "grouped_natural", 0, group_size=2)


def test_grouped_natural_group_size_one_is_natural(tmp_path):
    ds = owned(7)
    nat = partition(ds, "natural", 0)
    grp = partition(ds, "grouped_natural", 0, group_size=1)
    assert all(np.array_equal(a, b) for a, b in zip(nat.train, grp.train, strict=True))
    assert all(np.array_equal(a, b) for a, b in zip(nat.test, grp.test, strict=True))


def test_grouped_natural_shuffle_mixes_owners():
    ds = owned(owners=40, n=800)
    p = partition(ds, "grouped_natural", 5, group_size=4, shuffle=True)
    groups = [sorted(set(ds.train.owner[idx].tolist())) for idx in p.train]
    assert sorted(o for g in groups for o in g) == list(range(40))
    assert groups != [list(range(i, i + 4)) for i in range(0, 40, 4)]


# ---------------------------------------------------------------------------------------
# reproducibility: same seed, same bytes; another seed, another split; order of the data
# ---------------------------------------------------------------------------------------

CASES = [
    ("shard", labelled, {"num_clients": 10, "shards_per_client": 3}, True),
    ("size", labelled, {"num_clients": 8, "law": "square"}, True),
    ("size", labelled, {"num_clients": 30, "law": "exponential", "rate": 0.2,
                        "min_examples": 2}, True),
    ("continuous", labelled, {"num_clients": 7, "strictness": 0.6, "feature": 1}, True),
    ("continuous", labelled, {"num_clients": 7, "strictness": 1.0}, False),
    ("grouped_natural", owned, {"group_size": 3, "shuffle": True}, True),
    ("grouped_natural", owned, {"group_size": 3, "mode": "allow-bigger"}, False),
]


@pytest.mark.parametrize("name, make, params, random", CASES)
def test_reproducible_stores(tmp_path, name, make, params, random):
    ds = make()
    a = store_bytes(tmp_path, "a", ds, partition(ds, name, 11, **params))
    b = store_bytes(tmp_path, "b", ds, partition(ds, name, 11, **params))
    assert a == b and len([f for f in a if f.startswith("train-")]) > 1
    other = store_bytes(tmp_path, "c", ds, partition(ds, name, 12, **params))
    shards = [f for f in a if f.endswith(".arrow")]
    assert ([a[f] for f in shards] != [other.get(f) for f in shards]) == random
    moved = permuted(ds)
    assert store_bytes(tmp_path, "d", moved, partition(moved, name, 11, **params)) == a


# ---------------------------------------------------------------------------------------
# the compact per-client form
# ---------------------------------------------------------------------------------------


def test_ragged_is_a_sequence_of_arrays():
    arrays = [np.array([3, 1]), np.zeros(0, np.int64), np.array([7]), np.array([2, 5, 4])]
    r = Ragged.from_arrays(arrays)
    assert len(r) == 4 and r.counts.tolist() == [2, 0, 1, 3]
    assert [a.tolist() for a in r] == [a.tolist() for a in arrays]
    assert r[-1].tolist() == [2, 5, 4] and r[2].tolist() == [7]
    assert [a.tolist() for a in r[1:3]] == [[], [7]] and r.span(1, 4).tolist() == [7, 2, 5, 4]
    assert [a.tolist() for a in r.select(np.array([True, False, False, True]))] == \
        [[3, 1], [2, 5, 4]]
    with pytest.raises(IndexError):
        r[4]
    names = NumberedNames(3)
    assert names == ["0", "1", "2"] and names[1:] == ["1", "2"] and names[-1] == "2"


def test_store_of_a_ragged_partition_equals_the_list_one(tmp_path):
    ds = owned(9)
    p = partition(ds, "natural", 0, min_examples=45)
    assert isinstance(p.train, Ragged) and p.info["dropped_clients"] > 0
    as_lists = Partition(list(p.client_names), [a.copy() for a in p.train],
                         [a.copy() for a in p.test], info=p.info)
    assert store_bytes(tmp_path, "r", ds, p) == store_bytes(tmp_path, "l", ds, as_lists)


def test_size_and_grouped_natural_take_sequence_labels(tmp_path):
    """Neither reads a label as a class, so next-character targets ([n, L]) pass through."""
    g = np.random.default_rng(0)
    x = g.integers(1, 30, (60, 8)).astype(np.int64)
    y = g.integers(1, 30, (60, 8)).astype(np.int64)
    ds = Dataset("text", Split(x, y, owner=np.arange(60) % 6), None, 30,
                 owners=[f"r{i}" for i in range(6)])
    for name, params in (("size", {"num_clients": 4, "law": "square"}),
                         ("grouped_natural", {"group_size": 2})):
        p = partition(ds, name, 0, **params)
        assert sum(p.train.counts) == 60
        store_bytes(tmp_path, name, ds, p)
    with pytest.raises(FedrayError, match="cannot split by class; use one of: natural, iid, "
                       "size, grouped_natural"):
        partition(ds, "shard", 0, num_clients=3)
