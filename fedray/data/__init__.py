"""Federated data sources: what a worker reads when it trains a virtual client."""

__all__ = ["ClientCache", "ClientSource", "Dataset", "MemorySource", "SyntheticFEMNIST",
           "build_source", "from_arrays", "from_hf_disk", "from_table"]

_MODULE = {"ClientCache": "source", "ClientSource": "source", "MemorySource": "source",
           "build_source": "source", "SyntheticFEMNIST": "synthetic", "Dataset": "dataset",
           # your own data -> Dataset -> .partition(...) -> .write_store(url) (docs/api.md)
           "from_arrays": "arrays", "from_table": "table", "from_hf_disk": "hf_disk"}


def __getattr__(name: str):
    # the sources import torch; the loaders and the store's manifest checks, which
    # `fedray run` and `fedray partition` use to reject bad input first, do not need it
    if name in _MODULE:
        import importlib

        return getattr(importlib.import_module(f"fedray.data.{_MODULE[name]}"), name)
    raise AttributeError(f"module 'fedray.data' has no attribute {name!r}")
