"""Model registry: name -> factory(input_shape, num_classes) -> torch.nn.Module.

Architectures follow the papers fedray reproduces; a user can pass any nn.Module factory
to ``fedray.run(model_fn=...)`` instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

ModelFactory = Callable[[tuple[int, ...], int], nn.Module]


class EmnistCNN(nn.Module):
    """The EMNIST CNN of TFF and Reddi et al. (Adaptive Federated Optimization, Table 4):
    conv3x3-32, conv3x3-64, maxpool 2x2, dropout 0.25, fc128, dropout 0.5, fc62."""

    def __init__(self, input_shape: tuple[int, ...] = (1, 28, 28), num_classes: int = 62):
        super().__init__()
        channels, height, width = input_shape
        self.features = nn.Sequential(
            nn.Conv2d(channels, 32, 3), nn.ReLU(),
            nn.Conv2d(32, 64, 3), nn.ReLU(),
            nn.MaxPool2d(2), nn.Dropout(0.25), nn.Flatten(),
        )
        flat = 64 * ((height - 4) // 2) * ((width - 4) // 2)
        self.classifier = nn.Sequential(
            nn.Linear(flat, 128), nn.ReLU(), nn.Dropout(0.5), nn.Linear(128, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def logistic_regression(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Multinomial logistic regression on the flattened input."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))


def emnist_cnn(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    if len(input_shape) != 3:
        raise ValueError(f"emnist_cnn needs (channels, height, width) inputs, got {input_shape}")
    return EmnistCNN(input_shape, num_classes)


MODELS: dict[str, ModelFactory] = {
    "emnist_cnn": emnist_cnn,
    "logreg": logistic_regression,
}


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return MODELS[name](tuple(input_shape), num_classes)
