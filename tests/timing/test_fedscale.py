"""FedScale's pickled traces: converted field by field, assigned as FedScale assigns them,
and read without ever resolving a global."""

import os

import numpy as np
import pytest
from fedscale_files import BEHAVE, DEVICES, write_pickle

from fedray.errors import FedrayError
from fedray.timing.fedscale import from_fedscale_availability, from_fedscale_devices
from fedray.timing.traces import (
    availability_trace,
    device_trace,
    read_availability_trace,
    read_device_trace,
    write_availability_trace,
    write_device_trace,
)


def _pickle(tmp_path, obj, name="trace"):
    return write_pickle(tmp_path / name, obj)


def test_devices_field_by_field_in_fedscale_order(tmp_path):
    table = from_fedscale_devices(_pickle(tmp_path, DEVICES))
    # fedray client c gets what FedScale gives its client c + 1: key (c + 1) % 3, i.e.
    # keys 1, 2, then 0, which FedScale does not find and replaces by 1 ms and 1 kbit/s
    assert table.column("source_key").to_pylist() == [1, 2, None]
    # compute: 3 (forward + backward) * ms per sample / 1000; the division is correctly
    # rounded, so 3 * 162 / 1000 is the double nearest 0.486
    assert table.column("compute_s_per_example").to_pylist() == [0.486, 0.12, 0.003]
    # bandwidth: kbit/s * 1024 / 8 bytes, the same both ways; * 128 is exact in binary
    down = table.column("down_bytes_per_s").to_pylist()
    assert down == [5648.109619499134 * 128, 1024.0, 128.0]
    assert table.column("up_bytes_per_s").to_pylist() == down
    trace = device_trace(table)
    assert trace.profiles([4]).compute_s_per_example.tolist() == [0.12]  # 4 % 3 = row 1


def test_devices_in_key_order(tmp_path):
    table = from_fedscale_devices(_pickle(tmp_path, DEVICES), order="keys", train_factor=1.0)
    assert table.column("source_key").to_pylist() == [1, 2, 3]
    assert table.column("compute_s_per_example").to_pylist() == [0.162, 0.04, 0.0205]


def _fedscale_online(entry, t):
    """FedScale's rule (client_metadata.py, is_active): t % finish_time within some
    [active[i], inactive[i]]."""
    norm = t % entry["finish_time"]
    return any(a <= norm <= b for a, b in zip(entry["active"], entry["inactive"], strict=True))


def test_availability_matches_fedscale_assignment_and_rule(tmp_path):
    table = from_fedscale_availability(_pickle(tmp_path, BEHAVE))
    # rows: positions (c + 1) % 3 of the file's order 3834, 17, 5 -> 17, 5, 3834
    assert table.column("source_key").unique().to_pylist() == [17, 5, 3834]
    rows = list(zip(*(table.column(c).to_pylist()
                      for c in ("client_id", "start_s", "end_s", "period_s")), strict=True))
    assert rows[:3] == [(0, 10.0, 40.0, 100.0), (0, 80.0, 100.0, 100.0), (1, None, None, 50.0)]
    assert rows[3] == (2, 12788.0, 65881.0, 518400.0) and len(rows) == 3 + 8
    trace = availability_trace(table)
    entries = list(BEHAVE.values())
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 1000, 3000)
    # FedScale's intervals are closed, fedray's half-open: they differ only at an interval's
    # end, where random times never fall (FedScale's bounds are integers, these are not)
    t = rng.uniform(0, 3 * 518400, 3000)
    assert not np.any(t == t.round())
    expect = [_fedscale_online(entries[(c + 1) % 3], s) for c, s in zip(ids, t, strict=True)]
    assert trace.online(ids, t).tolist() == expect
    # the published entry's 'duration' is its online seconds, which fedray recomputes
    ends, starts = table.column("end_s").to_numpy(), table.column("start_s").to_numpy()
    assert (ends - starts)[3:].sum() == BEHAVE[3834]["duration"]


def test_availability_clips_merges_and_drops_empty_intervals(tmp_path):
    doc = {9: {"active": [50, 0, 5, 20, 120], "inactive": [150, 10, 8, 20, 130],
               "finish_time": 100, "duration": 0, "model": ""}}
    table = from_fedscale_availability(_pickle(tmp_path, doc), order="keys")
    # [50, 150] clipped to the period; [5, 8] inside [0, 10]; [20, 20] and [120, 130] never
    # reached by t % 100
    assert table.column("start_s").to_pylist() == [0.0, 50.0]
    assert table.column("end_s").to_pylist() == [10.0, 100.0]


def test_converted_tables_survive_fedray_files(tmp_path):
    devices = from_fedscale_devices(_pickle(tmp_path, DEVICES, "d"))
    behave = from_fedscale_availability(_pickle(tmp_path, BEHAVE, "b"))
    write_device_trace(devices, str(tmp_path / "d.csv"))
    write_availability_trace(behave, str(tmp_path / "b.parquet"))
    assert np.array_equal(read_device_trace(str(tmp_path / "d.csv")).down_bytes_per_s,
                          devices.column("down_bytes_per_s").to_numpy())
    back = read_availability_trace(str(tmp_path / "b.parquet"))
    assert back.online([0, 1, 2], 20.0).tolist() == [True, False, False]
    assert back.online([2], 518400 + 12788.0).tolist() == [True]


class _RunsACommand:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_that_names_a_global_is_refused_before_it_runs(tmp_path):
    marker = tmp_path / "ran"
    url = _pickle(tmp_path, {1: {"computation": _RunsACommand(marker), "communication": 1.0}})
    with pytest.raises(FedrayError, match=r"pickle refers to (posix|os)\.system") as e:
        from_fedscale_devices(url)
    assert "refused, nothing was run" in str(e.value) and "\n" not in str(e.value)
    assert not marker.exists()
    # a numpy scalar is a global too: plain numbers only
    url = _pickle(tmp_path, {1: {"computation": np.float64(3.0), "communication": 1.0}})
    with pytest.raises(FedrayError, match="pickle refers to numpy"):
        from_fedscale_devices(url)


@pytest.mark.parametrize("doc, message", [
    ([1, 2], "expected a pickled dict of client id -> entry, got list"),
    ({}, "has no entries"),
    ({"a": {"computation": 1.0, "communication": 1.0}}, "key 'a': FedScale client ids are"),
    ({1: {"computation": 1.0}}, "entry 1: missing field 'communication'"),
    ({1: {"computation": -1.0, "communication": 1.0}}, "'computation' must be a number > 0"),
    ({1: {"computation": True, "communication": 1.0}}, "'computation' must be a number > 0"),
])
def test_bad_device_pickles_are_one_line(tmp_path, doc, message):
    with pytest.raises(FedrayError, match=message) as e:
        from_fedscale_devices(_pickle(tmp_path, doc), order="keys")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("entry, message", [
    ({"active": [5], "inactive": [1], "finish_time": 10}, "interval 0 \\[5, 1\\] must have"),
    ({"active": [1, 2], "inactive": [3], "finish_time": 10}, "'active' has 2 times"),
    ({"active": [1], "inactive": [3]}, "missing field 'finish_time'"),
    ({"active": "1", "inactive": [3], "finish_time": 10}, "'active' must be a list"),
])
def test_bad_availability_pickles_are_one_line(tmp_path, entry, message):
    with pytest.raises(FedrayError, match=message):
        from_fedscale_availability(_pickle(tmp_path, {7: entry}))


def test_not_a_pickle(tmp_path):
    (tmp_path / "junk").write_bytes(b"\x00not a pickle")
    with pytest.raises(FedrayError, match="not a FedScale trace pickle"):
        from_fedscale_devices(str(tmp_path / "junk"))
    with pytest.raises(FedrayError, match="no such FedScale trace file"):
        from_fedscale_devices(str(tmp_path / "nothing"))
    with pytest.raises(FedrayError, match="order must be one of fedscale, keys"):
        from_fedscale_devices(_pickle(tmp_path, DEVICES), order="sorted")
