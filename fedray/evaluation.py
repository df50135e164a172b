"""Evaluation sums: loss and correct predictions, reduced like training updates.

Workers return sums (loss_sum, correct, count) for their share of a test set; the driver adds
them. Central (one held-out set split over workers) and federated (each sampled client's own
held-out data) evaluation share this one function.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


@torch.no_grad()
def evaluate(module: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int,
             device: torch.device) -> dict[str, float]:
    module.eval()
    loss_sum, correct = 0.0, 0
    for i in range(0, len(y), batch_size):
        xb = x[i:i + batch_size].to(device, non_blocking=True)
        yb = y[i:i + batch_size].to(device, non_blocking=True)
        logits = module(xb)
        loss_sum += float(F.cross_entropy(logits, yb, reduction="sum"))
        correct += int((logits.argmax(1) == yb).sum())
    return {"loss_sum": loss_sum, "correct": correct, "count": int(len(y))}


def merge_sums(parts: list[dict[str, float]]) -> dict[str, float]:
    out = {"loss_sum": 0.0, "correct": 0, "count": 0}
    for p in parts:
        for k in out:
            out[k] += p[k]
    return out
