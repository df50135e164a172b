"""The README's quickstart job, and the benchmarks, as a user would run them."""

import argparse
import importlib.util
import json
import time

import numpy as np
import pytest
import torch
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
    # chance is 1/62 = 0.016. Round 30 is still on the steep part of the curve, where the
    # CNN's trajectory follows the CPU's rounding: 0.32-0.35 with the convolutions and
    # elementwise kernels of other instruction sets (oneDNN's AVX2 and SSE4.1, ATen's
    # AVX2 and scalar ones, besides AVX-512), so the bar sits well below that spread
    assert accuracy > 0.2, accuracy
    assert elapsed < 120, elapsed


def _benchmark(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_throughput_benchmark_measures_every_side(ray_cluster, capsys):
    throughput = _benchmark("throughput")  # main() is measure() per workload, in a new Ray
    args = argparse.Namespace(rounds=2, warmup=1, workers=None, vectorized_worker_cpus=1.0,
                              repeat=1, flower_python=None)
    row = throughput.measure("b", throughput.make_clients(), args)
    assert "b            (logreg, 100 clients/round" in capsys.readouterr().out
    assert row["vectorized_updates_per_s"] > 0 and row["sequential_updates_per_s"] > 0
    assert row["vectorized_ratio"] == pytest.approx(
        row["vectorized_updates_per_s"] / row["raw_updates_per_s"])
    assert row["raw_updates_per_s"] == max(row["raw_1_threads_updates_per_s"],
                                           row[f"raw_{row['raw_threads']}_threads_updates_per_s"])
    assert row["vectorized_max_weight_diff_vs_raw"] < 1e-4  # the same job, trained alike
    for label in ("raw", "sequential", "vectorized"):  # medians of the interleaved repeats
        runs = row[f"{label}_runs"]
        assert len(runs) == 1 and row[f"{label}_updates_per_s"] == runs[0]


def test_vectorized_step_benchmark_times_both_steps_on_the_same_groups(capsys):
    step = _benchmark("vectorized_step")
    row, = step.measure("mlp", step.make_clients(6), groups=[4], repeat=1)
    assert "mlp     groups of   4, 1 epoch: stacks" in capsys.readouterr().out
    assert row["auto"] == "stacks" and "sums_per_s" not in row  # a ReLU chain: stacked
    assert row["closed_form_per_s"] == row["stacks_per_s"] > 0 and row["torch_func_per_s"] > 0
    assert row["speedup"] == pytest.approx(row["closed_form_per_s"] / row["torch_func_per_s"])
    assert row["max_abs_diff"] < 1e-5  # the same local SGD, rounded differently
    small, large = step.measure("logreg", step.make_clients(6), groups=[2, 3], repeat=1,
                                epochs=3)
    assert (small["group"], large["group"]) == (2, 3)
    row = large
    assert row["auto"] == "sums"  # one layer, three passes over small clients
    assert row["closed_form_per_s"] == row["sums_per_s"] > 0 and row["stacks_per_s"] > 0
    assert row["max_abs_diff"] < 1e-5
    check = step.against_sequential("mlp", step.make_clients(5), group=2)
    assert check["stacks_above_tol"] == 0 and check["stacks_max_diff"] < 1e-5
    assert set(check) >= {"sums_max_diff", "torch_func_max_diff", "torch_func_above_tol"}
    with pytest.raises(SystemExit):
        step.main(["--clients", "0"])
    assert "--clients, --repeat, --epochs and --group must be at least 1" in \
        capsys.readouterr().err


def test_throughput_repeats_interleave_the_sides_and_report_medians(monkeypatch, capsys):
    throughput = _benchmark("throughput")
    calls, weights = [], {"w": torch.zeros(2)}
    seconds = {"raw_2": [2.0, 1.0, 4.0], "raw_1": [1.0, 1.0, 1.0],  # per run: seconds a round
               "off": [0.5, 0.25, 1.0], "on": [0.2, 0.1, 0.4], "flower": [4.0, 2.0, 5.0]}
    updates = [100, 100, 100]

    def raw_loop(clients, model, k, lr, rounds, threads):
        calls.append(f"raw_{threads}")
        return [seconds[f"raw_{threads}"][calls.count(calls[-1]) - 1]] * rounds, weights

    def fedray_run(clients, model, k, lr, rounds, workers, out_dir, vectorize, cpus):
        calls.append(vectorize)
        return [seconds[vectorize][calls.count(vectorize) - 1]] * rounds, weights, {
            "num_workers": 2}

    def flower_run(python, name, data, rounds):
        assert (python, name, data) == ("/flower/bin/python", "b", "clients.npz")
        calls.append("flower")
        return {"round_s": [seconds["flower"][calls.count("flower") - 1]] * rounds,
                "updates": updates, "flower_version": "1.42.0"}

    monkeypatch.setattr(throughput, "raw_loop", raw_loop)
    monkeypatch.setattr(throughput, "fedray_run", fedray_run)
    monkeypatch.setattr(throughput, "flower_run", flower_run)
    monkeypatch.setattr(throughput.torch, "get_num_threads", lambda: 2)
    args = argparse.Namespace(rounds=3, warmup=1, workers=None, vectorized_worker_cpus=1.0,
                              repeat=3, flower_python="/flower/bin/python",
                              flower_data="clients.npz")
    row = throughput.measure("b", {}, args)
    assert calls == ["raw_2", "raw_1", "off", "on", "flower"] * 3  # interleaved
    # 100 clients a round: the raw loop's medians are 50/s (2 threads) and 100/s (1 thread)
    assert row["raw_threads"] == 1 and row["raw_updates_per_s"] == pytest.approx(100)
    assert row["sequential_runs"] == pytest.approx([200, 400, 100])
    assert row["sequential_updates_per_s"] == pytest.approx(200)
    assert row["vectorized_ratio"] == pytest.approx(5.0)
    assert row["sequential_workers"] == row["vectorized_workers"] == 2
    # Flower: a median of 25/s; fedray's best side (vectorized, 500/s) is 20x that
    assert row["flower_runs"] == pytest.approx([25, 50, 20])
    assert row["flower_ratio"] == pytest.approx(0.25)
    assert row["fedray_vs_flower"] == pytest.approx(20.0)
    out = capsys.readouterr().out
    assert "median of 3" in out and "Flower 1.42.0" in out and "20.0x Flower" in out
    updates[1] = 99  # a round that lost an update is an error, not a figure
    calls.clear()
    with pytest.raises(SystemExit, match="Flower aggregated"):
        throughput.measure("b", {}, args)
    with pytest.raises(SystemExit):  # before any Ray starts
        throughput.main(["--repeat", "0"])
    assert "--repeat must be at least 1" in capsys.readouterr().err


@pytest.mark.slow
def test_flower_side_reads_each_client_as_throughput_wrote_it(tmp_path):
    # the .npz is the contract between throughput.py and flower_side.py (which runs under
    # Flower's own environment, absent here): client c must come back as exactly client c
    throughput = _benchmark("throughput")
    flower_side = _benchmark("flower_side")
    g = np.random.default_rng(0)
    clients = {c: (g.random((n, 1, 28, 28), np.float32), g.integers(0, 62, n))
               for c, n in enumerate(g.integers(1, 4, throughput.POPULATION))}
    throughput.write_clients(clients, str(tmp_path / "clients.npz"))
    for c in (0, 1, 517, throughput.POPULATION - 1):
        x, y = flower_side._client_arrays(str(tmp_path / "clients.npz"), c)
        assert np.array_equal(x.numpy(), clients[c][0]) and np.array_equal(y.numpy(), clients[c][1])


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


def test_startup_benchmark_times_each_run(ray_cluster, tmp_path, capsys):
    startup = _benchmark("startup")  # reuses the session's Ray
    assert startup.main(["--in-session", "--runs", "1", "--json",
                         str(tmp_path / "startup.json")]) == 0
    r = json.loads((tmp_path / "startup.json").read_text())
    (run,) = r["runs"]
    assert run["workers"] == 2 and 0 < run["pool_start_s"] < run["wall_s"]
    assert 0 < run["rounds_s"] < run["wall_s"] and r["median_wall_s"] == run["wall_s"]
    assert "median of 1:" in capsys.readouterr().out


def test_startup_phases_add_up_to_the_whole_process():
    """benchmarks/startup.py's phases of one process: each from the mark before it, a mark
    not reached (a fedray without a second prepare) a phase of 0, the driver's setup split
    by its wait for the workers and the rounds by metrics.jsonl; together, exec to exit."""
    startup = _benchmark("startup")
    t = iter(range(100))
    marks = {name: float(next(t)) for name in [
        "exec", "python", "cli_imported", "prepare#0:in", "prepare#0:out", "run#0:in",
        "ray_session:in", "init#0:in", "init#0:out", "_build_source#0:in",
        "_build_source#0:out", "get#0:in", "get#0:out", "get#1:in", "get#1:out", "get#2:in",
        "get#2:out", "get#3:in", "get#3:out", "get#4:in", "get#4:out", "kill_actors#0:in",
        "kill_actors#0:out", "shutdown#0:in", "shutdown#0:out", "main_returned", "exit"]}
    out = startup.phases(marks, {"pool_start_s": 0.25}, [{"train_s": 0.5, "wall_s": 0.75}])
    assert out.pop("total") == marks["exit"] - marks["exec"] == sum(out.values())
    assert out["fedray.run: prepare the job"] == 0  # prepare#1 never happened
    assert out["imports for a Ray run"] == marks["ray_session:in"] - marks["prepare#0:out"]
    assert out["driver waits for its workers"] == 0.25
    assert out["driver: boot, imports, setup"] == 1 - 0.25
    assert (out["rounds: train"], out["rounds: evaluate"]) == (0.5, 0.25)
    assert out["rounds: the rest"] == marks["get#2:out"] - marks["get#2:in"] - 0.75
    assert out["finish: write outputs"] == marks["get#3:out"] - marks["get#2:out"]


def test_startup_phases_of_a_run_handed_over_to_ray():
    """runtime.backend auto: its first round in the CLI's process (the Driver's own
    methods, marked isetup/iround), the second on Ray (session.get #2); each part's rounds
    split by its own metrics lines."""
    startup = _benchmark("startup")
    t = iter(range(100))
    marks = {name: float(next(t)) for name in [
        "exec", "python", "cli_imported", "prepare#0:in", "prepare#0:out", "run#0:in",
        "isetup#0:in", "isetup#0:out", "iround#0:in", "iround#0:out",
        "ray_session:in", "init#0:in", "init#0:out", "_build_source#0:in",
        "_build_source#0:out", "get#0:in", "get#0:out", "get#1:in", "get#1:out", "get#2:in",
        "get#2:out", "get#3:in", "get#3:out", "get#4:in", "get#4:out", "kill_actors#0:in",
        "kill_actors#0:out", "shutdown#0:in", "shutdown#0:out", "main_returned", "exit"]}
    metrics = [{"train_s": 0.5, "wall_s": 0.75}, {"train_s": 0.25, "wall_s": 0.5}]
    out = startup.phases(marks, {"pool_start_s": 0.25}, metrics)
    assert out.pop("total") == marks["exit"] - marks["exec"] == sum(out.values())
    assert out["in this process: driver setup"] == marks["isetup#0:out"] - marks["prepare#0:out"]
    assert out["in this process: rounds: train"] == 0.5
    assert out["in this process: rounds: the rest"] == 2 - 0.75  # iround#0 out - isetup out
    assert out["in this process: finish"] == 0  # handed over: no finish here
    assert out["imports for a Ray run"] == marks["ray_session:in"] - marks["iround#0:out"]
    assert (out["rounds: train"], out["rounds: evaluate"]) == (0.25, 0.25)
    assert out["finish: write outputs"] == marks["get#3:out"] - marks["get#2:out"]
