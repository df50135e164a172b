"""Federated data: data sets read from their official formats (``sources/``), split into
clients (``partitioners/``), written to and read from a partition store (``store/``), and
transformed per round or per client at run time (``transforms/``); ``recipe`` composes them
for ``fedray partition``, ``client_source`` is what a worker reads a virtual client from.
docs/architecture.md draws the whole data path."""

__all__ = ["ClientCache", "ClientSource", "Dataset", "MemorySource", "SyntheticFEMNIST",
           "build_source", "from_arrays", "from_hf_disk", "from_table"]

_MODULE = {"ClientCache": "client_source", "ClientSource": "client_source",
           "MemorySource": "client_source", "build_source": "client_source",
           "SyntheticFEMNIST": "sources.synthetic", "Dataset": "dataset",
           # your own data -> Dataset -> .partition(...) -> .write_store(url) (docs/api.md)
           "from_arrays": "sources.arrays", "from_table": "sources.table",
           "from_hf_disk": "sources.hf_disk"}


def __getattr__(name: str):
    # the sources import torch; the loaders and the store's manifest checks, which
    # `fedray run` and `fedray partition` use to reject bad input first, do not need it
    if name in _MODULE:
        import importlib

        return getattr(importlib.import_module(f"fedray.data.{_MODULE[name]}"), name)
    raise AttributeError(f"module 'fedray.data' has no attribute {name!r}")
