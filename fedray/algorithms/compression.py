"""Update compression on the uplink: top-k sparsification with error feedback, and
stochastic quantization.

Why: in cross-device training the clients' uplink is usually the bottleneck, and an update
the size of the model is most of what a client sends. These stages change what the server
receives to what a compressed message would carry, so a run measures the accuracy that a
compression scheme costs, and ``payload`` says the bytes it saves.

``topk``      each client sends only its k largest-magnitude entries, k = ceil(fraction *
              entries), as (index, value) pairs. With error feedback (Stich et al. 2018,
              "Sparsified SGD with memory"; Karimireddy et al. 2019, "Error feedback fixes
              SignSGD and other gradient compression schemes") what a client did not send
              is kept as its residual and added to its next update, so no part of an update
              is lost, only delayed. The residual is per-client state in the client state
              store (``topk_residual``): in cross-device FL a client is sampled rarely, and
              its residual waits for it there.
``quantize``  every value is rounded stochastically onto 2**bits evenly spaced levels
              between the update's min and max, sent as ``bits``-bit integers plus the two
              float32 ends. Stochastic rounding (as in QSGD, Alistarh et al. 2017, and
              Suresh et al. 2017, "Distributed mean estimation with limited communication")
              makes the rounded value an unbiased estimate of the value, so the round's mean
              stays unbiased; each value moves by less than one level. Entries that are
              exactly zero stay zero: after ``topk`` they are the entries not sent (fedray's
              choice; the grid spans the min and max of the others).

Both work in place on the client's update, on its device, with one reusable buffer per
stage (never a per-client one): a worker trains its clients one after another.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction

import torch

from fedray.algorithms.base import (
    ClientContext,
    LocalUpdate,
    PartialSum,
    Payload,
    UpdateStage,
    WorkerEnv,
    require,
)
from fedray.algorithms.registry import register
from fedray.core.seeding import TAG_QUANTIZE, derive_seed

INDEX_BITS = 32  # fedray's choice: a plain 32-bit index per sent value

# -- pure functions ---------------------------------------------------------------------------


def top_k(v: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The indices and values of the ``k`` entries of largest magnitude of a flat ``v``."""
    idx = torch.topk(v.abs(), k, sorted=False).indices
    return idx, v[idx]


def topk_with_feedback(delta: torch.Tensor, residual: torch.Tensor,
                       k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of top-k with error feedback: v = delta + residual; send the k largest-|.|
    entries of v (dense, zeros elsewhere); what is not sent is the new residual, v - sent.
    ``sent + new_residual == v`` exactly: every entry is in one of the two, unchanged."""
    v = delta + residual
    idx, values = top_k(v, k)
    sent = torch.zeros_like(v)
    sent[idx] = values
    new_residual = v.clone()
    new_residual[idx] = 0
    return sent, new_residual


def stochastic_quantize(v: torch.Tensor, bits: int,
                        generator: torch.Generator) -> torch.Tensor:
    """``v`` rounded stochastically onto 2**bits levels spanning [min(v), max(v)]: each entry
    goes to one of the two levels around it, the upper one with probability equal to its
    distance from the lower one in steps, so its expected value is the entry itself. Each
    entry moves by less than one step, (max - min) / (2**bits - 1). Deterministic given the
    generator's state. The arithmetic is in v's dtype: in float32 at 16 bits, x + U rounds
    to 2**-8 of a level, the bound on the rounding's bias."""
    out = v.clone()
    _quantize_(out, bits, generator, torch.empty_like(out))
    return out


def _quantize_(v: torch.Tensor, bits: int, generator: torch.Generator,
               noise: torch.Tensor) -> tuple[float, float]:
    """``stochastic_quantize`` in place, drawing into ``noise`` (v's size, dtype, device);
    returns the grid's (min, max)."""
    lo, hi = (float(t) for t in torch.aminmax(v))
    step = (hi - lo) / (2**bits - 1)
    if not step > 0:  # a constant vector is on the grid already (and NaN stays NaN)
        return lo, hi
    torch.rand(v.shape, generator=generator, out=noise)
    # floor(x + U), U ~ U[0, 1): the upper level with probability frac(x), so E = x
    v.sub_(lo).div_(step).add_(noise).floor_().clamp_(0, 2**bits - 1)
    v.mul_(step).add_(lo)
    return lo, hi


def sent_count(fraction: float, n: int) -> int:
    """k = ceil(fraction * n), with fraction read as the decimal it was written as (0.07 *
    100 is 7.000000000000001 in binary floating point, and must give 7, not 8)."""
    return min(n, math.ceil(Fraction(repr(float(fraction))) * n))


def _buffer(buf: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """The stage's one reusable buffer, (re)allocated only when the update's shape, dtype
    or device changes."""
    if (buf is None or buf.shape != like.shape or buf.dtype != like.dtype
            or buf.device != like.device):
        buf = torch.empty_like(like)
    return buf


# -- stages ----------------------------------------------------------------------------------


@dataclass
class TopKParams:
    fraction: float = 0.01  # the share of entries each client sends, in (0, 1]
    error_feedback: bool = True  # keep what was not sent, add it to the next update


@register
class TopK(UpdateStage):
    """Top-k sparsification, with error feedback by default (module docstring)."""

    name = "topk"
    section = "topk"
    Params = TopKParams

    def __init__(self, params: TopKParams | None = None):
        super().__init__(params)
        # per-instance: the runtime keeps client state only when the residual is kept
        self.client_state = ("topk_residual",) if self.params.error_feedback else ()
        self._buf: torch.Tensor | None = None

    def check(self, params: TopKParams) -> None:
        require(isinstance(params.fraction, (int, float)) and 0 < params.fraction <= 1,
                "fraction", "must be in (0, 1]", params.fraction)

    def client_update(self, env: WorkerEnv, ctx: ClientContext, update: LocalUpdate,
                      acc: PartialSum) -> dict[str, torch.Tensor] | None:
        delta = update.delta
        k = sent_count(self.params.fraction, delta.numel())
        if not self.params.error_feedback:
            idx, values = top_k(delta, k)
            delta.zero_()
            delta[idx] = values
            return None
        v = self._buf = _buffer(self._buf, delta)
        residual = (ctx.state or {}).get("topk_residual")
        if residual is None:  # a client's first round: nothing held back yet
            v.copy_(delta)
        else:
            torch.add(delta, residual.to(delta.device, non_blocking=True), out=v)
        idx = top_k(v, k)[0]
        delta.zero_()
        delta[idx] = v[idx]
        v[idx] = 0  # v is now the new residual: what was not sent
        # the store copies it before the next client reuses the buffer
        return {"topk_residual": v}

    def payload(self, before: Payload) -> Payload:
        return replace(before, values=sent_count(self.params.fraction, before.values),
                       index_bits=INDEX_BITS)


@dataclass
class QuantizeParams:
    bits: int = 8  # bits per value: 2**bits levels between the update's min and max


@register
class Quantize(UpdateStage):
    """Stochastic quantization of each client's update (module docstring)."""

    name = "quantize"
    section = "quantize"
    Params = QuantizeParams

    def __init__(self, params: QuantizeParams | None = None):
        super().__init__(params)
        self._noise: torch.Tensor | None = None

    def check(self, params: QuantizeParams) -> None:
        require(isinstance(params.bits, int) and 1 <= params.bits <= 16, "bits",
                "must be an integer in 1..16", params.bits)

    def client_update(self, env: WorkerEnv, ctx: ClientContext, update: LocalUpdate,
                      acc: PartialSum) -> dict[str, torch.Tensor] | None:
        delta = update.delta
        g = torch.Generator(device=delta.device)
        g.manual_seed(derive_seed(ctx.seed, TAG_QUANTIZE))  # the client's own round stream
        noise = self._noise = _buffer(self._noise, delta)
        nonzero = delta != 0
        if bool(nonzero.all()):
            _quantize_(delta, self.params.bits, g, noise)
        elif bool(nonzero.any()):  # sparse (after topk): quantize only what is sent
            values = delta[nonzero]
            _quantize_(values, self.params.bits, g, noise[: values.numel()])
            delta[nonzero] = values
        return None

    def payload(self, before: Payload) -> Payload:
        return replace(before, value_bits=self.params.bits,
                       overhead_bytes=before.overhead_bytes + 8)  # min and max, float32
