"""Per-client and personalized evaluation (fedray.tracking.client_eval, the workers'
evaluate_clients): the table of every eval round, its statistics, and the pooled metrics
they must add up to.

Runs use runtime.backend=inline (no Ray): the workers and their client assignment are the
same objects and the same code as under Ray (tests/runtime/test_inline.py checks the two
backends agree bit for bit)."""

from __future__ import annotations

import math
import pathlib

import numpy as np
import pytest
import torch
from conftest import fixed_linear

import fedray
from fedray.core.evaluation import ClientEval, EvalSums, evaluate, pooled
from fedray.core.flat_model import FlatModel
from fedray.core.seeding import personalize_seed
from fedray.errors import FedrayError
from fedray.kernels.sequential import local_sgd
from fedray.state.run_dir import load_weights, read_metrics
from fedray.tracking.client_eval import (
    client_metrics,
    client_stats,
    client_table,
    read_table,
    table_bytes,
    table_name,
)


def split_clients(num_clients: int = 10, dim: int = 5, classes: int = 3, seed: int = 3
                  ) -> dict[int, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """In-memory clients with their own train and test splits; client 4 holds out nothing
    (it is evaluated with no rows: count 0, left out of the statistics). Every client is
    evaluated (eval.federated_clients = 10)."""
    g = np.random.default_rng(seed)
    centers = g.normal(scale=2.0, size=(classes, dim))
    out = {}
    for c in range(num_clients):
        def draw(n):
            y = g.integers(0, classes, size=n)
            return (centers[y] + g.normal(size=(n, dim))).astype(np.float32), y
        n_test = 0 if c == 4 else int(g.integers(3, 9))
        out[c] = {"train": draw(int(g.integers(6, 15)))}
        if n_test:
            out[c]["test"] = draw(n_test)
    return out


CLIENTS = split_clients()


def run(tmp_path, name: str, workers: int = 1, rounds: int = 3, backend: str = "inline",
        **extra) -> fedray.RunResult:
    job = {"name": name, "seed": 5, "rounds": rounds,
           "client": {"lr": 0.1, "batch_size": 4, "local_steps": 3},
           "sampling": {"clients_per_round": 4},
           "eval": {"every": 1, "federated_clients": 10, **extra.pop("eval", {})},
           "runtime": {"backend": backend, "num_workers": workers,
                       "worker": {"num_cpus": 1, "vectorize": "off"}},
           "output": {"dir": str(tmp_path / name), "tensorboard": False}, **extra}
    return fedray.run(job, model_fn=fixed_linear()[0], client_data=CLIENTS)


def table(result: fedray.RunResult, r: int):
    with open(f"{result.run_dir}/{table_name(r)}", "rb") as f:
        return read_table(f.read())


def same_table(a, b) -> bool:
    """Equal column for column, bit for bit (NaN, a client without test rows, equals NaN)."""
    return a.column_names == b.column_names and all(
        np.array_equal(a.column(k).to_numpy(), b.column(k).to_numpy(),
                       equal_nan=a.column(k).type == "double") for k in a.column_names)


def test_client_stats_match_numpy():
    v = np.random.default_rng(0).random(37)
    s = client_stats(v, "a", higher_is_better=True)
    assert s["a_mean"] == np.mean(v) and s["a_std"] == np.std(v) and s["a_min"] == v.min()
    for q in (10, 25, 50, 90):
        assert s[f"a_p{q}"] == np.percentile(v, q)
    assert s["a_worst10"] == np.sort(v)[:4].mean()  # ceil(3.7) = 4 worst clients
    loss = client_stats(v, "l", higher_is_better=False)  # a loss: the worst are the highest
    assert loss["l_max"] == v.max() and loss["l_worst10"] == np.sort(v)[-4:].mean()
    assert client_stats([], "a", True) == {}


def test_table_and_pooled_sums_are_in_client_order():
    rows = [ClientEval(7, EvalSums(1.5, 2, 4)), ClientEval(2, EvalSums(0.25, 1, 3)),
            ClientEval(5, EvalSums(0.0, 0, 0))]
    t = read_table(table_bytes(client_table(rows, accuracy=True)))
    assert t.column("client_id").to_pylist() == [2, 5, 7]
    assert t.column("correct").to_pylist() == [1, 0, 2]
    assert t.column("accuracy").to_pylist()[::2] == [1 / 3, 2 / 4]
    assert math.isnan(t.column("accuracy")[1].as_py())  # no test data: no accuracy
    m = client_metrics(t)
    assert m["clients_evaluated"] == 2 and m["clients_accuracy_mean"] == (1 / 3 + 0.5) / 2
    assert pooled(rows) == EvalSums(0.25 + 0.0 + 1.5, 3, 7)
    no_acc = client_table(rows, accuracy=False)  # mse: loss columns only
    assert "accuracy" not in no_acc.column_names and "clients_loss_mean" in client_metrics(no_acc)


def test_own_models_are_reported_beside_the_global_model(tmp_path):
    """A personalization preset's rows carry the global model's sums beside each client's
    own: the table's global_* columns, clients_global_* statistics, the pooled global sums,
    and `fedray report`'s per-client values and CDF (a line labelled as the global
    model's)."""
    from fedray.tracking.report import ClientGroup, cdf_figure, client_values

    rows = [ClientEval(3, EvalSums(1.0, 3, 4), global_sums=EvalSums(2.0, 1, 4)),
            ClientEval(1, EvalSums(0.5, 2, 2), global_sums=EvalSums(1.5, 0, 2))]
    table = client_table(rows, accuracy=True)
    assert table.column("accuracy").to_pylist() == [1.0, 0.75]
    assert table.column("global_accuracy").to_pylist() == [0.0, 0.25]
    m = client_metrics(table)
    assert m["clients_accuracy_mean"] == 0.875 and m["clients_global_accuracy_mean"] == 0.125
    assert pooled(rows, "global_sums") == EvalSums(1.5 + 2.0, 1, 6)
    path = tmp_path / "round_000001.arrow"
    path.write_bytes(table_bytes(table))
    values = client_values(str(path), "accuracy")
    assert list(values) == ["accuracy", "global_accuracy"]
    assert values["global_accuracy"].tolist() == [0.0, 0.25]
    fig = cdf_figure([ClientGroup("fedper", [1], values, 1)], "accuracy", "t")
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["fedper (n=2)", "fedper (global model) (n=2)"]


def test_per_client_table_every_eval_round_adds_up_to_the_pooled_metrics(tmp_path):
    res = run(tmp_path, "one")
    for m in read_metrics(res.run_dir):
        t = table(res, m["round"])
        assert t.column("client_id").to_pylist() == sorted(t.column("client_id").to_pylist())
        assert len(t) == 10
        count, correct = t.column("count").to_numpy(), t.column("correct").to_numpy()
        # integers: the pooled accuracy is the table's exactly; the loss is the table's
        # loss sums added in its (client-id) order, the order the driver adds them in
        assert m["fed_test_accuracy"] == correct.sum() / count.sum()
        loss = 0.0
        for v in t.column("loss_sum").to_pylist():
            loss += v
        assert m["fed_test_loss"] == loss / count.sum()
        has = count > 0
        assert m["clients_evaluated"] == has.sum() == 9  # client 4 has no test rows
        acc = t.column("accuracy").to_numpy()[has]
        assert m["clients_accuracy_p10"] == np.percentile(acc, 10)
        assert m["clients_accuracy_min"] == acc.min()
    assert res.summary["final"]["clients_accuracy_mean"] == m["clients_accuracy_mean"]


def test_one_and_three_workers_give_the_same_table(tmp_path):
    a, b = run(tmp_path, "w1", workers=1), run(tmp_path, "w3", workers=3)
    for r in (1, 2, 3):
        assert same_table(table(a, r), table(b, r))
    ma, mb = read_metrics(a.run_dir), read_metrics(b.run_dir)
    assert [m["fed_test_loss"] for m in ma] == [m["fed_test_loss"] for m in mb]


def test_ray_workers_send_the_same_rows(ray_cluster, tmp_path):
    """The rows cross Ray's object store as they leave an inline worker (personalized too)."""
    kw = {"eval": {"personalize": {"epochs": 1}}}
    on_ray = run(tmp_path, "ray", workers=2, backend="ray", **kw)
    inline = run(tmp_path, "inline", workers=2, **kw)
    for r in (1, 2, 3):
        assert same_table(table(on_ray, r), table(inline, r))


def test_personalization_reports_both_and_leaves_the_global_model_alone(tmp_path):
    plain = run(tmp_path, "plain")
    pers = run(tmp_path, "pers", eval={"personalize": {"steps": 5, "lr": 0.2}})
    for k, v in load_weights(plain.run_dir).items():
        assert torch.equal(v, load_weights(pers.run_dir)[k])  # bit for bit
    mp, mq = read_metrics(plain.run_dir), read_metrics(pers.run_dir)
    for a, b in zip(mp, mq, strict=True):
        assert a["fed_test_accuracy"] == b["fed_test_accuracy"]
        assert a["clients_accuracy_mean"] == b["clients_accuracy_mean"]
    t = table(pers, 3)
    assert (t.column("personalized_loss_sum").to_numpy() != t.column("loss_sum").to_numpy()
            ).sum() == 9  # every client with test data moved
    assert same_table(table(plain, 3), t.select(table(plain, 3).column_names))
    # the personalized column of one client, recomputed outside the runtime: the final
    # global model fine-tuned with 5 steps of SGD (lr 0.2, batch 4) from the client's
    # personalization seed for round 3, then evaluated on its test split
    cid = next(c for c in t.column("client_id").to_pylist() if c != 4)
    module = fixed_linear()[0]()
    module.load_state_dict(load_weights(pers.run_dir))
    model = FlatModel(module)
    start = model.flat.clone()
    (x, y), (tx, ty) = (tuple(torch.as_tensor(a) for a in CLIENTS[cid][s])
                        for s in ("train", "test"))
    local_sgd(model, start, x, y, lr=0.2, batch_size=4, local_epochs=1, local_steps=5,
              seed=personalize_seed(5, 3, cid), delta_out=torch.empty_like(start))
    want = evaluate(model.module, tx, ty, 500, torch.device("cpu"))
    row = t.filter(t.column("client_id").to_numpy() == cid).to_pylist()[0]
    assert (row["personalized_loss_sum"], row["personalized_correct"]) == \
        (want.loss_sum, want.correct)
    m = mq[-1]
    assert m["fed_test_personalized_accuracy"] == \
        t.column("personalized_correct").to_numpy().sum() / t.column("count").to_numpy().sum()
    assert "clients_personalized_accuracy_p10" in m


def test_personalization_table_script(tmp_path, monkeypatch, capsys):
    """jobs/personalization/table.py, docs/evaluation.md's table: it recomputes each run's
    clients_* statistics from the last table (asserting they equal the logged ones) and
    prints a row per seed."""
    import importlib.util

    path = pathlib.Path(__file__).resolve().parents[2] / "jobs" / "personalization" / "table.py"
    spec = importlib.util.spec_from_file_location("personalization_table", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    res = run(tmp_path, "pers", rounds=2, eval={"every": 0, "personalize": {"steps": 2}})
    monkeypatch.setattr("sys.argv", ["table.py", res.run_dir])
    script.main()
    rows = capsys.readouterr().out.splitlines()
    m = res.metrics[-1]
    assert rows[2].startswith("| 5 | 2 | 9 | ")  # seed 5, round 2, 9 clients with test data
    assert f"{m['clients_personalized_accuracy_p10']:.3f}" in rows[2].split(" | ")


def test_in_memory_clients_keep_their_test_splits():
    from fedray.data.client_source import MemorySource

    src = MemorySource(CLIENTS, in_process=True)
    assert src.has_client_test and src.test_sizes()[4] == 0
    for c in (0, 9):
        for split in ("train", "test"):
            x, y = src.client(c, split)
            assert np.array_equal(x, CLIENTS[c][split][0])
            assert np.array_equal(y, CLIENTS[c][split][1])
    with pytest.raises(FedrayError, match=r"client_data\[3\]: give \(x, y\)"):
        MemorySource({3: {"train": CLIENTS[0]["train"], "valid": CLIENTS[0]["train"]}})


def test_personalize_needs_federated_evaluation(tmp_path):
    with pytest.raises(FedrayError, match="'eval.personalize': needs eval.federated_clients"):
        run(tmp_path, "bad", eval={"federated_clients": 0, "personalize": {"epochs": 1}})
