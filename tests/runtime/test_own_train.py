"""A client part's own ``train()`` (issue 40, deliverable 2): the worker seeds torch from the
client's round seed before calling it, and ``WorkerEnv.batches`` / ``WorkerEnv.local_sgd``
give it fedray's batch schedule and sequential kernel, so a hand-written loop is
deterministic at any worker count and the helper is the built-in training bit for bit."""

from __future__ import annotations

import pytest
import torch
from conftest import blobs, fixed_linear

import fedray
from fedray.algorithms.base import (
    ClientContext,
    ClientOptimizer,
    ClientWork,
    ClipNorm,
    LocalUpdate,
    Phase,
    WorkerEnv,
)

CLIENTS = blobs(12, seed=6)


def dropout_mlp():
    """A model_fn of a small MLP with dropout, always built with the same weights."""
    from torch import nn

    def build():
        return nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 3))

    torch.manual_seed(1)
    init = build().state_dict()

    def model_fn():  # a closure: shipped to the workers by value
        m = build()
        m.load_state_dict(init)
        return m

    return model_fn


def _sgd_loop(env: WorkerEnv, ctx: ClientContext, subsample: bool) -> LocalUpdate:
    """Plain minibatch SGD over ``env.batches(ctx)``, written by hand; ``subsample``: each
    step keeps a random half of its batch (torch.randperm from torch's global generator)."""
    model, lr = env.model, env.training.lr
    model.load_(env.global_weights)
    module = model.module
    module.train()
    x, y = ctx.x.to(env.device), ctx.y.to(env.device)
    loss_sum, seen = 0.0, 0
    batches = env.batches(ctx)
    for idx in batches:
        if subsample:
            idx = idx[torch.randperm(len(idx))[: max(1, len(idx) // 2)]]
        for p in model.param_list:
            p.grad = None
        loss = torch.nn.functional.cross_entropy(module(x[idx]), y[idx])
        loss.backward()
        with torch.no_grad():
            for p in model.param_list:
                p.add_(p.grad, alpha=-lr)
        loss_sum += float(loss.detach()) * len(idx)
        seen += len(idx)
    with torch.no_grad():
        delta = model.flat - env.global_weights
    return LocalUpdate(delta, len(y), loss_sum, seen, len(batches))


class OwnLoop(ClientWork):
    """Its own loop: fedray's batches, thinned by its own torch draws, through dropout."""

    name = "own_loop_test"

    def train(self, env: WorkerEnv, ctx: ClientContext) -> LocalUpdate:
        return _sgd_loop(env, ctx, subsample=True)


class OwnSGD(ClientWork):
    """Plain SGD by hand over env.batches: fedray's local SGD, if the batches are its."""

    name = "own_sgd_test"

    def train(self, env: WorkerEnv, ctx: ClientContext) -> LocalUpdate:
        return _sgd_loop(env, ctx, subsample=False)


class ViaHelper(ClientWork):
    name = "via_helper_test"

    def train(self, env: WorkerEnv, ctx: ClientContext) -> LocalUpdate:
        return env.local_sgd(ctx)


PHASE = Phase(trainable=("3.",), steps=4, lr=0.05, transform=ClipNorm(0.5),
              optimizer=ClientOptimizer("momentum", momentum=0.8))


class PhaseBuiltIn(ClientWork):
    name = "phase_builtin_test"

    def phases(self, env: WorkerEnv, ctx: ClientContext) -> list[Phase]:
        return [PHASE]


class PhaseViaHelper(ClientWork):
    name = "phase_helper_test"

    def train(self, env: WorkerEnv, ctx: ClientContext) -> LocalUpdate:
        return env.local_sgd(ctx, PHASE)


def _job(tmp_path, name: str, algorithm: dict, backend: str = "inline", workers: int = 2,
         rounds: int = 2) -> dict:
    return {"name": name, "seed": 8, "rounds": rounds, "algorithm": algorithm,
            "client": {"lr": 0.1, "batch_size": 4, "local_steps": 3},
            "sampling": {"clients_per_round": 6},
            "runtime": {"backend": backend, "num_workers": workers,
                        "worker": {"num_cpus": 0.5, "vectorize": "off"}},
            "output": {"dir": str(tmp_path / name), "tensorboard": False}}


def _run(tmp_path, name: str, part: str | None, model_fn, **kw) -> dict[str, torch.Tensor]:
    algorithm = {"name": "fedavg"} if part is None else {"name": "fedavg",
                                                         "client": f"{__file__}:{part}"}
    return fedray.run(_job(tmp_path, name, algorithm, **kw), model_fn=model_fn,
                      client_data=CLIENTS).weights


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_own_loop_is_the_same_on_one_and_three_ray_workers(ray_cluster, tmp_path):
    """Dropout masks and the loop's own randperm come from torch's global generator, which
    the worker seeds from the client's round seed before train(): one worker training all
    six clients of a round in a row, and three workers two each, draw the same."""
    model_fn = dropout_mlp()
    one = _run(tmp_path, "one", "OwnLoop", model_fn, backend="ray", workers=1)
    three = _run(tmp_path, "three", "OwnLoop", model_fn, backend="ray", workers=3)
    assert _equal(one, three)
    assert not _equal(one, model_fn().state_dict())  # it trained


@pytest.mark.parametrize("model", ["linear", "dropout"])
def test_helper_and_hand_loop_are_the_built_in_training(tmp_path, model):
    """env.local_sgd(ctx) is the runtime's own sequential training, and a plain SGD loop
    over env.batches(ctx) the same float operations on the same batches (and, with
    dropout, the same masks): all three runs end bit for bit equal."""
    model_fn = fixed_linear()[0] if model == "linear" else dropout_mlp()
    built_in = _run(tmp_path, "builtin", None, model_fn)
    assert _equal(_run(tmp_path, "helper", "ViaHelper", model_fn), built_in)
    assert _equal(_run(tmp_path, "hand", "OwnSGD", model_fn), built_in)
    assert not _equal(built_in, model_fn().state_dict())


def test_helper_runs_a_phase_as_the_runtime_does(tmp_path):
    """env.local_sgd(ctx, phase): a phase's trainable prefix, steps, lr, gradient transform
    and optimizer, as the runtime trains the same phase given by phases()."""
    model_fn = dropout_mlp()
    built_in = _run(tmp_path, "builtin", "PhaseBuiltIn", model_fn)
    assert _equal(_run(tmp_path, "helper", "PhaseViaHelper", model_fn), built_in)
    start = model_fn().state_dict()
    assert torch.equal(built_in["0.weight"], start["0.weight"])  # frozen: not trainable
    assert not torch.equal(built_in["3.weight"], start["3.weight"])


def test_batches_are_the_kernels_schedule():
    """env.batches: the kernel's batch_schedule for the client's size, batch size, steps and
    round seed, or for the steps or epochs asked."""
    from fedray.core.flat_model import FlatModel
    from fedray.kernels.sequential import batch_schedule
    from fedray.runtime.worker import LocalTraining

    training = LocalTraining(lr=0.1, batch_size=4, local_epochs=2, local_steps=None,
                             eval_batch_size=8)
    env = WorkerEnv(model=FlatModel(fixed_linear()[0]()), device=torch.device("cpu"),
                    lr=0.1, loss="cross_entropy", eval_batch_size=8,
                    batch_size_for=training.batch_size_for, training=training)
    x, y = (torch.as_tensor(a) for a in CLIENTS[3])
    ctx = ClientContext(3, 2, 1234, x, y, 4)

    def same(a, b):
        return len(a) == len(b) and all(torch.equal(i, j) for i, j in zip(a, b, strict=True))

    assert same(env.batches(ctx), batch_schedule(len(y), 4, 2, None, 1234))
    assert same(env.batches(ctx, steps=7), batch_schedule(len(y), 4, 1, 7, 1234))
    assert same(env.batches(ctx, epochs=3), batch_schedule(len(y), 4, 3, None, 1234))
    assert same(env.batches(ctx, seed=99), batch_schedule(len(y), 4, 2, None, 99))
    assert not same(env.batches(ctx), env.batches(ctx, seed=99))
