"""Ditto (Li, Hu, Beirami, Smith, "Ditto: Fair and Robust Federated Learning Through
Personalization", ICML 2021, Algorithm 1): a personal model per client, written against the
public API only, kept outside the fedray package.

Each client k keeps a personal model v_k next to the global model w. In a round it is sent
w^t and does two things:

1. the global update, as FedAvg's local solver: w_k from w^t by local SGD on f_k, sent up
   (the server averages the updates into w^(t+1), as FedAvg does);
2. the personal update: from its stored v_k, s local steps on
   h_k(v) = f_k(v) + lam/2 ||v - w^t||^2, i.e. v <- v - lr (grad f_k(v) + lam (v - w^t)),
   kept on the client, never sent.

lam sets how far a personal model may stray from the global one: lam = 0 is local training
only (each client's own model), lam -> infinity pins v_k to w^t (FedAvg's model). The paper
evaluates each client with its personal model, which is the point: it is fair (the worst
clients gain most) and robust to corrupted clients (their data do not reach the others'
personal models beyond the global pull).

Why it needs no training loop: a client's work is a list of ``Phase``s that fedray's own
kernels run (one client after another, or vectorized in groups):

- phase 0 starts from the global model, trains with the job's ``client`` section and is the
  client's update (``send=True``);
- phase 1 starts from the stored personal model (the state key ``personal``; a client that
  has none yet starts from w^t, as PFLlib and FL-bench initialise theirs), adds the
  proximal term ``LocalTerms(proximal=lam)`` -- whose anchor is a phase's broadcast model
  w^t, exactly Ditto's pull -- and stores its trained weights under ``personal``
  (``keep``), sending nothing (``send=False``). It draws its batches from its own seed
  (derived from the client's round seed and the phase index), so it never shifts phase 0's.
- ``eval_weights`` returns the stored personal model, so federated evaluation and
  ``eval.personalize`` measure each client's personal model; a client that never trained
  falls back to the global model (``None``).

The personal model is stored versioned in the client state store (one model per client
that has trained: mind ``state.max_mb`` / the store's size for a large population).

Its hyper-parameters (``algorithm.ditto``): ``lam`` (>= 0), and for the personal phase
``steps`` or ``epochs`` and ``lr`` (unset: the job's ``client.local_steps``/``local_epochs``
and ``client.lr``, the paper's default of as many personal as global steps).

Run it by import path, from the repository root:

    fedray run jobs/quickstart.yaml model.name=mlp \\
        algorithm.client=examples.personal_model:Ditto algorithm.ditto.lam=0.1 \\
        eval.federated_clients=20
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
)


@dataclass
class DittoParams:
    lam: float = 0.1  # the pull of a personal model toward the global one
    steps: int | None = None  # the personal phase's local steps (None: the job's)
    epochs: int | None = None  # ... or passes over the client's data
    lr: float | None = None  # its learning rate (None: client.lr)


class Ditto(ClientWork):
    name = "ditto"
    section = "ditto"
    Params = DittoParams
    state = ("personal",)

    def check(self, params: DittoParams) -> None:
        require(params.lam >= 0, "lam", "must be >= 0", params.lam)
        require(params.steps is None or params.steps >= 1, "steps", "must be >= 1 (or unset)",
                params.steps)
        require(params.epochs is None or params.epochs >= 1, "epochs",
                "must be >= 1 (or unset)", params.epochs)
        require(params.steps is None or params.epochs is None, "steps",
                "give steps or epochs, not both", params.steps)
        require(params.lr is None or params.lr > 0, "lr", "must be > 0 (or unset)", params.lr)

    def phases(self, env: WorkerEnv, ctx: ClientContext) -> list[Phase]:
        p = self.params
        personal = ctx.state.get("personal") if ctx.state else None
        return [
            Phase(),  # the global update: FedAvg's local SGD from w^t, sent up
            Phase(start="global" if personal is None else personal,
                  terms=LocalTerms(proximal=p.lam), steps=p.steps, epochs=p.epochs, lr=p.lr,
                  send=False, keep="personal"),
        ]

    def eval_weights(self, env: WorkerEnv, cid: int,
                     state: dict[str, torch.Tensor] | None) -> torch.Tensor | None:
        return state.get("personal") if state else None
