"""Elastic aggregation (Chen et al., CVPR 2023, Alg. 1 and 2): a per-parameter update scale.

Before training, each client holds out a share of its examples, B_k (``holdout``), from its
own seed; on B_k it measures, at the global model, each parameter's sensitivity
Omega_k <- mu Omega_k + (1 - mu) |d ||F(theta; x)||^2 / d theta| over B_k's batches. The
partial sum carries sum_k w_k Omega_k beside the proportionally weighted deltas
(w_k = |D_k|, its training examples); the driver scales each parameter's mean delta by
zeta = 1 + tau - Omega / max(Omega), Omega = sum_k w_k Omega_k / sum_k w_k. Paired with
server momentum (Alg. 1, ``elastic_fedavgm``) or the FedProx client (Alg. 2,
``elastic_fedprox``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedray.algorithms.base import (
    Aggregator,
    ClientContext,
    LocalUpdate,
    PartialSum,
    WorkerEnv,
    require,
)
from fedray.algorithms.registry import register, register_preset
from fedray.core.flat_model import FlatModel
from fedray.core.seeding import TAG_HOLDOUT, derive_seed
from fedray.kernels.sequential import batch_slices


@dataclass
class ElasticParams:
    tau: float = 0.5  # zeta = 1 + tau - Omega / max Omega
    mu: float = 0.95  # EMA decay of the sensitivity over B_k's batches
    holdout: float = 0.3  # share of each client's examples held out as B_k


def holdout_split(n: int, share: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(held-out, training) example indices of a client for one round, from its own seed:
    round(share * n) examples, at least one, and at least one left to train on (a client
    with a single example holds nothing out)."""
    if n < 2:
        return torch.empty(0, dtype=torch.long), torch.arange(n)
    m = min(n - 1, max(1, round(share * n)))
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return perm[:m], perm[m:]


def sensitivity(model: FlatModel, weights: torch.Tensor, x: torch.Tensor, *, batch_size: int,
                mu: float, out: torch.Tensor) -> torch.Tensor:
    """The parameter sensitivity over the batches of the held-out examples ``x`` at
    ``weights``: Omega <- mu Omega + (1 - mu) |d ||F(theta; x)||_2^2 / d theta|, from zero,
    with F the model's output and the squared norm averaged over the batch's examples. Eval
    mode: the sensitivity is a property of the prediction function, not of dropout noise."""
    model.load_(weights)
    module = model.module
    module.eval()
    x = x.to(model.device, non_blocking=True)
    out.zero_()
    for sl in batch_slices(len(x), batch_size):
        model.grad.zero_()
        module(x[sl]).flatten(1).pow(2).sum(1).mean().backward()
        out.mul_(mu).add_(model.grad.abs(), alpha=1.0 - mu)
    module.train()
    return out


def elastic_scale(omega: torch.Tensor, tau: float) -> torch.Tensor:
    """zeta = 1 + tau - Omega / max(Omega); all-zero sensitivity (max 0) gives 1 + tau."""
    top = float(omega.max()) if omega.numel() else 0.0
    return (1.0 + tau) - (omega / top if top > 0 else torch.zeros_like(omega))


@register
class ElasticAggregator(Aggregator):
    name = "elastic"
    section = "elastic"
    Params = ElasticParams
    extras = {"omega": "params"}

    def check(self, params: ElasticParams) -> None:
        require(params.tau >= 0, "tau", "must be >= 0", params.tau)
        require(0 <= params.mu < 1, "mu", "must be in [0, 1)", params.mu)
        require(0 < params.holdout < 1, "holdout", "must be in (0, 1)", params.holdout)

    def setup(self, env: WorkerEnv) -> None:
        self._omega = torch.zeros(env.num_params, device=env.device)

    def prepare(self, env: WorkerEnv, ctx: ClientContext) -> None:
        n = len(ctx.y)
        held, keep = holdout_split(n, self.params.holdout, derive_seed(ctx.seed, TAG_HOLDOUT))
        ctx.scratch["held_x"], ctx.scratch["all"] = ctx.x[held], n
        ctx.x, ctx.y = ctx.x[keep], ctx.y[keep]
        ctx.batch_size = env.batch_size_for(len(keep))

    def accumulate(self, env: WorkerEnv, ctx: ClientContext, update: LocalUpdate,
                   acc: PartialSum) -> None:
        weight = self.weight(update)
        acc.add(update.delta, weight)
        sensitivity(env.model, env.global_weights, ctx.scratch["held_x"],
                    batch_size=env.batch_size_for(ctx.scratch["all"]), mu=self.params.mu,
                    out=self._omega)
        acc.add_extra("omega", self._omega, weight)

    def init_server(self, num_params: int, population: int) -> None:
        super().init_server(num_params, population)
        self.num_params = num_params

    def finish(self, acc: PartialSum) -> torch.Tensor:
        delta = acc.mean()
        omega = acc.extras["omega"] / acc.weight
        delta[: self.num_params].mul_(elastic_scale(omega, self.params.tau))
        return delta


register_preset("elastic_fedavgm", "local_sgd", "elastic", "momentum")  # Chen et al., Alg. 1
register_preset("elastic_fedprox", "fedprox", "elastic", "sgd")  # Chen et al., Alg. 2
