"""SCAFFOLD (Karimireddy et al., ICML 2020): local steps corrected by control variates.

Client (Alg. 1, lines 8-12): every local step is y <- y - lr (g(y) - c_i + c), i.e. the
local objective gains the linear term (c - c_i) . y: ``LocalTerms(linear=c - c_i)``. After
training the client's control variate becomes c_i+ by option I (the gradient of its whole
data at the global model, one extra pass) or option II (c_i - c + (x - y_i) / (K lr), K the
local steps it took), ``algorithm.scaffold.option``. c_i is per-client state, kept in the
client state store; it starts at zero.

Server (lines 13-17): the model moves by the plain mean of the deltas; c <- c + (1/N) sum
dc_i over the round's clients, N the population, dc_i = c_i+ - c_i summed on the workers
as an extra of the partial sum. c is the aggregator's state, broadcast with the weights.
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
from fedray.core.seeding import TAG_CONTROL, derive_seed
from fedray.kernels.sequential import full_gradient


@dataclass
class ScaffoldParams:
    option: int = 2  # the control-variate update: 1 (gradient at x) or 2 (from the delta)


@register
class ScaffoldClient(ClientWork):
    name = "scaffold"
    section = "scaffold"
    Params = ScaffoldParams
    state = ("c",)
    uses_broadcast = ("c",)
    extras = {"dc": "params"}

    def check(self, params: ScaffoldParams) -> None:
        require(params.option in (1, 2), "option", "must be 1 or 2", params.option)

    def setup(self, env: WorkerEnv) -> None:
        self._ci_new = torch.zeros(env.num_params, device=env.device)

    def terms(self, env: WorkerEnv, ctx: ClientContext) -> LocalTerms:
        c = env.broadcast["c"]
        if ctx.state is None:  # before its first round: c_i = 0
            ci = torch.zeros_like(c)
        else:
            ci = ctx.state["c"].to(env.device, non_blocking=True)
        ctx.scratch["ci"] = ci
        return LocalTerms(linear=c - ci)

    def finish(self, env: WorkerEnv, ctx: ClientContext, update: LocalUpdate,
               acc: PartialSum) -> dict[str, torch.Tensor]:
        ci, new = ctx.scratch["ci"], self._ci_new
        if self.params.option == 1:  # c_i+ = g_i(x), one extra pass at the global model
            full_gradient(env.model, env.global_weights, ctx.x, ctx.y,
                          batch_size=ctx.batch_size, seed=derive_seed(ctx.seed, TAG_CONTROL),
                          out=new, loss=env.loss)
        else:  # c_i+ = c_i - c + (x - y_i) / (K lr), K = the local steps actually taken
            torch.sub(ci, env.broadcast["c"], out=new)
            new.add_(update.delta[: env.num_params], alpha=-1.0 / (update.steps * env.lr))
        acc.add_extra("dc", new)  # dc_i = c_i+ - c_i, without a temporary
        acc.add_extra("dc", ci, -1.0)
        return {"c": new}


@register
class ScaffoldAggregator(Aggregator):
    name = "scaffold"
    provides = ("c",)
    requires_extras = ("dc",)

    def weight(self, update: LocalUpdate) -> float:
        return 1.0

    def init_server(self, num_params: int, population: int) -> None:
        super().init_server(num_params, population)
        self.state["c"] = torch.zeros(num_params, dtype=torch.float32)

    def broadcast(self) -> dict[str, torch.Tensor]:
        return {"c": self.state["c"]}

    def finish(self, acc: PartialSum) -> torch.Tensor:
        delta = acc.mean()
        c = self.state["c"]
        self.state["c"] = (c.double() + acc.extras["dc"] / self.population).float()
        return delta


register_preset("scaffold", "scaffold", "scaffold", "sgd")
