"""Federated algorithms as compositions of parts: client work x aggregator x server optimizer,
the selector that decides who takes part, and the update stages every client's update
passes through.

One module per family (fedavg, fedprox, scaffold, elastic, ...); each registers its parts
and presets when imported, and every module of this package is imported when a job is
resolved (registry.load_builtins), so a new family is one new module here and nothing else.
docs/algorithms.md describes each.

The API they are written against is fedray.algorithms.base (docs/algorithms.md); names and
import paths are resolved by fedray.algorithms.registry. Importing this package imports no
torch; the family modules do.
"""

from __future__ import annotations

from typing import Any

from fedray.algorithms import registry
from fedray.algorithms.registry import (
    Algorithm,
    load_builtins,
    register,
    register_preset,
    resolve,
)

__all__ = ["PRESETS", "Aggregator", "Algorithm", "ClientContext", "ClientFeedback",
           "ClientOptimizer", "ClientRows", "ClientWork", "ClipNorm", "GradTransform",
           "LocalTerms", "LocalUpdate", "Normalize", "PartialSum", "Payload", "Phase",
           "RoundPlan", "SelectionContext", "Selector", "ServerOptimizer", "UpdateStage",
           "WorkerEnv", "load_builtins", "register", "register_preset", "require", "resolve"]

_BASE = {"Aggregator", "ClientContext", "ClientFeedback", "ClientOptimizer", "ClientRows",
         "ClientWork", "ClipNorm", "GradTransform", "LocalTerms", "LocalUpdate", "Normalize",
         "PartialSum", "Payload", "Phase", "RoundPlan", "SelectionContext", "Selector",
         "UpdateStage", "WorkerEnv", "require"}


def __getattr__(name: str) -> Any:  # the API classes import torch: only when asked for
    if name == "PRESETS":  # every preset, once the families have registered theirs

        registry.load_builtins()
        return registry.PRESETS
    if name in _BASE:
        # imported when used, not at the top: it loads torch (start-up time)
        from fedray.algorithms import base

        return getattr(base, name)
    if name == "ServerOptimizer":
        # imported when used, not at the top: it loads torch (start-up time)
        from fedray.algorithms.server_opt import ServerOptimizer

        return ServerOptimizer
    raise AttributeError(f"module 'fedray.algorithms' has no attribute {name!r}")
