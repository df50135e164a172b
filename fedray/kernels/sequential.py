"""The sequential kernel: one client's local training on the worker's model replica.

A client's local update (McMahan et al. 2017, Alg. 1 ClientUpdate): starting from the global
weights x, run minibatch SGD on the client's data -- ``local_epochs`` passes, or exactly
``local_steps`` steps when set (cycling through reshuffled epochs) -- and report the model
delta y - x with the client's example count. What an algorithm adds to the local objective
arrives as ``LocalTerms`` (fedray.algorithms.base: a proximal pull, a linear term), applied to
every step's gradient; one full-batch step is ``full_batch``. The
vectorized kernel (fedray/kernels/vectorized.py) consumes the same terms. Batch order and dropout
masks come from the client's own seed (masks from a generator of its own:
fedray/kernels/dropout.py, as the vectorized kernel draws them), so the result is the same
on any worker. Max-pooling layers search their windows in channels-last order on the CPU,
with torch's own values and gradients (fedray/kernels/pooling.py): its faster kernel.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import nullcontext

import numpy as np
import torch

from fedray.algorithms.local_terms import (
    NO_TERMS,
    ClientOptimizer,
    GradTransform,
    LocalTerms,
    LocalUpdate,
)
from fedray.core.flat_model import FlatModel
from fedray.core.losses import loss_fn
from fedray.kernels.dropout import ClientDropout, draw_masks
from fedray.kernels.pooling import ChannelsLastPooling
from fedray.kernels.precision import forward

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
    ``local_epochs`` passes, or exactly ``local_steps`` steps. full_batch: one step
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


def batch_rows(n: int, batch_size: int, local_epochs: int, local_steps: int | None, seed: int,
               full_batch: bool = False) -> np.ndarray:
    """``batch_schedule`` (not ``independent``) as one [steps, batch] array: row t the
    indices of step t, a short last batch of a pass padded with -1. The same permutations,
    drawn from the same generator in the same order, so the same batches.

    Why a second form: a vectorized group lays every client's batches out as rows of one
    plan (fedray/kernels/vectorized.py); cut from whole permutations here, a client's rows
    are one reshape instead of a tensor per step to gather back together."""
    if full_batch:
        batch_size, local_steps = max(1, n), 1
    steps = num_local_steps(n, batch_size, local_epochs, local_steps) if n else 0
    if not steps:
        return np.zeros((0, batch_size), dtype=np.int64)
    per = math.ceil(n / batch_size)  # the steps one permutation lasts
    perms = math.ceil(steps / per)
    order = torch.Generator().manual_seed(seed)
    rows = np.full((perms, per * batch_size), -1, dtype=np.int64)
    for e in range(perms):
        rows[e, :n] = torch.randperm(n, generator=order).numpy()
    return rows.reshape(perms * per, batch_size)[:steps]


def local_sgd(model: FlatModel, global_weights: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
              *, lr: float, batch_size: int, local_epochs: int, local_steps: int | None,
              seed: int, delta_out: torch.Tensor, terms: LocalTerms = NO_TERMS,
              full_batch: bool = False, loss: str = "cross_entropy",
              step_weights: Sequence[float] | None = None,
              gradient_sum: torch.Tensor | None = None,
              independent_batches: bool = False, start: torch.Tensor | None = None,
              trainable: Sequence[bool] | None = None,
              optimizer: ClientOptimizer | None = None,
              opt_state: dict[str, torch.Tensor] | None = None,
              transform: GradTransform | None = None,
              precision: str = "fp32") -> LocalUpdate:
    """Local SGD from ``global_weights``; the delta lands in ``delta_out``.

    ``terms``, the client part's extra local-objective terms (a proximal pull toward x, a
    linear term), are added to every step's gradient. full_batch: one step on all of the
    client's data. lr = 0 takes every step's gradient at the global model.

    ``gradient_sum`` (one value per parameter), with ``step_weights`` theta_1, theta_2, ...:
    receives sum_k theta_k g_k over the steps, g_k the k-th step's gradient, terms included
    -- the message of LOCALUPDATE (seed 002, Alg. 2), which the model delta cannot give
    when lr = 0 or the thetas are not all equal. independent_batches: see batch_schedule.

    A phase (fedray.algorithms.base.Phase) says more, and only then is the general step
    taken (without these, the plain SGD loop runs, float for float as before phases):
    ``start``, flat weights to train from (None: ``global_weights``); the delta stays
    trained - ``global_weights`` and the proximal anchor ``global_weights``, so a partial
    or personal start still reports what moved from the broadcast model. ``trainable``,
    per parameter (``param_list`` order): a frozen one takes no step, its gradient is left
    out of the transform (a clipping norm measures what trains) and its optimizer tensors
    stay as they came. ``transform`` (GradTransform) changes each step's gradient, terms
    included, before the optimizer; with ``per_example`` it is applied to every example's
    gradient (torch.func's ``vmap(grad)``, one example at a time through the model) and
    the results averaged over the batch, the terms added after. ``optimizer``
    (ClientOptimizer) momentum or adam, from ``opt_state`` ("m", "v": flat per parameter;
    "t": [1] step count; zeros when absent); the new tensors return in
    ``LocalUpdate.opt_state``.

    ``precision`` (``runtime.precision``, fedray.kernels.precision): ``bf16`` runs each
    step's forward pass under bfloat16 autocast; weights, gradients and loss stay float32.
    """
    criterion = loss_fn(loss)
    model.load_(global_weights if start is None else start)
    torch.manual_seed(seed)  # any randomness of the model's own (AlphaDropout, F.dropout)
    n = len(y)
    device = model.device
    # nn.Dropout(1d/2d/3d)'s masks, from a generator of the client's own: on the CPU the
    # masks torch.manual_seed(seed) gave, bit for bit; and the vectorized kernel's
    drop = ClientDropout(model.module)
    masks = torch.Generator(device=device).manual_seed(seed) if drop else None
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
    general = not (trainable is None and transform is None
                   and (optimizer is None or optimizer.kind == "sgd"))
    # max-pooling searched channels-last, torch's result (fedray/kernels/pooling.py); not
    # under a per-example transform's vmap
    pooling = (nullcontext() if transform is not None and transform.per_example else
               ChannelsLastPooling(module, device).active())
    if general:
        step = _PhaseStep(model, criterion, lr, terms, anchors, linears, trainable,
                          optimizer, opt_state, transform, drop, masks, precision)
        with model.own_grads(), pooling:
            for k, idx in enumerate(schedule):
                weight = step_weights[k] if sums is not None else 0.0
                loss_sum += step(x[idx], y[idx], sums, weight) * len(idx)
                seen += len(idx)
        torch.sub(model.flat, global_weights, out=delta_out)
        return LocalUpdate(delta_out, n, float(loss_sum), seen, steps,
                           opt_state=step.state())
    with model.own_grads() as params, pooling:
        for k, idx in enumerate(schedule):
            for p in params:
                p.grad = None
            with drop.drawing(masks):
                batch_loss = criterion(forward(precision, device, module, x[idx]),
                                       y[idx])
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


class _PhaseStep:
    """One local step of a phase that trains part of the model, transforms its gradient or
    keeps optimizer tensors (local_sgd's general path).

    Apart from the plain loop so that a client part without these hooks runs the exact
    float operations it always has (every preset's final weights are pinned)."""

    def __init__(self, model: FlatModel, criterion, lr: float, terms: LocalTerms,
                 anchors: list, linears: list, trainable: Sequence[bool] | None,
                 optimizer: ClientOptimizer | None,
                 opt_state: dict[str, torch.Tensor] | None,
                 transform: GradTransform | None, drop: ClientDropout | None = None,
                 masks: torch.Generator | None = None, precision: str = "fp32"):
        self.precision = precision
        self.model, self.criterion, self.lr, self.terms = model, criterion, lr, terms
        self.drop = ClientDropout(model.module) if drop is None else drop
        self.masks, self.calls = masks, None  # dropout's generator; its calls (per example)
        self.anchors, self.linears = anchors, linears
        params = model.param_list
        if trainable is None:
            trainable = [True] * len(params)
        if len(trainable) != len(params):
            raise ValueError(f"trainable: {len(trainable)} flags for a model of "
                             f"{len(params)} parameters")
        self.trainable = [bool(t) for t in trainable]
        self.live = [i for i, t in enumerate(self.trainable) if t]
        # frozen parameters take no gradient in a step (__call__): backward() then skips
        # their weight gradients and, below the lowest trainable layer, the whole backward
        # pass (a head trained on a frozen body: FedRep); the trainable ones' are the same
        # floats. Those a user's model already froze stay as they are.
        self.frozen = [p for p, t in zip(params, self.trainable, strict=True)
                       if not t and p.requires_grad]
        self.transform = transform
        self.per_example = transform is not None and transform.per_example
        if self.per_example and model.size != model.num_params:
            raise ValueError("a per-example gradient transform needs a model without "
                             "buffers (batch-norm statistics are not per example)")
        self.kind = "sgd" if optimizer is None else optimizer.kind
        self.optimizer = optimizer
        own = {"sgd": (), "momentum": ("m",), "adam": ("m", "v")}[self.kind]
        self.moments: dict[str, torch.Tensor] = {}
        p, dev = model.num_params, model.device
        for key in own:
            given = None if opt_state is None else opt_state.get(key)
            if given is not None and given.numel() != p:
                raise ValueError(f"opt_state[{key!r}]: {given.numel()} values for a model "
                                 f"of {p} parameters")
            self.moments[key] = (torch.zeros(p, dtype=torch.float32, device=dev)
                                 if given is None else
                                 given.detach().reshape(-1).to(dev, torch.float32).clone())
        given_t = None if opt_state is None else opt_state.get("t")
        self.t = 0.0 if given_t is None else float(given_t.reshape(-1)[0])
        self.views = {}
        for key, flat in self.moments.items():
            split = model.split(flat)
            self.views[key] = [split[i] for i in self.live]
        if self.per_example:
            from torch.func import functional_call, grad, vmap

            module = model.module
            names = [name for name, _ in module.named_parameters()]
            flags = self.trainable
            transform_ = transform

            drop = self.drop

            def example_loss(ws, xi, yi, mi):
                # each example's dropout masks are its rows of the batch's (drawn as a
                # step without the transform draws them), given to vmap
                with drop.feeding([m.unsqueeze(0) for m in mi]):
                    out = forward(precision, model.device, functional_call, module,
                                  dict(zip(names, ws, strict=True)), (xi.unsqueeze(0),))
                value = criterion(out, yi.unsqueeze(0))
                return value, value.detach()

            def one(ws, xi, yi, mi):
                g, value = grad(example_loss, has_aux=True)(ws, xi, yi, mi)
                g = tuple(gi if f else torch.zeros_like(gi)
                          for gi, f in zip(g, flags, strict=True))
                return transform_(g), value

            self.examples = vmap(one, in_dims=(None, 0, 0, 0), randomness="different")

    def __call__(self, xb: torch.Tensor, yb: torch.Tensor, sums: list | None,
                 weight: float) -> torch.Tensor:
        """One step on the batch (xb, yb); its mean loss (a detached tensor)."""
        model, params = self.model, self.model.param_list
        if self.per_example:
            masks = ()
            if self.drop:
                if self.calls is None:
                    self.calls = self.drop.calls(xb[0])
                masks = draw_masks(self.calls, [self.masks], [len(xb)], len(xb), xb.device)
                masks = tuple(m[0] for m in masks)
            with torch.no_grad():
                per, losses = self.examples(tuple(p.detach() for p in params), xb, yb, masks)
                grads = [g.mean(0) for g in per]
                batch_loss = losses.mean()
        else:  # within model.own_grads (local_sgd)
            for p in params:
                p.grad = None
            for p in self.frozen:
                p.requires_grad_(False)
            try:
                with self.drop.drawing(self.masks):
                    value = self.criterion(forward(self.precision, model.device,
                                                   model.module, xb), yb)
                if self.live:
                    value.backward()
            finally:
                for p in self.frozen:
                    p.requires_grad_(True)
            grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in params]
            batch_loss = value.detach()
        with torch.no_grad():
            grads = [g if f else torch.zeros_like(g)
                     for g, f in zip(grads, self.trainable, strict=True)]
            if not self.terms.empty:
                for i in self.live:
                    self.terms.add_to_(grads[i], params[i], self.anchors[i], self.linears[i])
            if self.transform is not None and not self.per_example:
                grads = list(self.transform(tuple(grads)))
            if sums is not None and weight:
                torch._foreach_add_(sums, grads, alpha=weight)
            self._step([params[i] for i in self.live], [grads[i] for i in self.live])
        return batch_loss

    def _step(self, ps: list[torch.Tensor], gs: list[torch.Tensor]) -> None:
        """The optimizer's step on the trainable parameters (their moments alike)."""
        lr, opt = self.lr, self.optimizer
        if self.kind == "sgd":
            if lr and ps:
                torch._foreach_add_(ps, gs, alpha=-lr)
            return
        m = self.views["m"]
        if self.kind == "momentum":
            if ps:
                torch._foreach_mul_(m, opt.momentum)
                torch._foreach_add_(m, gs)
                if lr:
                    torch._foreach_add_(ps, m, alpha=-lr)
            return
        b1, b2 = opt.betas
        self.t += 1.0
        if not ps:
            return
        v = self.views["v"]
        torch._foreach_mul_(m, b1)
        torch._foreach_add_(m, gs, alpha=1.0 - b1)
        torch._foreach_mul_(v, b2)
        torch._foreach_addcmul_(v, gs, gs, value=1.0 - b2)
        if lr:
            # w -= lr * m_hat / (sqrt(v_hat) + eps), m_hat = m / (1 - b1^t), v_hat alike
            denom = torch._foreach_div(v, 1.0 - b2 ** self.t)
            torch._foreach_sqrt_(denom)
            torch._foreach_add_(denom, opt.eps)
            torch._foreach_addcdiv_(ps, m, denom, value=-lr / (1.0 - b1 ** self.t))

    def state(self) -> dict[str, torch.Tensor] | None:
        """The optimizer's tensors after the steps (None for plain SGD)."""
        if self.kind == "sgd":
            return None
        out = dict(self.moments)
        if self.kind == "adam":
            out["t"] = torch.tensor([self.t], dtype=torch.float32, device=self.model.device)
        return out


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
