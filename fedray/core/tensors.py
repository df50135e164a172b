"""Tensors over object-store memory.

Ray hands numpy arrays out of its shared-memory object store read-only and without a copy.
fedray only ever reads them, so wrapping them in a tensor is safe; this silences torch's
warning about non-writable arrays in that one place.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch


def readonly_tensor(array: np.ndarray) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array)


def reused_rows(buffer: Any, rows: int, size: int, make: Callable[[int, int], Any]
                ) -> tuple[Any, Any]:
    """``rows`` rows of ``size`` values: the first rows of ``buffer`` (a numpy array or a
    tensor) when it has room, else a new buffer from ``make(rows, size)``; returns them and
    the buffer to keep for the next call. Why: a buffer of individual updates (tens of MB)
    made anew each round is a new mapping whose pages fault in on first write -- 58 ms
    against 10 ms for the MLP's 68 MB of rows (docs/performance.md, "Client state packs")."""
    if buffer is not None and buffer.shape[0] >= rows and buffer.shape[1] == size:
        return buffer[:rows], buffer
    new = make(rows, size)
    return new, new
