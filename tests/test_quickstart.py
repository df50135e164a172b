"""The README's quickstart job, and the benchmarks, as a user would run them."""

import json
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


@pytest.mark.slow
def test_gpu_profile_runs_on_a_declared_gpu(tmp_path):
    # no GPU here: one is declared to Ray, and the workers' fractional shares are checked
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_profile.py"),
                          "--fake-gpu", "--workers-per-gpu", "2", "--rounds", "2",
                          "--warmup", "1", "--clients-per-round", "2", "--population", "4",
                          "--worker-cpus", "0.5", "--json", str(tmp_path / "gpu.json")],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    rows = json.loads((tmp_path / "gpu.json").read_text())
    assert [(r["workers_per_gpu"], r["vectorize"], r["vectorized"]) for r in rows] == [
        (2, "off", False), (2, "on", True)]
    assert all(r["workers"] == 2 and r["num_gpus_per_worker"] == 0.5 for r in rows)
    assert all(r["updates_per_s_per_gpu"] > 0 and r["gpu_utilization_pct"] is None
               for r in rows)
    assert "2 workers/GPU (num_gpus 0.5), vectorize on" in out.stdout
