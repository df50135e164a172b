"""The reduction every aggregator is written in: a weighted, log-scaled partial sum.

A weighted mean sum_k w_k v_k / sum_k w_k is associative, so a worker folds its clients into
one ``PartialSum`` and sends that back -- the driver never sees a per-client model
(architecture rule 2). Sums are float64 so the result does not depend on how clients were
split over workers (to ~1e-15, far below float32 resolution).

Softmax weights (Exp-alpha's rho_k proportional to exp(s_k)) would overflow for small
temperatures, so the sums are kept multiplied by exp(-m), m the largest log-scale added so
far, and merged by rescaling to the larger m: log-sum-exp. Beside the mean, a sum may carry
named extra vectors (SCAFFOLD's sum of dc_i, Elastic's sum of w_k Omega_k), summed as they
are (unscaled).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from fedray.core.tensors import add_scaled_, readonly_tensor

Vector = np.ndarray | torch.Tensor


def _tensor(v: Vector) -> torch.Tensor:
    return readonly_tensor(v) if isinstance(v, np.ndarray) else v


@dataclass
class PartialMessage:
    """A partial sum as it travels from a worker to the driver (numpy: zero-copy in Ray)."""

    sum: np.ndarray
    weight: float
    log_scale: float
    extras: dict[str, np.ndarray] = field(default_factory=dict)


class PartialSum:
    """sum_k w_k v_k and sum_k w_k, both multiplied by exp(-log_scale), plus named unscaled
    ``extras`` sums."""

    def __init__(self, size: int, device: torch.device | str = "cpu",
                 extras: dict[str, int] | None = None):
        self.total = torch.zeros(size, dtype=torch.float64, device=device)
        self.weight = 0.0
        self.log_scale = -math.inf  # nothing added yet
        self.extras = {k: torch.zeros(n, dtype=torch.float64, device=device)
                       for k, n in (extras or {}).items()}

    def _align(self, log_scale: float) -> float:
        """Bring the sum to max(own, given) scale; the factor for the incoming term."""
        if log_scale > self.log_scale:
            if self.weight:
                factor = math.exp(self.log_scale - log_scale)
                self.total.mul_(factor)
                self.weight *= factor
            self.log_scale = log_scale
            return 1.0
        return math.exp(log_scale - self.log_scale)

    def add(self, value: torch.Tensor, weight: float, log_scale: float = 0.0) -> None:
        """Fold in one client: weight * exp(log_scale) * value."""
        f = weight * self._align(log_scale)
        add_scaled_(self.total, value, f)
        self.weight += f

    def add_extra(self, name: str, value: torch.Tensor, weight: float = 1.0) -> None:
        """extras[name] += weight * value (value may be shorter: a prefix is summed)."""
        try:
            extra = self.extras[name]
        except KeyError:
            raise KeyError(f"partial sum has no extra sum {name!r} (declared: "
                           f"{sorted(self.extras)}); declare it in the part's extras") from None
        add_scaled_(extra[: value.numel()], value, weight)

    def merge(self, part: PartialMessage) -> None:
        """Fold in another partial sum (a worker's ``to_message()``)."""
        if part.weight <= 0:
            return
        f = self._align(part.log_scale)
        self.total.add_(_tensor(part.sum), alpha=f)
        self.weight += part.weight * f
        for k, v in part.extras.items():
            self.extras[k].add_(_tensor(v))

    def mean(self) -> torch.Tensor:
        if self.weight <= 0:
            raise ValueError("no client contributed to this round")
        return self.total / self.weight

    def to_message(self) -> PartialMessage:
        return PartialMessage(self.total.cpu().numpy(), self.weight, self.log_scale,
                              {k: v.cpu().numpy() for k, v in self.extras.items()})


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """torch's add on the CPU splits a long vector among its threads, and a split may change
    which elements take the scalar path instead of the vector one (a fused multiply-add):
    a fold that must be bit-identical wherever it runs -- a worker with many threads, the
    driver with one -- runs on one."""
    before = torch.get_num_threads()
    if before != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if before != 1:
            torch.set_num_threads(before)


def fold_partials(parts: Iterable[PartialMessage]) -> PartialMessage:
    """The partial sums ``parts`` merged into one, from zero, in the order given.

    One definition of a group's sum (runtime.reduce, fedray.runtime.reduction_tree) for
    every place that makes it -- a worker, the driver, a fallback after a fault -- so the
    round's arithmetic does not depend on where its groups were summed. ``parts`` is
    consumed one at a time: a caller that fetches each as it is needed holds one."""
    acc: PartialSum | None = None
    for part in parts:
        if acc is None:
            acc = PartialSum(part.sum.size, extras={k: v.size for k, v in part.extras.items()})
        with _one_thread():
            acc.merge(part)
    if acc is None:
        raise ValueError("no partial sums to fold")
    return acc.to_message()
