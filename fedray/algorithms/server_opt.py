"""Server optimizer: turns the round's aggregated client delta into the next global model.

The mean delta is the negative pseudo-gradient of Reddi et al.'s SERVEROPT view ("Adaptive
Federated Optimization", ICLR 2021, Alg. 2), so every optimizer here *adds* its update. With
SGD at server learning rate eta_s this is FedAvg's x <- x + eta_s * mean_delta (eta_s = 1 is
plain FedAvg); momentum gives FedAvgM, and Adam / Yogi / Adagrad give FedAdam / FedYogi /
FedAdagrad exactly as in Alg. 2 (no bias correction, v_0 = tau^2).

All arithmetic is float64 (the delta already is); the returned weights are float32, as the
model's are. The state is a plain dict of float64 tensors and ints, so a run directory can
checkpoint it with safetensors, and it is sized on the first step, so an optimizer can be
built before the model exists.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch

from fedray.algorithms.registry import lookup, register
from fedray.errors import key_error

StateDict = dict[str, torch.Tensor | float | int]


def _check(key: str, value: float, ok: bool, rule: str) -> None:
    if not ok:
        raise key_error(f"server.{key}", rule, value)


def _positive(key: str, value: float) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    _check(key, value, ok, "must be a finite number")
    _check(key, value, value > 0, "must be > 0")
    return float(value)


def _unit(key: str, value: float) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    _check(key, value, ok and 0 <= value < 1, "must be in [0, 1)")
    return float(value)


class ServerOptimizer:
    """x <- x + update(mean_delta), with the optimizer's own state in float64 buffers.

    Subclasses list their buffers in `buffers` and implement `_update`, which receives the
    float64 delta (buffers already allocated) and returns the float64 update to add."""

    part_kind: ClassVar[str] = "server_opt"  # its kind in the registry
    name: str = ""
    buffers: tuple[str, ...] = ()
    section: str | None = None  # a user's optimizer may read algorithm.<section> (Params)
    Params: type | None = None

    @classmethod
    def from_config(cls, server, params=None) -> ServerOptimizer:
        """Built from the job's ``server`` section (and its own ``Params``, if it has any)."""
        raise NotImplementedError(f"{cls.__name__} must define from_config(server, params)")

    def __init__(self) -> None:
        self.steps = 0
        self.state: dict[str, torch.Tensor] = {}

    def step(self, weights: torch.Tensor, mean_delta: torch.Tensor) -> torch.Tensor:
        """New global weights (float32) from the old ones and a float64 mean delta.

        Neither argument is modified in place."""
        if weights.shape != mean_delta.shape or weights.dim() != 1:
            raise ValueError(f"{self.name}: weights {tuple(weights.shape)} and mean delta "
                             f"{tuple(mean_delta.shape)} must be flat vectors of one size")
        delta = mean_delta.to(torch.float64)
        if self.buffers and not self.state:
            self.state = {k: self._initial(k, delta) for k in self.buffers}
        self._check_size(delta.numel())
        update = self._update(delta)
        self.steps += 1
        return (weights.double() + update).float()

    def state_dict(self) -> StateDict:
        """A copy of the state: `step` (rounds taken) and, after the first step, the buffers."""
        out: StateDict = {"step": self.steps}
        out.update({k: v.clone() for k, v in self.state.items()})
        return out

    def load_state_dict(self, state: StateDict) -> None:
        """Restore a `state_dict()` exactly (copies it), so a resumed run is bit-identical."""
        tensors = {k for k in state if k != "step"}
        if not all(isinstance(state[k], torch.Tensor) for k in tensors):
            raise key_error("algorithm.server_opt", "the saved optimizer buffers must be tensors",
                            self.name)
        if "step" not in state or tensors not in (set(), set(self.buffers)):
            raise key_error("algorithm.server_opt", f"the saved optimizer state has keys "
                            f"{sorted(state)}, expected step and {list(self.buffers)}", self.name)
        sizes = {state[k].numel() for k in tensors}
        if len(sizes) > 1:
            raise key_error("algorithm.server_opt", "the saved optimizer buffers differ in size",
                            self.name)
        self.steps = int(state["step"])
        self.state = {k: state[k].detach().to(torch.float64).clone() for k in self.buffers
                      if k in tensors}

    def _check_size(self, n: int) -> None:
        for v in self.state.values():
            if v.numel() != n:
                raise key_error("algorithm.server_opt", f"its state is for {v.numel()} "
                                f"parameters but the model has {n}", self.name)

    def _initial(self, key: str, delta: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(delta)

    def _update(self, delta: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def __repr__(self) -> str:
        hp = ", ".join(f"{k}={v!r}" for k, v in vars(self).items()
                       if k not in ("steps", "state", "name"))
        return f"{type(self).__name__}({hp})"


@register
class ServerSGD(ServerOptimizer):
    """x <- x + lr * delta (FedAvg when lr = 1). No state besides the step count."""

    name = "sgd"

    @classmethod
    def from_config(cls, server, params=None) -> ServerSGD:
        return cls(server.lr)

    def __init__(self, lr: float):
        super().__init__()
        self.lr = _positive("lr", lr)

    def _update(self, delta: torch.Tensor) -> torch.Tensor:
        return self.lr * delta


@register
class ServerMomentum(ServerOptimizer):
    """FedAvgM (Hsu et al. 2019): m <- beta * m + (1 - dampening) * delta; x <- x + lr * m,
    with m_0 = 0.

    ``dampening`` is PyTorch SGD's: 0 (the default) is the undamped heavy ball; dampening =
    beta is the exponential moving average m <- beta m + (1 - beta) delta of Chen et al.'s
    Alg. 1 (seed 000 line 130), whose steady state is delta itself rather than
    delta / (1 - beta), so the same ``lr`` takes a step 1 / (1 - beta) times shorter.
    Nesterov: the same m, then x <- x + lr * (delta + beta * m) (PyTorch SGD's form applied to
    the negative pseudo-gradient). momentum = 0 and dampening = 0 give ServerSGD exactly."""

    name = "momentum"
    buffers = ("m",)

    @classmethod
    def from_config(cls, server, params=None) -> ServerMomentum:
        return cls(server.lr, server.momentum, nesterov=cls.name == "nesterov",
                   dampening=getattr(server, "dampening", 0.0))

    def __init__(self, lr: float, momentum: float, nesterov: bool = False,
                 dampening: float = 0.0):
        super().__init__()
        self.lr = _positive("lr", lr)
        self.momentum = _unit("momentum", momentum)
        self.dampening = _unit("dampening", dampening)
        self.nesterov = bool(nesterov)
        if self.nesterov:
            self.name = "nesterov"

    def _update(self, delta: torch.Tensor) -> torch.Tensor:
        m = self.state["m"]
        m.mul_(self.momentum).add_(delta, alpha=1.0 - self.dampening)
        if self.nesterov:
            return self.lr * (delta + self.momentum * m)
        return self.lr * m


class _Adaptive(ServerOptimizer):
    """Reddi et al. Alg. 2: m_t = beta1 * m_{t-1} + (1 - beta1) * delta_t;
    v_t from the subclass's `_second_moment`; x_{t+1} = x_t + lr * m_t / (sqrt(v_t) + tau).

    m_0 = 0 and v_0 = tau^2 (the paper asks v_{-1} >= tau^2; we take the bound itself). No bias
    correction, as in the paper."""

    buffers = ("m", "v")

    def __init__(self, lr: float, beta1: float, tau: float):
        super().__init__()
        self.lr = _positive("lr", lr)
        self.beta1 = _unit("beta1", beta1)
        self.tau = _positive("tau", tau)

    def _initial(self, key: str, delta: torch.Tensor) -> torch.Tensor:
        if key == "v":
            return torch.full_like(delta, self.tau * self.tau)
        return torch.zeros_like(delta)

    def _second_moment(self, v: torch.Tensor, sq: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _update(self, delta: torch.Tensor) -> torch.Tensor:
        m = self.beta1 * self.state["m"] + (1 - self.beta1) * delta
        v = self._second_moment(self.state["v"], delta * delta)
        self.state["m"], self.state["v"] = m, v
        return self.lr * m / (v.sqrt() + self.tau)


class _DecayingSecondMoment(_Adaptive):
    """Adam and Yogi: the adaptive family whose second moment also has a decay, beta2."""

    def __init__(self, lr: float, beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3):
        super().__init__(lr, beta1, tau)
        self.beta2 = _unit("beta2", beta2)

    @classmethod
    def from_config(cls, server, params=None) -> _DecayingSecondMoment:
        return cls(server.lr, beta1=server.beta1, beta2=server.beta2, tau=server.tau)


@register
class ServerAdam(_DecayingSecondMoment):
    """FedAdam: v_t = beta2 * v_{t-1} + (1 - beta2) * delta_t^2."""

    name = "adam"

    def _second_moment(self, v: torch.Tensor, sq: torch.Tensor) -> torch.Tensor:
        return self.beta2 * v + (1 - self.beta2) * sq


@register
class ServerYogi(_DecayingSecondMoment):
    """FedYogi: v_t = v_{t-1} - (1 - beta2) * delta_t^2 * sign(v_{t-1} - delta_t^2)."""

    name = "yogi"

    def _second_moment(self, v: torch.Tensor, sq: torch.Tensor) -> torch.Tensor:
        return v - (1 - self.beta2) * sq * torch.sign(v - sq)


@register
class ServerAdagrad(_Adaptive):
    """FedAdagrad: v_t = v_{t-1} + delta_t^2.

    beta1 defaults to 0 here (plain Adagrad: m_t = delta_t); Alg. 2 keeps the beta1 momentum
    for FedAdagrad too, and build_server_optimizer passes its beta1 (0.9 by default)."""

    name = "adagrad"

    def __init__(self, lr: float, beta1: float = 0.0, tau: float = 1e-3):
        super().__init__(lr, beta1, tau)

    @classmethod
    def from_config(cls, server, params=None) -> ServerAdagrad:
        return cls(server.lr, beta1=server.beta1, tau=server.tau)

    def _second_moment(self, v: torch.Tensor, sq: torch.Tensor) -> torch.Tensor:
        return v + sq


@register
class ServerNesterov(ServerMomentum):
    """Nesterov momentum: ServerMomentum with nesterov=True."""

    name = "nesterov"


def build_server_optimizer(name: str, lr: float, momentum: float = 0.9, beta1: float = 0.9,
                           beta2: float = 0.99, tau: float = 1e-3,
                           dampening: float = 0.0) -> ServerOptimizer:
    """The registered optimizer ``name`` from explicit hyper-parameters (as the ``server``
    section gives them); values it does not use are not checked."""
    from types import SimpleNamespace

    cls = lookup("server_opt", name, "algorithm.server_opt") if isinstance(name, str) else None
    if cls is None:
        raise key_error("algorithm.server_opt", "must be a registered name", name)
    _positive("lr", lr)
    return cls.from_config(SimpleNamespace(lr=lr, momentum=momentum, beta1=beta1, beta2=beta2,
                                           tau=tau, dampening=dampening))
