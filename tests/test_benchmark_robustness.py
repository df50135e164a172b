"""benchmarks/robustness.py's core on fedray's generated writers: it runs every (attack,
defense, seed), writes the table, the JSON and the figure of the attack that hurts FedAvg
most, and a second call reuses every finished run (the benchmark is resumable). Inline
backend, no Ray; 2 rounds."""

from __future__ import annotations

import json
import os

import pytest
from benchmark_scripts import loaded


@pytest.fixture(scope="module")
def bench():
    with loaded("robustness") as module:
        yield module


def test_table_json_figure_and_reuse(bench, tmp_path):
    argv = ["synthetic", "--out", str(tmp_path), "--attacks", "none", "backdoor", "alie",
            "--defenses", "fedavg", "median", "norm_bound", "--seeds", "0", "--rounds", "2",
            "--eval-every", "1", "--quiet"]
    bench.main(argv)
    results = json.loads((tmp_path / "results.json").read_text())
    grid = results["grid"]
    assert set(grid) == {"none", "backdoor", "alie"}
    for key, attack in grid.items():
        assert set(attack) == {"fedavg", "median", "norm_bound"}
        for defense, (run,) in attack.items():
            if key == "alie" and defense == "norm_bound":  # refused by fedray: not run
                assert run["skipped"] == bench.NOT_WITH_STAGES
                continue
            assert 0 <= run["accuracy"] <= 1 and len(run["curve"]) == 2
    # a backdoor has a success rate; the others do not
    assert all("attack_success" in r[0] for r in grid["backdoor"].values())
    assert all("attack_success" not in r[0] for r in grid["alie"].values())
    # the median flags clients; FedAvg's mean never does (no precision, recall 0)
    assert grid["alie"]["median"][0]["defense_recall"] >= 0
    assert "defense_precision" not in grid["alie"]["fedavg"][0]
    table = (tmp_path / "table.md").read_text()
    assert "| ALIE (z from n, m) |" in table and "Backdoor success" in table
    alie = next(line for line in table.splitlines() if line.startswith("| ALIE"))
    assert alie.endswith("| n/a |") and "n/a: an omniscient attack" in table
    assert results["strongest"] in ("backdoor", "alie")
    assert (tmp_path / "robustness_synthetic.png").stat().st_size > 10_000
    # a second call trains nothing: every run is read back from its directory
    before = {p: os.path.getmtime(p) for p in tmp_path.glob("runs/**/summary.json")}
    bench.main(argv)
    again = json.loads((tmp_path / "results.json").read_text())
    assert all(r[0].get("reused") or "skipped" in r[0]
               for a in again["grid"].values() for r in a.values())
    assert {p: os.path.getmtime(p) for p in tmp_path.glob("runs/**/summary.json")} == before
