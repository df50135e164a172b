"""The worker actor: one long-lived process that trains many virtual clients per round.

A worker reserves ``runtime.worker.num_cpus`` CPUs and a (possibly fractional) share of a GPU,
builds one model replica, and for each round: maps the broadcast (one object store read),
trains its assigned clients on the replica (one after another, or in vectorized groups),
folds each into one partial sum and returns that. What a client's training adds and what
it contributes come from the algorithm's parts (fedray.algorithms.base); the worker knows
no algorithm.
"""

from __future__ import annotations

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

from fedray.algorithms.base import (
    Aggregator,
    ClientContext,
    ClientWork,
    LocalTerms,
    LocalUpdate,
    PartialSum,
    UpdateStage,
    WorkerEnv,
    extra_sizes,
)
from fedray.core.evaluation import ClientEval, EvalSums, evaluate
from fedray.core.flat_model import FlatModel
from fedray.core.seeding import client_seed, personalize_seed
from fedray.core.tensors import readonly_tensor
from fedray.data.per_round import PerRound, apply_per_round
from fedray.data.source import ClientCache, ClientSource, sizes_of
from fedray.kernels.sequential import client_batch_size, local_sgd
from fedray.kernels.vectorized import group_size, group_sizes, vmap_local_sgd
from fedray.runtime.messages import Broadcast, GroupResult, RoundResult, RoundTask
from fedray.runtime.reduction_tree import reduce_results
from fedray.runtime.session import keep_freed_memory, private_mb
from fedray.state.client_state import ClientStateStore


@dataclass
class LocalTraining:
    """How every client trains, whatever the algorithm: the ``client`` section, the loss,
    and the guard on what comes back."""

    lr: float
    batch_size: int
    local_epochs: int
    local_steps: int | None
    eval_batch_size: int
    loss: str = "cross_entropy"  # see fedray.core.losses.LOSSES
    steps_per_epoch: int | None = None  # client.steps_per_epoch: batch = n / steps_per_epoch
    max_update_norm: float | None = None  # guard: drop larger updates (NaN/Inf: always)

    def batch_size_for(self, n: int) -> int:
        return client_batch_size(n, self.batch_size, self.steps_per_epoch)


@dataclass
class Personalize:
    """eval.personalize resolved: how an evaluated client fine-tunes its copy of the global
    model (lr and batch size default to the client section's)."""

    lr: float
    batch_size: int | None  # None: the client section's rule (client.batch_size, or
    #                         client.steps_per_epoch)
    epochs: int
    steps: int  # > 0: exactly this many steps, else ``epochs`` passes


@dataclass
class WorkerResources:
    """What a worker reserves and caches (``runtime.worker``)."""

    num_cpus: float
    cache_mb: int
    state_cache_mb: float = 64.0
    vectorize: bool = False  # train clients in groups (the driver's vectorize_plan decides)


@dataclass
class WorkerSpec:
    """Everything a worker needs, shipped once when the pool is created: the model and data,
    how clients train, the worker's resources, and the algorithm's two worker-side parts
    (each worker gets its own copies)."""

    make_model: Callable[[], nn.Module]
    source: ClientSource
    seed: int
    training: LocalTraining
    resources: WorkerResources
    client: ClientWork
    aggregator: Aggregator
    state_url: str | None = None  # client state store, under the run dir (when the client
    # part keeps per-client state)
    per_round: PerRound | None = None  # data.per_round: each round's client data transform
    stages: tuple[UpdateStage, ...] = ()  # algorithm.stages, in order


def keeps_client_state(client: ClientWork, stages: tuple[UpdateStage, ...]) -> bool:
    """Whether any part keeps per-client state in the client state store."""
    return bool(client.state) or any(stage.client_state for stage in stages)


def _chunks(items: Iterator, sizes: list[int]) -> Iterator[list]:
    """``items`` cut into consecutive lists of the given sizes."""
    for size in sizes:
        yield [next(items) for _ in range(size)]


class ClientWorker:
    def __init__(self, spec: WorkerSpec | None = None):
        self._prefetcher: ThreadPoolExecutor | None = None  # made by _reader, kept for life
        if spec is not None:
            self.configure(spec)

    def configure(self, spec: WorkerSpec) -> None:
        """Build the model replica, the data cache, the client state store and the parts'
        buffers for ``spec``.

        Apart from __init__ so that a worker's process can start, and import torch,
        while the driver is still starting and has no spec yet
        (fedray.runtime.pool.launch_workers)."""
        self.spec = spec
        t, res = spec.training, spec.resources
        torch.set_num_threads(max(1, int(res.num_cpus)))
        keep_freed_memory()  # per-step tensors of MBs reuse the heap, without page faults
        gpu_ids = self.assigned_gpus()
        use_cuda = bool(gpu_ids) and torch.cuda.is_available()
        self.device = torch.device("cuda" if use_cuda else "cpu")
        self.gpu_ids = [str(g) for g in gpu_ids]
        self.model = FlatModel(spec.make_model(), self.device)
        self._weights = torch.empty_like(self.model.flat)
        self._delta = torch.empty_like(self.model.flat)
        self.cache = ClientCache(spec.source, res.cache_mb * 2**20)
        self.client, self.aggregator = spec.client, spec.aggregator
        self.env = WorkerEnv(model=self.model, device=self.device, lr=t.lr, loss=t.loss,
                             eval_batch_size=t.eval_batch_size, batch_size_for=t.batch_size_for,
                             training=t, seed=spec.seed)
        self.stages = spec.stages
        for part in (self.client, self.aggregator, *self.stages):
            part.setup(self.env)
        self.extras = extra_sizes((self.client, self.aggregator, *self.stages),
                                  self.model.num_params)
        self.state = (ClientStateStore(spec.state_url, res.state_cache_mb)
                      if keeps_client_state(self.client, self.stages) else None)
        self._stored: list[int] = []  # clients whose state this round's train() wrote
        self._staleness = 0  # the current task's (buffered asynchronous training)
        self._nonfinite = 0  # this round's updates the guard dropped for NaN or Inf
        own_training = self.client.train is not None
        self.group = (group_size(self.model.num_params, self.device.type == "cuda")
                      if res.vectorize and not own_training else 0)
        self._prefetch = spec.source.cacheable or self.device.type == "cuda"
        self._pool: tuple[np.ndarray, np.ndarray] | None = None
        pr = spec.per_round
        if pr is not None and pr.resamples and pr.pool == "all":
            self._pool = self._training_pool()

    def _training_pool(self) -> tuple[np.ndarray, np.ndarray]:
        """Every client's training data, in client-id order: the pool that
        ``data.per_round.imbalance.pool: all`` draws each round's clients from. Each worker
        holds its own copy (the whole training split: meant for small data sets)."""
        src = self.spec.source
        parts = [src.client(cid) for cid in range(src.population)]
        return (np.concatenate([np.asarray(x) for x, _ in parts]),
                np.concatenate([np.asarray(y) for _, y in parts]))

    def client_data(self, round_idx: int, cid: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A client's training data for a round: its stored examples, transformed by
        ``data.per_round`` when the job sets it (fedray.data.per_round: a pure function of
        (seed, round, client_id), so the same on any worker and in any order)."""
        pr = self.spec.per_round
        if pr is None:
            return self.cache.get(cid)
        x = y = own = None
        if self._pool is None:
            x, y = (a.numpy() for a in self.cache.get(cid))
        elif pr.size is None:  # pool: all draws from the pool: only the client's size is read
            own = int(sizes_of(self.spec.source, [cid])[0])
        nx, ny, _ = apply_per_round(pr, self.spec.seed, round_idx, cid, x, y,
                                    self.spec.source.num_classes, self._pool, own)
        return (readonly_tensor(np.ascontiguousarray(nx)),
                readonly_tensor(np.ascontiguousarray(ny)))

    def assigned_gpus(self) -> list:
        """The GPUs Ray gave this worker; outside Ray, none: the CPU."""
        import ray

        return ray.get_gpu_ids() if ray.is_initialized() else []

    def info(self) -> dict:
        import ray

        node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
        return {"pid": os.getpid(), "gpu_ids": self.gpu_ids, "device": str(self.device),
                "node_id": node, "threads": torch.get_num_threads()}

    def _admissible(self, delta: torch.Tensor) -> bool:
        """The guard: a non-finite update, or one above guard.max_update_norm, must never
        reach the global model (nor a client's stored state)."""
        norm = float(torch.linalg.vector_norm(delta))  # NaN or Inf if any entry is
        bound = self.spec.training.max_update_norm
        if not math.isfinite(norm):  # counted apart: a round of only these has diverged
            self._nonfinite += 1
            return False
        return bound is None or norm <= bound

    def _prepare(self, round_idx: int, cid: int, version: int) -> ClientContext:
        """A client's round before its local update: its seed, data and batch size, and
        whatever the aggregator prepares (examples it holds out, say). Runs on the prefetch
        thread: it must not touch the replica."""
        seed = client_seed(self.spec.seed, round_idx, cid)
        x, y = self.client_data(round_idx, cid)
        ctx = ClientContext(cid, round_idx, seed, x, y, self.env.batch_size_for(len(y)),
                            version, staleness=self._staleness)
        self.aggregator.prepare(self.env, ctx)
        if self.device.type == "cuda":  # page-locked: the copy to the GPU runs asynchronously
            ctx.x, ctx.y = ctx.x.pin_memory(), ctx.y.pin_memory()
        return ctx

    def _jobs(self, round_idx: int, client_ids: list[int],
              versions: list[int] | None) -> Iterator[ClientContext]:
        """The clients' prepared rounds, in order. Where reading a client costs something (a
        store's shards, generated data) or a GPU waits for it, the next client is read on a
        background thread while the current one trains."""
        args = [(round_idx, cid, versions[i] if versions else 0)
                for i, cid in enumerate(client_ids)]
        if not self._prefetch:
            yield from (self._prepare(*a) for a in args)
            return
        pool = self._reader()
        ahead = deque(pool.submit(self._prepare, *a) for a in args[:2])
        try:
            for a in args[2:]:
                yield ahead.popleft().result()
                ahead.append(pool.submit(self._prepare, *a))
            while ahead:
                yield ahead.popleft().result()
        finally:  # a round that failed part-way reads no further client
            for future in ahead:
                future.cancel()

    def _reader(self) -> ThreadPoolExecutor:
        """The one prefetch thread of this worker's life. With a thread started anew each
        round, a Ray worker's memory grew round after round to several times its data cache,
        and did not with glibc held to one malloc arena: each new thread's arena kept up to
        keep_freed_memory's trim threshold of freed client data (docs/performance.md,
        "Worker memory")."""
        if self._prefetcher is None:
            self._prefetcher = ThreadPoolExecutor(1, thread_name_prefix="fedray-prefetch")
        return self._prefetcher

    def _terms(self, ctx: ClientContext) -> LocalTerms:
        """The client's state as of the round (a client without training data takes no
        steps and needs none), then its local objective's terms."""
        if self.state is not None and len(ctx.y):
            ctx.state = self.state.get(ctx.cid, ctx.version)
        ctx.terms = self.client.terms(self.env, ctx)
        return ctx.terms

    def _finish(self, ctx: ClientContext, update: LocalUpdate, acc: PartialSum) -> bool:
        """Fold a trained client into the partial sum (the aggregator's contribution, then
        the client part's, which may return its new state); False when the guard dropped
        its update. A client without examples counts for nothing."""
        if update.num_examples == 0:
            return True
        if not self._admissible(update.delta):
            return False
        new: dict[str, torch.Tensor] = {}
        for stage in self.stages:  # on the way up: clip, add noise, compress, encode
            new |= stage.client_update(self.env, ctx, update, acc) or {}
            update.in_replica = False  # the delta may no longer be the replica's
        self._contribute(ctx, update, acc)
        new |= self.client.finish(self.env, ctx, update, acc) or {}
        if new and self.state is not None:  # a part that wrote nothing keeps its tensors
            self.state.put(ctx.cid, ctx.round, (ctx.state or {}) | new)
            self._stored.append(ctx.cid)
        return True

    def _contribute(self, ctx: ClientContext, update: LocalUpdate, acc: PartialSum) -> None:
        """The client's update into the round's result: the aggregator's contribution to
        the partial sum."""
        self.aggregator.accumulate(self.env, ctx, update, acc)

    def _train_client(self, ctx: ClientContext, acc: PartialSum,
                      terms_ready: bool = False) -> tuple[LocalUpdate, bool]:
        """One client's round on the replica (the sequential path): the client part's own
        ``train`` if it has one, else the sequential kernel with its terms."""
        t = self.spec.training
        if not terms_ready:
            self._terms(ctx)
        if self.client.train is not None:
            update = self.client.train(self.env, ctx)
        else:
            update = local_sgd(self.model, self.env.global_weights, ctx.x, ctx.y, lr=t.lr,
                               batch_size=ctx.batch_size, local_epochs=t.local_epochs,
                               local_steps=t.local_steps, seed=ctx.seed,
                               delta_out=self._delta, terms=ctx.terms,
                               full_batch=self.client.full_batch, loss=t.loss)
            update.in_replica = True  # the kernel trains in the replica
        if update.in_replica:
            update.replica_mark = self.model.loads
        return update, self._finish(ctx, update, acc)

    def _train_group(self, ctxs: list[ClientContext],
                     acc: PartialSum) -> list[tuple[LocalUpdate, bool]]:
        """A group of clients' rounds: one batched local update (fedray/kernels/vectorized.py), then
        each client folded in, in order, as on the sequential path. Clients whose terms
        differ in their proximal weight cannot share a batched step: they train one after
        another."""
        t = self.spec.training
        terms = [self._terms(ctx) for ctx in ctxs]
        if len({tm.proximal for tm in terms}) > 1:
            return [self._train_client(ctx, acc, terms_ready=True) for ctx in ctxs]
        linear = None
        if any(tm.linear is not None for tm in terms):
            linear = torch.zeros((len(ctxs), self.model.num_params), device=self.device)
            for k, tm in enumerate(terms):
                if tm.linear is not None:
                    linear[k] = tm.linear
        group = vmap_local_sgd(self.model, self.env.global_weights,
                               [(c.x, c.y) for c in ctxs], lrs=[t.lr] * len(ctxs),
                               batch_size=[c.batch_size for c in ctxs],
                               local_epochs=t.local_epochs, local_steps=t.local_steps,
                               seeds=[c.seed for c in ctxs],
                               terms=LocalTerms(proximal=terms[0].proximal, linear=linear),
                               full_batch=self.client.full_batch, loss=t.loss)
        out = []
        for k, ctx in enumerate(ctxs):
            update = LocalUpdate(group.delta(k), group.num_examples[k], group.loss_sums[k],
                                 group.examples_seen[k], group.steps[k])
            out.append((update, self._finish(ctx, update, acc)))
        return out

    def train(self, broadcast: Broadcast, task: RoundTask) -> RoundResult:
        """Train the task's clients from its broadcast (the global weights and the
        aggregator's per-round state); return their one partial sum, and which clients had
        their state stored as version ``task.round``."""
        start = time.perf_counter()
        self._weights.copy_(readonly_tensor(broadcast.weights))
        self.env.global_weights = self._weights
        self.env.broadcast = {k: readonly_tensor(v).to(self.device)
                              for k, v in broadcast.server.items()}
        acc = PartialSum(self.model.size, self.device, self.extras)
        loss_sum, seen, examples, dropped = 0.0, 0, 0, 0
        self._stored = []
        self._nonfinite = 0
        ids = task.client_ids
        self._staleness = task.staleness
        jobs = self._jobs(task.round, ids, task.versions)
        if self.group:
            results = (r for chunk in _chunks(jobs, group_sizes(len(ids), self.group))
                       for r in self._train_group(chunk, acc))
        else:
            results = (self._train_client(ctx, acc) for ctx in jobs)
        for res, kept in results:
            if not kept:  # its loss may be NaN too: the round's train_loss leaves it out
                dropped += 1
                continue
            loss_sum += res.loss_sum
            seen += res.examples_seen
            examples += res.num_examples
        return RoundResult(partial=acc.to_message(), clients=len(ids), examples=examples,
                           loss_sum=loss_sum, examples_seen=seen, dropped=dropped,
                           updates=len(ids) - dropped, nonfinite=self._nonfinite,
                           stored=self._stored,
                           busy_s=time.perf_counter() - start, mem_mb=private_mb())

    def reduce(self, *results: RoundResult) -> GroupResult:
        """runtime.reduce.where=workers: the round's results of a group of slots, this
        worker's first, as one (fedray.runtime.reduction_tree). Ray hands them over as this
        task's arguments, read from this node's object store without a copy where they were
        made on this node, so the driver receives one partial sum for the group."""
        return reduce_results(results)

    def evaluate_range(self, weights: np.ndarray, test: tuple[np.ndarray, np.ndarray],
                       lo: int, hi: int) -> EvalSums:
        """Evaluation sums on rows [lo, hi) of the central test set."""
        self.model.load_(readonly_tensor(weights))
        x, y = (readonly_tensor(a[lo:hi]) for a in test)
        t = self.spec.training
        return evaluate(self.model.module, x, y, t.eval_batch_size, self.device, t.loss)

    def evaluate_clients(self, weights: np.ndarray, client_ids: list[int], round_idx: int = 0,
                         personalize: Personalize | None = None) -> list[ClientEval]:
        """One row of evaluation sums per client of ``client_ids``, on its held-out data:
        the global model's, and with ``personalize`` also those of a copy fine-tuned on the
        client's train split (local SGD from the client's personalization seed for
        ``round_idx``). The copy lives in the replica, which is reloaded with the global
        weights for every client; nothing a later round reads is changed."""
        t = self.spec.training
        self._weights.copy_(readonly_tensor(weights))
        rows = []
        for cid in client_ids:
            self.model.load_(self._weights)
            x, y = self.cache.get(cid, "test")
            row = ClientEval(cid, evaluate(self.model.module, x, y, t.eval_batch_size,
                                           self.device, t.loss))
            if personalize is not None:
                tx, ty = self.cache.get(cid)
                if len(ty):
                    local_sgd(self.model, self._weights, tx, ty, lr=personalize.lr,
                              batch_size=personalize.batch_size or t.batch_size_for(len(ty)),
                              local_epochs=personalize.epochs,
                              local_steps=personalize.steps or None,
                              seed=personalize_seed(self.spec.seed, round_idx, cid),
                              delta_out=self._delta, loss=t.loss)
                row.personalized = evaluate(self.model.module, x, y, t.eval_batch_size,
                                            self.device, t.loss)
            rows.append(row)
        return rows
