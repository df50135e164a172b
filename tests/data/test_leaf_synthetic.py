"""LEAF's Synthetic generator (fedray/data/sources/leaf_synthetic.py, source leaf_synthetic).

What LEAF publishes of its default data set (``main.py -num-tasks 1000 -num-classes 5
-num-dim 60``): 1,000 devices and 107,553 samples (LEAF paper, arXiv:1812.01097, Table 1;
the same counts as Flower's copy of LEAF's default output, flwrlabs/synthetic on Hugging
Face), so 107.55 samples per device on average. A generated data set is one draw, and so is
LEAF's: the yardstick for "matches" is the sampling noise of the per-user count n, whose law
min(floor(LogNormal(3, 2)) + 5, 1000) gives E[n], Var[n] exactly
(``expected_size_moments``). Over K = 1000 independent users the total has standard
deviation sqrt(K Var[n]) = 6,346 samples, and the standard deviation of the users' counts
has a sampling standard deviation of about sqrt((mu4 - Var^2) / (4 Var K)) = 11.2 (delta
method). Every check below allows 3 of those standard deviations.
"""

import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from fedray.data.recipe import build, load_recipe
from fedray.data.sources.leaf_synthetic import (
    MODEL_SD,
    NOISE_SD,
    expected_size_moments,
    generate_leaf_synthetic,
    shared_model,
    sigma_diagonal,
    train_mask,
    user_data,
)
from fedray.data.sources.loaders import load_source
from fedray.data.store.reader import StoreSource
from fedray.errors import FedrayError

ROOT = pathlib.Path(__file__).resolve().parents[2]
RECIPE = ROOT / "partitions" / "leaf_synthetic.yaml"
LEAF_DEVICES, LEAF_SAMPLES = 1000, 107_553  # LEAF Table 1, Synthetic


@pytest.fixture(scope="module")
def leaf_default():
    return generate_leaf_synthetic(seed=0)


def _counts(ds):
    k = len(ds.owners)
    return (np.bincount(ds.train.owner, minlength=k), np.bincount(ds.test.owner, minlength=k))


def test_sizes_match_leafs_table_1_within_sampling_noise(leaf_default):
    mean, var, mu4 = expected_size_moments()
    assert abs(mean - 101.22) < 0.01 and abs(math.sqrt(var) - 200.68) < 0.01
    sd_total = math.sqrt(LEAF_DEVICES * var)
    sd_stdev = math.sqrt((mu4 - var**2) / (4 * var * LEAF_DEVICES))
    # LEAF's own draw is one sample of this law: our reading of its formula fits its data
    assert abs(LEAF_SAMPLES - LEAF_DEVICES * mean) < 3 * sd_total
    train, test = _counts(leaf_default)
    n = train + test
    assert len(leaf_default.owners) == len(n) == LEAF_DEVICES
    assert n.min() >= 5 and n.max() <= 1000
    # ours against the law, and against LEAF's draw (two independent draws: sqrt(2) sd)
    assert abs(n.sum() - LEAF_DEVICES * mean) < 3 * sd_total
    assert abs(n.sum() - LEAF_SAMPLES) < 3 * math.sqrt(2) * sd_total
    assert abs(n.mean() - LEAF_SAMPLES / LEAF_DEVICES) < 3 * math.sqrt(2) * sd_total / 1000
    assert abs(n.std() - math.sqrt(var)) < 3 * sd_stdev


def test_labels_and_split_are_leafs(leaf_default):
    ds = leaf_default
    assert ds.num_classes == 5 and ds.train.x.shape[1:] == (60,) and ds.train.x.dtype == np.float32
    assert set(np.unique(ds.train.y)) == set(range(5))  # every class drawn
    assert set(np.unique(ds.test.y)) <= set(range(5))
    train, test = _counts(ds)
    n = train + test
    # split_data.py --by_sample, --frac 0.9: max(1, int(0.9 n)) train samples per user
    assert (train == np.maximum(1, (0.9 * n).astype(np.int64))).all() and (test >= 1).all()


def test_each_label_is_the_argmax_of_its_users_model_as_leaf_computes_it():
    q, means = shared_model(7, 5, 60)
    assert q.shape == (61, 5, 1) and means.shape == (1, 1)
    plain_agree = []
    for k in range(40):
        d = user_data(7, k, q, means)
        x1 = np.hstack([np.ones((len(d["x"]), 1)), d["x"]])
        z = x1 @ d["w"] + d["noise"]
        # W_k = Q u_k: with one cluster, one scalar multiple of the shared matrix
        np.testing.assert_allclose(d["w"], q[:, :, 0] * d["u"][0], rtol=1e-12)
        # LEAF's _softmax divides each class by its sum over the user's samples
        ratio = np.exp(z) / np.exp(z).sum(axis=0)
        assert (d["y"] == ratio.argmax(axis=1)).all()
        plain_agree.append((d["y"] == z.argmax(axis=1)).mean())
    # ... which is not the argmax of the logits alone: the quirk is kept, and it matters
    assert min(plain_agree) < 1.0


def test_feature_and_model_distributions_are_as_documented():
    """Within a user x ~ N(v_k, diag(j^-1.2)); v_k ~ N(B_k, 1), B_k ~ N(0, 1); u_k ~
    N(mu, 0.1^2); logit noise N(0, 0.1^2). Pooled over 300 users (about 30,000 samples) a
    variance's relative sampling sd is sqrt(2 / N) < 1%: 5% is several times that."""
    q, means = shared_model(3, 5, 60)
    users = [user_data(3, k, q, means) for k in range(300)]
    centered = np.concatenate([u["x"] - u["v"] for u in users])
    cov = centered.T @ centered / len(centered)
    np.testing.assert_allclose(np.diag(cov), sigma_diagonal(60), rtol=0.05)
    off = cov / np.sqrt(np.outer(np.diag(cov), np.diag(cov))) - np.eye(60)
    assert np.abs(off).max() < 5 / math.sqrt(len(centered))
    b = np.array([float(u["b"]) for u in users])
    shift = np.concatenate([u["v"] - u["b"] for u in users])
    assert abs(b.std() - 1) < 0.15 and abs(shift.std() - 1) < 0.02
    u = np.array([u["u"][0] for u in users])
    assert abs(u.std() - MODEL_SD) < 0.015 and abs(u.mean() - means[0, 0]) < 0.03
    noise = np.concatenate([u["noise"].ravel() for u in users])
    assert abs(noise.std() - NOISE_SD) < 0.002


def test_a_user_does_not_depend_on_how_many_are_generated():
    small, large = generate_leaf_synthetic(num_users=3, seed=5), generate_leaf_synthetic(
        num_users=6, seed=5)
    rows = np.isin(large.train.owner, [0, 1, 2])
    np.testing.assert_array_equal(small.train.x, large.train.x[rows])
    np.testing.assert_array_equal(small.test.y, large.test.y[np.isin(large.test.owner, [0, 1, 2])])
    assert train_mask(5, 0, 2, 0.9).sum() == 1  # LEAF: n = 2 keeps one train sample


def _store_bytes(root: pathlib.Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_same_seed_same_store_bytes_and_another_seed_differs(tmp_path):
    args = ["source.num_users=60"]
    build(RECIPE, [f"out={tmp_path / 's'}", *args])
    os.rename(tmp_path / "s", tmp_path / "first")  # the manifest records out: build there again
    build(RECIPE, [f"out={tmp_path / 's'}", *args])
    first, again = _store_bytes(tmp_path / "first"), _store_bytes(tmp_path / "s")
    assert first and first.keys() == again.keys()
    assert all(first[f] == again[f] for f in first)
    build(RECIPE, [f"out={tmp_path / 'other'}", *args, "source.seed=1"])
    other = _store_bytes(tmp_path / "other")
    assert other.keys() == first.keys()
    assert other["train-00000.arrow"] != first["train-00000.arrow"]
    src = StoreSource(str(tmp_path / "s"))
    assert src.population == 60 and src.num_classes == 5
    assert [src.name(c) for c in (0, 59)] == ["0", "59"]  # LEAF's user ids


@pytest.mark.parametrize("override, key", [
    ("source.num_users=0", "source.num_users"),
    ("source.num_classes=1", "source.num_classes"),
    ("source.num_dim=0", "source.num_dim"),
    ("source.seed=-1", "source.seed"),
    ("source.train_fraction=1.0", "source.train_fraction"),
    ("source.train_fraction=0", "source.train_fraction"),
    ("source.num_writers=5", "source.num_writers"),  # synthetic's key, not this source's
])
def test_bad_parameters_are_one_line_naming_the_key(tmp_path, override, key):
    with pytest.raises(FedrayError) as e:
        load_recipe(RECIPE, [f"out={tmp_path / 's'}", override])
    assert f"'{key}'" in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "s").exists()


def test_no_path_needed_and_the_keys_are_refused_elsewhere(tmp_path):
    cfg = load_recipe(RECIPE, [f"out={tmp_path / 's'}"])
    assert cfg.source.path is None
    ds = load_source("leaf_synthetic", None, num_users=2, num_classes=3, num_dim=4, seed=0,
                     train_fraction=0.5)
    assert ds.num_classes == 3 and ds.train.x.shape[1] == 4 and ds.owners == ["0", "1"]
    with pytest.raises(FedrayError, match=r"'source.num_dim': is read by source leaf_synthetic"):
        load_recipe(ROOT / "partitions" / "dirichlet.yaml",
                    [f"out={tmp_path / 's'}", "source.path=x", "source.num_dim=3"])


def test_fedray_partition_by_name_then_a_short_run(tmp_path):
    """The bundled recipe by name, then the bundled job for 2 rounds (inline backend)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    store = tmp_path / "store"
    part = subprocess.run([sys.executable, "-m", "fedray.cli", "partition", "leaf_synthetic",
                           f"out={store}", "source.num_users=100", "--quiet"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env=env)
    assert part.returncode == 0, part.stderr
    run = subprocess.run([sys.executable, "-m", "fedray.cli", "run",
                          str(ROOT / "jobs" / "leaf" / "synthetic.yaml"),
                          f"data.partition={store}", "rounds=2", "eval.federated_clients=100",
                          "runtime.backend=inline", f"output.dir={tmp_path / 'run'}"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "done: 2 rounds" in run.stdout + run.stderr
