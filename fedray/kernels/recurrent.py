"""An LSTM written out step by step, so that torch.func's ``vmap`` can batch it over clients.

``nn.LSTM`` runs one fused kernel (``torch.lstm``) that has no vmap batching rule: under
``vmap`` torch.func falls back to running it once per client, slower than training the
clients one after another. ``UnrolledLSTM`` computes the same layer from the same
parameters (``weight_ih_l{k}``, ``weight_hh_l{k}``, ``bias_ih_l{k}``, ``bias_hh_l{k}``, the
same names, shapes and gate order i, f, g, o), as plain tensor operations that all batch:
per layer, the input projection of every time step in one product, then a loop over time
for the recurrent part (gates = x_t W_ih^T + b_ih + b_hh + h W_hh^T; c = f c + i g;
h = o tanh(c)). ``unrolled`` gives a copy of a model whose ``nn.LSTM`` layers are replaced
by it; the vectorized kernel calls that copy with the clients' weights
(fedray.kernels.vectorized). It sums in another order than the fused kernel, so its outputs
differ from ``nn.LSTM``'s by float rounding (tests/kernels/test_recurrent.py bounds it).

Only what seed 002's and LEAF's models use is written out: unidirectional layers, with or
without biases, batch-first or not, any number of layers, an initial state or none.
``lstm_refusal`` says why a layer is not (dropout between layers is drawn per call,
bidirectional layers and projections are not implemented; other recurrent layers, GRU and
plain RNN, neither).
"""

from __future__ import annotations

import copy

import torch
from torch import nn


def lstm_refusal(name: str, module: nn.Module) -> str | None:
    """Why the recurrent layer ``module`` (named ``name`` in its model) cannot be replaced
    by an ``UnrolledLSTM``, or None when it can."""
    what = f"{name or 'the model'}: {type(module).__name__}"
    if type(module) is not nn.LSTM:  # a subclass may compute something else in its forward
        return (f"it has a recurrent layer ({what}) that is not an nn.LSTM, whose fused kernel "
                "vmap cannot batch (only nn.LSTM has an unrolled form here)")
    if module.bidirectional:
        return (f"it has a bidirectional LSTM ({what}), which the unrolled LSTM does not "
                "implement")
    if module.proj_size:
        return (f"it has an LSTM with projections ({what}, proj_size {module.proj_size}), "
                "which the unrolled LSTM does not implement")
    if module.dropout and module.num_layers > 1:
        return f"it has dropout between LSTM layers ({what}: dropout {module.dropout})"
    return None


class UnrolledLSTM(nn.Module):
    """nn.LSTM's forward as per-time-step tensor operations, over the same parameters.

    Takes and returns what nn.LSTM does: ``(output, (h_n, c_n))`` for an input of
    [batch, time, features] (batch_first) or [time, batch, features], or unbatched
    [time, features], with an optional initial ``(h_0, c_0)``."""

    def __init__(self, lstm: nn.LSTM):
        super().__init__()
        reason = lstm_refusal("", lstm)
        if reason is not None:
            raise ValueError(f"cannot unroll this LSTM: {reason}")
        self.num_layers, self.hidden_size = lstm.num_layers, lstm.hidden_size
        self.batch_first, self.bias = lstm.batch_first, lstm.bias
        for name, p in lstm.named_parameters(recurse=False):
            self.register_parameter(name, p)  # the same tensors, under the same names

    def forward(self, x: torch.Tensor,
                hx: tuple[torch.Tensor, torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        unbatched = x.dim() == 2
        if unbatched:
            x = x.unsqueeze(0 if self.batch_first else 1)
            if hx is not None:
                hx = (hx[0].unsqueeze(1), hx[1].unsqueeze(1))
        if not self.batch_first:
            x = x.transpose(0, 1)
        batch, n = x.shape[0], self.hidden_size
        if hx is None:
            h0 = c0 = x.new_zeros((self.num_layers, batch, n))
        else:
            h0, c0 = hx
        last_h, last_c = [], []
        for k in range(self.num_layers):
            w_ih, w_hh = getattr(self, f"weight_ih_l{k}"), getattr(self, f"weight_hh_l{k}")
            # the input's part of every step's gates in one product
            pre = x @ w_ih.T
            if self.bias:
                pre = pre + (getattr(self, f"bias_ih_l{k}") + getattr(self, f"bias_hh_l{k}"))
            x, c, _, _ = _Recurrence.apply(pre, w_hh, h0[k], c0[k])
            last_h.append(x[:, -1])
            last_c.append(c)
        h_n, c_n = torch.stack(last_h), torch.stack(last_c)
        if not self.batch_first:
            x = x.transpose(0, 1)
        if unbatched:
            x = x.squeeze(0 if self.batch_first else 1)
            h_n, c_n = h_n.squeeze(1), c_n.squeeze(1)
        return x, (h_n, c_n)


class _Recurrence(torch.autograd.Function):
    """The recurrent part of one LSTM layer, with its backward pass written out.

    ``pre``: [batch, time, 4 hidden], every step's input projection and biases; ``w_hh``:
    [4 hidden, hidden]; ``h0``, ``c0``: [batch, hidden]. Returns every step's h [batch,
    time, hidden] and the last c, plus two outputs kept for the backward pass (the gates'
    activations and every step's c), which take no gradient.

    Why by hand: left to autograd, the loop's backward computes each step's W_hh gradient
    as a full [4 hidden, hidden] product and adds it to the sum, and each ``pre[:, t]``'s
    as a zero-filled [batch, time, 4 hidden] tensor, per step; here the steps' gate
    gradients are stacked and W_hh's gradient is one product over all of them (the fused
    kernel's way). Only torch operations, so ``generate_vmap_rule`` lets vmap batch it."""

    generate_vmap_rule = True

    @staticmethod
    def forward(pre: torch.Tensor, w_hh: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        n = w_hh.shape[1]
        h, c = h0, c0
        w_t = w_hh.T
        hs, cs, sig, cand = [], [], [], []
        for pre_t in pre.unbind(1):
            gates = pre_t + h @ w_t
            s = gates.sigmoid()  # i, f, (unused), o
            g = gates[:, 2 * n:3 * n].tanh()
            c = torch.addcmul(s[:, n:2 * n] * c, s[:, :n], g)
            h = s[:, 3 * n:] * c.tanh()
            hs.append(h)
            cs.append(c)
            sig.append(s)
            cand.append(g)
        # the activations as [i, f, (unused), o, g]: what the backward pass reads
        acts = torch.cat([torch.stack(sig, 1), torch.stack(cand, 1)], -1)
        return torch.stack(hs, 1), c, acts, torch.stack(cs, 1)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        _, w_hh, h0, c0 = inputs
        hs, _, acts, cs = output
        ctx.mark_non_differentiable(acts, cs)
        ctx.save_for_backward(w_hh, h0, c0, hs, acts, cs)

    @staticmethod
    def backward(ctx, d_hs: torch.Tensor, d_c: torch.Tensor, _a, _b):
        w_hh, h0, c0, hs, acts, cs = ctx.saved_tensors
        n = w_hh.shape[1]
        i, f, o, g = acts[..., :n], acts[..., n:2 * n], acts[..., 3 * n:4 * n], acts[..., 4 * n:]
        tanh_c = cs.tanh()
        c_prev = torch.cat([c0.unsqueeze(1), cs[:, :-1]], 1)
        # each gate's gradient is dc (or, for o, dh) times a factor known from the forward:
        # the partner in c = f c_prev + i g, times the gate's activation derivative
        partners = torch.stack([g * i * (1 - i), c_prev * f * (1 - f), i * (1 - g * g)], 2)
        out_factor = tanh_c * o * (1 - o)
        through_c = o * (1 - tanh_c * tanh_c)  # d c_t / d h_t along h = o tanh(c)
        dh_next, dc_next = torch.zeros_like(h0), d_c
        d_gates = []
        for dh_t, p_t, of_t, q_t, f_t in reversed(list(zip(
                d_hs.unbind(1), partners.unbind(1), out_factor.unbind(1),
                through_c.unbind(1), f.unbind(1), strict=True))):
            dh = dh_t + dh_next
            dc = torch.addcmul(dc_next, dh, q_t)
            dg = torch.cat([(dc.unsqueeze(1) * p_t).flatten(1), dh * of_t], 1)
            d_gates.append(dg)
            dc_next = dc * f_t
            dh_next = dg @ w_hh
        d_pre = torch.stack(d_gates[::-1], 1)
        h_prev = torch.cat([h0.unsqueeze(1), hs[:, :-1]], 1)
        d_w = d_pre.flatten(0, 1).T @ h_prev.flatten(0, 1)
        return d_pre, d_w, dh_next, dc_next


def has_lstm(module: nn.Module) -> bool:
    """Whether ``module`` holds an nn.LSTM that ``unrolled`` would replace."""
    return any(isinstance(m, nn.LSTM) for m in module.modules())


def unrolled(module: nn.Module) -> nn.Module:
    """``module`` itself when it holds no nn.LSTM; else a copy of it with every nn.LSTM
    replaced by an ``UnrolledLSTM`` (so its parameters keep their names, which
    ``functional_call`` addresses them by). The copy's parameters are copies too; the
    vectorized kernel replaces them with the clients' weights in every call."""
    if not has_lstm(module):
        return module
    if isinstance(module, nn.LSTM):
        return UnrolledLSTM(copy.deepcopy(module))
    twin = copy.deepcopy(module)
    for name, m in list(twin.named_modules()):
        if isinstance(m, nn.LSTM):
            parent, _, leaf = name.rpartition(".")
            setattr(twin.get_submodule(parent) if parent else twin, leaf, UnrolledLSTM(m))
    return twin
