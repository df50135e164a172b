"""Reproduction 7's tau sweep table (jobs/paper/elastic_dirichlet/tau_table.py) on run
directories written by hand: the "last 10" metric, the per-seed differences, the spread rule
and the group names the section's commands use."""

from __future__ import annotations

import json
import pathlib

import pytest
from paper_scripts import load_paper_script


@pytest.fixture(scope="module")
def tau_table():
    return load_paper_script("elastic_dirichlet", "tau_table.py")


def write_run(root: pathlib.Path, name: str, accs: list[float], boosted: float | None = None):
    run = root / name
    run.mkdir(parents=True)
    lines = []
    for i, acc in enumerate(accs, 1):
        m = {"round": 2 * i, "test_accuracy": acc}
        if boosted is not None:
            m["elastic_boosted_share"] = boosted - 0.001 * (i == 1)
        lines.append(json.dumps({"round": 2 * i - 1}))  # a round without evaluation
        lines.append(json.dumps(m))
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (run / "summary.json").write_text("{}")


def test_group_names_match_the_section_commands(tau_table):
    assert tau_table.elastic_group(0.5, "momentum") == "elastic_fedavgm"
    assert tau_table.elastic_group(0.5, "average") == "elastic_fedavgm_average"
    assert tau_table.elastic_group(0.01, "average") == "elastic_fedavgm_average_tau0.01"
    assert tau_table.elastic_group(0.01, "momentum", batch1=True) == (
        "elastic_fedavgm_momentum_b1_tau0.01")
    assert tau_table.elastic_group(0.5, "average", batch1=True) == "elastic_fedavgm_average_b1"
    assert tau_table.control_group(0.5) == "fedavgm_lr1.5"
    assert tau_table.control_group(0.1) == "fedavgm_lr1.1"


def test_last10_differences_and_spread(tau_table, tmp_path):
    # 12 evaluations: the first two (0.0) must not enter the last 10
    for s, level in enumerate([0.90, 0.91, 0.92]):
        write_run(tmp_path, f"fedavgm-s{s}", [0.0, 0.0] + [level] * 10)
        write_run(tmp_path, f"elastic_fedavgm-s{s}", [0.0, 0.0] + [level + 0.001] * 10, 0.99)
        write_run(tmp_path, f"elastic_fedavgm_tau0.1-s{s}", [0.0] * 2 + [0.95] * 10, 0.9)
    (tmp_path / "fedavgm-s9").mkdir()  # unfinished: no summary.json, left out
    t = tau_table.table(tmp_path, [0.5, 0.1])
    assert t["base"]["seeds"] == [0, 1, 2]
    assert t["base"]["last10_mean"] == pytest.approx(0.91)
    assert t["base"]["last10_std"] == pytest.approx((2 * 0.01**2 / 3) ** 0.5)
    r05, r01 = t["taus"]
    assert r05["momentum"]["minus_base"] == pytest.approx([0.001] * 3)
    # +0.001 is far inside a spread of 0.008: not beyond it
    assert r05["momentum"]["beyond_spread_vs_base"] is False
    assert r01["momentum"]["beyond_spread_vs_base"] is True
    assert r05["momentum"]["summary"]["boosted_mean"] == pytest.approx(0.99 - 0.001 / 12)
    assert r05["momentum"]["summary"]["boosted_min"] == pytest.approx(0.989)
    assert r05["momentum"]["summary"]["boosted_std"] == pytest.approx(0.0)
    assert r05["average"]["summary"] is None and r05["control_summary"] is None
    assert "| 0.1 | momentum | 0.9500 ± 0.0000 | +0.0500, +0.0400, +0.0300 |" in (
        tau_table.markdown(t))
