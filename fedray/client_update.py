"""Client work: what one virtual client does with the global model in one round.

FedAvg's local update (McMahan et al., Alg. 1 ClientUpdate): starting from the global
weights x, run minibatch SGD on the client's data -- ``local_epochs`` passes, or exactly
``local_steps`` steps when set (cycling through reshuffled epochs) -- and report the model
delta y - x with the client's example count. FedSGD and FedProx are options of the same
loop (``full_batch``, ``prox_mu``). Batch order and dropout come from the client's own
seed, so the result is the same on any worker.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fedray.replica import FlatModel


@dataclass
class ClientResult:
    delta: torch.Tensor  # y - x, flat; a view of a buffer reused for the next client
    num_examples: int
    loss_sum: float  # sum over local steps of (mean batch loss * batch size)
    examples_seen: int
    steps: int


def num_local_steps(n: int, batch_size: int, local_epochs: int, local_steps: int | None) -> int:
    if local_steps is not None:
        return local_steps
    return local_epochs * math.ceil(n / batch_size)


def local_sgd(model: FlatModel, global_weights: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
              *, lr: float, batch_size: int, local_epochs: int, local_steps: int | None,
              seed: int, delta_out: torch.Tensor, prox_mu: float = 0.0,
              full_batch: bool = False) -> ClientResult:
    """Local SGD from ``global_weights``; the delta lands in ``delta_out``.

    prox_mu > 0 is FedProx: each step minimises f_k(y) + (mu/2)||y - x||^2, i.e. adds
    mu (y - x) to the gradient. full_batch is FedSGD: one step on all of the client's data.
    """
    model.load_(global_weights)
    torch.manual_seed(seed)  # dropout masks
    order = torch.Generator().manual_seed(seed)  # batch order
    n = len(y)
    if full_batch:
        batch_size, local_steps = max(1, n), 1
    steps = num_local_steps(n, batch_size, local_epochs, local_steps) if n else 0
    anchor = global_weights[: model.num_params]
    device = model.device
    x = x.to(device, non_blocking=True)
    y = y.to(device, non_blocking=True)
    module = model.module
    module.train()
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    seen = 0
    perm = torch.empty(0, dtype=torch.long)
    pos = n
    for _ in range(steps):
        if pos >= n:
            perm = torch.randperm(n, generator=order).to(device, non_blocking=True)
            pos = 0
        idx = perm[pos:pos + batch_size]
        pos += batch_size
        model.grad.zero_()
        loss = F.cross_entropy(module(x[idx]), y[idx])
        loss.backward()
        with torch.no_grad():
            if prox_mu:
                model.grad.add_(model.params - anchor, alpha=prox_mu)
            model.params.add_(model.grad, alpha=-lr)
            loss_sum += loss.detach() * len(idx)
        seen += len(idx)
    torch.sub(model.flat, global_weights, out=delta_out)
    return ClientResult(delta_out, n, float(loss_sum), seen, steps)
