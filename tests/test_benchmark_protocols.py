"""benchmarks/protocols.py's pieces without Ray or Flower: the FLOP counter against hand
counts, the per-side numbers, the Markdown table, the arguments, the shared setup (the
clients Flower is given are fedray's sampled clients, bit for bit) and flower_side.py's
client file and local training."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch
from benchmark_scripts import loaded
from torch import nn


@pytest.fixture(scope="module")
def bench():
    with loaded("protocols") as module:
        yield module


@pytest.fixture(scope="module")
def flower_side():
    with loaded("flower_side") as module:
        yield module


def test_forward_macs_of_a_small_model_is_the_hand_count(bench):
    # conv 1->2, 3x3 on 4x4: 2 x 2 x 2 outputs, 1 x 9 MACs each = 72; linear 8 -> 3: 24
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8, 3))
    assert bench.forward_macs(model, (1, 4, 4)) == 72 + 24
    # stride 2, padding 1, 2 groups, 2 -> 4 channels on 5x5: 4 x 3 x 3 outputs, each
    # (2 / 2) x 9 MACs = 324
    grouped = nn.Conv2d(2, 4, 3, stride=2, padding=1, groups=2)
    assert bench.forward_macs(grouped, (2, 5, 5)) == 324


def test_forward_macs_of_the_protocol_models(bench):
    from fedray.core.models import build_model

    # emnist_cnn (FLUTE's CNN_DropOut) on 1x28x28: conv3x3-32 -> 32x26x26, conv3x3-64 ->
    # 64x24x24, pool -> 9,216, fc128, fc62
    emnist = 32 * 26 * 26 * 9 + 64 * 24 * 24 * 32 * 9 + 9216 * 128 + 128 * 62
    assert bench.forward_macs(build_model("emnist_cnn", (1, 28, 28), 62), (1, 28, 28)) == emnist
    # pfl_cifar10_cnn on 3x32x32: 32x30x30 (3 x 9 each), 64x28x28, 12,544 -> 128 -> 10
    pfl = 32 * 30 * 30 * 27 + 64 * 28 * 28 * 32 * 9 + 12544 * 128 + 128 * 10
    assert bench.forward_macs(build_model("pfl_cifar10_cnn", (3, 32, 32), 10),
                              (3, 32, 32)) == pfl
    # leaf_cnn: 5x5 'same' convolutions, two poolings: 28x28 and 14x14, 3,136 -> 2,048 -> 62
    leaf = 32 * 28 * 28 * 25 + 64 * 14 * 14 * 32 * 25 + 3136 * 2048 + 2048 * 62
    assert bench.forward_macs(build_model("leaf_cnn", (1, 28, 28), 62), (1, 28, 28)) == leaf


def test_forward_macs_refuses_layers_it_cannot_count_and_keeps_the_mode(bench):
    with pytest.raises(ValueError, match="BatchNorm1d"):
        bench.forward_macs(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)), (4,))
    with pytest.raises(ValueError, match="LSTM"):
        bench.forward_macs(nn.LSTM(4, 4), (3, 4))
    model = nn.Sequential(nn.Linear(4, 2), nn.Dropout(0.5))
    model.train()
    assert bench.forward_macs(model, (4,)) == 8
    assert model.training
    assert not model[0]._forward_hooks  # its hooks are removed


def test_training_flops_and_gemm_peak(bench):
    assert bench.training_flops(1000, 50, 2) == 6 * 1000 * 50 * 2
    threads = torch.get_num_threads()
    rate = bench.gemm_peak(threads=1, n=64, repeats=2)
    assert math.isfinite(rate) and rate > 0
    assert torch.get_num_threads() == threads


def test_side_numbers(bench):
    out = bench.side_numbers([10.0, 2.0, 4.0], [100, 50, 70], 30.0, 1, 6.0)
    assert out["steady_s_per_round"] == 3.0 and out["steady_median_s"] == 3.0
    assert out["steady_flop_s"] == 6.0 * 120 / 6.0
    assert out["whole_flop_s"] == 6.0 * 220 / 30.0
    assert out["outside_rounds_s"] == 14.0
    with pytest.raises(ValueError, match="leave none"):
        bench.side_numbers([1.0], [10], 2.0, 1, 6.0)
    med = bench.median_side([out, {**out, "whole_s": 40.0}, {**out, "whole_s": 20.0}])
    assert med["whole_s"] == 30.0 and len(med["runs"]) == 3


def _row(bench, flower: bool) -> dict:
    fedray = bench.side_numbers([9.0, 2.0, 2.0], [10, 10, 10], 20.0, 1, 1e9)
    row = {"title": "toy", "rounds": 3, "warmup": 1, "paper_rounds": 1500,
           "fedray": bench.median_side([fedray])}
    if flower:
        row["flower"] = bench.median_side([bench.side_numbers([9.0, 3.0, 3.0], [10, 10, 10],
                                                              50.0, 1, 1e9)])
    bench.with_peak(row, 1e10)
    return row


def test_markdown_table(bench):
    with_flower, without = _row(bench, True), _row(bench, False)
    assert bench.ratios(with_flower) == (1.5, 2.5)
    assert bench.ratios(without) == (None, None)
    # fedray steady: 20 examples x 1e9 FLOP in 4 s = 5e9 FLOP/s, half of the 1e10 peak
    assert with_flower["fedray"]["steady_peak_fraction"] == 0.5
    lines = bench.markdown_table([with_flower, without]).splitlines()
    assert len(lines) == 4
    assert len({line.count("|") for line in lines}) == 1  # every line has every column
    assert "| toy | 3 of 1,500 (2) | 20.0 s | 2.0 s | 50.0 s | 3.0 s | **1.50x**; 2.50x |" \
        in lines[2]
    assert "50.0% / 33.3%" in lines[2]
    assert "| - | - | - |" in lines[3]


def test_arguments(bench, tmp_path):
    args = bench.parse_args(["--protocol", "quickstart", "quickstart"])
    assert args.protocol == ["quickstart"] and args.rounds == 5 and args.warmup == 1
    for bad in (["--rounds", "1"], ["--repeat", "0"], ["--warmup", "-1"],
                ["--protocol", "nope"], ["--flower-python", str(tmp_path / "python")]):
        with pytest.raises(SystemExit):
            bench.parse_args(["--protocol", "quickstart", *bad])
    # the FEMNIST protocol needs the LEAF directory; the others do not
    with pytest.raises(SystemExit):
        bench.parse_args(["--protocol", "femnist-flute", "--femnist", str(tmp_path)])
    (tmp_path / "train").mkdir()
    args = bench.parse_args(["--femnist", str(tmp_path)])
    assert args.protocol == list(bench.PROTOCOLS)
    assert bench.command_line(["--rounds", "3", "a b"]) == \
        "python benchmarks/protocols.py --rounds 3 'a b'"
    assert bench.loaded(0.2, [2.5], cpus=2) is False  # its own two processes
    assert bench.loaded(0.2, [3.5], cpus=2) and bench.loaded(0.8, [], cpus=2)


def test_job_overrides(bench):
    out = bench.job_overrides("femnist-flute", "/s", 4, "leaf_cnn")
    assert "model.name=leaf_cnn" in out and "model.name=emnist_cnn" not in out
    assert "sampling.clients_per_round=10" in out and "data.partition=/s" in out
    assert out[-4:] == ["rounds=4", *bench.NO_EVAL]
    assert bench.job_overrides("quickstart", None, 3, None) == ["rounds=3", *bench.NO_EVAL]


def test_flute_overrides_give_a_valid_job(bench):
    from fedray.config import load_config

    p = bench.PROTOCOLS["femnist-flute"]
    cfg = load_config(os.path.join(bench.ROOT, p.job), list(p.overrides))
    assert (cfg.model.name, cfg.sampling.clients_per_round, cfg.client.lr,
            cfg.client.batch_size, cfg.client.local_epochs, cfg.server.lr,
            cfg.algorithm.name) == ("emnist_cnn", 10, 0.1, 20, 1, 1.0, "fedavg")


def test_setup_gives_flower_fedrays_sampled_clients(bench, flower_side, tmp_path):
    from fedray.config import load_config, typed
    from fedray.core.sampling import sample_clients
    from fedray.data.client_source import build_source

    overrides = bench.job_overrides("quickstart", None, 3, None)
    setup = bench.protocol_setup("quickstart", overrides, str(tmp_path))
    spec = setup["spec"]
    assert spec["ids"] == [sample_clients(0, r, 1000, 20).tolist() for r in (1, 2, 3)]
    assert (spec["model"], spec["input_shape"], spec["num_classes"], spec["batch_size"],
            spec["lr"]) == ("emnist_cnn", [1, 28, 28], 62, 20, 0.1)
    source = build_source(typed(load_config(os.path.join(bench.ROOT, "jobs/quickstart.yaml"),
                                            overrides)).data)
    assert setup["examples"] == [int(source.train_sizes()[ids].sum()) for ids in spec["ids"]]
    for cid in (spec["ids"][0][0], spec["ids"][2][-1]):
        x, y = flower_side._client_arrays(spec["data"], cid)
        want_x, want_y = source.client(cid)
        assert np.array_equal(x.numpy(), want_x) and np.array_equal(y.numpy(), want_y)
    with pytest.raises(KeyError, match="does not hold client"):
        flower_side._client_arrays(spec["data"], next(c for c in range(1000)
                                                      if c not in sum(spec["ids"], [])))


def test_train_local_is_sgd_on_cross_entropy(flower_side):
    # one batch holding every example, one epoch: exactly one SGD step on the mean loss
    torch.manual_seed(0)
    model, x, y = nn.Linear(4, 3), torch.randn(6, 4), torch.tensor([0, 1, 2, 0, 1, 2])
    ref = nn.Linear(4, 3)
    ref.load_state_dict(model.state_dict())
    flower_side.train_local(model, x, y, 0.5, 6, 1, seed=3)
    perm = torch.randperm(6, generator=torch.Generator().manual_seed(3))
    nn.functional.cross_entropy(ref(x[perm]), y[perm]).backward()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(p.grad, alpha=-0.5)  # what torch.optim.SGD does on CPU tensors
    for a, b in zip(model.parameters(), ref.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_failing_side_is_reported_not_raised_past_its_protocol(bench):
    import sys

    with pytest.raises(bench.ProtocolFailed, match=r"toy failed \(exit 3\): boom"):
        bench._call([sys.executable, "-c", "import sys; print('boom', file=sys.stderr); "
                                           "sys.exit(3)"], "toy", 60)
    with pytest.raises(bench.ProtocolFailed, match="took over 1s"):
        bench._call([sys.executable, "-c", "import time; time.sleep(30)"], "toy", 1)
    meta = {"command": "c", "machine": "m", "torch": "t", "gemm_peak_gflops": 1.0,
            "gemm_before_gflops": 1.0, "gemm_after_gflops": 0.5, "load_start": 0.1,
            "load_max": 2.0, "load_end": 2.0, "loaded": False, "repeat": 1,
            "failed": {"quickstart": "fedray run jobs/quickstart.yaml failed (exit 1): x"}}
    notes = bench.markdown_notes([], meta)
    assert "- quickstart: FAILED: fedray run jobs/quickstart.yaml failed (exit 1): x" in notes
    assert "preliminary" not in notes


def test_retrying_tries_again_then_gives_up(bench):
    tries = []

    def flaky(attempt: int) -> dict:
        tries.append(attempt)
        if attempt == 0:
            raise bench.ProtocolFailed("Ray's start-up timed out")
        return {"ok": attempt}

    assert bench.retrying(flaky, 1) == {"ok": 1} and tries == [0, 1]
    tries.clear()
    with pytest.raises(bench.ProtocolFailed, match="start-up"):
        bench.retrying(flaky, 0)
    assert tries == [0]
