"""Personal models: every client keeps a whole model of its own beside the global one.

``ditto``  Li, Hu, Beirami, Smith, "Ditto: Fair and Robust Federated Learning Through
           Personalization", ICML 2021, Algorithm 1.
``apfl``   Deng, Kamani, Mahdavi, "Adaptive Personalized Federated Learning", 2020
           (arXiv:2003.13461), Algorithm 1.
``pfedme`` T. Dinh, Tran, Nguyen, "Personalized Federated Learning with Moreau Envelopes",
           NeurIPS 2020, Algorithm 1.

Each preset keeps its per-client tensors in the client state store (versioned: a resume and
any worker count see the same personal models) and evaluates every client with its own
model (``eval_weights``), the global model's numbers beside it (docs/evaluation.md). A
personal model is one model-sized tensor per client that has trained: mind the store's size
for a large population (``fedray run`` prints its estimate before round 1).

Ditto. In a round, client k is sent w^t and

1. trains the global model as FedAvg's local solver does (the job's ``client`` section) and
   sends the update; the server averages the updates (``proportional``), as FedAvg;
2. trains its personal model v_k (stored; a client without one starts from w^t, as the
   paper's Algorithm 1 leaves open and FL-bench and PFLlib do) by local SGD on
   f_k(v) + lam/2 ||v - w^t||^2, sending nothing.

lam sets how far a personal model strays from the global one: 0 is local training alone,
lam -> infinity pins v_k to w^t. The personal phase's ``steps`` or ``epochs`` and ``lr``
default to the client section's (as many personal steps as global ones). Both phases are
``Phase``s that fedray's kernels run, vectorized where the model allows; the personal phase
draws its batches from its own stream (derived from the client's round seed), so it never
shifts the global phase's.

APFL. Client k keeps a local model v_k and a mixing weight alpha_k (state ``personal`` and
``alpha``, shape [1]); its personalized model is vbar_k = alpha_k v_k + (1 - alpha_k) w. In
a round it starts w from w^t, v from its stored v_k (w^t in its first round) and alpha from
its stored alpha_k (``algorithm.apfl.alpha`` in its first round), and at every local step,
on the step's batch xi and with the values before the step:

    g_w = grad f(w; xi),   vbar = alpha v + (1 - alpha) w,   g = grad f(vbar; xi)
    w <- w - lr g_w,   v <- v - lr alpha g    (grad_v f(vbar) = alpha g)
    alpha <- clip(alpha - alpha_lr <v - w, g>, 0, 1)    (with ``adaptive``: d f(vbar)/d alpha)

lr is client.lr, alpha_lr ``algorithm.apfl.alpha_lr`` (unset: client.lr). It sends w - w^t,
which the server averages by example counts as FedAvg (``proportional``, fedray's choice;
``algorithm.aggregator=uniform`` weighs every client 1); v_k and alpha_k are stored. A client
is evaluated with alpha_k v_k + (1 - alpha_k) w, w the current global model: the paper mixes
v_k with the client's own local w, which fedray does not keep between rounds (it would be a
second model-sized tensor per client), so fedray's choice is the broadcast model -- the
model the client would start its next round from. (PFLlib's clientAPFL mixes with the
client's w as its last round left it; FL-bench's APFLClient mixes the two models' outputs
rather than their weights.) Float buffers (BatchNorm's running statistics) are not trained
by gradients: w keeps those of its own forward passes, v those of the forward passes at
vbar (the only model v runs as), and evaluation mixes them as the weights, alpha_k v_k +
(1 - alpha_k) w.

pFedMe. From w^t the client sets its local model w = w^t and, for each of its R local steps
(the job's client section: ``client.local_steps``, or ``local_epochs`` passes of batches),
on the step's batch D, approximately solves theta = argmin f(theta; D) + lam/2
||theta - w||^2 by K (``inner_steps``) gradient steps at ``personal_lr``, then moves
w <- w - lr lam (w - theta) (lr = client.lr). It sends w - w^t. The server's
w <- (1 - beta) w + beta mean_k w_k is the mean of the round's deltas at server learning
rate beta: beta is ``server.lr`` (1, the plain mean, by default). Algorithm 1 averages the
sampled clients' models with equal weights, so the preset aggregates ``uniform`` (the
authors' code, CharlieDinh/pFedMe, weighs them by training examples instead). theta starts
each round at w^t and is carried from one local step to the next (the paper does not say
where the inner solver starts; the authors' code does this). theta is stored as
``personal``, the personalized model the paper evaluates, and each client is evaluated with
it. In the paper (and the authors' code) every client trains every round and only the
sampled ones send; fedray trains the sampled clients only, so a client's theta is the one
of its last sampled round. lr lam < 2 and personal_lr (L + lam) < 2 (L the loss's
smoothness) keep the two steps stable. Float buffers: theta's come from its own forward
passes, and w takes theta's after every local step (w is never run), so the update's buffer
part is the client's statistics, averaged as FedAvg averages them.

Both have their own ``train`` (two models that step together on one batch, or an inner
solve inside every local step: no ``Phase`` says either), so their clients train one after
another on the worker's replica, never in vectorized groups, on fedray's seeded batch
schedule (``env.batches``: the same batches on any worker, at any worker count).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedray.algorithms.base import (
    ClientContext,
    ClientWork,
    LocalTerms,
    LocalUpdate,
    PartialSum,
    Phase,
    WorkerEnv,
    finite_number,
    require,
    require_length,
)
from fedray.algorithms.registry import register, register_preset
from fedray.core.losses import loss_fn


class PersonalModel(ClientWork):
    """A client part whose clients keep a whole model, ``personal``, and are evaluated
    with it (a client that never trained with the global model)."""

    state = ("personal",)

    def eval_weights(self, env: WorkerEnv, cid: int,
                     state: dict[str, torch.Tensor] | None) -> torch.Tensor | None:
        return state.get("personal") if state else None


@dataclass
class DittoParams:
    lam: float = 0.1  # the pull of a personal model toward the global one
    steps: int | None = None  # the personal phase's local steps (None: the job's)
    epochs: int | None = None  # ... or passes over the client's data
    lr: float | None = None  # its learning rate (None: client.lr)


@register
class Ditto(PersonalModel):
    name = "ditto"
    section = "ditto"
    Params = DittoParams

    def check(self, params: DittoParams) -> None:
        require(finite_number(params.lam) and params.lam >= 0, "lam",
                "must be a finite number >= 0", params.lam)
        require_length(params.steps, params.epochs, params.lr)

    def phases(self, env: WorkerEnv, ctx: ClientContext) -> list[Phase]:
        p = self.params
        personal = ctx.state.get("personal") if ctx.state else None
        return [
            Phase(),  # the global update: FedAvg's local SGD from w^t, sent up
            Phase(start="global" if personal is None else personal,
                  terms=LocalTerms(proximal=float(p.lam)), steps=p.steps, epochs=p.epochs,
                  lr=p.lr, send=False, keep="personal"),
        ]


register_preset("ditto", "ditto", "proportional", "sgd")


def replica_gradient(model, criterion, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The gradient of the mean loss on (x, y) at the weights in the replica ``model`` (a
    FlatModel), left in ``model.grad`` (flat, one value per parameter): backward() adds
    into the parameters' ``.grad``, which are views of it, so an own ``train`` gets a flat
    gradient without gathering the parameters' tensors. Returns the loss (detached). A
    forward pass in train mode updates the replica's float buffers (BatchNorm statistics)."""
    model.grad.zero_()
    loss = criterion(model.module(x), y)
    loss.backward()
    return loss.detach()


@dataclass
class APFLParams:
    alpha: float = 0.25  # a client's mixing weight before its first round (fedray's default)
    adaptive: bool = True  # learn each client's alpha by gradient descent
    alpha_lr: float | None = None  # alpha's learning rate (None: client.lr)


@register
class APFL(PersonalModel):
    """APFL (Deng et al. 2020, Algorithm 1): see the module's docstring."""

    name = "apfl"
    section = "apfl"
    Params = APFLParams
    state = ("personal", "alpha")

    def check(self, params: APFLParams) -> None:
        require(finite_number(params.alpha) and 0 <= params.alpha <= 1, "alpha",
                "must be a number in [0, 1]", params.alpha)
        require(isinstance(params.adaptive, bool), "adaptive", "must be true or false",
                params.adaptive)
        require(params.alpha_lr is None or finite_number(params.alpha_lr) and params.alpha_lr > 0,
                "alpha_lr", "must be a finite number > 0 (or unset: client.lr)",
                params.alpha_lr)

    def setup(self, env: WorkerEnv) -> None:
        like = env.model.flat
        p = env.num_params
        self._w, self._v, self._vbar = (torch.empty_like(like) for _ in range(3))
        self._delta = torch.empty_like(like)
        self._g_w = torch.empty(p, dtype=like.dtype, device=like.device)
        self._diff = torch.empty(p, dtype=like.dtype, device=like.device)
        self._w_buffers = torch.empty_like(like[p:])

    def eval_weights(self, env: WorkerEnv, cid: int,
                     state: dict[str, torch.Tensor] | None) -> torch.Tensor | None:
        """alpha_k v_k + (1 - alpha_k) w, w the broadcast model (buffers mixed alike)."""
        if not state:
            return None
        w = env.global_weights
        v = state["personal"].to(w.device, torch.float32).reshape(-1)
        return torch.lerp(w, v, state["alpha"].to(w.device, torch.float32).reshape(1))

    def train(self, env: WorkerEnv, ctx: ClientContext) -> LocalUpdate:
        model, t, p = env.model, env.training, env.num_params
        lr = t.lr
        alpha_lr = lr if self.params.alpha_lr is None else float(self.params.alpha_lr)
        criterion = loss_fn(t.loss)
        x, y = ctx.x.to(env.device, non_blocking=True), ctx.y.to(env.device, non_blocking=True)
        w, v, vbar = self._w, self._v, self._vbar
        state = ctx.state or {}
        w.copy_(env.global_weights)
        v.copy_(state["personal"] if "personal" in state else env.global_weights)
        alpha = (state["alpha"].to(env.device, torch.float32).reshape(1).clone()
                 if "alpha" in state else
                 torch.full((1,), float(self.params.alpha), device=env.device))
        model.module.train()
        loss_sum = torch.zeros((), dtype=torch.float64, device=env.device)
        schedule = env.batches(ctx)
        for idx in schedule:
            xb, yb = x[idx], y[idx]
            model.load_(w)
            loss_sum += replica_gradient(model, criterion, xb, yb) * len(idx)
            self._g_w.copy_(model.grad)
            self._w_buffers.copy_(model.flat[p:])  # w's statistics after its forward pass
            torch.lerp(w, v, alpha, out=vbar)  # alpha v + (1 - alpha) w
            model.load_(vbar)
            replica_gradient(model, criterion, xb, yb)
            g = model.grad
            with torch.no_grad():
                if self.params.adaptive:  # d f(vbar) / d alpha = <v - w, g>, before the step
                    torch.sub(v[:p], w[:p], out=self._diff)
                    new_alpha = (alpha - alpha_lr * torch.dot(self._diff, g)).clamp_(0.0, 1.0)
                v[:p].addcmul_(g, alpha, value=-lr)
                v[p:].copy_(model.flat[p:])
                w[:p].add_(self._g_w, alpha=-lr)
                w[p:].copy_(self._w_buffers)
                if self.params.adaptive:
                    alpha = new_alpha
        torch.sub(w, env.global_weights, out=self._delta)
        ctx.scratch["apfl"] = {"personal": v, "alpha": alpha}
        return LocalUpdate(self._delta, len(ctx.y), float(loss_sum), sum(map(len, schedule)),
                           len(schedule))

    def finish(self, env: WorkerEnv, ctx: ClientContext, update: LocalUpdate,
               acc: PartialSum) -> dict[str, torch.Tensor]:
        return ctx.scratch["apfl"]  # the store copies them as it takes them


@dataclass
class PFedMeParams:
    lam: float = 15.0  # the pull of the personalized model theta toward w (fedray's default)
    inner_steps: int = 5  # K: gradient steps of the inner solve per local step
    personal_lr: float = 0.05  # the inner solve's learning rate


@register
class PFedMe(PersonalModel):
    """pFedMe (T. Dinh et al., NeurIPS 2020, Algorithm 1): see the module's docstring."""

    name = "pfedme"
    section = "pfedme"
    Params = PFedMeParams

    def check(self, params: PFedMeParams) -> None:
        require(finite_number(params.lam) and params.lam > 0, "lam", "must be a finite number > 0",
                params.lam)
        k = params.inner_steps
        require(isinstance(k, int) and not isinstance(k, bool) and k >= 1, "inner_steps",
                "must be an integer >= 1", k)
        require(finite_number(params.personal_lr) and params.personal_lr > 0, "personal_lr",
                "must be a finite number > 0", params.personal_lr)

    def setup(self, env: WorkerEnv) -> None:
        self._w = torch.empty_like(env.model.flat)
        self._theta = torch.empty_like(env.model.flat)
        self._delta = torch.empty_like(env.model.flat)

    def train(self, env: WorkerEnv, ctx: ClientContext) -> LocalUpdate:
        model, t, p = env.model, env.training, env.num_params
        lam, plr = float(self.params.lam), float(self.params.personal_lr)
        pull = t.lr * lam
        criterion = loss_fn(t.loss)
        x, y = ctx.x.to(env.device, non_blocking=True), ctx.y.to(env.device, non_blocking=True)
        w = self._w
        w.copy_(env.global_weights)
        model.load_(env.global_weights)  # theta lives in the replica, from w^t
        theta = model.params
        model.module.train()
        loss_sum = torch.zeros((), dtype=torch.float64, device=env.device)
        schedule = env.batches(ctx)
        for idx in schedule:
            xb, yb = x[idx], y[idx]
            for k in range(self.params.inner_steps):
                loss = replica_gradient(model, criterion, xb, yb)
                if k == 0:  # the loss at the step's start, as plain local SGD reports it
                    loss_sum += loss * len(idx)
                with torch.no_grad():  # theta <- theta - plr (g + lam (theta - w))
                    theta.mul_(1.0 - plr * lam).add_(w[:p], alpha=plr * lam)
                    theta.add_(model.grad, alpha=-plr)
            with torch.no_grad():
                w[:p].lerp_(theta, pull)  # w <- w - lr lam (w - theta)
                w[p:].copy_(model.flat[p:])  # theta's statistics (w is never run)
        self._theta.copy_(model.flat)
        torch.sub(w, env.global_weights, out=self._delta)
        return LocalUpdate(self._delta, len(ctx.y), float(loss_sum), sum(map(len, schedule)),
                           len(schedule))

    def finish(self, env: WorkerEnv, ctx: ClientContext, update: LocalUpdate,
               acc: PartialSum) -> dict[str, torch.Tensor]:
        return {"personal": self._theta}


register_preset("apfl", "apfl", "proportional", "sgd")
register_preset("pfedme", "pfedme", "uniform", "sgd")
