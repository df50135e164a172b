"""Models of a user's own, named by import path in a job, with keyword arguments:

    model:
      name: examples/models.py:BatchNormCNN   # or examples.models:BatchNormCNN
      args: {channels: 16}

fedray calls the class with ``model.args``, plus ``input_shape=`` and ``num_classes=`` (the
data's) for each of the two its signature names and ``model.args`` does not set, so one
class serves every data set of the right kind. Nothing here is registered or imports
fedray.

``BatchNormCNN`` is FedBN's setting (Li et al., ICLR 2021: a CNN whose BatchNorm layers a
client may keep local): two conv-BatchNorm-ReLU-maxpool blocks and a linear classifier, for
28x28 single-channel images (EMNIST, MNIST). Its BatchNorm layers are ``features.1`` and
``features.5`` (weights, and running statistics as buffers): under FedAvg they are averaged
with the rest; a client part that keeps parameters local by name (docs/algorithms.md) can
keep them per client instead, as FedBN does. A model with buffers trains one client after
another (``runtime.worker.vectorize: auto`` says so once). ``tiny_mlp`` is a fully connected
network of configurable width and depth, built by a function rather than a class.
"""

from __future__ import annotations

import math

from torch import nn


class BatchNormCNN(nn.Module):
    """conv3x3(channels)-BN-ReLU-maxpool2, conv3x3(2 channels)-BN-ReLU-maxpool2, linear.

    'same' padding keeps the two poolings the only size reductions: a 28x28 input ends
    7x7, so the classifier sees 2 * channels * 49 features."""

    def __init__(self, channels: int = 16, num_classes: int = 62,
                 input_shape: tuple[int, ...] = (1, 28, 28)):
        super().__init__()
        if len(input_shape) != 3:
            raise ValueError(f"BatchNormCNN needs (channels, height, width) inputs, "
                             f"got {tuple(input_shape)}")
        if channels < 1:
            raise ValueError(f"BatchNormCNN needs channels >= 1, got {channels}")
        depth, height, width = input_shape
        self.features = nn.Sequential(
            nn.Conv2d(depth, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.BatchNorm2d(2 * channels),
            nn.ReLU(), nn.MaxPool2d(2), nn.Flatten())
        self.classifier = nn.Linear(2 * channels * (height // 4) * (width // 4), num_classes)

    def forward(self, x):
        return self.classifier(self.features(x))


def tiny_mlp(input_shape: tuple[int, ...], num_classes: int, hidden: int = 32,
             layers: int = 1) -> nn.Module:
    """``layers`` hidden ReLU layers of ``hidden`` units on the flattened input."""
    if hidden < 1 or layers < 0:
        raise ValueError(f"tiny_mlp needs hidden >= 1 and layers >= 0, got {hidden}, {layers}")
    width, body = math.prod(input_shape), [nn.Flatten()]
    for _ in range(layers):
        body += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    return nn.Sequential(*body, nn.Linear(width, num_classes))
