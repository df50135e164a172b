"""LOCALUPDATE (Charles & Konečný, seed 002, Alg. 1-2) and MAML: clients send gradients.

A LOCALUPDATE client runs K steps of minibatch SGD at client learning rate gamma
(``client.lr``) on its loss plus (alpha/2) ||w - x||^2, x the broadcast model, each step on
its own independently drawn batch (Alg. 2 samples S_k at every step), and sends
sum_k theta_k g_k, a weighted sum of the gradients g_k it computed -- not its model delta.
The server averages the messages uniformly (1/M, Alg. 1) and gives the mean q to SERVEROPT
as a gradient: with ``server_opt: sgd`` at ``server.lr`` eta, x <- x - eta q.

The weights Theta (seed 002 eq. 4-5) are ``algorithm.local_update.theta``:

  ones          Theta_{1:K}: every step, K = the client's local steps (client.local_steps,
                or client.local_epochs passes)
  last          Theta_K: the last step's gradient only (FOMAML)
  {index: j}    Theta_j: the j-th step's gradient only (K = j steps)
  [t1, t2, ...] explicit theta_k >= 0, not all 0 (K = the last non-zero's position)

Table 1 of the seed, with SERVEROPT gradient descent (docs/algorithms.md gives each as a
config): mini-batch SGD (theta [1], one client), Lookahead (ones, one client, gamma > 0),
FedSGD (ones, gamma = 0: ``client.lr: 0`` takes all K gradients at x), FedAvg / Reptile
(ones, gamma > 0), FedProx (ones, alpha > 0), FOMAML (last), MAML (the ``maml`` client).

How FedAvg's model-delta form relates (seed 002 App. A): with Theta_{1:K}, sum_k g_k =
(x - y) / gamma for a client that ends at y, so LOCALUPDATE at server lr eta is FedAvg (the
plain mean of the deltas) at server lr eta / gamma; at eta = gamma it is FedAvg exactly. The
delta form cannot express gamma = 0 (its update is then 0), nor any Theta but Theta_{1:K}.

A client's message enters the partial sum where the model delta would (LocalUpdate.delta),
negated -- the runtime's server optimizers add the mean "delta", the negative
pseudo-gradient -- so every SERVEROPT (momentum, Nesterov, Adam, ...) applies unchanged.
These clients train one after another (their own ``train``), not in vectorized groups.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from fedray.algorithms.base import (
    ClientContext,
    ClientWork,
    LocalTerms,
    LocalUpdate,
    ParamError,
    WorkerEnv,
    require,
)
from fedray.algorithms.registry import register, register_preset
from fedray.core.losses import loss_fn
from fedray.kernels.sequential import batch_schedule, local_sgd, num_local_steps
from fedray.theory import surrogate

THETA_FAMILIES = ("ones", "last")
THETA_RULE = ("must be ones, last, {index: j} with j >= 1, or a list of numbers >= 0 that are "
              "not all 0")


def theta_weights(theta: Any, steps: int) -> list[float]:
    """theta_1..theta_K (trailing zeros dropped) for a client that takes ``steps`` local
    steps: ``ones`` and ``last`` use them; ``{index: j}`` and an explicit list fix K
    themselves. The forms are fedray.theory.surrogate's (eq. 4-5), so the runtime and the
    surrogate-loss tooling read a Theta the same way."""
    if theta in THETA_FAMILIES:
        if not steps:
            return []
        make = surrogate.theta_ones if theta == "ones" else surrogate.theta_last
        return make(steps).tolist()
    if isinstance(theta, dict):
        return surrogate.theta_index(int(theta["index"])).tolist()
    return surrogate.check_theta(theta).tolist()


def fixed_steps(theta: Any) -> int | None:
    """K(Theta) when Theta fixes it (an index or a list); None for ``ones`` and ``last``."""
    if theta in THETA_FAMILIES:
        return None
    return len(theta_weights(theta, 0))


def check_theta(theta: Any) -> None:
    """One rule for every form of ``theta``; ParamError (key ``theta``) otherwise."""
    if isinstance(theta, str):
        require(theta in THETA_FAMILIES, "theta", THETA_RULE, theta)
    elif isinstance(theta, dict):
        j = theta.get("index")
        require(set(theta) == {"index"} and isinstance(j, int) and not isinstance(j, bool)
                and j >= 1, "theta", THETA_RULE, theta)
    elif isinstance(theta, list | tuple):
        require(all(isinstance(t, int | float) and not isinstance(t, bool) for t in theta),
                "theta", THETA_RULE, theta)
        try:
            surrogate.check_theta(theta)
        except ValueError:
            raise ParamError("theta", THETA_RULE, theta) from None
    else:
        raise ParamError("theta", THETA_RULE, theta)


@dataclass
class LocalUpdateParams:
    theta: Any = "ones"  # ones | last | {index: j} | [theta_1, theta_2, ...]
    alpha: float = 0.0  # proximal strength toward the broadcast model


@register
class LocalUpdateClient(ClientWork):
    """Alg. 2's CLIENTUPDATE: the sequential kernel, asked for sum_k theta_k g_k."""

    name = "local_update"
    section = "local_update"
    Params = LocalUpdateParams
    allows_zero_lr = True
    independent_batches = True

    def check(self, params: LocalUpdateParams) -> None:
        check_theta(params.theta)
        a = params.alpha
        require(isinstance(a, int | float) and a >= 0 and a != float("inf"), "alpha",
                "must be a finite number >= 0", a)

    def setup(self, env: WorkerEnv) -> None:
        self._delta = torch.empty_like(env.model.flat)
        self._message = torch.empty(env.num_params, dtype=torch.float32, device=env.device)

    def terms(self, env: WorkerEnv, ctx: ClientContext) -> LocalTerms:
        return LocalTerms(proximal=float(self.params.alpha))

    def steps(self, env: WorkerEnv, ctx: ClientContext) -> int:
        """K(Theta) for this client."""
        fixed = fixed_steps(self.params.theta)
        if fixed is not None:
            return fixed
        t = env.training
        return num_local_steps(len(ctx.y), ctx.batch_size, t.local_epochs, t.local_steps)

    def train(self, env: WorkerEnv, ctx: ClientContext) -> LocalUpdate:
        k = self.steps(env, ctx)
        update = local_sgd(env.model, env.global_weights, ctx.x, ctx.y, lr=env.lr,
                           batch_size=ctx.batch_size, local_epochs=1, local_steps=k,
                           seed=ctx.seed, delta_out=self._delta, terms=ctx.terms,
                           loss=env.loss, step_weights=theta_weights(self.params.theta, k),
                           gradient_sum=self._message, independent_batches=True,
                           precision=env.training.precision)
        # the message where the delta goes, negated (float buffers keep their delta)
        torch.neg(self._message, out=self._delta[: env.num_params])
        update.in_replica = False  # the replica holds the trained model, not x + "delta"
        return update


@register
class MAMLClient(ClientWork):
    """MAML (Finn et al. 2017) as seed 002 Section 3 frames it: the client sends the gradient
    of m_K(x) = f(X_K(x)), X_K the map of K local SGD steps from x at gamma (``client.lr``),
    differentiated exactly -- through every step's Hessian -- with torch.func's functional
    call and autograd's double backward. The outer loss is taken on one more batch of the
    client's own (independently drawn, as the inner ones); with a batch as large as the
    client's data every step is full-batch gradient descent, Theorem 2's setting, where the
    message equals the Theta_{2K+1} surrogate gradient on quadratics. Second order costs K
    times the memory of a step's graph: meant for small models (and the theorem's checks).
    """

    name = "maml"
    allows_zero_lr = True  # gamma = 0: the gradient of f at x (FedSGD)
    independent_batches = True

    def setup(self, env: WorkerEnv) -> None:
        self._delta = torch.empty_like(env.model.flat)
        self._names = [n for n, _ in env.model.module.named_parameters()]

    def train(self, env: WorkerEnv, ctx: ClientContext) -> LocalUpdate:
        from torch.func import functional_call


        model, t = env.model, env.training
        n = len(ctx.y)
        k = num_local_steps(n, ctx.batch_size, t.local_epochs, t.local_steps) if n else 0
        schedule = batch_schedule(n, ctx.batch_size, 1, k + 1, ctx.seed, device=env.device,
                                  independent=True) if n else []
        criterion = loss_fn(env.loss)
        model.load_(env.global_weights)
        torch.manual_seed(ctx.seed)  # dropout masks
        module = model.module
        module.train()
        x, y = ctx.x.to(env.device), ctx.y.to(env.device)
        start = [w.detach().clone().requires_grad_(True) for w in model.split(model.flat)]
        weights = start
        loss_sum, seen = 0.0, 0

        def loss_at(ws: list[torch.Tensor], idx: torch.Tensor) -> torch.Tensor:
            return criterion(functional_call(module, dict(zip(self._names, ws, strict=True)),
                                             (x[idx],)), y[idx])

        for idx in schedule[:k]:
            inner = loss_at(weights, idx)
            grads = torch.autograd.grad(inner, weights, create_graph=True)
            weights = [w - env.lr * g for w, g in zip(weights, grads, strict=True)]
            loss_sum += float(inner.detach()) * len(idx)
            seen += len(idx)
        p = env.num_params
        self._delta.zero_()
        if schedule:
            meta = torch.autograd.grad(loss_at(weights, schedule[k]), start)
            torch.cat([g.reshape(-1) for g in meta], out=self._delta[:p]).neg_()
        torch.sub(model.flat[p:], env.global_weights[p:], out=self._delta[p:])
        return LocalUpdate(self._delta, n, loss_sum, seen, k)


register_preset("local_update", "local_update", "uniform", "sgd")
register_preset("minibatch_sgd", "local_update", "uniform", "sgd",
                defaults={"local_update": {"theta": [1.0]}})
register_preset("fomaml", "local_update", "uniform", "sgd",
                defaults={"local_update": {"theta": "last"}})
register_preset("maml", "maml", "uniform", "sgd")

__all__ = ["LocalUpdateClient", "LocalUpdateParams", "MAMLClient", "check_theta",
           "theta_weights"]
