"""Seed 001's toy reproduction: its own math and one short run through the real runtime
(seed 004's quadratics are tested in test_paper_quadratics.py)."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
from paper_scripts import load_paper_script

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def toy():
    return load_paper_script("toy")


def _metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (pathlib.Path(run_dir) / "metrics.jsonl").open()]


def test_toy_clients_follow_the_recipe(toy):
    clients = toy.make_clients(0)
    assert len(clients) == 10
    for c, (x, y) in clients.items():
        assert x.shape == (100, 2) and y.tolist() == [0.0] * 50 + [1.0] * 50
        mean1 = (4, 4) if c == toy.OUTLIER else (1, 1)
        assert np.abs(x[:50].mean(0)).max() < 0.25
        assert np.abs(x[50:].mean(0) - mean1).max() < 0.25
    x, _ = toy.pooled(clients)
    assert 0.4 < x[:50].std() < 0.6  # covariance I/4


def test_toy_test_set_and_iid_baseline(toy):
    """Line 55's test set (10 points per class per client, outlier included, drawn apart from the
    training data) and line 59's iid baseline (the same training points, reshuffled)."""
    x, y = toy.make_test(0)
    assert x.shape == (200, 2) and y.sum() == 100
    assert np.abs(x[-10:].mean(0) - (4, 4)).max() < 0.5  # the outlier's class-1 points
    train = toy.make_clients(0)
    assert not np.isin(x, toy.pooled(train)[0]).all(axis=1).any()
    iid = toy.iid_clients(train, 0)
    assert sorted(iid) == list(range(toy.M)) and all(len(v[1]) == 100 for v in iid.values())
    xi, yi = toy.pooled(iid)
    xt, yt = toy.pooled(train)
    key = np.lexsort  # the same multiset of (x, y) rows
    a, b = np.c_[xi, yi], np.c_[xt, yt]
    assert np.array_equal(a[key(a.T)], b[key(b.T)])
    # the outlier's points are spread over the clients, not left on the last one
    assert (xi[:, 0] > 2.5).reshape(toy.M, -1).any(axis=1).sum() > 5


def test_toy_bias_calculus(toy):
    """bias_grad and bias_curvature are F's derivatives in b (central differences in float64,
    step 1e-4: truncation ~1e-8, far under the 1e-6 tolerance); b* is stationary and F rises
    on both sides of it."""
    x, y = toy.pooled(toy.make_clients(1))
    b, h = np.array([-3.0, -1.0, 0.5, 2.0]), 1e-4
    fd = (toy.objective(x, y, b + h) - toy.objective(x, y, b - h)) / (2 * h)
    assert np.allclose(toy.bias_grad(x, y, b), fd, atol=1e-6)
    fd2 = (toy.bias_grad(x, y, b + h) - toy.bias_grad(x, y, b - h)) / (2 * h)
    assert np.allclose(toy.bias_curvature(x, y, b), fd2, atol=1e-6)
    b_star, f_star = toy.bias_optimum(x, y)
    assert abs(toy.bias_grad(x, y, b_star)[0]) < 1e-12 and 0 < f_star < np.log(2)
    assert (toy.objective(x, y, [b_star - 0.05, b_star + 0.05]) > f_star).all()


def test_toy_bound_constants(toy, monkeypatch):
    """zeta (eq. 3), L and D (line 95) as defined, and eq. 2's bound from them."""
    monkeypatch.setattr(toy, "GRID", np.linspace(-30.0, 30.0, 601))  # coarser: a fast test
    clients = toy.make_clients(0)
    c = toy.bound_constants(clients)
    # zeta bounds the divergence wherever it is evaluated, and is attained on the grid
    b = np.linspace(-10, 10, 41)
    assert (toy.divergence(clients, b) <= c["zeta"] + 1e-12).all()
    assert c["zeta"] == toy.divergence(clients, toy.GRID).max()
    # one client's divergence, written out at one point
    x, y = toy.pooled(clients)
    g = [toy.bias_grad(*clients[i], 0.3)[0] - toy.bias_grad(x, y, 0.3)[0] for i in clients]
    assert toy.divergence(clients, 0.3)[0] == pytest.approx(max(map(abs, g)), abs=1e-15)
    # L: a logistic loss's curvature never exceeds 1/4; D: from the initial bias to b*
    assert 0 < c["L"] <= 0.25 and c["D"] == abs(toy.B0 - c["b_star"])
    limit, finite = toy.bound(10, 50, c)
    assert limit == pytest.approx(18 * 100 * 0.04 * c["L"] * c["zeta"] ** 2, rel=1e-12)
    assert finite == pytest.approx(c["D"] ** 2 / (2 * 0.2 * 10 * 50) + limit, rel=1e-12)
    # the iid clients are far more alike than the non-iid ones
    assert toy.bound_constants(toy.iid_clients(clients, 0))["zeta"] < c["zeta"] / 2


def test_toy_through_the_runtime(toy, ray_cluster, tmp_path):
    """Two clients a round, the frozen slope never moves while the bias trains, and the bias
    trace the summary reads is the model's bias after each round."""
    import fedray
    from fedray.state.run_dir import load_tensors

    clients = toy.make_clients(0)
    r = fedray.run(
        str(ROOT / "jobs" / "paper" / "toy" / "fedavg.yaml"),
        model_fn=toy.perceptron_factory(toy.SLOPE),
        client_data=clients,
        test_data=toy.make_test(0),
        callbacks=[toy.BiasTrace()],
        overrides=["rounds=4", "client.local_steps=20", f"output.dir={tmp_path / 'toy'}"],
    )
    assert [m["clients"] for m in r.metrics] == [2] * 4
    weights = load_tensors(str(tmp_path / "toy"))
    assert np.array_equal(weights["slope"].numpy(), toy.SLOPE.astype(np.float32))
    trace = json.loads((tmp_path / "toy" / "bias.json").read_text())
    assert len(trace) == 4 and trace[-1] == weights["bias"].item() != toy.B0


def test_toy_separators_are_the_last_biases_against_the_optimum(toy, tmp_path):
    """separators() reads each run's last global bias and its distance to b* of the data
    that run trained on (the iid baseline's own shuffle for its row); the figure is drawn."""
    seeds = [0, 1]
    for i, (_, sub, _, _) in enumerate(toy.ROWS):
        for s in seeds:
            d = tmp_path / f"{sub}-s{s}"
            d.mkdir(parents=True)
            (d / "bias.json").write_text(json.dumps([toy.B0, -0.5 - 0.1 * i - s]))
    table, data = toy.separators(str(tmp_path), seeds)
    assert list(data) == [label for label, *_ in toy.ROWS]
    for i, (label, _, _, iid) in enumerate(toy.ROWS):
        for s in seeds:
            cl = toy.iid_clients(toy.make_clients(s), s) if iid else toy.make_clients(s)
            b_star = toy.bias_optimum(*toy.pooled(cl))[0]
            assert data[label]["final_bias"][s] == -0.5 - 0.1 * i - s
            assert data[label]["distance_to_optimum"][s] == abs(-0.5 - 0.1 * i - s - b_star)
    assert table.count("\n") == len(toy.ROWS) + 1
    toy.plot_separators(str(tmp_path), 0, str(tmp_path))
    assert (tmp_path / "separators.png").stat().st_size > 10_000


def test_a_finished_run_is_reused_only_with_the_settings_asked_for(toy, tmp_path, monkeypatch):
    """jobs/paper/common.run_all reuses a run by its directory: one made with other
    overrides (a new horizon, another store) is refused in one line, never reported as if
    it were the new setting; one made with them is reused without running anything."""
    import common

    out = tmp_path / "run"
    out.mkdir()
    (out / "config.yaml").write_text(
        "# fedray run 0\nseed: 0\nrounds: 300\nclient:\n  lr: 0.0316\n"
        f"data:\n  partition: {tmp_path / 'stores' / 's0'}\n")
    (out / "summary.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    job = str(ROOT / "jobs" / "paper" / "scaffold_mnist" / "fedavg.yaml")
    same = ["rounds=300", "client.lr=0.0316", "seed=0", "data.partition=stores/s0"]
    assert common.made_with(str(out), same) is None
    monkeypatch.setattr(common.fedray, "run", lambda *a, **k: pytest.fail("re-ran a run"))
    common.run_all([(job, same, str(out), {})])  # reused: nothing runs
    for changed, said in (("rounds=1000", "rounds=300, asked for 1000"),
                          ("client.lr=0.1", "client.lr=0.0316, asked for 0.1"),
                          ("data.partition=stores/s1", "data.partition=")):
        with pytest.raises(common.StaleRun, match="remove it, or pass another --runs") as e:
            common.run_all([(job, [*same[:-1], changed], str(out), {})])
        assert said in str(e.value) and str(out) in str(e.value)
