"""Secure aggregation, emulated (Bonawitz et al. 2017, "Practical Secure Aggregation for
Privacy-Preserving Machine Learning").

In the protocol the server learns the sum of the clients' updates and nothing else: each
client masks its update with pairwise masks that cancel in the sum, and a sum is revealed
only when enough clients took part. fedray does not run the cryptography (the masks cancel
exactly, so they change no number); it emulates the two things that do change what a run
computes and learns:

1. **The threshold.** The driver only ever reveals sums over at least ``min_clients``
   clients. Workers' partial sums arrive in worker order; they are pooled into a pending
   group until it holds ``min_clients`` clients, and the last complete group is held back
   until the next one completes, so that a short remainder at the end of the round can be
   folded into it instead of being revealed alone. If no group ever reaches the threshold,
   the round's sum is refused (``close`` says why) and nothing of it is used. Every extra
   sum of the partials (another part's, e.g. SCAFFOLD's) is grouped alike. The runtime is
   also told (``min_clients_per_partial``) not to give a worker fewer clients than that.
2. **The fixed-point sum** (``bits`` > 0). The protocol adds integers modulo 2**bits, so a
   client clips each coordinate to [-range, range], encodes it with stochastic rounding
   (unbiased) onto 2**precision_bits levels, u = round((v + range) / step),
   step = 2 range / (2**precision_bits - 1), and the server decodes
   (sum_k u_k mod 2**bits) * step - n range. The sum wraps around, and the decoded value is
   garbage, where it reaches 2**bits: with n clients that is avoided by
   bits >= precision_bits + log2(n). The emulation measures what the encoding costs
   (``secagg_error``, relative to the sum of the unencoded updates, which no real server
   could know) and how many coordinates wrapped (``secagg_wrapped``). Integer sums are
   kept in float64, exact below 2**53, hence bits <= 52. The aggregator must add updates as
   they are, with weight 1 (``needs_unit_weights``): the server's sum is the plain sum.

Only the model's parameters are encoded (the ``params`` extra sums' length); float buffers
(batch-norm statistics), when the model has any, are summed as they are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fedray.algorithms.base import (
    ClientContext,
    LocalUpdate,
    PartialSum,
    Payload,
    RoundPlan,
    UpdateStage,
    WorkerEnv,
    require,
)
from fedray.algorithms.reduction import PartialMessage
from fedray.algorithms.registry import register
from fedray.core.seeding import TAG_QUANTIZE, derive_seed
from fedray.errors import key_error

# secagg's rounding stream: derive_seed(client seed, TAG_QUANTIZE, 1), apart from the
# quantize stage's derive_seed(client seed, TAG_QUANTIZE), so that the two stages in one job
# never round with the same uniforms (fedray's choice)
_STREAM = 1
_EXACT_FLOAT64 = 2**53  # every integer up to here is exact in float64


@dataclass
class SecAggParams:
    min_clients: int = 2  # the fewest clients a revealed sum may hold
    bits: int = 0  # the modulus' bits (2..52); 0: no fixed-point emulation
    # each client's fixed-point levels: 2**precision_bits (the rounding's draw is float64, so it
    # stays unbiased to 2**(precision_bits - 52) of a level: keep it well below 52)
    precision_bits: int = 16
    range: float = 1.0  # each coordinate is clipped to [-range, range] before encoding


def _copy_of(acc: PartialSum) -> PartialSum:
    """An empty partial sum of ``acc``'s shape, device and extra sums."""
    return PartialSum(acc.total.numel(), acc.total.device,
                      {k: v.numel() for k, v in acc.extras.items()})


def _fold(dst: PartialSum, src: PartialSum) -> None:
    """dst += src (a partial sum as the driver merges a worker's)."""
    dst.merge(PartialMessage(src.total, src.weight, src.log_scale, src.extras))


@register
class SecureAggregation(UpdateStage):
    """Secure aggregation's threshold and fixed-point sum, emulated (module docstring)."""

    name = "secagg"
    section = "secagg"
    Params = SecAggParams

    def __init__(self, params: SecAggParams | None = None):
        super().__init__(params)
        p = self.params
        self.min_clients_per_partial = p.min_clients
        self.needs_unit_weights = p.bits > 0
        self.extras: dict[str, str | int] = {"secagg_clients": 1}
        if p.bits > 0:
            self.extras |= {"secagg_sum": "params", "secagg_exact": "params"}
        self.step = 2.0 * p.range / (2**p.precision_bits - 1)
        self._x: torch.Tensor | None = None  # reusable float64 buffers on the worker
        self._noise: torch.Tensor | None = None
        self._one: torch.Tensor | None = None
        self._reset()
        self._metrics: dict[str, float] = {}

    def check(self, params: SecAggParams) -> None:
        require(isinstance(params.min_clients, int) and params.min_clients >= 1,
                "min_clients", "must be an integer >= 1", params.min_clients)
        require(isinstance(params.bits, int) and (params.bits == 0 or 2 <= params.bits <= 52),
                "bits", "must be 0 (no fixed-point sum) or an integer in 2..52", params.bits)
        require(isinstance(params.precision_bits, int) and params.precision_bits >= 1,
                "precision_bits", "must be an integer >= 1", params.precision_bits)
        if params.bits > 0:
            require(params.precision_bits < params.bits, "precision_bits",
                    f"must be < bits ({params.bits})", params.precision_bits)
        require(math.isfinite(params.range) and params.range > 0, "range",
                "must be > 0 and finite", params.range)

    # -- on the workers -------------------------------------------------------------------

    def client_update(self, env: WorkerEnv, ctx: ClientContext, update: LocalUpdate,
                      acc: PartialSum) -> dict[str, torch.Tensor] | None:
        if self._one is None or self._one.device != acc.total.device:
            self._one = torch.ones(1, dtype=torch.float64, device=acc.total.device)
        acc.add_extra("secagg_clients", self._one)
        if self.params.bits == 0:
            return None
        p, r = self.params, self.params.range
        n = acc.extras["secagg_sum"].numel()  # the parameters (not float buffers)
        v = update.delta[:n]
        acc.add_extra("secagg_exact", v)  # only to measure the encoding's error
        if self._x is None or self._x.numel() != n or self._x.device != v.device:
            self._x = torch.empty(n, dtype=torch.float64, device=v.device)
            self._noise = torch.empty_like(self._x)
        x, noise = self._x, self._noise
        g = torch.Generator(device=v.device)
        g.manual_seed(derive_seed(ctx.seed, TAG_QUANTIZE, _STREAM))
        torch.rand(n, generator=g, dtype=torch.float64, out=noise)
        # u = floor((clip(v) + r) / step + U): the upper level with probability frac, unbiased
        x.copy_(v).clamp_(-r, r).add_(r).div_(self.step).add_(noise).floor_()
        x.clamp_(0, 2**p.precision_bits - 1)
        acc.add_extra("secagg_sum", x)
        v.copy_(x.mul_(self.step).sub_(r))  # what the server's sum holds of it, decoded
        return None

    def payload(self, before: Payload) -> Payload:
        if self.params.bits == 0:
            return before
        # a secure sum adds dense vectors: a sparse update is sent in full, without indices
        return Payload(values=before.dense or before.values, value_bits=self.params.bits,
                       overhead_bytes=before.overhead_bytes, dense=before.dense)

    # -- on the driver --------------------------------------------------------------------

    def _reset(self) -> None:
        self._pending: PartialSum | None = None  # pooled partials, fewer than min_clients
        self._pending_clients = 0
        self._held: PartialSum | None = None  # the last complete group, not yet revealed
        self._held_clients = 0
        self._groups: list[int] = []  # the sizes of the groups revealed this round

    def _release(self, acc: PartialSum) -> None:
        """Reveal the held group: fold it into the round's sum."""
        if self._held is not None:
            _fold(acc, self._held)
            self._groups.append(self._held_clients)
            self._held, self._held_clients = None, 0

    def init_server(self, plan: RoundPlan) -> None:
        """A fixed-size round below the threshold could never be revealed: refuse the job."""
        super().init_server(plan)
        k, m = plan.clients_per_round, self.params.min_clients
        if plan.sampling == "fixed" and k < m:
            raise key_error("algorithm.secagg.min_clients", f"exceeds "
                            f"sampling.clients_per_round ({k}): no round's sum could ever "
                            "be revealed", m)

    def merge(self, acc: PartialSum, part: PartialMessage) -> None:
        """Pool a worker's partial; once the pool holds min_clients clients it is a complete
        group, revealed only when the next one completes (or at ``close``)."""
        if self._pending is None:
            self._pending = _copy_of(acc)
        count = int(part.extras["secagg_clients"][0]) if part.weight > 0 else 0
        self._pending.merge(part)
        self._pending_clients += count
        if self._pending_clients >= self.params.min_clients:
            self._release(acc)
            self._held, self._held_clients = self._pending, self._pending_clients
            self._pending, self._pending_clients = None, 0

    def close(self, acc: PartialSum, round_idx: int) -> str | None:
        """Fold a short remainder into the held group, then reveal it; refuse the round
        when no group reached min_clients."""
        leftover = self._pending_clients
        aborted = self._held is None and leftover > 0
        if self._held is not None and leftover > 0:
            _fold(self._held, self._pending)
            self._held_clients += leftover
        self._release(acc)
        groups = self._groups
        self._metrics = {"secagg_sums": float(len(groups)),
                         "secagg_min_sum": float(min(groups, default=0)),
                         "secagg_aborted": float(aborted)}
        self._reset()
        if aborted:
            return (f"secure aggregation needs at least {self.params.min_clients} clients "
                    f"in a sum; round {round_idx} has {leftover}")
        return None

    def finish_sum(self, acc: PartialSum, round_idx: int) -> None:
        """Decode the fixed-point sum modulo 2**bits into the round's sum of updates."""
        p = self.params
        if p.bits == 0 or acc.weight <= 0:
            return
        if acc.log_scale != 0.0:
            raise ValueError(f"secagg: the round's sum is log-scaled ({acc.log_scale}); a "
                             "fixed-point sum needs unit weights")
        n = int(acc.extras["secagg_clients"][0])
        levels = 2**p.precision_bits - 1
        if n * levels > _EXACT_FLOAT64:
            raise ValueError(f"secagg: {n} clients of {p.precision_bits}-bit values overflow "
                             "float64's exact integers; lower secagg.precision_bits")
        total = acc.extras["secagg_sum"]
        modulus = float(2**p.bits)
        wrapped = int((total >= modulus).sum())  # what no real server could count
        decoded = torch.remainder(total, modulus).mul_(self.step).sub_(n * p.range)
        exact = acc.extras["secagg_exact"]
        norm = float(torch.linalg.vector_norm(exact))
        err = float(torch.linalg.vector_norm(decoded - exact))
        self._metrics |= {"secagg_error": err / norm if norm > 0 else err,
                          "secagg_wrapped": float(wrapped)}
        acc.total[: decoded.numel()] = decoded

    def round_metrics(self) -> dict[str, float]:
        return dict(self._metrics)
