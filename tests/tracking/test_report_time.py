"""``fedray report --x sim_time|wall_time --until``: hand-written clocked run directories
(config.yaml + metrics.jsonl with sim_time_s, as ``clock.enabled`` runs write them, no Ray)
whose step functions, times to target and cuts are computed by hand below."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from fedray.cli import main
from fedray.errors import FedrayError
from fedray.tracking.report import build_report, group_runs, load_run, step_values, time_curve

# two seeds of one method; every round evaluated. Seed 0 ends at 400 s, seed 1 at 500 s
A = {"sim": [100.0, 200.0, 300.0, 400.0], "acc": [0.1, 0.3, 0.5, 0.6]}
B = {"sim": [150.0, 350.0, 500.0], "acc": [0.2, 0.4, 0.8]}


def write_clocked(path: Path, seed: int, sim, acc, method: str = "fedavg", clock: bool = True,
                  elapsed=None, eval_rounds=None) -> str:
    """A run directory as a ``clock.enabled`` run leaves it: sim_round_s and sim_time_s in
    every record (``clock=False``: neither, as without the clock), test_accuracy in the
    ``eval_rounds`` (default: all)."""
    path.mkdir(parents=True)
    cfg = {"name": method, "seed": seed, "rounds": len(sim), "algorithm": {"name": method},
           "clock": {"enabled": clock}, "output": {"dir": str(path)}}
    (path / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(cfg)))
    lines, prev = [], 0.0
    for i, t in enumerate(sim):
        r = i + 1
        rec = {"round": r, "train_loss": 1.0 / r, "clients": 10}
        if clock:
            rec.update(sim_round_s=t - prev, sim_time_s=t)
        prev = t
        if eval_rounds is None or r in eval_rounds:
            rec["test_accuracy"] = acc[i]
        rec["elapsed_s"] = float(r) if elapsed is None else elapsed[i]
        lines.append(json.dumps(rec) + "\n")
    (path / "metrics.jsonl").write_text("".join(lines))
    return str(path)


@pytest.fixture
def ab(tmp_path):
    return [write_clocked(tmp_path / "a", 0, **A), write_clocked(tmp_path / "b", 1, **B)]


def _group(urls, x="sim_time", target=None, until=None):
    (group,) = group_runs([load_run(u) for u in urls], "test_accuracy", None, target, x=x,
                          until=until)
    return group


def test_step_function_takes_the_last_evaluation_at_or_before_t():
    xs = np.asarray([100.0, 100.0, 200.0])  # two evaluations at one time: the later round's
    v = np.asarray([1.0, 2.0, 3.0])
    assert step_values(xs, v, np.asarray([100.0, 150.0, 199.9, 200.0, 1e9])).tolist() == [
        2.0, 2.0, 2.0, 3.0, 3.0]
    with pytest.raises(ValueError, match="before the run's first evaluation"):
        step_values(xs, v, np.asarray([99.0]))


def test_the_last_value_holds_to_the_runs_end(tmp_path):
    """Round 3 (at 300 s) has no evaluation: the curve holds round 2's value to the run's
    end, while the final value's time is round 2's."""
    run = write_clocked(tmp_path / "c", 0, [100.0, 200.0, 300.0], [0.1, 0.2, 0.9],
                        eval_rounds={1, 2})
    group = _group([run])
    grid, mean, _, _ = time_curve(group)
    assert (grid.tolist(), mean.tolist()) == ([100.0, 200.0, 300.0], [0.1, 0.2, 0.2])
    (result,) = group.results
    assert (result.final_x, result.end_x) == (200.0, 300.0)


def test_seeds_are_averaged_on_a_common_time_grid(ab):
    """Grid: the union of both runs' evaluation times from the latest first one (b's 150 s)
    to the earliest end (a's 400 s); each run holds its last value between evaluations."""
    grid, mean, lo, hi = time_curve(_group(ab))
    assert grid.tolist() == [150.0, 200.0, 300.0, 350.0, 400.0]
    a = [0.1, 0.3, 0.5, 0.5, 0.6]  # a at 150 s: its 100 s value; at 350 s: its 300 s value
    b = [0.2, 0.2, 0.2, 0.4, 0.4]
    # numpy's mean of two values is (x + y) / 2, the same operations: compared exactly
    assert mean.tolist() == [(x + y) / 2 for x, y in zip(a, b, strict=True)]
    assert lo.tolist() == [min(p) for p in zip(a, b, strict=True)]
    assert hi.tolist() == [max(p) for p in zip(a, b, strict=True)]
    grid, mean, _, _ = time_curve(_group(ab), until=350.0)
    assert grid.tolist() == [150.0, 200.0, 300.0, 350.0]
    assert mean.tolist() == [(x + y) / 2 for x, y in zip(a[:4], b[:4], strict=True)]


def test_time_to_target_and_final_time_in_the_table(ab, tmp_path):
    """Target 0.45: a reaches it in round 3 at 300 s, b in round 3 at 500 s; finals at
    400 s (a, round 4) and 500 s (b, round 3). Ends below 2 h: seconds."""
    out = tmp_path / "out"
    table = build_report(ab, str(out), target=0.45, x="sim_time").table
    head, _, row = table.splitlines()
    assert head == ("| method | runs | seeds | final test_accuracy | best test_accuracy | "
                    "rounds to ≥ 0.45 | sim time to ≥ 0.45 (s) | final round | "
                    "final sim time (s) |")
    assert row == ("| fedavg | 2 | 0, 1 | 0.7000 ± 0.1000 | 0.7000 ± 0.1000 | "
                   "3.0 ± 0.0 (2/2 reached) | 400.0 ± 100.0 | 3–4 | 450.0 ± 50.0 |")
    with open(out / "report.csv", newline="") as f:
        (csv_row,) = csv.DictReader(f)
    assert float(csv_row["sim_time_to_target_s_mean"]) == 400.0
    assert float(csv_row["sim_time_to_target_s_std"]) == 100.0
    assert float(csv_row["final_sim_time_s_mean"]) == 450.0
    assert float(csv_row["final_sim_time_s_std"]) == 50.0
    data = json.loads((out / "report.json").read_text())
    assert (data["x"], data["x_key"], data["until"], data["time_unit"]) == (
        "sim_time", "sim_time_s", None, "s")
    assert [(r["final_sim_time_s"], r["sim_time_to_target_s"], r["end_sim_time_s"])
            for r in data["runs"]] == [(400.0, 300.0, 400.0), (500.0, 500.0, 500.0)]
    md = (out / "report.md").read_text()
    assert "x: simulated time (`sim_time_s` at the end of a round), in seconds" in md
    assert "step function" in md and "no interpolation" in md
    png = (out / "test_accuracy.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000


def test_until_compares_at_equal_simulated_time(ab, tmp_path):
    """--until 350: a keeps rounds 1-3 (final 0.5 at 300 s, reaches 0.45 at 300 s), b
    rounds 1-2 (final 0.4 at 350 s, never reaches 0.45)."""
    out = tmp_path / "out"
    table = build_report(ab, str(out), target=0.45, x="sim_time", until=350).table
    row = table.splitlines()[2]
    assert row == ("| fedavg | 2 | 0, 1 | 0.4500 ± 0.0500 | 0.4500 ± 0.0500 | "
                   "3.0 (1/2 reached) | 300.0 | 2–3 | 325.0 ± 25.0 |")
    md = (out / "report.md").read_text()
    assert "cut at --until 350 (`sim_time_s`)" in md and "note:" not in md
    # a budget beyond both runs: each is read at its end, and report.md says so
    build_report(ab, str(tmp_path / "o2"), x="sim_time", until=1000)
    md = (tmp_path / "o2" / "report.md").read_text()
    assert f"note: {ab[0]} ends at sim_time_s 400, before --until 1000" in md
    assert f"note: {ab[1]} ends at sim_time_s 500, before --until 1000" in md
    with pytest.raises(FedrayError, match=r"a/metrics.jsonl has no 'test_accuracy' value at or "
                       r"before --until 50 \(sim_time_s\); its first is at sim_time_s 100$"):
        build_report(ab, str(tmp_path / "o3"), x="sim_time", until=50)
    # --until on the round axis cuts at a round
    build_report(ab, str(tmp_path / "o4"), until=2)
    data = json.loads((tmp_path / "o4" / "report.json").read_text())
    assert [r["final_round"] for r in data["runs"]] == [2, 2]
    assert (data["x"], data["until"]) == ("round", 2) and "time_unit" not in data


def test_hours_from_two_hours_on(tmp_path):
    """A run whose end reaches 7200 s puts the plot and the table in hours (2 decimals);
    one ending at 7199 s stays in seconds."""
    hours = write_clocked(tmp_path / "h", 0, [3600.0, 7200.0], [0.5, 0.7])
    secs = write_clocked(tmp_path / "s", 0, [3600.0, 7199.0], [0.5, 0.7])
    table = build_report([hours], str(tmp_path / "oh"), target=0.6, x="sim_time").table
    head, _, row = table.splitlines()
    assert "sim time to ≥ 0.6 (h)" in head and "final sim time (h)" in head
    assert row.endswith("| 2.0 (1/1 reached) | 2.00 | 2 | 2.00 |")
    assert "in hours" in (tmp_path / "oh" / "report.md").read_text()
    table = build_report([secs], str(tmp_path / "os"), target=0.6, x="sim_time").table
    assert table.splitlines()[2].endswith("| 2.0 (1/1 reached) | 7199.0 | 2 | 7199.0 |")
    # the cut decides too: the same run cut at 1 h is in seconds
    table = build_report([hours], str(tmp_path / "oc"), x="sim_time", until=3600).table
    assert "final sim time (s)" in table.splitlines()[0]


def test_a_run_without_the_clock_is_refused_in_one_line(ab, tmp_path, capsys):
    plain = write_clocked(tmp_path / "plain", 2, **A, clock=False)
    out = tmp_path / "out"
    assert main(["report", *ab, plain, "--out", str(out), "--x", "sim_time"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"fedray: error: --x sim_time: run {plain} has no sim_time_s (round 1 of "
                   "metrics.jsonl): it ran without clock.enabled: true; report it with --x "
                   "round"]
    assert not out.exists()
    assert main(["report", *ab, plain, "--out", str(out)]) == 0  # rounds need no clock
    capsys.readouterr()


def test_simulated_time_never_goes_back(tmp_path):
    bad = write_clocked(tmp_path / "bad", 0, [100.0, 90.0], [0.1, 0.2])
    with pytest.raises(FedrayError, match=r"bad/metrics.jsonl round 2: sim_time_s goes back "
                       r"\(90 after 100\)"):
        build_report([bad], str(tmp_path / "out"), x="sim_time")


def test_wall_time_counts_on_across_a_resume(tmp_path):
    """elapsed_s restarts at a resume (round 3 here): the rounds' wall time goes on from
    the value before it, 20 + 5 and 20 + 15."""
    run = write_clocked(tmp_path / "r", 0, [1.0, 2.0, 3.0, 4.0], [0.1, 0.2, 0.3, 0.4],
                        elapsed=[10.0, 20.0, 5.0, 15.0])
    (result,) = _group([run], x="wall_time", target=0.3).results
    assert result.x == {1: 10.0, 2: 20.0, 3: 25.0, 4: 35.0}
    assert (result.x_to_target, result.final_x) == (25.0, 35.0)
    table = build_report([run], str(tmp_path / "out"), x="wall_time").table
    assert table.splitlines()[0].endswith("| final round | final wall time (s) |")


def test_a_method_without_a_common_time_is_noted_not_plotted(tmp_path):
    a = write_clocked(tmp_path / "a", 0, [100.0, 200.0], [0.1, 0.2])
    b = write_clocked(tmp_path / "b", 1, [300.0, 400.0], [0.3, 0.4])
    build_report([a, b], str(tmp_path / "out"), x="sim_time")
    assert "note: the runs of fedavg share no simulated time with a test_accuracy value" in \
        (tmp_path / "out" / "report.md").read_text()


def test_the_default_round_report_ignores_the_clock(ab, tmp_path):
    """Without --x and --until a clocked run's report is byte for byte what the same run
    without sim_round_s and sim_time_s gives (the same directories, rewritten), and the
    round report keeps its columns and keys."""
    build_report(ab, str(tmp_path / "clocked"), target=0.45)
    for run in ab:
        path = Path(run) / "metrics.jsonl"
        recs = [json.loads(line) for line in path.read_text().splitlines()]
        for rec in recs:
            del rec["sim_round_s"], rec["sim_time_s"]
        path.write_text("".join(json.dumps(rec) + "\n" for rec in recs))
    build_report(ab, str(tmp_path / "plain"), target=0.45)
    names = sorted(p.name for p in (tmp_path / "plain").iterdir())
    assert names == ["report.csv", "report.json", "report.md", "test_accuracy.png"]
    for name in names:
        assert (tmp_path / "clocked" / name).read_bytes() == \
            (tmp_path / "plain" / name).read_bytes(), name
    # the format a round report had before --x existed
    assert (tmp_path / "plain" / "report.csv").read_text().splitlines()[0] == (
        "method,runs,seeds,final_mean,final_std,best_mean,best_std,rounds_to_target_mean,"
        "rounds_to_target_std,reached,final_round_min,final_round_max")
    data = json.loads((tmp_path / "plain" / "report.json").read_text())
    assert list(data) == ["metric", "lower_is_better", "target", "group_by", "grouping",
                          "allow_differing", "std", "groups", "runs"]
    assert list(data["runs"][0]) == ["run_dir", "group", "seed", "final", "final_round",
                                     "best", "best_round", "rounds_to_target"]
    md = (tmp_path / "plain" / "report.md").read_text()
    assert "x: " not in md and "--until" not in md


def test_cli_time_options(ab, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["report", *ab, "--out", str(out), "--x", "sim_time", "--until", "350",
                 "--target", "0.45"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].endswith("| final round | final sim time (s) |")
    assert lines[3].endswith("| 300.0 | 2–3 | 325.0 ± 25.0 |")
    with pytest.raises(SystemExit):
        main(["report", *ab, "--out", str(tmp_path / "o2"), "--x", "simtime"])
    assert "invalid choice: 'simtime'" in capsys.readouterr().err
    assert main(["report", *ab, "--out", str(tmp_path / "o3"), "--until", "-1"]) == 2
    assert capsys.readouterr().err.strip() == \
        "fedray: error: --until must be a positive number, got -1"
