"""Synchronous rounds on the simulated clock (fedray.timing.rounds) and their wiring into a
run (clock.enabled): the round's arithmetic by hand, no offline client ever trained, the
schedule independent of worker count, and a resumed run's clock continuing bit for bit.

Runs use runtime.backend=inline: the driver and workers are the Ray backend's objects
(tests/runtime/test_inline.py checks the two agree bit for bit)."""

from __future__ import annotations

import numpy as np
import pytest
from clocked_runs import check_resume
from conftest import blobs, fixed_linear
from omegaconf import OmegaConf

import fedray
from fedray.config import ClockConfig
from fedray.errors import FedrayError
from fedray.timing.rounds import LocalWork, RoundClock

CLIENTS = blobs(30, seed=4)
SIZES = np.array([len(y) for _, y in CLIENTS.values()])


def clock(**over) -> RoundClock:
    cfg = OmegaConf.merge(OmegaConf.structured(ClockConfig), {"enabled": True, **over})
    return RoundClock(cfg, 7, SIZES, num_params=18, work=LocalWork(4, 1, 3))


def test_an_update_and_a_round_by_hand():
    """sigma 0: every device is the median. 3 steps of batch 4 on n examples touch
    (3 // m) * n + (3 % m) * 4 examples, m = ceil(n / 4); 18 parameters are 72 bytes each
    way."""
    c = clock(devices={"compute_sigma": 0, "down_sigma": 0, "up_sigma": 0,
                       "compute_s_per_example": 0.5, "down_bytes_per_s": 8.0,
                       "up_bytes_per_s": 4.0})
    for cid in (0, 5, 17):
        n = int(SIZES[cid])
        m = -(-n // 4)
        touched = (3 // m) * n + (3 % m) * 4
        assert c.durations(np.array([cid]))[0] == touched * 0.5 + 72 / 8.0 + 72 / 4.0
    sel = c.select(1, 100.0, 5)
    assert len(sel.participants) == 5 and sel.dropped_out == sel.late == 0
    assert sel.outcome.start_s == 100.0
    assert sel.outcome.end_s == 100.0 + c.durations(sel.participants).max()


def test_deadline_and_over_selection_keep_the_first_finishers():
    c = clock(deadline_s=40.0)
    sel = c.select(3, 0.0, 4, over_selection=1.0)  # 8 sampled, the first 4 in time kept
    d = c.durations(np.sort(np.concatenate([sel.participants, sel.outcome.late])))
    assert sel.sampled == 8 and len(sel.participants) + sel.late == 8
    assert (c.durations(sel.participants) <= 40.0).all()
    assert len(sel.participants) == min(4, int((d <= 40.0).sum()))
    assert sel.outcome.end_s <= 40.0


def test_no_offline_client_is_ever_trained():
    c = clock(availability={"model": "diurnal", "period_s": 100.0, "online_s": 30.0})
    t = 0.0
    for r in range(1, 30):
        sel = c.select(r, t, 3)
        ids = sel.participants
        assert c.availability.online(ids, t).all()  # sampled while online
        finish = t + c.durations(ids)
        assert (finish <= c.availability.online_until(ids, t)).all()  # done before leaving
        t = sel.outcome.end_s
    assert t > 0


def job(tmp_path, name: str, workers: int = 1, rounds: int = 4, **extra) -> dict:
    return {"name": name, "seed": 2, "rounds": rounds,
            "client": {"lr": 0.1, "batch_size": 4, "local_steps": 3},
            "sampling": {"clients_per_round": 5, "over_selection": 0.4},
            # ~4 minutes an update, clients online 30 of every 60 minutes: some leave
            # mid-update, some miss the deadline
            "clock": {"enabled": True, "deadline_s": 400.0,
                      "devices": {"compute_s_per_example": 20.0},
                      "availability": {"model": "diurnal", "period_s": 3600.0,
                                       "online_s": 1800.0}},
            "checkpoint": {"every": 2},
            "runtime": {"backend": "inline", "num_workers": workers,
                        "worker": {"num_cpus": 1, "vectorize": "off"}},
            "output": {"dir": str(tmp_path / name), "tensorboard": False}, **extra}


def run(tmp_path, name: str, callbacks=(), **kw) -> fedray.RunResult:
    return fedray.run(job(tmp_path, name, **kw), model_fn=fixed_linear()[0],
                      client_data=CLIENTS, callbacks=list(callbacks))


SCHEDULE = ("clients", "dropped_out", "late", "sim_round_s", "sim_time_s", "train_loss")


def test_the_clock_in_a_run_is_the_same_on_one_or_three_workers(tmp_path):
    a, b = run(tmp_path, "w1"), run(tmp_path, "w3", workers=3)
    for x, y in zip(a.metrics, b.metrics, strict=True):
        assert {k: x[k] for k in SCHEDULE} == {k: y[k] for k in SCHEDULE}
    times = [m["sim_time_s"] for m in a.metrics]
    assert times == list(np.cumsum([m["sim_round_s"] for m in a.metrics]))
    assert all(t > 0 for t in times)
    assert sum(m["dropped_out"] for m in a.metrics) > 0  # went offline mid-update
    assert sum(m["late"] for m in a.metrics) > 0  # over-selected or past the deadline
    assert 400.0 in [m["sim_round_s"] for m in a.metrics]  # a round closed by its deadline
    off = fedray.run({**job(tmp_path, "off"), "clock": {"enabled": False}},
                     model_fn=fixed_linear()[0], client_data=CLIENTS)
    assert "sim_time_s" not in off.metrics[-1]  # clock off: no clock work, no keys


def test_a_resumed_run_continues_its_clock(tmp_path):
    check_resume(tmp_path, run, SCHEDULE, CLIENTS)


def test_bad_clock_settings_are_one_line(tmp_path):
    with pytest.raises(FedrayError, match="'clock.availability.trace': must name"):
        run(tmp_path, "bad", clock={"enabled": True, "availability": {"model": "trace"}})
    with pytest.raises(FedrayError, match="'clock.devices.trace': .*nope.csv does not exist"):
        run(tmp_path, "bad2", clock={"enabled": True, "devices": {
            "source": "trace", "trace": str(tmp_path / "nope.csv")}})
    with pytest.raises(FedrayError, match="'sampling.always': cannot be combined"):
        run(tmp_path, "bad3", sampling={"clients_per_round": 5, "always": [0]})


def test_over_selection_on_the_clock_counts_as_without_it():
    """The clock asks fedray.core.sampling.over_selected: k = 50, o = 0.1 samples 55, not
    the 56 that float arithmetic gave (ceil(50 * 1.1) = ceil(55.00000000000001))."""
    from fedray.core.sampling import over_selected

    cfg = OmegaConf.merge(OmegaConf.structured(ClockConfig), {"enabled": True})
    c = RoundClock(cfg, 7, np.full(200, 10), num_params=18, work=LocalWork(4, 1, 3))
    assert c.select(2, 0.0, 50, over_selection=0.1).sampled == 55 == over_selected(50, 0.1, 200)
    assert c.select(2, 0.0, 100, over_selection=0.1).sampled == 110
    assert c.select(2, 0.0, 100, over_selection=1.5).sampled == 200  # at most the population
