"""FedProx (Li et al., MLSys 2020): local SGD on f_k(y) + (mu/2) ||y - x||^2.

Each local step adds mu (y - x) to the gradient: ``LocalTerms(proximal=mu)``, which every
kernel (sequential, torch.func, the closed-form chain) applies. Paired with the proportional
aggregator in the ``fedprox`` preset, and with Elastic aggregation in ``elastic_fedprox``.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedray.algorithms.base import ClientContext, ClientWork, LocalTerms, WorkerEnv, require
from fedray.algorithms.registry import register, register_preset


@dataclass
class FedProxParams:
    mu: float = 0.01  # the proximal weight


@register
class FedProxClient(ClientWork):
    name = "fedprox"
    section = "fedprox"
    Params = FedProxParams

    def check(self, params: FedProxParams) -> None:
        require(params.mu >= 0, "mu", "must be >= 0", params.mu)

    def terms(self, env: WorkerEnv, ctx: ClientContext) -> LocalTerms:
        return LocalTerms(proximal=self.params.mu)


register_preset("fedprox", "fedprox", "proportional", "sgd")
