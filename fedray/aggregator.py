"""Aggregation as partial sums: each worker reduces its own clients, the driver merges.

A weighted mean sum_k w_k d_k / sum_k w_k is associative, so a worker can fold its clients
into (sum_k w_k d_k, sum_k w_k) and send that one pair back -- the driver never sees a
per-client model (architecture rule 2). Sums are kept in float64 so that the result does not
depend on how clients were split over workers (to ~1e-15, far below float32 resolution).
"""

from __future__ import annotations

import numpy as np
import torch

from fedray.tensors import readonly_tensor


class WeightedSum:
    def __init__(self, size: int, device: torch.device | str = "cpu"):
        self.total = torch.zeros(size, dtype=torch.float64, device=device)
        self.weight = 0.0

    def add(self, value: torch.Tensor, weight: float) -> None:
        self.total.add_(value, alpha=weight)
        self.weight += weight

    def merge(self, total: np.ndarray | torch.Tensor, weight: float) -> None:
        """Fold in another partial sum (e.g. a worker's)."""
        self.total.add_(readonly_tensor(total) if isinstance(total, np.ndarray) else total)
        self.weight += weight

    def mean(self) -> torch.Tensor:
        if self.weight <= 0:
            raise ValueError("no client contributed to this round")
        return self.total / self.weight


def client_weight(aggregator: str, num_examples: int) -> float:
    """A client's weight in the mean: its example count (proportional, FedAvg's choice) or 1
    (uniform). A client without examples never counts."""
    if num_examples == 0:
        return 0.0
    return float(num_examples) if aggregator == "proportional" else 1.0
