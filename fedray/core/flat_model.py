"""A model replica whose weights and gradients live in two flat tensors.

A worker trains many clients per round on one replica. Keeping every floating-point
parameter and buffer as a view into one contiguous ``flat`` tensor makes the per-client
operations single kernels: reset to the global model (one copy), the client's delta (one
subtraction) -- instead of a Python loop over tensors, which dominates the cost of small
cross-device models. The same layout is the wire format: the driver broadcasts one flat
array per round and workers send back flat weighted sums.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from fedray.core.model_parts import select


class FlatModel:
    def __init__(self, module: nn.Module, device: torch.device | str = "cpu"):
        self.module = module.to(device)
        self.device = torch.device(device)
        params = [p for p in module.parameters()]
        buffers = [(m, n, b) for m in module.modules() for n, b in m.named_buffers(recurse=False)
                   if b is not None and b.is_floating_point()]
        qualified = {id(m): name for name, m in module.named_modules()}
        param_names = {id(p): n for n, p in module.named_parameters()}
        # every flat entry's tensor by name, in flat order: (name, offset, numel)
        self.spans: list[tuple[str, int, int]] = []
        self.num_params = sum(p.numel() for p in params)
        total = self.num_params + sum(b.numel() for _, _, b in buffers)
        self.flat = torch.empty(total, dtype=torch.float32, device=self.device)
        self.grad = torch.zeros(self.num_params, dtype=torch.float32, device=self.device)
        self.param_list = params
        offset = 0
        for p in params:
            n = p.numel()
            self.spans.append((param_names[id(p)], offset, n))
            self.flat[offset:offset + n].copy_(p.data.reshape(-1))
            p.data = self.flat[offset:offset + n].view_as(p)
            p.grad = self.grad[offset:offset + n].view_as(p)
            offset += n
        for m, name, b in buffers:
            n = b.numel()
            owner = qualified[id(m)]
            self.spans.append((f"{owner}.{name}" if owner else name, offset, n))
            self.flat[offset:offset + n].copy_(b.reshape(-1))
            m._buffers[name] = self.flat[offset:offset + n].view_as(b)
            offset += n
        self.params = self.flat[: self.num_params]
        self.loads = 0

    @property
    def size(self) -> int:
        return self.flat.numel()

    def load_(self, weights: torch.Tensor) -> None:
        """Reset the replica to ``weights`` (a flat tensor) in place. ``loads`` counts the
        calls, so whoever left weights in the replica can tell whether they are still there."""
        self.flat.copy_(weights, non_blocking=True)
        self.loads += 1

    def split(self, vector: torch.Tensor) -> list[torch.Tensor]:
        """A flat per-parameter vector (a correction, an anchor) as views shaped like the
        parameters, in their order."""
        return [v.view_as(p) for v, p in
                zip(vector[: self.num_params].split([p.numel() for p in self.param_list]),
                    self.param_list, strict=True)]

    def positions(self, prefixes: tuple[str, ...]) -> torch.Tensor:
        """The flat positions (int64, ascending) of every parameter and buffer whose name
        starts with one of ``prefixes`` ("head." or "fc2", "bn1.running_mean"), or that a
        selector among them picks (``@head``, ``@body``, ``@norm``, ``!X``:
        fedray.core.model_parts): how a part's ``local`` parameters are cut out of, and put
        back into, a flat weight vector."""
        hits = select(self.module, (name for name, _, _ in self.spans), prefixes)
        picked = [torch.arange(o, o + n) for (_, o, n), hit in zip(self.spans, hits,
                                                                    strict=True) if hit]
        return (torch.cat(picked) if picked else torch.zeros(0, dtype=torch.int64)).to(
            self.device)

    def trainable(self, prefixes: tuple[str, ...] | None) -> list[bool]:
        """Per parameter (``param_list`` order), whether ``prefixes`` (prefixes or
        selectors, as ``positions``) selects it (None: all do) -- a phase's ``trainable``."""
        names = [name for name, _, _ in self.spans[: len(self.param_list)]]
        if prefixes is None:
            return [True] * len(names)
        return select(self.module, names, prefixes)

    @contextmanager
    def own_grads(self) -> Iterator[list[torch.Tensor]]:
        """Within it, the parameters (yielded) take the gradient backward() makes as their
        own: set each ``p.grad`` to None before a step and autograd keeps the fresh tensor
        instead of adding it into the flat ``grad``. A local SGD step then makes two passes
        fewer over memory the size of the weights (no zeroing, no accumulating), which for a
        CNN of tens of MB is much of a step's memory traffic beyond the matmuls. On exit each
        ``p.grad`` is a view of ``grad`` again, as full_gradient and sensitivity sum into it.
        """
        try:
            yield self.param_list
        finally:
            for p, view in zip(self.param_list, self.split(self.grad), strict=True):
                p.grad = view

    def state_dict(self) -> dict[str, torch.Tensor]:
        """A plain state_dict (copies on CPU) for saving or handing to users."""
        return {k: v.detach().cpu().clone() for k, v in self.module.state_dict().items()}


def flatten_state(module: nn.Module) -> torch.Tensor:
    """The flat weight vector of a freshly built module, in FlatModel's layout."""
    return FlatModel(module).flat
