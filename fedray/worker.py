"""The worker actor: one long-lived process that trains many virtual clients per round.

A worker reserves ``runtime.worker.num_cpus`` CPUs and a (possibly fractional) share of a GPU,
builds one model replica, and for each round: maps the broadcast global weights (one object
store read), trains its assigned clients one after another on the replica, folds each delta
into a local weighted sum, and returns that single partial result.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedray.aggregator import WeightedSum, client_weight
from fedray.client_update import local_sgd
from fedray.data.source import ClientCache, ClientSource
from fedray.evaluation import evaluate, merge_sums
from fedray.replica import FlatModel
from fedray.seeding import client_seed
from fedray.tensors import readonly_tensor


@dataclass
class WorkerSpec:
    """Everything a worker needs, shipped once when the pool is created."""

    make_model: Callable[[], nn.Module]
    source: ClientSource
    seed: int
    lr: float
    batch_size: int
    local_epochs: int
    local_steps: int | None
    eval_batch_size: int
    num_cpus: float
    cache_mb: int
    aggregator: str = "proportional"  # see fedray.algorithms.AGGREGATORS
    prox_mu: float = 0.0  # > 0 only for the fedprox client update
    full_batch: bool = False  # the fedsgd client update


class ClientWorker:
    def __init__(self, spec: WorkerSpec):
        import ray

        self.spec = spec
        torch.set_num_threads(max(1, int(spec.num_cpus)))
        gpu_ids = ray.get_gpu_ids()
        use_cuda = bool(gpu_ids) and torch.cuda.is_available()
        self.device = torch.device("cuda" if use_cuda else "cpu")
        self.gpu_ids = [str(g) for g in gpu_ids]
        self.model = FlatModel(spec.make_model(), self.device)
        self._weights = torch.empty_like(self.model.flat)
        self._delta = torch.empty_like(self.model.flat)
        self.cache = ClientCache(spec.source, spec.cache_mb * 2**20)

    def info(self) -> dict:
        import ray

        return {"pid": os.getpid(), "gpu_ids": self.gpu_ids, "device": str(self.device),
                "node_id": ray.get_runtime_context().get_node_id(),
                "threads": torch.get_num_threads()}

    def _load_global(self, weights: np.ndarray) -> torch.Tensor:
        self._weights.copy_(readonly_tensor(weights))
        return self._weights

    def train(self, weights: np.ndarray, round_idx: int, client_ids: list[int]) -> dict:
        """Train ``client_ids`` from ``weights``; return their partial weighted sum."""
        start = time.perf_counter()
        s = self.spec
        global_w = self._load_global(weights)
        acc = WeightedSum(self.model.size, self.device)
        loss_sum, seen, examples = 0.0, 0, 0
        for cid in client_ids:
            x, y = self.cache.get(cid)
            res = local_sgd(self.model, global_w, x, y, lr=s.lr, batch_size=s.batch_size,
                            local_epochs=s.local_epochs, local_steps=s.local_steps,
                            seed=client_seed(s.seed, round_idx, cid), delta_out=self._delta,
                            prox_mu=s.prox_mu, full_batch=s.full_batch)
            acc.add(res.delta, client_weight(s.aggregator, res.num_examples))
            loss_sum += res.loss_sum
            seen += res.examples_seen
            examples += res.num_examples
        return {"sum": acc.total.cpu().numpy(), "weight": acc.weight, "clients": len(client_ids),
                "examples": examples, "loss_sum": loss_sum, "examples_seen": seen,
                "busy_s": time.perf_counter() - start}

    def evaluate_range(self, weights: np.ndarray, test: tuple[np.ndarray, np.ndarray],
                       lo: int, hi: int) -> dict:
        """Evaluation sums on rows [lo, hi) of the central test set."""
        self.model.load_(readonly_tensor(weights))
        x, y = (readonly_tensor(a[lo:hi]) for a in test)
        return evaluate(self.model.module, x, y, self.spec.eval_batch_size, self.device)

    def evaluate_clients(self, weights: np.ndarray, client_ids: list[int]) -> dict:
        """Evaluation sums over the held-out data of ``client_ids``."""
        self.model.load_(readonly_tensor(weights))
        parts = []
        for cid in client_ids:
            x, y = self.cache.get(cid, "test")
            parts.append(evaluate(self.model.module, x, y, self.spec.eval_batch_size,
                                  self.device))
        return merge_sums(parts)
