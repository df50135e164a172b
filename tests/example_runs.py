"""What the tests of examples/ share: a user's module run by import path through the CLI, a
sweep started from a directory that does not hold it, and ``fedray submit`` to a local test
head (tests/test_examples.py's checks of examples/qffl.py, for any example and job)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import yaml

from fedray.state.run_dir import load_weights

REPO = pathlib.Path(__file__).resolve().parents[1]
FEDRAY = [sys.executable, "-m", "fedray.cli"]


@pytest.fixture
def importable(monkeypatch):
    """This process imports ``examples`` from the repository root, wherever pytest runs."""
    monkeypatch.syspath_prepend(str(REPO))


def clean_env(**extra: str) -> dict[str, str]:
    """The environment of a user's shell: no Ray address, no PYTHONPATH (pytest's)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PYTHONPATH")}
    return {**env, "RAY_USAGE_STATS_ENABLED": "0", **extra}


def tiny_job(name: str, algorithm: dict, *, model: str = "logreg", workers: int | None = None,
             vectorize: str = "off") -> dict:
    """A few-second job on 40 synthetic writers, 8 per round, as the qffl tests run."""
    runtime: dict = {"num_cpus": 2, "worker": {"num_cpus": 1, "vectorize": vectorize}}
    if workers is not None:
        runtime["num_workers"] = workers
    return {"name": name, "seed": 3, "rounds": 2,
            "data": {"synthetic": {"num_clients": 40, "min_examples": 10, "max_examples": 30,
                                   "test_writers": 20}},
            "model": {"name": model}, "client": {"lr": 0.05, "batch_size": 8},
            "sampling": {"clients_per_round": 8}, "eval": {"every": 0},
            "algorithm": algorithm, "runtime": runtime, "output": {"tensorboard": False}}


def cli_run(run_dir: pathlib.Path, overrides: list[str], timeout: int = 300) -> None:
    """`fedray run jobs/quickstart.yaml` from the repository root, as a user runs it (a
    process of its own)."""
    out = subprocess.run(FEDRAY + ["run", str(REPO / "jobs" / "quickstart.yaml"),
                                   f"output.dir={run_dir}", "--quiet", *overrides],
                         capture_output=True, text=True, env=clean_env(), cwd=REPO,
                         timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]


def sweep_elsewhere(tmp_path: pathlib.Path, job: dict, parameters: dict) -> list[pathlib.Path]:
    """`fedray sweep` of ``job`` over ``parameters`` (two trials), run from a directory that
    does not hold the example (the caller imports it through its own sys.path): the trials
    import it only because the sweep ships its files. Returns the trials' directories."""
    sweep = {"name": "s", "job": job, "parameters": parameters, "output": str(tmp_path / "sweep")}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(sweep))
    work = tmp_path / "elsewhere"
    work.mkdir()
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); from fedray.cli import main; "
            f"sys.exit(main(['sweep', {str(tmp_path / 's.yaml')!r}]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=clean_env(), cwd=work, timeout=400)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    trials = sorted((tmp_path / "sweep" / "trials").iterdir())
    rows = (tmp_path / "sweep" / "results.csv").read_text().splitlines()
    assert len(trials) == len(rows) - 1 and all(",finished," in r for r in rows[1:]), rows
    assert f"done: {len(trials)} trials" in out.stdout, out.stdout[-3000:]
    return trials


def trial_weights(trials: list[pathlib.Path], rounds: int, aggregator: str) -> list[dict]:
    """Each trial's final weights, once its summary says it ran all ``rounds`` with the user's
    ``aggregator``: what a sweep test compares to see that the swept value mattered."""
    finals = []
    for trial in trials:
        summary = json.loads((trial / "summary.json").read_text())
        assert summary["rounds"] == rounds and summary["algorithm"]["aggregator"] == aggregator
        finals.append(load_weights(str(trial)))
    return finals


def submit_to_local_head(tmp_path: pathlib.Path, job: dict) -> pathlib.Path:
    """`fedray submit --wait` of ``job`` from the repository root to a local test head: the
    job runs in a temporary working directory holding only job.yaml, so it imports the
    example only because submit ships the user's package. Returns the run's directory."""
    from clusters import LocalHead, client_env

    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    out_dir = tmp_path / "on-cluster"
    env = client_env()
    env.pop("PYTHONPATH", None)
    with LocalHead(num_cpus=2, dashboard=True) as head:
        sub = subprocess.run(FEDRAY + ["submit", str(tmp_path / "job.yaml"),
                                       f"output.dir=file://{out_dir}", "--address",
                                       head.job_server, "--wait"],
                             env=env, cwd=REPO, capture_output=True, text=True, timeout=400)
    assert sub.returncode == 0, sub.stdout[-3000:] + sub.stderr[-3000:]
    assert "SUCCEEDED" in sub.stdout and f"done: {job['rounds']} rounds" in sub.stdout
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["rounds"] == job["rounds"]
    return out_dir
