"""``fedray report``: the tables and plots of a paper reproduction, from finished runs.

A method is rarely judged on one run: papers report a curve per method (accuracy against
rounds) with a band over seeds, and a table of final/best accuracy and rounds to reach a
target. This module groups run directories into methods by config keys, treats the runs of a
group as repetitions, and writes ``report.md``, ``report.csv``, ``report.json`` and
``<metric>.png``. Run directories are read and the report is written through fsspec, so
both can live anywhere ``fedray run`` can write (a local path, s3://, ...).
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import yaml

from fedray.errors import FedrayError
from fedray.state.storage import check_writable, filesystem

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
REPORT_FILE = "report.md"
BAND = "band: min–max over seeds"


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


@dataclass
class Group:
    """The runs of one method: same values of the group-by keys."""

    label: str
    keys: dict[str, Any]
    results: list[RunResult] = field(default_factory=list)


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


def parse_group_by(group_by: str | Sequence[str] | None) -> list[str] | None:
    """``"a.b,c"`` or ``["a.b", "c"]`` -> ``["a.b", "c"]``; None stays None (group by name)."""
    if group_by is None:
        return None
    keys = group_by.split(",") if isinstance(group_by, str) else list(group_by)
    keys = [k.strip() for k in keys]
    if not keys or any(not k for k in keys):
        raise FedrayError(f"group-by {group_by!r}: give config keys separated by commas, "
                          "e.g. algorithm.name,sampling.clients_per_round")
    return keys


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


def group_runs(runs: Sequence[Run], metric: str, group_by: list[str] | None,
               target: float | None) -> list[Group]:
    """Runs -> groups (methods) in the order they first appear, with per-run numbers."""
    if not any(r.metrics and any(rec.get(metric) is not None for rec in r.metrics)
               for r in runs):
        raise FedrayError(f"metric {metric!r} is in no run's {METRICS_FILE}; available: "
                          f"{', '.join(_available(runs)) or 'none'}")
    lower = lower_is_better(metric)
    groups: dict[str, Group] = {}
    for run in runs:
        keys = {}
        for key in group_by or ["name"]:
            try:
                keys[key] = config_value(run.config, key)
            except KeyError:
                raise FedrayError(f"group-by key {key!r} is not in "
                                  f"{_join(run.url, CONFIG_FILE)}") from None
        if group_by is None:
            label = str(keys["name"])
        else:
            label = ", ".join(f"{k}={v}" for k, v in keys.items())
        values = series(run, metric)
        if not values:
            raise FedrayError(f"{_join(run.url, METRICS_FILE)} has no {metric!r} values; "
                              f"available there: {', '.join(_available([run])) or 'none'}")
        final_round = max(values)
        pick = min if lower else max
        best = pick(values.values())
        best_round = next(r for r, v in values.items() if v == best)
        result = RunResult(
            run=run, group=label, seed=run.config.get("seed"), series=values,
            final=values[final_round], final_round=final_round, best=best,
            best_round=best_round,
            rounds_to_target=None if target is None else rounds_to_target(values, target, lower))
        groups.setdefault(label, Group(label=label, keys=keys)).results.append(result)
    for group in groups.values():
        check_repetitions(group, group_by)
    return list(groups.values())


# config keys in which the runs of one method may differ: the repetition itself (seed), what
# a run is called and where it wrote, how long it ran (the final round is reported) and how
# it was run, evaluated or checkpointed -- none changes the method being compared
REPEAT_KEYS = ("seed", "name", "rounds", "output.", "runtime.", "checkpoint.", "eval.every",
               "eval.batch_size", "data.verify", "data.open_shards")


def _repeat_key(key: str) -> bool:
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in REPEAT_KEYS)


def check_repetitions(group: Group, group_by: list[str] | None) -> None:
    """Refuse a group whose runs are not repetitions of one method: averaging runs with
    different learning rates as if they were seeds of one would report a method nobody ran.
    Names the first keys that differ and the runs that differ in them."""
    from fedray.config import flat_keys

    if len(group.results) < 2:
        return
    flat = [flat_keys(r.run.config) for r in group.results]
    keys = sorted({k for f in flat for k in f if not _repeat_key(k)
                   and any(g.get(k) != flat[0].get(k) for g in flat)})
    if not keys:
        return
    k = keys[0]
    other = next(i for i, g in enumerate(flat) if g.get(k) != flat[0].get(k))
    runs = group.results
    more = f" (and {', '.join(keys[1:4])}{', ...' if len(keys) > 4 else ''})" if len(keys) > 1 \
        else ""
    by = ",".join([*(group_by or ["name"]), *keys[:3]])
    raise FedrayError(f"the runs grouped as {group.label!r} are not repetitions of one method: "
                      f"they differ in {k}{more} ({runs[0].run.url}: {flat[0].get(k)!r}, "
                      f"{runs[other].run.url}: {flat[other].get(k)!r}); group them apart, "
                      f"e.g. --group-by {by}")


def curve(group: Group) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rounds common to all runs of the group, and the mean, min and max over runs there."""
    common = set.intersection(*(set(r.series) for r in group.results))
    rounds = np.asarray(sorted(common), dtype=int)
    if not len(rounds):
        empty = np.zeros(0)
        return rounds, empty, empty, empty
    v = np.asarray([[r.series[int(x)] for x in rounds] for r in group.results], dtype=float)
    return rounds, v.mean(axis=0), v.min(axis=0), v.max(axis=0)


def _rows(groups: Sequence[Group], target: float | None) -> list[dict[str, Any]]:
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
        row["final_round_min"] = min(r.final_round for r in res)
        row["final_round_max"] = max(r.final_round for r in res)
        rows.append(row)
    return rows


def markdown_table(groups: Sequence[Group], metric: str, target: float | None) -> str:
    """The report table: one row per group, mean ± std over its runs."""
    lower = lower_is_better(metric)
    head = ["method", "runs", "seeds", f"final {metric}", f"best {metric}"]
    if target is not None:
        head.append(f"rounds to {'≤' if lower else '≥'} {target:g}")
    head.append("final round")
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for g in groups:
        res = g.results
        cells = [_md_cell(g.label), str(len(res)),
                 _md_cell(", ".join(_fmt_seed(r.seed) for r in res)),
                 _fmt([r.final for r in res], 4), _fmt([r.best for r in res], 4)]
        if target is not None:
            reached = [r.rounds_to_target for r in res if r.rounds_to_target is not None]
            cells.append(f"{_fmt(reached, 1)} ({len(reached)}/{len(res)} reached)")
        lo, hi = min(r.final_round for r in res), max(r.final_round for r in res)
        cells.append(str(lo) if lo == hi else f"{lo}–{hi}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _plot_png(groups: Sequence[Group], metric: str, target: float | None,
              title: str) -> tuple[bytes, list[str]]:
    """The curves as PNG bytes, and the labels of groups with no common round (not drawn)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    skipped = []
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for i, g in enumerate(groups):
        rounds, mean, lo, hi = curve(g)
        if not len(rounds):
            skipped.append(g.label)
            continue
        color = f"C{i % 10}"
        ax.plot(rounds, mean, color=color, marker="o" if len(rounds) < 30 else None,
                markersize=3, label=f"{g.label} (n={len(g.results)})")
        ax.fill_between(rounds, lo, hi, color=color, alpha=0.2, linewidth=0)
    if target is not None:
        ax.axhline(target, color="black", linestyle="--", linewidth=1, label=f"target {target:g}")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")
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


def build_report(run_urls: Sequence[str], out: str, *, metric: str = "test_accuracy",
                 group_by: str | Sequence[str] | None = None, target: float | None = None,
                 title: str | None = None) -> str:
    """Write report.md, report.csv, report.json and ``<metric>.png`` into the directory ``out``
    (a local path or fsspec URL) and return the Markdown table.

    Everything is read and checked before anything is written, and ``out`` is refused when it
    already holds a report.md, so a bad input or a repeated command never leaves a half-written
    or overwritten report. ``group_by``: dotted config keys (``"algorithm.name,seed"`` or a
    list); None groups by the config's ``name``.
    """
    if not run_urls:
        raise FedrayError("no run directories given")
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
    runs = [load_run(u) for u in run_urls]
    groups = group_runs(runs, metric, keys, target)
    lower = lower_is_better(metric)
    title = title or metric
    png, skipped = _plot_png(groups, metric, target, title)
    table = markdown_table(groups, metric, target)

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
    md += ["", f"grouped by: {', '.join(keys) if keys else 'name'}", "",
           f"run directories ({len(runs)}):", ""]
    md += [f"- `{r.run.url}` ({_md_cell(g.label)}, seed {_fmt_seed(r.seed)})"
           for g in groups for r in g.results]
    md += ["", table, "", f"![{metric}]({plot_file_name(metric)})", ""]
    for label in skipped:
        md += [f"note: the runs of {label} share no round with a {metric} value; not plotted",
               ""]

    rows = _rows(groups, target)
    report_json = {
        "metric": metric, "lower_is_better": lower, "target": target,
        "group_by": keys or ["name"], "std": "population (ddof=0) over runs",
        "groups": rows,
        "runs": [{"run_dir": r.run.url, "group": r.group, "seed": r.seed,
                  "final": r.final, "final_round": r.final_round, "best": r.best,
                  "best_round": r.best_round, "rounds_to_target": r.rounds_to_target}
                 for g in groups for r in g.results],
    }
    fs.makedirs(out_path, exist_ok=True)
    for name, data in ((plot_file_name(metric), png), ("report.csv", _csv_text(rows).encode()),
                       ("report.json", (json.dumps(_json_safe(report_json), indent=2)
                                        + "\n").encode()),
                       (REPORT_FILE, "\n".join(md).encode())):  # last: it means complete
        with fs.open(_join(out_path, name), "wb") as f:
            f.write(data)
    return table
