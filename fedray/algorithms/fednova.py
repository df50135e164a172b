"""FedNova (Wang et al., "Tackling the Objective Inconsistency Problem in Heterogeneous
Federated Optimization", NeurIPS 2020): normalized averaging.

Clients that take more local steps move further, and a plain weighted mean of their deltas
optimises a skewed objective. FedNova divides each client's delta by ||a_k||_1, the sum of
the weights its local steps' gradients enter the delta with, and rescales the mean by the
effective number of steps tau_eff = sum_k p_k ||a_k||_1:

    update = tau_eff * sum_k p_k (y_k - x) / ||a_k||_1,   p_k = |D_k| / sum_j |D_j|.

For plain local SGD of tau_k steps ||a_k||_1 = tau_k; with a proximal term mu (FedProx's, read
from the client's ``LocalTerms``) each earlier gradient shrinks by (1 - lr mu) per later step,
so ||a_k||_1 = (1 - (1 - lr mu)^tau_k) / (lr mu). The partial sum carries sum_k |D_k| ||a_k||_1
as an extra, so tau_eff needs no second pass. A client with examples always takes at least
one step, so ||a_k||_1 > 0.
"""

from __future__ import annotations

import torch

from fedray.algorithms.base import (
    Aggregator,
    ClientContext,
    LocalUpdate,
    PartialSum,
    WorkerEnv,
)
from fedray.algorithms.registry import register, register_preset


def step_weights_norm(steps: int, lr: float, proximal: float) -> float:
    """||a_k||_1 for ``steps`` local SGD steps at ``lr`` with proximal weight ``proximal``:
    sum_j |1 - lr mu|^j, which is (1 - (1 - lr mu)^steps) / (lr mu) for lr mu < 1 (a
    proximal step that overshoots, lr mu > 1, still has a positive norm)."""
    r = abs(1.0 - lr * proximal)
    if not proximal or r == 1.0:
        return float(steps)
    return (1.0 - r ** steps) / (1.0 - r)


@register
class FedNovaAggregator(Aggregator):
    name = "fednova"
    extras = {"tau": 1}

    def accumulate(self, env: WorkerEnv, ctx: ClientContext, update: LocalUpdate,
                   acc: PartialSum) -> None:
        a = step_weights_norm(update.steps, env.lr, ctx.terms.proximal)
        weight = self.weight(update)
        value = update.delta.clone()
        value[: env.num_params] /= a  # float buffers (batch-norm statistics) are averaged
        acc.add(value, weight)
        acc.add_extra("tau", torch.tensor([a], dtype=torch.float64, device=acc.total.device),
                      weight)

    def init_server(self, num_params: int, population: int) -> None:
        super().init_server(num_params, population)
        self.num_params = num_params

    def finish(self, acc: PartialSum) -> torch.Tensor:
        """tau_eff * sum_k p_k d_k / ||a_k||_1, with tau_eff = sum_k |D_k| ||a_k||_1 / sum |D_k|
        (the parameters; float buffers get their plain weighted mean)."""
        update = acc.mean()
        update[: self.num_params] *= float(acc.extras["tau"][0]) / acc.weight
        return update


register_preset("fednova", "local_sgd", "fednova", "sgd")
