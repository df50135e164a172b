"""Bundled jobs and recipes by name (fedray/bundled.py), read from the checkout here; the
installed wheel's copy is checked by .ci/wheel_check, from a directory outside the checkout."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

from fedray import bundled
from fedray.errors import FedrayError

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_every_top_level_job_and_recipe_is_listed_once_with_its_first_comment():
    for folder in ("jobs", "partitions"):
        files = sorted(p.relative_to(ROOT / folder).with_suffix("").as_posix()
                       for p in (ROOT / folder).rglob("*.yaml"))
        items = bundled.listing(folder)
        assert [b.name for b in items] == files  # one source of truth: the top level
        assert all(b.path.is_relative_to(ROOT / folder) for b in items)
    jobs = {b.name: b for b in bundled.listing("jobs")}
    assert jobs["quickstart"].summary.startswith("FedAvg with the TFF EMNIST CNN")
    assert jobs["quickstart"].command == "fedray run"
    assert jobs["sweeps/participation"].command == "fedray sweep"
    assert {b.command for b in bundled.listing("partitions")} == {"fedray partition"}


def test_a_summary_is_the_leading_comments_first_sentence_cut_at_a_word(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("# FedAvg on Fed-CIFAR100 (Sec. 4, i.i.d. clients): a sentence\n"
                    "# that runs on (Fig. 3).\n# A second sentence.\nrounds: 2\n")
    assert bundled._summary(path) == ("FedAvg on Fed-CIFAR100 (Sec. 4, i.i.d. clients): a "
                                      "sentence that runs on (Fig. 3).")
    path.write_text("# Title:\n#   fedray run job.yaml\n# after the example\nrounds: 2\n")
    assert bundled._summary(path) == "Title:"  # an indented line is an example: it ends it
    path.write_text("# " + "word " * 40 + "end.\n")
    cut = bundled._summary(path)
    assert len(cut) <= bundled.SUMMARY_WIDTH and cut.endswith("word...")
    path.write_text("rounds: 2\n# a comment after the keys is not a summary\n")
    assert bundled._summary(path) == ""


def test_a_name_resolves_and_a_path_still_means_its_file(tmp_path, monkeypatch):
    assert bundled.resolve("jobs", "quickstart") == str(ROOT / "jobs" / "quickstart.yaml")
    assert bundled.resolve("jobs", "femnist/fedavg") == str(ROOT / "jobs/femnist/fedavg.yaml")
    assert bundled.resolve("partitions", "femnist") == str(ROOT / "partitions/femnist.yaml")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "quickstart").write_text("name: mine\n")  # a file of that name wins
    assert bundled.resolve("jobs", "quickstart") == "quickstart"
    assert bundled.resolve("jobs", "other.yaml") == "other.yaml"  # a path, even if missing
    assert bundled.resolve("jobs", "s3://bucket/job") == "s3://bucket/job"
    with pytest.raises(FedrayError, match="no file 'nosuch' and no bundled job of that name "
                       r"\(fedray jobs lists them; top level: .*quickstart"):
        bundled.resolve("jobs", "nosuch")


def test_the_cli_lists_shows_and_refuses(tmp_path):
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "fedray.cli", *args], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)

    listed = cli("recipes")
    lines = listed.stdout.splitlines()
    assert listed.returncode == 0 and lines == sorted(lines)  # by name
    assert any(ln.startswith("dirichlet ") for ln in lines)
    sweep = [ln for ln in bundled.table("jobs").splitlines() if ln.startswith("sweeps/")]
    assert sweep and "[fedray sweep] Participation sweep" in sweep[0]
    shown = cli("jobs", "show", "quickstart")
    assert shown.stdout == (ROOT / "jobs" / "quickstart.yaml").read_text()
    bad = cli("partition", "nosuch")
    assert bad.returncode == 2 and bad.stderr.startswith(
        "fedray: error: no file 'nosuch' and no bundled recipe of that name")
    assert len(bad.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("name", ["../x", "../../x", "sub/../../x", "<absolute>", "./quickstart",
                                  "quickstart/", "../partitions/femnist"])
def test_a_bundled_name_never_leaves_the_bundled_folder(name, tmp_path, monkeypatch):
    """A name is looked up among the bundled files' names, never joined to a path: a file
    where ``jobs/../x.yaml`` would point is not a bundled job, whatever it holds. The
    absolute name is under ``tmp_path`` (``x`` beside ``x.yaml``), never a fixed path such
    as /tmp/x, which this machine's other work may have created."""
    if name == "<absolute>":
        name = str(tmp_path / "x")
    (tmp_path / "jobs" / "sub").mkdir(parents=True)
    (tmp_path / "jobs" / "mine.yaml").write_text("# mine.\nrounds: 1\n")
    (tmp_path / "jobs" / "sub" / "x.yaml").write_text("# inner.\nrounds: 1\n")
    (tmp_path / "x.yaml").write_text("# outside the bundled folder.\nrounds: 1\n")
    (tmp_path / "partitions").mkdir()
    (tmp_path / "partitions" / "femnist.yaml").write_text("# a recipe.\nsource: {}\n")
    monkeypatch.setattr(bundled, "root", lambda folder: tmp_path / folder)
    monkeypatch.chdir(tmp_path / "jobs" / "sub")  # where none of the names is a file
    assert bundled.resolve("jobs", "sub/x") == str(tmp_path / "jobs" / "sub" / "x.yaml")
    with pytest.raises(FedrayError, match=f"^no file {re.escape(repr(name))} and no bundled "
                       "job of that name"):
        bundled.resolve("jobs", name)
    with pytest.raises(FedrayError, match="no bundled job of that name"):
        bundled.show("jobs", name)
