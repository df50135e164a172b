"""Max-pooling searched in channels-last order on the CPU, with torch's own result.

Why: torch's CPU max-pooling of a contiguous (NCHW) input is its slow kernel. One forward
on the TFF EMNIST CNN's [20, 64, 24, 24] activations took 6.6 ms, 2.4x the 2.8 ms of
copying the input to channels-last, pooling that and copying the result back; the LEAF
CNN's two poolings alike (docs/performance.md, "Max-pooling searched channels-last"). That
is about a tenth of a local step of either CNN, which the raw loop pays and fedray need not.

Why it is the same computation: both of torch's kernels return, per output, the maximum of
its window and the flat index ``h * W + w`` of that maximum in the input plane, scanning the
window in the same order and keeping the first maximum (a NaN wins); the index means the
same whatever the memory order. So the forward takes the values and indices from the
channels-last kernel, and the backward is torch's own NCHW backward on those indices:
outputs and input gradients are torch's, bit for bit, ties and NaNs included
(tests/kernels/test_pooling.py).

Used by the sequential kernel only (``ChannelsLastPooling.active``, an instance ``forward``
on nn.MaxPool2d layers of the exact type, removed on the way out): not under ``vmap``, not
on a GPU, not for ``return_indices`` (the layer's indices are then the caller's), and not
below ``SMALLEST`` values, where the copies cost more than the search saves.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from functools import partial

import torch
from torch import nn
from torch.autograd.function import once_differentiable

# the smallest input (values) pooled this way: below it the two copies and the Python of an
# autograd Function cost more than the slow search (a [3, 5, 7, 9] input: 0.21 against
# 0.11 ms, forward and backward)
SMALLEST = 1 << 15
_aten = torch.ops.aten


class _MaxPool(torch.autograd.Function):
    """max_pool2d: values and indices from the channels-last kernel, torch's NCHW backward."""

    @staticmethod
    def forward(ctx, x, kernel, stride, padding, dilation, ceil_mode):
        out, idx = _aten.max_pool2d_with_indices(x.contiguous(memory_format=torch.channels_last),
                                                 kernel, stride, padding, dilation, ceil_mode)
        out, idx = out.contiguous(), idx.contiguous()
        ctx.save_for_backward(x, idx)
        ctx.args = (kernel, stride, padding, dilation, ceil_mode)
        ctx.mark_non_differentiable(idx)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        x, idx = ctx.saved_tensors
        gx = _aten.max_pool2d_with_indices_backward(grad.contiguous(), x, *ctx.args, idx)
        return gx, None, None, None, None, None


def _pair(v) -> list[int]:
    return [v, v] if isinstance(v, int) else list(v)


def _forward(m: nn.MaxPool2d, x: torch.Tensor) -> torch.Tensor:
    """``m``'s forward, searched channels-last where that is torch's result and faster."""
    if (x.dim() != 4 or x.numel() < SMALLEST or not x.is_floating_point()
            or not x.is_contiguous()):
        return nn.MaxPool2d.forward(m, x)
    stride = m.kernel_size if m.stride is None or m.stride == [] else m.stride
    return _MaxPool.apply(x, _pair(m.kernel_size), _pair(stride), _pair(m.padding),
                          _pair(m.dilation), bool(m.ceil_mode))


class ChannelsLastPooling:
    """A model's nn.MaxPool2d layers (exact type, the class's own forward, no
    ``return_indices``), patched inside ``active()`` only, errors included: outside local
    training the module is the user's, as fedray.kernels.dropout patches its layers."""

    def __init__(self, module: nn.Module, device: torch.device | str = "cpu"):
        on_cpu = torch.device(device).type == "cpu"
        self.layers = [m for m in module.modules()
                       if type(m) is nn.MaxPool2d and "forward" not in m.__dict__
                       and not m.return_indices] if on_cpu else []

    def __bool__(self) -> bool:
        return bool(self.layers)

    @contextmanager
    def _patched(self) -> Iterator[None]:
        try:
            for m in self.layers:
                m.forward = partial(_forward, m)
            yield
        finally:
            for m in self.layers:
                m.__dict__.pop("forward", None)

    def active(self):
        """The context local steps run in (nothing to patch: a null context)."""
        return self._patched() if self.layers else nullcontext()
