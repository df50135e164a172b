"""The common ground of the numeric algorithm tests: deterministic linear-regression
clients (f_i(w) = 1/2 ||X_i w - y_i||^2 / n_i with mse) and a bias-free Linear(D, 1) model
started at W0, which a float64 NumPy reference can follow step by step."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

D = 3  # a 3-parameter model: Linear(3, 1) without bias (vectorizable: a linear chain)
W0 = np.array([0.3, -0.2, 0.1])


def regression_clients(sizes: Sequence[int], seed: int = 0, scale_step: float = 0.5
                       ) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Heterogeneous clients: client i has sizes[i] examples, its own feature scale
    (0.5 + scale_step i) and its own true weights, with a little noise on the targets."""
    g = np.random.default_rng(seed)
    out = {}
    for i, n in enumerate(sizes):
        x = (g.normal(size=(n, D)) * (0.5 + scale_step * i)).astype(np.float32)
        w_true = g.normal(size=D) * 2
        y = (x @ w_true + 0.1 * g.normal(size=n)).astype(np.float32)
        out[i] = (x, y)
    return out


def linear_model_fn(w0: np.ndarray = W0):
    def model_fn():  # a closure: shipped to the workers by value
        m = nn.Linear(D, 1, bias=False)
        with torch.no_grad():
            m.weight.copy_(torch.tensor(w0, dtype=torch.float32).view(1, -1))
        return m
    return model_fn
