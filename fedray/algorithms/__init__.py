"""Federated algorithms as compositions of parts: client work x aggregator x server optimizer.

One module per family; each registers its parts and presets when imported:

  fedavg     local_sgd, fedsgd; proportional, uniform; presets fedavg, fedsgd, fedavgm,
             fednesterov, fedadam, fedyogi, fedadagrad           (McMahan et al.; Reddi et al.)
  fedprox    fedprox client (algorithm.fedprox.mu)               (Li et al.)
  scaffold   scaffold client and aggregator (algorithm.scaffold.option)  (Karimireddy et al.)
  elastic    elastic aggregator (algorithm.elastic.tau, mu, holdout)     (Chen et al.)
  expalpha   expalpha aggregator (algorithm.expalpha.alpha)      (seed 003)
  feddyn     feddyn client and aggregator (algorithm.feddyn.alpha)       (Acar et al.)
  fednova    fednova aggregator                                  (Wang et al.)
  server_opt sgd, momentum, nesterov, adam, yogi, adagrad        (Reddi et al.'s SERVEROPT)

The API they are written against is fedray.algorithms.base (docs/algorithms.md); names and
import paths are resolved by fedray.algorithms.registry. Importing this package imports no
torch; the family modules do.
"""

from __future__ import annotations

from typing import Any

from fedray.algorithms.registry import (
    PRESETS,
    Algorithm,
    load_builtins,
    register,
    register_preset,
    resolve,
)

__all__ = ["PRESETS", "Aggregator", "Algorithm", "ClientContext", "ClientWork", "LocalTerms",
           "LocalUpdate", "PartialSum", "ServerOptimizer", "WorkerEnv", "load_builtins",
           "register", "register_preset", "require", "resolve"]

_BASE = {"Aggregator", "ClientContext", "ClientWork", "LocalTerms", "LocalUpdate",
         "PartialSum", "WorkerEnv", "require"}


def __getattr__(name: str) -> Any:  # the API classes import torch: only when asked for
    if name in _BASE:
        from fedray.algorithms import base

        return getattr(base, name)
    if name == "ServerOptimizer":
        from fedray.algorithms.server_opt import ServerOptimizer

        return ServerOptimizer
    raise AttributeError(f"module 'fedray.algorithms' has no attribute {name!r}")
