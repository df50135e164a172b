"""FedBuff (Nguyen et al., AISTATS 2022): buffered asynchronous aggregation.

Clients train concurrently and asynchronously; the server keeps a buffer and, once K
updates have arrived, applies their staleness-weighted mean
    x <- x + eta * (1/K) sum_i s(tau_i) Delta_i,   s(tau) = 1 / sqrt(1 + tau),
where tau_i counts the server steps applied since the model client i started from. The
schedule -- who trains when, from which version, which K updates make a step -- is the
runtime's (``sampling.concurrency`` on the simulated clock, fedray.timing.buffered); this
part only weights: it reads the staleness the runtime gives each client
(``ClientContext.staleness``) and divides by K, the buffer's fixed size, rather than by the
weights' sum. The server step is any server optimizer (``sgd`` with ``server.lr``: eta).
"""

from __future__ import annotations

import math
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

STALENESS = {
    "sqrt": lambda tau: 1.0 / math.sqrt(1.0 + tau),  # the paper's choice
    "none": lambda tau: 1.0,  # every update counts fully, however stale
}


@dataclass
class FedBuffParams:
    staleness: str = "sqrt"  # sqrt: 1/sqrt(1 + tau); none: 1


@register
class FedBuffAggregator(Aggregator):
    name = "fedbuff"
    section = "fedbuff"
    Params = FedBuffParams

    def check(self, params: FedBuffParams) -> None:
        require(params.staleness in STALENESS, "staleness",
                f"must be one of: {', '.join(STALENESS)}", params.staleness)

    def accumulate(self, env: WorkerEnv, ctx: ClientContext, update: LocalUpdate,
                   acc: PartialSum) -> None:
        """s(tau) * Delta into the sum, 1 into the count: the mean is over K, not over the
        weights (a stale buffer moves the model less)."""
        acc.add(update.delta.mul(STALENESS[self.params.staleness](ctx.staleness)), 1.0)


register_preset("fedbuff", "local_sgd", "fedbuff", "sgd")
