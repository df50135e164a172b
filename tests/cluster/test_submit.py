"""What ``fedray submit`` shows the cluster and the user holds no credential, without a
cluster: the job server is a stand-in that records what it is given."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from fedray import cli
from fedray.cluster import submit as submit_mod
from fedray.cluster.job_files import run_argv

ROOT = pathlib.Path(__file__).resolve().parents[2]
SECRETS = ("TOPSECRET", "hunter2", "tk123", "AKIAKEYID")
OVERRIDES = ["output.dir=s3://AKIAKEYID:TOPSECRET@bucket/runs/q1", "rounds=2",
             "data.partition=https://alice:hunter2@store.example/x?token=tk123"]


class FakeJobServer:
    """Ray's JobSubmissionClient as far as submit, status and logs use it; what a job's
    submission carried, as a reader of ``ray job list`` would see it, and the files it
    shipped."""

    def __init__(self):
        self.submitted: dict = {}
        self.shipped: dict[str, str] = {}

    def submit_job(self, **kwargs):
        self.submitted = kwargs
        staging = kwargs["runtime_env"]["working_dir"]  # removed once submit returns
        self.shipped = {n: open(os.path.join(staging, n)).read() for n in os.listdir(staging)}
        return "raysubmit_1"

    def get_job_logs(self, job_id):
        return ("Running entrypoint for job raysubmit_0: python -m fedray.cli run job.yaml "
                "output.dir=s3://AKIAKEYID:TOPSECRET@bucket/runs/q1\ndone: 2 rounds\n")


def test_a_submission_shows_no_override_value(tmp_path, monkeypatch):
    server = FakeJobServer()
    monkeypatch.setattr(submit_mod, "client", lambda address: server)
    job_id = submit_mod.submit(str(ROOT / "jobs" / "quickstart.yaml"), OVERRIDES,
                               "http://alice:hunter2@head:8265")
    assert job_id == "raysubmit_1"
    shown = json.dumps(server.submitted)  # entrypoint, runtime_env (env_vars), metadata
    assert not [s for s in SECRETS if s in shown], shown
    assert server.submitted["entrypoint"] == "python -m fedray.cluster.entrypoint"
    assert server.submitted["metadata"]["fedray_overrides"] == "output.dir, rounds, data.partition"
    # the values travel in the job's working directory, which the entrypoint reads back
    assert json.loads(server.shipped["overrides.json"]) == OVERRIDES
    (tmp_path / "overrides.json").write_text(server.shipped["overrides.json"])
    assert run_argv(str(tmp_path / "overrides.json")) == ["run", "job.yaml", *OVERRIDES,
                                                          "--quiet"]


def test_the_entrypoint_runs_fedray_run_with_the_shipped_overrides(tmp_path):
    """On the cluster, in the job's working directory: the overrides are applied (a
    refused one shows it, before Ray starts)."""
    (tmp_path / "job.yaml").write_text((ROOT / "jobs" / "quickstart.yaml").read_text())
    (tmp_path / "overrides.json").write_text(json.dumps(["rounds=0"]))
    out = subprocess.run([sys.executable, "-m", "fedray.cluster.entrypoint"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr == "fedray: error: config key 'rounds': must be >= 1, got 0\n"


def test_submit_status_and_logs_print_credentials_masked(monkeypatch, capsys):
    server = FakeJobServer()
    monkeypatch.setattr(submit_mod, "client", lambda address: server)
    address = "http://alice:hunter2@head:8265"
    assert cli.main(["submit", str(ROOT / "jobs" / "quickstart.yaml"), *OVERRIDES,
                     "--address", address]) == 0
    out = capsys.readouterr()
    assert "submitted raysubmit_1 to http://alice:***@head:8265;" in out.out
    assert cli.main(["logs", "raysubmit_0", "--address", address]) == 0
    out2 = capsys.readouterr()
    assert "s3://AKIAKEYID:***@bucket/runs/q1" in out2.out
    printed = out.out + out.err + out2.out + out2.err
    assert not [s for s in SECRETS[:3] if s in printed], printed


@pytest.mark.parametrize("address", ["http://alice:hunter2@127.0.0.1:9",
                                     "alice:hunter2@127.0.0.1:9"])
def test_an_unreachable_job_server_is_named_masked(address, capsys, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert cli.main(["status", "raysubmit_0", "--address", address]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedray: error: ") and "hunter2" not in err and "alice:***@" in err
