"""``fedray traces``: generate, convert and describe the clock's trace files from the shell.

A run reads traces (``clock.devices.trace``, ``clock.availability.trace``); this verb makes
them, so a researcher never needs Python to produce, import or inspect one. It is a thin
layer over fedray.timing.traces and fedray.timing.fedscale: options map one to one onto
the generators' parameters (and the ``clock.*`` keys of the same names), and every check
names the option a user typed.

The parser is built for every ``fedray`` command, so this module imports nothing heavy at
the top: numpy and pyarrow load only when a ``traces`` command runs. The option defaults
are therefore spelt out here (``DEVICE_DEFAULTS``, ``AVAILABILITY_DEFAULTS``) rather than
read from the models' dataclasses; tests/timing/test_traces_command.py checks that a trace
generated with them equals the Python generator's with its own defaults.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

from fedray.errors import FedrayError
from fedray.state.redact import mask

# fedray.timing.devices.LogNormalDevices' defaults (the clock.devices.* keys')
DEVICE_DEFAULTS = {"compute_s_per_example": 0.01, "compute_sigma": 0.7,
                   "down_bytes_per_s": 2.5e6, "down_sigma": 0.8,
                   "up_bytes_per_s": 7.5e5, "up_sigma": 0.8}
# fedray.timing.availability.Diurnal's (phase_spread_s None: the period)
AVAILABILITY_DEFAULTS = {"period_s": 86400.0, "online_s": 28800.0, "jitter_s": 0.0}
SHARE_TIMES = 48  # moments at which describe measures the online share

TRACES_HELP = """Generate, convert and describe the trace files of the simulated clock.

examples:
  fedray traces generate devices --clients 100000 --seed 0 --out traces/devices.parquet
  fedray traces generate availability --clients 100000 --seed 0 --online-s 21600 \\
      --out traces/day.csv
  fedray traces convert-fedscale devices client_device_capacity --out traces/fs_dev.parquet
  fedray traces describe traces/devices.parquet

A run reads them with clock.enabled=true clock.devices.source=trace
clock.devices.trace=FILE clock.availability.model=trace clock.availability.trace=FILE.
A trace's format follows its name: .csv (or .csv.gz, ...), .arrow (.feather, .ipc) or
.parquet. --out must not exist yet; it is written whole or not at all. Formats, models and
FedScale's mapping: docs/time.md."""

GENERATE_HELP = """Write the seeded device or availability model as a trace file.

examples:
  fedray traces generate devices --clients 1000 --seed 0 --out devices.csv
  fedray traces generate devices --clients 1000 --seed 0 --compute-sigma 1.2 --out slow.arrow
  fedray traces generate availability --clients 1000 --seed 0 --out day.csv
  fedray traces generate availability --clients 1000 --seed 0 --jitter-s 3600 \\
      --horizon-s 604800 --out week.parquet

Row c is exactly what the model with this seed gives client c: a run on the trace equals a
run on the model (same seed, same parameters) for clients 0..N-1. Details: docs/time.md."""

DEVICES_HELP = """Device profiles from the log-normal model: row c is client c's
compute seconds per example and download/upload bandwidths, each median * exp(sigma * z)
drawn from (seed, client id); the options mean what the clock.devices.* keys of the same
names mean.

examples:
  fedray traces generate devices --clients 1000 --seed 0 --out devices.csv
  fedray traces generate devices --clients 100000 --seed 3 --up-sigma 1.0 \\
      --out traces/devices.parquet"""

AVAILABILITY_HELP = """Online windows from the diurnal model: one window of --online-s per
--period-s per client, starting at the client's phase (uniform in [0, --phase-spread-s))
plus a jitter per period (uniform in [0, --jitter-s)); the options mean what the
clock.availability.* keys of the same names mean.

Without --horizon-s the trace holds one period that repeats (a period_s column); a
repeating trace cannot hold jitter, which changes every period. With --horizon-s it holds
every window in [0, HORIZON) in absolute seconds, jitter included.

examples:
  fedray traces generate availability --clients 1000 --seed 0 --out day.csv
  fedray traces generate availability --clients 1000 --seed 0 --online-s 3600 \\
      --phase-spread-s 43200 --out evenings.arrow
  fedray traces generate availability --clients 1000 --seed 0 --jitter-s 3600 \\
      --horizon-s 604800 --out week.parquet"""

CONVERT_HELP = """Convert one of FedScale's published pickled traces into a fedray trace.

examples:
  fedray traces convert-fedscale devices client_device_capacity --out devices.parquet
  fedray traces convert-fedscale availability client_behave_trace --out availability.parquet
  fedray traces convert-fedscale devices client_device_capacity --order keys --out d.csv

devices reads client_device_capacity ({id: {'computation': ms per sample, 'communication':
kbit/s}}), availability reads client_behave_trace ({id: {'active': [...], 'inactive':
[...], 'finish_time': s, ...}}). The pickle is read by an unpickler that resolves no
global, so it can run no code. --order fedscale (the default) lays the rows out so that a
fedray run's client c gets what FedScale's simulator gives its client c + 1; --order keys
gives row r the r-th smallest key. Field-by-field mapping: docs/time.md."""

DESCRIBE_HELP = """Say what a trace file holds: its kind, rows and clients, and summary
statistics (device traces: percentiles of compute seconds per example and of bandwidths;
availability traces: the online share over time, online time per client, window lengths).
The file is checked as a run would check it.

examples:
  fedray traces describe traces/devices.parquet
  fedray traces describe traces/day.csv"""

Command = Callable[[Any, str, str, str], argparse.ArgumentParser]


def add_traces_command(sub: Any, command: Command) -> None:
    """Add ``fedray traces`` to the CLI's sub-commands. ``command`` is fedray.cli's
    ``_command`` (help kept as written, --debug), used for the last verbs only: argparse
    lets a sub-command's unset --debug reset one given before it, so the levels above
    refuse --debug instead of ignoring it."""
    traces = _level(sub, "traces", "generate, convert and describe trace files", TRACES_HELP)
    verbs = traces.add_subparsers(dest="traces_command", required=True, metavar="VERB")
    gen = _level(verbs, "generate", "write a seeded model as a trace file", GENERATE_HELP)
    kinds = gen.add_subparsers(dest="kind", required=True, metavar="KIND")
    dev = command(kinds, "devices", "device profiles (log-normal model)", DEVICES_HELP)
    av = command(kinds, "availability", "online windows (diurnal model)", AVAILABILITY_HELP)
    for cmd in (dev, av):
        cmd.add_argument("--clients", type=int, required=True, metavar="N",
                         help="rows to write: clients 0..N-1")
        cmd.add_argument("--seed", type=int, required=True, metavar="S",
                         help="the model's seed (a run's seed key draws the same model)")
    for name, value in DEVICE_DEFAULTS.items():
        quantity = {"compute": "seconds per training example", "down": "download bytes/s",
                    "up": "upload bytes/s"}[name.split("_")[0]]
        what = (f"log-normal sigma of the {quantity}" if name.endswith("sigma") else
                f"median {quantity}")
        dev.add_argument(_option(name), type=float, default=value, metavar="X",
                         help=f"{what} (default: {value:g})")
    period, online = AVAILABILITY_DEFAULTS["period_s"], AVAILABILITY_DEFAULTS["online_s"]
    av.add_argument("--period-s", type=float, default=period, metavar="S",
                    help=f"length of a period (default: {period:g}, a day)")
    av.add_argument("--online-s", type=float, default=online, metavar="S",
                    help=f"online window per period (default: {online:g}, 8 h)")
    av.add_argument("--phase-spread-s", type=float, metavar="S",
                    help="phases uniform in [0, S) (default: the period, every time zone)")
    av.add_argument("--jitter-s", type=float, default=AVAILABILITY_DEFAULTS["jitter_s"],
                    metavar="S", help="window start jitter per period, uniform in [0, S) "
                    "(default: 0; needs --horizon-s)")
    av.add_argument("--horizon-s", type=float, metavar="S", help="write absolute windows in "
                    "[0, S) (default: one period that repeats)")
    conv = command(verbs, "convert-fedscale", "convert a FedScale trace", CONVERT_HELP)
    conv.add_argument("kind", choices=("devices", "availability"),
                      help="devices: client_device_capacity; availability: "
                      "client_behave_trace")
    conv.add_argument("source", metavar="FEDSCALE_FILE", help="the pickled FedScale trace "
                      "(a path or fsspec URL)")
    conv.add_argument("--order", choices=("fedscale", "keys"), default="fedscale",
                      help="row order (default: fedscale, FedScale's own assignment)")
    conv.add_argument("--train-factor", type=float, metavar="X",
                      help="devices only: inference passes per training sample (default: 3, "
                      "FedScale's augmentation_factor)")
    desc = command(verbs, "describe", "summarise a trace file", DESCRIBE_HELP)
    desc.add_argument("trace", metavar="FILE", help="a device or availability trace file")
    for cmd in (dev, av, conv):
        cmd.add_argument("--out", required=True, metavar="FILE",
                         help="the trace file to write: a new path or fsspec URL; .csv, "
                         ".arrow or .parquet")


def _level(sub: Any, name: str, summary: str, description: str) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=summary, description=description,
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def run_traces(args: argparse.Namespace) -> int:
    """Run a parsed ``fedray traces`` command; prints its result, returns the exit code."""
    if args.traces_command == "describe":
        print(describe_trace(args.trace), flush=True)
        return 0
    if args.traces_command == "generate" and args.kind == "devices":
        params = {name: getattr(args, name) for name in DEVICE_DEFAULTS}
        line = generate_devices(args.clients, args.seed, args.out, **params)
    elif args.traces_command == "generate":
        line = generate_availability(args.clients, args.seed, args.out,
                                     period_s=args.period_s, online_s=args.online_s,
                                     phase_spread_s=args.phase_spread_s,
                                     jitter_s=args.jitter_s, horizon_s=args.horizon_s)
    else:
        line = convert_fedscale(args.kind, args.source, args.out, order=args.order,
                                train_factor=args.train_factor)
    print(line, flush=True)
    return 0


# --- writing -----------------------------------------------------------------------------

def _new_out(url: str) -> None:
    """Refuse --out before any work: a name without a trace format, or a file that exists
    (a trace is an input of runs: overwriting one would silently change what they mean)."""
    # imported when used, not at the top: they load fsspec, numpy, pyarrow (start-up time)
    from fedray.state.storage import filesystem
    from fedray.timing.traces import file_format

    try:
        file_format(url)
    except FedrayError as exc:
        raise FedrayError(f"--out {exc}") from None
    fs, path = filesystem(url, "--out", durable=True, what=None)
    if fs.exists(path):
        raise FedrayError(f"--out {url} already exists; choose a new name or remove it")


def _check(name: str, value: float | None, ok: bool, need: str) -> None:
    if value is not None and not (math.isfinite(value) and ok):
        raise FedrayError(f"{_option(name)}: must be {need}, got {value!r}")


def _clients_and_seed(clients: int, seed: int) -> None:
    if clients < 1:
        raise FedrayError(f"--clients: must be >= 1, got {clients}")
    if seed < 0:
        raise FedrayError(f"--seed: must be >= 0, got {seed}")


def generate_devices(clients: int, seed: int, out: str, **params: float) -> str:
    """Write ``clients`` profiles of LogNormalDevices(seed, **params) to ``out``; the line
    to print."""
    _clients_and_seed(clients, seed)
    for name, value in params.items():
        if name.endswith("sigma"):
            _check(name, value, value >= 0, ">= 0 and finite")
        else:
            _check(name, value, value > 0, "> 0 and finite")
    _new_out(out)
    # imported when used, not at the top: it loads fsspec, numpy, pyarrow (start-up time)
    from fedray.timing.traces import generate_device_trace, write_device_trace

    write_device_trace(generate_device_trace(clients, seed, **params), out)
    return f"done: {clients:,} devices (seed {seed}); device trace at {mask(out)}"


def generate_availability(clients: int, seed: int, out: str, *, period_s: float,
                          online_s: float, phase_spread_s: float | None, jitter_s: float,
                          horizon_s: float | None) -> str:
    """Write the windows of Diurnal(seed, ...) for ``clients`` clients to ``out``; the line
    to print."""
    _clients_and_seed(clients, seed)
    p = period_s
    _check("period_s", p, p > 0, "> 0 and finite")
    _check("online_s", online_s, 0 < online_s <= p, f"in (0, --period-s = {p:g}]")
    _check("phase_spread_s", phase_spread_s, phase_spread_s is not None and
           0 <= phase_spread_s <= p, f"in [0, --period-s = {p:g}]")
    _check("jitter_s", jitter_s, jitter_s >= 0 and online_s + jitter_s <= p,
           f">= 0 with --online-s + --jitter-s <= --period-s ({p:g})")
    _check("horizon_s", horizon_s, horizon_s is not None and horizon_s > 0, "> 0 and finite")
    if jitter_s and horizon_s is None:
        raise FedrayError("--jitter-s needs --horizon-s: jitter changes every period, so a "
                          "repeating trace cannot hold it")
    _new_out(out)
    # imported when used, not at the top: it loads fsspec, numpy, pyarrow (start-up time)
    from fedray.timing.traces import generate_availability_trace, write_availability_trace

    table = generate_availability_trace(clients, seed, period_s=period_s, online_s=online_s,
                                        phase_spread_s=phase_spread_s, jitter_s=jitter_s,
                                        horizon_s=horizon_s)
    write_availability_trace(table, out)
    never = table.column("start_s").null_count
    times = (f"repeating every {period_s:g} s" if horizon_s is None else
             f"absolute, [0, {horizon_s:g}) s")
    return (f"done: {clients:,} clients, {table.num_rows - never:,} online intervals"
            + (f", {never:,} clients never online" if never else "")
            + f" (seed {seed}, {times}); availability trace at {mask(out)}")


def convert_fedscale(kind: str, source: str, out: str, *, order: str = "fedscale",
                     train_factor: float | None = None) -> str:
    """Convert FedScale's ``client_device_capacity`` (kind devices) or
    ``client_behave_trace`` (kind availability) at ``source`` into a fedray trace at
    ``out``; the line to print."""
    if kind not in ("devices", "availability"):
        raise FedrayError(f"convert-fedscale: kind must be devices or availability, got "
                          f"{kind!r}")
    if train_factor is not None and kind != "devices":
        raise FedrayError("--train-factor goes with convert-fedscale devices (FedScale's "
                          "compute cost); availability has none")
    _check("train_factor", train_factor, train_factor is not None and train_factor > 0,
           "> 0 and finite")
    _new_out(out)
    # imported when used, not at the top: they load fsspec, numpy, pyarrow (start-up time)
    from fedray.timing import fedscale
    from fedray.timing.traces import write_availability_trace, write_device_trace

    if kind == "devices":
        factor = fedscale.TRAIN_FACTOR if train_factor is None else train_factor
        table = fedscale.from_fedscale_devices(source, order=order, train_factor=factor)
        write_device_trace(table, out)
        fallback = table.column("source_key").null_count
        what = f"{table.num_rows:,} devices" + (
            f" ({fallback:,} with FedScale's fallback profile: no entry under their key)"
            if fallback else "")
        written = "device trace"
    else:
        table = fedscale.from_fedscale_availability(source, order=order)
        write_availability_trace(table, out)
        never = table.column("start_s").null_count
        clients = len(set(table.column("client_id").to_pylist()))
        what = (f"{clients:,} clients, {table.num_rows - never:,} online intervals"
                + (f", {never:,} clients never online" if never else ""))
        written = "availability trace"
    return (f"done: {what}, from FedScale's {mask(source)} (order {order}); {written} at "
            f"{mask(out)}")


# --- describing --------------------------------------------------------------------------

def _duration(s: float) -> str:
    if s >= 3600:
        return f"{s / 3600:.3g} h"
    if s >= 60:
        return f"{s / 60:.3g} min"
    return f"{s:.3g} s"


def describe_trace(url: str) -> str:
    """What the trace at ``url`` holds, checked as a run checks it; the kind is told by the
    columns (a table with both kinds' columns is refused rather than guessed)."""
    # imported when used, not at the top: it loads fsspec, numpy, pyarrow (start-up time)
    from fedray.timing.traces import AVAILABILITY_COLUMNS, DEVICE_COLUMNS, read_table

    table = read_table(url)
    cols = set(table.column_names)
    is_device = set(DEVICE_COLUMNS[1:]) <= cols
    is_availability = set(AVAILABILITY_COLUMNS[1:]) <= cols
    if is_device == is_availability:
        both = "both a device and an availability trace's" if is_device else \
            "neither a device nor an availability trace's"
        raise FedrayError(f"{url}: has {both} columns (device: {', '.join(DEVICE_COLUMNS)}; "
                          f"availability: {', '.join(AVAILABILITY_COLUMNS)}[, period_s]); "
                          f"it has: {', '.join(table.column_names) or 'none'}")
    lines = [f"trace:        {mask(url)}"]
    lines += _describe_devices(table, url) if is_device else _describe_availability(table, url)
    known = set(DEVICE_COLUMNS if is_device else (*AVAILABILITY_COLUMNS, "period_s"))
    other = [c for c in table.column_names if c not in known]
    if other:
        lines.append(f"other columns: {', '.join(other)} (kept, ignored by runs)")
    return "\n".join(lines)


def _describe_devices(table: Any, url: str) -> list[str]:
    import numpy as np

    # imported when used, not at the top: it loads fsspec, numpy, pyarrow (start-up time)
    from fedray.timing.traces import device_trace

    trace = device_trace(table, url)
    n = trace.rows
    qs = (0, 5, 50, 95, 100)
    rows = [("compute s/example", trace.compute_s_per_example),
            ("download bytes/s", trace.down_bytes_per_s),
            ("upload bytes/s", trace.up_bytes_per_s)]
    lines = [f"kind:         device trace, {n:,} devices (client c of a run takes row "
             f"c % {n:,})",
             f"{'':20}" + "".join(f"{h:>11}" for h in ("min", "p5", "median", "p95", "max"))]
    for name, values in rows:
        p = np.percentile(values, qs)
        lines.append(f"{name:20}" + "".join(f"{v:>11.4g}" for v in p))
    spread = np.percentile(trace.compute_s_per_example, [5, 95])
    lines.append(f"spread:       the p95 device computes {spread[1] / spread[0]:.3g}x slower "
                 f"than the p5 one")
    return lines


def _describe_availability(table: Any, url: str) -> list[str]:
    import numpy as np

    # imported when used, not at the top: it loads fsspec, numpy, pyarrow (start-up time)
    from fedray.timing.traces import availability_trace

    trace = availability_trace(table, url)
    n = trace.rows
    counts = np.diff(trace.offsets)
    row = np.repeat(np.arange(n), counts)
    length = trace.ends - trace.starts
    online = np.bincount(row, weights=length, minlength=n)
    periodic = ~np.isnan(trace.periods)
    absolute_end = float(trace.ends[~periodic[row]].max()) if (~periodic[row]).any() else 0.0
    lines = [f"kind:         availability trace, {table.num_rows:,} rows, {n:,} clients "
             f"(client c of a run takes row c % {n:,})"]
    if periodic.all():
        lo, hi = float(trace.periods.min()), float(trace.periods.max())
        times = (f"repeating every {lo:g} s ({_duration(lo)})" if lo == hi else
                 f"repeating, periods {lo:g} s to {hi:g} s")
        base = np.where(periodic, trace.periods, 1.0)
        over = "of its period"
    else:
        times = (f"absolute, windows up to {absolute_end:g} s ({_duration(absolute_end)})"
                 if not periodic.any() else
                 f"mixed: {int(periodic.sum()):,} clients repeating, "
                 f"{int((~periodic).sum()):,} absolute (up to {absolute_end:g} s)")
        base = np.where(periodic, trace.periods, max(absolute_end, 1e-300))
        over = (f"of [0, {absolute_end:g}) s" if not periodic.any() else
                f"of its period or, absolute, of [0, {absolute_end:g}) s")
    lines.append(f"times:        {times}")
    never = int((counts == 0).sum())
    lines.append(f"never online: {never:,} of {n:,} clients")
    if never == n:
        return lines
    frac = online / base
    lines.append(f"online time:  per client mean {frac.mean():.1%} {over} (median "
                 f"{np.median(frac):.1%}, p5 {np.percentile(frac, 5):.1%}, p95 "
                 f"{np.percentile(frac, 95):.1%})")
    # a repeating row's interval ending at the period and its first starting at 0 are one
    # window across the wrap (as the run reads them)
    first, last = trace.offsets[:-1], trace.offsets[1:] - 1
    has = counts > 1
    wraps = np.zeros(n, dtype=bool)
    wraps[has] = periodic[has] & (trace.starts[first[has]] == 0) & \
        (trace.ends[last[has]] == trace.periods[has])
    windows = counts - wraps
    lines.append(f"windows:      mean length {_duration(float(online.sum() / windows.sum()))}; "
                 f"{windows[counts > 0].mean():.3g} per online client"
                 + (" per period" if periodic.all() else ""))
    span = max(float(np.nanmax(trace.periods)) if periodic.any() else 0.0, absolute_end)
    ids = np.arange(n)
    share = np.array([trace.online(ids, t).mean()
                      for t in np.arange(SHARE_TIMES) * (span / SHARE_TIMES)])
    lines.append(f"online share: mean {share.mean():.1%} of clients online (min "
                 f"{share.min():.1%}, max {share.max():.1%}) at {SHARE_TIMES} evenly spaced "
                 f"times in [0, {span:g}) s")
    return lines
