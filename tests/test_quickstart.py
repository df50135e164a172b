"""The README's quickstart job, and the throughput benchmark, as a user would run them."""

import subprocess
import sys
import time

import pytest
from test_docs import ROOT

import fedray


@pytest.mark.slow
def test_quickstart_learns_well_above_chance(ray_cluster, tmp_path):
    start = time.perf_counter()
    # the demo's job, 30 of its 50 rounds (suite time): well above chance already
    res = fedray.run(ROOT / "jobs" / "quickstart.yaml",
                     overrides=[f"output.dir={tmp_path}/q", "rounds=30"])
    elapsed = time.perf_counter() - start
    accuracy = res.summary["final"]["test_accuracy"]
    assert accuracy > 0.25, accuracy  # chance is 1/62 = 0.016
    assert elapsed < 120, elapsed


@pytest.mark.slow
def test_throughput_benchmark_runs(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "throughput.py"),
                          "--workload", "b", "--rounds", "3", "--warmup", "1",
                          "--json", str(tmp_path / "b.json")],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "workload b" in out.stdout and "ratio" in out.stdout
    assert (tmp_path / "b.json").exists()
