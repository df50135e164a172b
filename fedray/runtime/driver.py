"""The driver actor: owns the global model and the worker pool, and runs the rounds.

One round (docs/architecture.md has the picture):
  1. sample ``sampling.clients_per_round`` client ids from (seed, round), less those that
     drop out or finish late (``sampling.dropout`` / ``over_selection``, fedray.core.sampling);
  2. assign them to workers, balanced by example count (fedray.core.assignment);
  3. put the global weights into the object store once; every worker reads that one copy;
  4. each worker trains its clients one after another, passes each update through the
     algorithm's update stages (clipping, compression: algorithm.stages) and returns one
     partial weighted sum;
  5. merge the partial sums (in worker order, so reruns are bit-identical; through the
     stage that guards what the driver may read, secure aggregation's; with
     ``runtime.reduce.group_size`` one sum per group of workers, made on the group's
     node: fedray.runtime.reduction_tree), let the stages
     finish the sum (decode, add noise), apply the
     server optimizer, write the round's metrics, and return them to fedray.run, which
     calls the run's callbacks (fedray.tracking.callbacks) and asks for the next round or stops;
  6. every ``checkpoint.every`` rounds or ``checkpoint.every_s`` seconds, write a checkpoint
     (fedray.state.checkpoint).
The driver never holds more than one worker's (or group's) partial result at a time, and
nothing per client of the population: example counts are asked of the source for the
clients a round uses, and client state versions are kept for the clients that have state.
A worker that dies mid-round has its clients re-run (fedray.runtime.pool); per-client state
is versioned by round (fedray.state.client_state), so a re-run, or a run resumed from a
checkpoint, reads exactly what the first run read. With ``runtime.backend: inline`` the same
class runs in the calling process, its pool and its broadcasts without Ray
(fedray.runtime.inline).
"""

from __future__ import annotations

import copy
import functools
import json
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf
from torch import nn

from fedray.algorithms.base import (
    Aggregator,
    ClientRows,
    ClientWork,
    PartialSum,
    Payload,
    RoundPlan,
    UpdateStage,
    evaluates_with_state,
    extra_sizes,
)
from fedray.algorithms.registry import Resolved, check_plan, resolve
from fedray.algorithms.selection import UniformSelector
from fedray.config import DataConfig, typed
from fedray.core.assignment import assign_balanced
from fedray.core.evaluation import ClientEval, EvalSums, merge_sums, pooled
from fedray.core.flat_model import FlatModel
from fedray.core.losses import correct_fn
from fedray.core.models import fit_problem
from fedray.core.sampling import federated_eval_clients
from fedray.core.seeding import TAG_CLUSTER, TAG_INIT, derive_seed
from fedray.core.tensors import readonly_tensor, reused_rows
from fedray.data.client_source import ClientSource, sizes_of
from fedray.data.transforms.per_client import check_data, parse_per_client
from fedray.data.transforms.per_round import parse_per_round
from fedray.errors import ConfigError, DivergedError, FedrayError, PartError, key_error
from fedray.kernels.vectorized import batch_failure, vectorize_plan
from fedray.runtime.adversary import DefenseRound, flagged_rows
from fedray.runtime.adversary import resolve as resolve_adversary
from fedray.runtime.inline import InlinePool, frozen, frozen_tree
from fedray.runtime.messages import Broadcast, ClientUpdates, RoundResult, RoundTask
from fedray.runtime.part_errors import PartNames, check_sum, check_update, names_part_errors
from fedray.runtime.part_errors import finite as all_finite
from fedray.runtime.participation import (
    Participation,
    check_selector,
    merge_arrived,
    participants_name,
    row_columns,
)
from fedray.runtime.pool import WorkerPool
from fedray.runtime.reduction_tree import slot_groups
from fedray.runtime.session import private_mb
from fedray.runtime.worker import (
    LocalTraining,
    Personalize,
    WorkerResources,
    WorkerSpec,
    keeps_client_state,
)
from fedray.state.checkpoint import (
    CHECKPOINT_FILE,
    RUN_ID_LINE,
    Checkpoint,
    encode,
    new_run_id,
    read_checkpoint,
    recorded_config,
    saved_run_id,
)
from fedray.state.client_state import ClientStateStore, ClientVersions
from fedray.state.client_state_disk import over_budget, run_estimate
from fedray.state.run_dir import (
    CLIENT_STATE_DIR,
    MODELS_DIR,
    SERVER_STATE_FILE,
    WEIGHTS_FILE,
    RunDir,
)
from fedray.timing.buffered import buffered_schedule, versions_needed
from fedray.timing.rounds import LocalWork, RoundClock
from fedray.tracking.client_eval import client_metrics, client_table, table_bytes, table_name
from fedray.version import __version__


def _data_name(data: DataConfig) -> str:
    """The data a run trains on, as an error message names it."""
    if data.partition == "memory":
        return "client_data"
    if data.partition == "synthetic":
        return "the synthetic population"
    return f"the store {data.partition}"


def _finite(t: torch.Tensor) -> bool:
    """No NaN or Inf in ``t``: one float64 reduction, without a mask the size of ``t`` (a
    float32 sum cannot overflow float64, and NaN and Inf carry through it)."""
    if not t.is_floating_point():
        return True
    if t.dtype == torch.float64:  # server state, checked only when written: a sum could overflow
        return bool(torch.isfinite(t).all())
    return math.isfinite(float(t.sum(dtype=torch.float64)))


def is_eval_round(r: int, every: int, rounds: int) -> bool:
    return r == rounds or (every > 0 and r % every == 0)


# the per-round metrics the summary is built from (kept for every round, and rebuilt from a
# checkpoint's metrics lines on resume)
_HISTORY_KEYS = ("updates_per_s", "test_accuracy", "dropped_updates", "worker_failures")


POISSON_TAIL = 1e-6  # the chance a poisson round keeps more clients than most_clients says


def most_clients(plan: RoundPlan) -> int:
    """The most clients a round keeps, for the memory an individual aggregator's updates
    take: ``clients_per_round`` (fixed sampling: over-selection's late clients and
    dropouts train no update), or under poisson sampling a count that a round's
    Binomial(population, q) exceeds with probability below POISSON_TAIL, from Bernstein's
    inequality (P(X - m >= t) <= exp(-t^2 / (2 (var + t / 3)))), at most the population."""
    if plan.sampling != "poisson":
        return plan.clients_per_round
    m, q = plan.clients_per_round, plan.rate
    log = math.log(1 / POISSON_TAIL)
    t = log / 3 + math.sqrt((log / 3) ** 2 + 2 * log * m * (1 - q))
    return min(plan.population, math.ceil(m + t))


class _RoundRows:
    """A round's kept clients' updates on the driver, for an individual aggregator: one
    float32 row per sampled client, at its place in the round's sampled order (so the
    aggregator sees the same rows whatever the worker count or placement); the rows of
    clients that sent none (dropped by the guard, without examples) are squeezed out at
    the end, in place."""

    def __init__(self, ids: Any, size: int, buffer: torch.Tensor | None = None):
        """``buffer``: the last round's rows, written over if it has room; ``buffer`` after
        this is the one to pass next round (``reused_rows``)."""
        ids = np.asarray(ids, dtype=np.int64)
        self.place = {int(c): i for i, c in enumerate(ids)}
        self.updates, self.buffer = reused_rows(
            buffer, len(ids), size, lambda n, d: torch.empty((n, d), dtype=torch.float32))
        self.ids = ids
        self.num_examples = np.zeros(len(ids), np.int64)
        self.losses = np.zeros(len(ids), np.float64)
        self.kept = np.zeros(len(ids), bool)

    def put(self, part: ClientUpdates) -> None:
        if not len(part.ids):
            return
        at = np.array([self.place[int(c)] for c in part.ids], np.int64)
        # read, never written: a Ray result's arrays are the object store's, read-only
        self.updates.index_copy_(0, torch.from_numpy(at), readonly_tensor(part.updates))
        self.num_examples[at], self.losses[at], self.kept[at] = (part.num_examples,
                                                                 part.losses, True)

    def assemble(self) -> tuple[torch.Tensor, ClientRows]:
        """The (k, d) view of the kept rows, in sampled order, and who they are."""
        keep = np.flatnonzero(self.kept)
        for j, i in enumerate(keep.tolist()):  # j <= i: each row moves up, none is overwritten
            if i != j:
                self.updates[j] = self.updates[i]
        return self.updates[: len(keep)], ClientRows(
            torch.from_numpy(self.ids[keep]), torch.from_numpy(self.num_examples[keep]),
            torch.from_numpy(self.losses[keep]))


def _parts(driver: Driver) -> PartNames | None:
    """The driver's parts as errors name them, as the job does (fedray.runtime.part_errors);
    None before setup has resolved them."""
    alg = getattr(driver, "algorithm", None)
    if alg is None:
        return None
    return PartNames.of(alg.client, alg.aggregator, alg.stages,
                        (alg.names["client"], alg.names["aggregator"], *alg.stage_names),
                        alg.server_opt, alg.names["server_opt"],
                        getattr(driver, "selector", None), alg.names.get("selector"))


class Driver:
    _finite_after: bool | None = None  # the last server step's weights had no NaN or Inf
    _blame: str | None = None  # the part a non-finite global model is traced to, if one

    @property
    def one_line_part_errors(self) -> bool:
        """A user's part's exception leaves the driver as a one-line PartError; with the
        inline backend (debugging in the caller's process) as itself, with a note."""
        cfg = getattr(self, "cfg", None)
        return cfg is None or cfg.runtime.backend != "inline"

    def __init__(self) -> None:
        # the driver merges and steps; workers do the heavy work
        torch.set_num_threads(1)

    @names_part_errors(_parts)
    def setup(self, cfg: dict, source: ClientSource, make_model: Callable[[], nn.Module],
              num_workers: int, run_dir: str, resume: bool = False,
              launched: list | None = None, algorithm: Resolved | None = None,
              in_process: bool | None = None) -> list[str]:
        """Build the global model and the worker pool, and open the run directory (resuming
        from its checkpoint when ``resume``). The pool configures the ``launched`` workers
        (fedray.run starts them beside this actor: pool.launch_workers), or starts its own.
        Returns the notes the user should see (fedray.run prints them). ``algorithm``: the
        job's parts, resolved by the caller (a user's module travels inside them, by value);
        None resolves ``cfg``'s here. ``in_process``: the workers are objects of this
        process (fedray.runtime.inline); None: when ``runtime.backend`` is ``inline``.

        Not in __init__: an exception there kills the actor with an opaque error, while one
        raised here reaches fedray.run as the FedrayError it is."""
        # the job as typed, read-only sections (fedray.config.typed): each subsystem below
        # is handed its own; ``cfg``'s plain tree is what the run directory records
        self.cfg = typed(cfg)
        c = self.cfg
        self.in_process = c.runtime.backend == "inline" if in_process is None else in_process
        self.source = source
        self.notes: list[str] = []
        torch.manual_seed(derive_seed(c.seed, TAG_INIT))
        # fedray.run(model_fn=...) names its model "custom"
        where = ("model_fn: the model" if c.model.name == "custom" else
                 f"config key 'model.name': the {c.model.name} model")
        data = _data_name(c.data)
        try:
            self.template = FlatModel(make_model())
        except (ValueError, RuntimeError) as exc:
            raise FedrayError(f"{where} cannot be built for the inputs of {data}, of shape "
                              f"{tuple(source.input_shape)}: {exc}") from None
        problem = fit_problem(self.template.module, tuple(source.input_shape),
                              source.num_classes, c.model.loss, data,
                              tuple(getattr(source, "label_shape", ())))
        if problem is not None:  # before any round, and before the run directory is written
            raise FedrayError(f"{where} {problem}")
        per_client = parse_per_client(c.data.per_client)
        check_data(per_client, tuple(source.input_shape),
                   tuple(getattr(source, "label_shape", ())), data)
        self.weights = self.template.flat.clone()
        self.algorithm = algorithm if algorithm is not None else resolve(c.algorithm, c.server)
        client = self.algorithm.client
        # the workers' copies, before the driver's aggregator grows its server state
        worker_parts = copy.deepcopy((client, self.algorithm.aggregator,
                                      self.algorithm.stages))
        self.aggregator = self.algorithm.aggregator
        self.aggregator.init_server(self.template.num_params, source.population)

        def model_init(j: int) -> torch.Tensor:  # the job's model from the run's stream j
            torch.manual_seed(derive_seed(c.seed, TAG_CLUSTER, j))
            return FlatModel(make_model()).flat.clone()

        self.aggregator.init_weights(self.weights, model_init)
        self.stages = self.algorithm.stages
        plan = RoundPlan(seed=c.seed, population=source.population,
                         clients_per_round=c.sampling.clients_per_round,
                         sampling=c.sampling.mode, rounds=c.rounds,
                         num_params=self.template.num_params, dropout=c.sampling.dropout,
                         always=tuple(c.sampling.always))
        for stage in self.stages:
            stage.init_server(plan)
        # who takes part (algorithm.selector): uniform unless the job names another
        self.selector = self.algorithm.selector
        if self.selector is None:
            self.selector = UniformSelector()
        self.selector.init_server(plan)
        check_plan(self.aggregator, plan)  # the round size its guarantee needs
        # the central test set, read once: the attacks' checks and measures need it too
        test = source.central_test() if c.eval.central else None
        self.adversary = resolve_adversary(c.adversary, c.seed, source.population,
                                           trusted=self.aggregator.trusted)
        if self.adversary is not None:
            self.adversary.check_data(tuple(source.input_shape), source.num_classes,
                                      None if test is None else test[0])
            self.adversary.check_parts(self.aggregator, self.algorithm.names["aggregator"],
                                       tuple(self.algorithm.stage_names))
        # the stage that decides which partial sums the driver may read (secure aggregation)
        self.merger = next((s for s in self.stages if type(s).merge is not UpdateStage.merge),
                           None)
        self.stopped_by: str | None = None
        self.diverged_at: int | None = None  # guard.non_finite=warn: the first such round
        self._nonfinite = 0  # the last round's updates the guard dropped as NaN or Inf
        payload = Payload(self.weights.numel(), dense=self.weights.numel())
        for stage in self.stages:
            payload = stage.payload(payload)
        self.update_bytes = payload.bytes  # what one client's update costs on the uplink
        self.server_opt = self.algorithm.server_opt
        # example counts are asked of the source for the clients a round uses, never held
        # for the population (10^8 synthetic clients: 800 MB)
        self.sizes_of = functools.partial(sizes_of, source)
        self.run_dir = RunDir(run_dir)
        state_url = self.run_dir.url_of(CLIENT_STATE_DIR)
        # per-client state (the client part's): which version of each client's state is current
        stateful = keeps_client_state(client, self.stages)
        state_half = c.runtime.worker.state_dtype == "float16"  # the driver's store, workers'
        self.state_store = (ClientStateStore(state_url, cache_mb=0, half=state_half)
                            if stateful else None)
        self.versions = ClientVersions(source.population) if stateful else None
        # (client, version, pack) of states the last checkpoint needs, though superseded
        self._superseded: list[tuple[int, int, int]] = []
        # how many clients' current (or checkpointed) state each (version, pack) holds: a
        # pack goes when that falls to 0 (ClientStateStore.begin_packs)
        self._live: dict[tuple[int, int], int] = {}
        # Aggregator.individual: the (k, d) rows, reused from round to round (_RoundRows)
        self._row_buffer: torch.Tensor | None = None
        self.last_checkpoint = 0
        self.start_round = 1
        self.resumed_from: int | None = None
        # runtime.backend auto: the round after which the run left the caller's process
        self.handed_over: int | None = None
        # the run's identity, in every checkpoint: --resume checks a checkpoint is this
        # run's and names what differs from the config it records (check_resume)
        self.run_id = new_run_id()  # a resumed run keeps its own (_restore)
        self.config_record = recorded_config(cfg)
        self.history: list[dict] = []
        cl, w = c.client, c.runtime.worker
        self.clock, self.sim_time_s = None, 0.0
        if c.clock.enabled:
            self.clock = RoundClock(c.clock, c.seed, self.sizes_of, self.template.num_params,
                                    LocalWork(cl.batch_size, cl.local_epochs, cl.local_steps,
                                              cl.steps_per_epoch, client.full_batch,
                                              client.independent_batches),
                                    update_bytes=self.update_bytes,
                                    population=source.population)
        # buffered asynchronous training: the whole schedule, from the clock alone
        self.schedule, self.keep_until = None, {}
        self.version_weights: dict[int, torch.Tensor] = {}  # the models stale clients need
        if c.sampling.concurrency:
            if stateful:
                who = (f"algorithm.client {self.algorithm.names['client']}"
                       if client.state or client.local else "an update stage (algorithm.stages)")
                raise key_error("sampling.concurrency", f"{who} keeps per-client state, "
                                "which buffered asynchronous training does not support",
                                c.sampling.concurrency)

            self.schedule = buffered_schedule(self.clock, c.sampling.concurrency,
                                              c.sampling.clients_per_round, c.rounds)
            self.keep_until = versions_needed(self.schedule)
            self.version_weights[0] = self.weights.clone()
        selector_name = self.algorithm.names.get("selector") or "uniform"
        check_selector(selector_name, self.selector, c.sampling)
        per_round = parse_per_round(c.data.per_round)
        # a fixed composition (None without one): its places are dealt over each round's
        # invitees (RoundTask.ranks)
        self.composed = per_round if per_round is not None and per_round.ranked else None
        if self.composed is not None and type(self.selector) is not UniformSelector:
            raise key_error("algorithm.selector", f"{selector_name} probes candidates outside "
                            "the round, which a fixed composition of the round "
                            "(data.per_round) cannot place: only uniform allows it",
                            selector_name)
        self.participation = None if self.schedule is not None else Participation(
            self.selector, selector_name, c.sampling, c.seed, source.population, self.sizes_of,
            self.clock, columns=client.columns, participants=c.output.participants,
            recorded=row_columns(client, self.aggregator, per_round))
        # each aggregated client's report (loss, examples, a part's columns)
        self.client_rows = self.participation is not None and self.participation.reports
        spec = WorkerSpec(
            make_model=make_model, source=source, seed=c.seed,
            training=LocalTraining(lr=cl.lr, batch_size=cl.batch_size,
                                   local_epochs=cl.local_epochs, local_steps=cl.local_steps,
                                   eval_batch_size=c.eval.batch_size, loss=c.model.loss,
                                   steps_per_epoch=cl.steps_per_epoch,
                                   max_update_norm=c.guard.max_update_norm,
                                   precision=c.runtime.precision),
            resources=WorkerResources(num_cpus=w.num_cpus, cache_mb=w.cache_mb,
                                      state_cache_mb=w.state_cache_mb,
                                      state_pack_mb=w.state_pack_mb,
                                      state_half=state_half,
                                      vectorize=self._vectorize_plan(client)),
            client=worker_parts[0], aggregator=worker_parts[1], state_url=state_url,
            per_round=per_round, per_client=per_client,
            stages=worker_parts[2],
            labels=(self.algorithm.names["client"], self.algorithm.names["aggregator"],
                    *self.algorithm.stage_names),
            adversary=self.adversary, client_rows=self.client_rows)
        reduce = c.runtime.reduce
        if reduce.group_size is not None and self.merger is not None:
            raise key_error("runtime.reduce.group_size", f"the update stage "
                            f"{self.merger.name} must see each worker's partial sum, not a "
                            "group's: use null with it", reduce.group_size)
        self.individual = self.aggregator.individual
        if self.individual:
            self._check_individual(plan)
        if stateful:
            self._check_state_disk(plan, client, num_workers)
        if resume:  # before the pool starts: a checkpoint that cannot be used fails fast
            self._restore()
        start = time.perf_counter()
        if self.in_process:  # plain objects of this process (fedray.runtime.inline)
            self.pool = InlinePool(spec, num_workers, c.runtime.max_retries,
                                   one_line_part_errors=self.one_line_part_errors)
        else:  # a reduction tree's groups of slots tend to share a node (node_major)
            self.pool = WorkerPool(spec, num_workers, c.runtime.worker.num_cpus,
                                   c.runtime.worker.num_gpus, c.runtime.max_retries,
                                   launched=launched, node_major=reduce.group_size is not None,
                                   timeout_s=c.runtime.worker_timeout_s)
        self.pool_start_s = time.perf_counter() - start
        self.test_ref, self.test_len = None, 0
        # metric -> (test set ref, its length), for each attack that measures its success on
        # the central test set (Attack.poison_test)
        self.attack_tests: dict[str, tuple[Any, int]] = {}
        if test is not None:
            self.test_ref, self.test_len = self._put(test), len(test[1])
            if self.adversary is not None:
                made = self.adversary.test_sets(*test)
                self.attack_tests = {
                    "test_attack_success" if len(made) == 1 else
                    f"test_attack_success_{name}": (self._put((x, y)), len(y))
                    for name, x, y in made}
        self.fed_eval_ids = (federated_eval_clients(c.seed, source.population,
                                                    c.eval.federated_clients)
                             if c.eval.federated_clients else None)
        p = c.eval.personalize
        self.personalize = Personalize(
            lr=cl.lr if p.lr is None else p.lr, batch_size=p.batch_size, epochs=p.epochs,
            steps=p.steps) if p.steps or p.epochs else None
        self.run_dir.create(RUN_ID_LINE.format(self.run_id)
                            + OmegaConf.to_yaml(OmegaConf.create(cfg), resolve=True))
        return self.notes

    def _check_individual(self, plan: RoundPlan) -> None:
        """An aggregator that needs every client's update (``individual``): refused, before
        round 1, without an ``aggregate``, with what works on sums only (a reduction tree's
        group sums, a stage that guards or changes the round's sum), and when the round's
        updates could exceed ``runtime.individual_updates_mb``."""
        c, agg = self.cfg, self.aggregator
        name = self.algorithm.names["aggregator"]
        if type(agg).aggregate is Aggregator.aggregate:
            raise key_error("algorithm.aggregator", f"aggregator {name} sets individual "
                            "(it needs every client's update) but defines no aggregate()", name)
        if c.runtime.reduce.group_size is not None:
            raise key_error("runtime.reduce.group_size", f"aggregator {name} needs every "
                            "client's update, which a reduction tree's group sums do not "
                            "keep: use null with it", c.runtime.reduce.group_size)
        for stage in self.stages:
            own = [m for m in ("merge", "close", "finish_sum")
                   if getattr(type(stage), m) is not getattr(UpdateStage, m)]
            if own:
                raise key_error("algorithm.stages", f"the update stage {stage.name} works on "
                                f"the round's sum ({', '.join(own)}), which aggregator {name} "
                                "does not make (it needs every client's update): use one of "
                                "them", list(self.algorithm.stage_names))
        k, d = most_clients(plan), self.template.size
        mb = k * d * 4 / 2**20
        budget = c.runtime.individual_updates_mb
        if mb > budget:
            raise ConfigError(f"config key 'runtime.individual_updates_mb': aggregator {name} "
                              f"needs every client's update: {k} x {d} float32 = "
                              f"{f'{mb:.1f}' if mb >= 0.1 else f'{mb:.2g}'} MB "
                              f"> {budget:g} MB; raise it or sample fewer clients")

    def _check_state_disk(self, plan: RoundPlan, client: ClientWork, workers: int) -> None:
        """Say what the run's client state will take on disk, and refuse, before round 1, a
        run expected to keep more than ``runtime.client_state_mb``
        (fedray.state.client_state_disk)."""
        c = self.cfg
        disk = run_estimate(c.runtime.worker, c.rounds, plan.population, most_clients(plan),
                            self.template, client, self.stages, workers)
        self.notes.append(disk.line(c.rounds, c.runtime.worker.state_dtype))
        refusal = over_budget(c.runtime, disk)
        if refusal:
            raise ConfigError(refusal)

    def _vectorize_plan(self, client: ClientWork) -> bool:
        """runtime.worker.vectorize resolved for this model and client part, once for every
        worker; auto's choice of sequential training is said once, here."""
        w = self.cfg.runtime.worker
        if client.train is not None and w.vectorize != "off":
            if w.vectorize == "on":
                raise key_error("runtime.worker.vectorize", f"algorithm.client "
                                f"{self.algorithm.names['client']} trains clients with its own "
                                "train(), which cannot be batched", "on")
            self.notes.append(f"runtime.worker.vectorize=auto: clients train one after "
                              f"another, as algorithm.client {self.algorithm.names['client']} "
                              "trains them with its own train() rather than LocalTerms")
            self.vectorized = False
            return False
        try:
            on, why_not = vectorize_plan(
                self.template.module, w.vectorize, w.num_gpus > 0, self.cfg.model.loss,
                probe=lambda: batch_failure(self.template, tuple(self.source.input_shape),
                                            self.cfg.model.loss,
                                            tuple(getattr(self.source, "label_shape", ()))))
        except ValueError as exc:
            raise FedrayError(str(exc)) from None
        if why_not is not None:
            self.notes.append(why_not)
        self.vectorized = on
        return on

    def _restore(self) -> None:
        """Continue from the run directory's checkpoint (or from round 1 if it has none)."""
        c = self.cfg
        ckpt = read_checkpoint(self.run_dir.url)
        # config.yaml's id (fedray.api.prepare_resume has checked the checkpoint's is the
        # same), else the checkpoint's: a run directory from an earlier fedray has none
        self.run_id = (saved_run_id(self.run_dir.url) or (ckpt.run_id if ckpt else None)
                       or self.run_id)
        where = self.run_dir.url_of(CHECKPOINT_FILE)
        if ckpt is not None:
            if ckpt.round > c.rounds:
                raise key_error("rounds", f"the run's checkpoint is already after round "
                                f"{ckpt.round}", c.rounds)
            if ckpt.weights.numel() != self.weights.numel():
                raise FedrayError(f"checkpoint {where} holds {ckpt.weights.numel()} weights; "
                                  f"the model has {self.weights.numel()}")
            if self.versions is not None and (ckpt.client_versions is None or
                                              ckpt.client_versions.population !=
                                              self.versions.population):
                raise FedrayError(f"checkpoint {where} has no client state versions for "
                                  f"{self.versions.population} clients")
            self.weights = ckpt.weights.to(torch.float32).clone()
            part = {p: {k.removeprefix(p): v for k, v in ckpt.server_state.items()
                        if k.startswith(p)}
                    for p in ("server_opt.", "aggregator.", "buffered.v", "selector.")}
            self.version_weights = {int(k): w.to(torch.float32).clone()
                                    for k, w in part["buffered.v"].items()}
            try:  # a part changed with --allow-change (algorithm.*) may not fit the state
                self.server_opt.load_state_dict(part["server_opt."])
                self.aggregator.load_state_dict(part["aggregator."])
                self.selector.load_state_dict(part["selector."])
                for stage in self.stages:
                    prefix = f"stage.{stage.name}."
                    stage.load_state_dict({k.removeprefix(prefix): v for k, v in
                                           ckpt.server_state.items() if k.startswith(prefix)})
            except (ValueError, KeyError, RuntimeError, TypeError) as exc:
                raise FedrayError(f"checkpoint {where}: its server state does not fit this "
                                  f"config's algorithm ({type(exc).__name__}: "
                                  f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
            if self.versions is not None:  # sparse, also from a dense (older) checkpoint
                self.versions = ckpt.client_versions
            self.resumed_from = self.last_checkpoint = ckpt.round
            self.start_round = ckpt.round + 1
        self.run_dir.remove_temporaries()
        lines = ckpt.metrics_lines if ckpt is not None else []
        # the simulated clock goes on from where the checkpoint's last round ended it
        self.sim_time_s = json.loads(lines[-1]).get("sim_time_s", 0.0) if lines else 0.0
        self.run_dir.restore_metrics(lines)
        self.history = [self._history_entry(json.loads(line)) for line in lines]
        if self.state_store is not None:  # versions written after the checkpoint, or unused
            v = self.versions
            self._live = v.live_packs()

            def own_file(cid: int) -> int:  # a client's version kept in a file of its own
                if cid >= v.population:
                    return 0
                version, pack = v.locate([cid])
                return int(version[0]) if pack[0] < 0 else 0

            self.state_store.sweep(own_file, keep_packs=self._live)

    @staticmethod
    def _history_entry(m: dict) -> dict:
        return {k: m[k] for k in (*_HISTORY_KEYS, "round") if k in m} | {
            k: v for k, v in m.items() if k.startswith(("test_", "fed_test_", "clients_"))}

    def _check_finite(self, r: int, m: dict[str, Any]) -> None:
        """After round ``r``'s server update: a global model with NaN or Inf, or a round
        whose every update the guard dropped as non-finite, has diverged. Checked here, on
        the driver, because every path (inline and Ray, synchronous and buffered) passes
        through it after its server step and before the round is evaluated, logged or
        checkpointed. ``guard.non_finite: stop`` raises DivergedError (the last checkpoint,
        written while the model was finite, stays as it is); ``warn`` marks the first such
        round in its metrics (``diverged``, which fedray.run says once) and goes on."""
        finite, self._finite_after = self._finite_after, None  # this round's, if it stepped
        blame, self._blame = self._blame, None
        if finite if finite is not None else _finite(self.weights):
            n = self._nonfinite
            if not n or m["examples"] > 0:
                return
            what = (f"every client update was non-finite ({n} of {m['clients']} clients, "
                    "all dropped by the guard)" if n == m["dropped_updates"] else
                    f"every client update was dropped by the guard, {n} of "
                    f"{m['clients']} as non-finite")
            client = self.algorithm.client
            if client.train is not None and type(client).__module__.partition(".")[0] \
                    != "fedray":  # a user's own loop made them: said beside the learning rate
                what += (f", trained by algorithm.client {self.algorithm.names['client']}'s "
                         "own train()")
        elif blame is not None:  # a part's result, not a learning rate: said as such
            what = (f"the global model has non-finite weights (NaN or Inf) after the server "
                    f"update: {blame}")
        else:
            what = "the global model has non-finite weights (NaN or Inf) after the server update"
        if self.cfg.guard.non_finite == "warn":
            if self.diverged_at is None:
                self.diverged_at = r
                m["diverged"] = self._why(r, what, blame is None)
            return
        raise self._diverged(r, what, blame is None)

    def _why(self, r: int, what: str, cause: bool = True) -> str:
        """Round ``r`` diverged (``what`` went non-finite), and its likely cause (unless
        ``what`` names the part that made it so)."""
        c = self.cfg
        if not cause:
            return f"round {r}: {what}"
        return (f"round {r}: {what}; likely cause: a learning rate too large (client.lr "
                f"{c.client.lr:g}, server.lr {c.server.lr:g}) or non-finite data")

    def _diverged(self, r: int, what: str, cause: bool = True) -> DivergedError:
        """guard.non_finite=stop's error: why, and which checkpoint a resume continues from."""
        kept = (f"; the checkpoint after round {self.last_checkpoint} is intact"
                if self.last_checkpoint else "")
        return DivergedError(self._why(r, what, cause) + kept, round=r,
                             checkpoint=self.last_checkpoint)

    def _non_finite_state(self, state: dict[str, torch.Tensor]) -> str | None:
        """The first tensor of ``state`` with NaN or Inf, or None: a file that holds one is
        never written (guard.non_finite=warn skips it; stop has stopped before)."""
        return next((k for k, t in state.items() if not _finite(t)), None)

    def _checkpoint(self, r: int) -> None:
        """Write the checkpoint after round ``r``; then the client state versions only the
        previous checkpoint needed can go. Never one with non-finite values: the last
        finite checkpoint stays the one a --resume continues from."""
        server = self.server_state()
        key = self._non_finite_state(server)
        if key is not None or not _finite(self.weights):
            if self.cfg.guard.non_finite == "stop":  # a server state gone non-finite alone
                what = f"the server state {key}" if key else "the global model"
                raise self._diverged(r, f"{what} has non-finite values (NaN or Inf)")
            return
        self.run_dir.write_bytes(CHECKPOINT_FILE, encode(Checkpoint(
            round=r, weights=self.weights, server_state=server,
            client_versions=self.versions, metrics_lines=self.run_dir.metrics_lines,
            run_id=self.run_id, config=self.config_record)))
        self.last_checkpoint = r
        self._checkpoint_t = time.perf_counter()
        if self._superseded:
            self._release(self._superseded)
            self._superseded = []

    def _record_versions(self, r: int, stored: list[int], packs: list[int]) -> None:
        """Clients whose state was written in round ``r`` (into ``packs``, one each) now read
        version ``r``. Their old version is kept while the last checkpoint refers to it (a
        resume reads it), and released at once otherwise -- the round is over, no re-run
        can need it."""
        if not stored:
            return
        # O(k log n), not O(population)
        ids, old, old_packs = self.versions.record(stored, r, packs)
        for pack in packs:
            if pack >= 0:
                self._live[(r, pack)] = self._live.get((r, pack), 0) + 1
        had = old > 0
        kept = had & (old <= self.last_checkpoint)
        self._superseded += list(zip(ids[kept].tolist(), old[kept].tolist(),
                                     old_packs[kept].tolist(), strict=True))
        stale = had & ~kept
        self._release(list(zip(ids[stale].tolist(), old[stale].tolist(),
                               old_packs[stale].tolist(), strict=True)))

    def _release(self, states: list[tuple[int, int, int]]) -> None:
        """(client, version, pack) states no client reads any more: a client's own file
        goes; a pack goes once none of its clients' states is read."""
        files, packs = [], []
        for cid, version, pack in states:
            if pack < 0:
                files.append((cid, version))
                continue
            left = self._live.get((version, pack), 0) - 1
            if left > 0:
                self._live[(version, pack)] = left
            else:
                self._live.pop((version, pack), None)
                packs.append((version, pack))
        if files:
            self.state_store.delete(files)
        if packs:
            self.state_store.delete_packs(packs)

    def workers_info(self) -> list[dict]:
        return self.pool.info()

    def _put(self, obj: Any) -> Any:
        """``obj`` as the workers receive it: one object-store copy that every worker on a
        node reads zero-copy, or with the workers in this process (no Ray) a read-only
        copy, which is what a Ray worker gets out of the store."""
        if self.in_process:
            return frozen_tree(obj)
        import ray  # start-up: a run in this process never loads Ray

        return ray.put(obj)

    def _broadcast(self) -> Any:
        return self._put(self.weights.numpy())

    def _broadcast_round(self, weights: torch.Tensor | None = None) -> Any:
        """The round's one object: the global weights (or, for buffered training's stale
        clients, an older version's) and the aggregator's broadcast state (a server
        control variate, say)."""
        weights = (self.weights if weights is None else weights).numpy()
        server = {k: v.numpy() for part in (self.aggregator, *self.stages)
                  for k, v in part.broadcast().items()}
        if self.in_process:
            return Broadcast(frozen(weights), frozen_tree(server))
        import ray

        return ray.put(Broadcast(weights, server))

    def _train_round(self, r: int) -> dict[str, Any]:
        c = self.cfg
        clocked: dict[str, float] = {}
        dropped_out = late = 0
        if self.schedule is not None:  # buffered asynchronous training: a server step
            step = self.schedule[r - 1]
            clocked = {"sim_round_s": step.end_s - self.sim_time_s, "sim_time_s": step.end_s}
            self.sim_time_s = step.end_s
            ids, dropped_out = step.client_ids, step.dropped
            clocked["staleness_mean"] = float(step.staleness.mean())
            clocked["staleness_max"] = int(step.staleness.max())
            missing = sorted(set(step.start_versions.tolist()) - set(self.version_weights))
            if missing:  # only a run extended past its rounds (--allow-change rounds)
                raise key_error("rounds", f"step {r} of buffered training starts clients from "
                                f"model version {missing[0]}, which the run did not keep "
                                "when it ended: a buffered run cannot be extended", c.rounds)
            shares = [(self._broadcast_round(self.version_weights[int(v)]), r - 1 - int(v),
                       np.sort(ids[step.start_versions == v]))
                      for v in np.unique(step.start_versions)]
        else:  # the selector's invitees (fedray.runtime.participation); on the clock
            # (clock.enabled) online clients, their durations and the deadline decide who
            # arrives
            broadcast = self._broadcast_round()
            invites = self.participation.invite(r, self.sim_time_s,
                                                lambda ids: self._probe(broadcast, ids, r))
            sel = invites.selection
            if self.clock is not None:
                clocked = {"sim_round_s": sel.outcome.end_s - self.sim_time_s,
                           "sim_time_s": sel.outcome.end_s}
                if invites.probe_s:
                    clocked["sim_probe_s"] = invites.probe_s
                self.sim_time_s = sel.outcome.end_s
            ids, dropped_out, late = sel.participants, sel.dropped_out, sel.late
            shares = [(broadcast, 0, ids)]
            if self.composed is not None:  # its places are dealt over the invitees
                invited = np.sort(np.asarray(invites.invited, dtype=np.int64))
                self.composed.check_cohort(len(invited), f"round {r} invited")
                rank_of = {c: k for k, c in enumerate(invited.tolist())}
        v = self.versions
        tasks = []
        # a secure sum's partials must each hold enough clients: fewer, fuller workers
        least = max([1, *(s.min_clients_per_partial for s in self.stages)])
        for broadcast, staleness, share in shares:  # one share (and broadcast) per model
            groups = assign_balanced(share, self.sizes_of(share),
                                     max(1, min(len(self.pool), len(share) // least)))
            for slot, g in enumerate(groups):
                if not g:
                    continue
                at = (None, None) if v is None else [a.tolist() for a in v.locate(g)]
                ranked = ({"ranks": [rank_of[c] for c in g], "invited": len(rank_of)}
                          if self.composed is not None else {})
                # the task's number names its packs of client state (begin_packs)
                tasks.append((slot, (broadcast, RoundTask(r, g, at[0], staleness, at[1],
                                                          len(tasks), **ranked)),
                              f"round {r}: clients {g}"))
        acc = PartialSum(self.weights.numel(), extras=extra_sizes(
            self.algorithm.parts, self.template.num_params))
        stats = dict.fromkeys(RoundResult.STATS, 0.0)
        worker_mem = 0.0
        stored: list[int] = []
        packs: list[int] = []
        flagged: list[int] = []  # clients the guard or a stage defended against (adversary)
        arrived: list[dict | None] = []  # each worker's aggregated clients (client_rows)
        # an individual aggregator's rows, in the round's sampled order
        rows = (_RoundRows(ids, self.weights.numel(), self._row_buffer) if self.individual
                else None)
        if rows is not None:
            self._row_buffer = rows.buffer
        merge_s = 0.0  # see docs/api.md: receiving and merging, not waiting for workers
        # fixed order: the float64 sum is bit-identical across reruns and re-runs
        group_size = c.runtime.reduce.group_size
        if group_size is None:  # every worker's partial, in slot order
            results = ((res.partial, (res,)) for res in self.pool.gather("train", tasks))
        else:  # the reduction tree: each group's sum, in group order (reduction_tree)
            results = ((g.partial, g.results) for g in self.pool.gather_reduced(
                tasks, slot_groups([slot for slot, _, _ in tasks], group_size),
                c.runtime.reduce.where == "workers"))
        for partial, members in results:
            start = time.perf_counter()
            if rows is not None:  # the parts' extras; the updates come as rows
                for key, extra in partial.extras.items():
                    acc.extras[key].add_(readonly_tensor(extra))
            elif self.merger is None:
                acc.merge(partial)
            else:  # a stage that reveals only large enough sums
                self.merger.merge(acc, partial)
            for res in members:
                if rows is not None:
                    rows.put(res.rows)
                for k in stats:
                    stats[k] += getattr(res, k)
                worker_mem = max(worker_mem, res.mem_mb)
                stored += res.stored
                packs += res.packs
                flagged += res.flagged
                arrived.append(res.arrived)
            del partial, members, res
            merge_s += time.perf_counter() - start
        merge_s += self.pool.merge_s
        if v is not None:
            self._record_versions(r, stored, packs)
        part_metrics: dict[str, float] = {}
        refused = self.merger.close(acc, r) if self.merger is not None else None
        if refused is None:
            for stage in reversed(self.stages):  # as layers unwrap: decode, then add noise
                stage.finish_sum(acc, r)
                check_sum(lambda stage=stage: _parts(self).who(stage), "finish_sum()",
                          acc.total, acc.weight, self.weights.numel())
        if rows is not None:  # every kept client's update at once (Aggregator.individual)
            updates, clients = rows.assemble()
            del rows
            if len(clients.ids):  # none kept: as a round without examples, below
                self._poison_rows(r, updates, clients)
                self.aggregator.influence = None  # this round's, if the aggregator says it
                update = self.aggregator.aggregate(updates, clients, acc)
                self.weights = self._step(self._check_update("aggregate()", update), acc,
                                          "aggregate()")
                part_metrics = self.aggregator.round_metrics()
                flagged += self._down_weighted(clients)
            del updates
        elif acc.weight > 0:  # a round without examples (or all dropped) leaves the model as is
            self.weights = self._step(self._check_update("finish()",
                                                         self.aggregator.finish(acc)), acc)
            part_metrics = self.aggregator.round_metrics()
        for stage in self.stages:
            part_metrics |= stage.round_metrics()
        if self.adversary is not None:  # the simulator knows who attacked: the defense's score
            ids_ = np.asarray(ids, np.int64)
            trusted = set(self.aggregator.trusted)  # the server's own: never scored
            part_metrics |= DefenseRound(ids_[self.adversary.mask(ids_)].tolist(),
                                         [c for c in flagged if c not in trusted]).metrics()
        if self.schedule is not None:
            self._keep_version(r)
        else:  # what the invitees reported: the selector learns, the table is written
            table = self.participation.feedback(r, invites, merge_arrived(arrived),
                                                clocked.get("sim_round_s", math.nan))
            if table is not None:
                self.run_dir.write_bytes(participants_name(r), table_bytes(table))
            part_metrics |= self.selector.round_metrics()
        self._nonfinite = int(stats["nonfinite"])
        return {"clients": len(ids), "dropped_out": dropped_out, "late": late,
                "examples": int(stats["examples"]), "updates": int(stats["updates"]),
                "dropped_updates": int(stats["dropped"]),
                "worker_failures": self.pool.round_failures,
                # a round that kept no update has no train_loss (absent, never a 0.0)
                **({"train_loss": stats["loss_sum"] / stats["examples_seen"]}
                   if stats["examples_seen"] > 0 else {}),
                "worker_busy_s": stats["busy_s"], "worker_mem_mb": worker_mem, "merge_s": merge_s,
                "upload_bytes": int(stats["updates"]) * self.update_bytes,
                **clocked, **part_metrics}

    def _probe(self, broadcast: Any, ids: np.ndarray, r: int) -> np.ndarray:
        """The broadcast model's mean loss on each of ``ids``' training data for round
        ``r``, computed on the workers (a selector's probe), aligned with ``ids``."""
        groups = assign_balanced(ids, self.sizes_of(ids), max(1, min(len(self.pool), len(ids))))
        tasks = [(slot, (broadcast, g, r), f"round {r} probe: clients {g}")
                 for slot, g in enumerate(groups) if g]
        out = dict(zip([c for _, (_, g, _), _ in tasks for c in g],
                       np.concatenate(list(self.pool.gather("probe", tasks))).tolist(),
                       strict=True))
        return np.array([out[int(c)] for c in ids], dtype=np.float64)

    def _poison_rows(self, r: int, updates: torch.Tensor, clients: ClientRows) -> None:
        """The omniscient attacks (``Attack.poison_rows``): the malicious rows rewritten
        from the round's others, before the aggregator sees them."""
        attacks = self.adversary.row_attacks if self.adversary is not None else ()
        if not attacks:
            return
        bad = torch.from_numpy(self.adversary.mask(clients.ids.numpy()))
        if not bool(bad.any()):
            return
        for attack in attacks:
            attack.poison_rows(updates, bad, clients, self.cfg.seed, r)
            if not bool(torch.isfinite(updates[bad]).all()):
                raise PartError(f"{self.adversary.label(attack)}: poison_rows() left a "
                                "non-finite value in a malicious row")

    def _down_weighted(self, clients: ClientRows) -> list[int]:
        """The clients an individual aggregator discarded or down-weighted this round (its
        ``influence``), when the run has an adversary to score it against."""
        influence = self.aggregator.influence
        if self.adversary is None or influence is None:
            return []
        k = len(clients.ids)
        try:
            low = flagged_rows(influence, k)
        except ValueError as exc:
            raise PartError(f"{_parts(self).who(self.aggregator)}: aggregate() set "
                            f"influence wrongly: {exc}") from None
        return clients.ids.numpy()[low].tolist()

    def _check_update(self, method: str, update: Any) -> torch.Tensor:
        """The aggregator's round update as ``method`` (``finish()``, ``aggregate()``)
        returned it, refused in one line naming the aggregator unless it is a flat float
        tensor of the model's size: else it would fail in the server optimizer, which an
        error would then blame."""
        return check_update(lambda: _parts(self).who(self.aggregator), method, update,
                            self.weights.numel())

    def _step(self, update: torch.Tensor, acc: PartialSum,
              method: str = "finish()") -> torch.Tensor:
        """The server optimizer's step from the round's ``update``, its result checked
        like the update. Weights gone non-finite are traced, here and only then, to the
        part that made them so (``_nonfinite_source``), for ``_check_finite`` to name."""
        who = lambda: _parts(self).who(self.server_opt)  # noqa: E731
        new = check_update(who, "step()", self.server_opt.step(self.weights, update),
                           self.weights.numel(), "the new global weights")
        if new.dtype != self.weights.dtype:
            raise PartError(f"{who()}: step() returned {str(new.dtype)[6:]} weights; the "
                            f"model's are {str(self.weights.dtype)[6:]}")
        self._finite_after = _finite(new)
        if not self._finite_after:
            self._blame = self._nonfinite_source(update, acc, method)
        return new

    def _nonfinite_source(self, update: torch.Tensor, acc: PartialSum,
                          method: str) -> str | None:
        """Which part made the global model non-finite: none (None) when the round's
        update was finite -- the server step overflowed, a divergence -- else the
        aggregator, whose ``method`` made a non-finite update from finite inputs, or the
        parts that made the round's sum, which the guard's finite client updates cannot
        make non-finite by themselves (a float64 sum of float32 values does not overflow)."""
        if all_finite(update):
            return None
        names = _parts(self)
        agg = names.who(self.aggregator)
        if method != "finish()" or all_finite(acc.total):
            inputs = "finite client updates" if method != "finish()" else "a finite sum"
            return f"{agg}: {method} returned non-finite values (NaN or Inf) from {inputs}"
        stages = ", ".join(names.who(s) for s in self.stages)
        return (f"the round's sum of client updates is non-finite (NaN or Inf) before "
                f"{agg}'s finish(), though every client update the guard admitted was "
                f"finite: made so by its accumulate() or weight()"
                + (f", or by the update stages ({stages}: client_update(), finish_sum())"
                   if stages else ""))

    def _keep_version(self, r: int) -> None:
        """Buffered training: keep the model after step ``r`` (version ``r``) while a later
        step's clients start from it, and drop the versions no later step needs."""
        if self.keep_until.get(r, 0) > r:
            self.version_weights[r] = self.weights.clone()
        for old in [u for u in self.version_weights if self.keep_until.get(u, 0) <= r]:
            del self.version_weights[old]

    def evaluate(self, r: int) -> dict[str, float]:
        """Central and federated evaluation of the current global model."""
        if self.test_ref is None and self.fed_eval_ids is None:
            return {}
        n = len(self.pool)
        weights_ref = self._broadcast()
        pending: dict[str, tuple[str, list]] = {}

        def ranges(name: str, ref: Any, length: int) -> tuple[str, list]:
            bounds = np.linspace(0, length, n + 1).astype(int)
            return ("evaluate_range", [
                (slot, (weights_ref, ref, int(lo), int(hi)),
                 f"round {r} evaluation: {name} rows {lo}..{hi - 1}")
                for slot, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:], strict=True))
                if hi > lo])

        if self.test_ref is not None:
            pending["test"] = ranges("test", self.test_ref, self.test_len)
        for metric, (ref, length) in self.attack_tests.items():
            pending[metric] = ranges(metric, ref, length)
        if self.fed_eval_ids is not None:
            ids = self.fed_eval_ids
            groups = assign_balanced(ids, self.sizes_of(ids, "test"), n)
            # a part whose clients are evaluated with their own state (local parameters, a
            # personal model): each client's current version, as of this round, goes along
            # (all 0 for a part that keeps none: eval_weights then sees no state)
            v = self.versions
            own = evaluates_with_state(self.algorithm.client)
            pending["fed_test"] = ("evaluate_clients", [
                (slot, (weights_ref, g, r, self.personalize)
                 + ((tuple(a.tolist() for a in v.locate(g)) if v is not None
                     else ([0] * len(g), [-1] * len(g))) if own else ()),
                 f"round {r} evaluation: clients {g}")
                for slot, g in enumerate(groups) if g])
        out: dict[str, float] = {}
        per_client: dict[str, float] = {}  # after the pooled metrics in metrics.jsonl
        has_accuracy = correct_fn(self.cfg.model.loss) is not None  # regression (mse): none
        for prefix, (method, tasks) in pending.items():
            parts = list(self.pool.gather(method, tasks))
            if prefix in self.attack_tests:  # accuracy on its set is the attack's success
                out[prefix] = merge_sums(parts).accuracy
                continue
            sums = {prefix: merge_sums(parts)} if prefix == "test" else \
                self._client_evaluation(r, [row for rows in parts for row in rows],
                                        per_client)
            for name, s in sums.items():
                out[f"{name}_loss"] = s.mean_loss
                if has_accuracy:
                    out[f"{name}_accuracy"] = s.accuracy
        return out | per_client

    def _client_evaluation(self, r: int, rows: list[ClientEval],
                           out: dict[str, float]) -> dict[str, EvalSums]:
        """Federated evaluation's rows (one per client): the round's table written to the
        run directory, its per-client statistics into ``out``; returns the pooled sums
        (and the personalized ones), added in client-id order whatever the worker count."""
        table = client_table(rows, correct_fn(self.cfg.model.loss) is not None)
        self.run_dir.write_bytes(table_name(r), table_bytes(table))
        out.update(client_metrics(table))
        sums = {"fed_test": pooled(rows)}
        if rows and rows[0].global_sums is not None:  # each client's own model, and beside
            sums["fed_test_global"] = pooled(rows, "global_sums")  # it the global one's
        if self.personalize is not None:
            sums["fed_test_personalized"] = pooled(rows, "personalized")
        return sums

    def begin(self, carried: dict[str, Any] | None = None) -> dict[str, Any]:
        """Start the run's clock. Where the rounds start, and the rounds before that (a
        resumed run's, from its checkpoint): what fedray.run tells its callbacks.

        ``carried``: this driver takes over a run whose first rounds another driver ran
        (``runtime.backend: auto``, fedray.api): that driver's ``hand_over`` result. The
        run is then one run, not a resumed one: its clock and its summary go on."""
        self._run_start = self._checkpoint_t = time.perf_counter()
        if carried is not None:
            self._run_start -= carried["elapsed_s"]
            self.resumed_from = None
            self.handed_over = carried["round"]
            self.diverged_at = carried["diverged_at"]
        self._next_round = self.start_round
        if 1 < self.start_round <= self.cfg.rounds:  # resumed where a stage had ended it
            self.stopped_by = next((why for s in self.stages
                                    if (why := s.stop_reason(self.start_round))), None)
        return {"start_round": self.start_round, "resumed_from": self.resumed_from,
                "stopped_by": self.stopped_by,
                "past_metrics": [json.loads(line) for line in self.run_dir.metrics_lines]}

    def hand_over(self, r: int) -> dict[str, Any] | None:
        """After round ``r``, before another driver takes over the rest of the run
        (``runtime.backend: auto``): the checkpoint after round ``r``, written now if it was
        not due, is what that driver resumes from. Returns what its ``begin`` carries on
        with; None when the checkpoint cannot be written (non-finite weights under
        ``guard.non_finite: warn``), so the run stays with this driver."""
        if self.last_checkpoint != r:
            self._checkpoint(r)
        if self.last_checkpoint != r:
            return None
        return {"round": r, "elapsed_s": time.perf_counter() - self._run_start,
                "diverged_at": self.diverged_at}

    @names_part_errors(_parts)
    def run_round(self, r: int, with_weights: bool = False
                  ) -> tuple[dict[str, Any], dict[str, torch.Tensor] | None]:
        """Round ``r`` (the one after the last): train, evaluate when due, append its
        metrics and checkpoint when due. Returns its metrics and, when the caller's
        callbacks ask for it, the new global model as a state_dict.

        One call per round, rather than a stream of rounds: the caller decides after each
        round whether there is another (a callback can stop the run), so the driver never
        trains a round that is then thrown away."""
        c = self.cfg
        if r != self._next_round:  # a caller's bug: rounds are not independent
            raise FedrayError(f"round {r} asked of a driver whose next round is "
                              f"{self._next_round}")
        self._next_round += 1
        t0 = time.perf_counter()
        self.pool.begin_round()
        m: dict[str, Any] = {"round": r}
        m.update(self._train_round(r))
        self._check_finite(r, m)  # before anything of the round is evaluated or written
        train_s = time.perf_counter() - t0
        m["train_s"] = train_s
        m["updates_per_s"] = m["clients"] / train_s
        if is_eval_round(r, c.eval.every, c.rounds):
            m.update(self.evaluate(r))
            m["worker_failures"] = self.pool.round_failures
        m["wall_s"] = time.perf_counter() - t0
        m["elapsed_s"] = time.perf_counter() - self._run_start
        m["driver_mem_mb"] = private_mb()
        if r < c.rounds:  # a stage may end the run here: a privacy budget the next round spends
            self.stopped_by = next((why for s in self.stages if (why := s.stop_reason(r + 1))),
                                   None)
            if self.stopped_by:
                m["stopped_by"] = self.stopped_by
        self.run_dir.append_metrics(m)
        self.history.append(self._history_entry(m))
        every_s = c.checkpoint.every_s
        if r == c.rounds or (c.checkpoint.every and r % c.checkpoint.every == 0) or (
                every_s and time.perf_counter() - self._checkpoint_t >= every_s):
            self._checkpoint(r)
        return m, (self.state_dict() if with_weights else None)

    @names_part_errors(_parts)
    def finish(self, stopped_after: int | None = None) -> dict[str, Any]:
        """After the last round, or after round ``stopped_after`` when a callback stopped
        the run there (its checkpoint is written now if it was not due, so that
        ``--resume`` continues from it): the weights, the server state and the summary."""
        c = self.cfg
        if stopped_after is not None and self.last_checkpoint != stopped_after:
            self._checkpoint(stopped_after)
        summary = self._summary(time.perf_counter() - self._run_start, stopped_after)
        finite = _finite(self.weights)  # guard.non_finite=warn: nothing non-finite is written
        if c.output.save_weights and finite:
            self.run_dir.save_weights(self.state_dict())
            for name, flat in self.aggregator.models().items():  # IFCA's other clusters
                if _finite(flat):
                    self.run_dir.save_tensors(f"{MODELS_DIR}/{name}.safetensors",
                                              self.state_dict(flat))
        server = self.server_state()
        if finite and self._non_finite_state(server) is None:
            self.run_dir.save_tensors(SERVER_STATE_FILE, server)
        self.run_dir.write_json("summary.json", summary)
        return summary

    def _summary(self, total_s: float, stopped_after: int | None = None) -> dict[str, Any]:
        c = self.cfg
        history = self.history
        last = history[-1] if history else {}
        accs = [h["test_accuracy"] for h in history if "test_accuracy" in h]
        ups = [h["updates_per_s"] for h in history]
        final = {k: v for k, v in last.items() if k.startswith(("test_", "fed_test_", "clients_"))}
        return {
            "name": c.name, "rounds": c.rounds, "population": self.source.population,
            "algorithm": {"name": c.algorithm.name, **self.algorithm.names},
            "clients_per_round": c.sampling.clients_per_round, "num_workers": len(self.pool),
            "workers": self.workers_info(),
            "final": final, "best_test_accuracy": max(accs) if accs else None,
            "dropped_updates": sum(h.get("dropped_updates", 0) for h in history),
            "worker_failures": sum(h.get("worker_failures", 0) for h in history),
            "resumed_from_round": self.resumed_from,
            "handed_over_after_round": self.handed_over,
            "diverged_at_round": self.diverged_at,
            "run_id": self.run_id,
            "stopped_early_after_round": stopped_after,
            "stopped_by": self.stopped_by if stopped_after is not None else None,
            **({"stages": {s.name: s.summary() for s in self.stages}} if self.stages else {}),
            "total_s": total_s, "pool_start_s": self.pool_start_s,
            "vectorized": self.vectorized,
            "median_updates_per_s": float(np.median(ups)) if ups else None,
            "driver_mem_mb": private_mb(),
            "weights_file": WEIGHTS_FILE if c.output.save_weights and _finite(self.weights)
            else None,
            "fedray_version": __version__,
        }

    def server_state(self) -> dict[str, torch.Tensor]:
        """The server optimizer's, the aggregator's and the selector's state (momentum, Adam
        moments, a control variate, Oort's utilities), as flat tensors named
        ``server_opt.*``, ``aggregator.*`` and ``selector.*``;
        in buffered training also the model versions later steps start from
        (``buffered.v<N>``)."""
        out = {f"aggregator.{k}": v for k, v in self.aggregator.state_dict().items()}
        out |= {f"selector.{k}": v for k, v in self.selector.state_dict().items()}
        for stage in self.stages:
            out |= {f"stage.{stage.name}.{k}": v for k, v in stage.state_dict().items()}
        # buffered training: the model versions later steps' clients start from
        out |= {f"buffered.v{k}": w for k, w in self.version_weights.items()}
        for k, v in self.server_opt.state_dict().items():
            out[f"server_opt.{k}"] = v if isinstance(v, torch.Tensor) else torch.tensor(v)
        return out

    def state_dict(self, flat: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """The global model (or the flat weights ``flat`` of one of the model's size) as a
        state_dict."""
        self.template.load_(self.weights if flat is None else flat)
        return self.template.state_dict()
