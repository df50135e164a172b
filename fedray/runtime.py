"""Starting or joining Ray for one fedray run.

``runtime.address`` (or RAY_ADDRESS, as set by Ray Jobs; ``auto`` finds a ``ray start`` on
this machine) joins an existing cluster; otherwise a private local Ray starts with
``runtime.num_cpus`` / ``runtime.num_gpus`` (a declared GPU count works on machines without
one, which is how fractional placement is tested). A Ray that was already initialised by the
caller is reused and left running.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

from omegaconf import DictConfig

from fedray.errors import FedrayError


@contextlib.contextmanager
def ray_session(cfg: DictConfig) -> Iterator[None]:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    if ray.is_initialized():
        yield
        return
    kwargs: dict = {"logging_level": logging.ERROR, "include_dashboard": False}
    address = cfg.runtime.address
    if address:
        kwargs["address"] = address
    elif not os.environ.get("RAY_ADDRESS"):  # a private instance, even if `ray start` ran here
        kwargs.update(address="local", num_cpus=cfg.runtime.num_cpus,
                      num_gpus=cfg.runtime.num_gpus)
    try:
        ray.init(**kwargs)
    except (ConnectionError, TimeoutError, RuntimeError) as exc:
        where = address or os.environ.get("RAY_ADDRESS") or "a local Ray"
        raise FedrayError(f"runtime.address: cannot start or reach Ray at {where}: "
                          f"{str(exc).splitlines()[0]}") from None
    try:
        yield
    finally:
        ray.shutdown()


def private_mb() -> float:
    """Resident memory of this process that is its own (RSS less shared pages), in MiB.

    Plain RSS also counts object-store pages a process maps when it reads a broadcast or a
    partial sum; those are shared memory, owned by the store, and not the process's growth.
    """
    import psutil

    info = psutil.Process().memory_info()
    return (info.rss - getattr(info, "shared", 0)) / 2**20
