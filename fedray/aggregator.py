"""Aggregation as partial sums: each worker reduces its own clients, the driver merges.

A weighted mean sum_k w_k d_k / sum_k w_k is associative, so a worker folds its clients
into one ``PartialSum`` and sends that back -- the driver never sees a per-client model
(architecture rule 2). Sums are float64 so the result does not depend on how clients were
split over workers (to ~1e-15, far below float32 resolution).

Every aggregator is such a mean plus, for some, one more summed vector and a finishing
step on the driver:

  proportional  w_k = |D_k|                                   (FedAvg, McMahan et al.)
  uniform       w_k = 1
  scaffold      dx = mean of dy_i (w_k = 1); extra = sum of dc_i over the round's clients;
                the driver keeps c <- c + (1/N) sum dc_i, N = population (Karimireddy et al.)
  elastic       w_k = |D_k|; extra = sum w_k Omega_k; the driver scales each parameter's
                mean delta by zeta = 1 + tau - Omega / max(Omega), Omega = sum w_k Omega_k /
                sum w_k (Chen et al., CVPR 2023)
  expalpha      rho_k proportional to exp((F_k(after) - F_k(before)) / alpha): a softmax, so
                the partial sum carries a log-scale m and is stored as exp(-m)-scaled sums
                (max, scaled sum), merged by rescaling to the larger m -- log-sum-exp, no
                overflow for tiny alpha (seed 003)
"""

from __future__ import annotations

import math

import numpy as np
import torch

from fedray.tensors import readonly_tensor

Vector = np.ndarray | torch.Tensor


def _tensor(v: Vector) -> torch.Tensor:
    return readonly_tensor(v) if isinstance(v, np.ndarray) else v


class PartialSum:
    """sum_k w_k d_k and sum_k w_k, both multiplied by exp(-log_scale), plus an optional
    unscaled ``extra`` sum (SCAFFOLD's sum of dc_i, Elastic's sum of w_k Omega_k)."""

    def __init__(self, size: int, device: torch.device | str = "cpu", extra_size: int = 0):
        self.total = torch.zeros(size, dtype=torch.float64, device=device)
        self.weight = 0.0
        self.log_scale = -math.inf  # nothing added yet
        self.extra = (torch.zeros(extra_size, dtype=torch.float64, device=device)
                      if extra_size else None)

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
        self.total.add_(value, alpha=f)
        self.weight += f

    def add_extra(self, value: torch.Tensor, weight: float = 1.0) -> None:
        assert self.extra is not None
        self.extra[: value.numel()].add_(value, alpha=weight)

    def merge(self, part: dict) -> None:
        """Fold in another partial sum (a worker's ``to_message()``)."""
        if part["weight"] <= 0:
            return
        f = self._align(part["log_scale"])
        self.total.add_(_tensor(part["sum"]), alpha=f)
        self.weight += part["weight"] * f
        if part.get("extra") is not None:
            self.extra.add_(_tensor(part["extra"]))

    def mean(self) -> torch.Tensor:
        if self.weight <= 0:
            raise ValueError("no client contributed to this round")
        return self.total / self.weight

    def to_message(self) -> dict:
        return {"sum": self.total.cpu().numpy(), "weight": self.weight,
                "log_scale": self.log_scale,
                "extra": None if self.extra is None else self.extra.cpu().numpy()}


# What each aggregator needs the client to measure besides its delta.
NEEDS = {"proportional": (), "uniform": (), "scaffold": ("control_variate",),
         "elastic": ("sensitivity",), "expalpha": ("risks",)}


def extra_size(aggregator: str, num_params: int) -> int:
    """Length of the extra summed vector: one value per parameter for scaffold and elastic."""
    return num_params if aggregator in ("scaffold", "elastic") else 0


def client_weight(aggregator: str, num_examples: int) -> float:
    """A client's weight in the mean: its example count (proportional, elastic) or 1. A
    client without examples never counts."""
    if num_examples == 0:
        return 0.0
    return float(num_examples) if aggregator in ("proportional", "elastic") else 1.0


def expalpha_log_weight(risk_before: float, risk_after: float, alpha: float) -> float:
    """log rho_k up to the round's normaliser: (F_k(W_k^{T+E}) - F_k(W^T)) / alpha."""
    return (risk_after - risk_before) / alpha


def elastic_scale(omega: torch.Tensor, tau: float) -> torch.Tensor:
    """zeta = 1 + tau - Omega / max(Omega); all-zero sensitivity (max 0) gives 1 + tau."""
    top = float(omega.max()) if omega.numel() else 0.0
    return (1.0 + tau) - (omega / top if top > 0 else torch.zeros_like(omega))


class Aggregation:
    """The driver's side of an aggregator: merges partial sums and finishes the round.

    ``state`` holds what persists across rounds (SCAFFOLD's c); ``broadcast`` is what the
    workers need each round beside the weights (again c), shipped in the same object."""

    def __init__(self, name: str, size: int, num_params: int, *, population: int = 1,
                 tau: float = 0.0):
        self.name = name
        self.size = size
        self.num_params = num_params
        self.population = population
        self.tau = tau
        self.state: dict[str, torch.Tensor] = {}
        if name == "scaffold":
            self.state["c"] = torch.zeros(num_params, dtype=torch.float32)

    def new_sum(self) -> PartialSum:
        return PartialSum(self.size, extra_size=extra_size(self.name, self.num_params))

    def broadcast(self) -> dict[str, np.ndarray]:
        return {k: v.numpy() for k, v in self.state.items()}

    def finish(self, acc: PartialSum) -> torch.Tensor:
        """The round's aggregated delta (float64), updating the state where there is one."""
        delta = acc.mean()
        if self.name == "scaffold":
            c = self.state["c"]
            self.state["c"] = (c.double() + acc.extra / self.population).float()
        elif self.name == "elastic":
            omega = acc.extra / acc.weight
            delta[: self.num_params].mul_(elastic_scale(omega, self.tau))
        return delta

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self.state.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        missing = set(self.state) - set(state)
        if missing:
            raise ValueError(f"aggregator {self.name}: state lacks {sorted(missing)}")
        self.state = {k: state[k].clone() for k in self.state}
