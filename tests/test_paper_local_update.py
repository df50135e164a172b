"""Reproduction 11's report (jobs/paper/local_update/run.py) for Fig. 12 (``--eta``: the
server lr fixed, no tuning runs) on run directories written by hand: the windows of the
training loss per seed, and no grid table when nothing was tuned."""

from __future__ import annotations

import json
import pathlib

import pytest
from paper_scripts import load_paper_script


@pytest.fixture(scope="module")
def local_update():
    return load_paper_script("local_update")


def write_run(root: pathlib.Path, name: str, losses: list[float], acc: float) -> str:
    run = root / name
    run.mkdir(parents=True)
    rows = [{"round": r, "train_loss": v} for r, v in enumerate(losses, 1)]
    rows[-1]["test_accuracy"] = acc
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(m) for m in rows) + "\n")
    return str(run)


def test_a_fixed_eta_report_has_the_windows_and_no_grid(local_update, tmp_path):
    finals = {"gamma=0": [write_run(tmp_path, f"g0-s{s}", [4.0 - 0.1 * r - s for r in range(6)],
                                    0.2) for s in range(3)]}
    chosen = {"gamma=0": (0.0, 0.01, {})}
    study = {"title": "t", "metric": "train_loss"}
    local_update.write_report(str(tmp_path), study, chosen, finals, 6, None)
    text = (tmp_path / "report.md").read_text()
    assert "No tuning: every gamma at the fixed eta; runs of 6 rounds, seeds 0, 1, 2." in text
    assert "Grid (seed 0)" not in text
    # windows: rounds 1-6 (at most 10), the first third (1-2), the last third (5-6); seed 0
    # falls 4.0, 3.9, ..., 3.5 and each later seed is 1 lower
    assert ("| gamma=0 | 2.750 ± 1.000 (3.750, 2.750, 1.750) | 2.950 ± 1.000 (3.950, 2.950, "
            "1.950) | 2.550 ± 1.000 (3.550, 2.550, 1.550) |") in text
