"""The worker actor: one long-lived process that trains many virtual clients per round.

A worker reserves ``runtime.worker.num_cpus`` CPUs and a (possibly fractional) share of a GPU,
builds one model replica, and for each round: maps the broadcast global weights (one object
store read), trains its assigned clients one after another on the replica, folds each delta
into a local weighted sum, and returns that single partial result.
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedray.aggregator import NEEDS, PartialSum, client_weight, expalpha_log_weight, extra_size
from fedray.client_state import ClientStateStore
from fedray.client_update import (
    ClientResult,
    client_batch_size,
    full_gradient,
    local_sgd,
    sensitivity,
)
from fedray.data.source import ClientCache, ClientSource
from fedray.evaluation import evaluate, merge_sums
from fedray.replica import FlatModel
from fedray.runtime import keep_freed_memory, private_mb
from fedray.seeding import TAG_CONTROL, TAG_HOLDOUT, client_seed, derive_seed
from fedray.tensors import readonly_tensor
from fedray.vectorized import group_size, group_sizes, vmap_local_sgd


@dataclass
class WorkerSpec:
    """Everything a worker needs, shipped once when the pool is created."""

    make_model: Callable[[], nn.Module]
    source: ClientSource
    seed: int
    lr: float
    batch_size: int
    local_epochs: int
    local_steps: int | None
    eval_batch_size: int
    num_cpus: float
    cache_mb: int
    client: str = "local_sgd"  # see fedray.algorithms.CLIENT_UPDATES
    aggregator: str = "proportional"  # see fedray.algorithms.AGGREGATORS
    loss: str = "cross_entropy"  # see fedray.losses.LOSSES
    prox_mu: float = 0.0  # > 0 only for the fedprox client update
    scaffold_option: int = 2  # SCAFFOLD's c_i+ rule (I: gradient at x, II: from the delta)
    elastic_mu: float = 0.95  # Elastic: EMA decay of the sensitivity over B_k's batches
    elastic_holdout: float = 0.3  # Elastic: share of a client's examples held out as B_k
    alpha: float = 0.2  # Exp-alpha temperature
    state_url: str | None = None  # client state store (SCAFFOLD's c_i), under the run dir
    state_cache_mb: float = 64.0
    steps_per_epoch: int | None = None  # client.steps_per_epoch: batch = n / steps_per_epoch
    max_update_norm: float | None = None  # guard: drop larger updates (NaN/Inf: always)
    vectorize: bool = False  # train clients in groups (the driver's vectorize_plan decides)


def holdout_split(n: int, share: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(held-out, training) example indices of a client for one round, from its own seed.

    Elastic aggregation measures sensitivity on a subset B_k removed from the training data:
    round(share * n) examples, at least one, and at least one left to train on (a client
    with a single example holds nothing out)."""
    if n < 2:
        return torch.empty(0, dtype=torch.long), torch.arange(n)
    m = min(n - 1, max(1, round(share * n)))
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return perm[:m], perm[m:]


@dataclass
class _Job:
    """One client's round between its preparation and its folding into the partial sum."""

    cid: int
    round: int
    version: int  # its current state version (0: none yet)
    seed: int
    x: torch.Tensor  # training data (Elastic: without B_k)
    y: torch.Tensor
    batch: int
    held_x: torch.Tensor | None = None  # Elastic's B_k


def _chunks(items: Iterator, sizes: list[int]) -> Iterator[list]:
    """``items`` cut into consecutive lists of the given sizes."""
    for size in sizes:
        yield [next(items) for _ in range(size)]


class ClientWorker:
    def __init__(self, spec: WorkerSpec | None = None):
        if spec is not None:
            self.configure(spec)

    def configure(self, spec: WorkerSpec) -> None:
        """Build the model replica, the data cache and the client state store for ``spec``.

        Apart from __init__ so that a worker's process can start, and import torch (1-2 s),
        while the driver is still starting and has no spec yet (fedray.pool.launch_workers)."""
        import ray

        self.spec = spec
        torch.set_num_threads(max(1, int(spec.num_cpus)))
        keep_freed_memory()  # per-step tensors of MBs reuse the heap, without page faults
        gpu_ids = ray.get_gpu_ids() if ray.is_initialized() else []  # outside Ray: the CPU
        use_cuda = bool(gpu_ids) and torch.cuda.is_available()
        self.device = torch.device("cuda" if use_cuda else "cpu")
        self.gpu_ids = [str(g) for g in gpu_ids]
        self.model = FlatModel(spec.make_model(), self.device)
        self._weights = torch.empty_like(self.model.flat)
        self._delta = torch.empty_like(self.model.flat)
        self.cache = ClientCache(spec.source, spec.cache_mb * 2**20)
        self.needs = NEEDS[spec.aggregator]
        p = self.model.num_params
        vec = functools.partial(torch.zeros, p, device=self.device)
        # SCAFFOLD: server c, client c_i, c - c_i, c_i+; Elastic: Omega_k
        self._c, self._ci, self._corr, self._ci_new, self._omega = (vec() for _ in range(5))
        self.state = (ClientStateStore(spec.state_url, spec.state_cache_mb)
                      if "control_variate" in self.needs else None)
        self._stored: list[int] = []  # clients whose state this round's train() wrote
        self.group = (group_size(self.model.num_params, self.device.type == "cuda")
                      if spec.vectorize else 0)
        self._prefetch = spec.source.cacheable or self.device.type == "cuda"

    def info(self) -> dict:
        import ray

        return {"pid": os.getpid(), "gpu_ids": self.gpu_ids, "device": str(self.device),
                "node_id": ray.get_runtime_context().get_node_id(),
                "threads": torch.get_num_threads()}

    def _load_global(self, weights: np.ndarray) -> torch.Tensor:
        self._weights.copy_(readonly_tensor(weights))
        return self._weights

    def _risk(self, weights: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> float:
        """Exp-alpha's F_k(w): the mean loss on the client's training data (eval mode)."""
        self.model.load_(weights)
        s = evaluate(self.model.module, x, y, self.spec.eval_batch_size, self.device,
                     self.spec.loss)
        return s["loss_sum"] / max(1, s["count"])

    def _admissible(self, delta: torch.Tensor) -> bool:
        """The guard: a non-finite update, or one above guard.max_update_norm, must never
        reach the global model (nor, for SCAFFOLD, the client's stored c_i)."""
        norm = float(torch.linalg.vector_norm(delta))  # NaN or Inf if any entry is
        bound = self.spec.max_update_norm
        return math.isfinite(norm) and (bound is None or norm <= bound)

    def _prepare(self, round_idx: int, cid: int, version: int) -> _Job:
        """A client's round before its local update: its seed, data, batch size and, for
        Elastic, the held-out B_k (gone from the training data)."""
        s = self.spec
        seed = client_seed(s.seed, round_idx, cid)
        x, y = self.cache.get(cid)
        job = _Job(cid, round_idx, version, seed, x, y,
                   client_batch_size(len(y), s.batch_size, s.steps_per_epoch))
        if "sensitivity" in self.needs:
            held, keep = holdout_split(len(y), s.elastic_holdout, derive_seed(seed, TAG_HOLDOUT))
            job.held_x = x[held]
            job.x, job.y = x[keep], y[keep]
            job.batch = client_batch_size(len(keep), s.batch_size, s.steps_per_epoch)
        if self.device.type == "cuda":  # page-locked: the copy to the GPU runs asynchronously
            job.x, job.y = job.x.pin_memory(), job.y.pin_memory()
        return job

    def _jobs(self, round_idx: int, client_ids: list[int],
              versions: list[int] | None) -> Iterator[_Job]:
        """The clients' prepared rounds, in order. Where reading a client costs something (a
        store's shards, generated data) or a GPU waits for it, the next client is read on a
        background thread while the current one trains."""
        args = [(round_idx, cid, versions[i] if versions else 0)
                for i, cid in enumerate(client_ids)]
        if not self._prefetch:
            yield from (self._prepare(*a) for a in args)
            return
        with ThreadPoolExecutor(1, thread_name_prefix="fedray-prefetch") as pool:
            ahead = deque(pool.submit(self._prepare, *a) for a in args[:2])
            for a in args[2:]:
                yield ahead.popleft().result()
                ahead.append(pool.submit(self._prepare, *a))
            while ahead:
                yield ahead.popleft().result()

    def _load_ci(self, job: _Job, out: torch.Tensor) -> torch.Tensor | None:
        """SCAFFOLD: the client's c_i into ``out`` (zero before its first round); None for a
        client without training data, which takes no steps."""
        if not len(job.y):
            return None
        state = self.state.get(job.cid, job.version)
        if state is None:
            return out.zero_()
        return out.copy_(state["c"])

    def _finish(self, global_w: torch.Tensor, job: _Job, res: ClientResult,
                ci: torch.Tensor | None, final: torch.Tensor | None, acc: PartialSum) -> bool:
        """Fold a trained client into the partial sum, with the measurements its aggregator
        needs (all at the global model, except Exp-alpha's risk after training, at ``final``
        -- None: the replica holds the client's trained weights); False when the guard
        dropped its update."""
        s = self.spec
        weight = client_weight(s.aggregator, res.num_examples)
        if weight == 0:
            return True
        if not self._admissible(res.delta):
            return False
        log_scale = 0.0
        if "risks" in self.needs:
            if final is not None:
                self.model.load_(final)
            after = self._risk(self.model.flat, job.x, job.y)
            before = self._risk(global_w, job.x, job.y)
            log_scale = expalpha_log_weight(before, after, s.alpha)
        acc.add(res.delta, weight, log_scale)
        if "sensitivity" in self.needs:
            full_batch = client_batch_size(len(job.y) + len(job.held_x), s.batch_size,
                                           s.steps_per_epoch)
            sensitivity(self.model, global_w, job.held_x, batch_size=full_batch,
                        mu=s.elastic_mu, out=self._omega)
            acc.add_extra(self._omega, weight)
        elif ci is not None:
            if s.scaffold_option == 1:  # c_i+ = g_i(x), one extra pass at the global model
                full_gradient(self.model, global_w, job.x, job.y, batch_size=job.batch,
                              seed=derive_seed(job.seed, TAG_CONTROL), out=self._ci_new,
                              loss=s.loss)
            else:
                # c_i+ = c_i - c + (x - y_i) / (K lr), K = the local steps actually taken
                torch.sub(ci, self._c, out=self._ci_new)
                self._ci_new.add_(res.delta[: self.model.num_params],
                                  alpha=-1.0 / (res.steps * s.lr))
            acc.add_extra(self._ci_new)  # dc_i = c_i+ - c_i, without a temporary
            acc.add_extra(ci, -1.0)
            self.state.put(job.cid, job.round, {"c": self._ci_new})
            self._stored.append(job.cid)
        return True

    def _train_client(self, global_w: torch.Tensor, job: _Job,
                      acc: PartialSum) -> tuple[ClientResult, bool]:
        """One client's round on the replica (the sequential path)."""
        s = self.spec
        correction = None
        ci = self._load_ci(job, self._ci) if self.state is not None else None
        if ci is not None:
            correction = torch.sub(self._c, ci, out=self._corr)
        res = local_sgd(self.model, global_w, job.x, job.y, lr=s.lr, batch_size=job.batch,
                        local_epochs=s.local_epochs, local_steps=s.local_steps, seed=job.seed,
                        delta_out=self._delta, prox_mu=s.prox_mu,
                        full_batch=s.client == "fedsgd", loss=s.loss, correction=correction)
        return res, self._finish(global_w, job, res, ci, None, acc)

    def _train_group(self, global_w: torch.Tensor, jobs: list[_Job],
                     acc: PartialSum) -> list[tuple[ClientResult, bool]]:
        """A group of clients' rounds: one batched local update (fedray/vectorized.py), then
        each client folded in, in order, as on the sequential path."""
        s = self.spec
        p = self.model.num_params
        cis: list[torch.Tensor | None] = [None] * len(jobs)
        corrections = None
        if self.state is not None:
            stack = torch.zeros((len(jobs), p), device=self.device)
            cis = [self._load_ci(job, stack[k]) for k, job in enumerate(jobs)]
            corrections = self._c - stack  # a client without data takes no step
        group = vmap_local_sgd(self.model, global_w, [(j.x, j.y) for j in jobs],
                               lrs=[s.lr] * len(jobs), batch_size=[j.batch for j in jobs],
                               local_epochs=s.local_epochs, local_steps=s.local_steps,
                               seeds=[j.seed for j in jobs], prox_mu=s.prox_mu,
                               full_batch=s.client == "fedsgd", loss=s.loss,
                               corrections=corrections)
        out = []
        for k, job in enumerate(jobs):
            res = ClientResult(group.delta(k), group.num_examples[k], group.loss_sums[k],
                               group.examples_seen[k], group.steps[k])
            final = torch.add(global_w[:p], res.delta) if "risks" in self.needs else None
            out.append((res, self._finish(global_w, job, res, cis[k], final, acc)))
        return out

    def train(self, payload: dict, round_idx: int, client_ids: list[int],
              versions: list[int] | None = None) -> dict:
        """Train ``client_ids`` from the broadcast ``payload`` (the global weights and the
        aggregator's per-round state); return their one partial sum, and which clients had
        their state stored as version ``round_idx``. ``versions``: each client's current
        state version (stateful client updates only)."""
        start = time.perf_counter()
        global_w = self._load_global(payload["weights"])
        if "c" in payload:
            self._c.copy_(readonly_tensor(payload["c"]))
        acc = PartialSum(self.model.size, self.device,
                         extra_size(self.spec.aggregator, self.model.num_params))
        loss_sum, seen, examples, dropped = 0.0, 0, 0, 0
        self._stored = []
        jobs = self._jobs(round_idx, client_ids, versions)
        if self.group:
            results = (r for chunk in _chunks(jobs, group_sizes(len(client_ids), self.group))
                       for r in self._train_group(global_w, chunk, acc))
        else:
            results = (self._train_client(global_w, job, acc) for job in jobs)
        for res, kept in results:
            if not kept:  # its loss may be NaN too: the round's train_loss leaves it out
                dropped += 1
                continue
            loss_sum += res.loss_sum
            seen += res.examples_seen
            examples += res.num_examples
        out = acc.to_message()
        out.update({"clients": len(client_ids), "examples": examples, "loss_sum": loss_sum,
                    "examples_seen": seen, "dropped": dropped,
                    "updates": len(client_ids) - dropped, "stored": self._stored,
                    "busy_s": time.perf_counter() - start, "mem_mb": private_mb()})
        return out

    def evaluate_range(self, weights: np.ndarray, test: tuple[np.ndarray, np.ndarray],
                       lo: int, hi: int) -> dict:
        """Evaluation sums on rows [lo, hi) of the central test set."""
        self.model.load_(readonly_tensor(weights))
        x, y = (readonly_tensor(a[lo:hi]) for a in test)
        return evaluate(self.model.module, x, y, self.spec.eval_batch_size, self.device,
                        self.spec.loss)

    def evaluate_clients(self, weights: np.ndarray, client_ids: list[int]) -> dict:
        """Evaluation sums over the held-out data of ``client_ids``."""
        self.model.load_(readonly_tensor(weights))
        parts = []
        for cid in client_ids:
            x, y = self.cache.get(cid, "test")
            parts.append(evaluate(self.model.module, x, y, self.spec.eval_batch_size,
                                  self.device, self.spec.loss))
        return merge_sums(parts)
