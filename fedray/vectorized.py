"""Vectorized client work: one batched forward/backward trains a group of clients at once.

Cross-device clients are small, so training them one after another is bound by per-step
Python and kernel-launch overhead, not arithmetic. Here a group of G clients' weights is
stacked into one [G, P] tensor and every local step runs one ``vmap(grad(...))`` over the
group (torch.func), each client with its own data, batch order (``batch_schedule``, the same
one sequential training follows), learning rate and number of steps. A client's batch is
padded to the group's largest and its padding masked out of the mean loss; a client whose
steps are done is masked out of the update. The result is each client's local SGD, equal to
``client_update.local_sgd`` up to float rounding (the batched kernels sum in another
order), for FedAvg, FedProx (``prox_mu``), FedSGD (``full_batch``) and SCAFFOLD
(``corrections``).

Only models whose training step is a pure function of the weights and the batch qualify:
no dropout (its masks are drawn per call, not per client seed) and no buffers (batch-norm
statistics). ``unsupported_reason`` says why a model does not.

Status: equal to sequential training (tests/test_vectorized.py) but not yet wired into the
workers. On this project's 2-core CPU machine, with one thread, 100 clients of 30-90
FEMNIST-shaped examples (batch 20, one epoch) took 0.13 s sequentially and 0.24 s
vectorized for logistic regression (groups of 32), and 0.24 s against 0.59 s for the MLP
(groups of 8); 20 LEAF-CNN clients took 3.0 s against 26 s (vmap turns the convolutions
into grouped ones). Whether and where it pays off (GPU, larger groups) is measured before
it becomes a worker option.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from fedray.client_update import batch_schedule
from fedray.losses import loss_fn
from fedray.replica import FlatModel

_RANDOM = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
           nn.FeatureAlphaDropout)


def unsupported_reason(module: nn.Module) -> str | None:
    """Why ``module`` cannot be trained vectorized, or None when it can."""
    for name, m in module.named_modules():
        if isinstance(m, _RANDOM):
            return f"it has dropout ({name or 'the model'}: {type(m).__name__})"
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            return f"it has batch-norm statistics ({name}: {type(m).__name__})"
    buffers = [n for n, _ in module.named_buffers()]
    if buffers:
        return f"it has buffers ({', '.join(buffers[:3])})"
    return None


@dataclass
class GroupResult:
    deltas: torch.Tensor  # [G, P]: each client's y - x
    num_examples: list[int]
    loss_sums: list[float]  # per client: sum over steps of (mean batch loss * batch size)
    examples_seen: list[int]
    steps: list[int]


def vmap_local_sgd(model: FlatModel, global_weights: torch.Tensor,
                   data: list[tuple[torch.Tensor, torch.Tensor]], *, lrs: list[float],
                   batch_size: int | list[int], local_epochs: int, local_steps: int | None,
                   seeds: list[int], prox_mu: float = 0.0, full_batch: bool = False,
                   loss: str = "cross_entropy",
                   corrections: torch.Tensor | None = None) -> GroupResult:
    """Local SGD of every client in ``data`` from ``global_weights``, batched.

    Per client i: its (x, y), lr ``lrs[i]``, batch size (one for all, or one each), batch
    order from ``seeds[i]``; ``corrections[i]`` (SCAFFOLD's c - c_i) is added to every step's
    gradient, ``prox_mu`` (FedProx) adds mu (y - x). ``model`` supplies the architecture (its
    module is called functionally; its weights are not touched)."""
    reason = unsupported_reason(model.module)
    if reason is not None:
        raise ValueError(f"cannot train this model vectorized: {reason}")
    device = model.device
    criterion = loss_fn(loss)
    module = model.module
    module.train()
    g = len(data)
    sizes = [len(y) for _, y in data]
    batches = batch_size if isinstance(batch_size, list) else [batch_size] * g
    schedules = [batch_schedule(n, b, local_epochs, local_steps, s, full_batch)
                 for n, b, s in zip(sizes, batches, seeds, strict=True)]
    steps = [len(s) for s in schedules]
    widest = max((len(idx) for s in schedules for idx in s), default=1)
    longest = max(sizes, default=0)

    # every client's data padded to the longest, so a step's batches are one gather
    x0 = data[0][0]
    xs = torch.zeros((g, max(1, longest), *x0.shape[1:]), dtype=x0.dtype, device=device)
    ys = torch.zeros((g, max(1, longest), *data[0][1].shape[1:]), dtype=data[0][1].dtype,
                     device=device)
    for i, (x, y) in enumerate(data):
        xs[i, :len(y)] = x.to(device, non_blocking=True)
        ys[i, :len(y)] = y.to(device, non_blocking=True)

    names, shapes, offsets = [], [], []
    offset = 0
    for name, p in module.named_parameters():
        names.append(name)
        shapes.append(p.shape)
        offsets.append(offset)
        offset += p.numel()

    def client_loss(w: torch.Tensor, xb: torch.Tensor, yb: torch.Tensor, mask: torch.Tensor):
        params = {n: w[o:o + s.numel()].view(s) for n, s, o in zip(names, shapes, offsets,
                                                                   strict=True)}
        per_example = criterion(functional_call(module, params, (xb,)), yb, reduction="none")
        mean = (per_example * mask).sum() / mask.sum().clamp(min=1.0)
        return mean, mean.detach()

    step_fn = vmap(grad(client_loss, has_aux=True))
    anchor = global_weights[: model.num_params].to(device)
    w = anchor.unsqueeze(0).repeat(g, 1)
    lr = torch.tensor(lrs, dtype=torch.float32, device=device)
    rows = torch.arange(g, device=device).unsqueeze(1)
    loss_sums = torch.zeros(g, dtype=torch.float64, device=device)
    seen = [0] * g
    for t in range(max(steps, default=0)):
        index = torch.zeros((g, widest), dtype=torch.long)
        mask = torch.zeros((g, widest), dtype=torch.float32)
        active = torch.zeros(g, dtype=torch.float32)
        for i, schedule in enumerate(schedules):
            if t < len(schedule):
                idx = schedule[t]
                index[i, :len(idx)] = idx
                mask[i, :len(idx)] = 1.0
                active[i] = 1.0
                seen[i] += len(idx)
        index, mask, active = (a.to(device, non_blocking=True) for a in (index, mask, active))
        grads, losses = step_fn(w, xs[rows, index], ys[rows, index], mask)
        with torch.no_grad():
            if corrections is not None:
                grads += corrections
            if prox_mu:
                grads += prox_mu * (w - anchor)
            w -= (lr * active).unsqueeze(1) * grads
            loss_sums += losses.double() * mask.sum(1).double()
    deltas = w - anchor
    return GroupResult(deltas=deltas, num_examples=sizes, loss_sums=loss_sums.tolist(),
                       examples_seen=seen, steps=steps)
