"""Buffered asynchronous training (FedBuff): the schedule on the simulated clock
(fedray.timing.buffered), the staleness-weighted step (fedray.algorithms.fedbuff) against
NumPy, and runs: equal to synchronous FedAvg where no update is stale, the same on 1 or 3
workers, and bit-identical after a resume. Runs use runtime.backend=inline (the Ray
backend's driver and workers, in this process: tests/runtime/test_inline.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from clocked_runs import check_resume
from conftest import blobs, fixed_linear
from omegaconf import OmegaConf

import fedray
from fedray.algorithms.base import ClientContext, LocalUpdate, PartialSum
from fedray.algorithms.fedbuff import FedBuffAggregator, FedBuffParams
from fedray.config import ClockConfig
from fedray.errors import FedrayError
from fedray.timing.buffered import buffered_schedule, versions_needed
from fedray.timing.rounds import LocalWork, RoundClock

CLIENTS = blobs(30, seed=4)
SIZES = np.array([len(y) for _, y in CLIENTS.values()])


def clock(sizes=SIZES, **over) -> RoundClock:
    cfg = OmegaConf.merge(OmegaConf.structured(ClockConfig), {"enabled": True, **over})
    return RoundClock(cfg, 7, sizes, num_params=18, work=LocalWork(4, 1, 3))


def test_schedule_keeps_concurrency_and_buffers_k_updates():
    c = clock(availability={"model": "diurnal", "period_s": 400.0, "online_s": 200.0},
              devices={"compute_s_per_example": 5.0})
    steps = buffered_schedule(c, concurrency=6, k=3, steps=40)
    assert [s.step for s in steps] == list(range(1, 41))
    ends = [s.end_s for s in steps]
    assert ends == sorted(ends) and ends[0] > 0
    for s in steps:
        assert len(s.client_ids) == len(set(s.client_ids.tolist())) == 3  # once per step
        assert (s.start_versions <= s.step - 1).all() and (s.staleness >= 0).all()
        # each was sampled while online and stayed online until its update arrived
        arrived = s.start_s + c.durations(s.client_ids)
        assert (arrived <= s.end_s).all() and arrived[-1] == s.end_s
        for cid, t0, t1 in zip(s.client_ids, s.start_s, arrived, strict=True):
            assert c.availability.online([cid], t0)[0]
            assert c.availability.online_until([cid], t0)[0] >= t1
    assert max(int(s.staleness.max()) for s in steps) > 0  # some updates were stale
    assert sum(s.dropped for s in steps) > 0  # and some clients left mid-update
    again = buffered_schedule(c, concurrency=6, k=3, steps=40)  # a pure function
    for a, b in zip(steps, again, strict=True):
        assert a.end_s == b.end_s and np.array_equal(a.client_ids, b.client_ids)
        assert np.array_equal(a.start_versions, b.start_versions)
    need = versions_needed(steps)
    assert all(need[int(v)] >= s.step for s in steps for v in s.start_versions)


def test_fedbuff_step_matches_numpy():
    """Three updates with staleness 0, 1 and 3 into one buffer of K = 3: the mean over K
    of 1/sqrt(1 + tau) * delta, in float64 (the partial sum's type) within float32's
    resolution of the float32 products (values of order 1: 1e-6)."""
    g = np.random.default_rng(0)
    deltas = g.normal(size=(3, 7)).astype(np.float32)
    taus = [0, 1, 3]
    agg = FedBuffAggregator()
    agg.params = FedBuffParams()
    acc = PartialSum(7)
    for d, tau in zip(deltas, taus, strict=True):
        ctx = ClientContext(0, 1, 0, torch.zeros(1), torch.zeros(1), 1, staleness=tau)
        agg.accumulate(None, ctx, LocalUpdate(torch.from_numpy(d), 5, 0.0, 5, 1), acc)
    want = sum(d.astype(np.float64) / np.sqrt(1 + t) for d, t in zip(deltas, taus,
                                                                      strict=True)) / 3
    np.testing.assert_allclose(acc.mean().numpy(), want, rtol=0, atol=1e-6)


def job(tmp_path, name: str, workers: int = 1, rounds: int = 5, **extra) -> dict:
    return {"name": name, "seed": 2, "rounds": rounds,
            "algorithm": {"name": "fedbuff"},
            "client": {"lr": 0.1, "batch_size": 4, "local_steps": 3},
            "sampling": {"clients_per_round": 3, "concurrency": 6},
            "clock": {"enabled": True, "devices": {"compute_s_per_example": 5.0},
                      "availability": {"model": "diurnal", "period_s": 400.0,
                                       "online_s": 200.0}},
            "checkpoint": {"every": 2},
            "runtime": {"backend": "inline", "num_workers": workers,
                        "worker": {"num_cpus": 1, "vectorize": "off"}},
            "output": {"dir": str(tmp_path / name), "tensorboard": False}, **extra}


def run(tmp_path, name: str, clients=CLIENTS, callbacks=(), **kw) -> fedray.RunResult:
    return fedray.run(job(tmp_path, name, **kw), model_fn=fixed_linear()[0],
                      client_data=clients, callbacks=list(callbacks))


KEYS = ("clients", "dropped_out", "sim_round_s", "sim_time_s", "staleness_mean",
        "staleness_max", "train_loss")


def test_one_and_three_workers_give_the_same_run(tmp_path):
    a, b = run(tmp_path, "w1"), run(tmp_path, "w3", workers=3)
    for x, y in zip(a.metrics, b.metrics, strict=True):
        assert {k: x[k] for k in KEYS} == {k: y[k] for k in KEYS}
    for k in a.weights:
        assert torch.equal(a.weights[k], b.weights[k])
    assert max(m["staleness_max"] for m in a.metrics) > 0


def test_without_staleness_it_is_synchronous_fedavg(tmp_path):
    """Every client the same size on the same device, always online, concurrency = K =
    the population: every step applies all clients, each from the latest model (staleness
    0), with the round's seed -- synchronous FedAvg with the plain mean, bit for bit."""
    g = np.random.default_rng(1)
    same = {c: (g.normal(size=(8, 5)).astype(np.float32), g.integers(0, 3, 8))
            for c in range(6)}
    clock_cfg = {"enabled": True, "devices": {"compute_sigma": 0, "down_sigma": 0,
                                              "up_sigma": 0}}
    buffered = run(tmp_path, "buf", clients=same, clock=clock_cfg,
                   sampling={"clients_per_round": 6, "concurrency": 6})
    sync = run(tmp_path, "sync", clients=same, clock=clock_cfg,
               algorithm={"name": "fedavg", "aggregator": "uniform"},
               sampling={"clients_per_round": 6})
    assert all(m["staleness_max"] == 0 for m in buffered.metrics)
    for k in sync.weights:
        assert torch.equal(buffered.weights[k], sync.weights[k])
    assert [m["sim_time_s"] for m in buffered.metrics] == \
        [m["sim_time_s"] for m in sync.metrics]


def test_a_resumed_buffered_run_is_bit_identical(tmp_path):
    check_resume(tmp_path, run, KEYS, CLIENTS)


def test_buffered_settings_are_checked(tmp_path):
    with pytest.raises(FedrayError, match="'sampling.concurrency': needs clock.enabled"):
        run(tmp_path, "a", clock={"enabled": False})
    with pytest.raises(FedrayError, match="'sampling.concurrency': algorithm.client scaffold"):
        run(tmp_path, "b", algorithm={"name": "scaffold"})
    with pytest.raises(FedrayError, match="'algorithm.fedbuff.staleness': must be one of"):
        run(tmp_path, "c", algorithm={"name": "fedbuff", "fedbuff": {"staleness": "exp"}})


def test_a_finished_buffered_run_cannot_be_extended(tmp_path):
    """The run keeps only the model versions its own steps need; a later step may start
    from one it dropped: one line, not a KeyError."""
    run(tmp_path, "short", rounds=4)
    with pytest.raises(FedrayError, match="'rounds': step .* a buffered run cannot be extended"):
        fedray.run(resume=str(tmp_path / "short"), overrides=["rounds=30"],
                   allow_changes=["rounds"], model_fn=fixed_linear()[0], client_data=CLIENTS)
