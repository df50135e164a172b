"""Meta-learning: a global model that is a good starting point for each client's own step.

``per_fedavg``     Fallah, Mokhtari, Ozdaglar, "Personalized Federated Learning with
                   Theoretical Guarantees: A Model-Agnostic Meta-Learning Approach",
                   NeurIPS 2020, Algorithm 1 (first-order variant, FO).
``per_fedavg_hf``  the same with the Hessian term (HF).

MAML and FOMAML as seed 002's LOCALUPDATE frames them (clients send gradients of K local
steps) live in fedray/algorithms/local_update.py.

Per-FedAvg. The objective is the average over clients of F_k(w) = f_k(w - alpha grad f_k(w)):
the loss after one step of local gradient descent at ``alpha``. A sampled client starts at
w^t and takes R local steps (the job's client section: ``client.local_steps``, or
``local_epochs`` passes' worth of batches at ``client.batch_size``), each on two or three
batches D, D', D'' of its own data, drawn independently (every batch a fresh permutation's
first ``batch_size`` examples: fedray's seeded schedule with ``independent`` draws):

    tmp = w - alpha grad f(w; D)
    FO:  w <- w - beta grad f(tmp; D')
    HF:  w <- w - beta (I - alpha H(w; D'')) grad f(tmp; D')

beta is ``client.lr``, alpha ``algorithm.per_fedavg.alpha``, and H(w; D'') u, the Hessian of
the loss on D'' at w times u = grad f(tmp; D'), is computed exactly by double backward
(autograd's gradient of <grad f(w; D''), u>; no Hessian is formed). Implementations such as
FL-bench's approximate that product by a central difference of two gradients; an exact
product is fedray's choice. The client sends w - w^t. Algorithm 1's server sets the next
model to the plain average of the sampled clients' models, (1 / |A_k|) sum_i w^i, so the
preset aggregates ``uniform`` (every client weight 1, as FL-bench's PerFedAvgClient does too),
at ``server.lr`` 1 by default.

A client is evaluated as the paper personalizes it: the global model after one step of
gradient descent at alpha on a batch of its own training split (``eval_phase``), from its
adaptation seed for the eval round; nothing of it is kept. The global model's numbers are
reported beside it (``global_*``).

Float buffers (BatchNorm's running statistics) take every forward pass of a step, as plain
local SGD's take every batch's. A step's training loss is f(w; D), the loss at the step's
start, so ``train_loss`` is comparable to FedAvg's.

A step needs two or three batches, a model moved to tmp and back, and (HF) a second-order
backward pass: no ``Phase`` says that, so the client part has its own ``train`` and its
clients train one after another on the worker's replica; the vectorized kernels, which run
one plain (or proximal) SGD step per batch for a group of clients at once, cannot run it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedray.algorithms.base import (
    ClientContext,
    ClientWork,
    LocalUpdate,
    Phase,
    WorkerEnv,
    finite_number,
    require,
)
from fedray.algorithms.personal_models import replica_gradient
from fedray.algorithms.registry import register, register_preset
from fedray.core.losses import loss_fn
from fedray.kernels.sequential import batch_schedule, num_local_steps

VARIANTS = ("fo", "hf")


@dataclass
class PerFedAvgParams:
    alpha: float = 0.01  # the personalization step's learning rate (fedray's default)
    variant: str = "fo"  # fo: first order; hf: with the Hessian-vector product


@register
class PerFedAvg(ClientWork):
    """Per-FedAvg (Fallah et al., NeurIPS 2020, Algorithm 1): see the module's docstring."""

    name = "per_fedavg"
    section = "per_fedavg"
    Params = PerFedAvgParams
    independent_batches = True

    def check(self, params: PerFedAvgParams) -> None:
        a = params.alpha
        require(finite_number(a) and a > 0, "alpha", "must be a finite number > 0", a)
        require(params.variant in VARIANTS, "variant", f"must be {' or '.join(VARIANTS)}",
                params.variant)

    def setup(self, env: WorkerEnv) -> None:
        p = env.num_params
        self._w = torch.empty(p, dtype=env.model.flat.dtype, device=env.model.device)
        self._delta = torch.empty_like(env.model.flat)
        if self.params.variant == "hf":
            self._hv = torch.empty_like(self._w)

    def eval_phase(self, env: WorkerEnv) -> Phase:
        """One step of gradient descent at alpha on the client's own data."""
        return Phase(steps=1, lr=float(self.params.alpha))

    def _hessian_times(self, env: WorkerEnv, criterion, x: torch.Tensor, y: torch.Tensor,
                       u: torch.Tensor) -> torch.Tensor:
        """H(w; (x, y)) u at the replica's weights w, by double backward: the gradient of
        <grad f(w), u> with respect to w (flat, into ``_hv``)."""
        params = env.model.param_list
        loss = criterion(env.model.module(x), y)
        grads = torch.autograd.grad(loss, params, create_graph=True, allow_unused=True)
        live = [i for i, g in enumerate(grads) if g is not None and g.requires_grad]
        us = env.model.split(u)
        hv = torch.autograd.grad([grads[i] for i in live], [params[i] for i in live],
                                 grad_outputs=[us[i] for i in live],
                                 allow_unused=True) if live else ()
        if len(live) == len(params) and all(h is not None for h in hv):
            return torch.cat([h.reshape(-1) for h in hv], out=self._hv)
        self._hv.zero_()  # a parameter whose gradient is constant in w: H u is 0 there
        out = env.model.split(self._hv)
        for i, h in zip(live, hv, strict=True):
            if h is not None:
                out[i].copy_(h)
        return self._hv

    def train(self, env: WorkerEnv, ctx: ClientContext) -> LocalUpdate:
        model, t = env.model, env.training
        alpha, beta = float(self.params.alpha), t.lr
        hf = self.params.variant == "hf"
        per_step = 3 if hf else 2
        n = len(ctx.y)
        steps = num_local_steps(n, ctx.batch_size, t.local_epochs, t.local_steps) if n else 0
        schedule = batch_schedule(n, ctx.batch_size, 1, steps * per_step, ctx.seed,
                                  device=env.device, independent=True) if n else []
        criterion = loss_fn(t.loss)
        x, y = ctx.x.to(env.device, non_blocking=True), ctx.y.to(env.device, non_blocking=True)
        model.load_(env.global_weights)
        model.module.train()
        w, g = model.params, model.grad
        loss_sum = torch.zeros((), dtype=torch.float64, device=env.device)
        seen = 0
        for s in range(steps):
            d, d2 = schedule[per_step * s], schedule[per_step * s + 1]
            loss_sum += replica_gradient(model, criterion, x[d], y[d]) * len(d)
            seen += len(d)
            with torch.no_grad():
                self._w.copy_(w)
                w.add_(g, alpha=-alpha)  # tmp = w - alpha grad f(w; D)
            replica_gradient(model, criterion, x[d2], y[d2])  # g = grad f(tmp; D')
            with torch.no_grad():
                w.copy_(self._w)
            if hf:
                d3 = schedule[per_step * s + 2]
                hv = self._hessian_times(env, criterion, x[d3], y[d3], g)
                with torch.no_grad():
                    w.add_(hv, alpha=alpha * beta)
            with torch.no_grad():
                w.add_(g, alpha=-beta)
        torch.sub(model.flat, env.global_weights, out=self._delta)
        return LocalUpdate(self._delta, n, float(loss_sum), seen, steps, in_replica=True)


register_preset("per_fedavg", "per_fedavg", "uniform", "sgd")
register_preset("per_fedavg_hf", "per_fedavg", "uniform", "sgd",
                defaults={"per_fedavg": {"variant": "hf"}})

__all__ = ["PerFedAvg", "PerFedAvgParams"]
