"""Coordinate-wise median aggregation (Yin, Chen, Ramchandran, Bartlett, "Byzantine-Robust
Distributed Learning: Towards Optimal Statistical Rates", ICML 2018) under a sign-flip attack:
a user's aggregator and update stage, kept outside the fedray package.

FedAvg's mean lets one client move the global model anywhere: a client that sends
-s times its honest update drags every coordinate of the mean by s/k of it, and a fifth of
such clients with s = 4 turns the mean's step around (0.8 x 1 - 0.2 x 4 = 0: no progress;
more and it ascends). The coordinate-wise median of the k updates moves only while the
attackers are fewer than half: per coordinate it is an honest client's value, or lies
between two honest values. The round's update is

    u_j = median_k d_kj    (the mean of the two middle values when k is even)

and the server adds it (server_opt sgd, server.lr 1: x <- x + u).

Why it needs fedray's individual updates: a median is not a weighted sum, so it cannot be
folded into a worker's partial sum. ``Median`` sets ``individual = True``: each worker
returns its clients' updates (float32 rows, through the object store), and the driver calls
``aggregate`` once with the round's (k, d) rows in the round's sampled client order -- the
same rows, in the same order, whatever the worker count, so runs are bit-identical across
worker counts and on resume. The driver's memory for them is k x d x 4 bytes, bounded by
``runtime.individual_updates_mb`` (checked before round 1).

The median is exact against a float64 reference: each value is one of the float32 rows, or
the float64 mean of two of them, which float64 holds exactly.

``SignFlip`` is the attack, an update stage (it changes each update on its way up, after
training, whatever the client part and aggregator): each client is malicious with
probability ``fraction``, drawn once for the run from (seed, client id), and a malicious
client sends -``scale`` times its update.

Use it by import path, from the repository root (or with this directory's parent importable):

    fedray run jobs/quickstart.yaml algorithm.aggregator=examples.median:Median \\
        'algorithm.stages=[examples.median:SignFlip]' algorithm.signflip.fraction=0.2

and, to see the attack break FedAvg's mean, the same with algorithm.aggregator=uniform.

fedray has since built both in, with the other robust aggregators and attacks
(``algorithm.aggregator=median``, ``adversary.attacks=[sign_flip]``: docs/robustness.md);
this file stays as the template of a user's aggregator that needs every client's update.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from fedray.algorithms.base import (
    Aggregator,
    ClientContext,
    ClientRows,
    LocalUpdate,
    PartialSum,
    UpdateStage,
    WorkerEnv,
    require,
)
from fedray.core.seeding import derive_seed

SIGNFLIP_TAG = 0x5F11  # this example's own stream of fedray's seed derivation


class Median(Aggregator):
    """The coordinate-wise median of the round's kept client updates (unweighted)."""

    name = "median"
    individual = True
    # the median sorts this many values at once (a slice of columns, k values each), so its
    # scratch memory (a transposed copy of the slice) stays a small addition to the k x d rows
    chunk_values = 1 << 19
    threads = min(4, os.cpu_count() or 1)  # the slices are sorted on this many threads

    def aggregate(self, updates: torch.Tensor, clients: ClientRows,
                  acc: PartialSum) -> torch.Tensor:
        k, d = updates.shape
        lo, hi = (k - 1) // 2, k // 2  # the middle value(s): equal for odd k
        rows = updates.numpy()
        out = np.empty(d, np.float64)
        step = max(1, self.chunk_values // k)

        def median_of(start: int) -> None:
            # each coordinate's k values side by side, sorted: numpy's vectorized sort of
            # short rows beat np.partition down the columns 3.5x at k = 100, d = 48,670
            # (docs/performance.md, "Client state packs"); NaN sorts last in both
            part = np.ascontiguousarray(rows[:, start:start + step].T)
            part.sort(axis=1)
            out[start:start + step] = (part[:, lo].astype(np.float64) + part[:, hi]) / 2

        # the slices on threads (numpy sorts and copies without the GIL): the driver runs
        # this while every worker waits for the next round, so their cores are idle
        with ThreadPoolExecutor(min(self.threads, max(1, d // step))) as pool:
            list(pool.map(median_of, range(0, d, step)))
        return torch.from_numpy(out)


@dataclass
class SignFlipParams:
    fraction: float = 0.2  # each client's chance to be malicious (once for the run)
    scale: float = 4.0  # a malicious client sends -scale x its update


def malicious(seed: int, cid: int, fraction: float) -> bool:
    """Whether client ``cid`` attacks in the run of ``seed``: a seeded hash of (seed, id),
    the same on every worker, in every round and on resume."""
    return derive_seed(seed, SIGNFLIP_TAG, cid) < fraction * 2.0 ** 63


class SignFlip(UpdateStage):
    """A sign-flip attack: malicious clients send -scale x their honest update."""

    name = "signflip"
    section = "signflip"
    Params = SignFlipParams

    def check(self, params: SignFlipParams) -> None:
        require(0 <= params.fraction <= 1, "fraction", "must be in [0, 1]", params.fraction)
        require(params.scale > 0, "scale", "must be > 0", params.scale)

    def client_update(self, env: WorkerEnv, ctx: ClientContext, update: LocalUpdate,
                      acc: PartialSum) -> dict[str, torch.Tensor] | None:
        p = self.params
        if malicious(env.seed, ctx.cid, p.fraction):
            update.delta = update.delta * -p.scale  # a new tensor: the kernel's may be reused
        return None
