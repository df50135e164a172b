"""q-FedAvg (Li, Sanjabi, Beirami, Smith, "Fair Resource Allocation in Federated Learning",
ICLR 2020, Algorithm 2): a user's aggregator, kept outside the fedray package.

q-FFL minimises sum_k F_k(w)^(q+1) / (q+1) instead of the mean risk, so clients that the
global model serves badly (large F_k) weigh more, and q sets how much more (q = 0: the plain
mean). q-FedAvg is its federated solver. Client k trains locally from the global model x as
in FedAvg (y_k, its delta d_k = y_k - x); with F_k its mean training loss at x and L an
estimate of the local Lipschitz constant of the gradient:

    dw_k    = L (x - y_k) = -L d_k
    Delta_k = F_k^q dw_k
    h_k     = q F_k^(q-1) ||dw_k||^2 + L F_k^q
    x      <- x - sum_k Delta_k / sum_k h_k

Why it is a fedray aggregator: the update is a weighted mean. Each client adds the value
v_k = -Delta_k / h_k with the weight h_k, and the partial sum's mean sum_k h_k v_k / sum_k h_k
is -sum_k Delta_k / sum_k h_k, the step to add (run it with server_opt sgd and server.lr 1,
the preset default). Weighted means are associative: workers fold their clients into one
partial sum each, the driver merges them, and any split of the clients over workers gives
the same update up to float64 rounding -- no per-client model ever reaches the driver.

Two edge cases of the formula. q = 0: F_k^0 = 1 and the first term of h_k vanishes, so
h_k = L and the update is the plain mean of the deltas (FedAvg with uniform weights; L cancels).
F_k = 0 with q > 0: Delta_k = 0, and h_k -> 0 as well (for a non-negative L-smooth loss
||grad F_k||^2 <= 2 L F_k, so q F_k^(q-1) ||dw_k||^2 = O(F_k^q)): the client adds nothing. A
client whose risk or h_k is not finite adds nothing either, like a non-finite update, which
the runtime's guard drops.

Use it by import path, from the repository root (or with this directory's parent importable):

    fedray run jobs/quickstart.yaml algorithm.aggregator=examples.qffl:QFedAvg \\
        algorithm.qffl.q=1 algorithm.qffl.lipschitz=10
"""

from __future__ import annotations

import math
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


@dataclass
class QFFLParams:
    q: float = 1.0  # fairness: 0 is the plain mean, larger q weighs high-loss clients more
    lipschitz: float = 1.0  # L: the paper tunes it like 1 / client.lr


def qffl_terms(risk: float, delta_sq_norm: float, q: float, lipschitz: float
               ) -> tuple[float, float]:
    """(F_k^q L, h_k) of one client: its delta's factor in sum_k Delta_k (up to the sign)
    and its weight, from its risk F_k at the global model and ||d_k||^2 (||dw_k||^2 is
    L^2 ||d_k||^2)."""
    if q == 0:
        return lipschitz, lipschitz  # F^0 = 1 even for F = 0; the q F^(q-1) term is 0
    if risk <= 0:
        return 0.0, 0.0  # see the module's docstring: the limit F_k -> 0
    fq = risk ** q
    h = q * risk ** (q - 1) * lipschitz ** 2 * delta_sq_norm + lipschitz * fq
    return lipschitz * fq, h


class QFedAvg(Aggregator):
    name = "qffl"
    section = "qffl"
    Params = QFFLParams

    def check(self, params: QFFLParams) -> None:
        require(params.q >= 0, "q", "must be >= 0", params.q)
        require(params.lipschitz > 0, "lipschitz", "must be > 0", params.lipschitz)

    def accumulate(self, env: WorkerEnv, ctx: ClientContext, update: LocalUpdate,
                   acc: PartialSum) -> None:
        p = self.params
        risk = env.risk(env.global_weights, ctx.x, ctx.y)  # F_k at x, on its training data
        delta = update.delta[: env.num_params].double()
        scale, h = qffl_terms(risk, float(delta.dot(delta)), p.q, p.lipschitz)
        if not (h > 0 and math.isfinite(h) and math.isfinite(scale)):
            return
        # v_k = -Delta_k / h_k = F_k^q L d_k / h_k, with weight h_k
        acc.add(update.delta.to(torch.float64) * (scale / h), h)
