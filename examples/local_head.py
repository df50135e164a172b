"""FedPer (Arivazhagan, Aggarwal, Singh, Choudhary, "Federated Learning with Personalization
Layers", 2019): a local head, written against the public API only, kept outside the fedray
package.

A model is a shared body (the base layers) and a head (the personalization layers). Every
round each sampled client trains the whole model from the global body and its *own* head,
sends up only the body's update, and keeps its trained head; the server averages the bodies
as FedAvg does. The head never leaves the client, so under label or feature skew each
client keeps a classifier fitted to its own data on top of the features all clients learn
together.

Why it is one class attribute and no training loop: ``ClientWork.local`` names the
parameters (by prefix, as ``model.named_parameters()`` spells them) that stay with the
client, and fedray does the rest inside its own kernels (sequential or vectorized):

- a ``"global"`` phase start is the broadcast model with the client's stored ``local``
  entries put in place of the broadcast ones (a client that has none yet starts from the
  broadcast head, as FedPer's clients start from the shared initialisation);
- the update sent up has the ``local`` entries zeroed, so they are never averaged (the
  global model's head stays at its initial values: it is only the starting head of clients
  that never trained);
- the trained ``local`` entries go to the client state store under the key ``local``,
  versioned, so a resume and any worker count see the same heads;
- federated evaluation (``eval.federated_clients``) and ``eval.personalize`` evaluate each
  client with the global body and its own head (``ClientWork.eval_weights``' default), a
  client that never trained with the global model's.

Which layers are the head is ``algorithm.local_head.prefix``: the default ``3.`` is the
output layer of fedray's ``mlp`` (``nn.Sequential(Flatten, Linear, ReLU, Linear)``: the
parameters ``3.weight`` and ``3.bias``). For ``logreg`` (one Linear, ``1.``) a head that is
the whole model would leave nothing to share; keep its per-class bias local instead
(``prefix=1.bias``). A prefix that names no parameter of the model, or all of them, is
refused when the workers build the model.

Run it by import path, from the repository root:

    fedray run jobs/quickstart.yaml model.name=mlp \\
        algorithm.client=examples.local_head:LocalHead eval.federated_clients=20
    fedray run jobs/quickstart.yaml model.name=logreg \\
        algorithm.client=examples.local_head:LocalHead algorithm.local_head.prefix=1.bias
"""

from __future__ import annotations

from dataclasses import dataclass

from fedray.algorithms.base import ClientWork, WorkerEnv, require


@dataclass
class LocalHeadParams:
    # parameter-name prefix of the head (one prefix: "3." is the mlp's output layer)
    prefix: str = "3."


class LocalHead(ClientWork):
    name = "local_head"
    section = "local_head"
    Params = LocalHeadParams

    def __init__(self, params: LocalHeadParams | None = None):
        super().__init__(params)
        # per instance, from the job: which parameters stay with the client
        self.local = (self.params.prefix,)

    def check(self, params: LocalHeadParams) -> None:
        require(bool(params.prefix.strip()), "prefix",
                "must name the head's parameters (a prefix such as '3.')", params.prefix)

    def setup(self, env: WorkerEnv) -> None:
        """Refuse a prefix that selects nothing (the run would be FedAvg, silently) or every
        parameter (nothing would be shared)."""
        names = [name for name, _, _ in env.model.spans[: len(env.model.param_list)]]
        head = [n for n in names if n.startswith(self.params.prefix)]
        if not head or len(head) == len(names):
            what = "no parameter" if not head else "every parameter"
            raise ValueError(f"config key 'algorithm.local_head.prefix': {self.params.prefix!r} "
                             f"selects {what} of the model (its parameters: "
                             f"{', '.join(names)})")
