"""The ``fedray`` command as a user runs it: exit codes, one-line errors, files written."""

import json
import os
import subprocess
import sys

import yaml
from conftest import tiny_job

FEDRAY = [sys.executable, "-m", "fedray.cli"]


def _run(args, **kw):
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    return subprocess.run(FEDRAY + args, capture_output=True, text=True, env=env, timeout=300,
                          **kw)


def test_help():
    out = _run(["--help"])
    assert out.returncode == 0 and "run" in out.stdout
    out = _run(["run", "--help"])
    assert out.returncode == 0 and "key=value" in out.stdout and "--quiet" in out.stdout


def test_config_error_is_one_line_and_writes_nothing(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(tiny_job(tmp_path)))
    for override, key in [("client.lrr=0.1", "client.lrr"), ("client.lr=-1", "client.lr"),
                          ("sampling.clients_per_round=41", "sampling.clients_per_round")]:
        out = _run(["run", str(job), override])
        assert out.returncode == 2, out.stderr
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("fedray: error: ") and key in lines[0]
        assert "Traceback" not in out.stderr
    assert not (tmp_path / "run").exists()
    out = _run(["run", str(tmp_path / "missing.yaml")])
    assert out.returncode == 2 and "job file not found" in out.stderr


def test_config_and_store_errors_come_before_torch_is_imported(tmp_path):
    """A typo fails in a fraction of a second: the checks before a run starts (config keys,
    the store's manifest) and the error path do not import torch (1-2 s)."""
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(tiny_job(tmp_path)))
    code = ("import sys; from fedray.cli import main; rc = main(sys.argv[1:]); "
            "print('torch' in sys.modules); sys.exit(rc)")
    for args in (["run", str(job), "client.lr=-1"],
                 ["run", str(job), f"data.partition={tmp_path / 'nostore'}"]):
        out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 2 and "fedray: error: " in out.stderr, out.stderr
        assert out.stdout.strip() == "False", args


def test_run_job_end_to_end(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(tiny_job(tmp_path, runtime={"num_cpus": 2})))
    out = _run(["run", str(job), "rounds=2", "--quiet"])
    assert out.returncode == 0, out.stderr
    assert "done: 2 rounds, test accuracy" in out.stdout
    assert "round" not in out.stderr  # --quiet: no progress
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["rounds"] == 2 and summary["num_workers"] == 2
    out = _run(["run", str(job), "rounds=2"])  # same output.dir again: refused, kept intact
    assert out.returncode == 2 and "already holds files" in out.stderr
    assert json.loads((tmp_path / "run" / "summary.json").read_text()) == summary
