"""Device profiles: seeded log-normal (a pure function of (seed, client id)) and traces."""

import numpy as np
import pytest

from fedray.errors import FedrayError
from fedray.timing.devices import DeviceTrace, LogNormalDevices


def _arrays(p):
    return (p.compute_s_per_example, p.down_bytes_per_s, p.up_bytes_per_s)


def test_a_profile_is_a_function_of_seed_and_id_only():
    model = LogNormalDevices(seed=11)
    ids = np.array([0, 5, 999_999_937, 42, 5])
    full = _arrays(model.profiles(ids))
    assert np.array_equal(full[0][1], full[0][4])  # the same id twice: the same profile
    for perm in (ids[::-1], ids[[2]], ids[[3, 0]]):
        part = _arrays(LogNormalDevices(seed=11).profiles(perm))
        for a, b in zip(part, full, strict=True):
            assert np.array_equal(a, b[[list(ids).index(i) for i in perm]])
    other = _arrays(LogNormalDevices(seed=12).profiles(ids))
    assert not np.any(other[0] == full[0])


def test_medians_and_spread_follow_the_parameters():
    # medians of 100k log-normal draws: the sample median's log has sd
    # sigma * 1.2533 / sqrt(n) (<= 0.0032 for sigma 0.8); allow 5 sd. The log-sd's own sd
    # is sigma / sqrt(2n) <= 0.0018: allow 5 sd too.
    model = LogNormalDevices(seed=3, compute_s_per_example=0.02, compute_sigma=0.5,
                             down_bytes_per_s=1e6, down_sigma=0.8, up_bytes_per_s=2e5,
                             up_sigma=0.3)
    p = model.profiles(np.arange(100_000))
    for values, median, sigma in ((p.compute_s_per_example, 0.02, 0.5),
                                  (p.down_bytes_per_s, 1e6, 0.8), (p.up_bytes_per_s, 2e5, 0.3)):
        logs = np.log(values)
        assert abs(np.median(logs) - np.log(median)) < 5 * sigma * 1.2533 / np.sqrt(1e5)
        assert abs(logs.std() - sigma) < 5 * sigma / np.sqrt(2e5)
    # the three quantities are drawn independently
    assert abs(np.corrcoef(np.log(p.down_bytes_per_s), np.log(p.up_bytes_per_s))[0, 1]) < 0.02


def test_zero_sigma_is_the_median_exactly():
    p = LogNormalDevices(seed=1, compute_sigma=0, down_sigma=0, up_sigma=0).profiles([3, 4])
    assert np.all(p.compute_s_per_example == 0.01) and np.all(p.up_bytes_per_s == 7.5e5)


def test_a_trace_maps_client_c_to_row_c_mod_rows():
    trace = DeviceTrace(np.array([1.0, 2.0, 3.0]), np.array([10.0, 20.0, 30.0]),
                        np.array([5.0, 6.0, 7.0]))
    p = trace.profiles(np.array([0, 1, 2, 3, 7, 3_000_000_002]))
    assert p.compute_s_per_example.tolist() == [1.0, 2.0, 3.0, 1.0, 2.0, 3.0]
    assert p.down_bytes_per_s.tolist() == [10.0, 20.0, 30.0, 10.0, 20.0, 30.0]
    assert p.up_bytes_per_s.tolist() == [5.0, 6.0, 7.0, 5.0, 6.0, 7.0]


@pytest.mark.parametrize("kwargs, message", [
    ({"compute_s_per_example": 0.0}, "compute_s_per_example must be > 0"),
    ({"down_sigma": -1.0}, "down_sigma must be >= 0"),
    ({"up_bytes_per_s": float("inf")}, "up_bytes_per_s must be > 0 and finite"),
])
def test_bad_parameters_are_one_line(kwargs, message):
    with pytest.raises(FedrayError, match=message) as e:
        LogNormalDevices(seed=0, **kwargs)
    assert "\n" not in str(e.value)


def test_a_bad_trace_row_is_named():
    with pytest.raises(FedrayError, match="down_bytes_per_s, row 1: must be > 0"):
        DeviceTrace(np.ones(2), np.array([1.0, 0.0]), np.ones(2))
