"""Clustered federated learning: IFCA (Ghosh et al., NeurIPS 2020).

K models are trained at once. Every round each participating client measures the loss of
each model on its training data, takes the one with the lowest loss (its cluster for the
round, ties to the lower index), trains it, and each model moves to the example-weighted
average of its own clients' trained models (model averaging). With ``averaging: gradient``
a client instead takes one full-batch gradient step at client.lr, so the average is the
paper's gradient averaging, theta_j - lr * (mean gradient of cluster j).

Where the K models live: model 0 is the runtime's global model (what the central test set
and checkpoints' ``weights`` hold, stepped by the server optimizer with the update
``finish`` returns); models 1..K-1 are the aggregator's state ``models`` ((K-1) x d,
checkpointed with it, saved in server_state.safetensors) and go to the clients in the
round's one broadcast. The models start from K independent initializations of the job's
model, model j's from the stream (seed, TAG_CLUSTER, j) (model 0: the run's own).
Because the other models are averaged here rather than by the server optimizer, IFCA
needs ``algorithm.server_opt: sgd`` at ``server.lr: 1`` (refused otherwise).

Each trained client's cluster is the ``cluster`` column of the round's participants table
(participants/round_<r>.arrow); federated evaluation evaluates each client with the model
of lowest loss on its training split and records that choice in its table's ``cluster``
column. At the end of a run, model j > 0 is also saved as models/cluster_<j>.safetensors,
a state_dict like model.safetensors (which holds model 0).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from fedray.algorithms.base import (
    Aggregator,
    ClientContext,
    ClientWork,
    LocalUpdate,
    PartialSum,
    Phase,
    WorkerEnv,
    require,
)
from fedray.algorithms.registry import register, register_preset

__all__ = ["IFCAAggregator", "IFCAClient", "IFCAParams", "choose_cluster"]

MODELS = "ifca_models"  # the broadcast key of models 1..K-1


@dataclass
class IFCAParams:
    clusters: int = 2  # K, the number of models (2 or more)
    averaging: str = "model"  # model: local training, models averaged; gradient: one step


def _check(params: IFCAParams) -> None:
    require(params.clusters >= 2, "clusters", "must be >= 2 (one cluster is FedAvg)",
            params.clusters)
    require(params.averaging in ("model", "gradient"), "averaging", "must be model or gradient",
            params.averaging)


def cluster_models(env: WorkerEnv) -> list[torch.Tensor]:
    """The K models of the round, as the clients see them: the global one, then the
    broadcast rest."""
    others = env.broadcast[MODELS]
    return [env.global_weights, *others.reshape(-1, env.model.size).unbind(0)]


def choose_cluster(env: WorkerEnv, models: list[torch.Tensor], x: torch.Tensor,
                   y: torch.Tensor) -> int:
    """The index of the model of lowest mean loss on (x, y); ties to the lower index."""
    losses = [env.risk(m, x, y) for m in models]
    return min(range(len(losses)), key=lambda j: (losses[j], j))


@register
class IFCAClient(ClientWork):
    """A client picks the model of lowest loss on its data and trains it."""

    name = "ifca"
    section = "ifca"
    Params = IFCAParams
    uses_broadcast = (MODELS,)
    columns = ("cluster",)

    def check(self, params: IFCAParams) -> None:
        _check(params)
        # gradient averaging: one step on all of a client's examples
        self.full_batch = params.averaging == "gradient"

    def phases(self, env: WorkerEnv, ctx: ClientContext) -> list[Phase]:
        models = cluster_models(env)
        j = choose_cluster(env, models, ctx.x, ctx.y) if len(ctx.y) else 0
        ctx.scratch["cluster"] = j
        ctx.columns["cluster"] = j
        steps = 1 if self.params.averaging == "gradient" else None
        return [Phase(start=models[j] if j else "global", steps=steps)]

    def eval_weights(self, env: WorkerEnv, cid: int,
                     state: dict[str, torch.Tensor] | None) -> torch.Tensor | None:
        models = cluster_models(env)
        x, y = env.client_split(cid, "train")
        j = choose_cluster(env, models, x, y) if len(y) else 0
        self._evaluated = (cid, j)
        return models[j].clone()

    def eval_columns(self, env: WorkerEnv, cid: int) -> dict[str, float]:
        done = getattr(self, "_evaluated", None)
        return {"cluster": done[1]} if done is not None and done[0] == cid else {}


@register
class IFCAAggregator(Aggregator):
    """Each model moves to the weighted average of its own clients' trained models."""

    name = "ifca"
    section = "ifca"
    Params = IFCAParams
    provides = (MODELS,)
    requires_columns = ("cluster",)  # which model each client trained: IFCA's client's
    # the other models are averaged here: only plain SGD at lr 1 moves model 0 the same way
    plain_server = True

    def check(self, params: IFCAParams) -> None:
        _check(params)

    def _size(self, size: int) -> None:
        """Per-model sums of the update's length (the model's ``size``: buffers included)."""
        self._d = size
        self.extras = {"ifca_sum": self.params.clusters * size,
                       "ifca_weight": self.params.clusters}

    def setup(self, env: WorkerEnv) -> None:
        self._size(env.model.size)

    def init_server(self, num_params: int, population: int) -> None:
        super().init_server(num_params, population)
        self._counts = [0.0] * self.params.clusters

    def init_weights(self, weights: torch.Tensor,
                     model_init: Callable[[int], torch.Tensor]) -> None:
        self._size(weights.numel())
        self.state["models"] = torch.stack([model_init(j)
                                            for j in range(1, self.params.clusters)])

    def broadcast(self) -> dict[str, torch.Tensor]:
        return {MODELS: self.state["models"]}

    def models(self) -> dict[str, torch.Tensor]:
        return {f"cluster_{j}": m for j, m in enumerate(self.state["models"], start=1)}

    def accumulate(self, env: WorkerEnv, ctx: ClientContext, update: LocalUpdate,
                   acc: PartialSum) -> None:
        w = self.weight(update)
        acc.add(update.delta, w)
        j = ctx.scratch.get("cluster", 0)
        d = update.delta.numel()
        part = acc.extras["ifca_sum"][j * d:(j + 1) * d]
        part.add_(update.delta, alpha=w)  # y - x_0 ...
        if j:  # ... + x_0 - x_j = y - x_j, the client's move from its own model
            part.add_(env.global_weights - cluster_models(env)[j], alpha=w)
        acc.extras["ifca_weight"][j] += w

    def finish(self, acc: PartialSum) -> torch.Tensor:
        k, d = self.params.clusters, self._d
        sums = acc.extras["ifca_sum"].reshape(k, d)
        weight = acc.extras["ifca_weight"]
        self._counts = weight.tolist()
        for j in range(1, k):
            if weight[j] > 0:
                self.state["models"][j - 1] += (sums[j] / weight[j]).to(torch.float32)
        if weight[0] > 0:
            return sums[0] / weight[0]
        return torch.zeros(d, dtype=torch.float64)

    def round_metrics(self) -> dict[str, float]:
        total = sum(self._counts) or 1.0
        return {f"ifca_share_{j}": w / total for j, w in enumerate(self._counts)}


register_preset("ifca", "ifca", "ifca", "sgd")
