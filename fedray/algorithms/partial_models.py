"""Partial models: every client keeps some layers of the model local, the rest is shared.

``fedper``     Arivazhagan, Aggarwal, Singh, Choudhary, "Federated Learning with
               Personalization Layers", 2019: a shared body, a local head.
``fedrep``     Collins, Hassani, Mokhtari, Shakkottai, "Exploiting Shared Representations
               for Personalized Federated Learning", ICML 2021 (Algorithm 1): a local head
               trained first, with the body frozen, then the body with the head frozen; the
               body is sent.
``lg_fedavg``  Liang, Liu, Ziyin, Allen, Auerbach, Brent, Salakhutdinov, Morency, "Think
               Locally, Act Globally: Federated Learning with Local and Global
               Representations", 2020: a local body (the representation), a shared head.
``fedbn``      Li, Jiang, Zhang, Kamp, Dou, "FedBN: Federated Learning on Non-IID Features
               via Local Batch Normalization", ICLR 2021: normalization layers local (their
               affine parameters and running statistics), the rest shared.

All four are a ``ClientWork`` whose ``local`` parameters never leave the client: the update
sent up has them zeroed (they are never averaged), the trained values go to the client
state store under ``local`` (versioned: a resume and any worker count see the same ones),
a round starts from the broadcast model with the client's own values put in (a client that
has none yet starts from the broadcast ones, the shared initialisation), and each client
is evaluated with the global model's shared part and its own local part, the global
model's numbers beside it (docs/evaluation.md). The aggregator is FedAvg's proportional
mean over the shared part; the global model's local part stays at its initial values (it
is only the start of clients that never trained).

Which parameters are the head, the body or the normalization layers is a selector
(fedray.core.model_parts): ``@head`` is the model's ``fedray_head`` or its last layer with
parameters (``logreg``'s bias), ``@norm`` its BatchNorm/GroupNorm/LayerNorm layers, or a
list of parameter-name prefixes (``algorithm.fedper.head: [classifier.3.]``). A selection
that is empty, or that leaves nothing shared, is refused in one line when the workers build
the model. FedPer, LG-FedAvg and FedBN train in one phase and FedRep in two, all run by
fedray's kernels and vectorized where the model allows (FedBN's models have BatchNorm
buffers, which the vectorized kernels refuse: they train one client after another).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fedray.algorithms.base import (
    ClientContext,
    ClientWork,
    ParamError,
    Phase,
    WorkerEnv,
    require,
    require_length,
)
from fedray.algorithms.registry import register, register_preset
from fedray.core.model_parts import describe

SPEC_RULE = ("must be a non-empty list of parameter-name prefixes or the selectors @head, "
             "@body, @norm")


def check_spec(key: str, spec: list[str]) -> None:
    """A list of parameter-name prefixes and selectors (no ``!``: the presets derive the
    complement themselves)."""
    require(isinstance(spec, list | tuple) and len(spec) > 0
            and all(isinstance(e, str) and e.strip() and not e.startswith("!")
                    and (not e.startswith("@") or e in ("@head", "@body", "@norm"))
                    for e in spec), key, SPEC_RULE, spec)


def complement(spec: tuple[str, ...]) -> tuple[str, ...]:
    """Every parameter ``spec`` does not select (model_parts' ``!`` entries)."""
    return tuple(f"!{e}" for e in spec)


class PartialModel(ClientWork):
    """A client part whose ``local`` parameters (a selector spec, per instance from its
    Params) stay with the client. ``what`` names them in errors."""

    key: str = "head"  # the Params field holding the spec
    what: str = "head"
    hint: str = ""

    def __init__(self, params=None):
        super().__init__(params)
        self.spec = tuple(getattr(self.params, self.key))
        self.local = self.local_spec()

    def local_spec(self) -> tuple[str, ...]:
        return self.spec

    def check(self, params) -> None:
        check_spec(self.key, getattr(params, self.key))

    def check_model(self, model) -> None:
        """Refuse a selection that picks nothing (the run would be FedAvg, silently) or
        everything (nothing would be shared), naming the model's parts."""
        n = int(model.positions(self.local).numel())
        if not 0 < n < model.size:
            found = "no parameter" if n == 0 else "every parameter"
            raise ParamError(self.key, f"keeps {found} of the model local (its {self.what} "
                             f"would be {'empty' if n == 0 else 'the whole model'}; the "
                             f"model's parts: {describe(model.module)}{self.hint})",
                             list(self.spec))


@dataclass
class HeadParams:
    # the head: parameter-name prefixes, or a selector (fedray.core.model_parts)
    head: list[str] = field(default_factory=lambda: ["@head"])


@register
class FedPer(PartialModel):
    name = "fedper"
    section = "fedper"
    Params = HeadParams


@register
class LGFedAvg(PartialModel):
    name = "lg_fedavg"
    section = "lg_fedavg"
    Params = HeadParams
    what = "body"

    def local_spec(self) -> tuple[str, ...]:
        return complement(self.spec)  # the body: everything but the head


@dataclass
class FedRepParams:
    head: list[str] = field(default_factory=lambda: ["@head"])
    # the head's phase: local epochs or steps over the client's data, and its learning
    # rate (None: the client section's)
    head_epochs: int | None = 5
    head_steps: int | None = None
    head_lr: float | None = None


@register
class FedRep(PartialModel):
    name = "fedrep"
    section = "fedrep"
    Params = FedRepParams

    def check(self, params: FedRepParams) -> None:
        super().check(params)  # head_steps wins over head_epochs, as eval.personalize's
        require_length(params.head_steps, None if params.head_steps is not None
                       else params.head_epochs, params.head_lr, "head_")

    def phases(self, env: WorkerEnv, ctx: ClientContext) -> list[Phase]:
        p = self.params
        return [
            # the head, from the global body and the client's own head, body frozen
            Phase(trainable=self.spec, steps=p.head_steps,
                  epochs=None if p.head_steps is not None else p.head_epochs, lr=p.head_lr,
                  send=False),
            # then the body with the head frozen (the client section's length): sent
            Phase(start="previous", trainable=complement(self.spec)),
        ]


@dataclass
class NormParams:
    # the normalization layers: prefixes, or a selector (fedray.core.model_parts)
    norm: list[str] = field(default_factory=lambda: ["@norm"])


@register
class FedBN(PartialModel):
    name = "fedbn"
    section = "fedbn"
    Params = NormParams
    key = "norm"
    what = "normalization layers"
    hint = "; a model with BatchNorm: model.name=emnist_cnn_bn or cifar_cnn_bn"


register_preset("fedper", "fedper", "proportional", "sgd")
register_preset("fedrep", "fedrep", "proportional", "sgd")
register_preset("lg_fedavg", "lg_fedavg", "proportional", "sgd")
register_preset("fedbn", "fedbn", "proportional", "sgd")
