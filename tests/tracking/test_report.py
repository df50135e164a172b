"""``fedray report`` on hand-written run directories (no Ray): numbers, files and errors."""

from __future__ import annotations

import csv
import json
import uuid

import fsspec
import numpy as np
import pytest
from omegaconf import OmegaConf

from fedray.cli import main
from fedray.errors import FedrayError
from fedray.tracking.report import build_report, curve, group_runs, load_run

ROUNDS = 20
EVAL = np.arange(2, ROUNDS + 1, 2)  # test_accuracy every 2 rounds
TARGET = 0.7


def _acc(method: str, seed: int, rounds: np.ndarray) -> np.ndarray:
    """Known curves, not monotonic (best != final): fedprox learns faster; fedavg seed 2 never
    reaches TARGET."""
    wobble = 0.03 * np.sin(rounds + seed)
    if method == "fedavg":
        return (0.8 * (1 - np.exp(-rounds / 8)) + 0.01 * seed - (0.15 if seed == 2 else 0.0)
                + wobble)
    return 0.9 * (1 - np.exp(-rounds / 5)) - 0.02 * seed + wobble


def _loss(method: str, seed: int, rounds: np.ndarray) -> np.ndarray:
    return 2.5 - 2.0 * _acc(method, seed, rounds)


def write_run(url: str, method: str, seed: int, cpr: int = 10, eval_rounds=EVAL,
              name: str | None = None, **extra) -> str:
    """A run directory as ``fedray run`` leaves it (config.yaml, metrics.jsonl, summary.json),
    at any fsspec URL; ``extra``: more config keys (``client={"lr": 0.1}``)."""
    fs, path = fsspec.core.url_to_fs(url)
    fs.makedirs(path, exist_ok=True)
    cfg = OmegaConf.create({"name": name or method, "seed": seed, "rounds": ROUNDS,
                            "algorithm": {"name": method},
                            "sampling": {"clients_per_round": cpr},
                            "output": {"dir": url}})  # differs between every two runs
    cfg = OmegaConf.merge(cfg, extra)
    with fs.open(f"{path}/config.yaml", "w") as f:
        f.write(OmegaConf.to_yaml(cfg))
    evals = set(int(r) for r in eval_rounds)
    lines = []
    for r in range(1, ROUNDS + 1):
        rec = {"round": r, "train_loss": 3.0 / r, "clients": cpr}
        if r in evals:
            rr = np.asarray([r])
            rec["test_accuracy"] = float(_acc(method, seed, rr)[0])
            rec["test_loss"] = float(_loss(method, seed, rr)[0])
        lines.append(json.dumps(rec))
    with fs.open(f"{path}/metrics.jsonl", "w") as f:
        f.write("\n".join(lines) + "\n")
    with fs.open(f"{path}/summary.json", "w") as f:
        f.write(json.dumps({"name": method, "rounds": ROUNDS}))
    return url


@pytest.fixture
def runs(tmp_path):
    """2 methods x 3 seeds, interleaved on the command line with fedprox first."""
    out = []
    for seed in range(3):
        for method in ("fedprox", "fedavg"):
            out.append(write_run(str(tmp_path / "runs" / f"{method}-s{seed}"), method, seed))
    return out


def _expected(method, metric="test_accuracy", target=None):
    curves = np.stack([(_acc if metric == "test_accuracy" else _loss)(method, s, EVAL)
                       for s in range(3)])
    lower = "loss" in metric
    final = curves[:, -1]
    best = curves.min(axis=1) if lower else curves.max(axis=1)
    rtt = []
    if target is not None:
        hit = curves <= target if lower else curves >= target
        rtt = [int(EVAL[row.argmax()]) for row in hit if row.any()]
    return final, best, rtt


def _csv_rows(out):
    with open(out / "report.csv", newline="") as f:
        return {row["method"]: row for row in csv.DictReader(f)}


def test_table_means_stds_and_rounds_to_target(runs, tmp_path):
    out = tmp_path / "report"
    table = build_report(runs, str(out), group_by="algorithm.name", target=TARGET).table
    rows = _csv_rows(out)
    assert list(rows) == ["algorithm.name=fedprox", "algorithm.name=fedavg"]  # first seen first
    lines = table.splitlines()
    assert lines[0].startswith("| method | runs | seeds | final test_accuracy")
    assert "rounds to ≥ 0.7" in lines[0]
    for method in ("fedavg", "fedprox"):
        final, best, rtt = _expected(method, target=TARGET)
        row = rows[f"algorithm.name={method}"]
        assert row["runs"] == "3" and row["seeds"] == "0, 1, 2"
        assert float(row["final_mean"]) == pytest.approx(final.mean())
        assert float(row["final_std"]) == pytest.approx(final.std(ddof=0))
        assert float(row["best_mean"]) == pytest.approx(best.mean())
        assert float(row["best_std"]) == pytest.approx(best.std(ddof=0))
        assert float(row["rounds_to_target_mean"]) == pytest.approx(np.mean(rtt))
        assert float(row["rounds_to_target_std"]) == pytest.approx(np.std(rtt))
        assert row["reached"] == str(len(rtt))
        assert row["final_round_min"] == row["final_round_max"] == "20"
        md_row = next(ln for ln in lines if ln.startswith(f"| algorithm.name={method} |"))
        assert f"{final.mean():.4f} ± {final.std():.4f}" in md_row
        assert f"{best.mean():.4f} ± {best.std():.4f}" in md_row
        assert f"{np.mean(rtt):.1f} ± {np.std(rtt):.1f} ({len(rtt)}/3 reached)" in md_row
        assert md_row.endswith("| 20 |")
    assert "(2/3 reached)" in next(ln for ln in lines if "fedavg" in ln)
    assert "(3/3 reached)" in next(ln for ln in lines if "fedprox" in ln)

    report = json.loads((out / "report.json").read_text())
    assert report["metric"] == "test_accuracy" and report["target"] == TARGET
    per_run = {r["run_dir"]: r for r in report["runs"]}
    assert set(per_run) == set(runs)
    never = per_run[str(tmp_path / "runs" / "fedavg-s2")]
    assert never["rounds_to_target"] is None and never["seed"] == 2
    assert never["group"] == "algorithm.name=fedavg"
    assert never["final"] == pytest.approx(_acc("fedavg", 2, EVAL)[-1])
    assert never["best"] == pytest.approx(_acc("fedavg", 2, EVAL).max())
    fast = per_run[str(tmp_path / "runs" / "fedprox-s0")]
    assert fast["rounds_to_target"] == int(EVAL[np.argmax(_acc("fedprox", 0, EVAL) >= TARGET)])

    md = (out / "report.md").read_text()
    assert table in md and "test_accuracy" in md and "≥ 0.7" in md
    assert all(f"`{r}`" in md for r in runs)  # the run directories used are listed


def test_plot_is_a_png(runs, tmp_path):
    out = tmp_path / "report"
    build_report(runs, str(out), target=TARGET, title="FedProx vs FedAvg")
    png = (out / "test_accuracy.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    assert sorted(p.name for p in out.iterdir()) == [
        "report.csv", "report.json", "report.md", "test_accuracy.png"]
    assert (out / "report.md").read_text().startswith("# FedProx vs FedAvg\n")


def test_runs_that_differ_only_in_lr_are_three_methods(tmp_path, capsys):
    """Three runs with one name that differ only in client.lr are three methods, not three
    "seeds" of one (before, the default grouping by name averaged them as seeds 0, 0, 0);
    the report and stdout say which key it grouped by. The methods are in numeric order of
    client.lr, not in the order given."""
    runs = [write_run(str(tmp_path / f"lr{lr}"), "fedavg", 0, name="baseline",
                      client={"lr": lr}) for lr in (0.1, 0.05, 0.01)]
    report = build_report(runs, str(tmp_path / "out"))
    assert report.group_by == ["client.lr"]
    labels = [ln.split(" | ")[0] for ln in report.table.splitlines()[2:]]
    assert labels == ["| client.lr=0.01", "| client.lr=0.05", "| client.lr=0.1"]
    assert all(" | 1 | 0 | " in ln for ln in report.table.splitlines()[2:])  # one run each
    md = (tmp_path / "out" / "report.md").read_text()
    assert "grouped by: client.lr -- the config keys whose values differ between the runs, " \
           "less seed, name, rounds, output.*, runtime.*, checkpoint.*" in md
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert data["group_by"] == ["client.lr"] and data["grouping"] == "differing keys"
    assert [g["client.lr"] for g in data["groups"]] == [0.01, 0.05, 0.1]
    assert main(["report", *runs, "--out", str(tmp_path / "cli")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("grouped by: client.lr -- ") and out[1].startswith("| method |")


def test_seeds_and_how_runs_ran_stay_one_method(tmp_path):
    """Runs that differ in seed, output.dir, runtime.* and checkpoint.* are repetitions:
    two learning rates x two seeds are two methods of two runs each."""
    runs = [write_run(str(tmp_path / f"lr{lr}-s{s}"), "fedavg", s, name=f"lr{lr}-s{s}",
                      client={"lr": lr}, runtime={"num_workers": 1 + s},
                      checkpoint={"every": 5 * s}) for lr in (0.1, 0.01) for s in (0, 1)]
    report = build_report(runs, str(tmp_path / "out"))
    assert report.group_by == ["client.lr"]
    rows = _csv_rows(tmp_path / "out")
    assert list(rows) == ["client.lr=0.01", "client.lr=0.1"]  # names differ within a group
    assert [r["seeds"] for r in rows.values()] == ["0, 1", "0, 1"]
    final = [_acc("fedavg", s, EVAL)[-1] for s in (0, 1)]
    assert float(rows["client.lr=0.1"]["final_mean"]) == pytest.approx(np.mean(final))


def test_names_label_the_groups_they_tell_apart(tmp_path):
    """Runs named after their method: the label is the name with the keys that differ."""
    runs = [write_run(str(tmp_path / f"{m}-s{s}"), m, s) for m in ("fedprox", "fedavg")
            for s in (0, 1)]
    report = build_report(runs, str(tmp_path / "out"))
    assert report.group_by == ["algorithm.name"]
    assert list(_csv_rows(tmp_path / "out")) == ["fedprox (algorithm.name=fedprox)",
                                                 "fedavg (algorithm.name=fedavg)"]


def test_runs_that_differ_in_nothing_are_one_method_and_single_run_has_no_std(tmp_path):
    a = write_run(str(tmp_path / "a"), "fedavg", 0, name="baseline")
    b = write_run(str(tmp_path / "b"), "fedavg", 1, name="baseline")
    report = build_report([a, b], str(tmp_path / "out"))
    assert report.group_by == [] and "| baseline | 2 | 0, 1 |" in report.table
    assert "grouped by: nothing (the runs differ in no such key: one method)" in \
        (tmp_path / "out" / "report.md").read_text()
    c = write_run(str(tmp_path / "c"), "fedprox", 1, name="prox-only")
    table = build_report([c], str(tmp_path / "out1")).table
    lines = table.splitlines()
    single = _acc("fedprox", 1, EVAL)
    assert lines[2].startswith("| prox-only | 1 | 1 |")
    assert f"| {single[-1]:.4f} | {single.max():.4f} |" in lines[2] and "±" not in lines[2]
    assert "rounds to" not in lines[0]  # no --target, no column
    assert "rounds_to_target_mean" not in (tmp_path / "out1" / "report.csv").read_text()


def test_a_group_of_different_methods_is_refused(tmp_path):
    """An explicit --group-by that leaves out a key the runs differ in (here the old default,
    name): the runs are not averaged as seeds of one method -- the report names the keys
    that differ and two runs, and writes nothing -- unless --allow-differing lets them
    differ. Keys that only say how a run was run (seed, output.dir, runtime.*) may differ
    within a group."""
    a = write_run(str(tmp_path / "a"), "fedavg", 0, name="baseline")
    b = write_run(str(tmp_path / "b"), "fedprox", 0, name="baseline")
    c = write_run(str(tmp_path / "c"), "fedavg", 1, name="baseline", cpr=20)
    out = tmp_path / "out"
    with pytest.raises(FedrayError, match=r"'name=baseline' are not repetitions of one method: "
                       r"they differ in algorithm.name \(and sampling.clients_per_round\) "
                       r"\(.*/a: 'fedavg', .*/b: 'fedprox'\); group them apart, e.g. --group-by "
                       r"name,algorithm.name,sampling.clients_per_round, or average them "
                       r"anyway with --allow-differing "
                       r"algorithm.name,sampling.clients_per_round$"):
        build_report([a, b, c], str(out), group_by="name")
    assert not out.exists()
    table = build_report([a, b, c], str(out),
                         group_by="algorithm.name,sampling.clients_per_round").table
    assert len(table.splitlines()) == 5  # header, rule, three methods
    with pytest.raises(FedrayError, match="differ in sampling.clients_per_round"):
        build_report([a, b, c], str(tmp_path / "o2"), group_by="name",
                     allow_differing="algorithm.name")
    report = build_report([a, b, c], str(tmp_path / "o3"), group_by="name",
                          allow_differing="algorithm.*,sampling.clients_per_round")
    assert "| name=baseline | 3 | 0, 0, 1 |" in report.table
    assert report.grouping == ("grouped by: name (--group-by); allowed to differ within a "
                               "method: algorithm.*, sampling.clients_per_round "
                               "(--allow-differing)")
    d = write_run(str(tmp_path / "d"), "fedavg", 2, name="baseline")
    for run, workers in ((a, 1), (d, 3)):  # how a run was placed is not part of the method
        cfg = OmegaConf.load(f"{run}/config.yaml")
        cfg.runtime = {"num_workers": workers}
        OmegaConf.save(cfg, f"{run}/config.yaml")
    table = build_report([a, d], str(tmp_path / "out2"), group_by="name").table
    assert "| name=baseline | 2 | 0, 2 |" in table


def test_loss_is_lower_is_better(runs, tmp_path):
    out = tmp_path / "report"
    target = 1.2
    table = build_report(runs, str(out), metric="test_loss", group_by="algorithm.name",
                         target=target).table
    assert "rounds to ≤ 1.2" in table.splitlines()[0]
    rows = _csv_rows(out)
    for method in ("fedavg", "fedprox"):
        final, best, rtt = _expected(method, "test_loss", target)
        row = rows[f"algorithm.name={method}"]
        assert float(row["best_mean"]) == pytest.approx(best.mean())  # the minimum loss
        assert float(row["rounds_to_target_mean"]) == pytest.approx(np.mean(rtt))
        assert row["reached"] == str(len(rtt))
    assert rows["algorithm.name=fedavg"]["reached"] == "2"
    assert (out / "test_loss.png").read_bytes().startswith(b"\x89PNG")


def test_group_by_two_keys(tmp_path):
    specs = [("fedavg", 0, 10), ("fedprox", 0, 10), ("fedavg", 1, 20), ("fedavg", 1, 10),
             ("fedprox", 1, 10)]
    runs = [write_run(str(tmp_path / f"r{i}"), m, s, cpr) for i, (m, s, cpr) in enumerate(specs)]
    out = tmp_path / "out"
    build_report(runs, str(out), group_by="algorithm.name, sampling.clients_per_round")
    rows = _csv_rows(out)
    assert list(rows) == ["algorithm.name=fedavg, sampling.clients_per_round=10",
                          "algorithm.name=fedavg, sampling.clients_per_round=20",
                          "algorithm.name=fedprox, sampling.clients_per_round=10"]
    first = rows["algorithm.name=fedavg, sampling.clients_per_round=10"]
    assert first["runs"] == "2" and first["seeds"] == "0, 1"
    assert first["algorithm.name"] == "fedavg" and first["sampling.clients_per_round"] == "10"
    finals = [_acc("fedavg", s, EVAL)[-1] for s in (0, 1)]
    assert float(first["final_mean"]) == pytest.approx(np.mean(finals))
    assert rows["algorithm.name=fedavg, sampling.clients_per_round=20"]["runs"] == "1"


def test_curve_uses_rounds_common_to_all_runs(tmp_path):
    a = write_run(str(tmp_path / "a"), "fedavg", 0, eval_rounds=[2, 4, 6, 8, 10, 12])
    b = write_run(str(tmp_path / "b"), "fedavg", 1, eval_rounds=[3, 6, 9, 12, 15])
    c = write_run(str(tmp_path / "c"), "fedavg", 2, eval_rounds=[6, 12, 18])
    (group,) = group_runs([load_run(u) for u in (a, b, c)], "test_accuracy", None, None)
    rounds, mean, lo, hi = curve(group)
    assert rounds.tolist() == [6, 12]
    v = np.stack([_acc("fedavg", s, rounds) for s in range(3)])
    np.testing.assert_allclose(mean, v.mean(axis=0))
    np.testing.assert_allclose(lo, v.min(axis=0))
    np.testing.assert_allclose(hi, v.max(axis=0))
    assert [r.final_round for r in group.results] == [12, 15, 18]  # each run's own last


def test_group_without_common_round_is_noted_not_plotted(tmp_path):
    a = write_run(str(tmp_path / "a"), "fedavg", 0, eval_rounds=[2, 4])
    b = write_run(str(tmp_path / "b"), "fedavg", 1, eval_rounds=[3, 5])
    build_report([a, b], str(tmp_path / "out"))
    md = (tmp_path / "out" / "report.md").read_text()
    assert "note: the runs of fedavg share no round with a test_accuracy value" in md
    assert (tmp_path / "out" / "test_accuracy.png").read_bytes().startswith(b"\x89PNG")


def test_memory_url(tmp_path):
    base = f"memory://fedray-report-test-{uuid.uuid4().hex}"
    runs = [write_run(f"{base}/{m}-s{s}", m, s) for m in ("fedavg", "fedprox") for s in (0, 1)]
    run = load_run(runs[0])
    assert run.config["algorithm"]["name"] == "fedavg" and len(run.metrics) == ROUNDS
    table = build_report(runs, str(tmp_path / "out"), group_by="algorithm.name").table
    final = [_acc("fedprox", s, EVAL)[-1] for s in (0, 1)]
    assert f"{np.mean(final):.4f} ± {np.std(final):.4f}" in table
    per_run = json.loads((tmp_path / "out" / "report.json").read_text())["runs"]
    assert [r["run_dir"] for r in per_run] == runs


def test_invalid_jsonl_names_file_and_line(tmp_path):
    url = write_run(str(tmp_path / "bad"), "fedavg", 0)
    with open(tmp_path / "bad" / "metrics.jsonl", "a") as f:
        f.write('{"round": 21, "test_accuracy": 0.5\n')
    with pytest.raises(FedrayError, match=r"bad/metrics.jsonl line 21: not valid JSON"):
        load_run(url)


def test_cli_prints_table_and_out_dir(runs, tmp_path, capsys):
    out = tmp_path / "cli-out"
    rc = main(["report", *runs, "--out", str(out), "--group-by", "algorithm.name",
               "--target", "0.7", "--title", "t"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    lines = captured.out.strip().splitlines()
    assert lines[0] == "grouped by: algorithm.name (--group-by)"
    assert "\x1b[" not in captured.out + captured.err
    assert lines[1].startswith("| method |") and "(2/3 reached)" in captured.out
    assert str(out) in lines[-1]
    md = (out / "report.md").read_text()
    assert lines[0] in md and "\n".join(lines[1:-1]) in md  # the table, as written


def test_cli_help(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["report", "--help"])
    assert exc.value.code == 0
    help_text = capsys.readouterr().out
    assert "--group-by" in help_text and "--target" in help_text and "examples:" in help_text


def _error(argv, capsys) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedray: error: "), err
    return lines[0]


def test_cli_errors_are_one_line_and_write_nothing(runs, tmp_path, capsys):
    out = tmp_path / "out"
    missing = str(tmp_path / "runs" / "nope")
    assert missing in _error(["report", runs[0], missing, "--out", str(out)], capsys)
    msg = _error(["report", *runs, "--out", str(out), "--metric", "test_acc"], capsys)
    assert "test_acc" in msg and "test_accuracy, test_loss, train_loss" in msg
    msg = _error(["report", *runs, "--out", str(out), "--group-by", "algorithm.nme"], capsys)
    assert "algorithm.nme" in msg and "config.yaml" in msg
    (tmp_path / "runs" / "fedavg-s1" / "config.yaml").unlink()
    msg = _error(["report", *runs, "--out", str(out)], capsys)
    assert str(tmp_path / "runs" / "fedavg-s1" / "config.yaml") in msg
    assert not out.exists()


def test_cli_refuses_out_dir_with_report(runs, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.md").write_text("earlier report\n")
    msg = _error(["report", *runs, "--out", str(out)], capsys)
    assert str(out / "report.md") in msg
    assert (out / "report.md").read_text() == "earlier report\n"
    assert [p.name for p in out.iterdir()] == ["report.md"]


def test_the_report_can_go_to_an_fsspec_url():
    """A sweep on a bucket writes its report next to its trials: --out can be a URL."""
    base = f"memory://fedray-report-out-{uuid.uuid4().hex}"
    runs = [write_run(f"{base}/runs/s{s}", "fedavg", s) for s in (0, 1)]
    table = build_report(runs, f"{base}/report").table
    fs = fsspec.filesystem("memory")
    names = {p.rsplit("/", 1)[-1] for p in fs.ls(f"{base}/report", detail=False)}
    assert names == {"report.md", "report.csv", "report.json", "test_accuracy.png"}
    assert table in fs.cat_file(f"{base}/report/report.md").decode()
    with pytest.raises(FedrayError, match="report.md already exists"):
        build_report(runs, f"{base}/report")


# ---- the distribution over clients: client_eval/round_NNNNNN.arrow as the driver writes it

def write_client_table(run: str, rnd: int, correct, count, personalized=None,
                       accuracy: bool = True) -> None:
    """A per-client table in the run directory's layout (Arrow IPC file format): client_id,
    count, loss_sum, correct, loss, accuracy (+ personalized_* columns)."""
    import pyarrow as pa

    count = np.asarray(count, np.int64)
    correct = np.asarray(correct, np.int64)
    loss_sum = count * 0.5 + np.arange(len(count))
    with np.errstate(invalid="ignore", divide="ignore"):
        cols = {"client_id": np.arange(len(count), dtype=np.int64) * 3, "count": count,
                "loss_sum": loss_sum}
        if accuracy:
            cols["correct"] = correct
        cols["loss"] = loss_sum / count
        if accuracy:
            cols["accuracy"] = correct / count
        if personalized is not None:
            p = np.asarray(personalized, np.int64)
            cols |= {"personalized_loss_sum": loss_sum / 2, "personalized_correct": p,
                     "personalized_loss": loss_sum / 2 / count,
                     "personalized_accuracy": p / count}
    table = pa.table(cols)
    fs, path = fsspec.core.url_to_fs(run)
    fs.makedirs(f"{path}/client_eval", exist_ok=True)
    with fs.open(f"{path}/client_eval/round_{rnd:06d}.arrow", "wb") as f:
        with pa.ipc.new_file(f, table.schema) as writer:
            writer.write_table(table)


def _stats(values):
    """Mean, 10th percentile (numpy linear) and the mean of the ceil(10%) lowest."""
    v = np.sort(np.asarray(values, dtype=np.float64))
    k = int(np.ceil(0.1 * len(v)))
    return v.mean(), np.percentile(v, 10), v[:k].mean()


def test_per_client_accuracy_at_the_final_round(tmp_path):
    """Two methods x two seeds with 12 clients each (one without test data): the report
    pools a method's clients at each run's last table, and its mean, 10th percentile and
    worst-10% mean are NumPy's over those values; personalized accuracy beside it."""
    g = np.random.default_rng(0)
    runs, expected = [], {}
    for method in ("fedavg", "fedprox"):
        pooled, pooled_p = [], []
        for seed in (0, 1):
            run = write_run(str(tmp_path / f"{method}-s{seed}"), method, seed)
            runs.append(run)
            count = g.integers(5, 40, size=12)
            count[4] = 0  # no test data: no accuracy, left out
            correct = g.integers(0, count + 1)
            personal = np.minimum(count, correct + 2)
            write_client_table(run, 10, np.zeros(12), count)  # an earlier round: not used
            write_client_table(run, 20, correct, count,
                               personalized=personal if method == "fedprox" else None)
            has = count > 0
            pooled += list(correct[has] / count[has])
            pooled_p += list(personal[has] / count[has])
        expected[method] = (_stats(pooled), _stats(pooled_p) if method == "fedprox" else None)
    out = tmp_path / "out"
    report = build_report(runs, str(out))
    assert report.files[:2] == ["test_accuracy.png", "client_accuracy_cdf.png"]
    assert (out / "client_accuracy_cdf.png").read_bytes().startswith(b"\x89PNG")
    md = (out / "report.md").read_text()
    assert "## Per-client accuracy at the final round (each run's last table)" in md
    section = md.split("## Per-client")[1]
    for method, (plain, personal) in expected.items():
        row = next(ln for ln in section.splitlines() if ln.startswith(f"| {method} (algo"))
        cells = row.strip("| ").split(" | ")
        assert cells[1:4] == ["2", "20", "22"]  # runs, round, clients (2 x 11)
        assert [float(c) for c in cells[4:7]] == pytest.approx(plain, abs=5e-5)  # 4 decimals
        if personal is None:
            assert cells[7:] == ["0", "—", "—", "—"]
        else:
            assert [float(c) for c in cells[8:11]] == pytest.approx(personal, abs=5e-5)
    data = json.loads((out / "report.json").read_text())["clients"]
    prox = data["groups"][1]
    assert prox["rounds"] == [20, 20] and prox["accuracy"]["clients"] == 22
    assert (prox["accuracy"]["mean"], prox["accuracy"]["p10"], prox["accuracy"]["worst10"]) \
        == pytest.approx(expected["fedprox"][0], rel=1e-12)  # the same float64 computation
    assert prox["personalized_accuracy"]["worst10"] == pytest.approx(expected["fedprox"][1][2],
                                                                     rel=1e-12)

    earlier = build_report(runs, str(tmp_path / "r10"), client_round=10,
                           client_metric="loss")
    assert "client_loss_cdf.png" in earlier.files
    md10 = (tmp_path / "r10" / "report.md").read_text()
    assert "## Per-client loss at round 10" in md10 and "| p90 | worst 10% |" in md10


def test_client_tables_are_optional_and_checked(tmp_path):
    a = write_run(str(tmp_path / "a"), "fedavg", 0)
    b = write_run(str(tmp_path / "b"), "fedavg", 1)
    report = build_report([a, b], str(tmp_path / "none"))
    assert not any("client" in f for f in report.files)
    assert "Per-client" not in (tmp_path / "none" / "report.md").read_text()
    write_client_table(a, 20, [3, 4], [5, 5], accuracy=False)  # an mse run: no accuracy
    with pytest.raises(FedrayError, match=r"a/client_eval/round_000020.arrow has no column "
                                          r"'accuracy' \(columns: client_id, count, loss_sum, "
                                          r"loss\)"):
        build_report([a, b], str(tmp_path / "out"))
    with pytest.raises(FedrayError, match=r"a/client_eval has no table of round 7 \(rounds "
                                          r"with one: 20\)"):
        build_report([a, b], str(tmp_path / "out"), client_metric="loss", client_round=7)
    report = build_report([a, b], str(tmp_path / "out"), client_metric="loss")
    md = (tmp_path / "out" / "report.md").read_text()
    assert f"note: {b} has no per-client tables; not in this section" in md
    assert "client_loss_cdf.png" in report.files
    assert not (tmp_path / "out" / "client_accuracy_cdf.png").exists()


def test_a_real_runs_tables_give_its_clients_statistics(tmp_path):
    """The tables a run writes (eval.federated_clients, eval.personalize) read as the
    driver's own statistics of them: the report of one run equals the clients_* keys of
    its last metrics.jsonl line, bit for bit (the same float64 computation)."""
    from conftest import tiny_job

    import fedray

    result = fedray.run(tiny_job(tmp_path, rounds=2, eval__federated_clients=10,
                                 eval__personalize={"steps": 2}, runtime__backend="inline"))
    build_report([result.run_dir], str(tmp_path / "out"))
    (group,) = json.loads((tmp_path / "out" / "report.json").read_text())["clients"]["groups"]
    last = result.metrics[-1]
    assert group["rounds"] == [2]
    for column in ("accuracy", "personalized_accuracy"):
        stats = group[column]
        assert stats["clients"] == last["clients_evaluated"]
        for stat in ("mean", "p10", "worst10"):
            assert stats[stat] == last[f"clients_{column}_{stat}"], (column, stat)


def test_an_attacks_success_is_lower_is_better():
    """A backdoor's success (docs/robustness.md) goes down as a defense works, as a loss."""
    from fedray.tracking.report import lower_is_better

    assert lower_is_better("test_attack_success") and lower_is_better("test_loss")
    assert not lower_is_better("test_accuracy")
    assert not lower_is_better("defense_recall")
