"""runtime.precision=bf16 on whole runs: still independent of the worker count.

A client's bf16 arithmetic is the same in any worker (``vectorize: off``: the same forward
under the same autocast, on the same weights and batches), so what changes with the worker
count is what changes in fp32: the float64 merge of the partial sums. With an aggregator that
sees every client's float32 update (the median) the runs are then equal bit for bit; with
FedAvg's partial sums to tolerance.merge_ulps. runtime.backend=inline is Ray's bit for bit at
the same worker count (tests/runtime/test_inline.py), so these run without Ray."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import blobs
from tolerance import f32_atol, merge_ulps

import fedray

CLIENTS = blobs(12, dim=6, classes=3, seed=4)
TEST = blobs(1, dim=6, classes=3, seed=9)[0]
ROUNDS = 3


def _model_fn():
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))


def _run(tmp_path, name: str, workers: int, precision: str, algorithm: dict):
    job = {"name": name, "seed": 2, "rounds": ROUNDS, "algorithm": algorithm,
           "client": {"lr": 0.1, "batch_size": 4, "local_steps": 3},
           "sampling": {"clients_per_round": 6},
           "runtime": {"backend": "inline", "num_workers": workers, "precision": precision,
                       "worker": {"num_cpus": 0.5, "vectorize": "off"}},
           "output": {"dir": str(tmp_path / name), "tensorboard": False}}
    return fedray.run(job, model_fn=_model_fn, client_data=CLIENTS, test_data=TEST)


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_bf16_median_is_the_same_bit_for_bit_on_one_and_three_workers(tmp_path):
    median = {"name": "median"}
    one = _run(tmp_path, "one", 1, "bf16", median)
    three = _run(tmp_path, "three", 3, "bf16", median)
    assert len(three.summary["workers"]) == 3
    assert _equal(one.weights, three.weights)
    assert not _equal(one.weights, _run(tmp_path, "fp32", 1, "fp32", median).weights)


def test_bf16_fedavg_worker_counts_agree_to_the_merge(tmp_path):
    """FedAvg's float64 partial sums merge in another grouping at another worker count: a
    last float32 bit may flip per round (merge_ulps), as in fp32."""
    runs = [_run(tmp_path, f"w{n}", n, "bf16", {"name": "fedavg"}) for n in (1, 3)]
    for k, v in runs[0].weights.items():
        np.testing.assert_allclose(runs[1].weights[k].double().numpy(), v.double().numpy(),
                                   rtol=0, atol=f32_atol(v, ulps=merge_ulps(ROUNDS)))


@pytest.mark.parametrize("value", ["fp16", "BF16"])
def test_a_precision_that_does_not_exist_is_one_line(value):
    from fedray.config import load_config, validate
    from fedray.errors import ConfigError

    cfg = load_config(None, [f"runtime.precision={value}"])
    with pytest.raises(ConfigError) as info:
        validate(cfg, population=10)
    assert str(info.value) == (f"config key 'runtime.precision': must be fp32 or bf16, "
                               f"got '{value}'")
    assert load_config().runtime.precision == "fp32"
