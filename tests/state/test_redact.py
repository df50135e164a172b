"""Credentials are masked wherever fedray writes about a run."""

import os
import subprocess
import sys

import pytest
import yaml

from fedray.state.redact import mask, mask_tree


@pytest.mark.parametrize("text, expected", [
    ("s3://AKIA123:abc/def+ghi@bucket/runs/a", "s3://AKIA123:***@bucket/runs/a"),
    ("ray://alice:hunter2@head:10001", "ray://alice:***@head:10001"),
    ("gs://bucket/x?token=SeCrEt&y=1", "gs://bucket/x?token=***&y=1"),
    ("aws_secret_access_key: wJalrXUtnFEMI", "aws_secret_access_key: ***"),
    ("storage.password=pw1", "storage.password=***"),
    # no credential: unchanged
    ("s3://bucket/runs/a", "s3://bucket/runs/a"),
    ("https://user@host/path", "https://user@host/path"),
    ("tokens_per_s: 3.5\nname: femnist", "tokens_per_s: 3.5\nname: femnist"),
    ("password:\n  x: 1", "password:\n  x: 1"),
])
def test_mask(text, expected):
    assert mask(text) == expected


def test_mask_tree():
    doc = {"source": {"path": "s3://k:s@b/x", "api_key": "abc", "n": 3},
           "l": ["https://u:p@h/y", 1], "token": None}
    assert mask_tree(doc) == {"source": {"path": "s3://k:***@b/x", "api_key": "***", "n": 3},
                              "l": ["https://u:***@h/y", 1], "token": None}


def test_config_yaml_never_shows_a_secret(tmp_path):
    from fedray.state.run_dir import RunDir

    RunDir(str(tmp_path / "run")).create("output:\n  dir: s3://AKIA:TOPSECRET@bucket/x\n")
    text = (tmp_path / "run" / "config.yaml").read_text()
    assert "TOPSECRET" not in text
    assert yaml.safe_load(text)["output"]["dir"] == "s3://AKIA:***@bucket/x"


def test_errors_never_show_a_secret():
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    out = subprocess.run([sys.executable, "-m", "fedray.cli", "run", "jobs/quickstart.yaml",
                          "data.partition=https://AKIA:TOPSECRET@127.0.0.1:9/store"],
                         capture_output=True, text=True, env=env, timeout=120,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "TOPSECRET" not in out.stderr + out.stdout and "AKIA:***@" in out.stderr
