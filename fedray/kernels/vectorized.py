"""Vectorized client work: one batched forward/backward trains a group of clients at once.

Cross-device clients are small, so training them one after another is bound by per-step
Python and kernel-launch overhead, not arithmetic. Here a group of G clients' weights is
stacked, one [G, *shape] tensor per parameter, and every local step runs one
``vmap(grad(...))`` over the group (torch.func), each client with its own data, batch order
(``batch_schedule``, the same one sequential training follows), learning rate and number
of steps. Chains of Linear and ReLU layers (logistic regression, the MLPs;
``linear_chain``) take the same step written out as batched matrix products
(``chain_sgd_step``), which is faster per group (docs/performance.md). A client's batch is
padded to the group's batch size and its padding masked out of the mean loss; clients train
longest-first, so a step computes only the ones that still have steps to take. The result
is each client's local SGD, equal to ``sequential.local_sgd`` up to float rounding (the
batched kernels sum in another order), with the algorithm's ``LocalTerms`` (a proximal pull,
a per-client linear term) and ``full_batch`` as the sequential kernel takes them, and a
phase's hooks (fedray.algorithms.base.Phase: per-client starting weights, frozen
parameters, a client optimizer with its state, a gradient transform per batch or per
example) as ``sequential.local_sgd`` takes them. What an
aggregator measures around the local update (sensitivity, risks) the worker measures per
client.

Only models whose training step is a pure function of the weights, the batch and the
client's seed qualify: dropout only as nn.Dropout, Dropout1d, Dropout2d or Dropout3d, whose
masks each client draws from a generator of its own, outside ``vmap``, exactly as the
sequential kernel draws them (fedray/kernels/dropout.py: the same masks bit for bit, in any
group); no other randomness (AlphaDropout, ``F.dropout`` in a forward: drawn per call from
the global generator); no buffers (batch-norm statistics) and no hooks (a
gradient-clipping ``register_hook``, a forward hook: the batched step would silently skip
them). ``unsupported_reason`` says why a model does not, ``batch_failure`` finds the
randomness it cannot see.

Workers use it under ``runtime.worker.vectorize`` (``vectorize_plan``): the worker prepares
a group of clients, trains them here, then folds each into its partial sum as the sequential
path does (fedray/runtime/worker.py). Groups are cut in the worker's client order. A client's update
is the same computation in any group, but not the same floating-point operations: batched
kernels of other shapes (another group size, so another worker count) may sum in another
order, which moves its update by a few float32 ulps (tests/kernels/test_vectorized.py measures it).
Trained one client after another (``vectorize: off``), a client's arithmetic is identical in
any worker, and only the float64 merge of the workers' partial sums changes with their
number.
Measured speed-ups, and where it does not pay, are in docs/performance.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from fedray.algorithms.local_terms import NO_TERMS, ClientOptimizer, GradTransform, LocalTerms
from fedray.core.flat_model import FlatModel
from fedray.core.losses import PER_POSITION, SEQUENCE_PAD, float_targets, loss_fn
from fedray.errors import key_error
from fedray.kernels.dropout import ClientDropout, draw_masks, foreign_dropout
from fedray.kernels.precision import forward
from fedray.kernels.recurrent import lstm_refusal, unrolled
from fedray.kernels.sequential import batch_rows

_MODULE_HOOKS = {"_forward_pre_hooks": "forward pre-hook", "_forward_hooks": "forward hook",
                 "_backward_pre_hooks": "backward pre-hook", "_backward_hooks": "backward hook"}


def _hook(module: nn.Module) -> str | None:
    """The first hook that batched training would not run: the torch.func step trains
    functional copies of the parameters (hooks registered on the originals, e.g. gradient
    clipping through ``p.register_hook``, never fire) and the closed-form chain step never
    calls the modules at all, so no forward or backward hook of any kind would run."""
    from torch.nn.modules import module as nn_module

    for attr, what in _MODULE_HOOKS.items():
        if getattr(nn_module, f"_global{attr}", None):
            return f"a global module {what} is registered"
    for name, m in module.named_modules():
        for attr, what in _MODULE_HOOKS.items():
            if getattr(m, attr, None):
                return f"{f'module {name}' if name else 'the model'} has a {what}"
    for name, p in module.named_parameters():
        if p._backward_hooks or getattr(p, "_post_accumulate_grad_hooks", None):
            return f"parameter {name} has a gradient hook"
    return None


def unsupported_reason(module: nn.Module) -> str | None:
    """Why ``module`` cannot be trained vectorized, or None when it can: randomness drawn
    per call, buffers, or hooks (``_hook``) would make the batched step compute something
    other than what the module computes when trained one client after another. A recurrent
    layer qualifies only as an nn.LSTM that ``fedray.kernels.recurrent`` can unroll (vmap
    has no batching rule for the fused RNN kernels; ``lstm_refusal`` says why others
    cannot), and the batched step then computes it unrolled; whether that pays is
    ``vectorize_plan``'s question."""
    hook = _hook(module)
    if hook is not None:
        return hook
    foreign = foreign_dropout(module)
    if foreign is not None:  # nn.Dropout(1d/2d/3d) draw per client (fedray.kernels.dropout)
        return f"it has dropout whose masks are not drawn per client ({foreign})"
    for name, m in module.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            return f"it has batch-norm statistics ({name}: {type(m).__name__})"
        if isinstance(m, nn.RNNBase):  # vmap cannot batch the fused RNN kernels: the
            # batched step computes an nn.LSTM unrolled (fedray.kernels.recurrent), others not
            reason = lstm_refusal(name, m)
            if reason is not None:
                return reason
    buffers = [n for n, _ in module.named_buffers()]
    if buffers:
        return f"it has buffers ({', '.join(buffers[:3])})"
    return None


_CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d,
         nn.ConvTranspose3d)
# A group's stacked weights stay within this many bytes. On the CPU larger groups are bound
# by memory bandwidth (each step streams every client's weights several times): groups of a
# few MB of stacked weights trained fastest (docs/performance.md, "Group size"). A GPU wants
# large batched kernels, and has the memory: 512 MiB is 20 LEAF CNNs (26 MB each) with their
# gradients and activations in about 2 GiB, so 8 workers still share a GPU comfortably.
GROUP_BYTES = {"cpu": 6 * 2**20, "gpu": 512 * 2**20}
MAX_GROUP = 128


def vectorize_plan(module: nn.Module, mode: str, gpu: bool,
                   loss: str = "cross_entropy",
                   probe: Callable[[], str | None] | None = None) -> tuple[bool, str | None]:
    """Whether workers train this model vectorized under ``runtime.worker.vectorize`` =
    ``mode``, and, when auto decides against it, the one line that says why. ``on`` for a
    model that cannot be vectorized is an error. On the CPU, auto keeps convolutional models
    sequential: vmap turns their convolutions into grouped ones, which measured slower than
    one client after another, while logistic regression and the MLP measured faster than
    sequential training (docs/performance.md, "Vectorized clients"; measured again for the
    LEAF and the TFF EMNIST CNN once dropout trained vectorized, in groups of 1 to 5: 0.5-0.8x
    sequential training, "Dropout drawn per client"). Auto keeps models with
    an nn.LSTM sequential on the CPU and the GPU: the batched step computes the LSTM
    unrolled (fedray.kernels.recurrent), time step by time step against every client's own
    recurrent weights, and on this project's 2-core CPU groups of seed 002's character LSTM
    trained slower per client than the fused nn.LSTM one client after another, the slower
    the larger the group (each time step streams every client's recurrent matrices through
    the cache, where one client's stay there; docs/performance.md, "Recurrent models,
    vectorized (issue 47)"). A GPU, where one batched kernel replaces G small launches,
    would favour batching more, but it was not measured; ``on`` trains them batched
    anywhere. Losses averaged over positions (``model.loss: sequence_cross_entropy``) are
    averaged per client over its batch's non-padding positions, as the sequential step's
    are (``_units``).

    ``probe`` (``batch_failure`` bound to the model and its inputs) is asked last, only where
    the model would be vectorized: a forward pass that branches on tensor values, calls
    ``.item()`` or asserts on a tensor passes every static check but fails inside ``vmap``,
    and it is cheaper to find that in one tiny step on the driver than in round 1 on every
    worker."""
    if mode == "off":
        return False, None
    reason = unsupported_reason(module)
    if reason is None:
        if mode == "auto" and not gpu and any(isinstance(m, _CONV) for m in module.modules()):
            return False, ("runtime.worker.vectorize=auto: clients train one after another: "
                           "on the CPU, batched training measured slower for models with "
                           "convolutions; set it to on to force it")
        if mode == "auto" and any(isinstance(m, nn.LSTM) for m in module.modules()):
            return False, ("runtime.worker.vectorize=auto: clients train one after another: "
                           "an LSTM, unrolled for batched training, measured slower than the "
                           "fused nn.LSTM one client after another (on the CPU; a GPU was not "
                           "measured); set it to on to force it")
        failure = probe() if probe is not None else None
        if failure is not None:
            reason = f"one batched step fails: {failure}"
    if reason is not None:
        if mode == "on":
            raise ValueError(str(key_error("runtime.worker.vectorize", "this model cannot be "
                                           f"trained vectorized: {reason}", "on")))
        return False, (f"runtime.worker.vectorize=auto: clients train one after another, "
                       f"as this model cannot be vectorized: {reason}")
    return True, None


def batch_failure(model: FlatModel, input_shape: tuple[int, ...], loss: str,
                  label_shape: tuple[int, ...] = ()) -> str | None:
    """Why one step of ``vmap_local_sgd`` fails for ``model``, or None when it runs: two
    clients of two zero examples each, learning rate 0, one step, through the same code the
    workers run (so the closed-form chain and the torch.func step are both covered).

    Any exception counts: vmap reports data-dependent control flow and ``.item()`` as a
    RuntimeError, but a model's own ``assert`` on a tensor, or its own checks, raise other
    types, and each of them means the model trains only one client after another. The
    model's weights are not changed (the kernel trains copies) and its train/eval mode is
    restored."""
    was_training = model.module.training
    x = torch.zeros((2, *input_shape), device=model.device)
    y = torch.zeros((2, *label_shape), device=model.device,
                    dtype=torch.float32 if float_targets(loss) else torch.long)
    try:
        vmap_local_sgd(model, model.flat, [(x, y), (x, y)], lrs=[0.0, 0.0], batch_size=2,
                       local_epochs=1, local_steps=1, seeds=[0, 1], loss=loss)
    except Exception as exc:  # noqa: BLE001 -- any failure means: do not batch this model
        text = str(exc).strip()
        first = text.splitlines()[0] if text else ""
        if len(first) > 160 and ". " in first:  # vmap's messages run to several sentences
            first = first[:first.index(". ") + 1]
        return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    finally:
        model.module.train(was_training)
    return None


def group_size(num_params: int, gpu: bool = False) -> int:
    """How many clients a worker trains in one group: as many as fit in GROUP_BYTES."""
    budget = GROUP_BYTES["gpu" if gpu else "cpu"]
    return max(1, min(MAX_GROUP, budget // (4 * max(1, num_params))))


def group_sizes(n: int, target: int) -> list[int]:
    """How a worker's ``n`` clients of a round split into groups of about ``target``:
    round(n / target) groups of equal size (give or take one). A group's step costs about
    the same however few clients remain in it, so 50 clients at a target of 24 train as
    25 + 25, not 24 + 24 + 2, whose third group would cost nearly as much as a full one."""
    if n <= 0:
        return []
    count = max(1, round(n / max(1, target)))
    base, extra = divmod(n, count)
    return [base + 1] * extra + [base] * (count - extra)


@dataclass
class GroupResult:
    deltas: torch.Tensor  # [G, P]: the clients' y - x, in training order (see rows)
    rows: list[int]  # client i's delta is deltas[rows[i]]
    num_examples: list[int]
    loss_sums: list[float]  # per client: sum over steps of (mean batch loss * batch size)
    examples_seen: list[int]
    steps: list[int]
    path: str = "torch.func"  # the step taken: "torch.func"; chain_sgd_step with the first
    # layer's weights stacked ("stacks") or as FirstLayerSums ("sums")
    # the clients' optimizer state after training ("m": [G, P], adam's "v": [G, P] and
    # "t": [G, 1]), rows like ``deltas`` (client i's is row rows[i]); None for plain SGD
    opt_state: dict[str, torch.Tensor] | None = None

    def delta(self, i: int) -> torch.Tensor:
        """Client i's y - x (a view)."""
        return self.deltas[self.rows[i]]


def _batched_loss(name: str):
    """The per-example training loss, in a form whose vmap batching rule is fast: cross
    entropy as log_softmax + gather (F.cross_entropy's reduction="none" falls back to a slow
    path under vmap), the sequence cross-entropy so too, one sum over each sequence's
    non-padding positions (``_units`` counts them); the others as ``fedray.core.losses``
    defines them."""
    if name == "cross_entropy":
        def ce(out: torch.Tensor, y: torch.Tensor, reduction: str = "none") -> torch.Tensor:
            return -torch.log_softmax(out, -1).gather(-1, y.unsqueeze(-1)).squeeze(-1)
        return ce
    if name == "sequence_cross_entropy":
        def seq_ce(out: torch.Tensor, y: torch.Tensor, reduction: str = "none") -> torch.Tensor:
            per = -torch.log_softmax(out, -1).gather(-1, y.unsqueeze(-1)).squeeze(-1)
            return (per * (y != SEQUENCE_PAD)).reshape(len(y), -1).sum(1)
        return seq_ce
    return loss_fn(name)


def _units(loss: str, y: torch.Tensor) -> torch.Tensor | None:
    """What each example of the batch ``y`` weighs in its client's mean loss where that is
    not 1: for a loss in PER_POSITION, its non-padding positions (the sequential step's
    ``sequence_cross_entropy`` is the mean over the batch's non-padding positions, 0 when
    there are none, which the callers' ``clamp_min(1)`` keeps); None for the others."""
    if loss not in PER_POSITION:
        return None
    return (y != SEQUENCE_PAD).reshape(len(y), -1).sum(1).to(torch.float32)


def _sgd_(w: torch.Tensor, lr: torch.Tensor, g: torch.Tensor) -> None:
    """w -= lr * g in place, each client (row of w) with its own lr."""
    w.addcmul_(lr.view(len(w), *([1] * (w.dim() - 1))), g, value=-1.0)


@dataclass(frozen=True)
class LinearChain:
    """A model that is an nn.Sequential of [Flatten,] Linear, then (ReLU, Linear) any number
    of times: logistic regression and the MLPs. ``layers`` holds each Linear's (weight, bias)
    positions among the model's parameters (bias None when it has none)."""

    flatten: bool
    layers: tuple[tuple[int, int | None], ...]


_CLOSED_FORM_LOSSES = ("cross_entropy", "mse")


def linear_chain(module: nn.Module, loss: str) -> LinearChain | None:
    """The model's LinearChain when ``chain_sgd_step`` can train it (the layers above, no
    weights shared between them, trained with cross-entropy or mse); else None.

    Why a second way to the same step: for these models the gradients are a few batched
    matrix products per layer, and written out they skip torch.func's per-op wrapping and
    let each weight's gradient go straight into the weight. Groups of logistic regressions
    and MLPs trained faster this way than through ``vmap(grad(...))``, and the first step
    does not import torch._dynamo, which costs each worker process its start-up time
    (docs/performance.md)."""
    # exact types: a subclass may compute something else in its forward
    if loss not in _CLOSED_FORM_LOSSES or type(module) is not nn.Sequential:
        return None
    children = list(module)
    flatten = bool(children) and type(children[0]) is nn.Flatten
    if flatten and (children[0].start_dim, children[0].end_dim) != (1, -1):
        return None
    children = children[1:] if flatten else children
    if len(children) % 2 == 0:  # none, or not ending in a Linear
        return None
    for k, layer in enumerate(children):
        if type(layer) is not (nn.ReLU if k % 2 else nn.Linear):
            return None
    linears = children[::2]
    tensors = [p for lin in linears for p in (lin.weight, lin.bias) if p is not None]
    if len({id(p) for p in tensors}) != len(tensors):  # a layer used twice, or tied weights:
        return None  # their gradients would have to be summed before the update
    position = {id(p): k for k, p in enumerate(module.parameters())}
    layers = tuple((position[id(lin.weight)],
                    None if lin.bias is None else position[id(lin.bias)])
                   for lin in linears)
    return LinearChain(flatten=flatten, layers=layers)


class FirstLayerSums:
    """A group's first-layer weights W_i = W + D_i, with W the global weight, kept as sums
    over each client's examples instead of as a [G, out, in] stack.

    Why: a Linear layer's gradient is (output gradient)^T (input), and the first layer's
    inputs are the client's own examples. So after t steps D_i = E_i^T X_i - beta_i C_i,
    where X_i [n_i, in] are client i's examples, E_i [n_i, out] sums -lr times the output
    gradient each example received (times (1 - lr mu) per later step: a proximal term mu),
    and C_i is the client's linear term. The layer's outputs at step t are then x W^T (one
    product over every example of the group, against the one shared W) plus (x X_i^T) E_i, read from
    the Gram matrix X_i X_i^T, computed once; the delta is one product per client at the
    end. With a stack, every step's forward reads each client's weights and every step's
    update (a rank-batch product) reads and writes them, in small products; here the
    products are large, each example goes through W once, and each client's weights are
    written once.

    ``xs``: the group's examples, flattened, back to back in training order; ``plan``:
    [G, steps, width] indices into it; ``starts``/``sizes``: each client's span there (one
    per client, in training order); ``lr``: [G]; ``corr``: [G, out, in] or None."""

    def __init__(self, weight: torch.Tensor, xs: torch.Tensor, plan: torch.Tensor,
                 starts: list[int], sizes: list[int], lr: torch.Tensor, proximal: float,
                 corr: torch.Tensor | None):
        g, span, out = len(sizes), max(sizes), weight.shape[0]
        self.xs, self.starts, self.sizes = xs, starts, sizes
        self.base = xs @ weight.T  # [N, out]: every example through the global weight
        self.gram = xs.new_zeros((g, span, span))
        # x C_i^T of each example, and beta_i: how much of -C_i the weights hold so far
        self.corr, self.corr_out = corr, None if corr is None else xs.new_zeros((g, span, out))
        for i, n in enumerate(sizes):
            x = xs[starts[i]:starts[i] + n]
            self.gram[i, :n, :n] = x @ x.T
            if corr is not None:
                self.corr_out[i, :n] = x @ corr[i].T
        self.local = plan - torch.tensor(starts, device=plan.device)[:, None, None]
        self.plan = plan
        self.e = xs.new_zeros((g, span, out))
        self.lr = lr
        self.decay = (1.0 - lr * proximal) if proximal else None
        self.beta = lr.new_zeros(g)

    def _rows(self, a: int, t: int, src: torch.Tensor) -> torch.Tensor:
        """Rows of ``src`` [G, span, k] for the first ``a`` clients' batches of step t."""
        loc = self.local[:a, t]
        return src[:a].gather(1, loc.unsqueeze(-1).expand(-1, -1, src.shape[-1]))

    def outputs(self, a: int, t: int) -> torch.Tensor:
        """The first ``a`` clients' batches of step t through their current first-layer
        weights (without the bias): [a, width, out]."""
        out = self.base[self.plan[:a, t]]
        if t:
            out.baddbmm_(self._rows(a, t, self.gram), self.e[:a])
            if self.corr_out is not None:
                out.sub_(self._rows(a, t, self.corr_out) * self.beta[:a, None, None])
        return out

    def absorb(self, a: int, t: int, grad_lr: torch.Tensor) -> None:
        """Step t's update for the first ``a`` clients: ``grad_lr`` [a, width, out] is lr
        times the gradient of the loss at the layer's outputs (0 on padding)."""
        e = self.e[:a]
        if self.decay is not None:  # y - x shrinks by (1 - lr mu) per step (proximal)
            e.mul_(self.decay[:a, None, None])
            self.beta[:a].mul_(self.decay[:a])
        if self.corr is not None:
            self.beta[:a].add_(self.lr[:a])
        loc = self.local[:a, t]
        e.scatter_add_(1, loc.unsqueeze(-1).expand(-1, -1, e.shape[-1]), grad_lr.neg())

    def delta(self, out: torch.Tensor) -> None:
        """Every client's D_i into ``out`` [G, out, in] (each out[i] contiguous)."""
        for i, n in enumerate(self.sizes):
            if n:
                torch.mm(self.e[i, :n].T, self.xs[self.starts[i]:self.starts[i] + n],
                         out=out[i])
            else:
                out[i].zero_()
        if self.corr is not None:
            out.sub_(self.corr * self.beta[:, None, None])


# How much more a stacked first layer's flop costs than FirstLayerSums' (small batched
# products against large ones): measured break-even for logistic regression (out = 62) on
# clients of 30-90 examples, 1 epoch of batches of 20, 1 CPU thread.
STACK_COST = 1.2


def defer_first_layer(sizes: list[int], seen: list[int], out_features: int) -> bool:
    """Whether a group keeps its first layer as FirstLayerSums rather than stacked: when
    its products, sum_i (2 n_i out + n_i^2) in (each example through W, the Gram matrix and
    the delta), cost less than a stack's 2 seen_i out in per client (a forward and an
    update per example of every batch, padding included) at STACK_COST times the price.
    It pays for several passes over small clients and for wider layers, not for clients much
    larger than the layer's output, whose Gram matrix grows as n^2 (docs/performance.md has
    the measurements)."""
    sums = sum(n * (2 * out_features + n) for n in sizes)
    return sums <= STACK_COST * 2 * out_features * sum(seen)


def chain_sgd_step(chain: LinearChain, loss: str, ws: list[torch.Tensor], xb: torch.Tensor | None,
                   yb: torch.Tensor, m: torch.Tensor, lr: torch.Tensor,
                   extra_grad: Callable[[int, torch.Tensor], torch.Tensor | None],
                   first: FirstLayerSums | None = None, t: int = 0,
                   trainable: list[bool] | None = None,
                   grads_out: list[torch.Tensor] | None = None) -> torch.Tensor:
    """One local SGD step of a group of LinearChain models, in place, by hand: the gradient
    of each client's masked mean batch loss (what ``vmap(grad(client_loss))`` gives), plus
    ``extra_grad(k, w)`` (the LocalTerms), times the client's lr, taken from its weights.
    Returns each client's mean batch loss.

    ``ws``: the stacked parameters, [a, *shape] each, contiguous (or, for a single layer's
    weight, the [a, out, in] view of a contiguous [a, in, out] stack); ``xb``: [a, B, ...] inputs;
    ``yb``: [a, B] labels (mse: [a, B, ...] targets); ``m``: [a, B], 1 for a real example and
    0 for padding; ``lr``: [a]. A weight's gradient goes straight into the weight (one
    baddbmm, lr folded into the small output gradient) instead of being materialized and
    then added, which halved the time of the MLP's first layer (docs/performance.md).

    ``first``: the first layer's weight is not in ``ws`` but kept as sums over the clients'
    examples (``FirstLayerSums``), which give its outputs at step ``t`` and take its update;
    ``xb`` is then not read.

    ``trainable`` (per parameter, None: all): a frozen parameter takes no step, not even its
    terms' (a phase that trains the head alone), and the backward pass stops below the
    lowest layer that trains, as nothing under it would use its gradient.

    ``grads_out`` ([a, *shape] each, contiguous): no step is taken; each parameter's
    gradient of the mean batch loss (without the terms) is written there instead, for a
    step that needs all of it first (a stateful optimizer, a gradient transform)."""
    a, b = m.shape
    h = None if first is not None else xb.reshape(a, b, -1)
    inputs = []
    for k, (wi, bi) in enumerate(chain.layers):
        if k:
            h = torch.relu(h)
        inputs.append(h)
        if k == 0 and first is not None:
            h = first.outputs(a, t)
            if bi is not None:
                h += ws[bi][:, None]
            continue
        w_t = ws[wi].transpose(1, 2)
        h = torch.bmm(h, w_t) if bi is None else torch.baddbmm(ws[bi].unsqueeze(1), h, w_t)
    share = m / m.sum(1, keepdim=True)  # each example's weight in its client's mean loss
    if loss == "cross_entropy":
        logp = torch.log_softmax(h, -1)
        per_example = -logp.gather(-1, yb.unsqueeze(-1)).squeeze(-1)
        d = logp.exp_()  # d loss / d logits = softmax - onehot(y)
        d.scatter_add_(-1, yb.unsqueeze(-1), torch.full_like(per_example, -1.0).unsqueeze(-1))
    else:  # mse: 1/2 |out - y|^2 per example, as fedray.core.losses defines it
        d = h - yb.reshape(a, b, -1).to(h.dtype)
        per_example = 0.5 * d.pow(2).sum(-1)
    losses = (per_example * share).sum(1)
    d = d * share.unsqueeze(-1)
    if grads_out is not None:
        for k in range(len(chain.layers) - 1, -1, -1):
            wi, bi = chain.layers[k]
            x = inputs[k]
            d_in = torch.bmm(d, ws[wi]).mul_(x > 0) if k else None
            torch.bmm(d.transpose(1, 2), x, out=grads_out[wi])
            if bi is not None:
                torch.sum(d, 1, out=grads_out[bi])
            d = d_in
        return losses
    rate = lr.view(a, 1, 1)
    if trainable is not None:
        _frozen_chain_backward(chain, ws, inputs, d, lr, extra_grad, trainable, first)
        return losses
    for k in range(len(chain.layers) - 1, -1, -1):
        wi, bi = chain.layers[k]
        x = inputs[k]
        deferred = k == 0 and first is not None
        # what the step needs of the weights before it changes them
        extras = [(j, extra_grad(j, ws[j])) for j in ((bi,) if deferred else (wi, bi))
                  if j is not None]
        d_in = torch.bmm(d, ws[wi]).mul_(x > 0) if k else None  # back through w and the ReLU
        d_lr = d * rate
        if deferred:
            first.absorb(a, t, d_lr)
        else:
            ws[wi].baddbmm_(d_lr.transpose(1, 2), x, alpha=-1.0)
        if bi is not None:
            ws[bi].sub_(d_lr.sum(1))
        for j, e in extras:
            if e is not None:
                _sgd_(ws[j], lr, e)
        d = d_in
    return losses


def _frozen_chain_backward(chain: LinearChain, ws: list[torch.Tensor],
                           inputs: list[torch.Tensor], d: torch.Tensor, lr: torch.Tensor,
                           extra_grad: Callable[[int, torch.Tensor], torch.Tensor | None],
                           trainable: list[bool], first: FirstLayerSums | None) -> None:
    """chain_sgd_step's backward pass and update with some parameters frozen: the same
    products as its own loop for the parameters that train, none for the others."""
    if first is not None:
        raise ValueError("FirstLayerSums trains the first layer: no frozen parameters with it")
    rate = lr.view(len(lr), 1, 1)
    trains = [[j is not None and trainable[j] for j in layer] for layer in chain.layers]
    lowest = next((k for k, t in enumerate(trains) if any(t)), len(trains))
    for k in range(len(chain.layers) - 1, lowest - 1, -1):
        wi, bi = chain.layers[k]
        x = inputs[k]
        extras = [(j, extra_grad(j, ws[j])) for j, on in zip((wi, bi), trains[k], strict=True)
                  if on]
        d_in = torch.bmm(d, ws[wi]).mul_(x > 0) if k > lowest else None
        d_lr = d * rate
        if trains[k][0]:
            ws[wi].baddbmm_(d_lr.transpose(1, 2), x, alpha=-1.0)
        if trains[k][1]:
            ws[bi].sub_(d_lr.sum(1))
        for j, e in extras:
            if e is not None:
                _sgd_(ws[j], lr, e)
        d = d_in


def _client_loss(module: nn.Module, names: list[str], criterion: Callable,
                 drop: ClientDropout, loss: str, precision: str,
                 device: torch.device | str) -> Callable:
    """A client's masked mean batch loss (and its detached copy, the aux output), as a
    function of its weights, batch, padding mask and dropout masks: what both batched steps
    take ``grad`` of under ``vmap``. The mean is over the batch's real examples, or for a
    per-position loss over their non-padding positions (``_units``)."""

    def client_loss(ws: tuple[torch.Tensor, ...], xb: torch.Tensor, yb: torch.Tensor,
                    m: torch.Tensor, masks: tuple[torch.Tensor, ...] = ()):
        with drop.feeding(masks):
            out = forward(precision, device, functional_call, module,
                          dict(zip(names, ws, strict=True)), (xb,))
        units = _units(loss, yb)
        mean = (criterion(out, yb, reduction="none") * m).sum() / (
            m.sum() if units is None else (units * m).sum().clamp_min(1))
        return mean, mean.detach()

    return client_loss


def _materialized_step(module: nn.Module, names: list[str], criterion: Callable,
                       trainable: list[bool] | None, transform: GradTransform | None,
                       drop: ClientDropout | None = None,
                       loss: str = "cross_entropy", precision: str = "fp32",
                       device: torch.device | str = "cpu"):
    """The group's gradients as tensors (and each client's mean batch loss): ``vmap`` over
    the clients of their masked mean batch loss's gradient; with a ``per_example``
    transform, of the mean of each example's transformed gradient (a second ``vmap``, over
    the batch), the padding weighted 0 and a frozen parameter's gradient zero before the
    transform (it sees what trains, as a clipping norm over the trained parameters would).
    ``drop``: the model's dropout, fed each client's masks (the steps' last argument; each
    example's rows of them under the per-example ``vmap``)."""
    drop = ClientDropout(module) if drop is None else drop

    client_loss = _client_loss(module, names, criterion, drop, loss, precision, device)

    if transform is None or not transform.per_example:
        return vmap(grad(client_loss, has_aux=True))

    def example_loss(ws: tuple[torch.Tensor, ...], x: torch.Tensor, y: torch.Tensor,
                     masks: tuple[torch.Tensor, ...]):
        with drop.feeding([mk.unsqueeze(0) for mk in masks]):
            out = forward(precision, device, functional_call, module,
                          dict(zip(names, ws, strict=True)), (x.unsqueeze(0),))
        value = criterion(out, y.unsqueeze(0), reduction="none").sum()
        units = _units(loss, y.unsqueeze(0))
        if units is not None:  # the example's own mean, as sequential per-example steps take
            value = value / units.sum().clamp_min(1)
        return value, value.detach()

    per_example = vmap(grad(example_loss, has_aux=True), in_dims=(None, 0, 0, 0))
    each = vmap(transform)

    def client_step(ws: tuple[torch.Tensor, ...], xb: torch.Tensor, yb: torch.Tensor,
                    m: torch.Tensor, masks: tuple[torch.Tensor, ...] = ()):
        grads, losses = per_example(ws, xb, yb, masks)
        if trainable is not None:
            grads = tuple(gr if on else torch.zeros_like(gr)
                          for gr, on in zip(grads, trainable, strict=True))
        grads = each(tuple(grads))
        share = m / m.sum()
        mean = tuple((gr * share.view(-1, *([1] * (gr.dim() - 1)))).sum(0) for gr in grads)
        return mean, (losses * share).sum()

    return vmap(client_step)


def _in_chunks(step_fn: Callable, chunk: int, ws: list[torch.Tensor], xb: torch.Tensor,
               yb: torch.Tensor, m: torch.Tensor,
               *masks: tuple[torch.Tensor, ...]) -> tuple[list[torch.Tensor], torch.Tensor]:
    """``step_fn`` over the clients ``chunk`` at a time (each client's result is its own);
    ``masks``: none, or the step's dropout masks, [clients, ...] each."""
    parts = [step_fn(tuple(w[i:i + chunk] for w in ws), xb[i:i + chunk], yb[i:i + chunk],
                     m[i:i + chunk], *(tuple(k[i:i + chunk] for k in mk) for mk in masks))
             for i in range(0, len(m), chunk)]
    grads = [torch.cat([part[0][k] for part in parts]) for k in range(len(ws))]
    return grads, torch.cat([part[1] for part in parts])


class _OptimizerState:
    """A group's ClientOptimizer tensors, [G, P] (adam's step count [G, 1]) in training
    order, with a [G, *shape] view of each parameter's columns, which the steps update in
    place: the result is then the stack, rows as the deltas'."""

    def __init__(self, kind: str, optimizer: ClientOptimizer | None,
                 given: dict[str, torch.Tensor] | None, order: list[int],
                 params: list[torch.Tensor], device: torch.device):
        self.kind, self.optimizer = kind, optimizer
        g = len(order)
        shapes = [tuple(p.shape[1:]) for p in params]
        sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
        total = sum(sizes)
        keys = {"sgd": (), "momentum": ("m",), "adam": ("m", "v", "t")}[kind]
        self.tensors: dict[str, torch.Tensor] = {}
        for key in keys:
            width = 1 if key == "t" else total
            src = None if given is None else given.get(key)
            if src is None:
                self.tensors[key] = torch.zeros((g, width), device=device)
            else:
                if tuple(src.shape) != (g, width):
                    raise ValueError(f"opt_state[{key!r}] has shape {tuple(src.shape)}, "
                                     f"expected {(g, width)}")
                self.tensors[key] = src[order].to(device=device, dtype=torch.float32)
        self.views: dict[str, list[torch.Tensor]] = {}
        for key in ("m", "v"):
            if key in self.tensors:
                cols = self.tensors[key].split(sizes, dim=1)
                self.views[key] = [c.view(g, *s) for c, s in zip(cols, shapes, strict=True)]

    def step(self, ws: list[torch.Tensor], grads: list[torch.Tensor], lr: torch.Tensor,
             trainable: list[bool] | None) -> None:
        """One step of the first len(lr) clients; a frozen parameter's weights and state
        stay as they are."""
        a = len(lr)
        on = [trainable is None or trainable[k] for k in range(len(ws))]
        if self.kind == "sgd":
            for k, (w, gr) in enumerate(zip(ws, grads, strict=True)):
                if on[k]:
                    _sgd_(w, lr, gr)
            return
        opt = self.optimizer
        if self.kind == "momentum":
            for k, (w, gr) in enumerate(zip(ws, grads, strict=True)):
                if on[k]:
                    m = self.views["m"][k][:a]
                    m.mul_(opt.momentum).add_(gr)
                    _sgd_(w, lr, m)
            return
        b1, b2 = opt.betas
        t = self.tensors["t"][:a]
        t.add_(1.0)
        # the bias corrections in float64, rounded once: 1 - 0.999 in float32 is 1.3e-5 off
        c1 = (1.0 - torch.pow(b1, t.double())).float()
        c2 = (1.0 - torch.pow(b2, t.double())).float()
        for k, (w, gr) in enumerate(zip(ws, grads, strict=True)):
            if not on[k]:
                continue
            m, v = self.views["m"][k][:a], self.views["v"][k][:a]
            m.mul_(b1).add_(gr, alpha=1.0 - b1)
            v.mul_(b2).addcmul_(gr, gr, value=1.0 - b2)
            shape = (a, *([1] * (w.dim() - 1)))
            denom = (v / c2.view(shape)).sqrt_().add_(opt.eps)
            _sgd_(w, lr, (m / c1.view(shape)).div_(denom))

    def result(self) -> dict[str, torch.Tensor] | None:
        return self.tensors or None


def vmap_local_sgd(model: FlatModel, global_weights: torch.Tensor,
                   data: list[tuple[torch.Tensor, torch.Tensor]], *, lrs: list[float],
                   batch_size: int | list[int], local_epochs: int, local_steps: int | None,
                   seeds: list[int], terms: LocalTerms = NO_TERMS,
                   full_batch: bool = False, loss: str = "cross_entropy",
                   closed_form: bool = True, defer_first: bool | None = None,
                   starts: torch.Tensor | None = None, trainable: list[bool] | None = None,
                   optimizer: ClientOptimizer | None = None,
                   opt_state: dict[str, torch.Tensor] | None = None,
                   transform: GradTransform | None = None,
                   precision: str = "fp32") -> GroupResult:
    """Local SGD of every client in ``data`` from ``global_weights``, batched.

    Per client i: its (x, y), lr ``lrs[i]``, batch size (one for all, or one each), batch
    order and dropout masks from ``seeds[i]``. ``terms``
    (fedray.algorithms.base.LocalTerms) are the group's extra local-objective terms: one
    proximal weight for all, and a linear term stacked [G, P], row i client i's. ``model``
    supplies the architecture (its module is called functionally; its weights are not
    touched).

    The clients are trained longest-first, so the ones still stepping at step t are a prefix
    of the group and a step computes only theirs. Every batch is padded to the largest batch
    size of the group (not of the step), so a client's arithmetic has the same shapes
    whichever clients share its group.

    A LinearChain model (``linear_chain``) takes its steps from ``chain_sgd_step`` unless
    ``closed_form`` is False; every other model, from torch.func's ``vmap(grad(...))``.
    ``defer_first``: keep the chain's first layer as ``FirstLayerSums`` (True) or stacked
    (False); None decides by ``defer_first_layer``, and only for single-layer chains (see
    below). ``GroupResult.path`` says which step was taken.

    A phase's hooks (fedray.algorithms.base.Phase), as ``sequential.local_sgd`` takes them:
    ``starts`` [G, model.size], row i client i's starting weights (None: ``global_weights``
    for all); the deltas stay y - ``global_weights``, and the proximal anchor is
    ``global_weights``. ``trainable`` (per parameter, in ``module.parameters()`` order): a
    frozen parameter takes no step, its gradient is zero for the transform, and its
    optimizer state stays as it was. ``optimizer`` (``ClientOptimizer``: sgd, momentum,
    adam) with ``opt_state`` ("m", "v": [G, num_params], "t": [G, 1], row i client i's; zeros
    when None or missing); the state after training is ``GroupResult.opt_state``.
    ``transform`` (a ``GradTransform``, run under ``vmap`` over the group) changes each
    step's gradient, terms included, before the optimizer's step; a ``per_example`` one
    changes each example's gradient (a second ``vmap`` over the batch, padding excluded),
    whose mean over the client's examples the terms are then added to.

    Why these paths: a start whose first-layer weight is not the global one voids
    ``FirstLayerSums`` (its sums describe W + D_i with W the global weight), so the chain
    then keeps its first layer stacked; a frozen parameter only drops its update from
    ``chain_sgd_step``. A stateful optimizer or a transform needs the whole gradient before
    any weight moves, so the chain step then writes the gradients out (``grads_out``)
    instead of into the weights; a per-example transform needs each example's gradient,
    which only torch.func's nested ``vmap`` gives. Unused, every hook leaves the code path
    as it was.

    ``precision`` (``runtime.precision``, fedray.kernels.precision): ``bf16`` runs the
    torch.func step's forward pass under bfloat16 autocast. ``chain_sgd_step`` stays float32:
    its products are written out by hand, updating the weights in place, and bfloat16 copies
    of them measured slower on the CPU (docs/performance.md, "Reduced precision")."""
    reason = unsupported_reason(model.module)
    if reason is not None:
        raise ValueError(f"cannot train this model vectorized: {reason}")
    proximal, linear = terms.proximal, terms.linear
    device = model.device
    criterion = _batched_loss(loss)
    module = model.module
    module.train()
    g = len(data)
    sizes = [len(y) for _, y in data]
    batches = batch_size if isinstance(batch_size, list) else [batch_size] * g
    schedules = [batch_rows(n, b, local_epochs, local_steps, s, full_batch)
                 for n, b, s in zip(sizes, batches, seeds, strict=True)]
    steps = [len(s) for s in schedules]
    order = sorted(range(g), key=lambda i: -steps[i])  # stable: ties keep their order
    width = max([max(1, n) if full_batch else b for n, b in zip(sizes, batches, strict=True)]
                + [1])
    horizon = max(steps + [0])

    # the clients' data back to back, in training order, and each client's batches as
    # [steps, width] rows into it (padding points at its first example and is masked out),
    # so a step's batches are one gather
    plan = np.zeros((g, max(1, horizon), width), dtype=np.int64)
    mask = np.zeros((g, max(1, horizon), width), dtype=np.float32)
    firsts = np.zeros(g, dtype=np.int64)  # where each client's examples begin in xs
    start = 0
    for row, i in enumerate(order):
        plan[row] = firsts[row] = start
        rows = schedules[i]
        if len(rows):
            real = rows >= 0
            plan[row, :len(rows), :rows.shape[1]] += np.where(real, rows, 0)
            mask[row, :len(rows), :rows.shape[1]] = real
        start += sizes[i]
    # each client's (pinned, on a GPU) tensors copied asynchronously, joined on the device
    xs = torch.cat([data[i][0].to(device, non_blocking=True) for i in order])
    ys = torch.cat([data[i][1].to(device, non_blocking=True) for i in order])
    counts = mask.sum(2, dtype=np.float64)  # [G, steps]: examples per batch
    plan = torch.from_numpy(plan).to(device, non_blocking=True)
    mask = torch.from_numpy(mask).to(device, non_blocking=True)
    active = [sum(1 for i in order if steps[i] > t) for t in range(horizon)]

    kind = "sgd" if optimizer is None else optimizer.kind
    if trainable is not None and all(trainable):
        trainable = None
    if trainable is not None and len(trainable) != len(model.param_list):
        raise ValueError(f"trainable has {len(trainable)} entries for the model's "
                         f"{len(model.param_list)} parameters")
    materialize = kind != "sgd" or transform is not None
    per_example = transform is not None and transform.per_example
    chain = linear_chain(module, loss) if closed_form and not per_example else None
    if chain is not None and not chain.flatten and xs.dim() != 2:
        chain = None  # a Linear applied to the last axis of multi-axis inputs
    lr = torch.tensor([lrs[i] for i in order], dtype=torch.float32, device=device)
    if defer_first is None and chain is not None:
        out_features = list(module.parameters())[chain.layers[0][0]].shape[0]
        # not before a ReLU: there, rounding differences the size of float32's can flip a
        # unit whose input is within them of 0 (benchmarks/vectorized_step.py
        # --against-sequential: 1 of 1,000 MLP clients 1.9e-3 off sequential training after
        # 5 epochs; none with the stack, whose products round as sequential training's do)
        defer_first = len(chain.layers) == 1 and defer_first_layer(
            sizes, [width * k for k in steps], out_features)
    if trainable is not None or materialize:
        defer_first = False
    if defer_first and chain is not None and starts is not None:
        # FirstLayerSums trains the first layer's weight from the global one: a start may
        # differ elsewhere only (a local bias or head, FedPer's), which its stack then holds
        _, at, n = model.spans[chain.layers[0][0]]  # where that weight is in the flat vector
        span = slice(at, at + n)
        defer_first = bool((starts[:, span] == global_weights[span].to(starts.device)).all())
    defer = chain.layers[0][0] if defer_first and chain is not None and horizon else None

    names = [n for n, _ in module.named_parameters()]
    anchor = global_weights[: model.num_params].to(device)
    # one contiguous [G, *shape] stack per parameter: a batched product can then write a
    # weight in place (a strided view of one [G, P] tensor made it copy)
    params, anchors, corr, offset = [], [], [], 0
    c = None if linear is None else linear[order].to(device)
    # each start's rows gathered straight into its contiguous stack: one pass over them,
    # as the global model's expand().clone()
    rows = None if starts is None else torch.tensor(order, device=starts.device)
    if starts is not None and (starts.dim() != 2 or len(starts) != g
                               or starts.shape[1] < model.num_params):
        raise ValueError(f"starts has shape {tuple(starts.shape)}, expected {(g, model.size)}")
    # a single Linear layer's weights (logistic regression) stacked [G, in, out] in memory,
    # as a [G, out, in] view: the forward's x W^T then reads a plain matrix, where MKL's
    # product with a transposed operand took about 3x as long at 20 x 784 by 784 x 62 (the
    # same bits there); the update writes the view in place. Not for deeper chains: for the
    # MLP's 784 x 200 layer the product gained less than the transposing copies in and out
    # cost (docs/performance.md, "Transposed stacks")
    flip = (set() if chain is None or materialize or device.type != "cpu"
            or len(chain.layers) != 1 else {chain.layers[0][0]})
    for k, (_, p) in enumerate(module.named_parameters()):
        span = slice(offset, offset + p.numel())
        anchors.append(anchor[span].view(p.shape))
        if k == defer:
            params.append(None)
        elif k in flip:
            w = torch.empty((g, p.shape[1], p.shape[0]), device=device, dtype=anchor.dtype)
            src = (anchors[-1].expand(g, *p.shape) if rows is None else
                   starts[:, span].index_select(0, rows).to(device).view(g, *p.shape))
            params.append(w.transpose(1, 2).copy_(src))
        elif rows is not None:
            params.append(starts[:, span].index_select(0, rows).to(device, anchor.dtype)
                          .view(g, *p.shape))
        else:
            params.append(anchors[-1].expand(g, *p.shape).clone())
        if c is not None:
            corr.append(c[:, span].view(g, *p.shape))
        offset += p.numel()
    first = None
    if defer is not None:
        first = FirstLayerSums(anchors[defer], xs.reshape(len(xs), -1), plan[:, :horizon],
                               firsts.tolist(), [sizes[i] for i in order], lr, proximal,
                               corr[defer] if c is not None else None)

    def extra_grad(k: int, w: torch.Tensor) -> torch.Tensor | None:
        """The terms' gradient (a linear term, a proximal pull) for parameter k of the first
        len(w) clients, or None."""
        return terms.gradient(w, anchors[k], corr[k][: len(w)] if c is not None else None)

    call = unrolled(module)  # a copy whose nn.LSTMs vmap can batch; else module itself

    # dropout: each client's masks drawn from its own generator outside vmap, exactly as
    # sequential training draws them (fedray.kernels.dropout), and handed in stacked
    drop = ClientDropout(call)
    client_loss = _client_loss(call, names, criterion, drop, loss, precision, device)
    calls = drop.calls(xs[0]) if drop and len(xs) else []
    gens = [torch.Generator(device=device).manual_seed(seeds[i]) for i in order] if calls else []

    def step_masks(a: int, t: int) -> tuple:
        """Step t's dropout masks of the first ``a`` clients, as step_fn's last argument
        (none without dropout)."""
        if not calls:
            return ()
        return (draw_masks(calls, gens[:a], counts[:a, t].astype(np.int64).tolist(), width,
                           device),)

    step_losses = torch.zeros((g, max(1, horizon)), dtype=torch.float32, device=device)
    if materialize:
        state = _OptimizerState(kind, optimizer, opt_state, order, params, device)
        step_fn = (None if chain is not None else
                   _materialized_step(call, names, criterion, trainable, transform, drop,
                                      loss, precision, device))
        buffers = [torch.empty_like(p) for p in params] if chain is not None else []
        # per-example gradients are [clients, width, P]: as many clients at once as keep
        # them within a group's budget (the whole group's, 125 MB for 32 logistic
        # regressions, trained 2.3x slower than one client after another on the CPU)
        budget = GROUP_BYTES["gpu" if device.type == "cuda" else "cpu"]
        chunk = max(1, budget // (4 * width * max(1, model.num_params)))
        for t in range(horizon):
            a = active[t]
            index = plan[:a, t]
            ws = [p[:a] for p in params]
            if chain is not None:
                grads = [b[:a] for b in buffers]
                step_losses[:a, t] = chain_sgd_step(chain, loss, ws, xs[index], ys[index],
                                                    mask[:a, t], lr[:a], extra_grad,
                                                    grads_out=grads)
            elif per_example and a > chunk:
                grads, step_losses[:a, t] = _in_chunks(step_fn, chunk, ws, xs[index],
                                                       ys[index], mask[:a, t],
                                                       *step_masks(a, t))
            else:
                grads, step_losses[:a, t] = step_fn(tuple(ws), xs[index], ys[index],
                                                    mask[:a, t], *step_masks(a, t))
            with torch.no_grad():
                grads = list(grads)
                if transform is not None and not transform.per_example:
                    for k, w in enumerate(ws):  # the transform sees the terms
                        e = extra_grad(k, w)
                        if e is not None:
                            grads[k] = grads[k] + e
                    if trainable is not None:
                        grads = [gr if on else torch.zeros_like(gr)
                                 for gr, on in zip(grads, trainable, strict=True)]
                    grads = list(vmap(transform)(tuple(grads)))
                else:  # plain or per-example gradients (transformed already): the terms
                    for k, w in enumerate(ws):
                        e = extra_grad(k, w)
                        if e is not None:
                            grads[k] = grads[k] + e
                state.step(ws, grads, lr[:a], trainable)
    else:
        state = None
        step_fn = None if chain is not None else vmap(grad(client_loss, has_aux=True))
    for t in range(0 if state is None else horizon, horizon):
        a = active[t]
        index = plan[:a, t]
        if chain is not None:
            ws = [None if p is None else p[:a] for p in params]
            xb = xs[index] if first is None else None
            step_losses[:a, t] = chain_sgd_step(chain, loss, ws, xb, ys[index],
                                                mask[:a, t], lr[:a], extra_grad, first, t,
                                                trainable)
            continue
        ws = [p[:a] for p in params]
        grads, step_losses[:a, t] = step_fn(tuple(ws), xs[index], ys[index], mask[:a, t],
                                            *step_masks(a, t))
        with torch.no_grad():
            for k, (w, gr) in enumerate(zip(ws, grads, strict=True)):
                if trainable is not None and not trainable[k]:
                    continue
                e = extra_grad(k, w)
                if e is not None:
                    gr += e
                _sgd_(w, lr[:a], gr)
    loss_sums = (step_losses.double().cpu().numpy() * counts).sum(1)
    weights = torch.empty((g, model.num_params), device=device)
    offset = 0
    for p, w0 in zip(params, anchors, strict=True):
        out = weights[:, offset:offset + w0.numel()].view(g, *w0.shape)
        if p is None:
            first.delta(out)
        else:
            torch.sub(p, w0, out=out)
        offset += w0.numel()
    row_of = [0] * g
    for row, i in enumerate(order):
        row_of[i] = row
    seen = [int(counts[row_of[i]].sum()) for i in range(g)]
    return GroupResult(deltas=weights, rows=row_of, num_examples=sizes,
                       loss_sums=[float(loss_sums[row_of[i]]) for i in range(g)],
                       examples_seen=seen, steps=steps,
                       path="torch.func" if chain is None else
                       "stacks" if first is None else "sums",
                       opt_state=None if state is None else state.result())
