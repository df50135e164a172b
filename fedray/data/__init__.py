"""Federated data sources: what a worker reads when it trains a virtual client."""

__all__ = ["ClientCache", "ClientSource", "MemorySource", "SyntheticFEMNIST", "build_source"]

_MODULE = {"ClientCache": "source", "ClientSource": "source", "MemorySource": "source",
           "build_source": "source", "SyntheticFEMNIST": "synthetic"}


def __getattr__(name: str):
    # the sources import torch; the loaders and the store's manifest checks, which
    # `fedray run` and `fedray partition` use to reject bad input first, do not need it
    if name in _MODULE:
        import importlib

        return getattr(importlib.import_module(f"fedray.data.{_MODULE[name]}"), name)
    raise AttributeError(f"module 'fedray.data' has no attribute {name!r}")
