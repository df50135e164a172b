"""fedray: Ray-based simulation of cross-device federated learning.

The stable Python entry point is ``fedray.run`` (see docs/api.md).
"""

__version__ = "0.1.0"

from fedray.api import RunResult, run  # noqa: E402

__all__ = ["RunResult", "run", "__version__"]
