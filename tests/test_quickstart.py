"""The README's quickstart job, and the benchmarks, as a user would run them."""

import argparse
import importlib.util
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


def _benchmark(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_throughput_benchmark_measures_every_side(ray_cluster, capsys):
    throughput = _benchmark("throughput")  # main() is measure() per workload, in a new Ray
    args = argparse.Namespace(rounds=2, warmup=1, workers=None, vectorized_worker_cpus=1.0)
    row = throughput.measure("b", throughput.make_clients(), args)
    assert "b            (logreg, 100 clients/round" in capsys.readouterr().out
    assert row["vectorized_updates_per_s"] > 0 and row["sequential_updates_per_s"] > 0
    assert row["vectorized_ratio"] == pytest.approx(
        row["vectorized_updates_per_s"] / row["raw_updates_per_s"])
    assert row["raw_updates_per_s"] == max(row["raw_1_threads_updates_per_s"],
                                           row[f"raw_{row['raw_threads']}_threads_updates_per_s"])
    assert row["vectorized_max_weight_diff_vs_raw"] < 1e-4  # the same job, trained alike


@pytest.mark.slow
def test_gpu_profile_cases_on_a_declared_gpu(ray_cluster, tmp_path):
    # the session's Ray declares one GPU and this machine has none: the workers get their
    # fractional shares and train on the CPU, which checks placement and bookkeeping only
    gpu_profile = _benchmark("gpu_profile")
    args = argparse.Namespace(rounds=2, warmup=1, population=4, clients_per_round=2,
                              worker_cpus=0.5, model="logreg", min_examples=10,
                              max_examples=20)
    rows = [gpu_profile.run_case(2, 1, v, args, str(tmp_path / v)) for v in ("off", "on")]
    assert [(r["vectorize"], r["vectorized"], r["workers"], r["num_gpus_per_worker"])
            for r in rows] == [("off", False, 2, 0.5), ("on", True, 2, 0.5)]
    assert all(r["updates_per_s_per_gpu"] > 0 and r["gpu_utilization_pct"] is None
               and r["devices"] == ["cpu"] for r in rows)
