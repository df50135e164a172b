"""fedray: Ray-based simulation of cross-device federated learning.

The stable Python entry point is ``fedray.run`` (see docs/api.md).
"""

from fedray.version import __version__

__all__ = ["STOP", "Callback", "RunResult", "run", "__version__"]


def __getattr__(name: str):
    # imported when asked for (start-up time): fedray.run pulls in torch, which takes
    # seconds; the CLI's --help, --version and the errors it reports before a job starts
    # do not need it
    if name in ("run", "RunResult"):
        from fedray import api

        return getattr(api, name)
    if name in ("Callback", "STOP"):
        from fedray.tracking import callbacks

        return getattr(callbacks, name)
    raise AttributeError(f"module 'fedray' has no attribute {name!r}")
