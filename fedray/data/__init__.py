"""Federated data sources: what a worker reads when it trains a virtual client."""

from fedray.data.source import ClientCache, ClientSource, MemorySource, build_source
from fedray.data.synthetic import SyntheticFEMNIST

__all__ = ["ClientCache", "ClientSource", "MemorySource", "SyntheticFEMNIST", "build_source"]
