"""FedDyn (Acar et al., "Federated Learning Based on Dynamic Regularization", ICLR 2021).

Client k, from the global model x (Alg. 1): minimise
    L_k(y) - <g_k, y> + (alpha/2) ||y - x||^2,
g_k the gradient of L_k at its previous local optimum (zero before its first round), i.e.
``LocalTerms(proximal=alpha, linear=-g_k)``; then g_k <- g_k - alpha (y_k - x), the
first-order condition of that minimum. g_k is per-client state.

Server: h <- h - (alpha/m) sum_k (y_k - x) over the round's clients, m the population; the
next model is the plain mean of the y_k less h/alpha, i.e. the update is
mean_k (y_k - x) - h/alpha (with server_opt sgd at lr 1, as the paper). h is the
aggregator's state, checkpointed with the run.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedray.algorithms.base import (
    Aggregator,
    ClientContext,
    ClientWork,
    LocalTerms,
    LocalUpdate,
    PartialSum,
    WorkerEnv,
    require,
)
from fedray.algorithms.registry import register, register_preset


@dataclass
class FedDynParams:
    alpha: float = 0.01  # the dynamic regulariser's weight


def _check(params: FedDynParams) -> None:
    require(params.alpha > 0, "alpha", "must be > 0", params.alpha)


@register
class FedDynClient(ClientWork):
    name = "feddyn"
    section = "feddyn"
    Params = FedDynParams
    state = ("g",)

    def check(self, params: FedDynParams) -> None:
        _check(params)

    def terms(self, env: WorkerEnv, ctx: ClientContext) -> LocalTerms:
        g = (torch.zeros(env.num_params, device=env.device) if ctx.state is None
             else ctx.state["g"].to(env.device))
        ctx.scratch["g"] = g
        return LocalTerms(proximal=self.params.alpha, linear=-g)

    def finish(self, env: WorkerEnv, ctx: ClientContext, update: LocalUpdate,
               acc: PartialSum) -> dict[str, torch.Tensor]:
        g = ctx.scratch["g"]
        g.add_(update.delta[: env.num_params], alpha=-self.params.alpha)
        return {"g": g}


@register
class FedDynAggregator(Aggregator):
    name = "feddyn"
    section = "feddyn"
    Params = FedDynParams

    def check(self, params: FedDynParams) -> None:
        _check(params)

    def weight(self, update: LocalUpdate) -> float:
        return 1.0

    def init_server(self, num_params: int, population: int) -> None:
        super().init_server(num_params, population)
        self.num_params = num_params
        self.state["h"] = torch.zeros(num_params, dtype=torch.float64)

    def finish(self, acc: PartialSum) -> torch.Tensor:
        mean = acc.mean()
        total = mean[: self.num_params] * acc.weight  # sum_k (y_k - x): every weight is 1
        alpha = self.params.alpha
        self.state["h"] = self.state["h"] - (alpha / self.population) * total
        mean[: self.num_params] -= self.state["h"] / alpha
        return mean


register_preset("feddyn", "feddyn", "feddyn", "sgd")
