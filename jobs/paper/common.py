"""What the scripted reproductions under jobs/paper/ share: run a list of jobs in one Ray
session, skipping those already finished, so an interrupted sweep resumes where it stopped."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import time
from collections.abc import Callable, Iterable
from typing import Any

import fedray
from fedray.config import load_config
from fedray.runtime.session import ray_session

# (job file, overrides, run directory, extra keyword arguments of fedray.run)
Run = tuple[str, list[str], str, dict[str, Any]]


def _log(line: str) -> None:
    print(line, flush=True)


def run_all(runs: Iterable[Run], log: Callable[[str], None] = _log) -> None:
    runs = list(runs)
    if all(os.path.exists(os.path.join(out, "summary.json")) for _, _, out, _ in runs):
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


def parser(doc: str, runs_default: str) -> argparse.ArgumentParser:
    """The options every scripted reproduction takes: --out, --runs and --rounds."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="directory for the tables and figures")
    p.add_argument("--runs", default=runs_default, help="where the run directories go "
                   "(finished runs found there are reused)")
    p.add_argument("--rounds", type=int, help="override the jobs' rounds (tests use few)")
    return p
