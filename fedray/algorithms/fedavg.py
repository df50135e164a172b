"""FedAvg and FedSGD (McMahan et al., AISTATS 2017), with the weighted and the plain mean.

local_sgd     K local minibatch SGD steps (or E epochs) from the global model; the message
              is the model delta y - x. No extra terms: the runtime's kernels train it.
fedsgd        one gradient step on the client's whole data (``full_batch``).
proportional  the mean of the deltas weighted by example count |D_k| / sum |D_j|.
uniform       the plain mean of the deltas.

The presets pair them with every server optimizer of Reddi et al.'s SERVEROPT family
(fedray.algorithms.server_opt): FedAvgM, FedAdam, FedYogi, FedAdagrad.
"""

from __future__ import annotations

from fedray.algorithms.base import Aggregator, ClientWork, LocalUpdate
from fedray.algorithms.registry import register, register_preset


@register
class LocalSGD(ClientWork):
    name = "local_sgd"


@register
class FedSGD(ClientWork):
    name = "fedsgd"
    full_batch = True


@register
class Proportional(Aggregator):
    name = "proportional"


@register
class Uniform(Aggregator):
    name = "uniform"
    unit_weights = True

    def weight(self, update: LocalUpdate) -> float:
        return 1.0


register_preset("fedavg", "local_sgd", "proportional", "sgd")
register_preset("fedsgd", "fedsgd", "proportional", "sgd")
register_preset("fedavgm", "local_sgd", "proportional", "momentum")
register_preset("fednesterov", "local_sgd", "proportional", "nesterov")
register_preset("fedadam", "local_sgd", "proportional", "adam")
register_preset("fedyogi", "local_sgd", "proportional", "yogi")
register_preset("fedadagrad", "local_sgd", "proportional", "adagrad")
