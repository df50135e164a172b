"""User-level differential privacy: DP-FedAvg's clipping and Gaussian noise, adaptive clipping.

DP-FedAvg (McMahan et al., ICLR 2018) protects every client's whole data set at once: each
client's update is clipped to L2 norm C on the worker, the round's sum gets Gaussian noise
N(0, z^2 C^2) once on the driver, and the sum is divided by a fixed denominator, the
expected number of clients E, never by the realized count or weights. Why fixed: the
realized count (or the sum of example-count weights) depends on who took part, so dividing
by it would leak membership and break the sensitivity bound the noise is calibrated to;
with a fixed E, adding or removing one client moves the sum by at most C, whatever the
others did. That is also why the stage admits only aggregators that add each update as it
is (``Aggregator.unit_weights``: ``uniform``) and client parts that add nothing else to the
sum (a control variate, say, would be released without noise).

``mode: local`` is the comparison point: every client adds N(0, z^2 C^2) to its own clipped
update before it leaves the device, and the server adds nothing -- the noise on the mean is
then sqrt(E) times larger for the same z.

Adaptive clipping (Andrew et al., NeurIPS 2021) replaces a hand-tuned C by one that tracks
the ``target_quantile`` of the update norms: each client also reports b_i = 1[|Delta_i| <=
C], the server forms the noisy share b = (sum b_i + N(0, sigma_b^2)) / E and moves C
geometrically, C <- C exp(-clip_lr (b - target_quantile)). The count is private too: the
two Gaussian releases together are one Gaussian mechanism of multiplier z when the update's
noise uses z_update = (z^-2 - (2 sigma_b)^-2)^(-1/2) (the paper's composition argument), so
``noise_multiplier`` stays the z the accountant sees. fedray's defaults -- sigma_b = E / 20,
clip_lr 0.2 -- are fedray's choices, not values this module attributes to the paper.

The privacy spent -- epsilon at ``delta`` after each round, from a maintained accountant
(fedray.privacy.accountant, Google's dp-accounting) -- goes to metrics.jsonl as
``dp_epsilon``; ``epsilon_budget`` ends the run before a round that would exceed it.
docs/privacy.md has what is and is not simulated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from fedray.algorithms.base import (
    ClientContext,
    LocalUpdate,
    PartialSum,
    RoundPlan,
    UpdateStage,
    WorkerEnv,
    require,
)
from fedray.algorithms.registry import register, register_preset
from fedray.core.seeding import TAG_DP_LOCAL, TAG_DP_NOISE, derive_seed
from fedray.errors import key_error

MODES = ("central", "local")


@dataclass
class DPParams:
    mode: str = "central"  # central: noise once on the round's sum; local: on every update
    clip: float = 1.0  # C, the L2 bound on each client's update (adaptive: its start)
    noise_multiplier: float = 1.0  # z: noise std z * C (on the sum, or on each update)
    # adaptive clipping: the share of updates C should leave unclipped; null: C stays fixed
    target_quantile: float | None = None
    clip_lr: float = 0.2  # adaptive clipping's geometric step eta_C
    count_noise_multiplier: float | None = None  # sigma_b; null: expected clients / 20
    delta: float | None = None  # the delta epsilon is reported at; null: 1 / population^1.1
    epsilon_budget: float | None = None  # end the run before a round would spend more
    accountant: str = "rdp"  # rdp or pld (fedray.privacy.accountant)


# clipping scales by C / norm less this relative margin: float32 rounds each scaled entry by
# at most 2^-24 relative, so the clipped update's exact norm is then at most C, never just above
CLIP_MARGIN = 2.0 ** -23


def clip_(delta: torch.Tensor, clip: float) -> float:
    """Scale ``delta`` in place to L2 norm at most ``clip`` (exactly, in real arithmetic on
    the float32 values: the sensitivity bound DP's noise is calibrated to); its norm before,
    computed in float64."""
    norm = float(torch.linalg.vector_norm(delta, dtype=torch.float64))
    if norm > clip:
        delta.mul_(clip / norm * (1.0 - CLIP_MARGIN))
    return norm


def gaussian(size: int, std: float, seed: int, device: torch.device | str = "cpu",
             dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """N(0, std^2) noise from its own seeded stream (the same on any worker or driver)."""
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return torch.randn(size, generator=g, device=device, dtype=dtype).mul_(std)


def update_noise_multiplier(z: float, count_sigma: float) -> float:
    """The update's own noise multiplier under adaptive clipping: the z_update whose release,
    composed with the count's (sigma_b), is one Gaussian mechanism of multiplier z."""
    return (z ** -2 - (2.0 * count_sigma) ** -2) ** -0.5


@register
class DifferentialPrivacy(UpdateStage):
    name = "dp"
    section = "dp"
    Params = DPParams
    extras = {"dp_unclipped": 1}  # clients whose update was within C (adaptive clipping)
    provides = ("dp_clip",)  # the round's C, as the server's state has it
    needs_unit_weights = True
    needs_plain_client = True

    def check(self, p: DPParams) -> None:
        # imported when used, not at the top: it loads scipy (start-up time)
        from fedray.privacy.accountant import ACCOUNTANTS, ACCOUNTED_NOISE

        require(p.mode in MODES, "mode", f"must be one of: {', '.join(MODES)}", p.mode)
        require(p.clip > 0 and math.isfinite(p.clip), "clip", "must be > 0", p.clip)
        require(p.noise_multiplier >= 0, "noise_multiplier", "must be >= 0",
                p.noise_multiplier)
        lo, hi = ACCOUNTED_NOISE  # what the run's accountant can account
        require(p.noise_multiplier == 0 or lo <= p.noise_multiplier <= hi, "noise_multiplier",
                f"must be 0 or in [{lo:g}, {hi:g}]", p.noise_multiplier)
        q = p.target_quantile
        require(q is None or 0 < q < 1, "target_quantile", "must be in (0, 1) or null", q)
        require(q is None or p.mode == "central", "target_quantile",
                "adaptive clipping is for mode central (its count is noised on the server)", q)
        require(p.clip_lr > 0, "clip_lr", "must be > 0", p.clip_lr)
        s = p.count_noise_multiplier
        require(s is None or s > 0, "count_noise_multiplier", "must be > 0 or null", s)
        require(p.delta is None or 0 < p.delta < 1, "delta", "must be in (0, 1) or null",
                p.delta)
        require(p.epsilon_budget is None or p.epsilon_budget > 0, "epsilon_budget",
                "must be > 0 or null", p.epsilon_budget)
        require(p.accountant in ACCOUNTANTS, "accountant",
                f"must be one of: {', '.join(ACCOUNTANTS)}", p.accountant)

    # -- on the workers -------------------------------------------------------------------

    def client_update(self, env: WorkerEnv, ctx: ClientContext, update: LocalUpdate,
                      acc: PartialSum) -> None:
        p = self.params
        clip = float(env.broadcast["dp_clip"][0])
        norm = clip_(update.delta, clip)
        if norm <= clip:
            acc.extras["dp_unclipped"][0] += 1.0
        if p.mode == "local" and p.noise_multiplier > 0:
            update.delta.add_(gaussian(update.delta.numel(), p.noise_multiplier * clip,
                                       derive_seed(ctx.seed, TAG_DP_LOCAL), env.device))

    # -- on the driver --------------------------------------------------------------------

    def init_server(self, plan: RoundPlan) -> None:
        super().init_server(plan)
        # imported when used, not at the top: it loads scipy (start-up time)
        from fedray.privacy.accountant import Accountant, default_delta

        p = self.params
        self.expected = plan.clients_per_round * (1.0 - plan.dropout)  # the denominator E
        self.count_sigma = (p.count_noise_multiplier if p.count_noise_multiplier is not None
                            else self.expected / 20.0)
        self.update_z = p.noise_multiplier
        if p.target_quantile is not None and p.noise_multiplier > 0:
            if 2.0 * self.count_sigma <= p.noise_multiplier:
                raise key_error("algorithm.dp.count_noise_multiplier", "must exceed "
                                f"noise_multiplier / 2 = {p.noise_multiplier / 2:g} (the count's "
                                "noise takes a share of the privacy z buys)", self.count_sigma)
            self.update_z = update_noise_multiplier(p.noise_multiplier, self.count_sigma)
        self.delta = p.delta if p.delta is not None else default_delta(plan.population)
        try:  # a combination the accountant cannot bound fails now, naming the key
            self.accountant = Accountant(
                p.noise_multiplier, self.delta,
                sampling=plan.sampling if p.mode == "central" else "local",
                population=plan.population, clients_per_round=plan.clients_per_round,
                accountant=p.accountant)
            self.accountant.epsilon(1)
        except ValueError as exc:
            raise key_error("algorithm.dp.accountant", str(exc), p.accountant) from None
        self.state = {"clip": torch.tensor([p.clip], dtype=torch.float64),
                      "rounds": torch.zeros(1, dtype=torch.float64)}
        self._metrics: dict[str, float] = {}

    def broadcast(self) -> dict[str, torch.Tensor]:
        return {"dp_clip": self.state["clip"].float()}

    @property
    def rounds(self) -> int:
        """The rounds whose sum was released (noised and used)."""
        return int(self.state["rounds"][0])

    def finish_sum(self, acc: PartialSum, round_idx: int) -> None:
        """Noise (central), then the fixed denominator E; adaptive clipping's next C."""
        p, plan = self.params, self.plan
        if acc.weight > 0 and acc.log_scale != 0.0:
            raise ValueError("dp: the partial sum carries softmax weights; DP-FedAvg needs "
                             "unit weights")
        clip = float(self.state["clip"][0])
        seed = derive_seed(plan.seed, TAG_DP_NOISE, round_idx)
        if p.mode == "central" and p.noise_multiplier > 0:
            acc.total.add_(gaussian(acc.total.numel(), self.update_z * clip, seed,
                                    dtype=torch.float64))
        acc.weight, acc.log_scale = self.expected, 0.0  # never the realized count
        unclipped = float(acc.extras["dp_unclipped"][0])
        self._metrics = {"dp_clip": clip}
        if p.target_quantile is not None:
            noisy = unclipped + float(gaussian(1, self.count_sigma, derive_seed(seed, 1),
                                               dtype=torch.float64)[0])
            share = noisy / self.expected
            self.state["clip"][0] = clip * math.exp(-p.clip_lr * (share - p.target_quantile))
            self._metrics["dp_unclipped_share"] = share  # noised: what the server sees
        elif self.expected > 0:
            # fixed C: the exact share, a simulation diagnostic no real server would see
            self._metrics["dp_unclipped_share"] = unclipped / self.expected
        self.state["rounds"][0] += 1

    def round_metrics(self) -> dict[str, float]:
        return {**self._metrics, "dp_epsilon": self.accountant.epsilon(self.rounds)}

    def stop_reason(self, next_round: int) -> str | None:
        budget = self.params.epsilon_budget
        if budget is None:
            return None
        eps = self.accountant.epsilon(self.rounds + 1)
        if eps <= budget:
            return None
        return (f"privacy budget: round {next_round} would spend epsilon {eps:.4g} > "
                f"algorithm.dp.epsilon_budget {budget:g} (delta {self.delta:.3g})")

    def summary(self) -> dict[str, Any]:
        p = self.params
        return {"epsilon": self.accountant.epsilon(self.rounds), "delta": self.delta,
                "rounds": self.rounds, "accountant": p.accountant, "mode": p.mode,
                "sampling": self.plan.sampling, "noise_multiplier": p.noise_multiplier,
                "update_noise_multiplier": self.update_z,
                "clip": float(self.state["clip"][0]), "expected_clients": self.expected}


register_preset("dp_fedavg", "local_sgd", "uniform", "sgd", stages=("dp",))
