"""Exp-alpha aggregation (seed 003): clients weighted by how much their training helped them.

Each client measures its training risk F_k (mean loss on its own training data, eval mode)
before and after its local update; its weight is rho_k proportional to
exp((F_k(after) - F_k(before)) / alpha) over the round's clients -- a softmax, which the
partial sum keeps log-scaled (fedray.algorithms.reduction), so a small temperature alpha
cannot overflow. Seed 003: eq. 3 (line 101), Alg. 1 (line 249), CalculateRisk a forward
pass over the local data (line 251). With ``data.per_round`` (fedray.data.transforms.per_round) the
risks are measured on the client's data of the round, the data it trained on.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedray.algorithms.base import (
    Aggregator,
    ClientContext,
    LocalUpdate,
    PartialSum,
    WorkerEnv,
    require,
)
from fedray.algorithms.registry import register, register_preset


@dataclass
class ExpAlphaParams:
    alpha: float = 0.2  # the temperature


def expalpha_log_weight(risk_before: float, risk_after: float, alpha: float) -> float:
    """log rho_k up to the round's normaliser: (F_k(W_k^{T+E}) - F_k(W^T)) / alpha."""
    return (risk_after - risk_before) / alpha


@register
class ExpAlphaAggregator(Aggregator):
    name = "expalpha"
    section = "expalpha"
    Params = ExpAlphaParams
    # log rho_k before the round's normaliser: with output.participants, a client's weight
    # is exp(log_weight) over the sum of the round's arrived clients' (seed 003's Fig. 2)
    columns = ("expalpha_log_weight",)

    def check(self, params: ExpAlphaParams) -> None:
        require(params.alpha > 0, "alpha", "must be > 0", params.alpha)

    def weight(self, update: LocalUpdate) -> float:
        return 1.0

    def accumulate(
        self, env: WorkerEnv, ctx: ClientContext, update: LocalUpdate, acc: PartialSum
    ) -> None:
        after = env.risk(env.trained_weights(update), ctx.x, ctx.y)
        before = env.risk(env.global_weights, ctx.x, ctx.y)
        log_weight = expalpha_log_weight(before, after, self.params.alpha)
        ctx.columns["expalpha_log_weight"] = log_weight
        acc.add(update.delta, 1.0, log_weight)


register_preset("expalpha", "local_sgd", "expalpha", "sgd")
register_preset("expalpha_fedavgm", "local_sgd", "expalpha", "momentum")
