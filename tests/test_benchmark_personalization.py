"""benchmarks/personalization.py's core on fedray's generated writers: it tunes, runs the
seeds, writes the table, the JSON and the figure with the measured keys, and a second call
reuses every finished run instead of training again (the benchmark is resumable). Inline
backend, no Ray; 2 rounds of 4 clients."""

from __future__ import annotations

import json
import os
from dataclasses import replace

import numpy as np
import pytest
from benchmark_scripts import loaded


@pytest.fixture(scope="module")
def bench():
    with loaded("personalization") as module:
        yield module


def test_tables_json_and_resume(bench, tmp_path, monkeypatch):
    # Ditto at one lam: fewer runs, the same code paths as a 2-value grid (FedAvg's has 2)
    monkeypatch.setattr(bench, "METHODS", [
        replace(m, grid={"algorithm.ditto.lam": [0.1]}) if m.key == "ditto" else m
        for m in bench.METHODS])
    argv = ["synthetic", "--out", str(tmp_path), "--methods", "fedavg", "fedavg_ft", "ditto",
            "--seeds", "0", "1", "--lrs", "0.1", "--quiet"]
    assert bench.main(argv) == 0
    args = bench.parse(argv)
    results = json.loads((tmp_path / "results.json").read_text())
    rows = {r["key"]: r for r in results["rows"]}
    assert set(rows) == {"fedavg", "fedavg_ft", "ditto"}
    for row in rows.values():
        assert row["seeds"] == [0, 1]
        assert len(row["grid"]) == (1 if row["key"] == "ditto" else 2)  # 1 lr x its values
        for k in ("mean", "p10", "worst10", "global_mean"):
            assert 0.0 <= row["stats"][k] <= 1.0 and row["stats"][f"{k}_std"] >= 0.0
        assert row["stats"]["train_s_per_round"] > 0 and row["stats"]["wall_s_per_round"] > 0
    # FedAvg and FedAvg + fine-tune share their seed-0 grid: 2 runs, then the seeds' runs
    fedavg_runs = [k for k in results["runs"] if os.sep + "fedavg" + os.sep in k]
    assert 2 <= len(fedavg_runs) <= 4
    # a row's numbers are its runs' final metrics, mean over seeds
    best = bench.slug(rows["ditto"]["best"])
    means = [results["runs"][os.path.join(bench.protocol_dir(args), "ditto", f"{best}_s{s}")]
             ["clients_accuracy_mean"] for s in (0, 1)]
    assert rows["ditto"]["stats"]["mean"] == pytest.approx(np.mean(means))
    table = (tmp_path / "table.md").read_text()
    for label in ("| FedAvg |", "| FedAvg + fine-tune (1 epoch) |", "| Ditto |"):
        assert label in table
    for header in ("client mean", "client p10", "worst 10 %", "global model, client mean",
                   "train s/round"):
        assert header in table
    assert (tmp_path / "personalization_synthetic.png").stat().st_size > 0

    # resumable: the same command again trains nothing
    bench.main(argv)
    again = json.loads((tmp_path / "results.json").read_text())
    assert all(r.get("reused") for r in again["runs"].values())
    assert again["rows"] == results["rows"]


def test_an_unregistered_preset_is_a_row_that_says_so(bench, tmp_path):
    args = bench.parse(["synthetic", "--out", str(tmp_path), "--seeds", "0", "--quiet"])
    results = bench.benchmark(bench.DATASETS["synthetic"], args,
                              [bench.Method("nope", "Nope", "no_such_preset", {})])
    assert results["runs"] == {}
    assert "| Nope | not run: preset no_such_preset is not registered |" \
        in (tmp_path / "table.md").read_text()


def test_pathological_split_two_classes_each_with_own_test(bench):
    y = np.repeat(np.arange(10), 50)
    owner, split = bench.pathological_clients(y, 20, seed=0)
    assert set(np.unique(owner)) == set(range(20))
    for c in range(20):
        mine = owner == c
        assert len(np.unique(y[mine])) == 2
        assert (split[mine] == "test").sum() > 0 and (split[mine] == "train").sum() > 0
    # every class is held by the same number of clients (2 * 20 / 10)
    assert all(len(np.unique(owner[y == k])) == 4 for k in range(10))
