"""Your own data into a store, two ways: ``fedray partition`` with a numpy / table /
hf_disk recipe, and the Python path ``from_arrays(...).partition(...).write_store(url)``;
then ``fedray run`` on the store. The commands run in this process (``fedray.cli.main``: the
same argument parsing, errors and exit codes as the ``fedray`` executable)."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
from byod_files import USERS, data, write_csv, write_hf_dict, write_npz, write_parquet

from fedray.cli import main
from fedray.data import from_arrays, from_table
from fedray.data.store.format import read_manifest
from fedray.data.store.reader import client_index
from fedray.errors import ConfigError, FedrayError

ROOT = pathlib.Path(__file__).resolve().parents[2]
D = data()


def _partition(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["partition", *args, "--quiet"])
    out = capsys.readouterr()
    return code, out.out, out.err


def _contents(url: str) -> tuple[dict, list]:
    """What two stores must share to be the same store: the clients (names, counts, shards,
    label histograms) and every shard's bytes (sha256)."""
    m = read_manifest(url)
    return m["client_index"], [(s["file"], s["sha256"]) for s in m["shards"]]


@pytest.mark.parametrize("partitioner, params", [
    ("natural", {}),
    ("dirichlet", {"num_clients": 5, "alpha": 0.5, "min_examples": 2}),
    ("iid", {"num_clients": 4}),
])
def test_python_path_writes_the_recipes_store(tmp_path, capsys, partitioner, params):
    npz = write_npz(tmp_path / "d.npz", D)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(json.dumps({  # JSON is YAML
        "source": {"name": "numpy", "path": str(npz), "user": "user", "split": "split"},
        "partitioner": {"name": partitioner, **params}}))
    code, out, err = _partition(capsys, str(recipe), f"out={tmp_path}/cli")
    assert code == 0, err
    store = from_arrays(D.features, D.y, user_ids=D.users, split=D.split) \
        .partition(partitioner, seed=0, **params).write_store(str(tmp_path / "py"), shard_mb=64)
    assert store.url == str(tmp_path / "py")
    assert _contents(store.url) == _contents(str(tmp_path / "cli"))
    m = read_manifest(store.url)
    assert m["source"]["name"] == "python" and m["recipe"]["partitioner"] == \
        {"name": partitioner, **params}
    assert json.loads(json.dumps(m["recipe"])) == m["recipe"]
    if partitioner == "natural":
        assert m["num_clients"] == USERS and m["client_index"]["splits"] == ["train", "test"]
    else:
        assert m["num_clients"] == params["num_clients"] and m["central_test"]["rows"] == 12
    code, out, err = _partition(capsys, "--describe", store.url)
    assert code == 0 and "source:       python" in out and "checksums ok" in out


def test_csv_recipe_then_run_one_client_per_user(tmp_path, capsys):
    csv = write_csv(tmp_path / "d.csv", D)
    code, out, err = _partition(capsys, str(ROOT / "partitions" / "table.yaml"),
                                f"source.path={csv}", f"out={tmp_path}/nat")
    assert code == 0, err
    m = read_manifest(str(tmp_path / "nat"))
    ix = client_index(str(tmp_path / "nat"), m)
    users = sorted(set(D.users.tolist()))
    assert ix.names() == users and m["recipe"]["source"]["name"] == "table"
    for k, user in enumerate(users):  # each user's own train and test rows
        assert ix.counts("train")[k] == int(((D.users == user) & (D.split == "train")).sum())
        assert ix.counts("test")[k] == int(((D.users == user) & (D.split == "test")).sum())
    last = _run(capsys, tmp_path / "nat", tmp_path / "run", USERS,
                f"eval.federated_clients={USERS}")
    assert 0.0 <= last["fed_test_accuracy"] <= 1.0 and last["clients_evaluated"] == USERS


def _run(capsys, store: pathlib.Path, out: pathlib.Path, population: int, *over: str) -> dict:
    """``fedray run`` on ``store`` for 2 rounds (logistic regression, no Ray); its last
    metrics record."""
    code = main(["run", str(ROOT / "jobs" / "quickstart.yaml"), f"data.partition={store}",
                 "model.name=logreg", "rounds=2", "eval.every=1", "runtime.backend=inline",
                 "sampling.clients_per_round=3", "client.batch_size=8", "--quiet",
                 f"output.dir={out}", *over])
    assert code == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["population"] == population
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["round"] == 2
    return last


def test_npz_recipe_then_run(tmp_path, capsys):
    npz = write_npz(tmp_path / "d.npz", D)
    code, _, err = _partition(capsys, str(ROOT / "partitions" / "numpy.yaml"),
                              f"source.path={npz}", "source.split=split",
                              "partitioner.num_clients=4", f"out={tmp_path}/npz")
    assert code == 0, err
    assert read_manifest(str(tmp_path / "npz"))["central_test"]["rows"] == 12
    assert 0.0 <= _run(capsys, tmp_path / "npz", tmp_path / "run", 4)["test_accuracy"] <= 1.0


def test_parquet_images_and_hf_disk_through_the_cli(tmp_path, capsys):
    pq = write_parquet(tmp_path / "img.parquet", D, image=True)
    code, _, err = _partition(capsys, str(ROOT / "partitions" / "table.yaml"),
                              f"source.path={pq}", "source.features=null", "source.image=image",
                              "partitioner.name=dirichlet", "partitioner.num_clients=4",
                              "partitioner.alpha=1.0", f"out={tmp_path}/img")
    assert code == 0, err
    m = read_manifest(str(tmp_path / "img"))
    assert m["input_shape"] == [1, 6, 5] and m["dtype"] == "uint8" and m["scale"] == 1 / 255
    hf = write_hf_dict(tmp_path / "hf", D)
    code, _, err = _partition(capsys, str(ROOT / "partitions" / "hf_disk.yaml"),
                              f"source.path={hf}", "partitioner.num_clients=3",
                              f"out={tmp_path}/hf_iid")
    assert code == 0, err
    m = read_manifest(str(tmp_path / "hf_iid"))
    assert m["num_classes"] == 5 and m["num_clients"] == 3 and m["central_test"]["rows"] == 12
    assert _contents(str(tmp_path / "img"))[1] != _contents(str(tmp_path / "hf_iid"))[1]
    for store, population in (("img", 4), ("hf_iid", 3)):  # each trains
        last = _run(capsys, tmp_path / store, tmp_path / f"run_{store}", population)
        assert 0.0 <= last["test_accuracy"] <= 1.0


def test_bad_input_exits_2_and_writes_nothing(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    lines = write_csv(tmp_path / "d.csv", D).read_text().splitlines()
    lines[8] = lines[8].replace(f",{D.y[7]},", ",7.5,")  # data row 7
    bad.write_text("\n".join(lines) + "\n")
    code, out, err = _partition(capsys, str(ROOT / "partitions" / "table.yaml"),
                                f"source.path={bad}", f"out={tmp_path}/s")
    assert code == 2 and out == ""
    assert err == f"fedray: error: {bad}: column 'label', row 7: 7.5 is not an integer label\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.csv", "d.csv"]
    code, _, err = _partition(capsys, str(ROOT / "partitions" / "table.yaml"),
                              f"source.path={bad}", "source.label=target", f"out={tmp_path}/s")
    assert code == 2 and "no column 'target' (source.label); it has: f0, f1, f2, label" in err


def test_hold_out_test_is_the_recipes_test_fraction(tmp_path, capsys):
    npz = write_npz(tmp_path / "d.npz", D)
    code, _, err = _partition(capsys, str(ROOT / "partitions" / "numpy.yaml"),
                              f"source.path={npz}", "partitioner.num_clients=4", "seed=3",
                              "test_fraction=0.25", f"out={tmp_path}/cli")
    assert code == 0, err
    store = from_arrays(D.features, D.y).hold_out_test(0.25, seed=3) \
        .partition("dirichlet", seed=3, num_clients=4, alpha=0.5, min_examples=1) \
        .write_store(str(tmp_path / "py"))
    assert _contents(store.url) == _contents(str(tmp_path / "cli"))
    assert store.manifest["central_test"]["rows"] == 15
    assert store.manifest["recipe"]["test_fraction"] == 0.25
    with pytest.raises(ConfigError, match=r"'test_fraction': must be in \(0, 1\), got 1\.0"):
        from_arrays(D.features, D.y).hold_out_test(1.0)


def test_write_store_refuses_what_a_recipe_refuses(tmp_path):
    part = from_table(write_csv(tmp_path / "d.csv", D), features=["f0"], user="user") \
        .partition("natural")
    part.write_store(str(tmp_path / "s"))
    with pytest.raises(ConfigError, match=r"recipe key 'out': .*/s already exists"):
        part.write_store(str(tmp_path / "s"))
    with pytest.raises(ConfigError, match=r"recipe key 'shard_mb': must be > 0"):
        part.write_store(str(tmp_path / "t"), shard_mb=0)
    with pytest.raises(ConfigError, match=r"recipe key 'partitioner\.alpha': must be > 0"):
        from_arrays(D.features, D.y).partition("dirichlet", num_clients=3, alpha=0)
    with pytest.raises(FedrayError, match="needs natural client ids"):
        from_arrays(D.features, D.y).partition("natural")
    ratios = np.array([1.0, 0.1])  # NumPy parameters are recorded as JSON numbers
    store = from_arrays(D.features, D.y).partition("imbalance", num_clients=3, ratios=ratios) \
        .write_store(str(tmp_path / "imb"))
    assert store.manifest["recipe"]["partitioner"]["ratios"] == [1.0, 0.1]
    assert not (tmp_path / "t").exists()
