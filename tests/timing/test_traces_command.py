"""``fedray traces``: generate, convert-fedscale and describe, as a user runs them
(``fedray.cli.main`` in this process: the same parsing, errors and exit codes as the
``fedray`` executable), then a run that reads the generated traces."""

from __future__ import annotations

import collections
import json
import pathlib

import numpy as np
import pytest
from fedscale_files import BEHAVE, DEVICES, write_pickle

from fedray.cli import main
from fedray.timing.fedscale import from_fedscale_availability, from_fedscale_devices
from fedray.timing.trace_commands import AVAILABILITY_DEFAULTS, DEVICE_DEFAULTS
from fedray.timing.traces import (
    generate_availability_trace,
    generate_device_trace,
    read_table,
)

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _traces(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["traces", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def _ok(capsys, *args: str) -> str:
    code, out, err = _traces(capsys, *args)
    assert code == 0 and err == "", err
    return out


def _files(path: pathlib.Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file()}


def test_the_options_defaults_are_the_models(tmp_path, capsys):
    """The CLI spells its defaults out (its parser imports no numpy); a trace generated with
    them equals, bit for bit, the Python generator's with the models' own defaults."""
    import inspect

    for fn, defaults in ((generate_device_trace, DEVICE_DEFAULTS),
                         (generate_availability_trace, AVAILABILITY_DEFAULTS)):
        params = inspect.signature(fn).parameters
        assert {k: params[k].default for k in defaults} == defaults
    _ok(capsys, "generate", "devices", "--clients", "300", "--seed", "4", "--out",
        str(tmp_path / "d.arrow"))
    assert read_table(str(tmp_path / "d.arrow")).equals(generate_device_trace(300, 4))
    out = _ok(capsys, "generate", "availability", "--clients", "300", "--seed", "4",
              "--jitter-s", "3600", "--horizon-s", "604800", "--out",
              str(tmp_path / "w.parquet"))
    want = generate_availability_trace(300, 4, jitter_s=3600.0, horizon_s=604800.0)
    assert read_table(str(tmp_path / "w.parquet")).equals(want)
    assert out.startswith(f"done: 300 clients, {want.num_rows:,} online intervals (seed 4, "
                          "absolute, [0, 604800) s); availability trace at ")


def _run(capsys, out: pathlib.Path, *clock: str) -> list[dict]:
    """2 rounds of logistic regression on 50 synthetic writers, no Ray; its metrics."""
    code = main(["run", str(ROOT / "jobs" / "quickstart.yaml"), "model.name=logreg",
                 "rounds=2", "runtime.backend=inline", "data.synthetic.num_clients=50",
                 "data.synthetic.test_writers=10", "sampling.clients_per_round=10",
                 "seed=5", "eval.every=2", "output.tensorboard=false", f"output.dir={out}",
                 "--quiet", "clock.enabled=true", *clock])
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_generate_describe_then_a_run_on_the_traces(tmp_path, capsys):
    devices, avail = str(tmp_path / "devices.csv"), str(tmp_path / "availability.csv")
    # ~1 s per example: updates of about a minute; clients online 15 of every 60 minutes
    # (quarter-hour windows at phases over the whole hour, so a quarter of them wrap)
    out = _ok(capsys, "generate", "devices", "--clients", "50", "--seed", "5",
              "--compute-s-per-example", "1", "--out", devices)
    assert out == f"done: 50 devices (seed 5); device trace at {devices}\n"
    _ok(capsys, "generate", "availability", "--clients", "50", "--seed", "5", "--period-s",
        "3600", "--online-s", "900", "--out", avail)

    lines = _ok(capsys, "describe", devices).splitlines()
    assert lines[1] == ("kind:         device trace, 50 devices (client c of a run takes "
                        "row c % 50)")
    table = read_table(devices)
    for label, column in (("compute s/example", "compute_s_per_example"),
                          ("download bytes/s", "down_bytes_per_s"),
                          ("upload bytes/s", "up_bytes_per_s")):
        v = table.column(column).to_numpy()
        row = next(ln for ln in lines if ln.startswith(label))
        assert row.split()[-5:] == [f"{x:.4g}" for x in (v.min(), np.percentile(v, 5),
                                                          np.median(v), np.percentile(v, 95),
                                                          v.max())]
    text = _ok(capsys, "describe", avail)
    assert "kind:         availability trace" in text and "50 clients" in text
    assert "times:        repeating every 3600 s (1 h)" in text
    assert "never online: 0 of 50 clients" in text
    assert "online time:  per client mean 25.0% of its period" in text
    # a window that wraps past the period is two rows but one window
    assert "windows:      mean length 15 min; 1 per online client per period" in text
    assert read_table(avail).num_rows > 50

    traced = _run(capsys, tmp_path / "traced", "clock.devices.source=trace",
                  f"clock.devices.trace={devices}", "clock.availability.model=trace",
                  f"clock.availability.trace={avail}")
    # the traces are the seeded models written out: the same run on the models has the
    # same schedule and the same training, bit for bit
    modelled = _run(capsys, tmp_path / "modelled", "clock.devices.compute_s_per_example=1",
                    "clock.availability.model=diurnal", "clock.availability.period_s=3600",
                    "clock.availability.online_s=900")
    keys = ("clients", "dropped_out", "late", "sim_round_s", "sim_time_s", "train_loss",
            "test_accuracy")
    assert [m["round"] for m in traced] == [1, 2]
    assert [{k: m.get(k) for k in keys} for m in traced] == \
        [{k: m.get(k) for k in keys} for m in modelled]
    assert traced[-1]["sim_time_s"] > 0 and "test_accuracy" in traced[-1]
    assert sum(m["dropped_out"] for m in traced) > 0  # availability decided who trained
    config = (tmp_path / "traced" / "config.yaml").read_text()
    assert devices in config and avail in config  # the run names the traces it read


def _pickle(path: pathlib.Path, obj) -> str:
    return write_pickle(path, obj)


def test_convert_fedscale_then_describe(tmp_path, capsys):
    cap = _pickle(tmp_path / "client_device_capacity", DEVICES)
    behave = _pickle(tmp_path / "client_behave_trace", BEHAVE)
    out = _ok(capsys, "convert-fedscale", "devices", cap, "--out", str(tmp_path / "d.csv"))
    # FedScale's client c + 1 for fedray's c: keys 1, 2, then 0, which has no entry
    assert out == (f"done: 3 devices (1 with FedScale's fallback profile: no entry under "
                   f"their key), from FedScale's {cap} (order fedscale); device trace at "
                   f"{tmp_path / 'd.csv'}\n")
    assert read_table(str(tmp_path / "d.csv")).equals(from_fedscale_devices(cap))
    _ok(capsys, "convert-fedscale", "devices", cap, "--order", "keys", "--train-factor", "1",
        "--out", str(tmp_path / "k.parquet"))
    assert read_table(str(tmp_path / "k.parquet")).equals(
        from_fedscale_devices(cap, order="keys", train_factor=1.0))
    text = _ok(capsys, "describe", str(tmp_path / "k.parquet"))
    assert "compute s/example        0.0205" in text  # 20.5 ms, one pass
    assert "other columns: source_key (kept, ignored by runs)" in text

    out = _ok(capsys, "convert-fedscale", "availability", behave, "--out",
              str(tmp_path / "a.arrow"))
    assert out.startswith("done: 3 clients, 10 online intervals, 1 clients never online, ")
    assert read_table(str(tmp_path / "a.arrow")).equals(from_fedscale_availability(behave))
    text = _ok(capsys, "describe", str(tmp_path / "a.arrow"))
    assert "availability trace, 11 rows, 3 clients" in text
    assert "times:        repeating, periods 50 s to 518400 s" in text
    assert "never online: 1 of 3 clients" in text
    # rows 0 and 2 (keys 17 and 3834) are online 50 of 100 s and 211,625 of 518,400 s; 17's
    # [80, 100) runs to the period but its first interval starts at 10, so nothing joins
    # across the wrap: 2 + 8 windows, (50 + 211625) / 10 s each on average
    assert f"per client mean {(0.5 + 211625 / 518400) / 3:.1%} of its period" in text
    assert "windows:      mean length 5.88 h; 5 per online client per period" in text


# a pickle that would call builtins.print when loaded, written opcode by opcode (pickling
# print itself names whatever a library has put in its place: Ray patches print)
EVIL = b"(dp0\nI1\ncbuiltins\nprint\n(Vpickle ran code\ntR.s."


@pytest.mark.parametrize("args, message", [
    (["generate", "devices", "--clients", "0", "--seed", "0", "--out", "{d}/x.csv"],
     "--clients: must be >= 1, got 0"),
    (["generate", "devices", "--clients", "5", "--seed", "-1", "--out", "{d}/x.csv"],
     "--seed: must be >= 0, got -1"),
    (["generate", "devices", "--clients", "5", "--seed", "0", "--up-sigma", "-0.5", "--out",
      "{d}/x.csv"], "--up-sigma: must be >= 0 and finite, got -0.5"),
    (["generate", "devices", "--clients", "5", "--seed", "0", "--out", "{d}/x.txt"],
     "--out {d}/x.txt: unknown trace format; name it *.csv (or *.csv.gz), *.parquet or "
     "*.arrow"),
    (["generate", "devices", "--clients", "5", "--seed", "0", "--out", "{d}/old.csv"],
     "--out {d}/old.csv already exists; choose a new name or remove it"),
    (["generate", "availability", "--clients", "5", "--seed", "0", "--jitter-s", "60",
      "--out", "{d}/x.csv"], "--jitter-s needs --horizon-s: jitter changes every period, so "
     "a repeating trace cannot hold it"),
    (["generate", "availability", "--clients", "5", "--seed", "0", "--online-s", "90000",
      "--out", "{d}/x.csv"], "--online-s: must be in (0, --period-s = 86400], got 90000.0"),
    (["generate", "availability", "--clients", "5", "--seed", "0", "--horizon-s", "inf",
      "--out", "{d}/x.csv"], "--horizon-s: must be > 0 and finite, got inf"),
    (["convert-fedscale", "availability", "{d}/behave", "--train-factor", "2", "--out",
      "{d}/x.csv"], "--train-factor goes with convert-fedscale devices (FedScale's compute "
     "cost); availability has none"),
    (["convert-fedscale", "devices", "{d}/evil", "--out", "{d}/x.csv"],
     "{d}/evil: pickle refers to builtins.print, but a FedScale trace holds only dicts, "
     "lists, numbers and strings (refused, nothing was run)"),
    (["convert-fedscale", "devices", "{d}/ordered", "--out", "{d}/x.csv"],
     "{d}/ordered: pickle refers to collections.OrderedDict"),
    (["convert-fedscale", "devices", "{d}/nofield", "--out", "{d}/x.csv"],
     "{d}/nofield: entry 0: missing field 'communication'"),
    (["convert-fedscale", "devices", "{d}/missing", "--out", "{d}/x.csv"],
     "{d}/missing: no such FedScale trace file"),
    (["describe", "{d}/old.csv"], "{d}/old.csv: column 'compute_s_per_example', row 1: must "
     "be > 0 and finite, got -0.5"),
    (["describe", "{d}/behave"], "{d}/behave: not a readable CSV trace (its header is not "
     "UTF-8 text)"),
])
def test_bad_inputs_are_one_line_and_write_nothing(tmp_path, capsys, args, message):
    d = tmp_path
    (d / "old.csv").write_text("client_id,compute_s_per_example,down_bytes_per_s,"
                               "up_bytes_per_s\n0,0.1,1e6,1e5\n1,-0.5,1e6,1e5\n")
    _pickle(d / "behave", BEHAVE)
    (d / "evil").write_bytes(EVIL)
    _pickle(d / "ordered", collections.OrderedDict(DEVICES))
    _pickle(d / "nofield", {0: {"computation": 1.0}})
    before = _files(d)
    code, out, err = _traces(capsys, *(a.format(d=d) for a in args))
    assert code == 2 and out == ""
    assert err.startswith(f"fedray: error: {message.format(d=d)}") and err.count("\n") == 1
    assert _files(d) == before  # no trace, no temporary file, old.csv unchanged
