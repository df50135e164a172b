"""``fedray report --vs KEY --at ROUNDS`` and the report's order, labels and line styles, on
hand-written run directories (config.yaml + metrics.jsonl, no training): a participation
study of 3 algorithms x clients_per_round 5/10/20 x 2 seeds, every number checked against
the values written here."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf
from test_report import _error as report_error

from fedray.cli import main
from fedray.errors import FedrayError
from fedray.tracking.report import (
    ClientGroup,
    build_report,
    cdf_figure,
    curves_figure,
    group_labels,
    group_runs,
    load_run,
    rounds_text,
    value_order,
    vs_figure,
    vs_lines,
    vs_panels,
    vs_scale,
)

ROUNDS = 30
EVERY = 5  # test_accuracy at rounds 5, 10, ..., 30
KEY = "sampling.clients_per_round"
METHODS = ("fedavg", "fedprox", "scaffold")
CPRS = (10, 20, 5)  # the order a shell glob gives trial names (cpr=10 < cpr=20 < cpr=5)
SEEDS = (0, 1)


def accuracy(method: str, cpr: int, seed: int, r: int) -> float:
    """Known, uneven values: fewer clients per round learn slower, so participation matters
    at round 10-20 and hardly by round 30; a dip at round 25 makes the best not the last."""
    speed = {"fedavg": 6.0, "fedprox": 5.0, "scaffold": 4.0}[method] * (20 / cpr) ** 0.5
    dip = 0.02 if r == 25 else 0.0
    return 0.58 * (1 - math.exp(-r / speed)) + 0.003 * seed + 0.001 * cpr / 5 - dip \
        + (0.004 if r == 20 and seed == 1 else 0.0)


def write_run(path: Path, method: str, cpr: int, seed: int, every: int = EVERY,
              rounds: int = ROUNDS) -> str:
    """A run directory as ``fedray run`` leaves it: a FedProx run's config has its
    algorithm.fedprox section, the others none (as fedray writes them)."""
    path.mkdir(parents=True)
    algorithm: dict = {"name": method}
    if method == "fedprox":
        algorithm["fedprox"] = {"mu": 0.01}
    cfg = {"name": "participation", "seed": seed, "rounds": rounds, "algorithm": algorithm,
           "client": {"lr": 0.05}, "sampling": {"clients_per_round": cpr},
           "output": {"dir": str(path)}}
    (path / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(cfg)))
    lines = []
    for r in range(1, rounds + 1):
        rec: dict = {"round": r, "train_loss": 1.0 / r}
        if r % every == 0:
            rec["test_accuracy"] = accuracy(method, cpr, seed, r)
        lines.append(json.dumps(rec) + "\n")
    (path / "metrics.jsonl").write_text("".join(lines))
    return str(path)


def trial_name(method: str, cpr: int, seed: int) -> str:
    return f"name={method},clients_per_round={cpr},seed={seed}"


@pytest.fixture
def study(tmp_path) -> list[str]:
    """The 18 runs, given in the order ``trials/*`` gives them: string order."""
    runs = [write_run(tmp_path / "trials" / trial_name(m, c, s), m, c, s)
            for m in METHODS for c in CPRS for s in SEEDS]
    return sorted(runs)


def _error(argv, capsys) -> str:
    """The CLI's one error line (test_report's check), without its prefix."""
    return report_error(argv, capsys).removeprefix("fedray: error: ")


def _csv(out: Path) -> list[dict]:
    with open(out / "report.csv", newline="") as f:
        return list(csv.DictReader(f))


def _labels(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def _lines(ax):
    return [ln for ln in ax.get_lines() if not ln.get_label().startswith("_")
            and not ln.get_label().startswith("target")]


def _assert_legend_outside(fig) -> None:
    """The legend's box, drawn, lies right of every axes' box: it covers no curve."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    assert len(legends) == 1
    box = legends[0].get_window_extent(renderer)
    for ax in fig.axes:
        assert box.x0 >= ax.get_window_extent(renderer).x1
        assert not box.overlaps(ax.get_window_extent(renderer))


def _assert_distinct_styles(ax, count: int) -> None:
    lines = _lines(ax)
    assert len(lines) == count
    pairs = {(ln.get_linestyle(), ln.get_marker()) for ln in lines}
    assert len(pairs) == count  # told apart without colour
    assert all(marker not in (None, "None", "") for _, marker in pairs)


# ---- order and labels (every report, --vs or not) ----

def test_value_order_is_numeric_for_numbers_and_as_given_otherwise():
    assert value_order([10, 20, 5, 20]) == [5, 10, 20]
    assert value_order([0.1, 0.05, 1e-3]) == [1e-3, 0.05, 0.1]
    assert value_order(["scaffold", "fedavg", "scaffold"]) == ["scaffold", "fedavg"]
    assert value_order(["(absent)", 5, "b", 2, True]) == ["(absent)", 2, 5, "b", True]


def test_groups_are_in_numeric_order_in_tables_and_legend(study, tmp_path):
    """Glob order gives clients_per_round 10, 20, 5; every table and legend gives 5, 10, 20
    (methods in the order their first run appears: fedavg, fedprox, scaffold)."""
    out = tmp_path / "out"
    report = build_report(study, str(out))
    want = [(m, c) for m in METHODS for c in (5, 10, 20)]
    rows = _csv(out)
    assert [(r["algorithm.name"], int(r[KEY])) for r in rows] == want
    table_rows = report.table.splitlines()[2:]
    assert [ln.split(" | ")[0] for ln in table_rows] == \
        [f"| {r['method']}" for r in rows]
    data = json.loads((out / "report.json").read_text())
    assert [(g["algorithm.name"], g[KEY]) for g in data["groups"]] == want
    groups = group_runs([load_run(u) for u in study], "test_accuracy", None, None)
    fig, skipped = curves_figure(groups, "test_accuracy", None, "t")
    assert skipped == []
    assert _labels(fig.axes[0]) == [f"{r['method']} (n=2)" for r in rows]


def test_labels_name_only_keys_that_differ_and_are_set(study, tmp_path):
    """FedAvg and SCAFFOLD runs have no algorithm.fedprox section: their labels do not say
    ``algorithm.fedprox.mu=(absent)``; FedProx's says its mu (it differs and is set).
    client.lr, the same in every run, is in no label."""
    build_report(study, str(tmp_path / "out"))
    methods = [r["method"] for r in _csv(tmp_path / "out")]
    assert methods[:3] == [f"algorithm.name=fedavg, {KEY}={c}" for c in (5, 10, 20)]
    assert methods[3] == f"algorithm.name=fedprox, {KEY}=5, algorithm.fedprox.mu=0.01"
    assert methods[6] == f"algorithm.name=scaffold, {KEY}=5"
    md = (tmp_path / "out" / "report.md").read_text()
    assert "=(absent)" not in md and "client.lr" not in md
    # the value itself stays in its column, for a reader of report.csv
    assert _csv(tmp_path / "out")[0]["algorithm.fedprox.mu"] == "(absent)"


def test_a_group_that_sets_none_of_its_keys_says_so(tmp_path):
    a = write_run(tmp_path / "a", "fedavg", 10, 0)
    b = write_run(tmp_path / "b", "fedprox", 10, 0)
    groups = group_runs([load_run(u) for u in (a, b)], "test_accuracy", None, None)
    # grouped by algorithm.fedprox.mu alone: FedAvg's group sets it not
    assert group_labels(groups, ["algorithm.fedprox.mu"], names=False) == [
        "algorithm.fedprox.mu unset", "algorithm.fedprox.mu=0.01"]


# ---- --vs: the numbers ----

def _point_stats(values: list[float]) -> dict:
    """By hand: the mean of two seeds is their sum halved (what numpy's mean computes for
    two values); std is the population std; the band min-max."""
    a = np.asarray(values, dtype=float)
    mean = sum(values) / len(values) if len(values) == 2 else float(a.mean())
    return {"mean": mean, "std": float(a.std(ddof=0)), "min": min(values), "max": max(values),
            "n": len(values)}


def test_vs_at_rounds_and_best_equal_a_hand_computation(study, tmp_path):
    out = tmp_path / "out"
    report = build_report(study, str(out), vs=KEY, at="20,10")  # any order, sorted
    data = json.loads((out / "report.json").read_text())["vs"]
    assert data["key"] == KEY and data["at"] == [10, 20]
    assert data["panels"] == ["round_10", "round_20", "best"]
    assert data["method_keys"] == ["algorithm.name", "algorithm.fedprox.mu"]
    assert data["x_scale"] == "log"
    assert [m["method"] for m in data["methods"]] == [
        "algorithm.name=fedavg", "algorithm.name=fedprox, algorithm.fedprox.mu=0.01",
        "algorithm.name=scaffold"]
    for method, line in zip(METHODS, data["methods"], strict=True):
        assert [p[KEY] for p in line["points"]] == [5, 10, 20]
        for point in line["points"]:
            cpr = point[KEY]
            assert point["seeds"] == [0, 1]
            for r in (10, 20):
                want = _point_stats([accuracy(method, cpr, s, r) for s in SEEDS])
                assert point[f"round_{r}"] == want  # exact, not approx
            best = [max(accuracy(method, cpr, s, r) for r in range(EVERY, ROUNDS + 1, EVERY))
                    for s in SEEDS]
            assert point["best"] == _point_stats(best)
    # report.csv: the same numbers on each method x value row, unrounded
    rows = {(r["algorithm.name"], int(r[KEY])): r for r in _csv(out)}
    row = rows[("fedprox", 5)]
    assert row["vs_method"] == "algorithm.name=fedprox, algorithm.fedprox.mu=0.01"
    want = _point_stats([accuracy("fedprox", 5, s, 20) for s in SEEDS])
    assert float(row["round_20_mean"]) == want["mean"]
    assert float(row["round_20_std"]) == want["std"]
    # report.md and stdout: mean ± std, runs and seeds
    lines = report.vs_table.splitlines()
    assert lines[0] == f"| method | {KEY} | runs | seeds | round 10 | round 20 | best |"
    assert len(lines) == 2 + 9
    w10 = _point_stats([accuracy("scaffold", 20, s, 10) for s in SEEDS])
    w20 = _point_stats([accuracy("scaffold", 20, s, 20) for s in SEEDS])
    assert lines[-1].startswith(f"| algorithm.name=scaffold | 20 | 2 | 0, 1 | "
                                f"{w10['mean']:.4f} ± {w10['std']:.4f} | "
                                f"{w20['mean']:.4f} ± {w20['std']:.4f} | ")
    md = (out / "report.md").read_text()
    assert f"## test_accuracy against {KEY}" in md and report.vs_table in md
    assert f"![test_accuracy against {KEY}](test_accuracy_vs_{KEY}.png)" in md
    png = (out / f"test_accuracy_vs_{KEY}.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert report.files[:2] == ["test_accuracy.png", f"test_accuracy_vs_{KEY}.png"]


def test_vs_without_at_shows_the_final_round_and_the_best(study, tmp_path):
    out = tmp_path / "out"
    report = build_report(study, str(out), vs=KEY)
    assert report.vs_table.splitlines()[0].endswith("| final (round 30) | best |")
    data = json.loads((out / "report.json").read_text())["vs"]
    assert data["at"] is None and data["panels"] == ["final", "best"]
    point = data["methods"][0]["points"][0]  # fedavg, 5 clients per round
    assert point["final"] == _point_stats([accuracy("fedavg", 5, s, 30) for s in SEEDS])


def test_vs_with_group_by_names_the_methods(study, tmp_path):
    """--group-by gives the method keys; --vs KEY is added to them for the points."""
    report = build_report(study, str(tmp_path / "out"), group_by="algorithm.name", vs=KEY,
                          at=[10])
    assert report.group_by == ["algorithm.name", KEY]
    assert "(--group-by, and --vs)" in report.grouping
    data = json.loads((tmp_path / "out" / "report.json").read_text())["vs"]
    assert [m["method"] for m in data["methods"]] == [f"algorithm.name={m}" for m in METHODS]


def test_a_sweep_directory_stands_for_its_finished_trials(study, tmp_path):
    """One command from a sweep's directory: its trials.json's finished trials, the others
    named in report.md."""
    names = sorted(Path(u).name for u in study)
    stopped = names[0]
    (tmp_path / "trials.json").write_text(json.dumps({"trials": [
        {"trial": n, "params": {}, "status": "stopped early" if n == stopped else "finished"}
        for n in names]}))
    out = tmp_path / "out"
    build_report([str(tmp_path)], str(out), vs=KEY, at="10,20,30")
    runs = [r["run_dir"] for r in json.loads((out / "report.json").read_text())["runs"]]
    assert len(runs) == 17 and str(tmp_path / "trials" / stopped) not in runs
    assert f"left out: `{stopped}` (stopped early)" in (out / "report.md").read_text()


# ---- --vs: refusals, one line, nothing written ----

def test_a_round_without_a_value_is_refused_naming_the_run_and_its_rounds(study, tmp_path,
                                                                           capsys):
    out = tmp_path / "out"
    msg = _error(["report", *study, "--out", str(out), "--vs", KEY, "--at", "10,12"], capsys)
    assert msg == (f"--at 12: run {study[0]} has no test_accuracy value at round 12; it has "
                   "values at rounds 5 to 30 every 5")
    sparse = write_run(tmp_path / "sparse", "fedavg", 40, 2, every=10)  # 10, 20, 30
    msg = _error(["report", *study, sparse, "--out", str(out), "--vs", KEY, "--at", "15,20"],
                 capsys)
    assert msg == (f"--at 15: run {sparse} has no test_accuracy value at round 15; it has "
                   "values at rounds 10 to 30 every 10")
    assert not out.exists()


@pytest.mark.parametrize("extra, message", [
    (["--vs", "client.lr"], "--vs client.lr: all 18 runs have client.lr=0.05; it does not vary "
                            f"between the runs (keys that do: algorithm.name, {KEY}, "
                            "algorithm.fedprox.mu)"),
    (["--vs", "algorithm.fedprox.mu"], "--vs algorithm.fedprox.mu: RUN0/config.yaml has no "
                                       "algorithm.fedprox.mu; every run must set the key its "
                                       "metric is plotted against"),
    (["--vs", "seed"], "--vs seed: one of the keys the runs of a method may differ in (seed, "
                       "name, rounds, output.*, runtime.*, ...), not a setting to plot "
                       "against; choose a key the runs were swept over"),
    (["--vs", KEY, "--x", "sim_time"], f"--vs and --x sim_time cannot be combined: --vs puts "
                                       f"{KEY}'s values on the x axis and reads each run at "
                                       "rounds (--at); make the report against simulated "
                                       "time separately"),
    (["--vs", KEY, "--until", "20"], "--vs and --until cannot be combined: --vs reads each "
                                     "run at the rounds of --at (and at its best over all "
                                     "rounds); name the rounds with --at instead"),
    (["--at", "10"], "--at needs --vs KEY: it names the rounds at which the metric is plotted "
                     "against KEY's values"),
    (["--vs", KEY, "--at", "10,twenty"], "--at 10,twenty: give rounds as positive integers "
                                         "separated by commas, e.g. --at 10,20,30"),
    (["--vs", KEY, "--at", "0"], "--at 0: give rounds as positive integers separated by "
                                 "commas, e.g. --at 10,20,30"),
    (["--vs", f"{KEY},client.lr"], f"--vs '{KEY},client.lr': give one dotted config key, e.g. "
                                   f"--vs {KEY}"),
])
def test_vs_refusals_are_one_line_and_write_nothing(study, tmp_path, capsys, extra, message):
    out = tmp_path / "out"
    msg = _error(["report", *study, "--out", str(out), *extra], capsys)
    assert msg == message.replace("RUN0", study[0])
    assert not out.exists()


def test_vs_refusals_from_the_api_raise_before_writing(study, tmp_path):
    with pytest.raises(FedrayError, match="--at 7: run "):
        build_report(study, str(tmp_path / "out"), vs=KEY, at=[7])
    assert not (tmp_path / "out").exists()


# ---- the plots: styles, legend outside, axis ----

def _vs_setup(urls, at=(10, 20)):
    runs = [load_run(u) for u in urls]
    method_keys = ["algorithm.name", "algorithm.fedprox.mu"]
    groups = group_runs(runs, "test_accuracy", None, None, order=[*method_keys, KEY])
    panels = vs_panels(list(at))
    return vs_lines(groups, KEY, method_keys, panels, True), panels


def test_vs_figure_panels_styles_legend_and_axis(study):
    lines, panels = _vs_setup(study)
    fig = vs_figure(lines, KEY, panels, "test_accuracy", "participation")
    axes = fig.axes
    assert [ax.get_title() for ax in axes] == ["round 10", "round 20", "best"]
    assert axes[0].get_shared_y_axes().joined(axes[0], axes[2])  # one y axis for all panels
    for ax in axes:
        _assert_distinct_styles(ax, 3)
        assert ax.get_xscale() == "log"
        assert [t.get_text() for t in ax.get_xticklabels()] == ["5", "10", "20"]
        for ln in _lines(ax):
            assert list(ln.get_xdata()) == [5.0, 10.0, 20.0]  # numeric order
    # the plotted means are the table's: round 20, fedavg
    ys = _lines(axes[1])[0].get_ydata()
    assert list(ys) == [_point_stats([accuracy("fedavg", c, s, 20) for s in SEEDS])["mean"]
                        for c in (5, 10, 20)]
    assert _labels(axes[-1])[0] == "algorithm.name=fedavg (n=2)"
    _assert_legend_outside(fig)


def test_the_curves_and_client_plots_have_styles_and_an_outside_legend(study):
    groups = group_runs([load_run(u) for u in study], "test_accuracy", None, None)
    fig, _ = curves_figure(groups, "test_accuracy", 0.5, "t")
    _assert_distinct_styles(fig.axes[0], 9)
    _assert_legend_outside(fig)
    rng = np.random.default_rng(0)
    cgroups = [ClientGroup(label=f"m{i}", rounds=[30], runs=1,
                           values={"accuracy": rng.random(50),
                                   "personalized_accuracy": rng.random(50)})
               for i in range(3)]
    fig = cdf_figure(cgroups, "accuracy", "t")
    _assert_distinct_styles(fig.axes[0], 6)
    _assert_legend_outside(fig)


def test_log_axis_only_for_evenly_spaced_ratios():
    assert vs_scale([5, 10, 20]) == "log"
    assert vs_scale([10, 50, 100, 500]) == "log"
    assert vs_scale([1e-3, 1e-2, 1e-1]) == "log"
    assert vs_scale([1, 2, 3, 4]) == "linear"
    assert vs_scale([0, 0.01, 0.1]) == "linear"  # no log of 0
    assert vs_scale([10, 100]) == "linear"  # two values: any axis spaces them evenly
    assert vs_scale(["iid", "dirichlet"]) == "categorical"


def test_categorical_values_keep_their_order(tmp_path):
    runs = []
    for part in ("stores/b", "stores/a"):
        for s in SEEDS:
            url = write_run(tmp_path / f"{part[-1]}{s}", "fedavg", 10, s)
            cfg = OmegaConf.load(f"{url}/config.yaml")
            cfg.data = {"partition": part}
            OmegaConf.save(cfg, f"{url}/config.yaml")
            runs.append(url)
    build_report(runs, str(tmp_path / "out"), vs="data.partition")
    data = json.loads((tmp_path / "out" / "report.json").read_text())["vs"]
    assert data["x_scale"] == "categorical"
    assert [p["data.partition"] for p in data["methods"][0]["points"]] == ["stores/b",
                                                                           "stores/a"]


def test_rounds_text():
    assert rounds_text(list(range(5, 31, 5))) == "5 to 30 every 5"
    assert rounds_text(list(range(1, 21))) == "1 to 20"
    assert rounds_text([3, 7, 12]) == "3, 7, 12"
    assert rounds_text([1, 2, 3, 10, 20]) == "1 to 3, 10, 20"


def test_cli_prints_the_vs_table(study, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["report", *study, "--out", str(out), "--vs", KEY, "--at", "10,20,30"]) == 0
    text = capsys.readouterr().out
    assert f"test_accuracy against {KEY}:\n| method | {KEY} | runs | seeds | round 10 | " \
           "round 20 | round 30 | best |" in text
    assert text.rstrip().endswith(f"report in {out}")
    assert (out / f"test_accuracy_vs_{KEY}.png").is_file()


def test_cli_help_names_vs_and_at(capsys):
    with pytest.raises(SystemExit):
        main(["report", "--help"])
    text = capsys.readouterr().out
    assert "--vs KEY" in text and "--at ROUND[,ROUND...]" in text


def test_a_named_group_by_key_some_runs_lack_is_absent_there(study, tmp_path, capsys):
    """A sweep with choices groups by every key it sets, algorithm.fedprox.mu among them,
    which FedAvg's and SCAFFOLD's configs have no section for: (absent) there, and no
    label says so; a key no run has is still refused, as a misspelt key."""
    keys = ["algorithm.name", "algorithm.fedprox.mu", KEY]
    groups = group_runs([load_run(u) for u in study], "test_accuracy", keys, None)
    assert len(groups) == 9
    assert "(absent)" not in "".join(group_labels(groups, keys))
    build_report(study, str(tmp_path / "out"), group_by=keys)
    assert _error(["report", *study, "--out", str(tmp_path / "o2"), "--group-by",
                   "algorithm.fedprox.muu"], capsys).startswith(
        "group-by key 'algorithm.fedprox.muu' is not in ")
    assert not (tmp_path / "o2").exists()
