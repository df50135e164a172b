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
    START,
    Aggregator,
    ClientContext,
    ClientWork,
    LocalTerms,
    LocalUpdate,
    PartialSum,
    Phase,
    UpdateStage,
    WorkerEnv,
    evaluates_own_model,
    extra_sizes,
)
from fedray.core.evaluation import ClientEval, EvalSums, evaluate
from fedray.core.flat_model import FlatModel
from fedray.core.seeding import TAG_ADAPT, TAG_PHASE, client_seed, derive_seed, personalize_seed
from fedray.core.tensors import readonly_tensor, reused_rows
from fedray.data.client_source import ClientCache, ClientSource, sizes_of
from fedray.data.transforms.per_client import PerClient, shift_inputs
from fedray.data.transforms.per_round import COLUMNS as PER_ROUND_COLUMNS
from fedray.data.transforms.per_round import PerRound, apply_per_round
from fedray.errors import PartError
from fedray.kernels.sequential import client_batch_size, local_sgd
from fedray.kernels.vectorized import group_size, group_sizes, vmap_local_sgd
from fedray.runtime.adversary import Adversary
from fedray.runtime.messages import (
    Broadcast,
    ClientUpdates,
    GroupResult,
    RoundResult,
    RoundTask,
)
from fedray.runtime.part_errors import (
    PartNames,
    check_delta,
    check_local_update,
    names_part_errors,
)
from fedray.runtime.participation import row_columns
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
    precision: str = "fp32"  # runtime.precision: fp32, or bf16 autocast (kernels/precision.py)

    def batch_size_for(self, n: int) -> int:
        return client_batch_size(n, self.batch_size, self.steps_per_epoch)

    def passes(self, steps: int | None = None,
               epochs: int | None = None) -> tuple[int, int | None]:
        """(local epochs, local steps) for a stretch of training that may set its own
        ``steps`` or ``epochs`` (a Phase, a part's own loop); the section's where neither."""
        if steps is not None:
            return 1, steps
        if epochs is not None:
            return epochs, None
        return self.local_epochs, self.local_steps


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
    state_pack_mb: float = 8.0  # 0: a file per client (ClientStateStore.begin_packs)
    state_half: bool = False  # float32 state stored as float16 (runtime.worker.state_dtype)
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
    per_client: PerClient | None = None  # data.per_client: each client's fixed input shift
    stages: tuple[UpdateStage, ...] = ()  # algorithm.stages, in order
    # the job's names of the client part, the aggregator and the stages, in that order
    # (registered names or import paths): what an error from one of them says
    labels: tuple[str, ...] = ()
    adversary: Adversary | None = None  # the job's malicious clients and their attacks
    # report each aggregated client's loss, examples and part columns (RoundResult.arrived):
    # for a selector that learns from them, and the participants table
    client_rows: bool = False


def keeps_client_state(client: ClientWork, stages: tuple[UpdateStage, ...]) -> bool:
    """Whether any part keeps per-client state in the client state store (a client part's
    ``local`` parameters live there too, under "local")."""
    return (bool(client.state) or bool(client.local)
            or any(stage.client_state for stage in stages))


def _plain(phases: list[Phase]) -> bool:
    """One phase that says nothing but its terms: the single-phase training every client
    part had before phases, which must keep running the same float operations (every
    preset's final weights are pinned), so it takes the old call unchanged."""
    if len(phases) != 1:
        return False
    ph = phases[0]
    return (isinstance(ph.start, str) and ph.start == "global" and ph.trainable is None
            and ph.steps is None and ph.epochs is None and ph.lr is None
            and ph.transform is None and ph.send and ph.keep is None
            and (ph.optimizer is None or ph.optimizer.kind == "sgd"))


def _same_shape(a: Phase, b: Phase) -> bool:
    """Whether two clients' phases can share one batched call: equal in everything but the
    start point, the optimizer's stored tensors and the linear term (per client rows)."""
    return (a.trainable == b.trainable and a.steps == b.steps and a.epochs == b.epochs
            and a.lr == b.lr and a.optimizer == b.optimizer and a.transform == b.transform
            and a.send == b.send and a.keep == b.keep
            and a.terms.proximal == b.terms.proximal
            and (isinstance(a.start, str) and a.start == "previous")
            == (isinstance(b.start, str) and b.start == "previous"))


class _Rows:
    """A round's kept clients' updates on a worker, for an individual aggregator: one
    preallocated float32 row per client of the task (the most it can keep), filled in the
    worker's client order; a dropped client takes no row. ``buffer``: the last round's
    rows, written over if it has room (``reused_rows``); the rows leave in the round's
    result (Ray copies them out; the inline backend's driver copies them before the next
    round)."""

    def __init__(self, clients: int, size: int, buffer: np.ndarray | None = None):
        self.updates, self.buffer = reused_rows(
            buffer, clients, size, lambda n, d: np.empty((n, d), np.float32))
        self.ids = np.empty(clients, np.int64)
        self.num_examples = np.empty(clients, np.int64)
        self.losses = np.empty(clients, np.float64)
        self.n = 0

    def add(self, cid: int, update: LocalUpdate) -> None:
        i, n = self.n, update.delta.numel()
        row = torch.from_numpy(self.updates[i])
        row[:n].copy_(update.delta)  # from the GPU too
        row[n:].zero_()  # a part's own train() may leave the buffers out
        self.ids[i], self.num_examples[i] = cid, update.num_examples
        self.losses[i] = (update.loss_sum / update.examples_seen if update.examples_seen
                          else math.nan)
        self.n += 1

    def message(self) -> ClientUpdates:
        n = self.n
        return ClientUpdates(self.updates[:n], self.ids[:n], self.num_examples[:n],
                             self.losses[:n])


def _parts(worker: ClientWorker) -> PartNames | None:
    """A worker's parts as errors name them (fedray.runtime.part_errors); None before it
    has a spec."""
    spec = getattr(worker, "spec", None)
    if spec is None:
        return None
    return PartNames.of(spec.client, spec.aggregator, spec.stages,
                        getattr(spec, "labels", ()))


def _chunks(items: Iterator, sizes: list[int]) -> Iterator[list]:
    """``items`` cut into consecutive lists of the given sizes."""
    for size in sizes:
        yield [next(items) for _ in range(size)]


class ClientWorker:
    def __init__(self, spec: WorkerSpec | None = None):
        self._prefetcher: ThreadPoolExecutor | None = None  # made by _reader, kept for life
        if spec is not None:
            self.configure(spec)

    @names_part_errors(_parts)
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
                             training=t, seed=spec.seed, client_split=self.client_split)
        self.stages = spec.stages
        for part in (self.client, self.aggregator, *self.stages):
            part.setup(self.env)
        self.extras = extra_sizes((self.client, self.aggregator, *self.stages),
                                  self.model.num_params)
        self.state = (ClientStateStore(spec.state_url, res.state_cache_mb, res.state_half)
                      if keeps_client_state(self.client, self.stages) else None)
        # a client part's ``local`` parameters (and buffers): their flat positions, and the
        # state keys the client part may write (_phases, _finish)
        self._local_at = (self.model.positions(self.client.local) if self.client.local
                          else None)
        self._local_n = 0 if self._local_at is None else self._local_at.numel()
        if self._local_at is not None and not self._local_n:
            names = ", ".join(name for name, _, _ in self.model.spans)
            raise PartError(f"{_parts(self).who(self.client)}: local {self.client.local} "
                            f"names no parameter or buffer of the model (its names: "
                            f"{names})")
        if self._local_n and int(self._local_at[-1] - self._local_at[0]) + 1 == self._local_n:
            # one span (a head, the last layers): a slice reads and writes views, where an
            # index tensor gathers and scatters, per client
            first = int(self._local_at[0])
            self._local_at = slice(first, first + self._local_n)
        self._writable = set(self.client.state) | ({"local"} if self.client.local else set())
        self._trainable: dict[tuple[str, ...], list[bool]] = {}  # Phase.trainable's flags
        self._stored: list[int] = []  # clients whose state this round's train() wrote
        self._pack_of: dict[int, int] = {}  # the pack of each task client's current state
        self._staleness = 0  # the current task's (buffered asynchronous training)
        self._ranks: dict[int, tuple[int, int]] = {}  # the current task's (RoundTask.ranks)
        # the per-client values a client's report carries (the participants table's)
        self.row_columns = row_columns(self.client, self.aggregator, spec.per_round)
        self._nonfinite = 0  # this round's updates the guard dropped for NaN or Inf
        self._flagged: list[int] = []  # this round's clients the guard or a stage defended
        # against (dropped, clipped): the run's defense metrics, with an adversary
        adv = spec.adversary
        self._data_attacks = adv.data_attacks if adv is not None else ()
        self._update_attacks = adv.update_attacks if adv is not None else ()
        self._rows: _Rows | None = None  # this round's updates (Aggregator.individual)
        # this round's aggregated clients: (id, mean train loss, examples, part columns),
        # when the run reports them per client (WorkerSpec.client_rows)
        self._arrived: list[tuple[int, float, int, dict]] | None = None
        self._row_buffer: np.ndarray | None = None  # their memory, kept across rounds
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

    def client_split(self, cid: int, split: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
        """A client's stored examples of ``split`` as the client holds them: shifted into its
        domain by ``data.per_client`` when the job sets it (fedray.data.transforms.per_client:
        a pure function of (seed, client_id) and the data, the same in every round and for both
        splits, so a client is evaluated in the domain it trains in)."""
        x, y = self.cache.get(cid, split)
        pc = self.spec.per_client
        if pc is None or not len(y):
            return x, y
        return readonly_tensor(shift_inputs(pc, self.spec.seed, cid, split, x.numpy())), y

    def client_data(self, round_idx: int, cid: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A client's training data for a round: its stored examples (``client_split``),
        transformed by ``data.per_round`` when the job sets it
        (fedray.data.transforms.per_round: a pure function of (seed, round, client_id), so the
        same on any worker and in any order)."""
        return self._round_data(round_idx, cid)[:2]

    def _round_data(self, round_idx: int, cid: int
                    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """``client_data`` and what ``data.per_round`` drew for the client (its ratio, whether
        it is flipped), as the round's participants table records it."""
        pr = self.spec.per_round
        if pr is None:
            return (*self.client_split(cid), {})
        x = y = own = None
        if self._pool is None:
            x, y = (a.numpy() for a in self.client_split(cid))
        elif pr.size is None:  # pool: all draws from the pool: only the client's size is read
            own = int(sizes_of(self.spec.source, [cid])[0])
        rank = self._ranks.get(cid) if pr.ranked else None
        nx, ny, info = apply_per_round(pr, self.spec.seed, round_idx, cid, x, y,
                                       self.spec.source.num_classes, self._pool, own, rank)
        return (readonly_tensor(np.ascontiguousarray(nx)),
                readonly_tensor(np.ascontiguousarray(ny)),
                {PER_ROUND_COLUMNS[k]: float(v) for k, v in info.items()})

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

    def _prepare(self, round_idx: int, cid: int, version: int, pack: int = -1
                 ) -> ClientContext:
        """A client's round before its local update: its seed, data and batch size, and
        whatever the aggregator prepares (examples it holds out, say). Runs on the prefetch
        thread: it must not touch the replica."""
        seed = client_seed(self.spec.seed, round_idx, cid)
        x, y, drawn = self._round_data(round_idx, cid)
        ctx = ClientContext(cid, round_idx, seed, x, y, self.env.batch_size_for(len(y)),
                            version, staleness=self._staleness)
        ctx.columns.update(drawn)  # data.per_round's draws, for the participants table
        if self._data_attacks and len(y) and self.spec.adversary.is_malicious(cid):
            for attack in self._data_attacks:  # a malicious client's data, as it trains on it
                attack.poison_data(self.env, ctx)
                if len(ctx.y) != len(y) or len(ctx.x) != len(ctx.y):
                    raise PartError(f"{self.spec.adversary.label(attack)}: poison_data() "
                                    f"changed the client's {len(y)} examples into "
                                    f"{len(ctx.x)} inputs and {len(ctx.y)} labels; keep "
                                    "their number")
        self.aggregator.prepare(self.env, ctx)
        if self.state is not None and len(ctx.y):  # read ahead with the data: a stateful
            # client's file is read while the clients before it train
            ctx.state = self.state.get(cid, version, pack)
        if self.device.type == "cuda":  # page-locked: the copy to the GPU runs asynchronously
            ctx.x, ctx.y = ctx.x.pin_memory(), ctx.y.pin_memory()
        return ctx

    def _jobs(self, round_idx: int, client_ids: list[int], versions: list[int] | None,
              packs: list[int] | None = None) -> Iterator[ClientContext]:
        """The clients' prepared rounds, in order. Where reading a client costs something (a
        store's shards, generated data) or a GPU waits for it, the next client is read on a
        background thread while the current one trains."""
        args = [(round_idx, cid, versions[i] if versions else 0, packs[i] if packs else -1)
                for i, cid in enumerate(client_ids)]
        self._pack_of = dict(zip(client_ids, packs or [], strict=False))
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

    def _refuse(self, what: str) -> PartError:
        return PartError(f"{_parts(self).who(self.client)}: {what}")

    def _undeclared(self, key: str, where: str) -> PartError:
        return self._refuse(f"{where} writes the state key {key!r}, which its state "
                            f"{tuple(self.client.state)} does not declare (list it there)")

    def _phases(self, ctx: ClientContext) -> list[Phase]:
        """The client's state as of the round (a client without training data takes no
        steps and needs none), then its phases (``ClientWork.phases``; by default one with
        its ``terms``), checked: one sends, and every key they write is declared.
        ``ctx.terms`` is the sending phase's."""
        if self.state is not None and len(ctx.y) and ctx.state is None:  # not read ahead
            ctx.state = self.state.get(ctx.cid, ctx.version, self._pack_of.get(ctx.cid, -1))
        phases = self.client.phases(self.env, ctx)
        if not isinstance(phases, (list, tuple)) or not phases \
                or not all(isinstance(ph, Phase) for ph in phases):
            raise self._refuse(f"phases() must return a non-empty list of Phase, got "
                               f"{type(phases).__name__}")
        sends = [i for i, ph in enumerate(phases) if ph.send]
        if len(sends) != 1:
            raise self._refuse(f"exactly one phase must send (Phase.send), {len(sends)} "
                               f"of its {len(phases)} do")
        for i, ph in enumerate(phases):
            if ph.keep is not None and ph.keep not in self._writable:
                raise self._undeclared(ph.keep, f"phase {i}'s keep")
            if ph.optimizer is not None:
                for key in ph.optimizer.state_keys():
                    if key not in self._writable:
                        raise self._undeclared(key, f"phase {i}'s optimizer")
            if isinstance(ph.start, str):
                if ph.start not in START or (i == 0 and ph.start == "previous"):
                    raise self._refuse(f"phase {i}'s start must be "
                                       f"{' or '.join(START[: 1 + (i > 0)])} or a tensor, "
                                       f"got {ph.start!r}")
            elif not isinstance(ph.start, torch.Tensor) \
                    or ph.start.numel() != self.model.size:
                got = (f"{ph.start.numel()} values" if isinstance(ph.start, torch.Tensor)
                       else type(ph.start).__name__)
                raise self._refuse(f"phase {i}'s start has {got}, not the model's "
                                   f"{self.model.size}")
        ctx.terms = phases[sends[0]].terms
        return list(phases)

    def _finish(self, ctx: ClientContext, update: LocalUpdate, acc: PartialSum,
                kept: dict[str, torch.Tensor] | None = None) -> bool:
        """Fold a trained client into the partial sum (the aggregator's contribution, then
        the client part's, which may return its new state); False when the guard dropped
        its update. A client without examples counts for nothing. ``kept``: what its phases
        store (personal models, optimizer tensors, its ``local`` parameters), written only
        with the rest, so a dropped update leaves the client's state as it was."""
        if update.num_examples == 0:
            return True
        if self._update_attacks and self.spec.adversary.is_malicious(ctx.cid):
            for attack in self._update_attacks:  # what a malicious client sends instead
                attack.poison_update(self.env, ctx, update)
                check_delta(lambda attack=attack: self.spec.adversary.label(attack),
                            "poison_update()", update.delta, self.model.flat)
            update.in_replica = False
        if not self._admissible(update.delta):
            if self.spec.adversary is not None:
                self._flagged.append(ctx.cid)
            return False
        new: dict[str, torch.Tensor] = {}
        for stage in self.stages:  # on the way up: clip, add noise, compress, encode
            own = stage.client_update(self.env, ctx, update, acc) or {}
            check_delta(lambda stage=stage: _parts(self).who(stage), "client_update()",
                        update.delta, self.model.flat)
            for key in own:
                if key not in stage.client_state:
                    raise PartError(f"{_parts(self).who(stage)}: client_update() writes the "
                                    f"state key {key!r}, which its client_state "
                                    f"{tuple(stage.client_state)} does not declare")
            new |= own
            update.in_replica = False  # the delta may no longer be the replica's
        if update.flagged and self.spec.adversary is not None:
            self._flagged.append(ctx.cid)
        self._contribute(ctx, update, acc)
        if self._arrived is not None:  # what the selector and the participants table read
            self._arrived.append((ctx.cid, update.loss_sum / max(update.examples_seen, 1),
                                  update.num_examples, ctx.columns))
        new |= kept or {}
        own = self.client.finish(self.env, ctx, update, acc) or {}
        for key in own:  # stored silently before: a typo'd key never read back
            if key not in self._writable:
                raise self._undeclared(key, "finish()")
        new |= own
        if new and self.state is not None:  # a part that wrote nothing keeps its tensors
            self.state.put_async(ctx.cid, ctx.round, (ctx.state or {}) | new)
            self._stored.append(ctx.cid)
        return True

    def _contribute(self, ctx: ClientContext, update: LocalUpdate, acc: PartialSum) -> None:
        """The client's update into the round's result: the aggregator's contribution to
        the partial sum, or, for an aggregator that needs every client's update
        (``individual``), a row of this round's updates, which the driver hands to its
        ``aggregate`` (the parts' extras still go into ``acc``)."""
        if self._rows is None:
            self.aggregator.accumulate(self.env, ctx, update, acc)
        else:
            self._rows.add(ctx.cid, update)

    def _train_client(self, ctx: ClientContext, acc: PartialSum,
                      phases: list[Phase] | None = None) -> tuple[LocalUpdate, bool]:
        """One client's round on the replica (the sequential path): the client part's own
        ``train`` if it has one, else the sequential kernel, once per phase (``phases``:
        already made by ``_phases``)."""
        t = self.spec.training
        if phases is None:
            phases = self._phases(ctx)
        kept = None
        if self.client.train is not None:
            # a custom loop's torch draws (dropout, its own shuffles) then derive from the
            # client's seed, as the kernels' do, whatever worker trains it and after whom
            torch.manual_seed(ctx.seed)
            update = self.client.train(self.env, ctx)
            check_local_update(lambda: _parts(self).who(self.client), update, self.model.flat)
        elif not _plain(phases) or self._local_at is not None:
            update, kept = self._run_phases(ctx, phases)
        else:
            update = local_sgd(self.model, self.env.global_weights, ctx.x, ctx.y, lr=t.lr,
                               batch_size=ctx.batch_size, local_epochs=t.local_epochs,
                               local_steps=t.local_steps, seed=ctx.seed,
                               delta_out=self._delta, terms=ctx.terms,
                               full_batch=self.client.full_batch, loss=t.loss,
                               precision=t.precision)
            update.in_replica = True  # the kernel trains in the replica
        if update.in_replica:
            update.replica_mark = self.model.loads
        return update, self._finish(ctx, update, acc, kept)

    def _phase_seed(self, ctx: ClientContext, i: int) -> int:
        """Phase 0 trains from the client's round seed (as a single phase always has), a
        later phase from its own stream, so two phases never share batches or masks."""
        return ctx.seed if i == 0 else derive_seed(ctx.seed, TAG_PHASE, i)

    def _flags(self, prefixes: tuple[str, ...] | None) -> list[bool] | None:
        if prefixes is None:
            return None
        key = tuple(prefixes)
        if key not in self._trainable:
            self._trainable[key] = self.model.trainable(key)
        return self._trainable[key]

    def _global_start(self, ctx: ClientContext) -> torch.Tensor | None:
        """A "global" start: the broadcast model with the client's own ``local`` values
        (None: the broadcast model as it is -- no local parameters, or none stored yet)."""
        return self._with_local(self.env.global_weights, ctx.cid, ctx.state)

    def _with_local(self, weights: torch.Tensor, cid: int,
                    state: dict[str, torch.Tensor] | None) -> torch.Tensor | None:
        """``weights`` (a copy) with client ``cid``'s stored ``local`` values in place of
        theirs: where a "global" phase starts, and the model it is evaluated with. None
        when there is nothing to put in (no local parameters, or none stored yet)."""
        local = self._local_values(cid, state)
        if local is None:
            return None
        out = weights.clone()
        out[self._local_at] = local
        return out

    def _local_values(self, cid: int,
                      state: dict[str, torch.Tensor] | None) -> torch.Tensor | None:
        """Client ``cid``'s stored ``local`` values (flat, on the device), checked against
        the part's local positions; None without local parameters or before it has any."""
        if self._local_at is None or not state or "local" not in state:
            return None
        local = state["local"].reshape(-1)
        if local.numel() != self._local_n:
            raise self._refuse(f"client {cid}'s stored \"local\" has {local.numel()} "
                               f"values for the {self._local_n} of its local "
                               f"parameters {self.client.local}")
        return local.to(self.device, torch.float32)

    def _group_starts(self, mine: list[Phase],
                      ctxs: list[ClientContext]) -> torch.Tensor | None:
        """A group's starts for a phase that does not continue the previous one: [G, size],
        row k client k's (its tensor, or the broadcast model with its stored ``local``
        values); None when every client starts from the broadcast model as it is. Written
        into one stack, without a model-sized copy per client."""
        rows: dict[int, tuple[bool, torch.Tensor]] = {}
        for k, (q, ctx) in enumerate(zip(mine, ctxs, strict=True)):
            if isinstance(q.start, torch.Tensor):
                rows[k] = (True, q.start.reshape(-1).to(self.device, torch.float32))
            else:
                local = self._local_values(ctx.cid, ctx.state)
                if local is not None:
                    rows[k] = (False, local)
        if not rows:
            return None
        g = self.env.global_weights
        starts = g.expand(len(ctxs), -1).clone()
        for k, (whole, values) in rows.items():
            if whole:
                starts[k] = values
            else:
                starts[k, self._local_at] = values
        return starts

    def _opt_in(self, ph: Phase, ctx: ClientContext,
                kept: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
        """A phase's optimizer tensors to start from: those an earlier phase of this round
        left under its keys, else the client's stored ones; None (zeros) without any."""
        if ph.optimizer is None or not ph.optimizer.state_keys():
            return None
        out = {}
        for key in ph.optimizer.state_keys():
            have = kept.get(key)
            if have is None and ctx.state:
                have = ctx.state.get(key)
            if have is not None:
                out[key.rsplit(".", 1)[1]] = have
        return out or None

    def _phase_steps(self, ph: Phase) -> tuple[float, int, int | None]:
        """A phase's lr, local epochs and local steps (the client section's where unset)."""
        t = self.spec.training
        return (t.lr if ph.lr is None else ph.lr, *t.passes(ph.steps, ph.epochs))

    def _run_phases(self, ctx: ClientContext,
                    phases: list[Phase]) -> tuple[LocalUpdate, dict[str, torch.Tensor]]:
        """A client's phases on the replica, one sequential-kernel call each: the sending
        phase's update (its ``local`` positions zeroed: never averaged) and what the phases
        keep in the client's state."""
        t = self.spec.training
        g = self.env.global_weights
        kept: dict[str, torch.Tensor] = {}
        sent: LocalUpdate | None = None
        last = len(phases) - 1
        for i, ph in enumerate(phases):
            if isinstance(ph.start, torch.Tensor):
                start = ph.start.reshape(-1).to(self.device, torch.float32)
            elif ph.start == "previous":
                start = self.model.flat.clone()  # where the previous phase left the replica
            else:
                start = self._global_start(ctx)
            lr, epochs, steps = self._phase_steps(ph)
            out = self._delta if i == last else torch.empty_like(self._delta)
            update = local_sgd(self.model, g, ctx.x, ctx.y, lr=lr, batch_size=ctx.batch_size,
                               local_epochs=epochs, local_steps=steps,
                               seed=self._phase_seed(ctx, i), delta_out=out, terms=ph.terms,
                               full_batch=self.client.full_batch, loss=t.loss, start=start,
                               trainable=self._flags(ph.trainable), optimizer=ph.optimizer,
                               opt_state=self._opt_in(ph, ctx, kept), transform=ph.transform,
                               precision=t.precision)
            if ph.keep is not None:
                kept[ph.keep] = self.model.flat.clone()
            if update.opt_state is not None and ph.optimizer is not None:
                for key in ph.optimizer.state_keys():
                    kept[key] = update.opt_state[key.rsplit(".", 1)[1]]
            if ph.send:
                sent = update
        if self._local_at is not None:
            kept["local"] = self.model.flat[self._local_at].clone()
            sent.delta[self._local_at] = 0.0
        # the replica holds the sent weights only if the sending phase came last and
        # nothing was zeroed (WorkerEnv.trained_weights rebuilds them otherwise)
        sent.in_replica = sent is update and self._local_at is None
        return sent, kept

    def _train_group(self, ctxs: list[ClientContext],
                     acc: PartialSum) -> list[tuple[LocalUpdate, bool]]:
        """A group of clients' rounds: one batched local update (fedray/kernels/vectorized.py), then
        each client folded in, in order, as on the sequential path. Clients whose terms
        differ in their proximal weight cannot share a batched step: they train one after
        another; so do clients whose phases differ in more than their start, stored
        optimizer tensors and linear terms (``_same_shape``)."""
        t = self.spec.training
        phases = [self._phases(ctx) for ctx in ctxs]
        if self._local_at is not None or not all(_plain(ph) for ph in phases):
            if all(len(ph) == len(phases[0]) and all(map(_same_shape, ph, phases[0]))
                   for ph in phases):
                return self._group_phases(ctxs, phases, acc)
            return [self._train_client(ctx, acc, ph) for ctx, ph in zip(ctxs, phases,
                                                                         strict=True)]
        terms = [ctx.terms for ctx in ctxs]
        if len({tm.proximal for tm in terms}) > 1:
            return [self._train_client(ctx, acc, ph) for ctx, ph in zip(ctxs, phases,
                                                                         strict=True)]
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
                               full_batch=self.client.full_batch, loss=t.loss,
                               precision=t.precision)
        out = []
        for k, ctx in enumerate(ctxs):
            update = LocalUpdate(group.delta(k), group.num_examples[k], group.loss_sums[k],
                                 group.examples_seen[k], group.steps[k])
            out.append((update, self._finish(ctx, update, acc)))
        return out

    def _group_phases(self, ctxs: list[ClientContext], phases: list[list[Phase]],
                      acc: PartialSum) -> list[tuple[LocalUpdate, bool]]:
        """A group's phases, each one batched call for all its clients (their phases agree
        but for start, stored optimizer tensors and linear terms), then each client folded
        in as on the sequential path."""
        t = self.spec.training
        g, p, n = self.env.global_weights, self.model.num_params, len(ctxs)
        kept: list[dict[str, torch.Tensor]] = [{} for _ in ctxs]
        last = None  # the previous phase's GroupResult
        sent: list[LocalUpdate] = []
        for i in range(len(phases[0])):
            ph = phases[0][i]
            mine = [phs[i] for phs in phases]
            if isinstance(ph.start, str) and ph.start == "previous":
                starts = g + last.deltas[[last.rows[k] for k in range(n)]]
            else:
                starts = self._group_starts(mine, ctxs)
            linear = None
            if any(q.terms.linear is not None for q in mine):
                linear = torch.zeros((n, p), device=self.device)
                for k, q in enumerate(mine):
                    if q.terms.linear is not None:
                        linear[k] = q.terms.linear
            opt_state = None
            ins = [self._opt_in(q, ctx, kept[k])
                   for k, (q, ctx) in enumerate(zip(mine, ctxs, strict=True))]
            if any(s is not None for s in ins):
                names = {"m": p, "v": p, "t": 1}
                opt_state = {}
                for name, width in names.items():
                    if any(s is not None and name in s for s in ins):
                        rows = torch.zeros((n, width), device=self.device)
                        for k, s in enumerate(ins):
                            if s is not None and name in s:
                                rows[k] = s[name].reshape(-1).to(self.device, torch.float32)
                        opt_state[name] = rows
            lr, epochs, steps = self._phase_steps(ph)
            group = vmap_local_sgd(self.model, g, [(c.x, c.y) for c in ctxs], lrs=[lr] * n,
                                   batch_size=[c.batch_size for c in ctxs],
                                   local_epochs=epochs, local_steps=steps,
                                   seeds=[self._phase_seed(c, i) for c in ctxs],
                                   terms=LocalTerms(proximal=ph.terms.proximal, linear=linear),
                                   full_batch=self.client.full_batch, loss=t.loss,
                                   starts=starts, trainable=self._flags(ph.trainable),
                                   optimizer=ph.optimizer, opt_state=opt_state,
                                   transform=ph.transform, precision=t.precision)
            last = group
            for k in range(n):
                if ph.keep is not None:  # the trained weights, rebuilt as x + delta
                    kept[k][ph.keep] = g + group.delta(k)
                if group.opt_state is not None and ph.optimizer is not None:
                    for key in ph.optimizer.state_keys():
                        kept[k][key] = group.opt_state[key.rsplit(".", 1)[1]][group.rows[k]]
            if ph.send:
                sent = [LocalUpdate(group.delta(k), group.num_examples[k],
                                    group.loss_sums[k], group.examples_seen[k],
                                    group.steps[k]) for k in range(n)]
        out = []
        for k, ctx in enumerate(ctxs):
            update = sent[k]
            if self._local_at is not None:  # where the last phase left them
                kept[k]["local"] = g[self._local_at] + last.delta(k)[self._local_at]
                update.delta[self._local_at] = 0.0
            out.append((update, self._finish(ctx, update, acc, kept[k])))
        return out

    @names_part_errors(_parts)
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
        self._flagged = []
        self._arrived = [] if self.spec.client_rows else None
        ids = task.client_ids
        if self.aggregator.individual:
            self._rows = _Rows(len(ids), self.model.size, self._row_buffer)
            self._row_buffer = self._rows.buffer
        else:
            self._rows = None
        self._staleness = task.staleness
        # a fixed composition (data.per_round): each client's (rank, invited) in the round
        self._ranks = ({c: (k, task.invited) for c, k in zip(ids, task.ranks, strict=True)}
                       if task.ranks is not None else {})
        if self.state is not None and self.spec.resources.state_pack_mb:
            # the round's clients' state goes into packs of state_pack_mb each
            self.state.begin_packs(task.round, task.task, self.spec.resources.state_pack_mb)
        jobs = self._jobs(task.round, ids, task.versions, task.packs)
        if self.group:
            results = (r for chunk in _chunks(jobs, group_sizes(len(ids), self.group))
                       for r in self._train_group(chunk, acc))
        else:
            results = (self._train_client(ctx, acc) for ctx in jobs)
        packs: list[int] = []
        try:
            for res, kept in results:
                if not kept:  # its loss may be NaN too: the round's train_loss leaves it out
                    dropped += 1
                    continue
                loss_sum += res.loss_sum
                seen += res.examples_seen
                examples += res.num_examples
        finally:  # the clients' state files are written before the round reports them
            if self.state is not None:  # (or, after a failure, before it is re-run)
                packs = self.state.flush()
        return RoundResult(partial=acc.to_message(), clients=len(ids), examples=examples,
                           loss_sum=loss_sum, examples_seen=seen, dropped=dropped,
                           updates=len(ids) - dropped, nonfinite=self._nonfinite,
                           stored=self._stored, packs=packs, rows=self._take_rows(),
                           flagged=self._flagged, arrived=self._arrived_message(),
                           busy_s=time.perf_counter() - start, mem_mb=private_mb())

    def _arrived_message(self) -> dict[str, np.ndarray] | None:
        """This round's aggregated clients as columns: ``id``, ``loss``, ``examples`` and
        the recorded values (``row_columns``; NaN where a client recorded none)."""
        rows, self._arrived = self._arrived, None
        if rows is None:
            return None
        out = {"id": np.array([r[0] for r in rows], dtype=np.int64),
               "loss": np.array([r[1] for r in rows], dtype=np.float64),
               "examples": np.array([r[2] for r in rows], dtype=np.int64)}
        for name in self.row_columns:
            out[name] = np.array([float(r[3].get(name, np.nan)) for r in rows],
                                 dtype=np.float64)
        return out

    def probe(self, broadcast: Broadcast, client_ids: list[int],
              round_idx: int = 0) -> np.ndarray:
        """The broadcast model's mean loss on each client's training data for round
        ``round_idx`` (a selector's probe: power of choice), float64, aligned with
        ``client_ids``; NaN for a client without examples."""
        self._weights.copy_(readonly_tensor(broadcast.weights))
        self.model.load_(self._weights)
        t = self.spec.training
        out = np.full(len(client_ids), np.nan)
        for i, cid in enumerate(client_ids):
            x, y = self.client_data(round_idx, cid)  # data.per_round's too, as it would train
            if len(y):
                out[i] = evaluate(self.model.module, x, y, t.eval_batch_size, self.device,
                                  t.loss).mean_loss
        return out

    def _take_rows(self) -> ClientUpdates | None:
        """This round's rows, which the worker then lets go of (they travel in the result)."""
        rows, self._rows = self._rows, None
        return None if rows is None else rows.message()

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

    @names_part_errors(_parts)
    def evaluate_clients(self, weights: np.ndarray, client_ids: list[int], round_idx: int = 0,
                         personalize: Personalize | None = None,
                         versions: list[int] | None = None,
                         packs: list[int] | None = None) -> list[ClientEval]:
        """One row of evaluation sums per client of ``client_ids``, on its held-out data:
        the global model's, and with ``personalize`` also those of a copy fine-tuned on the
        client's train split (local SGD from the client's personalization seed for
        ``round_idx``). The copy lives in the replica, which is reloaded with the global
        weights for every client; nothing a later round reads is changed.

        ``versions`` (one per client, 0: none; only for a client part that evaluates with
        its state, ``evaluates_with_state``) and ``packs`` (where each is stored; -1 or
        None: in its own file): each client is evaluated, and fine-tuned, from its own
        weights instead, built from the global ones and its stored state of that version
        (``_client_weights``)."""
        t = self.spec.training
        self._weights.copy_(readonly_tensor(weights))
        self.env.global_weights = self._weights
        adapt = self.client.eval_phase(self.env)
        own = evaluates_own_model(self.client)
        rows = []
        for i, cid in enumerate(client_ids):
            start = self._weights if versions is None else self._client_weights(
                cid, versions[i], packs[i] if packs else -1)
            x, y = self.client_split(cid, "test")
            glob = None
            if own:  # the global model's numbers beside the client's own model's
                self.model.load_(self._weights)
                glob = evaluate(self.model.module, x, y, t.eval_batch_size, self.device,
                                t.loss)
            # the training split, read (and shifted) once for the adaptation and the
            # fine-tuning that start from it
            tx, ty = self.client_split(cid) if adapt or personalize else (None, None)
            if adapt is not None:
                start = self._adapted(cid, round_idx, adapt, start, tx, ty)
            self.model.load_(start)
            row = ClientEval(cid, evaluate(self.model.module, x, y, t.eval_batch_size,
                                           self.device, t.loss), global_sums=glob)
            if self.client.columns:  # what the part chose for it (eval_weights): IFCA's cluster
                row.columns = {k: float(v) for k, v in
                               self.client.eval_columns(self.env, cid).items()}
            if personalize is not None:
                if len(ty):
                    local_sgd(self.model, start, tx, ty, lr=personalize.lr,
                              batch_size=personalize.batch_size or t.batch_size_for(len(ty)),
                              local_epochs=personalize.epochs,
                              local_steps=personalize.steps or None,
                              seed=personalize_seed(self.spec.seed, round_idx, cid),
                              delta_out=self._delta, loss=t.loss, precision=t.precision)
                row.personalized = evaluate(self.model.module, x, y, t.eval_batch_size,
                                            self.device, t.loss)
            rows.append(row)
        return rows

    def _adapted(self, cid: int, round_idx: int, phase: Phase, start: torch.Tensor,
                 tx: torch.Tensor, ty: torch.Tensor) -> torch.Tensor:
        """Client ``cid``'s model adapted on its training split (tx, ty) by the client
        part's ``eval_phase`` (from ``start``, its eval weights), as a copy: the client's own
        adaptation seed for the round, no algorithm terms but the phase's."""
        if not len(ty):
            return start
        seed = derive_seed(self.spec.seed, TAG_ADAPT, round_idx, cid)
        ctx = ClientContext(cid, round_idx, seed, tx, ty, self.env.batch_size_for(len(ty)))
        self.env.local_sgd(ctx, phase, weights=start)
        return self.model.flat.clone()

    def _client_weights(self, cid: int, version: int, pack: int = -1) -> torch.Tensor:
        """Client ``cid``'s model for evaluation: what the client part's ``eval_weights``
        returns from the global weights (in ``_weights``) and the client's state of
        ``version``; by default the global weights with the part's ``local`` parameters
        from the state's "local". A client without state (version 0: it never trained)
        gets the global weights as broadcast, its ``local`` parameters included."""
        self.env.global_weights = self._weights
        state = self.state.get(cid, version, pack) if self.state is not None else None
        own = self.client.eval_weights(self.env, cid, state)
        size = self.model.size
        if own is not None:
            if not isinstance(own, torch.Tensor) or own.numel() != size \
                    or not bool(torch.isfinite(own).all()):
                what = (f"{own.numel()} values" + ("" if own.numel() != size else
                                                   ", not all finite")
                        if isinstance(own, torch.Tensor) else type(own).__name__)
                raise PartError(f"{_parts(self).who(self.client)}: eval_weights(client "
                                f"{cid}) returned {what}; it must be None or the model's "
                                f"{size} finite values (flat)")
            return own.reshape(-1).to(self.device, torch.float32)
        own = self._with_local(self._weights, cid, state)
        return self._weights if own is None else own
