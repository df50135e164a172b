"""The sequential kernel: one client's local training on the worker's model replica.

FedAvg's local update (McMahan et al., Alg. 1 ClientUpdate): starting from the global
weights x, run minibatch SGD on the client's data -- ``local_epochs`` passes, or exactly
``local_steps`` steps when set (cycling through reshuffled epochs) -- and report the model
delta y - x with the client's example count. What an algorithm adds to the local objective
arrives as ``LocalTerms`` (fedray.algorithms.base: a proximal pull, a linear term), applied to
every step's gradient; one full-batch step (FedSGD) is ``full_batch``. The
vectorized kernel (fedray/kernels/vectorized.py) consumes the same terms. Batch order and dropout
come from the client's own seed, so the result is the same on any worker.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from fedray.algorithms.base import NO_TERMS, LocalTerms, LocalUpdate
from fedray.core.flat_model import FlatModel
from fedray.core.losses import loss_fn

ClientResult = LocalUpdate  # the name before fedray.algorithms.base existed


def client_batch_size(n: int, batch_size: int, steps_per_epoch: int | None) -> int:
    """The batch size a client trains with: ``batch_size``, or, with ``steps_per_epoch``
    set, ceil(n / steps_per_epoch) -- seed 004's "batch = 1/5 of the local data" setup, where
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
                   device: torch.device | str = "cpu",
                   independent: bool = False) -> list[torch.Tensor]:
    """The example indices of each local step, in order: minibatches of ``batch_size`` cut
    from a fresh permutation (drawn from ``seed``) each time the previous one is used up --
    ``local_epochs`` passes, or exactly ``local_steps`` steps. full_batch (FedSGD): one step
    on all ``n`` examples. Sequential and vectorized training both follow it, so a client's
    batches do not depend on how it is trained. Each permutation is moved to ``device`` once,
    and the steps' indices are views of it.

    independent: every step draws its own batch (a fresh permutation's first ``batch_size``
    examples), so the steps' batches are independent draws, as LOCALUPDATE's Alg. 2 samples
    S_k (seed 002, fedray.algorithms.local_update); epochs of disjoint batches are not."""
    if full_batch:
        batch_size, local_steps = max(1, n), 1
    steps = num_local_steps(n, batch_size, local_epochs, local_steps) if n else 0
    order = torch.Generator().manual_seed(seed)
    out: list[torch.Tensor] = []
    perm = torch.empty(0, dtype=torch.long)
    pos = n
    for _ in range(steps):
        if pos >= n or independent:
            perm = torch.randperm(n, generator=order).to(device, non_blocking=True)
            pos = 0
        out.append(perm[pos:pos + batch_size])
        pos += batch_size
    return out


def local_sgd(model: FlatModel, global_weights: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
              *, lr: float, batch_size: int, local_epochs: int, local_steps: int | None,
              seed: int, delta_out: torch.Tensor, terms: LocalTerms = NO_TERMS,
              full_batch: bool = False, loss: str = "cross_entropy",
              step_weights: Sequence[float] | None = None,
              gradient_sum: torch.Tensor | None = None,
              independent_batches: bool = False) -> LocalUpdate:
    """Local SGD from ``global_weights``; the delta lands in ``delta_out``.

    ``terms``, the client part's extra local-objective terms (a proximal pull toward x, a
    linear term), are added to every step's gradient. full_batch: one step on all of the
    client's data (FedSGD). lr = 0 takes every step's gradient at the global model.

    ``gradient_sum`` (one value per parameter), with ``step_weights`` theta_1, theta_2, ...:
    receives sum_k theta_k g_k over the steps, g_k the k-th step's gradient, terms included
    -- the message of LOCALUPDATE (seed 002, Alg. 2), which the model delta cannot give
    when lr = 0 or the thetas are not all equal. independent_batches: see batch_schedule.
    """
    criterion = loss_fn(loss)
    model.load_(global_weights)
    torch.manual_seed(seed)  # dropout masks
    n = len(y)
    device = model.device
    schedule = batch_schedule(n, batch_size, local_epochs, local_steps, seed, full_batch,
                              device, independent_batches)
    steps = len(schedule)
    x = x.to(device, non_blocking=True)
    y = y.to(device, non_blocking=True)
    module = model.module
    module.train()
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    seen = 0
    linears = [None] * len(model.param_list) if terms.linear is None else model.split(
        terms.linear)
    anchors = model.split(global_weights) if terms.proximal else linears
    sums = None
    if gradient_sum is not None:
        gradient_sum.zero_()
        sums = model.split(gradient_sum)
    with model.own_grads() as params:
        for k, idx in enumerate(schedule):
            for p in params:
                p.grad = None
            batch_loss = criterion(module(x[idx]), y[idx])
            batch_loss.backward()
            with torch.no_grad():
                # a parameter the loss does not reach has no gradient: zero
                grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in params]
                if not terms.empty:
                    for g, p, a, c in zip(grads, params, anchors, linears, strict=True):
                        terms.add_to_(g, p, a, c)
                if sums is not None and step_weights[k]:
                    torch._foreach_add_(sums, grads, alpha=step_weights[k])
                if lr:
                    torch._foreach_add_(params, grads, alpha=-lr)
                loss_sum += batch_loss.detach() * len(idx)
            seen += len(idx)
    torch.sub(model.flat, global_weights, out=delta_out)
    return LocalUpdate(delta_out, n, float(loss_sum), seen, steps)


def batch_slices(n: int, batch_size: int):
    """Consecutive slices of at most ``batch_size`` over n examples (measurement passes)."""
    for lo in range(0, n, batch_size):
        yield slice(lo, min(n, lo + batch_size))


def full_gradient(model: FlatModel, weights: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                  *, batch_size: int, seed: int, out: torch.Tensor,
                  loss: str = "cross_entropy") -> torch.Tensor:
    """The gradient of the client's mean training loss at ``weights`` over all its data
    (e.g. a control variate measured at the global model), accumulated in batches so memory
    stays that of one batch. Train mode, as the local steps: dropout masks come from ``seed``."""
    criterion = loss_fn(loss)
    model.load_(weights)
    torch.manual_seed(seed)
    model.module.train()
    x = x.to(model.device, non_blocking=True)
    y = y.to(model.device, non_blocking=True)
    n = len(y)
    out.zero_()
    for sl in batch_slices(n, batch_size):
        model.grad.zero_()
        criterion(model.module(x[sl]), y[sl]).backward()
        out.add_(model.grad, alpha=(sl.stop - sl.start) / n)
    return out
