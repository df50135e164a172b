"""What a job ``fedray submit`` sends carries beside the job file, and how the cluster reads
it back: the overrides (overrides.json) and, for ``fedray submit --resume``, the run
directory and --allow-change keys (resume.json). They travel as files in the job's working
directory, never on its command line (fedray.cluster.entrypoint says why). The submitting
side (fedray.cluster.submit) and the cluster side (fedray.cluster.entrypoint) share this
module and nothing else.
"""

from __future__ import annotations

import json
import os

JOB_FILE = "job.yaml"
OVERRIDES_FILE = "overrides.json"
# set in a job fedray submit sent: the hint a cut run prints is then `fedray submit --resume`
# (what continues it from the user's machine), not `fedray run --resume`
SUBMITTED_ENV = "FEDRAY_SUBMITTED_JOB"
RESUME_FILE = "resume.json"  # a resumed job's run directory and --allow-change keys


def run_argv(overrides_file: str = OVERRIDES_FILE) -> list[str]:
    """The ``fedray`` arguments the job runs: ``run job.yaml OVERRIDES... --quiet``."""
    with open(overrides_file, encoding="utf-8") as f:
        overrides = json.load(f)
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise ValueError(f"{overrides_file} must hold a JSON list of key=value strings")
    return ["run", JOB_FILE, *overrides, "--quiet"]


def resume_argv(resume_file: str = RESUME_FILE) -> list[str]:
    """The ``fedray`` arguments a resumed job runs, in its working directory:
    ``run [job.yaml] --resume RUN_DIR OVERRIDES... --allow-change KEY ... --quiet``, from
    the files ``job_spec`` staged (the run directory, like an override, may hold a
    credential, so it is not on the command line Ray shows)."""
    with open(resume_file, encoding="utf-8") as f:
        resume = json.load(f)
    run_dir, allow = resume.get("run_dir"), resume.get("allow_change", [])
    if not isinstance(run_dir, str) or not isinstance(allow, list) or \
            not all(isinstance(k, str) for k in allow):
        raise ValueError(f"{resume_file} must hold a run_dir string and an allow_change list")
    overrides = run_argv()[2:-1]  # overrides.json's, checked there
    job = [JOB_FILE] if os.path.exists(JOB_FILE) else []
    return ["run", *job, "--resume", run_dir, *overrides,
            *[a for k in allow for a in ("--allow-change", k)], "--quiet"]
