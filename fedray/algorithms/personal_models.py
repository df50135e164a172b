"""Personal models: every client keeps a whole model of its own beside the global one.

``ditto``  Li, Hu, Beirami, Smith, "Ditto: Fair and Robust Federated Learning Through
           Personalization", ICML 2021, Algorithm 1.

Each preset keeps its per-client tensors in the client state store (versioned: a resume and
any worker count see the same personal models) and evaluates every client with its own
model (``eval_weights``), the global model's numbers beside it (docs/evaluation.md). A
personal model is one model-sized tensor per client that has trained: mind the store's size
for a large population (``fedray run`` prints its estimate before round 1).

Ditto. In a round, client k is sent w^t and

1. trains the global model as FedAvg's local solver does (the job's ``client`` section) and
   sends the update; the server averages the updates (``proportional``), as FedAvg;
2. trains its personal model v_k (stored; a client without one starts from w^t, as the
   paper's Algorithm 1 leaves open and FL-bench and PFLlib do) by local SGD on
   f_k(v) + lam/2 ||v - w^t||^2, sending nothing.

lam sets how far a personal model strays from the global one: 0 is local training alone,
lam -> infinity pins v_k to w^t. The personal phase's ``steps`` or ``epochs`` and ``lr``
default to the client section's (as many personal steps as global ones). Both phases are
``Phase``s that fedray's kernels run, vectorized where the model allows; the personal phase
draws its batches from its own stream (derived from the client's round seed), so it never
shifts the global phase's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedray.algorithms.base import (
    ClientContext,
    ClientWork,
    LocalTerms,
    Phase,
    WorkerEnv,
    require,
    require_length,
)
from fedray.algorithms.registry import register, register_preset


class PersonalModel(ClientWork):
    """A client part whose clients keep a whole model, ``personal``, and are evaluated
    with it (a client that never trained with the global model)."""

    state = ("personal",)

    def eval_weights(self, env: WorkerEnv, cid: int,
                     state: dict[str, torch.Tensor] | None) -> torch.Tensor | None:
        return state.get("personal") if state else None


@dataclass
class DittoParams:
    lam: float = 0.1  # the pull of a personal model toward the global one
    steps: int | None = None  # the personal phase's local steps (None: the job's)
    epochs: int | None = None  # ... or passes over the client's data
    lr: float | None = None  # its learning rate (None: client.lr)


@register
class Ditto(PersonalModel):
    name = "ditto"
    section = "ditto"
    Params = DittoParams

    def check(self, params: DittoParams) -> None:
        require(isinstance(params.lam, int | float) and 0 <= params.lam < float("inf"),
                "lam", "must be a finite number >= 0", params.lam)
        require_length(params.steps, params.epochs, params.lr)

    def phases(self, env: WorkerEnv, ctx: ClientContext) -> list[Phase]:
        p = self.params
        personal = ctx.state.get("personal") if ctx.state else None
        return [
            Phase(),  # the global update: FedAvg's local SGD from w^t, sent up
            Phase(start="global" if personal is None else personal,
                  terms=LocalTerms(proximal=float(p.lam)), steps=p.steps, epochs=p.epochs,
                  lr=p.lr, send=False, keep="personal"),
        ]


register_preset("ditto", "ditto", "proportional", "sgd")
