"""Server optimizer: turns the round's aggregated client delta into the next global model.

With SGD at server learning rate eta_s this is FedAvg's x <- x + eta_s * mean_delta (the
mean delta is the negative pseudo-gradient of Reddi et al.'s SERVEROPT view; eta_s = 1 is
plain FedAvg).
"""

from __future__ import annotations

import torch


class ServerSGD:
    def __init__(self, lr: float):
        self.lr = lr

    def step(self, weights: torch.Tensor, mean_delta: torch.Tensor) -> torch.Tensor:
        """New global weights (float32) from the old ones and a float64 mean delta."""
        return (weights.double() + self.lr * mean_delta).float()
