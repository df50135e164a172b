"""Training and evaluation losses, by name (``model.loss``).

Classification uses cross-entropy on logits; ``mse`` lets a job be a linear or quadratic
regression (the closed-form algorithm tests run through the whole runtime that way) and
``bce`` is a one-logit binary classifier (the seed 001 perceptron);
``sequence_cross_entropy`` is next-character prediction (a class per position, padding
left out; seed 002's Shakespeare) and next-word prediction (Stack Overflow);
``multi_label_bce`` is multi-label classification (Stack Overflow tags), evaluated by
recall@5. One table keeps the training loss, the evaluation sums
and whether accuracy means anything in step.
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


# The padding token of sequence targets (fedray.data.sources.shakespeare.PAD, TFF's pad id): its
# positions are left out of sequence_cross_entropy and of its accuracy.
SEQUENCE_PAD = 0


def _sequence_cross_entropy(out: torch.Tensor, y: torch.Tensor,
                            reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy at every position of a target sequence, padding positions left out.

    ``out``: [batch, positions, classes] logits; ``y``: [batch, positions] targets. Seed 002
    trains its Shakespeare model with "cross-entropy loss" (App. E.1, line 1080 of the seed
    text) and says nothing of padding; leaving padded positions out is fedray's choice (as
    TFF's masked accuracy does): a short speech's padding would otherwise teach the model to
    predict padding and weigh short snippets' tails as much as text.

    "mean": the mean over the batch's non-padding positions (0 when there are none);
    "sum": their sum; "none": one sum per sequence. So a client's training loss is per
    character, and evaluation's ``loss_sum / count`` is too (``count_fn``: positions).
    Training's bookkeeping (fedray.kernels.sequential) weighs each step's mean by its
    sequences, so ``train_loss`` is a per-character loss averaged over sequences."""
    per = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1), reduction="none")
    per = per.view(y.shape) * (y != SEQUENCE_PAD)
    if reduction == "none":
        return per.reshape(len(y), -1).sum(1)
    if reduction == "sum":
        return per.sum()
    return per.sum() / (y != SEQUENCE_PAD).sum().clamp_min(1)


def _sequence_correct(out: torch.Tensor, y: torch.Tensor) -> int:
    """Correct predictions at the non-padding positions."""
    return int(((out.argmax(-1) == y) & (y != SEQUENCE_PAD)).sum())


def _sequence_count(y: torch.Tensor) -> int:
    """What accuracy and mean loss divide by: the non-padding positions."""
    return int((y != SEQUENCE_PAD).sum())


def _multi_label_bce(out: torch.Tensor, y: torch.Tensor,
                     reduction: str = "mean") -> torch.Tensor:
    """Multi-label classification (Stack Overflow tag prediction): a sigmoid binary
    cross-entropy per label, summed over an example's labels -- the negative log-likelihood
    of its whole 0/1 label vector under independent per-label logits.

    ``out``: [batch, labels] logits; ``y``: [batch, labels] 0/1 (int or float). "none": one
    loss per example; "mean": their mean over the batch; "sum": their sum. Reddi et al.'s
    tag model trains with Keras' BinaryCrossentropy(reduction=SUM) on sigmoid outputs
    (google-research/federated ``optimization/tasks/stackoverflow_tp.py``), which is, per
    batch, the sum over examples of the mean over labels: with L labels and B examples in
    a batch that is B / L times this loss's mean, so their client learning rate eta is this
    loss's eta * B / L (10^2 at B = 100, L = 500: 20 here; jobs/stackoverflow/tag.yaml).
    Logits rather than Keras' clipped probabilities: the same loss, computed stably."""
    per = F.binary_cross_entropy_with_logits(
        out.reshape(out.shape[0], -1), y.reshape(y.shape[0], -1).to(out.dtype),
        reduction="none").sum(-1)
    if reduction == "none":
        return per
    return per.sum() if reduction == "sum" else per.mean()


# how many top-scored labels recall@k looks at (TFF / Reddi et al.: recall@5)
RECALL_AT = 5


def _recall_correct(out: torch.Tensor, y: torch.Tensor) -> int:
    """The true labels among each example's ``RECALL_AT`` highest-scored ones, summed:
    recall@5's numerator (Keras' Recall(top_k=5), which Reddi et al. report: its true
    positives). Ties between scores go to torch.topk's choice."""
    k = min(RECALL_AT, out.shape[-1])
    top = out.reshape(out.shape[0], -1).topk(k, dim=-1).indices
    return int((y.reshape(y.shape[0], -1).gather(-1, top) != 0).sum())


def _positive_count(y: torch.Tensor) -> int:
    """Recall's denominator: the true labels (Keras' true positives + false negatives)."""
    return int((y != 0).sum())


def _argmax_correct(out: torch.Tensor, y: torch.Tensor) -> int:
    return int((out.argmax(1) == y).sum())


def _sign_correct(out: torch.Tensor, y: torch.Tensor) -> int:
    return int(((out.reshape(-1) > 0).to(y.dtype) == y.reshape(-1)).sum())


LossFn = Callable[..., torch.Tensor]
LOSSES: dict[str, tuple[LossFn, Callable[[torch.Tensor, torch.Tensor], int] | None]] = {
    "cross_entropy": (_cross_entropy, _argmax_correct),
    "mse": (_mse, None),  # regression: no accuracy
    "bce": (_bce, _sign_correct),
    "sequence_cross_entropy": (_sequence_cross_entropy, _sequence_correct),
    "multi_label_bce": (_multi_label_bce, _recall_correct),
}
# what an evaluation divides by, where it is not the number of examples
# multi_label_bce's is its true labels, so its "accuracy" is recall@5 and its evaluation
# loss (loss_sum / count) a loss per true label, while its training loss is per example
_COUNTS: dict[str, Callable[[torch.Tensor], int]] = {
    "sequence_cross_entropy": _sequence_count,
    "multi_label_bce": _positive_count,
}
# losses whose targets are a vector of labels per example ([n, L]), not one class
VECTOR_LABEL = ("sequence_cross_entropy", "multi_label_bce")
# losses whose "mean" is not a mean over examples: batched multi-client training
# (fedray.kernels.vectorized), which averages per-example losses, cannot train them
PER_POSITION = ("sequence_cross_entropy",)


def loss_fn(name: str) -> LossFn:
    """``fn(out, y, reduction="mean"|"sum"|"none")`` for ``model.loss`` = name ("none": one
    loss per example, which batched multi-client training masks)."""
    return LOSSES[name][0]


def correct_fn(name: str) -> Callable[[torch.Tensor, torch.Tensor], int] | None:
    """Count of correct predictions, or None where accuracy is undefined (regression)."""
    return LOSSES[name][1]


def count_fn(name: str) -> Callable[[torch.Tensor], int]:
    """How many predictions a batch of targets ``y`` holds: its examples, for
    ``sequence_cross_entropy`` its non-padding positions, for ``multi_label_bce`` its true
    labels (so accuracy is recall@5). Evaluation's mean loss and accuracy divide by the sum
    of these."""
    return _COUNTS.get(name, len)


def float_targets(name: str) -> bool:
    """Whether the loss takes real-valued targets (labels are kept as float32)."""
    return name in ("mse", "bce")
