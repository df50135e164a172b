"""``runtime.backend: auto``: a short run never starts Ray; a long one hands itself to Ray.

Why: on a laptop most of a short run's time is start-up, not training. Starting a private
Ray, a driver actor and its workers costs several processes that each import torch (about
3 CPU seconds apiece on a 2-core machine, docs/performance.md); a run of a round or two
finishes sooner in the caller's process (``runtime.backend: inline``) than Ray takes to
start. A long run wants the workers, which train a round's clients side by side.

Which one a run is cannot be known before it trains: so ``auto`` starts in the calling
process, with exactly the workers (the same count) a Ray run would have, times each round,
and after each round projects the rest at that pace. When the projection exceeds
``runtime.auto_inline_s`` the driver writes the checkpoint after that round, and a driver
actor on Ray resumes from it; the caller's callbacks, the metrics and the summary see one
run. Because a result depends neither on where a worker's clients train nor on a
checkpoint and resume between rounds (tests/runtime/test_handover.py checks the weights bit
for bit against a run on Ray alone), the hand-over changes no number.

``auto`` goes to Ray from the first round wherever Ray is the point or is already paid
for: a cluster address (``runtime.address``, or RAY_ADDRESS as Ray Jobs sets it), a Ray
already running in this process (a sweep's trial, a notebook, a test session), GPU
workers, the dashboard, or a worker timeout (only Ray workers can be timed out).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from fedray.config import RuntimeConfig


def ray_from_the_start(runtime: RuntimeConfig) -> str | None:
    """Why ``runtime.backend: auto`` starts this run on Ray rather than in this process,
    or None when it starts here. Imports nothing: a run that stays here never loads Ray."""
    if runtime.address:
        return "runtime.address names a cluster"
    inherited = os.environ.get("RAY_ADDRESS")
    if inherited and inherited != "local":
        return "RAY_ADDRESS names a cluster"
    ray = sys.modules.get("ray")
    if ray is not None and getattr(ray, "is_initialized", lambda: False)():
        return "Ray is already running in this process"
    if runtime.worker.num_gpus > 0:
        return "runtime.worker.num_gpus asks for GPU workers"
    if runtime.dashboard:
        return "runtime.dashboard asks for Ray's dashboard"
    if runtime.worker_timeout_s is not None:
        return "runtime.worker_timeout_s times out Ray workers"
    return None


def local_resources(runtime: RuntimeConfig) -> dict[str, float]:
    """The resources a private Ray started by this run would have (fedray.runtime.session):
    ``runtime.num_cpus`` or this machine's CPU count, ``runtime.num_gpus`` or none (auto
    runs no GPU workers here). The count of workers follows from them
    (fedray.runtime.pool.pool_size), so the first rounds run with the workers Ray's would."""
    return {"CPU": float(runtime.num_cpus or os.cpu_count() or 1),
            "GPU": float(runtime.num_gpus or 0)}


class HandOver:
    """The rule: after round ``r`` of ``rounds``, hand the run to Ray when the rounds left,
    at the mean pace of the rounds run here so far, are projected to take more than
    ``limit_s`` seconds. The first round's time includes one-off work (buffers allocated,
    kernels chosen), so a long run is projected long, and handed over, after its first
    round; a run of a round or two stays here."""

    def __init__(self, rounds: int, limit_s: float,
                 note: Callable[[str], None] | None = None):
        self.rounds = rounds
        self.limit_s = limit_s
        self.note = note
        self.seconds: list[float] = []

    def due(self, r: int, round_s: float) -> bool:
        """Round ``r`` took ``round_s`` seconds here: is the rest of the run Ray's?"""
        self.seconds.append(round_s)
        left = self.rounds - r
        if left <= 0:
            return False
        pace = sum(self.seconds) / len(self.seconds)
        rest = left * pace
        if rest <= self.limit_s:
            return False
        if self.note is not None:
            done = (f"round {r} took {pace:.1f} s" if len(self.seconds) == 1 else
                    f"rounds took {pace:.1f} s each")
            self.note(f"runtime.backend=auto: {done} in this process; the {left} left "
                      f"(about {rest:.0f} s at that pace, more than runtime.auto_inline_s="
                      f"{self.limit_s:g}) go to Ray's workers")
        return True
