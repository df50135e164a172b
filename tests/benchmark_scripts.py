"""A benchmark script (benchmarks/ is not a package) loaded as a module for its tests."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

BENCHMARKS = os.path.join(os.path.dirname(__file__), "..", "benchmarks")


@contextmanager
def loaded(name: str) -> Iterator[ModuleType]:
    """benchmarks/NAME.py as the module ``bench_NAME``, registered in sys.modules while in
    use (its dataclasses look their module up there), removed after."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}",
                                                  os.path.join(BENCHMARKS, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)
