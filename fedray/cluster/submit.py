"""``fedray submit / status / logs / stop``: fedray jobs on a Ray cluster, through Ray Jobs.

``fedray submit JOB.yaml`` sends the job file, this machine's fedray package and the user's
modules the job names by import path: parts, ``model.name``, callbacks (Ray's runtime_env
``working_dir`` and ``py_modules``, ``user_modules``) to the cluster's job server, where
``fedray run job.yaml key=value ...`` runs (``python -m fedray.cluster.entrypoint``, which
reads the overrides from a file shipped with the job, so that no credential in them shows in
the cluster's job list), joining the cluster through the RAY_ADDRESS Ray Jobs sets. The
cluster's nodes must already have fedray's dependencies (ray_cluster.yaml's setup_commands
install them); the shipped package makes the code the one you just edited. The job runs on
the head, so its paths are the cluster's: ``output.dir`` and a partition store must be URLs
(s3://, gs://) or absolute paths on storage every node shares -- a relative path would land
in the job's temporary working directory and be lost with it, so it is refused here, before
anything is sent.

``fedray submit --resume RUN_DIR`` sends ``fedray run --resume RUN_DIR`` the same way (the
package, the user's modules the run's config names), for a run whose job stopped, failed
or lost its cluster: it continues from the run's last checkpoint on the cluster. RUN_DIR is
checked here first (a URL or an absolute path, holding a run with a checkpoint).

A cluster with token authentication that refuses this machine (no token sent, or the wrong
one) is said in one line with the fix (fedray.runtime.session.token_refusal), not with the
traceback of Ray's AuthenticationError.
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from omegaconf import OmegaConf

from fedray.algorithms.registry import PART_KEYS, installed, sibling_files
from fedray.cluster.job_files import JOB_FILE, OVERRIDES_FILE, RESUME_FILE
from fedray.config import FedrayConfig, load_structured
from fedray.errors import FedrayError, key_error, one_line
from fedray.runtime.session import token_refusal, token_source
from fedray.state.checkpoint import (
    CHECKPOINT_FILE,
    masked_keys,
    read_checkpoint_header,
    saved_config,
)
from fedray.state.redact import mask

DEFAULT_ADDRESS = "http://127.0.0.1:8265"
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")

MAX_MODULES_MB = 64  # the user's modules shipped with a job, and with every sweep trial


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
        return JobSubmissionClient(url)  # asks the server its version: auth is checked here
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise FedrayError(f"--address {url}: cannot reach Ray's job server: "
                          f"{one_line(exc)}") from None
    except Exception as exc:
        refused = auth_failure(exc, url)
        if refused is None:
            raise
        raise refused from None


def auth_failure(exc: BaseException, url: str) -> FedrayError | None:
    """Ray's AuthenticationError as one line with the fix, or None for any other error.

    The job client raises it for the job server's 401 (no token came) and 403 (a wrong one)
    under token authentication, and before any request when RAY_AUTH_MODE=token finds no
    token here; its text is a paragraph of advice that names neither case plainly. A 401
    that is not Ray's (a proxy's in front of the dashboard: its first line does not speak
    of an authentication token) is shown as the server's refusal instead."""
    try:
        from ray.exceptions import AuthenticationError
    except ImportError:  # a Ray without token authentication
        return None
    if not isinstance(exc, AuthenticationError):
        return None

    no_token_here = os.environ.get("RAY_AUTH_MODE", "").strip().lower() == "token" and \
        token_source()[0] is None  # Ray refused before sending (its words vary by cause)
    if no_token_here or "authentication token" in one_line(exc).lower():
        return FedrayError(token_refusal(f"the Ray cluster at {url}"))
    return FedrayError(f"--address {url}: the job server refused the request: "
                       f"{one_line(exc)}")


def _local_relative(url: str) -> bool:
    """A path relative to this process's directory: ``runs/x``, and ``file://runs/x``
    (fsspec reads a file URL's relative path from the directory it runs in too)."""
    path = url.removeprefix("file://")
    return "://" not in path and not os.path.isabs(os.path.expanduser(path))


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


@dataclass(frozen=True)
class UserModule:
    """A user's module that a job names a part or its model in (``algorithm.aggregator:
    examples.qffl:QFedAvg``, ``model.name: examples/models.py:BatchNormCNN``), as found on
    this machine."""

    key: str  # the config key that names it
    ref: str  # the module part of the import path, as given: examples.qffl, or algos/x.py
    path: str  # what to ship: its top-level package's directory, or its .py file (absolute)
    by_file: bool  # named by a .py file's path rather than a module name


def algorithm_refs(algorithm: Any) -> list[tuple[str, str]]:
    """(config key, import path) of each part of an ``algorithm`` section named by import
    path (``module:Class``) rather than by a registered name."""
    out = []
    for k in PART_KEYS:
        ref = algorithm.get(k) if algorithm is not None else None
        # algorithm.stages is a list of them (a ListConfig is a Sequence too)
        refs = ref if isinstance(ref, Sequence) and not isinstance(ref, str) else [ref]
        out += [(f"algorithm.{k}", r) for r in refs if isinstance(r, str) and ":" in r]
    return out


def model_refs(cfg: Any) -> list[tuple[str, str]]:
    """``[("model.name", import path)]`` when a job names its model by import path."""
    name = (cfg.get("model") or {}).get("name")
    return [("model.name", name)] if isinstance(name, str) and ":" in name else []


def job_refs(cfg: Any) -> list[tuple[str, str]]:
    """(config key, import path) of everything of the user's a job names: its algorithm's
    parts, its model and its ``output.callbacks`` (which run in the process that runs the
    job)."""
    output = cfg.get("output") or {}
    callbacks = [("output.callbacks", r) for r in output.get("callbacks") or []
                 if isinstance(r, str) and ":" in r]
    return algorithm_refs(cfg.get("algorithm")) + model_refs(cfg) + callbacks


def user_modules(refs: Iterable[tuple[str, str]], cwd: str | None = None) -> list[UserModule]:
    """The user's modules behind import paths, found from ``cwd`` first, as ``fedray run``
    imports them (fedray.algorithms.registry.import_object), without running their code.

    A module name ships its *top-level* package: ``examples.qffl`` ships the directory
    ``examples/``, so the module's own imports of its siblings work on the cluster too. A
    top-level module that is a file (``my_models`` for ``my_models.py``) ships with the
    ``.py`` files beside it, as a ``.py`` path does (``_stage_file``; the same
    ``registry.sibling_files``), at most MAX_MODULES_MB of them. fedray itself and installed
    packages are left out (the nodes have them)."""
    cwd = cwd or os.getcwd()
    out: dict[str, UserModule] = {}
    for key, ref in refs:
        module = ref.rpartition(":")[0]
        if not module:
            continue  # registry.import_object refuses it with the key's name
        if module.endswith(".py") or os.sep in module:
            path = os.path.abspath(os.path.join(cwd, module))
            if not os.path.isfile(path):
                raise key_error(key, f"no such file: {path}", ref)
            siblings(key, ref, path)  # what _stage_file copies, checked here
            out.setdefault(os.path.realpath(path), UserModule(key, module, path, True))
            continue
        top = module.split(".")[0]
        if top == "fedray":
            continue
        spec = importlib.machinery.PathFinder.find_spec(top, [cwd, *sys.path])
        if spec is None:
            raise key_error(key, f"cannot find module {top} (looked in {cwd} and on "
                            "sys.path)", ref)
        paths = list(spec.submodule_search_locations or []) or [spec.origin or ""]
        if not spec.submodule_search_locations and paths[0].endswith(".py") and \
                not installed(paths[0]):
            paths = siblings(key, ref, paths[0])  # a module file: its neighbours too
        for path in paths:  # one directory reached twice on sys.path ("a/../b" and "b",
            # a symlink) is one module: keyed by its real path
            if path and os.path.exists(path) and not installed(path):
                out.setdefault(os.path.realpath(path),
                               UserModule(key, module, os.path.abspath(path), False))
    return list(out.values())


def siblings(key: str, ref: str, path: str) -> list[str]:
    """The ``.py`` files that travel with the module file ``path``
    (fedray.algorithms.registry.sibling_files), refused in one line naming ``key`` when
    they exceed what a sweep ships with every trial (MAX_MODULES_MB)."""
    files = sibling_files(path)
    size = sum(os.path.getsize(f) for f in files)
    if size > MAX_MODULES_MB * 2**20:
        raise key_error(key, f"the {len(files)} .py files beside {os.path.basename(path)} "
                        f"that travel with it take {size / 2**20:.0f} MiB, more than "
                        f"{MAX_MODULES_MB} MiB: move the module into a directory of its own, "
                        "or install it on the cluster's nodes", ref)
    return files


def submit(job: str, overrides: list[str], address: str | None = None,
           submission_id: str | None = None, agent_wait_s: float = 120.0) -> str:
    """Submit ``fedray run JOB.yaml overrides`` to the cluster; return the job's id. A head
    whose job agent is not up yet (just after ``ray up``) is retried for ``agent_wait_s``."""
    # typos and types fail here, not on the cluster; without load_config's default output.dir
    cfg = load_structured(FedrayConfig, job, overrides)
    if cfg.output.dir is None:
        raise FedrayError("config key 'output.dir': set it for a cluster job (a URL such as "
                          "s3://bucket/runs/x, or an absolute path on shared storage)")
    check_cluster_paths(cfg)
    return _send(f"submit {job}", job, overrides, cfg, address, submission_id, agent_wait_s)


@dataclass(frozen=True)
class Resumed:
    """A resumed run's submission: the job's id, and the checkpoint it continues from."""

    job_id: str
    round: int


def submit_resume(run_dir: str, job: str | None = None, overrides: Sequence[str] = (),
                  allow_changes: Sequence[str] = (), address: str | None = None,
                  submission_id: str | None = None, agent_wait_s: float = 120.0) -> Resumed:
    """Submit ``fedray run [JOB.yaml] --resume RUN_DIR overrides --allow-change KEY ...``:
    the run continues from its last checkpoint on the cluster, under its config.yaml (or
    ``job``, which a config.yaml with masked credentials needs) plus the overrides. What
    can be checked here is, before anything is sent: RUN_DIR is a URL or an absolute path
    (the cluster's processes read it), a fedray run, with a checkpoint (without one a
    resume would start again from round 1: submit the job again instead), and the config
    the resume would run under has no unknown key or wrong type, nor a relative store. The
    comparison with the config the checkpoint records needs the run's data and model, so the
    cluster makes it: a refusal there is the job's last log line."""
    if _local_relative(run_dir) or run_dir.startswith("memory://"):
        raise FedrayError(f"--resume {run_dir}: a job on a cluster continues a run where "
                          "every node can reach it: give the run's URL (s3://bucket/runs/x) "
                          "or its absolute path on shared storage")
    saved = saved_config(run_dir)  # "not a fedray run directory (no config.yaml)"
    head = read_checkpoint_header(run_dir)
    if head is None:
        raise FedrayError(f"--resume {run_dir}: it has no {CHECKPOINT_FILE} to continue "
                          "from (a resume would start again from round 1); submit its job "
                          "again with a new output.dir")
    masked = masked_keys(saved) if job is None else []
    if masked:
        raise FedrayError(f"--resume {run_dir}: its config.yaml has masked credentials in "
                          f"{', '.join(masked)}; give the job again: fedray submit JOB.yaml "
                          f"--resume {run_dir}")
    cfg = load_structured(FedrayConfig, job if job is not None else saved, overrides)
    check_cluster_paths(OmegaConf.merge(cfg, {"output": {"dir": run_dir}}))
    job_id = _send(f"submit --resume {run_dir}", job, overrides, cfg, address, submission_id,
                   agent_wait_s, resume={"run_dir": run_dir,
                                         "allow_change": list(allow_changes)})
    return Resumed(job_id, head.round)


def _send(what: str, job: str | None, overrides: Sequence[str], cfg: Any,
          address: str | None, submission_id: str | None, agent_wait_s: float,
          resume: dict | None = None) -> str:
    """Ship a checked job to the cluster's job server, with this machine's fedray package
    and the user's modules ``cfg`` names; return the job's id."""
    modules = user_modules(job_refs(cfg))
    jobs = client(address)
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # fedray/
    staging = tempfile.mkdtemp(prefix="fedray-submit-")
    try:
        for m in modules:
            if m.by_file:
                _stage_file(m, staging)
        spec = job_spec(job, overrides, staging,
                        [package] + [m.path for m in modules if not m.by_file], cfg.name,
                        resume=resume)
        deadline = time.monotonic() + agent_wait_s
        while True:
            try:
                return jobs.submit_job(submission_id=submission_id, **spec)
            except RuntimeError as exc:  # the job server's refusal (a duplicate id, ...)
                # a head that has just started has no job agent yet: wait for it
                if "No available agent" in str(exc) and time.monotonic() < deadline:
                    time.sleep(2.0)
                    continue
                raise FedrayError(f"{what}: {one_line(exc)}") from None
            except Exception as exc:
                refused = auth_failure(exc, job_server(address))
                if refused is None:
                    raise
                raise refused from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def job_spec(job: str | None, overrides: Sequence[str], staging: str, py_modules: list[str],
             name: str, resume: dict | None = None) -> dict[str, Any]:
    """What ``submit`` hands Ray Jobs: the entrypoint, the runtime environment and the
    metadata, with the job file and the overrides staged in ``staging`` (the job's working
    directory). Everything returned here is shown to whoever can list the cluster's jobs
    (``ray job list``, the dashboard, the job log's first line), so it holds no override
    value, which may carry a credential (``output.dir=s3://KEY:SECRET@...``): the values
    travel in ``overrides.json`` (fedray.cluster.entrypoint), the metadata names only the
    keys. A resume (``resume``: the run directory and the --allow-change keys) travels the
    same way, in ``resume.json``, which the entrypoint reads
    (fedray.cluster.entrypoint.resume_argv); its job file, if any, is optional."""
    if job is not None:
        shutil.copyfile(job, os.path.join(staging, JOB_FILE))
    with open(os.path.join(staging, OVERRIDES_FILE), "w", encoding="utf-8") as f:
        json.dump(list(overrides), f)
    keys = ", ".join(o.split("=", 1)[0] for o in overrides)
    metadata = {"fedray_job": mask(os.path.basename(job)) if job is not None else "",
                "fedray_name": mask(name), "fedray_overrides": mask(keys)}
    if resume is not None:
        with open(os.path.join(staging, RESUME_FILE), "w", encoding="utf-8") as f:
            json.dump(resume, f)
        metadata["fedray_resume"] = mask(resume["run_dir"])
    return {"entrypoint": shlex.join(["python", "-m", "fedray.cluster.entrypoint"]),
            "runtime_env": {"working_dir": staging, "py_modules": py_modules,
                            "excludes": ["__pycache__"]},
            "metadata": metadata}


def _stage_file(module: UserModule, staging: str) -> None:
    """A part or model named by a relative .py path goes into the job's working directory at
    that path, with the .py files beside it (``siblings``: a helper it imports), where the
    entrypoint (which runs there) finds them; an absolute path is left as it is: like
    output.dir, it must be on storage every node shares."""
    if os.path.isabs(module.ref):
        return
    rel = os.path.normpath(module.ref)
    if rel.startswith(os.pardir):
        raise key_error(module.key, "a job on a cluster finds a .py file inside the directory "
                        "you submit from, or at an absolute path on shared storage; or name "
                        "its module instead (package.module:Class)", module.ref)
    folder = os.path.dirname(os.path.join(staging, rel))
    os.makedirs(folder, exist_ok=True)
    for path in siblings(module.key, module.ref, module.path):
        shutil.copyfile(path, os.path.join(folder, os.path.basename(path)))


def _call(what: str, job_id: str, fn: Callable[[], Any], address: str | None) -> Any:
    try:
        return fn()
    except RuntimeError as exc:
        raise FedrayError(f"{what} {job_id}: {one_line(exc)}") from None
    except Exception as exc:  # a token refused between two calls of `logs --follow`
        refused = auth_failure(exc, job_server(address))
        if refused is None:
            raise
        raise refused from None


def status(job_id: str, address: str | None = None) -> dict[str, Any]:
    info = _call("status", job_id, lambda: client(address).get_job_info(job_id), address)
    return {"job_id": job_id, "status": str(info.status.value if hasattr(info.status, "value")
                                            else info.status),
            "message": mask(info.message or ""), "entrypoint": mask(info.entrypoint)}


def logs(job_id: str, address: str | None = None) -> str:
    """The job's log, credentials masked (a job of an older fedray had them in its first
    line, the entrypoint)."""
    return mask(_call("logs", job_id, lambda: client(address).get_job_logs(job_id), address))


def stop(job_id: str, address: str | None = None) -> bool:
    return bool(_call("stop", job_id, lambda: client(address).stop_job(job_id), address))


def follow(job_id: str, address: str | None = None, out: Callable[[str], None] = print,
           poll_s: float = 2.0, timeout_s: float | None = None) -> str:
    """Print the job's log as it grows until the job ends; return its final status."""
    jobs = client(address)
    shown = 0
    start = time.monotonic()
    while True:
        state = _call("status", job_id, lambda: jobs.get_job_status(job_id), address)
        state = str(getattr(state, "value", state))
        text = _call("logs", job_id, lambda: jobs.get_job_logs(job_id), address)
        if len(text) > shown:
            out(mask(text[shown:].rstrip("\n")))
            shown = len(text)
        if state in TERMINAL:
            return state
        if timeout_s is not None and time.monotonic() - start > timeout_s:
            raise FedrayError(f"job {job_id}: still {state} after {timeout_s:.0f}s")
        time.sleep(poll_s)
