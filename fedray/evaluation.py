"""Evaluation sums: loss and correct predictions, reduced like training updates.

Workers return sums (loss_sum, correct, count) for their share of a test set; the driver adds
them. Central (one held-out set split over workers) and federated (each sampled client's own
held-out data) evaluation share this one function.
"""

from __future__ import annotations

import torch
from torch import nn

from fedray.losses import correct_fn, loss_fn


@torch.no_grad()
def evaluate(module: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int,
             device: torch.device, loss: str = "cross_entropy") -> dict[str, float]:
    module.eval()
    criterion, count_correct = loss_fn(loss), correct_fn(loss)
    loss_sum, correct = 0.0, 0
    for i in range(0, len(y), batch_size):
        xb = x[i:i + batch_size].to(device, non_blocking=True)
        yb = y[i:i + batch_size].to(device, non_blocking=True)
        out = module(xb)
        loss_sum += float(criterion(out, yb, reduction="sum"))
        if count_correct is not None:
            correct += count_correct(out, yb)
    return {"loss_sum": loss_sum, "correct": correct, "count": int(len(y))}


def merge_sums(parts: list[dict[str, float]]) -> dict[str, float]:
    out = {"loss_sum": 0.0, "correct": 0, "count": 0}
    for p in parts:
        for k in out:
            out[k] += p[k]
    return out
