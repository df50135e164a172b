"""What the scripted reproductions under jobs/paper/ share: run a list of jobs in one Ray
session, skipping those already finished, so an interrupted sweep resumes where it stopped."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

from omegaconf import OmegaConf

import fedray
from fedray.config import load_config
from fedray.errors import FedrayError, printable_line
from fedray.runtime.session import ray_session
from fedray.state.redact import mask
from fedray.state.storage import absolute_url

# (job file, overrides, run directory, extra keyword arguments of fedray.run)
Run = tuple[str, list[str], str, dict[str, Any]]


def _log(line: str) -> None:
    print(line, flush=True)


class StaleRun(FedrayError):
    """A finished run that was made with other settings than those asked for now."""


def made_with(out: str, overrides: list[str]) -> str | None:
    """None when the finished run in ``out`` was made with every ``key=value`` of
    ``overrides``, else the first that differs, as "key=old, asked for new". Why: a run is
    reused by its directory, so changing a script's horizon, grid or data without a new
    --runs would otherwise report the old runs under the new settings."""
    saved = OmegaConf.load(os.path.join(out, "config.yaml"))
    for item in overrides:
        key, _, value = item.partition("=")
        want = OmegaConf.select(OmegaConf.from_dotlist([item]), key)
        have = OmegaConf.select(saved, key, default=None)
        if key == "data.partition":  # the run records the store's absolute URL
            want = absolute_url(value)
        if want != have:
            return f"{key}={have}, asked for {want}"
    return None


def run_all(runs: Iterable[Run], log: Callable[[str], None] = _log) -> None:
    """Run each job not yet finished in its directory; a finished one is reused, unless it
    was made with other overrides (StaleRun: remove it, or give the script another --runs)."""
    runs = list(runs)
    finished = [(out, o) for _, o, out, _ in runs
                if os.path.exists(os.path.join(out, "summary.json"))]
    for out, overrides in finished:
        differs = made_with(out, overrides)
        if differs:
            raise StaleRun(f"{out}: finished with {differs}; remove it, or pass another --runs")
    if len(finished) == len(runs):
        return  # everything already finished: no Ray session to start
    cfg = load_config(runs[0][0], runs[0][1])
    # runtime.backend=inline runs need no Ray: starting a session would only cost time
    session = (contextlib.nullcontext() if cfg.runtime.backend == "inline"
               else ray_session(cfg.runtime))
    with session:
        for i, (job, overrides, out, kwargs) in enumerate(runs, 1):
            if os.path.exists(os.path.join(out, "summary.json")):
                continue
            if os.path.exists(out):  # a run cut off before its summary: start it again
                shutil.rmtree(out)
            t0 = time.perf_counter()
            fedray.run(job, overrides=[*overrides, f"output.dir={out}"], **kwargs)
            log(f"[{i}/{len(runs)}] {out} ({time.perf_counter() - t0:.0f}s)")


def _one_line(kind: type, error: BaseException, tb: Any) -> None:
    """A FedrayError as the fedray CLI prints one (secrets masked, one printable line)."""
    if isinstance(error, FedrayError):
        print(f"error: {printable_line(mask(str(error)))}", file=sys.stderr)
        sys.exit(2)
    sys.__excepthook__(kind, error, tb)


def parser(doc: str, runs_default: str) -> argparse.ArgumentParser:
    """The options every scripted reproduction takes: --out, --runs and --rounds. A script
    that builds its command line this way also ends on a FedrayError (a bad store, a stale
    run) with its one line and exit status 2, as the fedray CLI does, not a traceback."""
    sys.excepthook = _one_line
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="directory for the tables and figures")
    p.add_argument("--runs", default=runs_default, help="where the run directories go "
                   "(finished runs found there are reused)")
    p.add_argument("--rounds", type=int, help="override the jobs' rounds (tests use few)")
    return p
