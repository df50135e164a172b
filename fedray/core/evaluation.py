"""Evaluation sums: loss and correct predictions, reduced like training updates.

Workers return sums (loss_sum, correct, count) for their share of a test set; the driver adds
them. Central (one held-out set split over workers) and federated (each sampled client's own
held-out data) evaluation share this one function. Federated evaluation comes back as one
row of sums per client (``ClientEval``), so the driver can also report how the model serves
clients one by one -- the distribution cross-device papers report (fairness, personalization)
-- and the pooled numbers are those rows added up.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from fedray.core.losses import correct_fn, count_fn, loss_fn


@dataclass
class EvalSums:
    """A share of an evaluation, as a worker sends it back: sums, so shares add up."""

    loss_sum: float = 0.0
    correct: int = 0
    count: int = 0  # examples, or predictions counted (sequence losses: non-padding positions)

    def __add__(self, other: EvalSums) -> EvalSums:
        return EvalSums(self.loss_sum + other.loss_sum, self.correct + other.correct,
                        self.count + other.count)

    @property
    def mean_loss(self) -> float:
        return self.loss_sum / max(1, self.count)

    @property
    def accuracy(self) -> float:
        return self.correct / max(1, self.count)


@torch.no_grad()
def evaluate(module: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int,
             device: torch.device, loss: str = "cross_entropy") -> EvalSums:
    module.eval()
    criterion, count_correct, count = loss_fn(loss), correct_fn(loss), count_fn(loss)
    loss_sum, correct = 0.0, 0
    for i in range(0, len(y), batch_size):
        xb = x[i:i + batch_size].to(device, non_blocking=True)
        yb = y[i:i + batch_size].to(device, non_blocking=True)
        out = module(xb)
        loss_sum += float(criterion(out, yb, reduction="sum"))
        if count_correct is not None:
            correct += count_correct(out, yb)
    # the denominator of mean loss and accuracy: examples, or a sequence loss's counted
    # positions (fedray.core.losses.count_fn)
    total = len(y) if count is len else count(y)
    return EvalSums(loss_sum, correct, int(total))


def merge_sums(parts: list[EvalSums]) -> EvalSums:
    """The shares added in the order given (floats: the same order, the same result)."""
    out = EvalSums()
    for p in parts:
        out = out + p
    return out


@dataclass
class ClientEval:
    """One evaluated client's row, as a worker sends it back: the global model's sums on
    the client's test split (or, for a client part with personalized models, its own
    model's, with the global model's in ``global_sums``), and, with personalized
    evaluation (eval.personalize), the sums of the copy it fine-tuned on its train split.
    Rows, not weights: the driver only ever merges numbers."""

    client_id: int
    sums: EvalSums
    personalized: EvalSums | None = None
    # for a client part that evaluates each client with its own model (a local head, a
    # personal model, an adapted copy: ``sums``), the global model's sums beside them
    global_sums: EvalSums | None = None
    # the client part's per-client values (ClientWork.eval_columns: IFCA's cluster)
    columns: dict[str, float] | None = None


def pooled(rows: list[ClientEval], which: str = "sums") -> EvalSums:
    """The rows' ``which`` sums (``sums``, ``personalized``, ``global_sums``) added in
    client-id order: the pooled federated evaluation, the same floats whichever worker
    evaluated which client."""
    ordered = sorted(rows, key=lambda row: row.client_id)
    return merge_sums([getattr(row, which) for row in ordered])

