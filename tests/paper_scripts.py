"""Load a reproduction script under jobs/paper/ as a module, for the tests of its math.

Why one loader: the scripts are not a package (they import ``jobs/paper/common.py`` by path),
and a script that defines dataclasses needs its module registered in ``sys.modules``."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType

ROOT = pathlib.Path(__file__).resolve().parents[1]


def load_paper_script(experiment: str, script: str = "run.py") -> ModuleType:
    """``jobs/paper/<experiment>/<script>`` as the module ``paper_<experiment>`` (run.py) or
    ``paper_<experiment>_<script stem>``: two scripts of one experiment (expalpha_mnist's
    fig2.py and tables89.py) must not replace each other in ``sys.modules``."""
    path = ROOT / "jobs" / "paper" / experiment / script
    if str(path.parent.parent) not in sys.path:
        sys.path.insert(0, str(path.parent.parent))  # jobs/paper/common.py
    name = f"paper_{experiment}" + ("" if script == "run.py" else f"_{path.stem}")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
