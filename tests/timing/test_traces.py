"""fedray's trace files: round trips in every format, and bad files as one line."""

import gzip

import numpy as np
import pyarrow as pa
import pytest

from fedray.errors import FedrayError
from fedray.timing.availability import Diurnal
from fedray.timing.devices import LogNormalDevices
from fedray.timing.traces import (
    availability_table,
    availability_trace,
    device_table,
    generate_availability_trace,
    generate_device_trace,
    read_availability_trace,
    read_device_trace,
    read_table,
    write_availability_trace,
    write_device_trace,
)

FORMATS = ["t.csv", "t.csv.gz", "t.arrow", "t.parquet"]


@pytest.mark.parametrize("name", FORMATS)
def test_device_trace_round_trip(tmp_path, name):
    table = generate_device_trace(300, seed=5)
    url = str(tmp_path / "sub" / name)
    write_device_trace(table, url)
    back = read_device_trace(url)
    p = LogNormalDevices(seed=5).profiles(np.arange(300))  # the generator is the model
    assert np.array_equal(back.compute_s_per_example, p.compute_s_per_example)
    assert np.array_equal(back.down_bytes_per_s, p.down_bytes_per_s)
    assert np.array_equal(back.up_bytes_per_s, p.up_bytes_per_s)
    write_device_trace(back, str(tmp_path / ("again_" + name)))  # from the object, too
    assert read_table(str(tmp_path / ("again_" + name))).equals(device_table(back))
    assert [p.name for p in tmp_path.glob("**/*.tmp")] == []


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("horizon", [None, 3 * 86400.0])
def test_availability_trace_round_trip(tmp_path, name, horizon):
    jitter = 0.0 if horizon is None else 3600.0
    table = generate_availability_trace(200, 4, online_s=5 * 3600, jitter_s=jitter,
                                        horizon_s=horizon)
    url = str(tmp_path / name)
    write_availability_trace(table, url)
    back = read_availability_trace(url)
    ref = availability_trace(table)
    for name_ in ("offsets", "starts", "ends"):
        assert np.array_equal(getattr(back, name_), getattr(ref, name_))
    assert np.array_equal(back.periods, ref.periods, equal_nan=True)
    assert availability_table(back).equals(table)


def test_memory_urls_work(tmp_path):
    url = "memory://fedray-timing-test/devices.parquet"
    write_device_trace(generate_device_trace(5, seed=1), url)
    assert read_device_trace(url).rows == 5


def test_never_online_rows_and_touching_intervals(tmp_path):
    f = tmp_path / "a.csv"
    f.write_text("client_id,start_s,end_s\n0,10,20\n2,5,6\n1,,\n0,20,30\n0,0,5\n")
    trace = read_availability_trace(str(f))
    assert trace.offsets.tolist() == [0, 2, 2, 3]  # [0,5) and [10,20)+[20,30) joined
    assert trace.starts.tolist() == [0.0, 10.0, 5.0] and trace.ends.tolist() == [5.0, 30.0, 6.0]
    assert trace.online([1], 0.0).tolist() == [False]
    assert availability_table(trace).column("start_s").null_count == 1


def _write(tmp_path, text, name="t.csv"):
    f = tmp_path / name
    f.write_text(text)
    return str(f)


DEVICE_HEADER = "client_id,compute_s_per_example,down_bytes_per_s,up_bytes_per_s\n"


BAD_DEVICE_FILES = [
    ("client_id,compute_s_per_example,down_bytes_per_s\n0,1,1\n",
     "no column 'up_bytes_per_s'; it has: client_id, compute_s_per_example, down_bytes_per_s"),
    (DEVICE_HEADER + "0,1,1,1\n1,-0.5,1,1\n",
     "column 'compute_s_per_example', row 1: must be > 0 and finite, got -0.5"),
    (DEVICE_HEADER + "0,1,1,1\n1,1,,1\n",
     "column 'down_bytes_per_s', row 1: must be > 0 and finite, got a missing value"),
    (DEVICE_HEADER + "0,1,1,1\n0,1,1,1\n", "column 'client_id', row 1: client id 0 appears twice"),
    (DEVICE_HEADER + "0,1,1,1\n2,1,1,1\n", "client ids must be 0..1, each once; 1 is missing"),
    (DEVICE_HEADER + "0,1,1,1\n-1,1,1,1\n", "column 'client_id', row 1: must be >= 0, got -1"),
    (DEVICE_HEADER + "0,1,x,1\n", "not a readable CSV trace"),
    (DEVICE_HEADER, "no rows"),
]
BAD_AVAILABILITY_FILES = [
    ("client_id,start_s\n0,1\n", "no column 'end_s'"),
    ("client_id,start_s,end_s\n0,10,10\n", "column 'end_s', row 0: must be > start_s (10.0)"),
    ("client_id,start_s,end_s\n0,-1,10\n", "column 'start_s', row 0: must be >= 0"),
    ("client_id,start_s,end_s\n0,0,10\n0,5,20\n",
     "column 'start_s', row 1: client 0's interval [5.0, 20.0) overlaps the one in row 0"),
    ("client_id,start_s,end_s\n0,0,10\n0,,\n",
     "client 0 has online intervals, so it cannot also have an empty"),
    ("client_id,start_s,end_s\n0,0,\n", "column 'end_s', row 0: missing value"),
    ("client_id,start_s,end_s\n0,0,1\n2,0,1\n", "client id 1 has no row"),
    ("client_id,start_s,end_s,period_s\n0,0,10,100\n0,20,30,50\n",
     "column 'period_s', row 1: client 0's rows must share one period_s"),
    ("client_id,start_s,end_s,period_s\n0,0,120,100\n",
     "column 'end_s', row 0: must be <= period_s (100.0), got 120.0"),
    ("client_id,start_s,end_s,period_s\n0,0,10,0\n", "column 'period_s', row 0: must be > 0"),
    ("client_id,start_s,end_s\n0.5,0,10\n", "not a readable CSV trace"),
]


@pytest.mark.parametrize("read, text, message",
                         [(read_device_trace, *case) for case in BAD_DEVICE_FILES]
                         + [(read_availability_trace, *case) for case in BAD_AVAILABILITY_FILES])
def test_bad_trace_files_are_one_line(tmp_path, read, text, message):
    url = _write(tmp_path, text)
    with pytest.raises(FedrayError) as e:
        read(url)
    assert message in str(e.value) and str(e.value).startswith(url)
    assert "\n" not in str(e.value)


def test_bad_arrow_types_and_unreadable_files(tmp_path):
    url = str(tmp_path / "t.parquet")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"client_id": [0.0], "start_s": [0.0], "end_s": [1.0]}), url)
    with pytest.raises(FedrayError, match="column 'client_id' must hold integers, it holds"):
        read_availability_trace(url)
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 and then nothing")
    with pytest.raises(FedrayError, match="not a readable parquet file"):
        read_table(str(tmp_path / "broken.parquet"))
    with pytest.raises(FedrayError, match="no such trace file"):
        read_table(str(tmp_path / "missing.csv"))
    (tmp_path / "bad.csv.gz").write_bytes(b"not gzip")
    with pytest.raises(FedrayError, match="cannot read"):
        read_table(str(tmp_path / "bad.csv.gz"))


def test_writers_refuse_bad_tables_and_names(tmp_path):
    bad = pa.table({"client_id": [0], "start_s": [5.0], "end_s": [1.0]})
    with pytest.raises(FedrayError, match="must be > start_s"):
        write_availability_trace(bad, str(tmp_path / "a.csv"))
    with pytest.raises(FedrayError, match="unknown trace format; name it"):
        write_device_trace(generate_device_trace(2, 0), str(tmp_path / "a.pkl"))
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_generator_checks_and_gzip_is_real(tmp_path):
    with pytest.raises(FedrayError, match="give horizon_s"):
        generate_availability_trace(3, 0, jitter_s=60.0)
    url = str(tmp_path / "d.csv.gz")
    write_device_trace(generate_device_trace(3, 0), url)
    assert gzip.decompress((tmp_path / "d.csv.gz").read_bytes()).startswith(b'"client_id"')
    full = generate_availability_trace(4, 0, online_s=86400.0)  # always online
    assert Diurnal(0, online_s=86400.0).always
    assert read_table_rows(full) == [(c, 0.0, 86400.0) for c in range(4)]


def read_table_rows(table):
    return list(zip(*(table.column(c).to_pylist() for c in ("client_id", "start_s", "end_s")),
                    strict=True))


def test_a_stray_huge_id_is_named_not_allocated(tmp_path):
    url = _write(tmp_path, DEVICE_HEADER + "0,1,1,1\n1000000000000,1,1,1\n")
    with pytest.raises(FedrayError, match="client ids must be 0..1, each once; 1 is missing"):
        read_device_trace(url)
    url = _write(tmp_path, "client_id,start_s,end_s\n0,0,1\n1000000000000,0,1\n", "a.csv")
    with pytest.raises(FedrayError, match="client id 1 has no row"):
        read_availability_trace(url)


def test_a_binary_file_is_not_a_csv_trace(tmp_path):
    """Not parquet, not Arrow, and a header that is not text (pyarrow reads it and fails
    only when the column names are decoded): one line, not a UnicodeDecodeError."""
    from fedray.errors import FedrayError
    from fedray.timing.traces import read_table

    bad = tmp_path / "trace.csv"
    bad.write_bytes(b"\xff\xfeclient_id,start_s\n1,2\n")
    with pytest.raises(FedrayError, match="not a readable CSV trace"):
        read_table(str(bad))
