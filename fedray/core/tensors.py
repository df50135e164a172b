"""Tensors over object-store memory.

Ray hands numpy arrays out of its shared-memory object store read-only and without a copy.
fedray only ever reads them, so wrapping them in a tensor is safe; this silences torch's
warning about non-writable arrays in that one place.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch


def readonly_tensor(array: np.ndarray) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array)
