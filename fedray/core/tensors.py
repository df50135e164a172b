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


# values per chunk of add_scaled_'s conversion: 1 MiB of float64, which stays in cache
# between being written and being added (docs/performance.md, "Folding a client into its
# partial sum")
FOLD_CHUNK = 1 << 17


def add_scaled_(acc: torch.Tensor, value: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    """``acc += alpha * value`` in place, ``acc`` float64 and ``value`` of any float dtype:
    the float32 update of every client folded into a float64 partial sum.

    Why not ``acc.add_(value, alpha=alpha)``: on the CPU torch's add with inputs of two
    dtypes converts element by element outside its vectorized loop, 3-3.7x slower than
    converting ``value`` in chunks to float64 and adding like to like (41-49 ms against 13 ms
    for 6.6 M values, one thread: benchmarks/cnn_client.py) -- 40 ms of every LEAF CNN
    client's ~240 ms in a profile of cnn-20. The result is
    the same float64 number, bit for bit: float32 -> float64 is exact, and the add then is
    the same float64 ``acc + alpha * value`` (tests/core/test_tensors.py)."""
    if value.dtype == acc.dtype or acc.device.type != "cpu" or not acc.is_contiguous():
        return acc.add_(value, alpha=alpha)
    flat_acc, flat_value = acc.view(-1), value.reshape(-1)
    n = flat_value.numel()
    if flat_acc.numel() != n:
        raise ValueError(f"add_scaled_: {n} values for a sum of {flat_acc.numel()}")
    buffer = torch.empty(min(n, FOLD_CHUNK), dtype=acc.dtype)
    for lo in range(0, n, FOLD_CHUNK):
        hi = min(n, lo + FOLD_CHUNK)
        chunk = buffer[: hi - lo]
        chunk.copy_(flat_value[lo:hi])
        flat_acc[lo:hi].add_(chunk, alpha=alpha)
    return acc
