"""Training and evaluation losses, by name (``model.loss``).

Classification uses cross-entropy on logits; ``mse`` lets a job be a linear or quadratic
regression (the closed-form algorithm tests run through the whole runtime that way) and
``bce`` is a one-logit binary classifier (the seed 001 perceptron). One table keeps the
training loss, the evaluation sums and whether accuracy means anything in step.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F


def _cross_entropy(out: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    return F.cross_entropy(out, y, reduction=reduction)


def _mse(out: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Half the squared error, summed over output dimensions: f(w) = 1/2 ||Xw - y||^2 / n
    for a linear model, whose gradient X^T (Xw - y) / n the closed forms use."""
    err = out.reshape(len(out), -1) - y.reshape(len(y), -1).to(out.dtype)
    per_example = 0.5 * err.pow(2).sum(1)
    if reduction == "none":
        return per_example
    return per_example.mean() if reduction == "mean" else per_example.sum()


def _bce(out: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(out.reshape(-1), y.reshape(-1).to(out.dtype),
                                              reduction=reduction)


def _argmax_correct(out: torch.Tensor, y: torch.Tensor) -> int:
    return int((out.argmax(1) == y).sum())


def _sign_correct(out: torch.Tensor, y: torch.Tensor) -> int:
    return int(((out.reshape(-1) > 0).to(y.dtype) == y.reshape(-1)).sum())


LossFn = Callable[..., torch.Tensor]
LOSSES: dict[str, tuple[LossFn, Callable[[torch.Tensor, torch.Tensor], int] | None]] = {
    "cross_entropy": (_cross_entropy, _argmax_correct),
    "mse": (_mse, None),  # regression: no accuracy
    "bce": (_bce, _sign_correct),
}


def loss_fn(name: str) -> LossFn:
    """``fn(out, y, reduction="mean"|"sum"|"none")`` for ``model.loss`` = name ("none": one
    loss per example, which batched multi-client training masks)."""
    return LOSSES[name][0]


def correct_fn(name: str) -> Callable[[torch.Tensor, torch.Tensor], int] | None:
    """Count of correct predictions, or None where accuracy is undefined (regression)."""
    return LOSSES[name][1]


def float_targets(name: str) -> bool:
    """Whether the loss takes real-valued targets (labels are kept as float32)."""
    return name in ("mse", "bce")
