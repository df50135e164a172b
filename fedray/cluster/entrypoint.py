"""What a job that ``fedray submit`` sent runs on the cluster: ``fedray run job.yaml`` with
the submission's ``key=value`` overrides, read from ``overrides.json`` in the job's working
directory.

The overrides travel in that file, inside the job's runtime environment (its
``working_dir``, uploaded to the cluster with the job file), and not in the entrypoint
command: Ray shows a job's entrypoint in ``ray job list``, the dashboard and the first line
of the job's log, and its runtime_env (``env_vars`` included) in the first two, so an
``output.dir=s3://KEY:SECRET@bucket/...`` there would be readable by anyone who can see
the cluster's jobs. The command line is ``python -m fedray.cluster.entrypoint``.
"""

from __future__ import annotations

import json
import sys

JOB_FILE = "job.yaml"
OVERRIDES_FILE = "overrides.json"
# set in a job fedray submit sent: the hint a cut run prints is then `fedray submit --resume`
# (what continues it from the user's machine), not `fedray run --resume`
SUBMITTED_ENV = "FEDRAY_SUBMITTED_JOB"


def run_argv(overrides_file: str = OVERRIDES_FILE) -> list[str]:
    """The ``fedray`` arguments the job runs: ``run job.yaml OVERRIDES... --quiet``."""
    with open(overrides_file, encoding="utf-8") as f:
        overrides = json.load(f)
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise ValueError(f"{overrides_file} must hold a JSON list of key=value strings")
    return ["run", JOB_FILE, *overrides, "--quiet"]


def main() -> int:
    import os

    from fedray.cli import main as fedray_main

    os.environ[SUBMITTED_ENV] = "1"
    return fedray_main(run_argv())


if __name__ == "__main__":
    sys.exit(main())
