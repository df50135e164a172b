"""Client work: what one virtual client does with the global model in one round.

FedAvg's local update (McMahan et al., Alg. 1 ClientUpdate): starting from the global
weights x, run minibatch SGD on the client's data -- ``local_epochs`` passes, or exactly
``local_steps`` steps when set (cycling through reshuffled epochs) -- and report the model
delta y - x with the client's example count. FedSGD and FedProx are options of the same
loop (``full_batch``, ``prox_mu``), and so is SCAFFOLD's corrected step (``correction``).
The measurements other algorithms need around the local update -- SCAFFOLD option I's
full-data gradient, Elastic aggregation's parameter sensitivity -- are the functions below;
fedray/worker.py decides which of them a round's client runs. Batch order and dropout come
from the client's own seed, so the result is the same on any worker.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fedray.losses import loss_fn
from fedray.replica import FlatModel


@dataclass
class ClientResult:
    delta: torch.Tensor  # y - x, flat; a view of a buffer reused for the next client
    num_examples: int
    loss_sum: float  # sum over local steps of (mean batch loss * batch size)
    examples_seen: int
    steps: int


def client_batch_size(n: int, batch_size: int, steps_per_epoch: int | None) -> int:
    """The batch size a client trains with: ``batch_size``, or, with ``steps_per_epoch``
    set, ceil(n / steps_per_epoch) -- SCAFFOLD's "batch = 1/5 of the local data" setup, where
    every client takes the same number of steps per epoch whatever its size (a client with
    fewer examples than steps takes one step per example)."""
    if steps_per_epoch is None:
        return batch_size
    return max(1, math.ceil(n / steps_per_epoch))


def num_local_steps(n: int, batch_size: int, local_epochs: int, local_steps: int | None) -> int:
    if local_steps is not None:
        return local_steps
    return local_epochs * math.ceil(n / batch_size)


def batch_schedule(n: int, batch_size: int, local_epochs: int, local_steps: int | None,
                   seed: int, full_batch: bool = False,
                   device: torch.device | str = "cpu") -> list[torch.Tensor]:
    """The example indices of each local step, in order: minibatches of ``batch_size`` cut
    from a fresh permutation (drawn from ``seed``) each time the previous one is used up --
    ``local_epochs`` passes, or exactly ``local_steps`` steps. full_batch (FedSGD): one step
    on all ``n`` examples. Sequential and vectorized training both follow it, so a client's
    batches do not depend on how it is trained. Each permutation is moved to ``device`` once,
    and the steps' indices are views of it."""
    if full_batch:
        batch_size, local_steps = max(1, n), 1
    steps = num_local_steps(n, batch_size, local_epochs, local_steps) if n else 0
    order = torch.Generator().manual_seed(seed)
    out: list[torch.Tensor] = []
    perm = torch.empty(0, dtype=torch.long)
    pos = n
    for _ in range(steps):
        if pos >= n:
            perm = torch.randperm(n, generator=order).to(device, non_blocking=True)
            pos = 0
        out.append(perm[pos:pos + batch_size])
        pos += batch_size
    return out


def local_sgd(model: FlatModel, global_weights: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
              *, lr: float, batch_size: int, local_epochs: int, local_steps: int | None,
              seed: int, delta_out: torch.Tensor, prox_mu: float = 0.0,
              full_batch: bool = False, loss: str = "cross_entropy",
              correction: torch.Tensor | None = None) -> ClientResult:
    """Local SGD from ``global_weights``; the delta lands in ``delta_out``.

    prox_mu > 0 is FedProx: each step minimises f_k(y) + (mu/2)||y - x||^2, i.e. adds
    mu (y - x) to the gradient. full_batch is FedSGD: one step on all of the client's data.
    correction (SCAFFOLD, c - c_i over the parameters) is added to every step's gradient:
    y <- y - lr (g(y) - c_i + c).
    """
    criterion = loss_fn(loss)
    model.load_(global_weights)
    torch.manual_seed(seed)  # dropout masks
    n = len(y)
    device = model.device
    schedule = batch_schedule(n, batch_size, local_epochs, local_steps, seed, full_batch,
                              device)
    steps = len(schedule)
    x = x.to(device, non_blocking=True)
    y = y.to(device, non_blocking=True)
    module = model.module
    module.train()
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    seen = 0
    corrections = None if correction is None else model.split(correction)
    anchors = model.split(global_weights) if prox_mu else None
    with model.own_grads() as params:
        for idx in schedule:
            for p in params:
                p.grad = None
            batch_loss = criterion(module(x[idx]), y[idx])
            batch_loss.backward()
            with torch.no_grad():
                # a parameter the loss does not reach has no gradient: zero
                grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in params]
                if corrections is not None:
                    torch._foreach_add_(grads, corrections)
                if anchors is not None:
                    torch._foreach_add_(grads, torch._foreach_sub(params, anchors),
                                        alpha=prox_mu)
                torch._foreach_add_(params, grads, alpha=-lr)
                loss_sum += batch_loss.detach() * len(idx)
            seen += len(idx)
    torch.sub(model.flat, global_weights, out=delta_out)
    return ClientResult(delta_out, n, float(loss_sum), seen, steps)


def _batches(n: int, batch_size: int):
    for lo in range(0, n, batch_size):
        yield slice(lo, min(n, lo + batch_size))


def full_gradient(model: FlatModel, weights: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                  *, batch_size: int, seed: int, out: torch.Tensor,
                  loss: str = "cross_entropy") -> torch.Tensor:
    """The gradient of the client's mean training loss at ``weights`` over all its data
    (SCAFFOLD option I: c_i+ = g_i(x)), accumulated in batches so memory stays that of one
    batch. Train mode, as the local steps: dropout masks come from ``seed``."""
    criterion = loss_fn(loss)
    model.load_(weights)
    torch.manual_seed(seed)
    model.module.train()
    x = x.to(model.device, non_blocking=True)
    y = y.to(model.device, non_blocking=True)
    n = len(y)
    out.zero_()
    for sl in _batches(n, batch_size):
        model.grad.zero_()
        criterion(model.module(x[sl]), y[sl]).backward()
        out.add_(model.grad, alpha=(sl.stop - sl.start) / n)
    return out


def sensitivity(model: FlatModel, weights: torch.Tensor, x: torch.Tensor, *, batch_size: int,
                mu: float, out: torch.Tensor) -> torch.Tensor:
    """Elastic aggregation's parameter sensitivity (Chen et al., CVPR 2023, Alg. 1/2).

    Over the batches of the held-out examples ``x`` at the global model, per parameter:
    Omega <- mu Omega + (1 - mu) |d ||F(theta; x)||_2^2 / d theta|, Omega starting at zero,
    with F the model's output and the squared norm averaged over the batch's examples. Eval
    mode: the sensitivity is a property of the prediction function, not of dropout noise.
    """
    model.load_(weights)
    module = model.module
    module.eval()
    x = x.to(model.device, non_blocking=True)
    out.zero_()
    for sl in _batches(len(x), batch_size):
        model.grad.zero_()
        module(x[sl]).flatten(1).pow(2).sum(1).mean().backward()
        out.mul_(mu).add_(model.grad.abs(), alpha=1.0 - mu)
    module.train()
    return out
