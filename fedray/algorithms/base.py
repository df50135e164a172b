"""The public algorithm API: an algorithm is a client part, an aggregator and a server optimizer.

fedray's runtime (fedray/runtime/) knows no algorithm. It samples clients, ships one
broadcast per round, trains each worker's clients on one model replica (one after another,
or vectorized in groups), folds them into one partial sum per worker, merges the partials on
the driver and applies the server optimizer. What an algorithm adds is said through three
small classes, each family of algorithms in one module of this package, and a user's in
their own file (docs/algorithms.md, "Write your own algorithm"):

``ClientWork``  what a client does from the global model: its local training as a short
                list of ``Phase``s that fedray's kernels run (start point, trainable
                parameters, the extra terms of its objective -- ``LocalTerms``: a proximal
                pull, a linear correction --, a gradient transform, a client optimizer,
                where the result goes), the parameters that stay with the client
                (``local``), the per-client state it keeps in the client state store
                (``state``), the model each client is evaluated with (``eval_weights``),
                and what it adds to the partial sum after training (``finish``).
``Aggregator``  aggregation as an associative reduction: what each client contributes to its
                worker's ``PartialSum`` (``accumulate``), and, on the driver, the finishing
                step that turns the merged sum into the round's update (``finish``), with
                the aggregator's own server-side state (``state``), part of which it may
                broadcast to the clients each round (``broadcast``). One that cannot be a
                sum (a median, Krum) sets ``individual`` and gets every client's update at
                once (``aggregate``), within runtime.individual_updates_mb.
``ServerOptimizer`` (fedray.algorithms.server_opt) SERVEROPT: the next global model from the
                round's update, with ``state_dict`` / ``load_state_dict``.
``Selector``    who takes part (fedray.algorithms.selection): the round's clients from
                the server's knowledge of them, fed back each round (``ClientFeedback``:
                loss, examples, simulated duration, whether the update arrived in time).
``UpdateStage`` what happens to every client's update on its way up and to the round's sum
                before the aggregator finishes it, whatever the algorithm: clipping and
                noise (user-level DP), compression, secure aggregation's fixed-point sum.
                A job lists them in ``algorithm.stages``; they compose with every client
                part and aggregator that admits them.

Hyper-parameters are a dataclass per part (``Params``), read from ``algorithm.<section>`` of a
job and checked by the part (``check``), so a user's part gets the same one-line errors as a
built-in one. Parts are named in a job by a registered name or an import path
(``my_algos:FedDynClient``); fedray.algorithms.registry resolves both.

Why this split: it is what the seeds compose (Elastic aggregation with FedAvgM or FedProx,
Exp-alpha with FedAvgM, SCAFFOLD's client and server halves), and each piece maps onto one
place in the data path, so the runtime keeps its speed: the terms feed the sequential, the
torch.func and the closed-form kernels alike; contributions are summed on the worker; only
the finishing step runs once per round on the driver.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from fedray.algorithms.local_terms import (
    NO_TERMS,
    ClientOptimizer,
    ClipNorm,
    GradTransform,
    LocalTerms,
    LocalUpdate,
    Normalize,
    ParamError,
    finite_number,
    global_norm,
    require,
    require_length,
)
from fedray.algorithms.reduction import PartialSum
from fedray.core.evaluation import evaluate
from fedray.kernels.sequential import batch_schedule, local_sgd

__all__ = ["Aggregator", "Attack", "ClientContext", "ClientFeedback", "ClientOptimizer",
           "ClientRows", "ClientWork", "ClipNorm", "GradTransform", "LocalTerms", "LocalUpdate",
           "Normalize", "ParamError",
           "PartialSum", "Payload", "Phase", "RoundPlan", "SelectionContext", "Selector",
           "UpdateStage", "WorkerEnv",
           "evaluates_own_model", "evaluates_with_state", "finite_number", "global_norm",
           "require", "require_length"]


START = ("global", "previous")


@dataclass(frozen=True)
class Phase:
    """One stretch of a client's local training, run by fedray's own kernels (one client
    after another, or vectorized in groups). A client's work in a round is a short list of
    phases (``ClientWork.phases``), run in order:

    ``start``     where its weights start: ``"global"``, the broadcast model with the client
                  part's ``local`` parameters taken from the client's state (the broadcast
                  values for a client that has none yet); ``"previous"``, where the
                  previous phase ended; or a flat tensor of ``env.model.size`` values (a
                  stored personal model, a mix of the global body and the client's head).
    ``trainable`` parameter-name prefixes that train (``("head.",)``, or ``("fc2",)``);
                  the others stay as they started. None: every parameter trains.
    ``terms``     the extra gradient terms of its objective (``LocalTerms``); the
                  proximal pull is toward the broadcast model, the phase's anchor.
    ``steps``, ``epochs``, ``lr``  its local steps or passes and learning rate; None takes
                  the job's client section (``client.local_steps``/``local_epochs``/``lr``).
    ``transform`` a ``GradTransform`` applied to every step's gradient (terms included).
    ``optimizer`` a ``ClientOptimizer`` (None: plain SGD).
    ``send``      its result is the client's update: y - x, x the broadcast model, with
                  the ``local`` parameters zeroed (they are never averaged). Exactly one
                  phase of a client's list sends.
    ``keep``      a state key (listed in the part's ``state``) that receives the phase's
                  trained weights (flat, ``env.model.size`` values): a personal model.

    Phase i > 0 draws its batches and dropout masks from its own seed, derived from the
    client's round seed and i (fedray.core.seeding.TAG_PHASE); phase 0 from the round seed
    itself, as a single-phase client always has."""

    start: str | torch.Tensor = "global"
    trainable: tuple[str, ...] | None = None
    terms: LocalTerms = NO_TERMS
    steps: int | None = None
    epochs: int | None = None
    lr: float | None = None
    transform: GradTransform | None = None
    optimizer: ClientOptimizer | None = None
    send: bool = True
    keep: str | None = None


@dataclass
class WorkerEnv:
    """What the parts see of their worker: built once per worker (``setup``), updated with
    each round's broadcast."""

    model: Any  # fedray.core.flat_model.FlatModel: the worker's replica
    device: torch.device
    lr: float  # client.lr
    loss: str  # model.loss
    eval_batch_size: int
    batch_size_for: Callable[[int], int]  # the batch size a client of n examples trains with
    training: Any = None  # fedray.runtime.worker.LocalTraining: lr, batch size, local epochs/steps,
    # the loss -- what a part's own train() needs to honour the job's client section
    global_weights: torch.Tensor | None = None  # this round's broadcast model (flat)
    broadcast: dict[str, torch.Tensor] = field(default_factory=dict)  # Aggregator.broadcast
    seed: int = 0  # the job's seed: a part's per-client stream that must stay the same in
    # every round (Elastic's B_k) derives from (seed, tag, client id), never from a worker
    # (cid, split) -> a client's (x, y) as it trains or is tested on them ("train", "test"):
    # what ``eval_weights`` may measure a choice of model on (IFCA's cluster)
    client_split: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None

    @property
    def num_params(self) -> int:
        return self.model.num_params

    def trained_weights(self, update: LocalUpdate) -> torch.Tensor:
        """The client's trained weights, in the replica (a view of it): as training left
        them there if nothing has been loaded since (another part's measurement at the
        global model, say), else rebuilt as x + delta."""
        if not (update.in_replica and self.model.loads == update.replica_mark):
            # the whole model, float buffers included, as the delta is (the runtime checks
            # a part's own train() returns it so)
            self.model.load_(torch.add(self.global_weights, update.delta))
            update.in_replica, update.replica_mark = True, self.model.loads
        return self.model.flat

    def risk(self, weights: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> float:
        """The mean loss of ``weights`` on (x, y), in eval mode."""
        self.model.load_(weights)
        return evaluate(self.model.module, x, y, self.eval_batch_size, self.device,
                        self.loss).mean_loss

    # -- for a part's own train(): fedray's seeded schedule and kernel --------------------

    def batches(self, ctx: ClientContext, steps: int | None = None,
                epochs: int | None = None, *, seed: int | None = None,
                full_batch: bool = False) -> list[torch.Tensor]:
        """The example indices (on ``device``) of each of the client's local steps, in
        order: the batch schedule fedray's kernels train it with (fedray.kernels.sequential.
        batch_schedule), drawn from ``seed`` (None: ``ctx.seed``, the client's round seed)
        with ``ctx.batch_size``. ``steps`` or ``epochs`` replace the job's
        ``client.local_steps`` / ``local_epochs``. Being a function of (seed, round, client)
        only, a loop over it visits the same batches on any worker, at any worker count."""
        epochs, steps_ = self.training.passes(steps, epochs)
        return batch_schedule(len(ctx.y), ctx.batch_size, epochs, steps_,
                              ctx.seed if seed is None else seed, full_batch, self.device)

    def local_sgd(self, ctx: ClientContext, phase: Phase | None = None, *,
                  weights: torch.Tensor | None = None, seed: int | None = None,
                  full_batch: bool = False) -> LocalUpdate:
        """One stretch of local training of the client by fedray's sequential kernel
        (fedray.kernels.sequential.local_sgd), for a part that writes its own ``train``: the
        job's client section (``env.training``: lr, local epochs or steps, the loss) at
        ``ctx.batch_size``, the batches and dropout masks of ``seed`` (None: ``ctx.seed``),
        and ``ctx.terms``. Without a ``phase`` and ``weights`` it is float for float what
        the runtime's own sequential training of the client computes.

        ``phase`` (Phase) says the start, trainable parameters, terms, steps or epochs, lr,
        gradient transform and optimizer instead (``optimizer.state`` tensors are read from
        ``ctx.state`` and returned in ``LocalUpdate.opt_state``: the part's ``finish``
        stores them). ``weights`` (flat, ``model.size``) is where training starts, ahead of
        the phase's ``start``: ``"global"`` is ``env.global_weights`` as broadcast (no
        ``local`` parameters put in: pass ``weights`` for that), ``"previous"`` the
        replica as the last call left it. The update's ``delta`` is always the trained
        weights minus ``env.global_weights`` (a fresh tensor), and a proximal term pulls
        toward ``env.global_weights``; the trained weights stay in the replica
        (``in_replica``). ``send`` and ``keep`` mean nothing here: what the update becomes
        is the part's ``train`` and ``finish``'s to say."""
        t = self.training
        ph = Phase(terms=ctx.terms) if phase is None else phase
        if weights is None:
            if isinstance(ph.start, torch.Tensor):
                weights = ph.start
            elif ph.start == "previous":
                weights = self.model.flat.clone()
            elif ph.start != "global":
                raise ValueError(f"phase start must be 'global', 'previous' or a tensor, "
                                 f"got {ph.start!r}")
        if weights is not None and weights.numel() != self.model.size:
            raise ValueError(f"local_sgd: weights has {weights.numel()} values for a model "
                             f"of {self.model.size}")
        epochs, steps = t.passes(ph.steps, ph.epochs)
        extra: dict[str, Any] = {}  # the phase's hooks: only when used (the plain loop else)
        if weights is not None:
            extra["start"] = weights.to(self.device)
        if ph.trainable is not None:
            extra["trainable"] = self.model.trainable(ph.trainable)
        if ph.transform is not None:
            extra["transform"] = ph.transform
        if ph.optimizer is not None and ph.optimizer.kind != "sgd":
            extra["optimizer"] = ph.optimizer
            keys = ph.optimizer.state_keys()
            if keys and ctx.state is not None:
                extra["opt_state"] = {k.rsplit(".", 1)[1]: ctx.state[k] for k in keys
                                      if k in ctx.state}
        update = local_sgd(self.model, self.global_weights, ctx.x, ctx.y,
                           lr=t.lr if ph.lr is None else ph.lr, batch_size=ctx.batch_size,
                           local_epochs=epochs, local_steps=steps,
                           seed=ctx.seed if seed is None else seed,
                           delta_out=torch.empty_like(self.model.flat), terms=ph.terms,
                           full_batch=full_batch, loss=t.loss, precision=t.precision,
                           **extra)
        update.in_replica, update.replica_mark = True, self.model.loads
        return update


@dataclass
class ClientContext:
    """One client in one round, as the parts see it on the worker. ``x``, ``y`` and
    ``batch_size`` are what it trains on (an aggregator's ``prepare`` may hold examples out);
    ``state`` is its per-client state as of the round (None: it has none yet); ``scratch``
    carries whatever a part computes before training and needs after it."""

    cid: int
    round: int
    seed: int  # the client's seed for this round, from (seed, round, client id)
    x: torch.Tensor
    y: torch.Tensor
    batch_size: int
    version: int = 0  # the version of its stored state (0: none yet)
    # server steps applied since the model it trains from (buffered asynchronous training,
    # sampling.concurrency; 0 in synchronous rounds)
    staleness: int = 0
    state: dict[str, torch.Tensor] | None = None
    terms: LocalTerms = NO_TERMS
    scratch: dict[str, Any] = field(default_factory=dict)
    # per-client values of the round a part records (the cluster it chose: IFCA), written
    # to the round's participants table (fedray.tracking.participants); names declared in
    # the part's ``columns``
    columns: dict[str, float] = field(default_factory=dict)


class Part:
    """What client parts, aggregators and server optimizers share: a registered ``name``,
    typed hyper-parameters (``Params``, a dataclass, read from ``algorithm.<section>``) and a
    check of them."""

    name: ClassVar[str] = ""
    section: ClassVar[str | None] = None  # the config section of its Params
    Params: ClassVar[type | None] = None

    def __init__(self, params: Any = None):
        if params is None and self.Params is not None:
            params = self.Params()
        self.params = params
        if params is not None:
            self.check(params)

    def check(self, params: Any) -> None:
        """Raise ``ParamError`` (``require``) for a value the part cannot work with."""

    def describe(self) -> dict[str, Any]:
        """Its hyper-parameters, as recorded in config.yaml."""
        return dataclasses.asdict(self.params) if self.params is not None else {}

    def check_model(self, model: Any) -> None:
        """On the driver, once, before any worker starts: refuse a model (a
        fedray.core.flat_model.FlatModel of the job's model) the part cannot work with --
        a head that selects nothing, say -- by raising ``ParamError`` for the field at
        fault, which the run reports as ``config key 'algorithm.<section>.<field>'``."""

    def setup(self, env: WorkerEnv) -> None:
        """On each worker, once: allocate buffers the size of the model, say."""


class ServerState:
    """A driver-side part's ``state`` (tensors: a control variate, an adaptive clip) as the
    checkpoint saves and a resume restores it."""

    kind: ClassVar[str] = "part"  # how errors name it

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in getattr(self, "state", {}).items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        own = getattr(self, "state", {})
        missing = set(own) - set(state)
        if missing:
            raise ValueError(f"{self.kind} {self.name}: state lacks {sorted(missing)}")
        self.state = {k: state[k].clone() for k in own}


class ClientWork(Part):
    """What a client does with the global model x in a round.

    Override ``terms`` to add terms to the local objective, or ``phases`` for more (a start
    of its own, frozen or local parameters, a gradient transform, a client optimizer, a
    second model): the runtime's kernels then train the client, vectorized where the model
    allows. Override ``train`` only for local work no phase can say (the client then trains
    one after another, and the run says so once; ``env.batches`` and ``env.local_sgd`` give
    it fedray's seeded schedule and kernel). ``finish`` runs after the client's
    contribution is in the partial sum; what it returns becomes the client's state
    (``state`` names its tensors)."""

    part_kind: ClassVar[str] = "client"  # its kind in the registry (fedray.algorithms.registry)

    state: ClassVar[tuple[str, ...]] = ()  # per-client state tensors, in the state store
    full_batch: ClassVar[bool] = False  # one step on all of the client's data (FedSGD)
    # every local step draws its own batch (batch_schedule's independent): what the
    # simulated clock (clock.enabled) counts as the examples an update touches
    independent_batches: ClassVar[bool] = False
    uses_broadcast: ClassVar[tuple[str, ...]] = ()  # Aggregator.broadcast keys it reads
    extras: ClassVar[dict[str, str]] = {}  # extra sums it adds: name -> "params" (one value
    # per model parameter) -- see Aggregator.extras
    allows_zero_lr: ClassVar[bool] = False  # client.lr = 0 is meaningful for it (every
    # gradient taken at the global model, as LOCALUPDATE's gamma = 0); else client.lr > 0

    # parameter-name prefixes (buffers included: a BatchNorm layer's statistics) that stay
    # with the client: never sent up (zero in its update, so never averaged), kept in the
    # client state store under the key "local" (flat, those values in model order), and
    # put in place of the broadcast ones at a "global" phase start and at evaluation
    local: ClassVar[tuple[str, ...]] = ()
    # per-client values it records in ``ctx.columns`` while training (and returns from
    # ``eval_columns`` at evaluation): columns of the round's participants table and of
    # federated evaluation's per-client table
    columns: ClassVar[tuple[str, ...]] = ()

    def terms(self, env: WorkerEnv, ctx: ClientContext) -> LocalTerms:
        return LocalTerms()

    def phases(self, env: WorkerEnv, ctx: ClientContext) -> list[Phase]:
        """The client's local training in this round, as phases fedray's kernels run
        (``Phase``). The default is one phase from the global model with ``terms``."""
        return [Phase(terms=self.terms(env, ctx))]

    def eval_weights(self, env: WorkerEnv, cid: int,
                     state: dict[str, torch.Tensor] | None) -> torch.Tensor | None:
        """The weights (flat, ``env.model.size``) client ``cid`` is evaluated with, from the
        broadcast model (``env.global_weights``) and its stored ``state`` (None: it has
        never trained). None: the broadcast model with the ``local`` parameters from its
        state -- what federated evaluation and ``eval.personalize`` then start from. A
        personal-model algorithm returns the stored personal model here."""
        return None

    def eval_columns(self, env: WorkerEnv, cid: int) -> dict[str, float]:
        """Per-client values (names in ``columns``) for federated evaluation's table, called
        right after ``eval_weights`` for the same client: what it chose there, say."""
        return {}

    def eval_phase(self, env: WorkerEnv) -> Phase | None:
        """Local training every evaluated client does on its own training split, from its
        ``eval_weights``, before it is evaluated: Per-FedAvg's one step of adaptation
        (``Phase(steps=1, lr=alpha)``). Run by the sequential kernel from the client's
        adaptation seed for the eval round (its own stream: it shifts no training draw);
        the ``start``, ``send`` and ``keep`` of the phase mean nothing here, and nothing it
        trains is kept. None: clients are evaluated as ``eval_weights`` says."""
        return None

    # a part's own local training, in place of the phases: the worker calls it after
    # torch.manual_seed(ctx.seed), so the loop's torch draws (dropout, shuffles) come from
    # the client's round seed whatever worker trains it; it owns everything the phases
    # would do (``local`` parameters included: the update it returns is sent as it is)
    train: Callable[[WorkerEnv, ClientContext], LocalUpdate] | None = None

    def finish(self, env: WorkerEnv, ctx: ClientContext, update: LocalUpdate,
               acc: PartialSum) -> dict[str, torch.Tensor] | None:
        """After the client is folded in (not for a dropped update): its new state, if any."""
        return None


def evaluates_with_state(client: ClientWork) -> bool:
    """Whether federated evaluation builds each client's model from its stored state: the
    part keeps ``local`` parameters or says its clients' weights (``eval_weights``). Else
    every client is evaluated with the global model, reading no state."""
    return bool(client.local) or type(client).eval_weights is not ClientWork.eval_weights


def evaluates_own_model(client: ClientWork) -> bool:
    """Whether each evaluated client has a model of its own (from its state, or adapted on
    its data: ``ClientWork.eval_phase``), so that federated evaluation measures it and, beside
    it, the global model."""
    return evaluates_with_state(client) or type(client).eval_phase is not ClientWork.eval_phase


class Aggregator(ServerState, Part):
    """The round's reduction: each client's contribution to its worker's partial sum, and
    the driver's finishing step with the aggregator's server-side state.

    A PartialSum is sum_k w_k v_k with sum_k w_k (log-scaled, for softmax weights) plus
    named extra sums (``extras``: name -> "params" for one value per model parameter, or an
    int length); merging two is associative, so any split of clients over workers gives the
    same result up to float64 rounding."""

    part_kind: ClassVar[str] = "aggregator"  # its kind in the registry (fedray.algorithms.registry)

    kind = "aggregator"
    extras: ClassVar[dict[str, str | int]] = {}  # extra sums it adds itself
    # every client adds its update as it is, with weight 1, and nothing else: a client's
    # influence on the sum is then bounded by its update's norm (what user-level DP's
    # sensitivity and secure aggregation's fixed-point sum need; UpdateStage.needs_unit_weights)
    unit_weights: ClassVar[bool] = False
    requires_extras: ClassVar[tuple[str, ...]] = ()  # extra sums a client part must add
    # per-client values a client part must record (ClientWork.columns) for it to read in
    # ``accumulate`` (IFCA's cluster), checked when the job is resolved
    requires_columns: ClassVar[tuple[str, ...]] = ()
    # per-client values it records in ``ctx.columns`` in ``accumulate`` (Exp-alpha's log
    # weight): columns of the round's participants table when the run writes one
    # (output.participants), so what it decided per client can be looked at afterwards
    columns: ClassVar[tuple[str, ...]] = ()
    provides: ClassVar[tuple[str, ...]] = ()  # the keys of its broadcast
    # it moves models of its own by the plain average (IFCA's K models): the global one
    # must move the same way, so the job's server optimizer must be sgd at server.lr 1
    plain_server: ClassVar[bool] = False
    population: int = 1

    # -- on the workers -------------------------------------------------------------------

    def prepare(self, env: WorkerEnv, ctx: ClientContext) -> None:
        """Before the client trains, e.g. hold out examples to measure on."""

    def weight(self, update: LocalUpdate) -> float:
        """A client's weight in the mean: its example count (the default)."""
        return float(update.num_examples)

    def accumulate(self, env: WorkerEnv, ctx: ClientContext, update: LocalUpdate,
                   acc: PartialSum) -> None:
        """Fold one trained client into the partial sum (it has examples, and the guard
        admitted its update)."""
        acc.add(update.delta, self.weight(update))

    # every client's update reaches the driver, and ``aggregate`` computes the round's
    # update from all of them at once (a median, a trimmed mean, Krum): opt-in, as the
    # driver must hold k x d float32 values (runtime.individual_updates_mb bounds them)
    individual: ClassVar[bool] = False
    # set by ``aggregate`` (an individual aggregator that defends): each row's share of the
    # round's update, float64 [k], summing to 1 (the plain mean: 1/k each; Krum: 1 for the
    # chosen row). A row below half its fair share (1/k) counts as discarded or
    # down-weighted in the run's defense precision and recall (docs/robustness.md)
    influence: torch.Tensor | None = None
    # clients whose updates the aggregator takes as the server's own (FLTrust's root data
    # set): a run's threat model never makes them malicious, nor scores them as discarded
    trusted: tuple[int, ...] = ()

    # -- on the driver --------------------------------------------------------------------

    def aggregate(self, updates: torch.Tensor, clients: ClientRows,
                  acc: PartialSum) -> torch.Tensor:
        """With ``individual``: the round's update (float64, one value per model entry)
        from ``updates``, a (k, d) float32 view of the k kept clients' updates (after the
        update stages), row i client ``clients.ids[i]``, in the round's sampled order;
        ``acc`` holds the extra sums the parts added (its mean is not set). May update
        ``state``. ``updates`` is the driver's buffer, written over by the next round's
        rows: copy what you keep beyond this call (its rows may also be changed in
        place, as a sort does)."""
        raise NotImplementedError(f"aggregator {self.name} sets individual but has no "
                                  "aggregate()")

    def check_plan(self, plan: RoundPlan) -> None:
        """On the driver, once, before round 1: refuse (``ParamError``, for the field at
        fault) a round size the aggregator's guarantee forbids -- Krum with
        ``plan.clients_per_round`` <= 2f + 2, say."""

    def init_server(self, num_params: int, population: int) -> None:
        """Once, on the driver: size the server-side state."""
        self.population = population
        self.state: dict[str, torch.Tensor] = {}

    def init_weights(self, weights: torch.Tensor,
                     model_init: Callable[[int], torch.Tensor]) -> None:
        """Once, on the driver, after ``init_server`` (a resume then loads ``state`` over
        it): the global model's initial ``weights`` (flat), and ``model_init(j)``, the job's
        model freshly initialized from the run's stream j (flat float32): an aggregator
        that trains several models (IFCA) draws its others here."""

    def broadcast(self) -> dict[str, torch.Tensor]:
        """What the clients read of the server state each round (e.g. SCAFFOLD's c)."""
        return {}

    def models(self) -> dict[str, torch.Tensor]:
        """Models it trains beside the global one (IFCA's clusters 1..K-1), by name, as flat
        weights of the model's size: the run saves each as ``models/<name>.safetensors``, a
        state_dict like model.safetensors."""
        return {}

    def finish(self, acc: PartialSum) -> torch.Tensor:
        """The round's update (float64) from the merged partial sum; may update ``state``."""
        return acc.mean()

    def round_metrics(self) -> dict[str, float]:
        """Scalars the last ``finish`` measured, added to the round's line of metrics.jsonl
        (e.g. Elastic's share of boosted parameters). Name them after the part
        (``elastic_...``) so they never shadow the runtime's keys; a round without a
        ``finish`` (no examples) records none."""
        return {}



@dataclass(frozen=True)
class ClientRows:
    """Who the rows of an individual aggregator's (k, d) updates are: per row, the client's
    id, its training example count and its mean training loss over its local steps."""

    ids: torch.Tensor  # int64 [k]
    num_examples: torch.Tensor  # int64 [k]
    losses: torch.Tensor  # float64 [k]


@dataclass(frozen=True)
class RoundPlan:
    """What the driver's stages know of the run before it starts: how clients are sampled
    (what a privacy accountant and a fixed denominator need) and the model's size."""

    seed: int
    population: int
    clients_per_round: int  # sampling.clients_per_round: exactly k, or k expected (poisson)
    sampling: str  # sampling.mode: fixed | poisson
    rounds: int
    num_params: int
    dropout: float = 0.0  # sampling.dropout
    always: tuple[int, ...] = ()  # sampling.always: clients in every round

    @property
    def rate(self) -> float:
        """The chance that a given client takes part in a round (q)."""
        return self.clients_per_round / self.population


@dataclass(frozen=True)
class Payload:
    """What one client's update costs on the uplink, as the stages encode it: ``values``
    numbers of ``value_bits`` each, with ``index_bits`` of position each (sparse updates),
    plus ``overhead_bytes`` (a scale, a norm). Uncompressed: every parameter in float32."""

    values: int
    value_bits: int = 32
    index_bits: int = 0
    overhead_bytes: int = 0
    dense: int = 0  # the update's full length (a stage that must send it densely: secagg)

    @property
    def bytes(self) -> int:
        return -(-self.values * (self.value_bits + self.index_bits) // 8) + self.overhead_bytes


class UpdateStage(ServerState, Part):
    """A stage every trained client's update passes through before the aggregator folds it
    into the partial sum (on the worker), and that the round's merged sum passes through
    before the aggregator finishes it (on the driver).

    Stages are listed in ``algorithm.stages`` and run in that order on each client's update
    (clip, then quantize, say); on the driver their ``finish_sum`` runs in reverse order, as
    layers unwrap (a secure sum is decoded before noise is added to it). Like the other
    parts a stage may keep per-client state in the client state store (an error-feedback
    residual: ``client_state``), add extra sums (``extras``: the count of unclipped clients),
    broadcast part of its server state to the clients (``provides``), and measure the round
    (``round_metrics``). A client's update here is ``update.delta``, which a stage changes
    in place or replaces; the aggregator's weighting comes after."""

    part_kind: ClassVar[str] = "stage"  # its kind in the registry (fedray.algorithms.registry)

    kind = "stage"
    # per-client state tensors, in the client state store (name them after the stage: a
    # client's state file holds the client part's tensors too); server state is ``state``
    # (these three may be set per instance, from the stage's Params)
    client_state: tuple[str, ...] = ()
    extras: dict[str, str | int] = {}  # extra sums it adds: name -> "params" | n  # noqa: RUF012
    provides: ClassVar[tuple[str, ...]] = ()  # the keys of its broadcast
    # it needs the aggregator to add updates as they are (Aggregator.unit_weights): DP's
    # clipping bounds a client's influence only then, a fixed-point sum holds only them
    needs_unit_weights: bool = False
    # it bounds what a client reveals only if the client part adds nothing of its own to
    # the sum and keeps no state derived from its data outside this stage (e.g. DP)
    needs_plain_client: ClassVar[bool] = False
    # the fewest clients a worker's partial sum may hold (secure aggregation); 1: any
    min_clients_per_partial: int = 1

    # -- on the workers -------------------------------------------------------------------

    def client_update(self, env: WorkerEnv, ctx: ClientContext, update: LocalUpdate,
                      acc: PartialSum) -> dict[str, torch.Tensor] | None:
        """Transform ``update.delta`` (the guard admitted it); return this stage's new state
        for the client (its ``client_state`` tensors), if it keeps any. ``ctx.state`` holds
        the client's stored state as of the round (None before its first)."""
        return None

    def payload(self, before: Payload) -> Payload:
        """What a client's update costs to send after this stage (``before``: after the
        stages ahead of it)."""
        return before

    # -- on the driver --------------------------------------------------------------------

    def init_server(self, plan: RoundPlan) -> None:
        """Once, on the driver, before round 1 (and before a resume loads ``state``)."""
        self.plan = plan
        self.state: dict[str, torch.Tensor] = {}

    def broadcast(self) -> dict[str, torch.Tensor]:
        return {}

    def merge(self, acc: PartialSum, part: Any) -> None:
        """Fold a worker's partial sum (a PartialMessage) into the round's sum; a stage
        that must not reveal small sums (secure aggregation) holds it back instead."""
        acc.merge(part)

    def close(self, acc: PartialSum, round_idx: int) -> str | None:
        """After the last worker's partial: fold in what ``merge`` held back; a reason when
        the round's sum must not be used (too few clients for a secure sum)."""
        return None

    def finish_sum(self, acc: PartialSum, round_idx: int) -> None:
        """The merged sum before the aggregator finishes it: add noise, fix the
        denominator, decode a fixed-point sum."""

    def round_metrics(self) -> dict[str, float]:
        """Scalars of the round, named after the stage (``dp_epsilon``)."""
        return {}

    def stop_reason(self, next_round: int) -> str | None:
        """Why the run must end before ``next_round`` (a privacy budget spent), or None."""
        return None

    def summary(self) -> dict[str, Any]:
        """What summary.json records of the stage at the end of the run."""
        return {}



def extra_sizes(parts: tuple[Part, ...], num_params: int) -> dict[str, int]:
    """The extra sums the parts add to a partial sum, with their lengths."""
    out: dict[str, int] = {}
    for part in parts:
        for k, v in getattr(part, "extras", {}).items():
            out[k] = num_params if v == "params" else int(v)
    return out


class Attack(Part):
    """What the job's malicious clients do (the ``adversary`` section: docs/robustness.md).

    The runtime decides who is malicious (a fraction of the population fixed per (seed,
    client id), or a list of ids) and calls an attack's hooks for those clients only, at
    the three places an attacker can act -- so that an attack is a few lines against this
    class, and every defense meets it unchanged:

    ``poison_data``    on the worker, the client's training data for the round, before it
                       trains (label flipping, a backdoor trigger): data poisoning.
    ``poison_update``  on the worker, the client's trained update, before the guard, the
                       update stages and the aggregator see it (sign flip, boosting,
                       noise): model poisoning by a client that knows only itself.
    ``poison_rows``    on the driver, the round's individual updates (``omniscient``):
                       the malicious rows rewritten from the benign ones (ALIE, IPM), as
                       those papers' attacker, who sees every update, is assumed to. Needs
                       an individual aggregator (``mean`` is FedAvg's).

    ``poison_test`` says how the attack's success is measured: the central test set made
    into one on which accuracy is the attack's success (a backdoor's triggered inputs of
    the other classes, labelled with its target), reported as ``test_attack_success``.

    Randomness comes from ``ctx.seed`` (the client's round seed: (seed, round, client id))
    or the (seed, round) given, never from a worker's state, so the attack is the same at
    any worker count and on resume."""

    part_kind: ClassVar[str] = "attack"  # its kind in the registry (fedray.algorithms.registry)

    kind = "attack"
    omniscient: ClassVar[bool] = False  # rewrites rows on the driver (poison_rows)

    def check_data(self, input_shape: tuple[int, ...], num_classes: int,
                   test_x: Any = None) -> None:
        """On the driver, before round 1: refuse (``ParamError``) data the attack cannot
        work on -- a target class the data lacks, a trigger on inputs that are not
        images -- and keep what the hooks need of the data (``test_x``: the central test
        set's inputs, numpy, or None without one)."""

    def poison_data(self, env: WorkerEnv, ctx: ClientContext) -> None:
        """Replace ``ctx.x`` / ``ctx.y`` (read-only tensors: make new ones) with the data a
        malicious client trains on this round."""

    def poison_update(self, env: WorkerEnv, ctx: ClientContext, update: LocalUpdate) -> None:
        """Replace ``update.delta`` (a new tensor: the kernel's buffer is reused) with what
        the malicious client sends."""

    def poison_rows(self, updates: torch.Tensor, malicious: torch.Tensor,
                    clients: ClientRows, seed: int, round_idx: int) -> None:
        """With ``omniscient``: rewrite, in place, the rows of ``updates`` ((k, d) float32,
        the round's individual updates in sampled order) where ``malicious`` (bool [k]) is
        set, from the others."""

    def poison_test(self, x: Any, y: Any) -> tuple[Any, Any] | None:
        """The central test set (numpy x, y) made into one on which accuracy measures the
        attack's success, or None: the attack has no such measure."""
        return None



@dataclass(frozen=True)
class SelectionContext:
    """What a ``Selector`` may ask of the runtime while it picks round ``round``'s clients.

    ``sample(n, exclude=())``: n distinct clients drawn uniformly among those eligible (online
    at ``start_s`` when clock.enabled) and not in ``exclude``, sorted; from the round's own
    stream of (seed, round), so the draw is the same on every worker count and after a
    resume. Without ``exclude`` it is exactly the draw fedray has always made (the plain
    sampler's), which is what keeps ``uniform`` bit-identical to it; with ``exclude`` it
    returns fewer than n when fewer eligible clients are left (or can be found online).
    Call it once a round: a second call draws from the same stream again.
    ``probe(ids, share)``: the global model's mean loss on each client's training data
    (a forward pass on the workers). On the simulated clock the round then starts when
    the slowest probed client has answered: model down plus ``share`` of a training
    example's compute per example (fedray.timing.rounds.RoundClock.probe_s).
    ``durations(ids)``: each client's simulated update seconds (None without the clock).
    ``online(ids)``: which of them are online at ``start_s`` (None without the clock: all).
    ``rng``: the selector's own generator for the round, from (seed, round)."""

    round: int
    k: int  # clients to invite: clients_per_round, or more with sampling.over_selection
    population: int
    seed: int
    start_s: float  # the round's simulated start (0 without the clock)
    sample: Callable[..., np.ndarray]
    probe: Callable[..., np.ndarray]
    durations: Callable[[np.ndarray], np.ndarray] | None
    online: Callable[[np.ndarray], np.ndarray] | None
    rng: np.random.Generator


@dataclass(frozen=True)
class ClientFeedback:
    """What the runtime reports back to a ``Selector`` after round ``round``, one entry per
    invited client (aligned arrays, sorted by id). ``arrived``: trained and aggregated (in
    time for the round, not dropped, not late); ``loss``: its mean training loss over its
    local steps (NaN where it did not train); ``duration_s``: its update's simulated
    seconds (NaN without the clock); ``examples``: its training examples."""

    round: int
    ids: np.ndarray  # int64
    arrived: np.ndarray  # bool
    loss: np.ndarray  # float64
    duration_s: np.ndarray  # float64
    examples: np.ndarray  # int64
    round_s: float  # the round's simulated duration (NaN without the clock)


class Selector(ServerState, Part):
    """Who takes part in a round (``algorithm.selector``; fedray.algorithms.selection).

    The runtime asks ``select`` for the round's invitees, then runs them as it runs any
    sample (dropout, over-selection and the deadline on the clock decide who arrives), and
    after the round hands ``feedback`` what each invited client reported. A selector's
    knowledge of clients is its ``state``: tensors (sparse, over the clients it has seen,
    never the population) that the checkpoint saves and a resume restores. Its randomness
    comes from ``ctx.rng`` and ``ctx.sample`` only, so its choice is a function of (seed,
    round, its state): the same at any worker count."""

    part_kind: ClassVar[str] = "selector"  # its kind in the registry (fedray.algorithms.registry)

    kind = "selector"
    # the runtime gathers each invited client's loss and examples for ``feedback`` (k
    # numbers a worker, beside its partial sum); False: feedback is never called
    wants_feedback: ClassVar[bool] = True

    def init_server(self, plan: RoundPlan) -> None:
        """Once, on the driver, before round 1 (and before a resume loads ``state``)."""
        self.state: dict[str, torch.Tensor] = {}

    def select(self, ctx: SelectionContext) -> np.ndarray:
        """The round's ``ctx.k`` invitees: distinct client ids in [0, population)."""
        raise NotImplementedError(f"selector {self.name} has no select()")

    def feedback(self, fb: ClientFeedback) -> None:
        """After the round: learn from what the invited clients reported."""

    def round_metrics(self) -> dict[str, float]:
        """Scalars of the last selection (name them after the selector: ``oort_...``)."""
        return {}
