"""What a job that ``fedray submit`` sent runs on the cluster: ``fedray run job.yaml`` with
the submission's ``key=value`` overrides, read from ``overrides.json`` in the job's working
directory.

The overrides travel in that file, inside the job's runtime environment (its
``working_dir``, uploaded to the cluster with the job file), and not in the entrypoint
command: Ray shows a job's entrypoint in ``ray job list``, the dashboard and the first line
of the job's log, and its runtime_env (``env_vars`` included) in the first two, so an
``output.dir=s3://KEY:SECRET@bucket/...`` there would be readable by anyone who can see
the cluster's jobs. The command line is ``python -m fedray.cluster.entrypoint``, for a
resumed job too (``fedray submit --resume`` stages resume.json beside the overrides).
"""

from __future__ import annotations

import os
import sys

from fedray.cli import main as fedray_main
from fedray.cluster.job_files import RESUME_FILE, SUBMITTED_ENV, resume_argv, run_argv


def main() -> int:
    """The job: a resume when ``fedray submit --resume`` staged resume.json, else a run."""
    os.environ[SUBMITTED_ENV] = "1"
    return fedray_main(resume_argv() if os.path.exists(RESUME_FILE) else run_argv())


if __name__ == "__main__":
    sys.exit(main())
