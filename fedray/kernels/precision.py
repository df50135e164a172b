"""Reduced precision for local training (``runtime.precision``): the one piece both kernels
share.

``fp32`` (the default) changes nothing: no context, no cast, the float operations of a run
without the key. ``bf16`` runs a local step's forward pass under
``torch.autocast(device_type, dtype=torch.bfloat16)``: autocast's matrix products and
convolutions take bfloat16 copies of their inputs and weights (8 bits of mantissa, float32's
range), so their outputs, and the gradients that flow back through them, carry about 2^-8
relative rounding instead of float32's 2^-24. Everything else stays float32: the master
weights the optimizer updates (the flat model, the vectorized stacks), each gradient as the
optimizer sees it (autocast's cast of a float32 weight returns its gradient in float32), the
loss, which is computed from the forward's output cast back to float32 (CPU autocast keeps
``log_softmax`` in bfloat16, which the vectorized kernel's cross entropy uses), and the
float64 loss sums and partial sums. So a client's update is its float32 update up to
bfloat16's rounding of the products, and, computed the same way in every worker, still
independent of the worker count.

Why only the forward: the backward pass runs outside autocast (as PyTorch advises), and its
products already take bfloat16 inputs where the forward cast them. Why not evaluation:
eval keeps float32, so the accuracy of a bf16 run is measured as an fp32 run's is and the two
compare (docs/performance.md, "Reduced precision").

Where bfloat16 pays: GPUs with bfloat16 tensor cores, and CPUs with bfloat16 instructions
(AVX512_BF16, AMX). Without them (an AVX-512 Xeon before Cooper Lake), oneDNN converts to
float32 and back, and bf16 measured slower than fp32 (docs/performance.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

PRECISIONS = ("fp32", "bf16")


def precision_context(precision: str,
                      device: torch.device | str) -> contextlib.AbstractContextManager:
    """The context a local step's forward pass runs in: nothing for ``fp32``, bfloat16
    autocast on ``device``'s type for ``bf16``."""
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision == "bf16":
        return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
    raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")


def forward(precision: str, device: torch.device | str, call: Callable[..., Any],
            *args: Any) -> Any:
    """``call(*args)`` (a module, a ``functional_call``) in ``precision_context``, its
    floating-point output back in float32, so the loss after it is a float32 loss. For
    ``fp32`` exactly ``call(*args)``: no context entered, no cast made."""
    if precision == "fp32":
        return call(*args)
    with precision_context(precision, device):
        out = call(*args)
    if isinstance(out, torch.Tensor) and out.is_floating_point():
        return out.float()
    return out
