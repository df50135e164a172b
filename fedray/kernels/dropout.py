"""Client-seeded dropout masks: every client draws its dropout masks from its own generator,
seeded with its own seed, whether it trains alone or in a group.

Why: torch's dropout draws from the process's default generator, one draw per call, so a
client's masks depend on every draw made before them: in a vectorized group (one call for
all the clients, under ``vmap``) they would depend on the group. Here the dropout layers'
forward multiplies by a mask that comes from a *source*: drawn on the spot from the
client's generator (``ClientDropout.drawing``, sequential training), or handed in,
drawn outside ``vmap`` client by client and stacked (``ClientDropout.feeding``,
vectorized training). Both draw a client's masks the same way -- one
``bernoulli_(1 - p, generator=gen)`` per dropout call, shaped as that call's input
(``[batch, *features]``; Dropout1d/2d/3d: ``[batch, channels, 1, ...]``), step by step,
the layers in forward order -- so a client's masks are bit for bit the same in either
kernel and in any group.

On the CPU this is torch's own dropout, float for float: ATen's ``_dropout`` is
``noise = empty_like(x).bernoulli_(1 - p); noise.div_(1 - p); x * noise`` from the default
generator, and ``torch.Generator().manual_seed(seed)`` starts where
``torch.manual_seed(seed)`` leaves the default one (tests/kernels/test_dropout.py). On a GPU
torch's dropout is a fused kernel that draws otherwise, so there fedray's masks are its own
(the same in both kernels). Masks are drawn in the input's logical order, whatever its
memory format. p = 0, eval mode and an empty input draw nothing and return the input; p = 1
multiplies by zero, as torch does.

Only nn.Dropout, Dropout1d, Dropout2d and Dropout3d (exact types: a subclass may compute
something else) are drawn here; AlphaDropout, FeatureAlphaDropout and dropout called as a
function keep drawing from the default generator, which the sequential kernel seeds with
the client's seed, and the vectorized kernel refuses them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn

# the layers whose masks are drawn here; True: one draw per channel (feature dropout)
LAYERS: dict[type[nn.Module], bool] = {nn.Dropout: False, nn.Dropout1d: True,
                                       nn.Dropout2d: True, nn.Dropout3d: True}
# dropout that this module cannot draw (subclasses of these are refused too)
RANDOM = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
          nn.FeatureAlphaDropout)


def drawn_here(m: nn.Module) -> bool:
    """Whether ``m``'s masks are drawn per client: one of LAYERS, exactly, with the class's
    own forward (a forward set on the instance is the user's)."""
    return type(m) in LAYERS and "forward" not in m.__dict__


def foreign_dropout(module: nn.Module) -> str | None:
    """The first dropout layer of ``module`` whose masks are not drawn per client, as
    "name: Type", or None."""
    for name, m in module.named_modules():
        if isinstance(m, RANDOM) and not drawn_here(m):
            return f"{name or 'the model'}: {type(m).__name__}"
    return None


def noise_shape(m: nn.Module, shape: Sequence[int]) -> tuple[int, ...]:
    """The shape of the noise torch draws for ``m`` on an input of ``shape``: the input's
    own, or for feature dropout ``[batch, channels, 1, ...]`` -- of the input with a batch
    axis put in front where F.dropout1d/3d treat it as unbatched (and F.dropout2d, on any
    number of dimensions, does not)."""
    shape = tuple(shape)
    if not LAYERS[type(m)]:
        return shape
    dims = len(shape)
    if type(m) is nn.Dropout1d and dims not in (2, 3):
        raise RuntimeError(f"dropout1d: Expected 2D or 3D input, but received a {dims}D input")
    batched = {nn.Dropout1d: dims == 3, nn.Dropout3d: dims == 5}.get(type(m), True)
    full = shape if batched else (1, *shape)
    if len(full) < 2:
        raise RuntimeError("Feature dropout requires at least 2 dimensions in the input")
    return (full[0], full[1]) + (1,) * (len(full) - 2)


def draw_(noise: torch.Tensor, p: float, gen: torch.Generator | None) -> torch.Tensor:
    """Fill ``noise`` (contiguous) with a dropout mask, in place: 0 with probability p, else
    1 / (1 - p), as ATen's ``_dropout`` draws it."""
    return noise.bernoulli_(1 - p, generator=gen).div_(1 - p)


@dataclass(frozen=True)
class DropoutCall:
    """One dropout call of a forward pass: the layer, and the noise shape of one example
    (the noise of a batch of n is [n, *features])."""

    layer: nn.Module
    features: tuple[int, ...]
    dtype: torch.dtype


def _forward(m: nn.Module, source, x: torch.Tensor) -> torch.Tensor:
    """``m``'s forward with its mask from ``source``, in torch's semantics."""
    p = float(m.p)
    if not m.training or p == 0 or x.numel() == 0:
        return x
    if p == 1:
        zero = x.new_zeros(())
        return x.mul_(zero) if m.inplace else x * zero
    shape = noise_shape(m, x.shape)
    noise = source(m, shape, x)
    batched = len(shape) == x.dim()
    view = x if batched else x.unsqueeze(0)
    if m.inplace:
        view.mul_(noise)
        return x
    out = view * noise
    return out if batched else out.squeeze(0)


class ClientDropout:
    """A model's per-client dropout (the module docstring): its layers, and contexts in
    which their forward takes the mask from one source. The layers are patched only inside
    a context (an instance ``forward``, removed on the way out, errors included), so the
    module is the user's own outside training."""

    def __init__(self, module: nn.Module):
        self.module = module
        self.layers = [m for m in module.modules() if drawn_here(m)]

    def __bool__(self) -> bool:
        return bool(self.layers)

    @contextmanager
    def _patched(self, source) -> Iterator[None]:
        if not self.layers:
            yield
            return
        try:
            for m in self.layers:
                m.forward = partial(_forward, m, source)
            yield
        finally:
            for m in self.layers:
                m.__dict__.pop("forward", None)

    def drawing(self, gen: torch.Generator | None):
        """Masks drawn on each call from ``gen`` (sequential training)."""
        def source(m, shape, x):
            return draw_(torch.empty(shape, dtype=x.dtype, device=x.device), float(m.p), gen)
        return self._patched(source)

    @contextmanager
    def feeding(self, masks: Sequence[torch.Tensor]) -> Iterator[None]:
        """The calls take ``masks`` in order, one each; all of them must be taken (a forward
        whose calls differ from ``calls``' fails here rather than train with wrong masks)."""
        left = list(masks)[::-1]

        def source(m, shape, x):
            if not left:
                raise RuntimeError("a dropout layer was called more often than in the "
                                   "forward pass that counted the calls")
            mask = left.pop()
            if tuple(mask.shape) != tuple(shape):
                raise RuntimeError(f"dropout mask of shape {tuple(mask.shape)} for noise of "
                                   f"shape {tuple(shape)}: the layer's input has no leading "
                                   "batch axis")
            return mask if mask.dtype == x.dtype else mask.to(x.dtype)

        with self._patched(source):
            yield
        if left:
            raise RuntimeError(f"{len(left)} dropout masks were not used: the forward pass "
                               "called dropout less often than when the calls were counted")

    def calls(self, example: torch.Tensor) -> list[DropoutCall]:
        """The dropout calls that draw in one forward pass on inputs shaped like
        ``example`` (one example), in order: one forward on two zero examples, without
        gradients; drawing nothing. A call whose noise does not lead with the batch axis
        is refused: its masks could not be stacked per example."""
        if not self.layers:
            return []
        seen: list[DropoutCall] = []

        def source(m, shape, x):
            if len(shape) != x.dim() or shape[0] != 2:
                raise ValueError(f"{type(m).__name__} is applied to an input of shape "
                                 f"{tuple(x.shape)} for 2 examples: its masks are not per "
                                 "example")
            seen.append(DropoutCall(m, tuple(shape[1:]), x.dtype))
            return torch.ones(shape, dtype=x.dtype, device=x.device)

        x = torch.zeros((2, *example.shape), dtype=example.dtype, device=example.device)
        with torch.no_grad(), self._patched(source):
            self.module(x)
        return seen


def draw_masks(calls: Sequence[DropoutCall], gens: Sequence[torch.Generator],
               lengths: Sequence[int], width: int,
               device: torch.device) -> tuple[torch.Tensor, ...]:
    """One vectorized step's masks: per call, [len(gens), width, *features], row r client
    r's ``lengths[r]`` masks drawn from ``gens[r]`` exactly as sequential training draws
    them for a batch of that size, the padding rows 1 (padded examples are masked out of
    the loss). A client's draws come from its generator alone, call after call, so its
    masks do not depend on the other clients of the group, nor on its size."""
    out = []
    for call in calls:
        noise = torch.ones((len(gens), width, *call.features), dtype=call.dtype, device=device)
        p = float(call.layer.p)
        for r, (gen, n) in enumerate(zip(gens, lengths, strict=True)):
            if n:
                draw_(noise[r, :n], p, gen)
        out.append(noise)
    return tuple(out)
