"""A client's local objective and local optimizer, as fedray's kernels run them: the terms
a part adds to the loss (``LocalTerms``), transforms of the gradient, the client optimizer,
what a stretch of local training returns (``LocalUpdate``), and the checks of a part's
hyper-parameters.

Why a module of their own: the kernels (fedray.kernels) run these, and the parts' API
(fedray.algorithms.base, which re-exports every name here) calls the kernels, so the
vocabulary both speak sits below both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch


class ParamError(ValueError):
    """A hyper-parameter a part rejects: ``key`` is the field's name in the part's
    ``Params``; the runtime reports it as ``config key 'algorithm.<section>.<key>'``."""

    def __init__(self, key: str, rule: str, value: Any):
        super().__init__(f"{key}: {rule}, got {value!r}")
        self.key, self.rule, self.value = key, rule, value


def require(ok: bool, key: str, rule: str, value: Any) -> None:
    """For a part's ``check``: raise ``ParamError`` unless ``ok``."""
    if not ok:
        raise ParamError(key, rule, value)


def finite_number(value: Any) -> bool:
    """A real number, not a bool, and finite: what most hyper-parameters must be (a YAML
    ``.inf`` or ``true`` would otherwise pass a comparison)."""
    return isinstance(value, int | float) and not isinstance(value, bool) \
        and math.isfinite(value)


def require_length(steps: int | None, epochs: int | None, lr: float | None,
                   prefix: str = "") -> None:
    """For a part's ``check``: a phase's own length and learning rate, each optional (None:
    the job's client section), ``steps`` or ``epochs`` but not both; the keys are
    ``{prefix}steps``, ``{prefix}epochs`` and ``{prefix}lr``."""
    for key, value in ((f"{prefix}steps", steps), (f"{prefix}epochs", epochs)):
        require(value is None or isinstance(value, int) and not isinstance(value, bool)
                and value >= 1, key, "must be an integer >= 1 (or unset)", value)
    require(steps is None or epochs is None, f"{prefix}steps", "give steps or epochs, not "
            "both", steps)
    require(lr is None or finite_number(lr) and lr > 0, f"{prefix}lr",
            "must be > 0 (or unset)", lr)


@dataclass(frozen=True)
class LocalTerms:
    """The terms a client's local objective adds to its training loss f_k, as they enter the
    gradient of every local step: ``grad f_k(w) + linear + proximal (w - x)``, x the global
    model. FedProx is ``proximal`` > 0; SCAFFOLD's correction c - c_i is ``linear``; FedDyn
    is both. Every kernel (one client after another, torch.func's vmap, the closed-form
    chain step) consumes this one description, through the two methods below."""

    proximal: float = 0.0
    linear: torch.Tensor | None = None  # flat, one value per parameter (or None: no term)

    def add_to_(self, grad: torch.Tensor, w: torch.Tensor, anchor: torch.Tensor,
                linear: torch.Tensor | None) -> None:
        """grad += linear + proximal (w - anchor), for one parameter (or a stack of them):
        ``linear`` is this parameter's slice of ``self.linear`` (stacked alike)."""
        if linear is not None:
            grad.add_(linear)
        if self.proximal:
            grad.add_(w - anchor, alpha=self.proximal)

    def gradient(self, w: torch.Tensor, anchor: torch.Tensor,
                 linear: torch.Tensor | None) -> torch.Tensor | None:
        """linear + proximal (w - anchor), or None when there is no term. Without a proximal
        term it is ``linear`` itself (not a copy): read it, do not modify it."""
        if not self.proximal:
            return linear
        if linear is None:
            return (w - anchor).mul_(self.proximal)
        out = linear.expand_as(w).clone()
        out.add_(w - anchor, alpha=self.proximal)
        return out

    @property
    def empty(self) -> bool:
        return self.linear is None and not self.proximal


NO_TERMS = LocalTerms()  # plain local SGD


class GradTransform:
    """A change to every local step's gradient before the step is taken: clipping,
    normalisation. ``__call__`` takes one client's gradient, a tuple of tensors shaped like
    the model's parameters (their order), and returns the new one; it must be a pure tensor
    function (no ``.item()``, no branching on values: ``torch.where`` instead), so the
    vectorized kernels run it under ``vmap`` for a whole group of clients at once.

    ``per_example``: the transform is applied to each example's gradient (computed with
    torch.func's ``vmap(grad)`` over the batch) and the transformed gradients are averaged
    over the batch -- DP-SGD's per-example clipping -- instead of to the batch's mean."""

    per_example: bool = False

    def __call__(self, grads: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        return grads


def global_norm(grads: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """The L2 norm of a gradient given as a tuple of tensors (vmap-safe)."""
    return torch.sqrt(sum(torch.sum(g * g) for g in grads))


@dataclass(frozen=True)
class ClipNorm(GradTransform):
    """g * min(1, max_norm / ||g||): per batch, or per example with ``per_example``."""

    max_norm: float = 1.0
    per_example: bool = False

    def __call__(self, grads: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        norm = global_norm(grads)
        scale = torch.clamp(self.max_norm / torch.clamp(norm, min=1e-12), max=1.0)
        return tuple(g * scale for g in grads)


@dataclass(frozen=True)
class Normalize(GradTransform):
    """g / ||g|| (a zero gradient stays zero): every step moves the weights by lr."""

    per_example: bool = False

    def __call__(self, grads: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        norm = global_norm(grads)
        return tuple(g / torch.clamp(norm, min=1e-12) for g in grads)


CLIENT_OPTIMIZERS = ("sgd", "momentum", "adam")


@dataclass(frozen=True)
class ClientOptimizer:
    """A phase's local optimizer. ``sgd`` is the kernels' plain step w -= lr g;
    ``momentum`` the heavy ball m <- momentum m + g, w -= lr m; ``adam`` Kingma & Ba's
    moments with bias correction (``betas``, ``eps``).

    ``state``: keep the optimizer's tensors across the client's rounds in the client state
    store, under the keys ``<state>.m`` (momentum, adam), ``<state>.v`` and ``<state>.t``
    (adam), versioned like SCAFFOLD's c_i; each must be listed in the client part's
    ``state``. None: they start at zero every round."""

    kind: str = "sgd"
    momentum: float = 0.9
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    state: str | None = None

    def __post_init__(self) -> None:
        """Checked once, where it is made: every kernel that runs it can rely on it."""
        if self.kind not in CLIENT_OPTIMIZERS:
            raise ValueError(f"ClientOptimizer kind must be one of {', '.join(CLIENT_OPTIMIZERS)}"
                             f", got {self.kind!r}")
        b1, b2 = self.betas
        if not (0 <= self.momentum < 1 and 0 <= b1 < 1 and 0 <= b2 < 1 and self.eps > 0):
            raise ValueError(f"ClientOptimizer needs 0 <= momentum, betas < 1 and eps > 0, "
                             f"got momentum={self.momentum}, betas={self.betas}, "
                             f"eps={self.eps}")

    def state_keys(self) -> tuple[str, ...]:
        """The client-state keys this optimizer keeps (none without ``state``)."""
        if self.state is None or self.kind == "sgd":
            return ()
        own = ("m",) if self.kind == "momentum" else ("m", "v", "t")
        return tuple(f"{self.state}.{k}" for k in own)


@dataclass
class LocalUpdate:
    """What local training returns for one client."""

    delta: torch.Tensor  # y - x, flat; may be a view of a buffer reused for the next client
    num_examples: int  # training examples the client has
    loss_sum: float  # sum over local steps of (mean batch loss * batch size)
    examples_seen: int
    steps: int  # local steps taken
    in_replica: bool = False  # the trained weights were left in the worker's replica ...
    replica_mark: int = -1  # ... at its ``loads`` count then (see WorkerEnv.trained_weights)
    # the client optimizer's tensors after training ("m", "v": one value per parameter;
    # "t": the step count, shape [1]), which the worker keeps under ClientOptimizer.state;
    # None for plain SGD
    opt_state: dict[str, torch.Tensor] | None = None
    # an update stage that defends (norm_bound) set it: the update was clipped or
    # down-weighted, which the run's defense precision and recall count (docs/robustness.md)
    flagged: bool = False
