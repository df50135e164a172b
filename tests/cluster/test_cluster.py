"""fedray on a Ray cluster of its own: Ray Jobs submission and an autoscaling sweep.

Each test starts a separate Ray head on 127.0.0.1 (tests/clusters.py) and stops exactly the
processes it started."""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
import yaml
from clusters import LocalHead, autoscaling_cluster, client_env
from conftest import tiny_job

from fedray.state.run_dir import read_metrics

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

FEDRAY = [sys.executable, "-m", "fedray.cli"]


def _fedray(args, env, timeout=400):
    return subprocess.run(FEDRAY + args, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_submit_runs_the_job_on_the_cluster_and_writes_to_the_output_url(tmp_path):
    # one worker, sequential clients: all the job has to do is run on the cluster
    job = tiny_job(tmp_path, runtime__num_workers=1, runtime__worker__num_cpus=1)
    del job["output"]
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    out_url = f"file://{tmp_path}/on-cluster"
    env = client_env()
    with LocalHead(num_cpus=2, dashboard=True) as head:
        sub = _fedray(["submit", str(tmp_path / "job.yaml"), f"output.dir={out_url}",
                       "rounds=4", "--address", head.job_server, "--wait"], env)
        assert sub.returncode == 0, sub.stdout[-3000:] + sub.stderr[-3000:]
        job_id = sub.stdout.split()[1]
        assert job_id.startswith("raysubmit_")
        assert f"job {job_id}: SUCCEEDED" in sub.stdout
        # the entrypoint ran the shipped job file with the overrides, on the cluster
        assert "fedray.cluster.entrypoint" in sub.stdout and "done: 4 rounds" in sub.stdout
        status = _fedray(["status", job_id, "--address", head.job_server], env)
        assert status.returncode == 0 and f"{job_id}: SUCCEEDED" in status.stdout
        logs = _fedray(["logs", job_id], {**env, "RAY_ADDRESS": head.job_server})
        assert logs.returncode == 0 and "done: 4 rounds" in logs.stdout
        stop = _fedray(["stop", job_id, "--address", head.job_server], env)
        assert stop.returncode == 0 and "already ended" in stop.stdout
        missing = _fedray(["status", "raysubmit_nope", "--address", head.job_server], env)
        assert missing.returncode == 2 and missing.stderr.startswith(
            "fedray: error: status raysubmit_nope: ")
        assert "Traceback" not in missing.stderr
    metrics = read_metrics(out_url)
    assert [m["round"] for m in metrics] == [1, 2, 3, 4]
    summary = json.loads((tmp_path / "on-cluster" / "summary.json").read_text())
    assert summary["rounds"] == 4 and summary["final"]["test_accuracy"] >= 0


def test_a_sweep_on_an_autoscaling_cluster_adds_worker_nodes(tmp_path):
    """The head has no CPU, so no trial fits until the autoscaler adds 1-CPU worker nodes;
    two trials of one worker each make it add two."""
    job = tiny_job(tmp_path, rounds=4, runtime__worker__num_cpus=1)
    del job["output"]
    sweep = {"name": "scale", "job": job, "parameters": {"seed": [0, 1]},
             "output": str(tmp_path / "sweep")}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(sweep))
    nodes = {"cpu_node": {"resources": {"CPU": 1}, "node_config": {}, "min_workers": 0,
                          "max_workers": 2}}
    with autoscaling_cluster(nodes, head_cpus=0) as head:
        env = client_env(RAY_ADDRESS=head.address)
        out = _fedray(["sweep", str(tmp_path / "s.yaml")], env)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        monitor = "".join(p.read_text() for p in pathlib.Path(head.temp_dir).glob(
            "session_*/logs/monitor.log"))
        seen = subprocess.run([sys.executable, "-c", (
            "import json, ray; ray.init(address='auto', logging_level='ERROR'); "
            "print(json.dumps([[n['NodeID'], n['Resources'].get('CPU', 0)] "
            "for n in ray.nodes()]))")], env=env, capture_output=True, text=True, timeout=120)
    assert seen.returncode == 0, seen.stderr[-2000:]
    nodes_seen = json.loads(seen.stdout.strip().splitlines()[-1])
    (head_id,) = [node for node, cpus in nodes_seen if cpus == 0]
    added = {node for node, cpus in nodes_seen if cpus == 1}
    assert "done: 2 trials" in out.stdout
    # the autoscaler (its log on the head) added nodes of the worker type ...
    assert re.search(r"Adding \d+ node\(s\) of type cpu_node", monitor), monitor[-3000:]
    used = set()
    for trial in sorted((tmp_path / "sweep" / "trials").iterdir()):
        summary = json.loads((trial / "summary.json").read_text())
        assert summary["rounds"] == 4 and len(read_metrics(str(trial))) == 4
        used |= {w["node_id"] for w in summary["workers"]}
    # ... and the trials' workers ran on them, not on the CPU-less head
    assert used and used <= added and head_id not in used
    rows = (tmp_path / "sweep" / "results.csv").read_text().splitlines()
    assert len(rows) == 3 and all(",finished," in r for r in rows[1:])
    assert os.path.exists(tmp_path / "sweep" / "report" / "test_accuracy.png")
