"""Update stages (algorithm.stages) in the runtime: secure aggregation's threshold and worker
assignment, error feedback through the client state store, the uplink bytes, and the
simulated clock's upload time. Inline backend (no Ray): the same driver and worker code."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from conftest import tiny_job

import fedray
from fedray.algorithms.base import Payload
from fedray.algorithms.compression import sent_count
from fedray.errors import ConfigError
from fedray.state.run_dir import CLIENT_STATE_DIR, read_metrics


def _job(tmp_path, name: str, algorithm: dict, workers: int = 3, **over) -> dict:
    return tiny_job(tmp_path, name=name, rounds=3, runtime__backend="inline",
                    runtime__num_workers=workers, output__dir=str(tmp_path / name),
                    sampling__clients_per_round=6, algorithm=algorithm, **over)


def _weights(res) -> torch.Tensor:
    return torch.cat([v.flatten() for v in res.weights.values()])


def test_secure_sums_hold_at_least_min_clients_and_change_nothing_else(tmp_path):
    """6 clients a round on 3 workers with min_clients 3: the driver gives 2 workers 3
    clients each (never 2 + 2 + 2 ... below the threshold), reveals 2 sums of 3, and the
    model equals the plain run's: the same float64 sums grouped otherwise (~1e-16 relative)
    then cast to float32, so equal to within one float32 ulp of weights of size ~1."""
    plain = fedray.run(_job(tmp_path, "plain", {"name": "fedavg", "aggregator": "uniform"}))
    sec = fedray.run(_job(tmp_path, "sec", {"name": "fedavg", "aggregator": "uniform",
                                            "stages": ["secagg"],
                                            "secagg": {"min_clients": 3}}))
    for m in read_metrics(sec.run_dir):
        assert m["secagg_sums"] == 2 and m["secagg_min_sum"] == 3 and m["secagg_aborted"] == 0
    assert torch.allclose(_weights(plain), _weights(sec), rtol=0, atol=1e-6)
    # min 5 of 6: one worker takes the whole round, one sum is revealed
    one = fedray.run(_job(tmp_path, "one", {"name": "fedavg", "stages": ["secagg"],
                                            "secagg": {"min_clients": 5}}))
    assert all(m["secagg_sums"] == 1 and m["secagg_min_sum"] == 6
               for m in read_metrics(one.run_dir))
    with pytest.raises(ConfigError, match="algorithm.secagg.min_clients"):
        fedray.run(_job(tmp_path, "never", {"name": "fedavg", "stages": ["secagg"],
                                            "secagg": {"min_clients": 7}}))


def test_fixed_point_secure_sum_with_dp_measures_its_error(tmp_path):
    """[dp, secagg]: clipped updates encoded onto 2^16 levels in a 2^24 field: no coordinate
    wraps (6 clients need 16 + 3 bits), and the decoded sum differs from the exact one by
    stochastic rounding alone, at most 6 steps of 2C/2^16 a coordinate (test_secagg.py
    checks that bound): here a fraction of a percent of the sum's norm, never 0."""
    res = fedray.run(_job(tmp_path, "dpsec", {
        "name": "dp_fedavg", "stages": ["dp", "secagg"],
        "dp": {"clip": 0.05, "noise_multiplier": 0.0},
        "secagg": {"min_clients": 2, "bits": 24, "precision_bits": 16, "range": 0.05}}))
    for m in read_metrics(res.run_dir):
        assert m["secagg_wrapped"] == 0
        assert 0 < m["secagg_error"] < 1e-2
    bytes_each = -(-(_weights(res).numel() * 24) // 8)
    assert read_metrics(res.run_dir)[0]["upload_bytes"] == 6 * bytes_each


def test_topk_error_feedback_keeps_residuals_in_the_client_state_store(tmp_path):
    """Each client's residual is versioned in client_state/ like SCAFFOLD's c_i; a rerun is
    bit-identical; the uplink bytes are k values and k 32-bit indices per update."""
    algo = {"name": "fedavg", "stages": ["topk"], "topk": {"fraction": 0.1}}
    a = fedray.run(_job(tmp_path, "topk-a", algo))
    b = fedray.run(_job(tmp_path, "topk-b", algo))
    assert torch.equal(_weights(a), _weights(b))
    files = [f for _, _, names in os.walk(os.path.join(a.run_dir, CLIENT_STATE_DIR))
             for f in names]
    assert files, "no residual was stored"
    n = _weights(a).numel()
    m = read_metrics(a.run_dir)
    assert m[0]["upload_bytes"] == m[0]["updates"] * sent_count(0.1, n) * 8
    plain = fedray.run(_job(tmp_path, "topk-plain", {"name": "fedavg"}))
    assert read_metrics(plain.run_dir)[0]["upload_bytes"] == 6 * 4 * n
    assert not torch.allclose(_weights(a), _weights(plain))


def test_quantize_and_its_bytes(tmp_path):
    res = fedray.run(_job(tmp_path, "q", {"name": "fedavg", "stages": ["quantize"],
                                          "quantize": {"bits": 4}}))
    n = _weights(res).numel()
    assert read_metrics(res.run_dir)[0]["upload_bytes"] == 6 * (Payload(n, 4).bytes + 8)


def test_compressed_updates_upload_faster_on_the_simulated_clock(tmp_path):
    """The same clients, devices and work: only the upload shrinks, so every round ends
    sooner."""
    clock = {"enabled": True, "devices": {"up_bytes_per_s": 100.0}}
    plain = fedray.run(_job(tmp_path, "c-plain", {"name": "fedavg"}, clock=clock))
    small = fedray.run(_job(tmp_path, "c-topk", {"name": "fedavg", "stages": ["topk"],
                                                 "topk": {"fraction": 0.01}}, clock=clock))
    a = np.array([m["sim_round_s"] for m in read_metrics(plain.run_dir)])
    b = np.array([m["sim_round_s"] for m in read_metrics(small.run_dir)])
    assert (b < a).all()
