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

from fedray.errors import FedrayError, one_line
from fedray.state.redact import mask
from fedray.state.storage import check_writable, filesystem, write_atomic
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


def lower_is_better(metric: str) -> bool:
    """Losses go down, everything else (accuracies) goes up: decides "best" and the target."""
    return "loss" in metric.lower()


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
    from fedray.config import flat_keys

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


def _auto_labels(runs: Sequence[Run], keys: list[str]) -> list[str]:
    """Each run's group label when grouped by the keys that differ: ``k=v, ...``, after the
    runs' ``name`` when names tell the groups apart (``fedprox (client.lr=0.1)``); the name
    (or names) alone when no key differs."""
    combos = [tuple(_flat(r.config).get(k, ABSENT) for k in keys) for r in runs]
    names: dict[tuple, set[str]] = {}
    for run, combo in zip(runs, combos, strict=True):
        names.setdefault(combo, set()).add(str(run.config.get("name")))
    # a name per group, and a different one for each group: the user's own words for it
    named = all(len(n) == 1 for n in names.values()) and len(
        {next(iter(n)) for n in names.values()}) == len(names)
    labels = []
    for run, combo in zip(runs, combos, strict=True):
        pairs = ", ".join(f"{k}={v}" for k, v in zip(keys, combo, strict=True))
        if not keys:
            all_names = sorted({str(r.config.get("name")) for r in runs})
            labels.append(" / ".join(all_names[:3]) + (" / ..." if len(all_names) > 3
                                                       else ""))
        elif named and len(names) > 1:
            labels.append(f"{run.config.get('name')} ({pairs})")
        else:
            labels.append(pairs)
    return labels


def group_runs(runs: Sequence[Run], metric: str, group_by: list[str] | None,
               target: float | None, allow_differing: Sequence[str] = (), *,
               x: str = "round", until: float | None = None) -> list[Group]:
    """Runs -> groups (methods) in the order they first appear, with per-run numbers.
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
    labels = _auto_labels(runs, by) if auto else None
    groups: dict[str, Group] = {}
    for i, run in enumerate(runs):
        keys = {}
        for key in by:
            try:
                keys[key] = config_value(run.config, key)
            except KeyError:
                if auto:
                    keys[key] = ABSENT
                    continue
                raise FedrayError(f"group-by key {key!r} is not in "
                                  f"{_join(run.url, CONFIG_FILE)}") from None
        label = mask(labels[i] if labels is not None else ", ".join(f"{k}={v}"  # in plots
                                                                    for k, v in keys.items()))
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
            run=run, group=label, seed=run.config.get("seed"), series=values,
            final=values[final_round], final_round=final_round, best=best,
            best_round=best_round, rounds_to_target=rtt,
            x={r: xs[r] for r in values}, end_x=xs[max(xs)], final_x=xs[final_round],
            x_to_target=None if rtt is None else xs[rtt])
        groups.setdefault(label, Group(label=label, keys=keys)).results.append(result)
    for group in groups.values():
        check_repetitions(group, by, allow_differing)
    return list(groups.values())


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


def _plot_png(groups: Sequence[Group], metric: str, target: float | None,
              title: str, x: str = "round", until: float | None = None,
              unit: tuple[float, str] = (1.0, "s")) -> tuple[bytes, list[str]]:
    """The curves as PNG bytes, and the labels of groups with no common round (not drawn);
    against a time ``x``, each group's ``time_curve`` as steps, in ``unit``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    skipped = []
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for i, g in enumerate(groups):
        color = f"C{i % 10}"
        if x != "round":
            grid, mean, lo, hi = time_curve(g, until)
            if not len(grid):
                skipped.append(g.label)
                continue
            t = grid / unit[0]
            ax.step(t, mean, where="post", color=color, label=f"{g.label} (n={len(g.results)})")
            ax.fill_between(t, lo, hi, step="post", color=color, alpha=0.2, linewidth=0)
            continue
        rounds, mean, lo, hi = curve(g)
        if not len(rounds):
            skipped.append(g.label)
            continue
        ax.plot(rounds, mean, color=color, marker="o" if len(rounds) < 30 else None,
                markersize=3, label=f"{g.label} (n={len(g.results)})")
        ax.fill_between(rounds, lo, hi, color=color, alpha=0.2, linewidth=0)
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
    if ax.get_legend_handles_labels()[0]:
        ax.legend(title=f"mean; {BAND}", fontsize="small", title_fontsize="small")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    return buf.getvalue(), skipped


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


def client_values(url: str, metric: str) -> dict[str, np.ndarray]:
    """``metric``'s column of one per-client table, and ``personalized_<metric>``'s when the
    table has it, over the clients with test data (``count`` > 0: a client without any has
    no accuracy); one line naming the file and the column when the table cannot be read or
    lacks it."""
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
    if not metric.startswith("personalized_") and f"personalized_{metric}" in table.column_names:
        columns.append(f"personalized_{metric}")
    return {c: table.column(c).to_numpy(zero_copy_only=False).astype(np.float64)[has]
            for c in columns}


def client_groups(groups: Sequence[Group], metric: str, round_: int | None
                  ) -> tuple[list[ClientGroup], list[str]]:
    """Per group, the pooled per-client ``metric`` (and ``personalized_<metric>`` where
    the tables have it) at each run's last table round (or ``round_``), and the URLs of the
    runs without per-client tables (left out). Groups none of whose runs has a table are
    left out; ([], ...) when no run has one."""
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


def _cdf_png(cgroups: Sequence[ClientGroup], metric: str, title: str) -> bytes:
    """The empirical CDF of the per-client metric, a line per group (dashed: personalized).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for i, g in enumerate(cgroups):
        for column, values in g.values.items():
            if not len(values):
                continue
            x = np.sort(values)
            y = np.arange(1, len(x) + 1) / len(x)
            personal = column.startswith("personalized_") and not metric.startswith(
                "personalized_")
            ax.step(x, y, where="post", color=f"C{i % 10}", linestyle="--" if personal else "-",
                    label=f"{g.label}{' (personalized)' if personal else ''} "
                          f"(n={len(values)})")
    ax.set_xlabel(f"per-client {metric}")
    ax.set_ylabel("fraction of clients ≤ x")
    ax.set_ylim(0, 1)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    return buf.getvalue()


def client_plot_name(metric: str) -> str:
    """``client_<metric>_cdf.png``."""
    return plot_file_name(f"client_{metric}_cdf")


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
                 notes: Sequence[str] = ()) -> Report:
    """Write report.md, report.csv, report.json and ``<metric>.png`` into the directory ``out``
    (a local path or fsspec URL) -- and, when runs have per-client tables, the
    distribution of ``client_metric`` over clients at the final round (or ``client_round``):
    ``client_<metric>_cdf.png`` and a table in report.md -- and return what was written.

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
    """
    if not run_urls:
        raise FedrayError("no run directories given")
    if x not in X_AXES:
        raise FedrayError(f"--x {x!r}: choose one of {', '.join(X_AXES)}")
    if until is not None and not (math.isfinite(until) and until > 0):
        raise FedrayError(f"--until must be a positive number, got {until:g}")
    fs, out_path = filesystem(out, "--out", what=None)
    report_path = _join(out, REPORT_FILE)
    if fs.exists(out_path) and not fs.isdir(out_path):
        raise FedrayError(f"--out {out} exists and is not a directory")
    if fs.exists(_join(out_path, REPORT_FILE)):
        raise FedrayError(f"{report_path} already exists; choose a new --out or remove it")
    check_writable(fs, out_path, out, "--out", what=None)  # before any run is read
    seen: set[str] = set()
    for url in run_urls:
        if url.rstrip("/") in seen:
            raise FedrayError(f"run directory {url} is given twice")
        seen.add(url.rstrip("/"))
    keys = parse_group_by(group_by)
    allow = parse_group_by(allow_differing, "--allow-differing") or []
    runs = [load_run(u) for u in run_urls]
    groups = group_runs(runs, metric, keys, target, allow, x=x, until=until)
    by = list(groups[0].keys)
    grouping = _grouping_line(by, keys is None, allow)
    lower = lower_is_better(metric)
    title = title or metric
    unit = time_unit(groups, until) if x != "round" else (1.0, "s")
    with plain_text():  # the title and the methods' labels are a user's text, not TeX
        png, skipped = _plot_png(groups, metric, target, title, x, until, unit)
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
    outputs = [(plot_file_name(metric), png)]
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
                  files=[*files, "report.csv", "report.json", REPORT_FILE])
