"""Parts that misbehave, each one way, for tests/runtime/test_part_errors.py: a job names
them by this file's path (``.../bad_parts.py:ShortFinish``), as a user's job names theirs."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fedray.algorithms.base import Aggregator, ClientWork, LocalUpdate, UpdateStage
from fedray.algorithms.server_opt import ServerSGD
from fedray.kernels.sequential import local_sgd


class ShortFinish(Aggregator):
    """finish() drops the last value of the round's update."""

    def finish(self, acc):
        return acc.mean()[:-1]


class ListFinish(Aggregator):
    """finish() returns a list, not a tensor."""

    def finish(self, acc):
        return acc.mean().tolist()


class NaNFinish(Aggregator):
    """finish() turns a finite sum into NaN."""

    def finish(self, acc):
        out = acc.mean()
        out[0] = float("nan")
        return out


class NaNAccumulate(Aggregator):
    """accumulate() adds a NaN to the sum (every client's update it sees is finite)."""

    def accumulate(self, env, ctx, update, acc):
        acc.add(torch.full_like(update.delta, float("nan")), 1.0)


class RaisingFinish(Aggregator):
    """finish() raises (on the driver)."""

    def finish(self, acc):
        raise ValueError("no median of an empty set")


class RaisingAccumulate(Aggregator):
    """accumulate() raises (on a worker), through a helper of its own."""

    def accumulate(self, env, ctx, update, acc):
        self._fold(update)

    def _fold(self, update):
        raise KeyError(f"bucket {update.num_examples}\nsecond line")


def _sgd(env, ctx) -> LocalUpdate:
    t = env.training
    return local_sgd(env.model, env.global_weights, ctx.x, ctx.y, lr=t.lr,
                     batch_size=ctx.batch_size, local_epochs=t.local_epochs,
                     local_steps=t.local_steps, seed=ctx.seed,
                     delta_out=torch.empty_like(env.model.flat), loss=t.loss)


class ShortTrain(ClientWork):
    """train() returns a delta one value short."""

    def train(self, env, ctx):
        update = _sgd(env, ctx)
        update.delta = update.delta[:-1].clone()
        return update


class DoubleTrain(ClientWork):
    """train() returns a float64 delta (the model's are float32)."""

    def train(self, env, ctx):
        update = _sgd(env, ctx)
        update.delta = update.delta.double()
        return update


class TupleTrain(ClientWork):
    """train() returns (delta, examples) instead of a LocalUpdate."""

    def train(self, env, ctx):
        update = _sgd(env, ctx)
        return update.delta, update.num_examples


class Truncate(UpdateStage):
    """client_update() replaces the client's update with a shorter one."""

    def client_update(self, env, ctx, update, acc):
        update.delta = update.delta[:3].clone()


class HalfSum(UpdateStage):
    """finish_sum() replaces the round's float64 sum by a float32 one."""

    def finish_sum(self, acc, round_idx):
        acc.total = acc.total.float()


class NaNWeight(UpdateStage):
    """finish_sum() leaves the round's sum with a NaN weight."""

    def finish_sum(self, acc, round_idx):
        acc.weight = float("nan")


@dataclass
class ShortStepParams:
    drop: int = 1


class ShortStep(ServerSGD):
    """step() returns weights ``drop`` values short."""

    section = "short_step"
    Params = ShortStepParams

    @classmethod
    def from_config(cls, server, params=None):
        out = cls(server.lr)
        out.drop = params.drop
        return out

    def step(self, weights, mean_delta):
        return super().step(weights, mean_delta)[: -self.drop]


@dataclass
class Inner:
    depth: int = 2


@dataclass
class SectionParams:
    mode: str = "a"
    ids: list = field(default_factory=list)
    inner: Inner = field(default_factory=Inner)
    tag: str | None = None


class SectionAgg(Aggregator):
    """Hyper-parameters of every kind a job can get wrong, in ``algorithm.sec``."""

    section = "sec"
    Params = SectionParams


class NotADataclass(Aggregator):
    section = "sec"

    class Params:
        k: int = 1


class WrongWidth(torch.nn.Module):
    """A model with 2 outputs, named by model.name, for data of 3 classes."""

    def __init__(self, input_shape=(5,), num_classes=3):
        super().__init__()
        self.fc = torch.nn.Linear(input_shape[0], 2)

    def forward(self, x):
        return self.fc(x)


@dataclass
class LimitParams:
    limit: int = 1


class BadCheck(Aggregator):
    """check() compares its value with a string: a TypeError, not a ParamError."""

    section = "limit"
    Params = LimitParams

    def check(self, params):
        if params.limit > "3":
            raise ValueError("unreachable")


class NaNTrain(ClientWork):
    """train() returns a NaN delta for every client."""

    def train(self, env, ctx):
        update = _sgd(env, ctx)
        update.delta.fill_(float("nan"))
        return update
