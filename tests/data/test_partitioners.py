"""Partitioners: the invariants papers rely on, on small synthetic data sets.

Rows of x are random bytes, so every example is distinct and a client can be compared across
runs as a set of example contents; "reversed" data sets check that a partition depends on
the examples, not on the order a loader read them in.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedray.data.dataset import Dataset
from fedray.data.examples import Split
from fedray.data.partitioners import PARAMS, PARTITIONERS, canonical_order, partition
from fedray.data.sources.cifar100 import FINE_TO_COARSE
from fedray.errors import FedrayError

# Official CIFAR-100 fine label -> coarse label (a list, as the tests index and count it).
CIFAR100_COARSE = list(FINE_TO_COARSE)


def make_split(y, seed: int, coarse=None, owner=None) -> Split:
    g = np.random.default_rng(seed)
    y = np.asarray(y, dtype=np.int64)
    x = g.integers(0, 256, size=(len(y), 1, 4, 4), dtype=np.uint8)
    return Split(x, y, None if coarse is None else np.asarray(coarse, dtype=np.int64),
                 None if owner is None else np.asarray(owner, dtype=np.int64))


def shuffled_labels(num_classes: int, per_class: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).permutation(np.repeat(np.arange(num_classes), per_class))


def labelled(num_classes: int = 10, per_class: int = 100, test_per_class: int = 10) -> Dataset:
    train = make_split(shuffled_labels(num_classes, per_class, 1), seed=2)
    test = make_split(shuffled_labels(num_classes, test_per_class, 3), seed=4)
    return Dataset("toy", train, test, num_classes)


def reverse_split(s: Split | None) -> Split | None:
    if s is None:
        return None
    return Split(s.x[::-1].copy(), s.y[::-1].copy(),
                 None if s.coarse is None else s.coarse[::-1].copy(),
                 None if s.owner is None else s.owner[::-1].copy())


def reversed_ds(ds: Dataset) -> Dataset:
    return Dataset(ds.name, reverse_split(ds.train), reverse_split(ds.test), ds.num_classes,
                   owners=ds.owners, num_coarse=ds.num_coarse)


def contents(split: Split, parts, labels=None) -> list[frozenset]:
    """Each client as the set of (row bytes, label) it holds."""
    out = []
    for k, idx in enumerate(parts):
        ys = split.y[idx] if labels is None else labels[k]
        out.append(frozenset((split.x[i].tobytes(), int(v)) for i, v in zip(idx, ys, strict=True)))
    return out


def assert_disjoint(parts, n: int, every: bool = True) -> None:
    flat = np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])
    assert len(np.unique(flat)) == len(flat), "an example is in two clients"
    assert flat.min() >= 0 and flat.max() < n
    if every:
        assert len(flat) == n, "not every example is assigned"
    for p in parts:
        assert p.dtype == np.int64


# --------------------------------------------------------------------------------------------
# canonical order
# --------------------------------------------------------------------------------------------


def test_canonical_order_is_independent_of_input_order():
    s = make_split(shuffled_labels(5, 40, 0), seed=0)
    perm = np.random.default_rng(9).permutation(len(s))
    a, b = s.take(canonical_order(s)), s.take(perm).take(canonical_order(s.take(perm)))
    np.testing.assert_array_equal(a.x, b.x)
    np.testing.assert_array_equal(a.y, b.y)
    assert (np.diff(a.y) >= 0).all()  # label is the first key


def test_canonical_order_float_rows_and_empty_split():
    g = np.random.default_rng(0)
    x = g.random((300, 13)).astype(np.float32)  # 52 bytes: padded to whole words
    s = Split(x, np.zeros(300, dtype=np.int64))
    o1 = canonical_order(s)
    o2 = canonical_order(Split(x[::-1].copy(), s.y))
    np.testing.assert_array_equal(x[o1], x[::-1][o2])
    assert len(canonical_order(Split(np.zeros((0, 3)), np.zeros(0, dtype=np.int64)))) == 0


# --------------------------------------------------------------------------------------------
# pachinko: TFF Fed-CIFAR100
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cifar100_like() -> Dataset:
    coarse_of = np.array(CIFAR100_COARSE)
    y_train = shuffled_labels(100, 500, 10)
    y_test = shuffled_labels(100, 100, 11)
    return Dataset("cifar100", make_split(y_train, 12, coarse_of[y_train]),
                   make_split(y_test, 13, coarse_of[y_test]), 100, num_coarse=20)


@pytest.fixture(scope="module")
def cifar_partition(cifar100_like):
    return partition(cifar100_like, "pachinko", seed=0)


def test_cifar100_mapping_is_the_official_one():
    assert len(CIFAR100_COARSE) == 100
    assert np.bincount(CIFAR100_COARSE).tolist() == [5] * 20
    assert CIFAR100_COARSE[0] == 4 and CIFAR100_COARSE[1] == 1  # apple, aquarium_fish


def test_pachinko_tff_invariants(cifar100_like, cifar_partition):
    ds, p = cifar100_like, cifar_partition
    assert p.client_names == [str(i) for i in range(500)]
    assert [len(t) for t in p.train] == [100] * 500
    assert_disjoint(p.train, 50_000)
    train_y = ds.train.y[np.concatenate(p.train)]
    assert np.bincount(train_y, minlength=100).tolist() == [500] * 100
    assert np.bincount(ds.train.coarse[np.concatenate(p.train)]).tolist() == [2500] * 20
    # test: clients "0".."99" hold 100 test examples each, "100".."499" none
    assert [len(t) for t in p.test[:100]] == [100] * 100
    assert all(len(t) == 0 for t in p.test[100:])
    assert_disjoint(p.test, 10_000)
    assert np.bincount(ds.test.y[np.concatenate(p.test)], minlength=100).tolist() == [100] * 100
    assert p.info["train_clients"] == 500 and p.info["test_clients"] == 100
    assert p.info["unassigned_train"] == 0 and p.info["unassigned_test"] == 0
    assert json.loads(json.dumps(p.info)) == p.info


def test_pachinko_clients_are_non_iid(cifar100_like, cifar_partition):
    coarse = cifar100_like.train.coarse
    distinct = [len(np.unique(coarse[t])) for t in cifar_partition.train]
    assert np.mean(distinct) < 10  # i.i.d. clients of 100 examples would see ~19.9 of 20
    iid_like = partition(cifar100_like, "pachinko", seed=0, coarse_alpha=1000.0)
    assert np.mean([len(np.unique(coarse[t])) for t in iid_like.train]) > 18


def test_pachinko_deterministic_seeded_and_order_independent(cifar100_like, cifar_partition):
    ds = cifar100_like
    again = partition(ds, "pachinko", seed=0)
    for a, b in zip(cifar_partition.train + cifar_partition.test,
                    again.train + again.test, strict=True):
        np.testing.assert_array_equal(a, b)
    other = partition(ds, "pachinko", seed=1)
    assert contents(ds.train, other.train) != contents(ds.train, cifar_partition.train)
    rev = reversed_ds(ds)
    prev = partition(rev, "pachinko", seed=0)
    assert contents(rev.train, prev.train) == contents(ds.train, cifar_partition.train)
    assert contents(rev.test, prev.test) == contents(ds.test, cifar_partition.test)


def test_pachinko_client_counts_and_unassigned():
    coarse_of = np.repeat(np.arange(4), 5)  # 20 fine labels, 4 coarse labels
    y_tr, y_te = shuffled_labels(20, 100, 1), shuffled_labels(20, 25, 2)
    ds = Dataset("small", make_split(y_tr, 3, coarse_of[y_tr]),
                 make_split(y_te, 4, coarse_of[y_te]), 20, num_coarse=4)
    p = partition(ds, "pachinko", seed=5, examples_per_client=50)
    assert p.num_clients == 40 and [len(t) for t in p.train] == [50] * 40
    assert [len(t) for t in p.test] == [50] * 10 + [0] * 30
    assert_disjoint(p.train, 2000)
    assert_disjoint(p.test, 500)
    q = partition(ds, "pachinko", seed=5, num_clients=7, examples_per_client=60)
    assert q.num_clients == 7 and [len(t) for t in q.train] == [60] * 7
    assert [len(t) for t in q.test] == [60] * 7
    assert q.info["unassigned_train"] == 2000 - 420 and q.info["unassigned_test"] == 500 - 420
    assert_disjoint(q.train, 2000, every=False)
    no_test = Dataset("small", ds.train, None, 20, num_coarse=4)
    assert partition(no_test, "pachinko", seed=5, examples_per_client=50).test is None


def test_pachinko_errors():
    y = shuffled_labels(4, 50, 0)
    with pytest.raises(FedrayError, match="needs coarse labels"):
        partition(Dataset("d", make_split(y, 0), None, 4), "pachinko", seed=0)
    coarse = y % 2
    coarse[0] = 1 - coarse[0]  # one fine label now has two coarse labels
    with pytest.raises(FedrayError, match="one coarse label per fine label"):
        partition(Dataset("d", make_split(y, 0, coarse), None, 4), "pachinko", seed=0)
    ds = Dataset("d", make_split(y, 0, y % 2), None, 4)
    with pytest.raises(FedrayError, match=r"partitioner\.num_clients"):
        partition(ds, "pachinko", seed=0, num_clients=3)  # 3 x 100 > 200
    with pytest.raises(FedrayError, match=r"partitioner\.coarse_alpha': must be > 0, got 0"):
        partition(ds, "pachinko", seed=0, coarse_alpha=0)
    with pytest.raises(FedrayError, match=r"partitioner\.examples_per_client"):
        partition(ds, "pachinko", seed=0, examples_per_client=500)


# --------------------------------------------------------------------------------------------
# natural
# --------------------------------------------------------------------------------------------


def owned_dataset() -> Dataset:
    g = np.random.default_rng(0)
    sizes = [30, 2, 0, 15, 8]
    owner = g.permutation(np.repeat(np.arange(5), sizes))
    test_owner = np.array([0, 0, 1, 3, 3, 3, 2])
    train = make_split(g.integers(0, 3, len(owner)), 1, owner=owner)
    test = make_split(g.integers(0, 3, len(test_owner)), 2, owner=test_owner)
    return Dataset("writers", train, test, 3, owners=["w0", "w1", "w2", "w3", "w4"])


def test_natural_keeps_owners_and_their_split():
    ds = owned_dataset()
    p = partition(ds, "natural", seed=0)
    assert p.client_names == ["w0", "w1", "w2", "w3", "w4"]
    assert [len(t) for t in p.train] == [30, 2, 0, 15, 8]
    assert [len(t) for t in p.test] == [2, 1, 1, 3, 0]
    for k, (tr, te) in enumerate(zip(p.train, p.test, strict=True)):
        assert (ds.train.owner[tr] == k).all() and (ds.test.owner[te] == k).all()
    assert_disjoint(p.train, len(ds.train))
    assert_disjoint(p.test, len(ds.test))
    assert p.info["dropped_clients"] == 0
    rev = reversed_ds(ds)
    prev = partition(rev, "natural", seed=0)
    assert contents(rev.train, prev.train) == contents(ds.train, p.train)
    assert contents(rev.test, prev.test) == contents(ds.test, p.test)


def test_natural_min_examples_drops_small_clients():
    ds = owned_dataset()
    p = partition(ds, "natural", seed=0, min_examples=8)
    assert p.client_names == ["w0", "w3", "w4"]
    assert p.info["dropped_clients"] == 2 and json.loads(json.dumps(p.info)) == p.info
    assert p.info["dropped_train_examples"] == 2 and p.info["dropped_test_examples"] == 2
    assert_disjoint(p.train, len(ds.train), every=False)
    assert sum(len(t) for t in p.train) + p.info["dropped_train_examples"] == len(ds.train)


def test_natural_errors():
    with pytest.raises(FedrayError, match="needs natural client ids"):
        partition(labelled(), "natural", seed=0)
    with pytest.raises(FedrayError, match=r"partitioner\.min_examples': must be >= 0"):
        partition(owned_dataset(), "natural", seed=0, min_examples=-1)


# --------------------------------------------------------------------------------------------
# dirichlet
# --------------------------------------------------------------------------------------------


def max_class_share(ds: Dataset, parts) -> float:
    return float(np.mean([np.bincount(ds.train.y[t]).max() / len(t) for t in parts]))


def test_dirichlet_covers_every_example_and_ignores_input_order():
    ds = labelled()
    p = partition(ds, "dirichlet", seed=3, num_clients=20, alpha=0.5)
    assert p.num_clients == 20 and p.test is None
    assert_disjoint(p.train, 1000)
    assert min(len(t) for t in p.train) >= 1
    rev = reversed_ds(ds)
    prev = partition(rev, "dirichlet", seed=3, num_clients=20, alpha=0.5)
    assert contents(rev.train, prev.train) == contents(ds.train, p.train)
    again = partition(ds, "dirichlet", seed=3, num_clients=20, alpha=0.5)
    assert all(np.array_equal(a, b) for a, b in zip(p.train, again.train, strict=True))
    other = partition(ds, "dirichlet", seed=4, num_clients=20, alpha=0.5)
    assert contents(ds.train, other.train) != contents(ds.train, p.train)


def test_dirichlet_alpha_controls_skew_and_sigma_controls_sizes():
    ds = labelled()
    skewed = partition(ds, "dirichlet", seed=0, num_clients=10, alpha=0.05, min_examples=0)
    flat = partition(ds, "dirichlet", seed=0, num_clients=10, alpha=100.0)
    assert max_class_share(ds, [t for t in skewed.train if len(t)]) > 0.6
    assert max_class_share(ds, flat.train) < 0.25
    even = [len(t) for t in partition(ds, "dirichlet", seed=0, num_clients=10, alpha=100.0,
                                      sigma=0.0).train]
    uneven = [len(t) for t in partition(ds, "dirichlet", seed=0, num_clients=10, alpha=100.0,
                                        sigma=1.0).train]
    assert np.std(uneven) > 3 * np.std(even)
    assert sum(uneven) == 1000


def test_dirichlet_min_examples():
    ds = labelled()
    p = partition(ds, "dirichlet", seed=1, num_clients=20, alpha=0.5, min_examples=20)
    assert min(len(t) for t in p.train) >= 20
    assert p.info["attempts"] > 1  # the first draws left a client short: redrawn
    assert p.info["topped_up_examples"] == 0
    # so skewed that no draw works: short clients are topped up from the largest ones
    q = partition(ds, "dirichlet", seed=1, num_clients=20, alpha=0.01, min_examples=45)
    assert min(len(t) for t in q.train) >= 45 and q.info["topped_up_examples"] > 0
    # exactly 10 draws, the last one topped up (an 11th draw would top up other clients)
    assert q.info == {"attempts": 10, "topped_up_examples": 468, "min_size": 45,
                      "max_size": 94}
    assert sorted(np.concatenate(q.train).tolist()) == list(range(len(ds.train)))
    with pytest.raises(FedrayError,
                       match="'partitioner.min_examples': cannot give every client 51 examples"):
        partition(ds, "dirichlet", seed=1, num_clients=20, alpha=1.0, min_examples=51)


@pytest.mark.parametrize("params,match", [
    ({"num_clients": 5, "alpha": -1}, r"partitioner\.alpha': must be > 0, got -1"),
    ({"num_clients": 5, "alpha": 0.0}, r"partitioner\.alpha': must be > 0"),
    ({"num_clients": 1001, "alpha": 1.0}, r"partitioner\.num_clients': must be <= .*1000"),
    ({"num_clients": 0, "alpha": 1.0}, r"partitioner\.num_clients': must be >= 1"),
    ({"num_clients": 2.5, "alpha": 1.0}, r"partitioner\.num_clients': must be an integer"),
    ({"num_clients": 5, "alpha": 1.0, "sigma": -0.1}, r"partitioner\.sigma': must be >= 0"),
    ({"num_clients": 5, "alpha": "big"}, r"partitioner\.alpha': must be a number"),
    ({"num_clients": 5}, r"partitioner\.alpha': is required by 'dirichlet'"),
])
def test_dirichlet_bad_params(params, match):
    with pytest.raises(FedrayError, match=match):
        partition(labelled(), "dirichlet", seed=0, **params)


# --------------------------------------------------------------------------------------------
# iid and similarity
# --------------------------------------------------------------------------------------------


def test_iid_near_equal_sizes_and_order_independent():
    ds = labelled()
    p = partition(ds, "iid", seed=2, num_clients=7)
    sizes = [len(t) for t in p.train]
    assert max(sizes) - min(sizes) <= 1 and p.test is None
    assert_disjoint(p.train, 1000)
    rev = reversed_ds(ds)
    assert contents(rev.train, partition(rev, "iid", seed=2, num_clients=7).train) == \
        contents(ds.train, p.train)
    assert max_class_share(ds, p.train) < 0.3
    with pytest.raises(FedrayError, match=r"partitioner\.num_clients"):
        partition(ds, "iid", seed=2, num_clients=1001)


def label_hist(ds: Dataset, idx) -> np.ndarray:
    return np.bincount(ds.train.y[idx], minlength=ds.num_classes) / len(idx)


def test_similarity_extremes():
    ds = labelled()
    global_hist = label_hist(ds, np.arange(1000))
    same = partition(ds, "similarity", seed=0, num_clients=10, similarity=1.0)
    tv = [0.5 * np.abs(label_hist(ds, t) - global_hist).sum() for t in same.train]
    assert max(tv) < 0.25
    sorted_ = partition(ds, "similarity", seed=0, num_clients=10, similarity=0.0)
    assert all(len(np.unique(ds.train.y[t])) <= 2 for t in sorted_.train)
    half = partition(ds, "similarity", seed=0, num_clients=10, similarity=0.5)
    assert half.info == {"iid_examples": 500, "sorted_examples": 500}
    for p in (same, sorted_, half):
        assert_disjoint(p.train, 1000)
        assert [len(t) for t in p.train] == [100] * 10


def test_similarity_order_independent_and_every_client_nonempty():
    ds = labelled()
    p = partition(ds, "similarity", seed=4, num_clients=6, similarity=0.3)
    rev = reversed_ds(ds)
    prev = partition(rev, "similarity", seed=4, num_clients=6, similarity=0.3)
    assert contents(rev.train, prev.train) == contents(ds.train, p.train)
    tiny = Dataset("t", make_split([0, 1, 2, 3], 0), None, 4)
    q = partition(tiny, "similarity", seed=0, num_clients=4, similarity=0.5)
    assert sorted(len(t) for t in q.train) == [1, 1, 1, 1]
    with pytest.raises(FedrayError, match=r"partitioner\.similarity': must be in \[0, 1\]"):
        partition(ds, "similarity", seed=0, num_clients=4, similarity=1.5)


# --------------------------------------------------------------------------------------------
# imbalance
# --------------------------------------------------------------------------------------------


def test_imbalance_profile_and_drop_rule():
    ds = labelled()
    p = partition(ds, "imbalance", seed=0, num_clients=8)
    assert_disjoint(p.train, 1000, every=False)
    assert sum(len(t) for t in p.train) + p.info["unassigned"] == 1000
    assert all(1 <= len(t) <= 125 for t in p.train)
    assert set(p.info["client_ratios"]) <= {1.0, 0.5, 0.1, 0.05, 0.01, 0.005, 0.001}
    steep = partition(ds, "imbalance", seed=0, num_clients=4, ratios=[0.01])
    for t in steep.train:
        counts = np.sort(np.bincount(ds.train.y[t], minlength=10))[::-1]
        assert counts[0] >= 10 * max(counts[-1], 1)  # majority >> minority
    flat = partition(ds, "imbalance", seed=0, num_clients=4, ratios=[1.0])
    assert flat.info["unassigned"] == 0
    assert all(np.bincount(ds.train.y[t], minlength=10).tolist() == [25] * 10
               for t in flat.train)
    rev = reversed_ds(ds)
    prev = partition(rev, "imbalance", seed=0, num_clients=8)
    assert contents(rev.train, prev.train) == contents(ds.train, p.train)


def test_imbalance_every_client_gets_an_example_and_bad_ratios():
    ds = labelled(num_classes=4, per_class=5)
    p = partition(ds, "imbalance", seed=3, num_clients=20, ratios=[0.001])
    assert all(len(t) >= 1 for t in p.train)
    assert_disjoint(p.train, 20, every=False)
    for bad in ([], [0.0], [1.5], "0.5"):
        with pytest.raises(FedrayError, match=r"partitioner\.ratios"):
            partition(ds, "imbalance", seed=0, num_clients=2, ratios=bad)


# --------------------------------------------------------------------------------------------
# label_flip
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("base", ["iid", "dirichlet"])
def test_label_flip_records_exactly_what_it_flips(base):
    ds = labelled()
    p = partition(ds, "label_flip", seed=0, num_clients=9, base=base)
    assert_disjoint(p.train, 1000)
    info = p.info
    assert len(info["flipped_clients"]) == round(9 / 3) == 3
    changed = [name for name, idx, lab in zip(p.client_names, p.train, p.train_labels, strict=True)
               if not np.array_equal(ds.train.y[idx], lab)]
    assert sorted(changed) == sorted(info["flipped_clients"])
    total = 0
    for name, idx, lab in zip(p.client_names, p.train, p.train_labels, strict=True):
        y = ds.train.y[idx]
        if name in info["flip_maps"]:
            perm = np.array(info["flip_maps"][name])
            assert sorted(perm.tolist()) == list(range(10)) and (perm != np.arange(10)).all()
            np.testing.assert_array_equal(lab, perm[y])  # flip_ratio 1: every label flipped
            total += len(idx)
        else:
            np.testing.assert_array_equal(lab, y)
    assert info["flipped_examples"] == total
    rev = reversed_ds(ds)
    prev = partition(rev, "label_flip", seed=0, num_clients=9, base=base)
    assert contents(rev.train, prev.train, prev.train_labels) == \
        contents(ds.train, p.train, p.train_labels)


def test_label_flip_ratio_and_corruption_count():
    ds = labelled()
    p = partition(ds, "label_flip", seed=1, num_clients=10, corruption=0.2, flip_ratio=0.5)
    assert len(p.info["flipped_clients"]) == 2
    flipped = 0
    for name, idx, lab in zip(p.client_names, p.train, p.train_labels, strict=True):
        diff = int((ds.train.y[idx] != lab).sum())
        assert diff == (round(0.5 * len(idx)) if name in p.info["flip_maps"] else 0)
        flipped += diff
    assert flipped == p.info["flipped_examples"]
    none = partition(ds, "label_flip", seed=1, num_clients=10, corruption=0.0)
    assert none.info["flipped_clients"] == [] and none.info["flipped_examples"] == 0
    with pytest.raises(FedrayError, match=r"partitioner\.base': must be 'iid' or 'dirichlet'"):
        partition(ds, "label_flip", seed=1, num_clients=10, base="pachinko")
    with pytest.raises(FedrayError, match=r"partitioner\.corruption': must be in \[0, 1\]"):
        partition(ds, "label_flip", seed=1, num_clients=10, corruption=2)


# --------------------------------------------------------------------------------------------
# dispatch and shared rules
# --------------------------------------------------------------------------------------------


def test_params_table():
    assert PARAMS == {
        "pachinko": {"num_clients", "examples_per_client", "coarse_alpha", "fine_alpha"},
        "natural": {"min_examples"},
        "dirichlet": {"num_clients", "alpha", "sigma", "min_examples"},
        "iid": {"num_clients"},
        "similarity": {"num_clients", "similarity"},
        "imbalance": {"num_clients", "ratios"},
        "label_flip": {"num_clients", "corruption", "flip_ratio", "base", "alpha"},
        "shard": {"num_clients", "shards_per_client"},
        "size": {"num_clients", "law", "rate", "min_examples"},
        "continuous": {"num_clients", "strictness", "feature"},
        "grouped_natural": {"group_size", "mode", "shuffle"},
        "inner_dirichlet": {"num_clients", "alpha", "examples_per_client"},
    }
    assert set(PARTITIONERS) == set(PARAMS)


def test_dispatch_errors():
    ds = labelled()
    with pytest.raises(FedrayError,
                       match="recipe key 'partitioner.name': must be one of: .*, got 'shards'"):
        partition(ds, "shards", seed=0)
    with pytest.raises(FedrayError,
                       match=r"^recipe key 'partitioner\.alpha': is not used by 'iid'"):
        partition(ds, "iid", seed=0, num_clients=3, alpha=0.5)
    with pytest.raises(FedrayError,
                       match=r"recipe key 'partitioner\.num_clients': is required by 'iid'"):
        partition(ds, "iid", seed=0)
    with pytest.raises(FedrayError, match="recipe key 'seed': must be a whole number >= 0"):
        partition(ds, "iid", seed=-1, num_clients=3)


@pytest.mark.parametrize("name,params", [
    ("iid", {"num_clients": 6}),
    ("dirichlet", {"num_clients": 6, "alpha": 0.3}),
    ("similarity", {"num_clients": 6, "similarity": 0.2}),
    ("imbalance", {"num_clients": 6}),
    ("label_flip", {"num_clients": 6}),
])
def test_central_test_and_determinism(name, params):
    ds = labelled()
    a = partition(ds, name, seed=8, **params)
    b = partition(ds, name, seed=8, **params)
    assert a.test is None and a.client_names == [str(i) for i in range(6)]
    assert all(np.array_equal(x, y) for x, y in zip(a.train, b.train, strict=True))
    assert a.info == b.info and json.loads(json.dumps(a.info)) == a.info  # manifest-safe
    rev = reversed_ds(ds)
    r = partition(rev, name, seed=8, **params)
    assert contents(rev.train, r.train, r.train_labels) == \
        contents(ds.train, a.train, a.train_labels)


def test_dirichlet_documented_defaults():
    """docs/partitions.md: `sigma` (0), `min_examples` (1). Seed 0 with 40 clients at alpha
    0.1 is a case where each default matters: its first draws leave a client empty (so
    min_examples 1 redraws, 0 would not) and a client of exactly 1 (so 2 would redraw on)."""
    import inspect
    import re
    from pathlib import Path

    from fedray.data.partitioners.dirichlet import dirichlet

    doc = (Path(__file__).resolve().parents[2] / "docs" / "partitions.md").read_text()
    row = re.search(r"^\| `dirichlet` \| (.*?) \|", doc, re.M).group(1)
    assert "`sigma` (0)" in row and "`min_examples` (1)" in row
    sig = inspect.signature(dirichlet).parameters
    assert (sig["sigma"].default, sig["min_examples"].default) == (0.0, 1)
    ds = labelled()
    default = partition(ds, "dirichlet", seed=0, num_clients=40, alpha=0.1)
    explicit = partition(ds, "dirichlet", seed=0, num_clients=40, alpha=0.1, sigma=0.0,
                         min_examples=1)
    assert default.info == explicit.info == {"attempts": 4, "topped_up_examples": 0,
                                             "min_size": 1, "max_size": 106}
    assert all(np.array_equal(a, b) for a, b in zip(default.train, explicit.train, strict=True))
    for other in ({"min_examples": 0}, {"min_examples": 2}, {"sigma": 0.5}):
        p = partition(ds, "dirichlet", seed=0, num_clients=40, alpha=0.1, **other)
        assert p.info != default.info, other
    assert partition(ds, "dirichlet", seed=0, num_clients=40, alpha=0.1,
                     min_examples=0).info["attempts"] == 1  # 0: any draw will do


def test_dirichlet_min_examples_boundary_and_equal_sizes_without_sigma():
    ds = labelled()  # 1,000 examples
    exact = partition(ds, "dirichlet", seed=3, num_clients=20, alpha=100.0, min_examples=50)
    assert [len(t) for t in exact.train] == [50] * 20  # 20 x 50 = n: allowed, and forced
    with pytest.raises(FedrayError, match="cannot give every client 51 examples: 20 clients"):
        partition(ds, "dirichlet", seed=3, num_clients=20, alpha=100.0, min_examples=51)
    # sigma 0: targets n / K each, so with a large alpha sizes stay near 50 (one cut per class
    # rounds down: at most 10 classes off)
    even = partition(ds, "dirichlet", seed=3, num_clients=20, alpha=1e4)
    assert all(40 <= len(t) <= 60 for t in even.train)
    assert sorted(np.concatenate(even.train).tolist()) == list(range(1000))


def test_dirichlet_top_up_by_hand():
    """Short clients in id order take the last examples (canonical order) of the largest
    clients, largest first, ties by id, each donor keeping the minimum."""
    from fedray.data.partitioners.dirichlet import _top_up

    client = np.array([0, 0, 0, 0, 0, 1, 1, 1, 2])  # sizes 5, 3, 1, 0
    assert _top_up(client, 4, 2) == 3
    assert client.tolist() == [0, 0, 2, 3, 3, 1, 1, 1, 2]
    client = np.array([1, 0, 1, 0, 1, 0])  # sizes 3, 3, 0: both give one, 0 first (tie)
    assert _top_up(client, 3, 2) == 2
    assert client.tolist() == [1, 0, 1, 0, 2, 2]  # each gave its last example
    client = np.array([0, 1, 0, 1])
    assert _top_up(client, 2, 2) == 0 and client.tolist() == [0, 1, 0, 1]


@pytest.mark.parametrize(("sigma", "classes", "per_class", "k"), [
    (0.0, 10, 100, 12), (0.7, 10, 100, 12), (0.0, 2, 10, 20)])
def test_dirichlet_is_its_documented_procedure(sigma, classes, per_class, k):
    """Steps 1-2 of the docstring, written out: per client and class, the number of examples
    is the difference of floor(cumsum(w) * n_c) over clients, w the class's Dirichlet draw
    times the targets (tiny alpha: many clients get none of a class). One client per
    example (targets of exactly 1: the draw's sum is then 1 up to rounding, 0.9999999999999997
    for this seed) is the edge of the draw's sanity check."""
    from fedray.core.seeding import rng
    from fedray.data.partitioners.common import TAG_DIRICHLET

    ds, alpha = labelled(num_classes=classes, per_class=per_class), 0.05
    y = np.asarray(ds.train.y)
    g = rng(5, TAG_DIRICHLET)
    if sigma > 0:
        target = g.lognormal(0.0, sigma, size=k)
        target = target * (len(y) / target.sum())
    else:
        target = np.full(k, len(y) / k)
    want = np.zeros((k, classes), dtype=np.int64)
    for c in range(classes):
        n_c = int((y == c).sum())
        w = g.dirichlet(np.full(k, alpha)) * target
        if not (np.isfinite(w).all() and w.sum() > 0):
            w = target.copy()
        cuts = np.floor(np.cumsum(w / w.sum())[:-1] * n_c).astype(np.int64)
        want[:, c] = np.diff(np.concatenate([[0], cuts, [n_c]]))
        g.permutation(n_c)  # the class's shuffle, drawn next from the same stream
    p = partition(ds, "dirichlet", seed=5, num_clients=k, alpha=alpha, sigma=sigma,
                  min_examples=0)
    got = np.array([np.bincount(y[t], minlength=classes) for t in p.train])
    assert np.array_equal(got, want)
    assert (want == 0).any() and p.info["attempts"] == 1


def test_dirichlet_tries_ten_draws_before_topping_up():
    """Seed 64 (40 clients, alpha 0.3, at least 7 each) succeeds on exactly the 10th draw:
    no example is moved by the top-up."""
    p = partition(labelled(), "dirichlet", seed=64, num_clients=40, alpha=0.3, min_examples=7)
    assert p.info == {"attempts": 10, "topped_up_examples": 0, "min_size": 7, "max_size": 48}
