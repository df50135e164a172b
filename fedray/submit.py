"""``fedray submit / status / logs / stop``: fedray jobs on a Ray cluster, through Ray Jobs.

``fedray submit JOB.yaml`` sends the job file and this machine's fedray package (Ray's
runtime_env ``working_dir`` and ``py_modules``) to the cluster's job server, where
``python -m fedray.cli run job.yaml key=value ...`` runs as the job's entrypoint, joining the
cluster through the RAY_ADDRESS Ray Jobs sets. The cluster's nodes must already have fedray's
dependencies (ray_cluster.yaml's setup_commands install them); the shipped package makes the
code the one you just edited. The job runs on the head, so its paths are the cluster's:
``output.dir`` and a partition store must be URLs (s3://, gs://) or absolute paths on storage
every node shares -- a relative path would land in the job's temporary working directory and
be lost with it, so it is refused here, before anything is sent.
"""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

from fedray.errors import FedrayError, one_line

DEFAULT_ADDRESS = "http://127.0.0.1:8265"
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


def job_server(address: str | None) -> str:
    """The job server's HTTP address: --address, else RAY_ADDRESS when it is one (as `ray job`
    reads it), else the local head's default."""
    address = address or os.environ.get("RAY_ADDRESS") or DEFAULT_ADDRESS
    if "://" not in address:
        address = f"http://{address}"
    return address


def client(address: str | None):
    from ray.job_submission import JobSubmissionClient

    url = job_server(address)
    try:
        return JobSubmissionClient(url)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise FedrayError(f"--address {url}: cannot reach Ray's job server: "
                          f"{one_line(exc)}") from None


def _local_relative(url: str) -> bool:
    return "://" not in url and not os.path.isabs(os.path.expanduser(url))


def check_cluster_paths(cfg) -> None:
    """Paths a job on the cluster can use: URLs or absolute paths, never relative ones."""
    if _local_relative(cfg.output.dir):
        raise FedrayError(f"config key 'output.dir': a job on a cluster writes where every node "
                          f"can reach: give a URL (s3://bucket/runs/x) or an absolute path on "
                          f"shared storage, got {cfg.output.dir!r}")
    part = cfg.data.partition
    if part not in ("synthetic", "memory") and _local_relative(part):
        raise FedrayError(f"config key 'data.partition': a job on a cluster reads its store "
                          f"where every node can reach: give a URL or an absolute path on shared "
                          f"storage, got {part!r}")


def submit(job: str, overrides: list[str], address: str | None = None,
           submission_id: str | None = None, agent_wait_s: float = 120.0) -> str:
    """Submit ``fedray run JOB.yaml overrides`` to the cluster; return the job's id. A head
    whose job agent is not up yet (just after ``ray up``) is retried for ``agent_wait_s``."""
    import fedray
    from fedray.config import FedrayConfig, load_structured

    # typos and types fail here, not on the cluster; without load_config's default output.dir
    cfg = load_structured(FedrayConfig, job, overrides)
    if cfg.output.dir is None:
        raise FedrayError("config key 'output.dir': set it for a cluster job (a URL such as "
                          "s3://bucket/runs/x, or an absolute path on shared storage)")
    check_cluster_paths(cfg)
    jobs = client(address)
    package = os.path.dirname(os.path.abspath(fedray.__file__))
    staging = tempfile.mkdtemp(prefix="fedray-submit-")
    try:
        shutil.copyfile(job, os.path.join(staging, "job.yaml"))
        entrypoint = shlex.join(["python", "-m", "fedray.cli", "run", "job.yaml", *overrides,
                                 "--quiet"])
        deadline = time.monotonic() + agent_wait_s
        while True:
            try:
                return jobs.submit_job(
                    entrypoint=entrypoint, submission_id=submission_id,
                    runtime_env={"working_dir": staging, "py_modules": [package],
                                 "excludes": ["__pycache__"]},
                    metadata={"fedray_job": os.path.basename(job), "fedray_name": cfg.name})
            except RuntimeError as exc:  # the job server's refusal (a duplicate id, ...)
                # a head that has just started has no job agent yet: wait for it
                if "No available agent" in str(exc) and time.monotonic() < deadline:
                    time.sleep(2.0)
                    continue
                raise FedrayError(f"submit {job}: {one_line(exc)}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _call(what: str, job_id: str, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except RuntimeError as exc:
        raise FedrayError(f"{what} {job_id}: {one_line(exc)}") from None


def status(job_id: str, address: str | None = None) -> dict[str, Any]:
    info = _call("status", job_id, lambda: client(address).get_job_info(job_id))
    return {"job_id": job_id, "status": str(info.status.value if hasattr(info.status, "value")
                                            else info.status),
            "message": info.message or "", "entrypoint": info.entrypoint}


def logs(job_id: str, address: str | None = None) -> str:
    return _call("logs", job_id, lambda: client(address).get_job_logs(job_id))


def stop(job_id: str, address: str | None = None) -> bool:
    return bool(_call("stop", job_id, lambda: client(address).stop_job(job_id)))


def follow(job_id: str, address: str | None = None, out: Callable[[str], None] = print,
           poll_s: float = 2.0, timeout_s: float | None = None) -> str:
    """Print the job's log as it grows until the job ends; return its final status."""
    jobs = client(address)
    shown = 0
    start = time.monotonic()
    while True:
        state = _call("status", job_id, lambda: jobs.get_job_status(job_id))
        state = str(getattr(state, "value", state))
        text = _call("logs", job_id, lambda: jobs.get_job_logs(job_id))
        if len(text) > shown:
            out(text[shown:].rstrip("\n"))
            shown = len(text)
        if state in TERMINAL:
            return state
        if timeout_s is not None and time.monotonic() - start > timeout_s:
            raise FedrayError(f"job {job_id}: still {state} after {timeout_s:.0f}s")
        time.sleep(poll_s)
