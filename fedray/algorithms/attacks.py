"""Poisoning attacks: what the job's malicious clients do (the ``adversary`` section).

Who is malicious is the threat model's (fedray.runtime.adversary); what they do is an
``Attack`` (fedray.algorithms.base), one of these or a user's by import path. Data poisoning
changes a malicious client's training data on the worker; model poisoning changes the
update it sends; the omniscient attacks rewrite the malicious rows of the round's
individual updates on the driver from the benign ones.

label_flip   every training label of a malicious client changed: to ``target``
             (all_to_one), or to a uniformly drawn other class (random).
backdoor     a pixel-pattern trigger (a square or a plus in the bottom-right corner) drawn
             on a ``poison_fraction`` share of the client's training images each round,
             relabelled ``target`` (Bagdasaryan, Veit, Hua, Estrin, Shmatikov, "How To
             Backdoor Federated Learning", AISTATS 2020; Sun, Kairouz, Suresh, McMahan,
             "Can You Really Backdoor Federated Learning?", 2019). The trigger is drawn on
             the fly; nothing in the store is rewritten. Its success is measured on the
             central test set's images of the other classes, triggered: the share
             classified as ``target`` (``test_attack_success``).
sign_flip    the update sent as -scale times the honest one.
scaling      the update boosted by ``boost``: with a backdoor, the model replacement of
             Bagdasaryan et al., where the boost makes one client's update outweigh the
             round's average.
noise        Gaussian noise: the update replaced by (or, with ``add``, added to) N(0, std^2)
             per coordinate -- the "Gaussian" Byzantine worker of Blanchard et al.'s
             experiments (NeurIPS 2017).
alie         "A Little Is Enough" (Baruch, Baruch, Goldberg, NeurIPS 2019): every malicious
             row set to mu - z sigma, the coordinate-wise mean and standard deviation of the
             round's benign rows; z from the paper's bound on how far the attackers can go
             while a majority-based defense still counts them as inliers (``z`` unset):
             s = floor(n/2 + 1) - m supporters needed, z = Phi^-1((n - s) / n).
ipm          inner-product manipulation (Xie, Koyejo, Gupta, "Fall of Empires: Breaking
             Byzantine-tolerant SGD by Inner Product Manipulation", UAI 2019): every
             malicious row set to -epsilon times the benign rows' mean, so the aggregate's
             inner product with the true direction turns negative while each attacker stays
             close to the benign ones.

Every default here is fedray's choice, not a value attributed to those papers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np
import torch

from fedray.algorithms.base import (
    Attack,
    ClientContext,
    ClientRows,
    LocalUpdate,
    WorkerEnv,
    finite_number,
    require,
)
from fedray.algorithms.registry import register
from fedray.core.seeding import TAG_ATTACK, derive_seed
from fedray.core.tensors import readonly_tensor

LABEL_FLIP_MODES = ("all_to_one", "random")
TRIGGERS = ("square", "plus")


# each built-in attack's salt of the attack stream, so that two attacks on one client
# (label_flip and backdoor) draw independently
SALT_LABEL_FLIP, SALT_NOISE, SALT_BACKDOOR = 0, 1, 2


def attack_rng(ctx_seed: int, salt: int = 0) -> np.random.Generator:
    """An attack's own stream from a client's round seed: what it draws never shifts the
    client's training draws (batches, dropout), which come from the seed itself."""
    return np.random.default_rng(derive_seed(ctx_seed, TAG_ATTACK, salt))


def _is_class(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass
class LabelFlipParams:
    mode: str = "all_to_one"  # all_to_one: every label becomes target; random: another class
    target: int = 0  # all_to_one's class


@register
class LabelFlip(Attack):
    name = "label_flip"
    section = "label_flip"
    Params = LabelFlipParams

    def check(self, params: LabelFlipParams) -> None:
        require(params.mode in LABEL_FLIP_MODES, "mode",
                f"must be one of: {', '.join(LABEL_FLIP_MODES)}", params.mode)
        require(_is_class(params.target), "target", "must be a class index >= 0",
                params.target)

    def check_data(self, input_shape: tuple[int, ...], num_classes: int,
                   test_x: np.ndarray | None = None) -> None:
        require(num_classes >= 2, "mode", f"needs labelled classes; the data has "
                f"{num_classes}", self.params.mode)
        require(self.params.target < num_classes, "target",
                f"must be a class of the data (0..{num_classes - 1})", self.params.target)
        self.num_classes = num_classes

    def poison_data(self, env: WorkerEnv, ctx: ClientContext) -> None:
        y = ctx.y.numpy()
        if self.params.mode == "all_to_one":
            new = np.full_like(y, self.params.target)
        else:  # a uniformly drawn class other than the true one: y + 1 + U{0..C-2} mod C
            shift = attack_rng(ctx.seed, SALT_LABEL_FLIP).integers(1, self.num_classes,
                                                                   size=y.shape)
            new = ((y + shift) % self.num_classes).astype(y.dtype)
        ctx.y = readonly_tensor(new)


@dataclass
class BackdoorParams:
    target: int = 0  # the class a triggered input is to be taken for
    poison_fraction: float = 0.5  # share of a malicious client's examples triggered, per round
    trigger: str = "square"  # square | plus, in the bottom-right corner
    size: int = 4  # the pattern's side, in pixels
    value: float | None = None  # the trigger's pixel value; None: the test inputs' extreme
    # (min or max) farthest from their mean -- white on MNIST, dark ink on FEMNIST


def image_dims(input_shape: tuple[int, ...]) -> tuple[int, int] | None:
    """(height, width) of images of this shape: (C, H, W), (H, W), or a flat square
    (784: 28 x 28); None for inputs that are not images."""
    if len(input_shape) in (2, 3):
        return int(input_shape[-2]), int(input_shape[-1])
    if len(input_shape) == 1:
        side = math.isqrt(int(input_shape[0]))
        if side * side == input_shape[0] and side >= 2:
            return side, side
    return None


def trigger_mask(height: int, width: int, size: int, pattern: str) -> np.ndarray:
    """The trigger's pixels: a ``size`` x ``size`` square, or a plus of that span, one pixel
    in from the bottom-right corner."""
    mask = np.zeros((height, width), bool)
    top, left = height - 1 - size, width - 1 - size
    if pattern == "square":
        mask[top:top + size, left:left + size] = True
    else:
        mid = size // 2
        mask[top + mid, left:left + size] = True
        mask[top:top + size, left + mid] = True
    return mask


@register
class Backdoor(Attack):
    name = "backdoor"
    section = "backdoor"
    Params = BackdoorParams

    def check(self, params: BackdoorParams) -> None:
        require(_is_class(params.target), "target", "must be a class index >= 0",
                params.target)
        require(finite_number(params.poison_fraction) and 0 < params.poison_fraction <= 1,
                "poison_fraction", "must be in (0, 1]", params.poison_fraction)
        require(params.trigger in TRIGGERS, "trigger", f"must be one of: "
                f"{', '.join(TRIGGERS)}", params.trigger)
        require(isinstance(params.size, int) and not isinstance(params.size, bool)
                and params.size >= 1, "size", "must be an integer >= 1", params.size)
        require(params.value is None or finite_number(params.value), "value",
                "must be a finite number (or unset)", params.value)

    def check_data(self, input_shape: tuple[int, ...], num_classes: int,
                   test_x: np.ndarray | None = None) -> None:
        p = self.params
        dims = image_dims(tuple(input_shape))
        require(dims is not None, "trigger", f"draws on images; the inputs have shape "
                f"{tuple(input_shape)}", p.trigger)
        require(p.size + 1 <= min(dims), "size", f"must leave the trigger inside the "
                f"{dims[0]} x {dims[1]} images", p.size)
        require(p.target < num_classes, "target",
                f"must be a class of the data (0..{num_classes - 1})", p.target)
        self.shape = tuple(input_shape)
        self.mask = trigger_mask(*dims, p.size, p.trigger).reshape(-1)
        if p.value is not None:
            self.pixel = float(p.value)
        elif test_x is not None and np.size(test_x):
            x = np.asarray(test_x, np.float64)
            lo, hi, mean = float(x.min()), float(x.max()), float(x.mean())
            self.pixel = hi if hi - mean >= mean - lo else lo
        else:
            self.pixel = 1.0

    def stamp(self, x: np.ndarray) -> np.ndarray:
        """Images with the trigger drawn on (a copy), every channel alike."""
        out = np.array(x, copy=True)
        flat = out.reshape(len(out), -1, int(self.mask.size))
        flat[:, :, self.mask] = self.pixel
        return out

    def poison_data(self, env: WorkerEnv, ctx: ClientContext) -> None:
        n = len(ctx.y)
        count = int(round(self.params.poison_fraction * n))
        if not count:
            return
        pick = np.sort(attack_rng(ctx.seed, SALT_BACKDOOR).choice(n, size=count,
                                                                  replace=False))
        x, y = ctx.x.numpy().copy(), ctx.y.numpy().copy()
        x[pick] = self.stamp(x[pick])
        y[pick] = self.params.target
        ctx.x, ctx.y = readonly_tensor(x), readonly_tensor(y)

    def poison_test(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        other = np.asarray(y) != self.params.target
        return self.stamp(np.asarray(x)[other]), np.full(int(other.sum()), self.params.target,
                                                          np.asarray(y).dtype)


class _Multiply(Attack):
    """An update sent as ``sign`` times its Params' one positive field (``key``) times the
    honest one: the sign flip and the boost differ only in that sign and name."""

    key = ""
    sign = 1.0

    def check(self, params: Any) -> None:
        value = getattr(params, self.key)
        require(finite_number(value) and value > 0, self.key, "must be > 0", value)

    def poison_update(self, env: WorkerEnv, ctx: ClientContext, update: LocalUpdate) -> None:
        update.delta = update.delta * (self.sign * getattr(self.params, self.key))


@dataclass
class SignFlipParams:
    scale: float = 1.0  # the update is sent as -scale times the honest one


@register
class SignFlip(_Multiply):
    name = "sign_flip"
    section = "sign_flip"
    Params = SignFlipParams
    key, sign = "scale", -1.0


@dataclass
class ScalingParams:
    boost: float = 10.0  # the update is sent boost times larger


@register
class Scaling(_Multiply):
    name = "scaling"
    section = "scaling"
    Params = ScalingParams
    key = "boost"


@dataclass
class NoiseParams:
    std: float = 1.0  # of each coordinate's Gaussian noise
    add: bool = False  # False: the update is replaced by the noise; True: noise added to it


@register
class Noise(Attack):
    name = "noise"
    section = "noise"
    Params = NoiseParams

    def check(self, params: NoiseParams) -> None:
        require(finite_number(params.std) and params.std > 0, "std", "must be > 0",
                params.std)
        require(isinstance(params.add, bool), "add", "must be true or false", params.add)

    def poison_update(self, env: WorkerEnv, ctx: ClientContext, update: LocalUpdate) -> None:
        gen = torch.Generator().manual_seed(derive_seed(ctx.seed, TAG_ATTACK, SALT_NOISE))
        noise = torch.randn(update.delta.shape, generator=gen, dtype=torch.float32)
        noise = noise.mul_(self.params.std).to(update.delta.device)
        update.delta = update.delta + noise if self.params.add else noise


def benign_stats(updates: torch.Tensor, malicious: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """The coordinate-wise mean and (population) standard deviation of the benign rows, in
    float64; of every row when the round sampled no benign client (the attackers then know
    only their own honest updates)."""
    benign = updates[~malicious] if bool((~malicious).any()) else updates
    rows = benign.to(torch.float64)
    return rows.mean(0), rows.std(0, correction=0)


def alie_z(n: int, m: int) -> float:
    """Baruch et al.'s z for n clients, m of them malicious: the attackers need
    s = floor(n/2 + 1) - m benign supporters, and go as far as the share (n - s) / n of
    a normal's mass allows. Clamped to a finite z (probability at most 1 - 1e-6) when the
    attackers are a majority, and to 0 when they need more supporters than half."""
    s = n // 2 + 1 - m
    p = min(max((n - s) / n, 0.5), 1 - 1e-6)
    return NormalDist().inv_cdf(p)


@dataclass
class AlieParams:
    z: float | None = None  # None: from the round's n and malicious count (alie_z)


@register
class Alie(Attack):
    name = "alie"
    section = "alie"
    Params = AlieParams
    omniscient = True

    def check(self, params: AlieParams) -> None:
        require(params.z is None or finite_number(params.z) and params.z >= 0, "z",
                "must be >= 0 (or unset: from the round's counts)", params.z)

    def poison_rows(self, updates: torch.Tensor, malicious: torch.Tensor,
                    clients: ClientRows, seed: int, round_idx: int) -> None:
        m = int(malicious.sum())
        if not m:
            return
        mu, sigma = benign_stats(updates, malicious)
        z = alie_z(len(updates), m) if self.params.z is None else float(self.params.z)
        updates[malicious] = (mu - z * sigma).to(updates.dtype)


@dataclass
class IpmParams:
    epsilon: float = 0.1  # malicious rows are -epsilon times the benign mean


@register
class Ipm(Attack):
    name = "ipm"
    section = "ipm"
    Params = IpmParams
    omniscient = True

    def check(self, params: IpmParams) -> None:
        require(finite_number(params.epsilon) and params.epsilon > 0, "epsilon",
                "must be > 0", params.epsilon)

    def poison_rows(self, updates: torch.Tensor, malicious: torch.Tensor,
                    clients: ClientRows, seed: int, round_idx: int) -> None:
        if not bool(malicious.any()):
            return
        mu, _ = benign_stats(updates, malicious)
        updates[malicious] = (-self.params.epsilon * mu).to(updates.dtype)
