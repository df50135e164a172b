"""benchmarks/selection.py's two studies at toy sizes: the selection study on fedray's
generated writers on the simulated clock (every selector, the report against simulated time,
the invitation counts from the participants tables), the IFCA study on the real MNIST t10k
in 8 clients of 2 rotated domains (recovery of the domains), and a second call of each that
reuses every finished run. Inline backend, no Ray; 2-3 rounds."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from benchmark_scripts import loaded


@pytest.fixture(scope="module")
def bench():
    with loaded("selection") as module:
        yield module


def test_gini_and_invitation_stats(bench):
    assert bench.gini([3, 3, 3, 3]) == 0.0
    assert bench.gini([0, 0, 0, 4]) == pytest.approx(0.75)  # (n - 1) / n
    x = np.array([0, 1, 2, 5, 9])
    pairs = np.abs(x[:, None] - x[None, :]).sum()
    assert bench.gini(x) == pytest.approx(pairs / (2 * len(x) ** 2 * x.mean()))
    assert bench.invitation_stats([0, 2, 0, 6]) == {"ever_invited": 0.5, "max_invited": 6.0,
                                                    "gini": pytest.approx(bench.gini([0, 2, 0, 6]))}


def test_recovery_takes_the_best_relabelling(bench):
    truth = np.arange(12) % 3
    assert bench.recovery((truth + 1) % 3, truth, 3) == 1.0  # renamed clusters: all found
    merged = np.where(truth == 2, 0, truth)  # domains 0 and 2 in one cluster
    assert bench.recovery(merged, truth, 3) == pytest.approx(2 / 3)
    assert bench.recovery([np.nan, 1.0, 0.0], [0, 0, 1], 2) == 1.0  # NaN: left out


def test_seeds_are_picked_for_separated_domain_angles(bench):
    from fedray.data.transforms.per_client import PerClient, draw_shift

    # the angles are what the worker draws for client d of domain d
    spec = PerClient(rotation=180.0, domains=2)
    assert bench.domain_angles(5, 2) == [draw_shift(spec, 5, d).angle for d in range(2)]
    assert bench.separation([170.0, -170.0]) == pytest.approx(20.0)  # on the circle
    seeds = bench.pick_seeds(2, 3, 90.0)
    assert len(seeds) == 3 and seeds == sorted(seeds)
    assert all(bench.separation(bench.domain_angles(s, 2)) >= 90.0 for s in seeds)
    assert bench.separation(bench.domain_angles(0, 2)) < 90.0 and 0 not in seeds


def test_selection_study_table_report_and_reuse(bench, tmp_path):
    argv = ["synthetic", "--out", str(tmp_path), "--seeds", "0", "--rounds", "3",
            "--target", "0.0", "--quiet"]
    assert bench.main(argv) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results["selectors"]) == set(bench.SELECTORS)
    for run in results["runs"].values():
        assert len(run["curve"]) == 3 and 0 <= run["accuracy"] <= 1
        assert sum(run["invited"]) == 3 * 4 and len(run["invited"]) == 20
        assert run["arrived"] == run["invited"]  # always online, no deadline
        assert run["time_to_target"] == run["curve"][0][1]  # target 0: the first eval
        assert run["sim_time_s"] > 0 and run["at_budget"] is not None
    for stats in results["selectors"].values():
        assert stats["reached"] == 1 and 0 < stats["ever_invited"][0] <= 1
    table = (tmp_path / "table.md").read_text()
    for label in ("| uniform |", "| power of choice (d = 2k) |", "| Oort |", "Gini"):
        assert label in table
    assert (tmp_path / "report" / "report.json").exists()
    for png in ("selection_synthetic_time.png", "selection_synthetic_invitations.png"):
        assert (tmp_path / png).stat().st_size > 5_000
    # a second call trains nothing: every run is read back from its directory
    before = {p: os.path.getmtime(p) for p in tmp_path.glob("runs/**/summary.json")}
    bench.main(argv)
    again = json.loads((tmp_path / "results.json").read_text())
    assert all(r.get("reused") for r in again["runs"].values())
    assert {p: os.path.getmtime(p) for p in tmp_path.glob("runs/**/summary.json")} == before


def test_ifca_study_recovers_domains_and_reuses(bench, tmp_path, shared_data):
    argv = ["ifca", "--out", str(tmp_path), "--data", str(shared_data), "--domains", "2",
            "--seeds", "2", "--clients", "8", "--rounds", "2", "--clients-per-round", "4",
            "--eval-every", "1", "--quiet"]
    assert bench.main(argv) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    (block,) = results["blocks"]
    assert block["k"] == 2 and block["seeds"] == [2]
    (fedavg,), (ifca,) = block["runs"]["fedavg"], block["runs"]["ifca"]
    assert "recovery" not in fedavg and len(fedavg["domain_accuracy"]) == 2
    assert len(ifca["clusters"]) == 8 and 0.5 <= ifca["recovery"] <= 1
    assert len(ifca["recovery_curve"]) == 2 and ifca["trained_last"] >= 4
    assert 0 <= ifca["global_mean"] <= 1 and ifca["clusters_used"] in (1, 2)
    table = (tmp_path / "table.md").read_text()
    assert "| IFCA (each client's cluster) |" in table and "seed 2: -94, 32" in table
    assert (tmp_path / "selection_ifca.png").stat().st_size > 5_000
    bench.main(argv)
    again = json.loads((tmp_path / "results.json").read_text())
    assert all(r.get("reused") for m in again["blocks"][0]["runs"].values() for r in m)
