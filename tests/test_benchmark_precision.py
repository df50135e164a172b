"""benchmarks/throughput.py --precision bf16: fedray's sides in bfloat16 autocast, interleaved
with the fp32 ones, against the same float32 raw loop; the fp32 rows as without it."""

from __future__ import annotations

import argparse

import pytest
import torch
from benchmark_scripts import loaded


def test_bf16_rows_sit_beside_the_fp32_rows(monkeypatch, capsys):
    with loaded("throughput") as throughput:
        calls, weights = [], {"w": torch.zeros(2)}
        seconds = {"raw_1": 1.0, "off": 0.5, "on": 0.25, "off_bf16": 1.0, "on_bf16": 0.5}

        def raw_loop(clients, model, k, lr, rounds, threads):
            calls.append(f"raw_{threads}")
            return [seconds["raw_1"]] * rounds, weights

        def fedray_run(clients, model, k, lr, rounds, workers, out_dir, vectorize, cpus,
                       precision="fp32"):
            side = vectorize + ("" if precision == "fp32" else f"_{precision}")
            calls.append(side)
            return [seconds[side]] * rounds, weights, {"num_workers": 2}

        monkeypatch.setattr(throughput, "raw_loop", raw_loop)
        monkeypatch.setattr(throughput, "fedray_run", fedray_run)
        monkeypatch.setattr(throughput.torch, "get_num_threads", lambda: 1)
        args = argparse.Namespace(rounds=3, warmup=1, workers=None, vectorized_worker_cpus=1.0,
                                  repeat=2, flower_python=None, precision=["bf16"])
        row = throughput.measure("b", {}, args)
    assert calls == ["raw_1", "off", "off_bf16", "on", "on_bf16"] * 2  # interleaved
    assert row["sequential_updates_per_s"] == pytest.approx(200)  # 100 clients / 0.5 s
    assert row["sequential_bf16_updates_per_s"] == pytest.approx(100)
    assert row["sequential_bf16_ratio"] == pytest.approx(1.0)  # against the fp32 raw loop
    assert row["sequential_bf16_vs_fp32"] == pytest.approx(0.5)
    assert row["vectorized_bf16_ratio"] == pytest.approx(2.0)
    out = capsys.readouterr().out
    assert "vectorized_bf16:   200.0/s [200.0-200.0] = 2.00x raw (fp32), 0.50x fedray fp32" in out
