"""Elastic aggregation (Chen et al., CVPR 2023, Alg. 1 and 2): a per-parameter update scale.

Each client holds out a share of its examples, B_k (``holdout``, 10% as in seed 000 line
193), once for the whole run (seed 000 lines 94-95 and 144-145): the split derives from the
job's seed and the client's id only, so it is the same in every round and on any worker, and
the client trains on D_k without B_k in every round. On B_k it measures, at the global
model, each parameter's sensitivity to ||F(theta; x)||^2 over B_k's batches
(``method``): ``momentum`` Omega_k <- mu Omega_k + (1 - mu) |g| from zero (Alg. 1, lines
99-105), or ``average`` Omega_k = mean over the batches of |g| (eq. 1, lines 3-10). The
partial sum carries sum_k w_k Omega_k beside the proportionally weighted deltas
(w_k = |D_k|, its training examples, line 114); the driver scales each parameter's mean
delta by zeta = 1 + tau - Omega / max(Omega) (lines 117-127). Paired with server momentum
(Alg. 1, ``elastic_fedavgm``; the seed's damped form is ``server.dampening`` =
``server.momentum``, line 130) or the FedProx client (Alg. 2, ``elastic_fedprox``).

Signs: fedray's deltas are theta_k - theta (line 113) and every server optimizer *adds*
its step, as the appendix's Alg. 3 does (x <- x + phi eta_g Delta x); lines 132 and 180
write theta <- theta - eta m, which with line 113's Delta would step away from the clients
(docs/algorithms.md, "Elastic aggregation").

Each round records ``elastic_boosted_share`` in metrics.jsonl: the share of parameters
with zeta > 1 (Omega_i / max Omega < tau), the quantity of the appendix's Fig. 1 (line 52).
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

METHODS = ("momentum", "average")


@dataclass
class ElasticParams:
    tau: float = 0.5  # zeta = 1 + tau - Omega / max Omega (the seed gives no value)
    mu: float = 0.95  # EMA decay of the momentum method (the seed gives no value)
    holdout: float = 0.1  # share of each client's examples held out as B_k (seed 000 l. 193)
    method: str = "momentum"  # the sensitivity: "momentum" (Alg. 1) or "average" (eq. 1)
    batch_size: int | None = None  # B_k's batches (None: the client's training batch size)


def holdout_seed(seed: int, cid: int) -> int:
    """The seed of client ``cid``'s B_k: from the job's seed and the client's id alone, so
    B_k is drawn once for the run (seed 000 lines 94-95), whatever the round or worker."""
    return derive_seed(seed, TAG_HOLDOUT, cid)


def holdout_split(n: int, share: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(held-out, training) example indices of a client of ``n`` examples, from ``seed``
    (``holdout_seed``): round(share * n) examples, at least one, and at least one left to
    train on (a client with a single example holds nothing out). The same (n, share, seed)
    give the same split, so a client's B_k and D_k are fixed for the run."""
    if n < 2:
        return torch.empty(0, dtype=torch.long), torch.arange(n)
    m = min(n - 1, max(1, round(share * n)))
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return perm[:m], perm[m:]


def sensitivity(model: FlatModel, weights: torch.Tensor, x: torch.Tensor, *, batch_size: int,
                mu: float, out: torch.Tensor, method: str = "momentum") -> torch.Tensor:
    """The parameter sensitivity over the batches of the held-out examples ``x`` at
    ``weights``, with g = d ||F(theta; x)||_2^2 / d theta per batch (F the model's output,
    the squared norm averaged over the batch's examples): ``momentum``
    Omega <- mu Omega + (1 - mu) |g| from zero (Alg. 1), or ``average`` the mean of |g|
    over the batches (eq. 1, which the seed calls the average over batches, line 4). Eval
    mode: the sensitivity is a property of the prediction function, not of dropout noise."""
    model.load_(weights)
    module = model.module
    module.eval()
    x = x.to(model.device, non_blocking=True)
    out.zero_()
    batches = 0
    for sl in batch_slices(len(x), batch_size):
        model.grad.zero_()
        module(x[sl]).flatten(1).pow(2).sum(1).mean().backward()
        if method == "average":
            out.add_(model.grad.abs())
        else:
            out.mul_(mu).add_(model.grad.abs(), alpha=1.0 - mu)
        batches += 1
    if method == "average" and batches > 1:
        out.div_(batches)
    module.train()
    return out


def boosted_share(zeta: torch.Tensor) -> float:
    """The share of parameters whose update elastic aggregation enlarges (zeta > 1, i.e.
    Omega / max Omega < tau): the quantity of the appendix's Fig. 1 (seed 000 line 52)."""
    return float((zeta > 1).double().mean()) if zeta.numel() else 0.0


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
        require(params.method in METHODS, "method", f"must be one of {', '.join(METHODS)}",
                params.method)
        require(params.batch_size is None or params.batch_size >= 1, "batch_size",
                "must be >= 1 or null", params.batch_size)

    def setup(self, env: WorkerEnv) -> None:
        self._omega = torch.zeros(env.num_params, device=env.device)

    def prepare(self, env: WorkerEnv, ctx: ClientContext) -> None:
        n = len(ctx.y)
        held, keep = holdout_split(n, self.params.holdout, holdout_seed(env.seed, ctx.cid))
        ctx.scratch["held_x"], ctx.scratch["all"] = ctx.x[held], n
        ctx.x, ctx.y = ctx.x[keep], ctx.y[keep]
        ctx.batch_size = env.batch_size_for(len(keep))

    def accumulate(self, env: WorkerEnv, ctx: ClientContext, update: LocalUpdate,
                   acc: PartialSum) -> None:
        weight = self.weight(update)
        acc.add(update.delta, weight)
        sensitivity(env.model, env.global_weights, ctx.scratch["held_x"],
                    batch_size=self.params.batch_size or env.batch_size_for(ctx.scratch["all"]),
                    mu=self.params.mu,
                    out=self._omega, method=self.params.method)
        acc.add_extra("omega", self._omega, weight)

    def init_server(self, num_params: int, population: int) -> None:
        super().init_server(num_params, population)
        self.num_params = num_params
        self._boosted: float | None = None

    def finish(self, acc: PartialSum) -> torch.Tensor:
        delta = acc.mean()
        omega = acc.extras["omega"] / acc.weight
        zeta = elastic_scale(omega, self.params.tau)
        delta[: self.num_params].mul_(zeta)
        self._boosted = boosted_share(zeta)
        return delta

    def round_metrics(self) -> dict[str, float]:
        return {} if self._boosted is None else {"elastic_boosted_share": self._boosted}


register_preset("elastic_fedavgm", "local_sgd", "elastic", "momentum")  # Chen et al., Alg. 1
register_preset("elastic_fedprox", "fedprox", "elastic", "sgd")  # Chen et al., Alg. 2
