"""Availability: online windows respected, diurnal share as configured, traces exact."""

import numpy as np
import pytest

from fedray.errors import FedrayError
from fedray.timing.availability import AlwaysOnline, Diurnal, TraceAvailability
from fedray.timing.traces import availability_trace, generate_availability_trace

DAY = 86400.0


def _explicit_online(model, ids, t):
    """Online per the definition, by enumerating every window near t (no p +- 1 shortcut)."""
    phase = model.phase(ids)
    on = np.zeros(ids.shape, dtype=bool)
    for q in range(-2, int(t.max() // model.period_s) + 3):
        s = model.window_start(ids, np.full(ids.shape, q), phase)
        on |= (s <= t) & (t < s + model.online_s)
    return on


@pytest.mark.parametrize("jitter", [0.0, 5400.0])
def test_diurnal_online_only_inside_its_windows(jitter):
    model = Diurnal(seed=4, online_s=6 * 3600, jitter_s=jitter)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 10**9, 5000)
    t = rng.uniform(0, 10 * DAY, 5000)
    on = model.online(ids, t)
    assert np.array_equal(on, _explicit_online(model, ids, t))
    until, nxt = model.online_until(ids, t), model.next_online(ids, t)
    # online: until is later, the client is online just before it and offline at it
    assert np.all(until[on] > t[on]) and np.all(until[on] - t[on] <= model.online_s)
    assert model.online(ids[on], until[on] - 1e-3).all()
    assert not model.online(ids[on], until[on]).any()  # half-open window
    # offline: until is t itself; next_online is later, online there, offline in between
    assert np.array_equal(until[~on], t[~on]) and np.array_equal(nxt[on], t[on])
    off = ~on
    assert np.all(nxt[off] > t[off]) and model.online(ids[off], nxt[off]).all()
    assert not model.online(ids[off], (t[off] + nxt[off]) / 2).any()


def test_diurnal_share_is_the_configured_fraction():
    # 200k independent clients, each online with probability online_s / period_s = 1/3 at
    # any t (phase uniform over the day); the share's sd is sqrt(p(1-p)/n) = 1.05e-3:
    # 5-sigma tolerance, fixed seed
    n, share = 200_000, 1 / 3
    model = Diurnal(seed=9, online_s=8 * 3600, jitter_s=2 * 3600)
    ids = np.arange(n)
    for t in (0.0, 3.5 * 3600, 1.2 * DAY, 30 * DAY + 17.0):
        assert abs(model.online(ids, t).mean() - share) < 5 * np.sqrt(share * (1 - share) / n)


def test_a_narrow_phase_spread_makes_the_share_vary_over_the_day():
    model = Diurnal(seed=1, online_s=4 * 3600, phase_spread_s=0.0)
    ids = np.arange(1000)
    assert model.online(ids, 3600.0).all() and model.online(ids, DAY + 10).all()
    assert not model.online(ids, 5 * 3600.0).any()
    assert np.all(model.online_until(ids, 3600.0) == 4 * 3600.0)
    assert np.all(model.next_online(ids, 5 * 3600.0) == DAY)


def test_always_online_and_full_windows():
    ids = np.array([0, 3])
    for model in (AlwaysOnline(), Diurnal(seed=0, online_s=DAY)):
        assert model.online(ids, 123.0).all()
        assert np.all(model.online_until(ids, 123.0) == np.inf)
        assert np.all(model.next_online(ids, 123.0) == 123.0)


@pytest.mark.parametrize("kwargs, message", [
    ({"online_s": 0.0}, "online_s must be in"),
    ({"online_s": 20 * 3600, "jitter_s": 5 * 3600}, "online_s \\+ jitter_s <= period_s"),
    ({"phase_spread_s": 2 * DAY}, "phase_spread_s must be in"),
    ({"period_s": -1.0}, "period_s must be > 0"),
])
def test_bad_diurnal_parameters(kwargs, message):
    with pytest.raises(FedrayError, match=message):
        Diurnal(seed=0, **kwargs)


def _hand_trace():
    # row 0: absolute [10, 20) and [30, 40); row 1: never online; row 2: period 100,
    # [0, 10) and [90, 100), online across the wrap; row 3: period 50, [0, 50): always
    return TraceAvailability(offsets=np.array([0, 2, 2, 4, 5]),
                             starts=np.array([10.0, 30.0, 0.0, 90.0, 0.0]),
                             ends=np.array([20.0, 40.0, 10.0, 100.0, 50.0]),
                             periods=np.array([np.nan, np.nan, 100.0, 50.0]))


@pytest.mark.parametrize("cid, t, online, until, nxt", [
    (0, 5.0, False, 5.0, 10.0),
    (0, 10.0, True, 20.0, 10.0),
    (0, 19.5, True, 20.0, 19.5),
    (0, 20.0, False, 20.0, 30.0),  # half-open: offline at the end
    (0, 35.0, True, 40.0, 35.0),
    (0, 40.0, False, 40.0, np.inf),  # not periodic: never again
    (4, 12.0, True, 20.0, 12.0),  # client 4 takes row 4 % 4 = 0
    (1, 15.0, False, 15.0, np.inf),  # never online
    (2, 5.0, True, 10.0, 5.0),
    (2, 50.0, False, 50.0, 90.0),
    (2, 95.0, True, 110.0, 95.0),  # [90, 100) joins [100, 110) across the wrap
    (2, 305.0, True, 310.0, 305.0),  # 305 = 3 * 100 + 5
    (2, 250.0, False, 250.0, 290.0),
    (6, 395.0, True, 410.0, 395.0),  # row 2 again
    (3, 1234.5, True, np.inf, 1234.5),  # [0, period) repeating: online for ever
])
def test_trace_answers_by_hand(cid, t, online, until, nxt):
    trace = _hand_trace()
    assert trace.online([cid], t).tolist() == [online]
    assert trace.online_until([cid], t).tolist() == [until]
    assert trace.next_online([cid], t).tolist() == [nxt]


def test_trace_answers_vectorised_equal_one_by_one():
    trace = _hand_trace()
    rng = np.random.default_rng(3)
    ids, t = rng.integers(0, 40, 500), rng.uniform(0, 1000, 500)
    for ask in ("online", "online_until", "next_online"):
        whole = getattr(trace, ask)(ids, t)
        one = [getattr(trace, ask)([i], s)[0] for i, s in zip(ids, t, strict=True)]
        assert np.array_equal(whole, np.array(one))


def test_generated_traces_answer_as_the_model():
    n = 2000
    ids = np.arange(n)
    rng = np.random.default_rng(5)
    # one repeating day (no jitter) against the model at any time: online agrees exactly;
    # online_until and next_online are the same sums in another order (base + offset vs
    # phase + q * period), so they agree to float64 rounding at ~1e7 s, i.e. 1e-6 s
    model = Diurnal(seed=2, online_s=7 * 3600)
    trace = availability_trace(generate_availability_trace(n, 2, online_s=7 * 3600))
    t = rng.uniform(0, 100 * DAY, n)
    assert np.array_equal(trace.online(ids, t), model.online(ids, t))
    np.testing.assert_allclose(trace.online_until(ids, t), model.online_until(ids, t),
                               rtol=0, atol=1e-6)
    np.testing.assert_allclose(trace.next_online(ids, t), model.next_online(ids, t),
                               rtol=0, atol=1e-6)
    # jittered windows over a horizon: the same windows, so equal on [0, horizon) where the
    # answer does not run past the horizon (the trace ends there)
    model = Diurnal(seed=2, online_s=7 * 3600, jitter_s=3 * 3600)
    horizon = 5 * DAY
    trace = availability_trace(generate_availability_trace(
        n, 2, online_s=7 * 3600, jitter_s=3 * 3600, horizon_s=horizon))
    t = rng.uniform(0, horizon, n)
    assert np.array_equal(trace.online(ids, t), model.online(ids, t))
    until, m_until = trace.online_until(ids, t), model.online_until(ids, t)
    inside = m_until < horizon
    assert np.array_equal(until[inside], m_until[inside])
    assert np.all(until[~inside] == horizon)
    nxt, m_nxt = trace.next_online(ids, t), model.next_online(ids, t)
    inside = m_nxt < horizon
    assert np.array_equal(nxt[inside], m_nxt[inside]) and np.all(nxt[~inside] == np.inf)


def test_bad_trace_structures_are_refused():
    with pytest.raises(FedrayError, match="sorted, disjoint and not touching"):
        TraceAvailability(np.array([0, 2]), np.array([0.0, 5.0]), np.array([5.0, 9.0]),
                          np.array([np.nan]))
    with pytest.raises(FedrayError, match="lie in \\[0, period\\]"):
        TraceAvailability(np.array([0, 1]), np.array([0.0]), np.array([120.0]),
                          np.array([100.0]))
