"""``fedray report``: the tables and plots of a paper reproduction, from finished runs.

A method is rarely judged on one run: papers report a curve per method (accuracy against
rounds) with a band over seeds, and a table of final/best accuracy and rounds to reach a
target. This module groups run directories into methods -- by default by every config key
whose value differs between the runs, less the seed and the keys that cannot change what a
run computes (REPEAT_KEYS), so that runs with different settings are never averaged as
seeds of one -- treats the runs of a group as repetitions, and writes ``report.md``,
``report.csv``, ``report.json`` and ``<metric>.png``; for runs with per-client evaluation
tables (``client_eval/``) also the distribution over clients at the final round
(``client_<metric>_cdf.png`` and a table). Run directories are read and the report is
written through fsspec, so both can live anywhere ``fedray run`` can write (a local path,
s3://, ...).

Cross-device methods are compared at equal time rather than equal rounds (a FedBuff "round"
is not a synchronous one), so the x axis can also be a run's simulated time (``sim_time_s``,
runs with ``clock.enabled``) or its wall time (``elapsed_s``), and every run can be cut at
one x value (``until``): its final, best and target are then read at that budget.

A sweep asks a different question: how does a method's metric change with a swept value
(participation, a learning rate), and at which point of training? ``vs`` draws that: a line
per method against the values of one config key, at chosen rounds and at each run's best,
so that an effect that shows at round 20 and is gone by round 30 is seen in one figure
instead of a pivot the user writes by hand.
"""

from __future__ import annotations

import csv
import io
import json
import math
import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import yaml

from fedray.config import flat_keys
from fedray.errors import FedrayError, one_line
from fedray.state.redact import mask
from fedray.state.storage import check_writable, filesystem, write_atomic
from fedray.state.sweep_dir import FINISHED, PLAN_FILE, TRIALS_DIR
from fedray.tracking.figures import plain_text

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
REPORT_FILE = "report.md"
BAND = "band: min–max over seeds"
CLIENT_EVAL_DIR = "client_eval"  # fedray.state.run_dir's: client_eval/round_NNNNNN.arrow

# config keys in which the runs of one method may differ: the repetition itself (seed), what
# a run is called and where it wrote, how long it ran (the final round is reported) and how
# it was run, evaluated or checkpointed -- none changes the numbers of the rounds it ran
# (runtime.*: the pool size changes float64 sums by ~1e-16, docs/fault_tolerance.md). The
# default grouping uses every other key whose value differs between the runs; a group's
# runs may differ in no other key (check_repetitions)
REPEAT_KEYS = ("seed", "name", "rounds", "output.", "runtime.", "checkpoint.", "eval.every",
               "eval.batch_size", "data.verify", "data.open_shards")
ABSENT = "(absent)"  # a key one run's config lacks (written by another fedray version)

# --x: the metrics.jsonl key that holds a round's x value (at the round's end), the axis
# label and the table's shorter one
X_AXES = {"round": ("round", "round", "round"),
          "sim_time": ("sim_time_s", "simulated time", "sim time"),
          "wall_time": ("elapsed_s", "wall time", "wall time")}
# a time axis is shown in hours once some run's end (cut at until) reaches this: below, a
# curve's few thousand seconds read better as seconds; above, hours are the unit people think in
HOURS_FROM_S = 7200.0

# the look of a plot's i-th line: colour alone does not tell 9 curves apart (nor survives a
# grey-scale print or a colour-blind reader), so every line also gets its own pair of line
# style and marker. Style j % 4 with marker (j + j // 20) % 10 gives all 40 pairs once (the
# first 20 by the Chinese remainder theorem, the next 20 shifted by one marker); after 40
# they repeat
LINE_STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
STYLES = tuple((LINE_STYLES[j % len(LINE_STYLES)], MARKERS[(j + j // 20) % len(MARKERS)])
               for j in range(len(LINE_STYLES) * len(MARKERS)))
MARKS_PER_LINE = 10  # markers on a long curve: enough to tell lines apart, not a smear


@dataclass
class Run:
    """One run directory as the report sees it: where it is, its config, its metric records."""

    url: str
    config: dict
    metrics: list[dict]


@dataclass
class RunResult:
    """The per-run numbers of a report (one row of report.json)."""

    run: Run
    group: str
    seed: Any
    series: dict[int, float]  # round -> metric value, for the rounds that have the metric
    final: float
    final_round: int
    best: float
    best_round: int
    rounds_to_target: int | None
    # the x values (X_AXES; the round itself for round) at the end of the rounds in series,
    # at the run's last record, at final_round and at rounds_to_target
    x: dict[int, float] = field(default_factory=dict)
    end_x: float = 0.0
    final_x: float = 0.0
    x_to_target: float | None = None


@dataclass
class Group:
    """The runs of one method: same values of the group-by keys."""

    label: str
    keys: dict[str, Any]
    results: list[RunResult] = field(default_factory=list)


@dataclass
class Report:
    """What ``build_report`` wrote: the Markdown table, the keys the runs were grouped by
    and how they were chosen (the line report.md and ``fedray report`` print)."""

    table: str
    group_by: list[str]
    grouping: str
    files: list[str]
    vs_table: str | None = None  # with vs: the metric against the key, per method


def _join(path: str, name: str) -> str:
    return f"{path.rstrip('/')}/{name}"


def load_run(url: str) -> Run:
    """Read ``config.yaml`` and ``metrics.jsonl`` of the run directory at ``url`` (any fsspec
    URL), failing with one line that names the file (and line) when it is not a run directory.

    Only these two files are read: a run that is still going, or one that crashed before its
    summary, can still be reported (its final round shows it).
    """
    fs, path = filesystem(url, "run directory", what=None)
    if not fs.exists(path):
        raise FedrayError(f"run directory {url} does not exist")
    if not fs.isdir(path):
        raise FedrayError(f"run directory {url} is not a directory")
    for name in (CONFIG_FILE, METRICS_FILE):
        if not fs.isfile(_join(path, name)):
            raise FedrayError(f"{_join(url, name)} not found: {url} is not a fedray run "
                              "directory")
    cfg_url = _join(url, CONFIG_FILE)
    with fs.open(_join(path, CONFIG_FILE), "r") as f:
        try:
            config = yaml.safe_load(f)
        except yaml.YAMLError as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise FedrayError(f"{cfg_url} is not valid YAML: {first}") from None
    if not isinstance(config, dict):
        raise FedrayError(f"{cfg_url} is not a mapping of config keys")
    metrics_url = _join(url, METRICS_FILE)
    metrics: list[dict] = []
    with fs.open(_join(path, METRICS_FILE), "r") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise FedrayError(f"{metrics_url} line {lineno}: not valid JSON "
                                  f"({exc.msg})") from None
            if not isinstance(record, dict):
                raise FedrayError(f"{metrics_url} line {lineno}: not a JSON object")
            rnd = record.get("round")
            if not isinstance(rnd, int) or isinstance(rnd, bool):
                raise FedrayError(f"{metrics_url} line {lineno}: no integer 'round'")
            metrics.append(record)
    return Run(url=url, config=config, metrics=metrics)


def sweep_trials(url: str) -> tuple[list[str], list[str]] | None:
    """The run directories of a sweep directory's finished trials (``fedray sweep``'s
    ``trials/<name>/``, in its ``trials.json`` order) and report.md's note on the trials left
    out; None when ``url`` is not a sweep directory. A trial stopped early, failed or still
    running is left out, as the sweep's own report/ leaves it: it would pull its setting's
    mean toward wherever it was cut."""
    fs, path = filesystem(url, "run directory", what=None)
    if fs.isfile(_join(path, CONFIG_FILE)) or not fs.isfile(_join(path, PLAN_FILE)):
        return None
    try:
        doc = json.loads(fs.cat_file(_join(path, PLAN_FILE)).decode())
        trials = [(str(e["trial"]), str(e["status"])) for e in doc["trials"]]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise FedrayError(f"{_join(url, PLAN_FILE)} is not fedray's record of a sweep's trials "
                          f"({type(exc).__name__})") from None
    done = [_join(_join(url, TRIALS_DIR), name) for name, status in trials if status == FINISHED]
    if not done:
        raise FedrayError(f"sweep directory {url}: none of its {len(trials)} trials has "
                          f"finished ({PLAN_FILE}); report it once some have")
    left = [f"`{name}` ({status})" for name, status in trials if status != FINISHED]
    notes = [f"from the sweep {url}: its {len(done)} finished trials; left out: "
             f"{', '.join(left)}"] if left else []
    return done, notes


def lower_is_better(metric: str) -> bool:
    """Losses and an attack's success go down, everything else (accuracies) goes up: decides
    "best" and the target."""
    return "loss" in metric.lower() or "attack_success" in metric.lower()


def _has(config: dict, key: str) -> bool:
    try:
        config_value(config, key)
    except KeyError:
        return False
    return True


def config_value(config: dict, key: str) -> Any:
    """The value of a dotted key (``algorithm.name``) in a config; KeyError when missing."""
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(key)
        node = node[part]
    return node


def parse_group_by(group_by: str | Sequence[str] | None,
                   what: str = "group-by") -> list[str] | None:
    """``"a.b,c"`` or ``["a.b", "c"]`` -> ``["a.b", "c"]``; None stays None (group by the
    keys that differ)."""
    if group_by is None:
        return None
    keys = group_by.split(",") if isinstance(group_by, str) else list(group_by)
    keys = [k.strip() for k in keys]
    if not keys or any(not k for k in keys):
        raise FedrayError(f"{what} {group_by!r}: give config keys separated by commas, "
                          "e.g. algorithm.name,sampling.clients_per_round")
    return keys


def _flat(config: dict) -> dict[str, Any]:
    return flat_keys(config)


def differing_keys(runs: Sequence[Run]) -> list[str]:
    """The config keys whose values differ between the runs, less REPEAT_KEYS, in the order
    they first appear in the runs' configs: the default group-by keys."""
    flat = [_flat(r.config) for r in runs]
    order = list(dict.fromkeys(k for f in flat for k in f))
    return [k for k in order if not _repeat_key(k)
            and any(f.get(k, ABSENT) != flat[0].get(k, ABSENT) for f in flat)]


def series(run: Run, metric: str) -> dict[int, float]:
    """round -> value of ``metric``, over the rounds whose record has it (null values skipped).
    """
    out: dict[int, float] = {}
    for rec in run.metrics:
        if rec.get(metric) is None:
            continue
        v = rec[metric]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise FedrayError(f"{_join(run.url, METRICS_FILE)} round {rec['round']}: "
                              f"{metric} is not a number ({v!r})")
        out[rec["round"]] = float(v)
    return dict(sorted(out.items()))


def x_values(run: Run, x: str) -> dict[int, float]:
    """round -> the run's x value at the end of that round, for every record: the round
    itself, ``sim_time_s`` (x ``sim_time``) or ``elapsed_s`` (x ``wall_time``).

    A run without ``sim_time_s`` ran without the clock and has no simulated time to plot;
    sim_time_s never goes back (a resumed run continues its clock). elapsed_s does: a
    resumed run's restarts at 0, so each restart is counted on from the value before it
    (the rounds' wall time, less the time between a crash and its resume).
    """
    if x == "round":
        return {rec["round"]: float(rec["round"]) for rec in run.metrics}
    key = X_AXES[x][0]
    url = _join(run.url, METRICS_FILE)
    out: dict[int, float] = {}
    offset, prev = 0.0, None
    for rec in run.metrics:
        r, v = rec["round"], rec.get(key)
        if v is None:
            if x == "sim_time":
                raise FedrayError(f"--x sim_time: run {run.url} has no sim_time_s (round {r} "
                                  f"of {METRICS_FILE}): it ran without clock.enabled: true; "
                                  "report it with --x round")
            raise FedrayError(f"--x {x}: {url} round {r} has no {key}")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise FedrayError(f"{url} round {r}: {key} is not a finite number ({v!r})")
        v = float(v)
        if prev is not None and v < prev:
            if x == "sim_time":
                raise FedrayError(f"{url} round {r}: sim_time_s goes back ({v:g} after "
                                  f"{prev:g}); simulated time only goes forward")
            offset += prev  # a resume: its elapsed_s counts from its own start
        prev = v
        out[r] = offset + v
    return out


def rounds_to_target(values: dict[int, float], target: float, lower: bool) -> int | None:
    """The first round whose value reaches ``target`` (<= when lower is better, else >=)."""
    for rnd, v in values.items():
        if (v <= target) if lower else (v >= target):
            return rnd
    return None


def _available(runs: Sequence[Run]) -> list[str]:
    return sorted({k for r in runs for rec in r.metrics for k in rec if k != "round"})


def _mean_std(values: Sequence[float]) -> tuple[float | None, float | None]:
    """Mean and population std (ddof=0) over runs; (None, None) when there are none."""
    if not values:
        return None, None
    a = np.asarray(values, dtype=float)
    return float(a.mean()), float(a.std(ddof=0))


def _fmt(values: Sequence[float], decimals: int) -> str:
    mean, std = _mean_std(values)
    if mean is None:
        return "—"
    if len(values) == 1:
        return f"{mean:.{decimals}f}"
    return f"{mean:.{decimals}f} ± {std:.{decimals}f}"


def _fmt_seed(seed: Any) -> str:
    return "?" if seed is None else str(seed)


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|")


def _value_id(value: Any) -> str:
    """A hashable identity for a config value (lists and mappings included), as its text
    shows it: 1 and 1.0 are two settings, as the runs' configs wrote them."""
    return repr(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)


def _absent(value: Any) -> bool:
    return isinstance(value, str) and value == ABSENT


def value_order(values: Sequence[Any]) -> list[Any]:
    """The distinct values in the order a report shows them: absent first (the setting
    without the option, usually the baseline), then numbers in numeric order (5 < 10 <
    20, where their text would give 10, 20, 5), then anything else in the order given
    (algorithm names have no order but the one the user chose)."""
    distinct = list({_value_id(v): v for v in values}.values())
    ranks = {_value_id(v): i for i, v in enumerate(distinct)}
    return sorted(distinct, key=lambda v: _sort_key(v, ranks))


def _sort_key(value: Any, ranks: dict[str, int]) -> tuple[int, float, int]:
    if _absent(value):
        return (0, 0.0, 0)
    if _is_number(value):
        return (1, float(value), 0)
    return (2, 0.0, ranks[_value_id(value)])


def order_groups(groups: Sequence[Group], keys: Sequence[str]) -> list[Group]:
    """Groups sorted by their values of ``keys``, key by key (``value_order`` within a key;
    groups given in the order their first run appears): one order for every table, legend
    and axis of a report."""
    ranks = {}
    for k in keys:
        seen = [g.keys[k] for g in groups]
        ranks[k] = {_value_id(v): i for i, v in
                    enumerate({_value_id(v): v for v in seen}.values())}
    return sorted(groups, key=lambda g: tuple(_sort_key(g.keys[k], ranks[k]) for k in keys))


def group_labels(groups: Sequence[Group], keys: Sequence[str], names: bool = True
                 ) -> list[str]:
    """Each group's label: its ``key=value`` pairs for the keys whose values differ between
    the groups and that the group sets -- a key every group shares says nothing about one,
    and ``algorithm.fedprox.mu=(absent)`` on a FedAvg line only says FedAvg has no mu. A
    group that sets none of them is ``KEY unset``. With ``names`` (keys the report chose,
    not the user), after the runs' ``name`` when each group's runs share one and the names
    tell the groups apart (``fedprox (algorithm.name=fedprox)``); the runs' name (or names)
    alone when there are no keys (one method)."""
    if not keys:
        all_names = sorted({str(r.run.config.get("name")) for g in groups for r in g.results})
        return [" / ".join(all_names[:3]) + (" / ..." if len(all_names) > 3 else "")
                for _ in groups]
    shown = [k for k in keys if len({_value_id(g.keys[k]) for g in groups}) > 1] \
        if len(groups) > 1 else list(keys)
    run_names = [{str(r.run.config.get("name")) for r in g.results} for g in groups]
    # a name per group, and a different one for each group: the user's own words for it
    named = names and len(groups) > 1 and all(len(n) == 1 for n in run_names) and len(
        {next(iter(n)) for n in run_names}) == len(groups)
    labels = []
    for g, name in zip(groups, run_names, strict=True):
        pairs = ", ".join(f"{k}={g.keys[k]}" for k in shown if not _absent(g.keys[k]))
        if named:
            labels.append(f"{next(iter(name))} ({pairs})" if pairs else next(iter(name)))
        else:
            labels.append(pairs or ", ".join(f"{k} unset" for k in shown))
    return labels


def group_runs(runs: Sequence[Run], metric: str, group_by: list[str] | None,
               target: float | None, allow_differing: Sequence[str] = (), *,
               x: str = "round", until: float | None = None,
               order: Sequence[str] | None = None) -> list[Group]:
    """Runs -> groups (methods) with per-run numbers, sorted by their values of the group-by
    keys (``order_groups``; ``order``: those keys in another order of precedence).
    ``group_by`` None: by the keys that differ between the runs (``differing_keys``).
    ``x``: a key of X_AXES; ``until``: keep only the values evaluated at or before this x
    value (every per-run number is then read at that budget)."""
    if not any(r.metrics and any(rec.get(metric) is not None for rec in r.metrics)
               for r in runs):
        raise FedrayError(f"metric {metric!r} is in no run's {METRICS_FILE}; available: "
                          f"{', '.join(_available(runs)) or 'none'}")
    lower = lower_is_better(metric)
    auto = group_by is None
    by = differing_keys(runs) if auto else group_by
    for key in () if auto else by:  # a named key some runs lack (a sweep's per-method key,
        # algorithm.fedprox.mu on FedAvg's runs) is (absent) there; one no run has, a typo
        if not any(_has(run.config, key) for run in runs):
            raise FedrayError(f"group-by key {key!r} is not in "
                              f"{_join(runs[0].url, CONFIG_FILE)} (nor in any other run's)")
    cells: dict[tuple[str, ...], Group] = {}
    for run in runs:
        keys = {}
        for key in by:
            try:
                keys[key] = config_value(run.config, key)
            except KeyError:
                keys[key] = ABSENT
        values = series(run, metric)
        if not values:
            raise FedrayError(f"{_join(run.url, METRICS_FILE)} has no {metric!r} values; "
                              f"available there: {', '.join(_available([run])) or 'none'}")
        xs = x_values(run, x)
        if until is not None:
            first = xs[min(values)]
            values = {r: v for r, v in values.items() if xs[r] <= until}
            if not values:
                key = X_AXES[x][0]
                raise FedrayError(f"{_join(run.url, METRICS_FILE)} has no {metric!r} value at "
                                  f"or before --until {until:g} ({key}); its first is at "
                                  f"{key} {first:g}")
        final_round = max(values)
        pick = min if lower else max
        best = pick(values.values())
        best_round = next(r for r, v in values.items() if v == best)
        rtt = None if target is None else rounds_to_target(values, target, lower)
        result = RunResult(
            run=run, group="", seed=run.config.get("seed"), series=values,
            final=values[final_round], final_round=final_round, best=best,
            best_round=best_round, rounds_to_target=rtt,
            x={r: xs[r] for r in values}, end_x=xs[max(xs)], final_x=xs[final_round],
            x_to_target=None if rtt is None else xs[rtt])
        cell = tuple(_value_id(v) for v in keys.values())
        cells.setdefault(cell, Group(label="", keys=keys)).results.append(result)
    groups = order_groups(list(cells.values()), by if order is None else order)
    for group, label in zip(groups, group_labels(groups, by, auto), strict=True):
        group.label = mask(label)  # config values, shown in plots and tables
        for result in group.results:
            result.group = group.label
    for group in groups:
        check_repetitions(group, by, allow_differing)
    return groups


def _matches(key: str, patterns: Sequence[str]) -> bool:
    """``key`` is one of ``patterns``, or under one ending in ``.`` (``runtime.``)."""
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in patterns)


def _repeat_key(key: str) -> bool:
    return _matches(key, REPEAT_KEYS)


def check_repetitions(group: Group, group_by: list[str] | None,
                      allow_differing: Sequence[str] = ()) -> None:
    """Refuse a group whose runs are not repetitions of one method: averaging runs with
    different learning rates as if they were seeds of one would report a method nobody ran.
    Names the first keys that differ and the runs that differ in them. ``allow_differing``:
    keys (or ``prefix.``) the user lets differ within a group (``--allow-differing``)."""
    if len(group.results) < 2:
        return
    flat = [_flat(r.run.config) for r in group.results]
    allowed = [k.rstrip("*") for k in allow_differing]
    keys = sorted({k for f in flat for k in f if not _repeat_key(k)
                   and not _matches(k, allowed)
                   and any(g.get(k) != flat[0].get(k) for g in flat)})
    if not keys:
        return
    k = keys[0]
    other = next(i for i, g in enumerate(flat) if g.get(k) != flat[0].get(k))
    runs = group.results
    more = f" (and {', '.join(keys[1:4])}{', ...' if len(keys) > 4 else ''})" if len(keys) > 1 \
        else ""
    by = ",".join([*(group_by or []), *keys[:3]])
    raise FedrayError(f"the runs grouped as {group.label!r} are not repetitions of one method: "
                      f"they differ in {k}{more} ({runs[0].run.url}: {flat[0].get(k)!r}, "
                      f"{runs[other].run.url}: {flat[other].get(k)!r}); group them apart, "
                      f"e.g. --group-by {by}, or average them anyway with --allow-differing "
                      f"{','.join(keys)}")


def curve(group: Group) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rounds common to all runs of the group, and the mean, min and max over runs there."""
    common = set.intersection(*(set(r.series) for r in group.results))
    rounds = np.asarray(sorted(common), dtype=int)
    if not len(rounds):
        empty = np.zeros(0)
        return rounds, empty, empty, empty
    v = np.asarray([[r.series[int(x)] for x in rounds] for r in group.results], dtype=float)
    return rounds, v.mean(axis=0), v.min(axis=0), v.max(axis=0)


def step_values(xs: np.ndarray, values: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """One run's metric at each point t of ``grid``: the value of its last evaluation at or
    before t (``xs`` sorted; of evaluations at one x, the later round's). A step function,
    not an interpolation: between two evaluations the only model anyone measured is the
    earlier one, and a line between them would invent values nobody evaluated."""
    idx = np.searchsorted(xs, grid, side="right") - 1
    if len(idx) and idx.min() < 0:
        raise ValueError("a grid point lies before the run's first evaluation")
    return values[idx]


def run_end(result: RunResult, until: float | None) -> float:
    """How far a run's step function reaches: its last record's x, cut at ``until``."""
    return result.end_x if until is None else min(result.end_x, until)


def time_curve(group: Group, until: float | None = None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The group's runs on a common time grid, and the mean, min and max over runs there.

    Seeds of one method evaluate at different times, so there is no common x to average at
    (as rounds are for ``curve``): each run's step function (``step_values``) is read on the
    union of the group's evaluation times from the latest first evaluation (before it some
    run has no value) to the earliest run end (after it some run has stopped), both ends
    included; between two grid points no run's value changes, so the mean is exact there
    too, and is drawn as a step."""
    runs = group.results
    xs = [np.asarray([r.x[k] for k in r.series], dtype=float) for r in runs]
    vs = [np.asarray(list(r.series.values()), dtype=float) for r in runs]
    lo = max(float(a[0]) for a in xs)
    hi = min(run_end(r, until) for r in runs)
    if lo > hi:
        empty = np.zeros(0)
        return empty, empty, empty, empty
    grid = np.unique(np.concatenate([*(a[(a >= lo) & (a <= hi)] for a in xs), [lo, hi]]))
    v = np.stack([step_values(a, b, grid) for a, b in zip(xs, vs, strict=True)])
    return grid, v.mean(axis=0), v.min(axis=0), v.max(axis=0)


def time_unit(groups: Sequence[Group], until: float | None) -> tuple[float, str]:
    """Seconds, or hours once some run's end (cut at until) reaches HOURS_FROM_S: one unit
    for the plot and the table, so that they read alike."""
    end = max(run_end(r, until) for g in groups for r in g.results)
    return (3600.0, "h") if end >= HOURS_FROM_S else (1.0, "s")


def _rows(groups: Sequence[Group], target: float | None, x: str = "round"
          ) -> list[dict[str, Any]]:
    rows = []
    for g in groups:
        res = g.results
        final_mean, final_std = _mean_std([r.final for r in res])
        best_mean, best_std = _mean_std([r.best for r in res])
        row: dict[str, Any] = {"method": g.label, **g.keys, "runs": len(res),
                               "seeds": ", ".join(_fmt_seed(r.seed) for r in res),
                               "final_mean": final_mean, "final_std": final_std,
                               "best_mean": best_mean, "best_std": best_std}
        if target is not None:
            reached = [r.rounds_to_target for r in res if r.rounds_to_target is not None]
            rtt_mean, rtt_std = _mean_std(reached)
            row.update(rounds_to_target_mean=rtt_mean, rounds_to_target_std=rtt_std,
                       reached=len(reached))
            if x != "round":
                ttt = [r.x_to_target for r in res if r.x_to_target is not None]
                row[f"{x}_to_target_s_mean"], row[f"{x}_to_target_s_std"] = _mean_std(ttt)
        row["final_round_min"] = min(r.final_round for r in res)
        row["final_round_max"] = max(r.final_round for r in res)
        if x != "round":
            row[f"final_{x}_s_mean"], row[f"final_{x}_s_std"] = _mean_std(
                [r.final_x for r in res])
        rows.append(row)
    return rows


def markdown_table(groups: Sequence[Group], metric: str, target: float | None,
                   x: str = "round", unit: tuple[float, str] = (1.0, "s")) -> str:
    """The report table: one row per group, mean ± std over its runs; with a time ``x``
    also the time to target and the final value's time, in ``unit`` (seconds, or hours)."""
    lower = lower_is_better(metric)
    timed = x != "round"
    scale, name = unit
    decimals = 2 if name == "h" else 1
    head = ["method", "runs", "seeds", f"final {metric}", f"best {metric}"]
    if target is not None:
        head.append(f"rounds to {'≤' if lower else '≥'} {target:g}")
        if timed:
            head.append(f"{X_AXES[x][2]} to {'≤' if lower else '≥'} {target:g} ({name})")
    head.append("final round")
    if timed:
        head.append(f"final {X_AXES[x][2]} ({name})")
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for g in groups:
        res = g.results
        cells = [_md_cell(g.label), str(len(res)),
                 _md_cell(", ".join(_fmt_seed(r.seed) for r in res)),
                 _fmt([r.final for r in res], 4), _fmt([r.best for r in res], 4)]
        if target is not None:
            reached = [r.rounds_to_target for r in res if r.rounds_to_target is not None]
            cells.append(f"{_fmt(reached, 1)} ({len(reached)}/{len(res)} reached)")
            if timed:
                cells.append(_fmt([r.x_to_target / scale for r in res
                                   if r.x_to_target is not None], decimals))
        lo, hi = min(r.final_round for r in res), max(r.final_round for r in res)
        cells.append(str(lo) if lo == hi else f"{lo}–{hi}")
        if timed:
            cells.append(_fmt([r.final_x / scale for r in res], decimals))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def line_style(i: int) -> dict[str, Any]:
    """The i-th line's colour, line style and marker (STYLES): told apart without colour."""
    linestyle, marker = STYLES[i % len(STYLES)]
    return {"color": f"C{i % 10}", "linestyle": linestyle, "marker": marker}


def _mark_every(i: int, points: int) -> tuple[int, int] | None:
    """Markers on at most MARKS_PER_LINE of a line's points, each line starting at another
    offset so that the markers of lines that share x values do not cover each other."""
    step = max(1, math.ceil(points / MARKS_PER_LINE))
    return None if step == 1 else (i % step, step)


def legend_outside(ax: Any, **kwargs: Any) -> None:
    """The legend to the right of ``ax``, outside it: inside, a legend of many lines covers
    the curves it names. The PNG is cut to its contents (``_png``), legend included."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0,
                  fontsize="small", title_fontsize="small", **kwargs)


def _png(fig: Any) -> bytes:
    """The figure as PNG bytes at dpi 120, cut to what is drawn (the legend outside the
    axes included), then closed."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    finally:
        plt.close(fig)
    return buf.getvalue()


def curves_figure(groups: Sequence[Group], metric: str, target: float | None,
                  title: str, x: str = "round", until: float | None = None,
                  unit: tuple[float, str] = (1.0, "s")) -> tuple[Any, list[str]]:
    """The metric against rounds, a line per group (mean, min-max band), as a matplotlib
    figure, and the labels of groups with no common round (not drawn); against a time
    ``x``, each group's ``time_curve`` as steps, in ``unit``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    skipped = []
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for i, g in enumerate(groups):
        style = line_style(i)
        if x != "round":
            grid, mean, lo, hi = time_curve(g, until)
            if not len(grid):
                skipped.append(g.label)
                continue
            t = grid / unit[0]
            ax.step(t, mean, where="post", markersize=4, markevery=_mark_every(i, len(t)),
                    label=f"{g.label} (n={len(g.results)})", **style)
            ax.fill_between(t, lo, hi, step="post", color=style["color"], alpha=0.2,
                            linewidth=0)
            continue
        rounds, mean, lo, hi = curve(g)
        if not len(rounds):
            skipped.append(g.label)
            continue
        ax.plot(rounds, mean, markersize=4, markevery=_mark_every(i, len(rounds)),
                label=f"{g.label} (n={len(g.results)})", **style)
        ax.fill_between(rounds, lo, hi, color=style["color"], alpha=0.2, linewidth=0)
    if target is not None:
        ax.axhline(target, color="black", linestyle="--", linewidth=1, label=f"target {target:g}")
    if x == "round":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("round")
    else:
        ax.set_xlabel(f"{X_AXES[x][1]} ({unit[1]})")
    ax.set_ylabel(metric)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    legend_outside(ax, title=f"mean; {BAND}")
    return fig, skipped


def _plot_png(groups: Sequence[Group], metric: str, target: float | None,
              title: str, x: str = "round", until: float | None = None,
              unit: tuple[float, str] = (1.0, "s")) -> tuple[bytes, list[str]]:
    """``curves_figure`` as PNG bytes, and the labels of the groups it left out."""
    fig, skipped = curves_figure(groups, metric, target, title, x, until, unit)
    return _png(fig), skipped


def _csv_text(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    fields = list(dict.fromkeys(k for row in rows for k in row))
    w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    w.writeheader()
    for row in rows:
        w.writerow({k: "" if row.get(k) is None else row[k] for k in fields})
    return buf.getvalue()


def _json_safe(obj: Any) -> Any:
    """NaN (a diverged run) -> null, so that report.json stays strict JSON."""
    if isinstance(obj, float) and math.isnan(obj):
        return None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_json_safe(v) for v in obj]
    return obj


def plot_file_name(metric: str) -> str:
    """``<metric>.png``, with characters that do not belong in a file name replaced."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", metric) + ".png"


# ---- the distribution over clients (runs with per-client evaluation, client_eval/) ----

_TABLE = re.compile(r"round_(\d+)\.arrow$")


@dataclass
class ClientGroup:
    """The per-client values of a group's runs at their final (or a chosen) round, pooled:
    one value per client with test data per run. ``values``: column -> values, for the
    metric's column and, where the tables have it, its personalized one; ``rounds``: the
    round used of each run that has tables (``runs`` of them)."""

    label: str
    rounds: list[int]
    values: dict[str, np.ndarray]
    runs: int


def client_rounds(run: Run) -> dict[int, str]:
    """round -> URL of the run's per-client tables (``client_eval/round_NNNNNN.arrow``)."""
    fs, path = filesystem(run.url, "run directory", what=None)
    folder = _join(path, CLIENT_EVAL_DIR)
    if not fs.isdir(folder):
        return {}
    out = {}
    for p in fs.ls(folder, detail=False):
        m = _TABLE.search(p.rsplit("/", 1)[-1])
        if m:
            out[int(m.group(1))] = _join(_join(run.url, CLIENT_EVAL_DIR), m.group(0))
    return dict(sorted(out.items()))


# the columns a per-client table may hold beside a metric's, and how plots name them: the
# global model's (a personalization preset's table, whose plain columns are each client's
# own model) and the fine-tuned copies' (eval.personalize)
BESIDE = ("global_", "personalized_")
BESIDE_LABEL = {"global_": " (global model)", "personalized_": " (personalized)"}


def client_values(url: str, metric: str) -> dict[str, np.ndarray]:
    """``metric``'s column of one per-client table, and ``global_<metric>``'s and
    ``personalized_<metric>``'s when the table has them, over the clients with test data
    (``count`` > 0: a client without any has no accuracy); one line naming the file and
    the column when the table cannot be read or lacks it."""
    import pyarrow as pa

    fs, path = filesystem(url, "client table", what=None)
    try:
        with fs.open(path, "rb") as f:
            table = pa.ipc.open_file(pa.BufferReader(f.read())).read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise FedrayError(f"{url} is not an Arrow IPC file: {first}") from None
    for name in ("count", metric):
        if name not in table.column_names:
            raise FedrayError(f"{url} has no column {name!r} (columns: "
                              f"{', '.join(table.column_names)})")
    has = table.column("count").to_numpy(zero_copy_only=False) > 0
    columns = [metric]
    if not metric.startswith(BESIDE):  # the global model's, the fine-tuned copies'
        columns += [f"{p}{metric}" for p in BESIDE if f"{p}{metric}" in table.column_names]
    return {c: table.column(c).to_numpy(zero_copy_only=False).astype(np.float64)[has]
            for c in columns}


def client_groups(groups: Sequence[Group], metric: str, round_: int | None
                  ) -> tuple[list[ClientGroup], list[str]]:
    """Per group, the pooled per-client ``metric`` (and ``global_<metric>`` and
    ``personalized_<metric>`` where the tables have them) at each run's last table round
    (or ``round_``), and the URLs of the runs without per-client tables (left out). Groups
    none of whose runs has a table are left out; ([], ...) when no run has one."""
    out: list[ClientGroup] = []
    missing: list[str] = []
    for g in groups:
        rounds, pooled, runs = [], {}, 0
        for res in g.results:
            tables = client_rounds(res.run)
            if not tables:
                missing.append(res.run.url)
                continue
            r = max(tables) if round_ is None else round_
            if r not in tables:
                raise FedrayError(f"{_join(res.run.url, CLIENT_EVAL_DIR)} has no table of "
                                  f"round {r} (rounds with one: "
                                  f"{', '.join(map(str, tables))})")
            for column, values in client_values(tables[r], metric).items():
                pooled.setdefault(column, []).append(values)
            rounds.append(r)
            runs += 1
        if runs:
            out.append(ClientGroup(label=g.label, rounds=rounds, runs=runs,
                                   values={k: np.concatenate(v) for k, v in pooled.items()}))
    return out, missing


def client_summary(values: np.ndarray, metric: str) -> dict[str, float]:
    """Clients, mean, the 10th percentile (90th for a loss: the bad tail) and the worst-10%
    mean, as the ``clients_*`` keys of metrics.jsonl compute them (fedray.tracking
    .client_eval.client_stats)."""
    # imported when used, not at the top: it loads pyarrow (start-up time)
    from fedray.tracking.client_eval import client_stats

    higher = not lower_is_better(metric)
    stats = client_stats(values, "s", higher_is_better=higher)
    tail = "p10" if higher else "p90"
    return {"clients": len(values), "mean": stats.get("s_mean"), tail: stats.get(f"s_{tail}"),
            "worst10": stats.get("s_worst10")}


def client_table(cgroups: Sequence[ClientGroup], metric: str) -> str:
    """The report.md table: per group and column, clients, mean, p10 and worst-10% mean."""
    columns = list(dict.fromkeys(c for g in cgroups for c in g.values))
    tail = "p10" if not lower_is_better(metric) else "p90"
    head = ["method", "runs", "round"]
    for c in columns:
        head += [f"{c}: clients", "mean", tail, "worst 10%"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for g in cgroups:
        lo, hi = min(g.rounds), max(g.rounds)
        cells = [_md_cell(g.label), str(g.runs), str(lo) if lo == hi else f"{lo}–{hi}"]
        for c in columns:
            if c not in g.values or not len(g.values[c]):
                cells += ["0", "—", "—", "—"]
                continue
            st = client_summary(g.values[c], metric)
            cells += [str(st["clients"]), f"{st['mean']:.4f}", f"{st[tail]:.4f}",
                      f"{st['worst10']:.4f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cdf_figure(cgroups: Sequence[ClientGroup], metric: str, title: str) -> Any:
    """The empirical CDF of the per-client metric, a line per group and column: a group's
    colour, each line its own line style and marker, hollow markers for the global model's
    and the fine-tuned copies' columns beside each client's own."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    n = 0
    for i, g in enumerate(cgroups):
        for column, values in g.values.items():
            if not len(values):
                continue
            x = np.sort(values)
            y = np.arange(1, len(x) + 1) / len(x)
            beside = next((p for p in BESIDE if column.startswith(p)
                           and not metric.startswith(p)), None)
            style = {**line_style(n), "color": f"C{i % 10}"}
            ax.step(x, y, where="post", markersize=4, markevery=_mark_every(n, len(x)),
                    markerfacecolor="none" if beside else style["color"],
                    label=f"{g.label}{BESIDE_LABEL.get(beside, '')} "
                          f"(n={len(values)})", **style)
            n += 1
    ax.set_xlabel(f"per-client {metric}")
    ax.set_ylabel("fraction of clients ≤ x")
    ax.set_ylim(0, 1)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    legend_outside(ax)
    return fig


def _cdf_png(cgroups: Sequence[ClientGroup], metric: str, title: str) -> bytes:
    """``cdf_figure`` as PNG bytes."""
    return _png(cdf_figure(cgroups, metric, title))


def client_plot_name(metric: str) -> str:
    """``client_<metric>_cdf.png``."""
    return plot_file_name(f"client_{metric}_cdf")


# ---- a metric against a swept config value (--vs KEY), at chosen rounds and the best ----

@dataclass
class Panel:
    """One view of the ``vs`` figure and one column of its table: the metric at a round
    (``round``), at each run's final round (``final``) or its best over rounds (``best``)."""

    title: str  # "round 20", "final", "best"
    column: str  # its report.csv prefix: round_20, final, best
    round: int | None = None

    def value(self, result: RunResult) -> float:
        if self.round is not None:
            return result.series[self.round]
        return result.final if self.column == "final" else result.best


@dataclass
class VsPoint:
    """One point of a method's line: its runs with one value of the key, and the metric of
    each (in the order of the command line) per panel column."""

    value: Any
    group: Group
    values: dict[str, list[float]]


@dataclass
class VsLine:
    """A method: the cells that share every group-by key but the swept one."""

    label: str
    keys: dict[str, Any]
    points: list[VsPoint]


def parse_at(at: str | Sequence[int] | None) -> list[int] | None:
    """``"10,20,30"`` (or a sequence of ints) -> ``[10, 20, 30]``, sorted, each once; one
    line when a part is not a positive integer."""
    if at is None:
        return None
    parts = at.split(",") if isinstance(at, str) else list(at)
    rounds = []
    for part in parts:
        if isinstance(part, int) and not isinstance(part, bool):
            r = part
        elif isinstance(part, str) and part.strip().isascii() and part.strip().isdigit():
            r = int(part.strip())
        else:
            r = 0
        if r < 1:
            shown = at if isinstance(at, str) else ",".join(map(str, parts))
            raise FedrayError(f"--at {shown}: give rounds as positive integers separated by "
                              "commas, e.g. --at 10,20,30")
        rounds.append(r)
    return sorted(set(rounds))


def rounds_text(rounds: Sequence[int], most: int = 8) -> str:
    """Sorted rounds in few words: ``5 to 30 every 5``, ``1 to 20``, ``3, 7, 12``; after
    ``most`` parts, ``...``."""
    parts: list[str] = []
    i = 0
    while i < len(rounds):
        j = i
        if i + 2 < len(rounds):
            step = rounds[i + 1] - rounds[i]
            while j + 1 < len(rounds) and rounds[j + 1] - rounds[j] == step:
                j += 1
        if j - i >= 2:
            parts.append(f"{rounds[i]} to {rounds[j]}" + ("" if step == 1 else f" every {step}"))
            i = j + 1
        else:
            parts.append(str(rounds[i]))
            i += 1
    return ", ".join(parts[:most]) + (", ..." if len(parts) > most else "")


def check_vs_options(vs: str, x: str, until: float | None) -> str:
    """The --vs key, refused in one line where it cannot be a setting or the other options
    say what --vs also decides (the x axis, where each run is read)."""
    key = vs.strip()
    if not key or "," in key:
        raise FedrayError(f"--vs {vs!r}: give one dotted config key, e.g. --vs "
                          "sampling.clients_per_round")
    if x != "round":
        raise FedrayError(f"--vs and --x {x} cannot be combined: --vs puts {key}'s values on "
                          "the x axis and reads each run at rounds (--at); make the report "
                          f"against {X_AXES[x][1]} separately")
    if until is not None:
        raise FedrayError("--vs and --until cannot be combined: --vs reads each run at the "
                          "rounds of --at (and at its best over all rounds); name the rounds "
                          "with --at instead")
    if _repeat_key(key):
        raise FedrayError(f"--vs {key}: one of the keys the runs of a method may differ in "
                          "(seed, name, rounds, output.*, runtime.*, ...), not a setting to "
                          "plot against; choose a key the runs were swept over")
    return key


def vs_method_keys(runs: Sequence[Run], key: str, group_by: list[str] | None) -> list[str]:
    """The keys that make a method of a --vs report: ``group_by`` less ``key``, or every key
    that differs between the runs less ``key``. Refused in one line when a run lacks ``key``
    or every run has one value of it: there would be no line to draw."""
    values = []
    for run in runs:
        try:
            values.append(config_value(run.config, key))
        except KeyError:
            raise FedrayError(f"--vs {key}: {_join(run.url, CONFIG_FILE)} has no {key}; every "
                              "run must set the key its metric is plotted against") from None
    if len({_value_id(v) for v in values}) < 2:
        differ = differing_keys(runs)
        which = f"all {len(runs)} runs have" if len(runs) > 1 else "the only run has"
        raise FedrayError(f"--vs {key}: {which} {key}={values[0]}; it does not vary between "
                          f"the runs (keys that do: {', '.join(differ) if differ else 'none'})")
    if group_by is not None:
        return [k for k in group_by if k != key]
    return [k for k in differing_keys(runs) if k != key]


def check_at(groups: Sequence[Group], at: Sequence[int], metric: str,
             runs: Sequence[Run]) -> None:
    """Every run has a value at every round of ``at``, or one line naming the round, the
    first such run of ``runs`` (the command line's order) and the rounds it has: a round
    without an evaluation is not read as the one before it, which would compare models
    trained for different numbers of rounds."""
    result = {id(res.run): res for g in groups for res in g.results}
    for r in at:
        for run in runs:
            res = result[id(run)]
            if r not in res.series:
                have = sorted(res.series)
                raise FedrayError(f"--at {r}: run {run.url} has no {metric} value at round "
                                  f"{r}; it has values at round{'s' if len(have) > 1 else ''} "
                                  f"{rounds_text(have)}")


def vs_panels(at: Sequence[int] | None) -> list[Panel]:
    """A panel per round of ``at`` (without: the final round), then the best."""
    first = [Panel(f"round {r}", f"round_{r}", r) for r in at] if at else \
        [Panel("final", "final")]
    return [*first, Panel("best", "best")]


def vs_lines(groups: Sequence[Group], key: str, method_keys: Sequence[str],
             panels: Sequence[Panel], names: bool) -> list[VsLine]:
    """The groups (one per method and value of ``key``, sorted by method keys, then key)
    as a line per method, its points in the order of ``key``'s values."""
    methods: dict[tuple[str, ...], list[Group]] = {}
    for g in groups:
        methods.setdefault(tuple(_value_id(g.keys[k]) for k in method_keys), []).append(g)
    mgroups = [Group(label="", keys={k: cells[0].keys[k] for k in method_keys},
                     results=[r for c in cells for r in c.results])
               for cells in methods.values()]
    labels = group_labels(mgroups, list(method_keys), names)
    lines = []
    for label, mg, cells in zip(labels, mgroups, methods.values(), strict=True):
        points = [VsPoint(value=c.keys[key], group=c,
                          values={p.column: [p.value(r) for r in c.results] for p in panels})
                  for c in cells]
        lines.append(VsLine(label=mask(label), keys=mg.keys, points=points))
    return lines


def vs_scale(values: Sequence[Any]) -> str:
    """``categorical`` unless every value is a number; ``log`` when the numbers are all
    positive and more evenly spaced on a log axis than on a linear one (a doubling or
    decade sweep: 5, 10, 20 or 10, 50, 100, 500 would crowd their small values into a
    corner), judged by the spread of the gaps between neighbours relative to their mean;
    else ``linear`` (1, 2, 3, 4; a sweep with 0)."""
    if not all(_is_number(v) for v in values):
        return "categorical"
    xs = np.asarray(sorted({float(v) for v in values}))
    if len(xs) < 3 or xs[0] <= 0:
        return "linear"

    def unevenness(a: np.ndarray) -> float:
        gaps = np.diff(a)
        return float(gaps.std() / gaps.mean())

    return "log" if unevenness(np.log(xs)) < unevenness(xs) else "linear"


def _vs_stats(values: Sequence[float]) -> dict[str, Any]:
    mean, std = _mean_std(values)
    return {"mean": mean, "std": std, "min": float(min(values)), "max": float(max(values)),
            "n": len(values)}


def vs_table(lines: Sequence[VsLine], key: str, panels: Sequence[Panel]) -> str:
    """report.md's --vs table: a row per method and value of ``key``, the metric at each
    panel as mean ± std over the runs (seeds), and how many runs."""
    head = ["method", key, "runs", "seeds", *(p.title for p in panels)]
    rows = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for line in lines:
        for pt in line.points:
            res = pt.group.results
            cells = [_md_cell(line.label), _md_cell(str(pt.value)), str(len(res)),
                     _md_cell(", ".join(_fmt_seed(r.seed) for r in res)),
                     *(_fmt(pt.values[p.column], 4) for p in panels)]
            rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def vs_figure(lines: Sequence[VsLine], key: str, panels: Sequence[Panel], metric: str,
              title: str) -> Any:
    """The metric against ``key``'s values, a panel per round (and the best) side by side
    on one y axis; a line per method (mean over its runs), a min-max band over them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    values = value_order([pt.value for line in lines for pt in line.points])
    scale = vs_scale(values)
    where = {_value_id(v): (i if scale == "categorical" else float(v))
             for i, v in enumerate(values)}
    fig, axes = plt.subplots(1, len(panels), sharey=True, squeeze=False,
                             figsize=(0.6 + 3.2 * len(panels), 4.0))
    axes = axes[0]
    for ax, panel in zip(axes, panels, strict=True):
        for i, line in enumerate(lines):
            style = line_style(i)
            xs = [where[_value_id(pt.value)] for pt in line.points]
            stats = [_vs_stats(pt.values[panel.column]) for pt in line.points]
            ns = sorted({s["n"] for s in stats})
            n = str(ns[0]) if len(ns) == 1 else f"{ns[0]}–{ns[-1]}"
            ax.plot(xs, [s["mean"] for s in stats], markersize=5,
                    label=f"{line.label} (n={n})", **style)
            ax.fill_between(xs, [s["min"] for s in stats], [s["max"] for s in stats],
                            color=style["color"], alpha=0.15, linewidth=0)
        if scale == "log":
            ax.set_xscale("log")
        ticks = [where[_value_id(v)] for v in values]
        ax.set_xticks(ticks, labels=[str(v) for v in values])
        ax.xaxis.set_minor_locator(NullLocator())
        if scale == "categorical":
            ax.set_xlim(-0.5, len(values) - 0.5)
        ax.set_title(panel.title)
        ax.set_xlabel(key)
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel(metric)
    fig.subplots_adjust(top=0.84, wspace=0.08)  # the title above the panels' own
    fig.suptitle(title)
    legend_outside(axes[-1], title=f"mean; {BAND}")
    return fig


def vs_plot_name(metric: str, key: str) -> str:
    """``<metric>_vs_<key>.png``."""
    return plot_file_name(f"{metric}_vs_{key}")


def _vs_lines_md(lines: Sequence[VsLine], key: str, method_keys: Sequence[str],
                 panels: Sequence[Panel], metric: str, lower: bool) -> list[str]:
    """report.md's heading and words of the --vs section: what a line, a point, a panel and
    the band are, and why the x axis has its scale."""
    scale = vs_scale([pt.value for line in lines for pt in line.points])
    axis = {"log": "a log axis: the values are more evenly spaced on it than on a linear one",
            "linear": "a linear axis",
            "categorical": "its values in the order given (not all numbers)"}[scale]
    methods = (f"a line per method, the runs grouped by {', '.join(method_keys)}"
               if method_keys else "one line: the runs differ in no other key")
    where = ", ".join(p.title for p in panels[:-1])
    return [f"## {metric} against {key}", "",
            f"{methods}; x = `{key}` on {axis}; a panel at {where} and at each run's best "
            f"({'min' if lower else 'max'} over its rounds); a point = the mean over the "
            f"method's runs with that value of `{key}` (its seeds), {BAND}; the table: mean "
            "± std over those runs (population std)"]


def _vs_json(lines: Sequence[VsLine], key: str, at: Sequence[int] | None,
             panels: Sequence[Panel], method_keys: Sequence[str]) -> dict[str, Any]:
    values = [pt.value for line in lines for pt in line.points]
    return {"key": key, "at": list(at) if at else None, "method_keys": list(method_keys),
            "panels": [p.column for p in panels], "x_scale": vs_scale(values),
            "band": "min-max over the runs", "std": "population (ddof=0) over the runs",
            "methods": [{"method": line.label, "keys": line.keys, "points": [
                {key: pt.value, "group": pt.group.label,
                 "seeds": [r.seed for r in pt.group.results],
                 **{p.column: _vs_stats(pt.values[p.column]) for p in panels}}
                for pt in line.points]} for line in lines]}


def _grouping_line(keys: list[str], auto: bool, allow: list[str]) -> str:
    if auto:
        said = ", ".join(keys) if keys else "nothing (the runs differ in no such key: one method)"
        line = (f"grouped by: {said} -- the config keys whose values differ between the runs, "
                f"less {', '.join(k + '*' if k.endswith('.') else k for k in REPEAT_KEYS)}")
    else:
        line = f"grouped by: {', '.join(keys)} (--group-by)"
    if allow:
        line += f"; allowed to differ within a method: {', '.join(allow)} (--allow-differing)"
    return line


def _x_lines(groups: Sequence[Group], x: str, until: float | None,
             unit: tuple[float, str]) -> list[str]:
    """report.md's lines on the x axis and the cut (none for a round report without one):
    how the curves were formed, and the runs that end before the cut."""
    key, label, short = X_AXES[x]
    lines: list[str] = []
    if x != "round":
        shown = "hours" if unit[1] == "h" else "seconds"
        lines += ["", f"x: {label} (`{key}` at the end of a round), in {shown} (hours once "
                  f"some run reaches {HOURS_FROM_S / 3600:g} h); a run's curve is a step "
                  f"function, its value at t being its last evaluation at or before t (no "
                  "interpolation between evaluations); a method's mean and band are taken on "
                  "the union of its runs' evaluation times, from the latest first evaluation "
                  f"to the earliest run end; {short} to target = `{key}` of the first round "
                  f"that reaches it; final {short} = `{key}` of the final value's round"]
    if until is not None:
        lines += ["", f"cut at --until {until:g} (`{key}`): each run's values are those "
                  "evaluated at or before it; final, best and targets are read there"]
        lines += [f"note: {r.run.url} ends at {key} {r.end_x:g}, before --until {until:g}: "
                  "its values are at its end" for g in groups for r in g.results
                  if r.end_x < until]
    return lines


def _write_outputs(fs: Any, out_path: str, out: str, outputs: list[tuple[str, bytes]]) -> None:
    """Every file of the report whole, or none (fedray.state.storage.write_atomic), and
    the directories made for them gone again when the writing fails (a full disk): a
    failed report leaves --out as it was, with one line."""
    top = out_path.rstrip("/")  # the topmost directory this call creates, if any
    while top and not fs.exists(top) and posixpath.dirname(top) not in ("", top) \
            and not fs.exists(posixpath.dirname(top)):
        top = posixpath.dirname(top)
    created = not fs.exists(top)
    try:
        fs.makedirs(out_path, exist_ok=True)
        write_atomic(fs, [(_join(out_path, name), data) for name, data in outputs])
    except OSError as exc:
        if created:
            try:
                fs.rm(top, recursive=True)
            except OSError:
                pass
        raise FedrayError(f"--out {out}: writing the report failed: "
                          f"{exc.strerror or one_line(exc)}; nothing was written") from None


def build_report(run_urls: Sequence[str], out: str, *, metric: str = "test_accuracy",
                 group_by: str | Sequence[str] | None = None, target: float | None = None,
                 title: str | None = None, allow_differing: str | Sequence[str] | None = None,
                 client_metric: str = "accuracy", client_round: int | None = None,
                 x: str = "round", until: float | None = None,
                 notes: Sequence[str] = (), vs: str | None = None,
                 at: str | Sequence[int] | None = None) -> Report:
    """Write report.md, report.csv, report.json and ``<metric>.png`` into the directory ``out``
    (a local path or fsspec URL) -- and, when runs have per-client tables, the
    distribution of ``client_metric`` over clients at the final round (or ``client_round``):
    ``client_<metric>_cdf.png`` and a table in report.md -- and return what was written.

    A sweep directory (``fedray sweep``'s ``output``) among ``run_urls`` stands for its
    finished trials (``sweep_trials``).

    Everything is read and checked before anything is written, and ``out`` is refused when it
    already holds a report.md, so a bad input or a repeated command never leaves a half-written
    or overwritten report. ``group_by``: dotted config keys (``"algorithm.name,seed"`` or a
    list); None groups by every key whose value differs between the runs, less REPEAT_KEYS.
    ``allow_differing``: keys the runs of one group may differ in anyway (averaged as seeds).
    ``x``: the plot's x axis, ``round``, ``sim_time`` (``sim_time_s``) or ``wall_time``
    (``elapsed_s``); a time axis also adds the time to target and the final value's time to
    the table. ``until``: an x value (a round, or seconds) at which every run is cut, to
    compare methods at equal (simulated) time. ``notes``: Markdown lines report.md shows
    before the table (``fedray sweep``: the trials it left out, and why).

    ``vs``: a config key the runs were swept over; adds the metric against its values
    (``<metric>_vs_<key>.png``, a table in report.md, columns in report.csv, ``vs`` in
    report.json): a line per method -- the runs grouped by every group-by key but ``vs`` --
    at each round of ``at`` (``"10,20,30"`` or a list; default: each run's final round) and
    at each run's best, mean over the runs with a min-max band. Every run must have a value
    at every round of ``at``; ``vs`` excludes a time ``x`` and ``until``.
    """
    if not run_urls:
        raise FedrayError("no run directories given")
    if x not in X_AXES:
        raise FedrayError(f"--x {x!r}: choose one of {', '.join(X_AXES)}")
    if until is not None and not (math.isfinite(until) and until > 0):
        raise FedrayError(f"--until must be a positive number, got {until:g}")
    at_rounds = parse_at(at)
    if at_rounds is not None and vs is None:
        raise FedrayError("--at needs --vs KEY: it names the rounds at which the metric is "
                          "plotted against KEY's values")
    vs_key = None if vs is None else check_vs_options(vs, x, until)
    fs, out_path = filesystem(out, "--out", what=None)
    report_path = _join(out, REPORT_FILE)
    if fs.exists(out_path) and not fs.isdir(out_path):
        raise FedrayError(f"--out {out} exists and is not a directory")
    if fs.exists(_join(out_path, REPORT_FILE)):
        raise FedrayError(f"{report_path} already exists; choose a new --out or remove it")
    check_writable(fs, out_path, out, "--out", what=None)  # before any run is read
    expanded: list[str] = []
    for url in run_urls:  # a sweep directory stands for its finished trials
        trials = sweep_trials(url)
        expanded += [url] if trials is None else trials[0]
        notes = [*notes, *(trials[1] if trials else [])]
    run_urls = expanded
    seen: set[str] = set()
    for url in run_urls:
        if url.rstrip("/") in seen:
            raise FedrayError(f"run directory {url} is given twice")
        seen.add(url.rstrip("/"))
    keys = parse_group_by(group_by)
    allow = parse_group_by(allow_differing, "--allow-differing") or []
    runs = [load_run(u) for u in run_urls]
    cell_keys, order, method_keys = keys, None, []
    if vs_key is not None:
        method_keys = vs_method_keys(runs, vs_key, keys)
        order = [*method_keys, vs_key]  # a method's rows together, in the order of vs_key
        if keys is not None:
            cell_keys = order
    groups = group_runs(runs, metric, cell_keys, target, allow, x=x, until=until, order=order)
    by = list(groups[0].keys)
    grouping = _grouping_line(by, keys is None, allow)
    if keys is not None and vs_key is not None and vs_key not in keys:
        grouping = grouping.replace("(--group-by)", "(--group-by, and --vs)", 1)
    lines: list[VsLine] = []
    panels: list[Panel] = []
    if vs_key is not None:
        check_at(groups, at_rounds or (), metric, runs)
        panels = vs_panels(at_rounds)
        if at_rounds is None:  # the final panel says which round(s) it is
            finals = sorted({r.final_round for g in groups for r in g.results})
            panels[0].title = (f"final (round {finals[0]})" if len(finals) == 1 else
                               f"final (rounds {finals[0]}–{finals[-1]})")
        lines = vs_lines(groups, vs_key, method_keys, panels, keys is None)
    lower = lower_is_better(metric)
    title = title or metric
    unit = time_unit(groups, until) if x != "round" else (1.0, "s")
    with plain_text():  # the title and the methods' labels are a user's text, not TeX
        png, skipped = _plot_png(groups, metric, target, title, x, until, unit)
        vs_png = _png(vs_figure(lines, vs_key, panels, metric, title)) if lines else b""
    table = markdown_table(groups, metric, target, x, unit)
    cgroups, no_tables = client_groups(groups, client_metric, client_round)

    direction = "lower is better" if lower else "higher is better"
    md = [f"# {title}", "",
          f"metric: `{metric}` ({direction}); final = last round with a value, best = "
          f"{'min' if lower else 'max'} over rounds; mean ± std over the runs of a method "
          "(population std, ddof=0)", ""]
    if target is None:
        md.append("target: none")
    else:
        md.append(f"target: {metric} {'≤' if lower else '≥'} {target:g}; rounds to target = "
                  "first round that reaches it, mean ± std over the runs that reach it")
    md += _x_lines(groups, x, until, unit)
    md += ["", grouping, ""]
    if notes:
        md += [*notes, ""]
    md += [f"run directories ({len(runs)}):", ""]
    md += [f"- `{r.run.url}` ({_md_cell(g.label)}, seed {_fmt_seed(r.seed)})"
           for g in groups for r in g.results]
    md += ["", table, "", f"![{metric}]({plot_file_name(metric)})", ""]
    for label in skipped:
        md += [f"note: the runs of {label} share no {X_AXES[x][1]} with a {metric} value; "
               "not plotted", ""]
    files = [plot_file_name(metric)]
    vs_text = None
    if vs_key is not None:
        vs_text = vs_table(lines, vs_key, panels)
        md += _vs_lines_md(lines, vs_key, method_keys, panels, metric, lower)
        md += ["", vs_text, "",
               f"![{metric} against {vs_key}]({vs_plot_name(metric, vs_key)})", ""]
        files.append(vs_plot_name(metric, vs_key))
    client_json: dict[str, Any] | None = None
    if cgroups:
        where = "the final round (each run's last table)" if client_round is None else \
            f"round {client_round}"
        tail = "90th" if lower_is_better(client_metric) else "10th"
        md += [f"## Per-client {client_metric} at {where}", "",
               f"one value per evaluated client with test data (`{CLIENT_EVAL_DIR}/`), the "
               f"clients of a method's runs pooled; {tail} percentile by numpy's linear "
               "interpolation; worst 10% = mean over the ceil(10%) worst clients", "",
               client_table(cgroups, client_metric), "",
               f"![per-client {client_metric}]({client_plot_name(client_metric)})", ""]
        md += [f"note: {u} has no per-client tables; not in this section" for u in no_tables]
        if no_tables:
            md.append("")
        files.append(client_plot_name(client_metric))
        client_json = {
            "metric": client_metric, "round": client_round, "pooled": "over the runs' clients",
            "groups": [{"method": g.label, "runs": g.runs, "rounds": g.rounds,
                        **{c: client_summary(v, client_metric) for c, v in g.values.items()}}
                       for g in cgroups]}

    rows = _rows(groups, target, x)
    if vs_key is not None:  # each row is one point of a --vs line: which, and its rounds
        method_of = {id(pt.group): line.label for line in lines for pt in line.points}
        for g, row in zip(groups, rows, strict=True):
            row["vs_method"] = method_of[id(g)]
            for r in at_rounds or ():
                row[f"round_{r}_mean"], row[f"round_{r}_std"] = _mean_std(
                    [res.series[r] for res in g.results])
    report_json = {
        "metric": metric, "lower_is_better": lower, "target": target,
        "group_by": by, "grouping": "given" if keys is not None else "differing keys",
        "allow_differing": allow, "std": "population (ddof=0) over runs",
        "groups": rows,
        "runs": [{"run_dir": r.run.url, "group": r.group, "seed": r.seed,
                  "final": r.final, "final_round": r.final_round, "best": r.best,
                  "best_round": r.best_round, "rounds_to_target": r.rounds_to_target,
                  **({} if x == "round" else {f"final_{x}_s": r.final_x,
                                              f"{x}_to_target_s": r.x_to_target,
                                              f"end_{x}_s": r.end_x})}
                 for g in groups for r in g.results],
    }
    if x != "round" or until is not None:  # a round report's JSON stays as it was
        report_json.update(x=x, x_key=X_AXES[x][0], until=until)
        if x != "round":
            report_json["time_unit"] = unit[1]
    if client_json is not None:
        report_json["clients"] = client_json
    if vs_key is not None:
        report_json["vs"] = _vs_json(lines, vs_key, at_rounds, panels, method_keys)
    outputs = [(plot_file_name(metric), png)]
    if vs_key is not None:
        outputs.append((vs_plot_name(metric, vs_key), vs_png))
    if cgroups:
        with plain_text():
            outputs.append((client_plot_name(client_metric),
                            _cdf_png(cgroups, client_metric, f"{title}: per-client "
                                     f"{client_metric}")))
    # run URLs and config values, credentials masked (fedray.state.redact)
    outputs += [("report.csv", mask(_csv_text(rows)).encode()),
                ("report.json", mask(json.dumps(_json_safe(report_json), indent=2) + "\n"
                                     ).encode()),
                (REPORT_FILE, mask("\n".join(md)).encode())]  # last: it means complete
    _write_outputs(fs, out_path, out, outputs)
    return Report(table=table, group_by=by, grouping=grouping,
                  files=[*files, "report.csv", "report.json", REPORT_FILE],
                  vs_table=None if vs_text is None else mask(vs_text))
