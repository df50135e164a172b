"""Starting or joining Ray for one fedray run.

``runtime.address`` (or RAY_ADDRESS, as set by Ray Jobs; ``auto`` finds a ``ray start`` on
this machine) joins an existing cluster; otherwise a private local Ray starts with
``runtime.num_cpus`` / ``runtime.num_gpus`` (a declared GPU count works on machines without
one, which is how fractional placement is tested), without a dashboard or job server unless
``runtime.dashboard`` asks for them, and then listening on ``runtime.dashboard_host``
(loopback by default). A Ray that was already initialised by the
caller is reused and left running.

What Ray does to the calling process beyond that is undone or bounded here: ``ray.init``
replaces the process's SIGTERM handler with one that dumps a C++ stack and aborts, so the
caller's handlers are put back (the CLI's turns SIGTERM into an orderly stop); Ray's
coloured ``(Driver pid=...)`` prefixes are plain text unless both output streams are
terminals; and a private instance gets a reaper (fedray.runtime.reaper), so its processes end with
the process that started them, even after ``kill -9``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator

from omegaconf import DictConfig

from fedray.errors import key_error, one_line


def probe(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast when a ``host:port`` (or ``ray://host:port``) address does not answer: Ray
    itself retries an unreachable GCS for minutes, logging as it goes."""
    if address in ("auto", "local") or "://" in address and not address.startswith("ray://"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise key_error("runtime.address", "must be host:port, ray://host:port or auto",
                        address)
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise key_error("runtime.address", f"cannot reach Ray at {address}: {reason}") from None


def _signal_handlers() -> dict[int, object]:
    """The process's SIGINT and SIGTERM handlers, where this thread may set them."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}


def _restore(handlers: dict[int, object]) -> None:
    for sig, handler in handlers.items():
        if handler is not None:  # None: set outside Python, nothing to put back
            signal.signal(sig, handler)


def _uncoloured(msg: str) -> str:
    return msg


def _plain_log_prefixes() -> None:
    """Ray colours the prefix of lines its actors print; escape codes belong on a terminal,
    not in a redirected log (RAY_COLOR_PREFIX=0 is Ray's switch; NO_COLOR the convention)."""
    ttys = all(getattr(stream, "isatty", lambda: False)() for stream in (sys.stdout,
                                                                           sys.stderr))
    if not ttys or os.environ.get("NO_COLOR"):
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")
        # the "[repeated Nx across cluster]" note of Ray's log deduplication is coloured
        # whatever RAY_COLOR_PREFIX says; Ray has no switch for it (ray 2.x formats it with
        # ray._private.ray_logging._color): plain text where Ray still has that function
        with contextlib.suppress(ImportError, AttributeError):
            from ray._private import ray_logging

            if callable(ray_logging._color):
                ray_logging._color = _uncoloured


@contextlib.contextmanager
def ray_session(cfg: DictConfig) -> Iterator[None]:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    if ray.is_initialized():
        yield
        return
    _plain_log_prefixes()
    kwargs: dict = {"logging_level": logging.ERROR, "include_dashboard": False}
    address = cfg.runtime.address
    if address:
        probe(address)
        kwargs["address"] = address
    elif not os.environ.get("RAY_ADDRESS"):  # a private instance, even if `ray start` ran here
        kwargs.update(address="local", num_cpus=cfg.runtime.num_cpus,
                      num_gpus=cfg.runtime.num_gpus, include_dashboard=cfg.runtime.dashboard,
                      dashboard_host=cfg.runtime.dashboard_host)
    reaper = None
    if kwargs.get("address") == "local":  # before init: what init starts is ours to end
        from fedray.runtime import reaper as reapers

        reaper = reapers.start(os.path.dirname(ray.__file__))
    handlers = _signal_handlers()
    try:
        try:
            ray.init(**kwargs)
        finally:
            _restore(handlers)
    except BaseException as exc:
        with contextlib.suppress(Exception):
            ray.shutdown()  # whatever init had started
        if reaper is not None:
            reaper.stop()
        if isinstance(exc, SystemExit) and exc.code == signal.SIGTERM and handlers:
            # Ray's own SIGTERM handler, in place while ray.init runs, exits with the
            # signal's number: the signal goes to the caller's handler instead
            os.kill(os.getpid(), signal.SIGTERM)
        if isinstance(exc, ConnectionError | TimeoutError | RuntimeError):
            where = address or os.environ.get("RAY_ADDRESS") or "a local Ray"
            raise key_error("runtime.address", f"cannot start or reach Ray at {where}: "
                            f"{one_line(exc)}") from None
        raise
    try:
        yield
    finally:
        ray.shutdown()
        if reaper is not None:
            reaper.stop()


def private_mb() -> float:
    """Resident memory of this process that is its own (RSS less shared pages), in MiB.

    Plain RSS also counts object-store pages a process maps when it reads a broadcast or a
    partial sum; those are shared memory, owned by the store, and not the process's growth.
    """
    import psutil

    info = psutil.Process().memory_info()
    return (info.rss - getattr(info, "shared", 0)) / 2**20


def keep_freed_memory() -> bool:
    """Have glibc keep freed tensor memory in the process instead of returning it to the OS.

    By default glibc serves every allocation above its mmap threshold with a fresh mapping
    and gives small heap tops back: a worker stepping a group of clients allocates tens of
    MB per step (gradients, gathered batches) and pays a page fault for every 4 KB of it,
    again each step, which made a vectorized group markedly slower (docs/performance.md,
    "Vectorized clients"). The cost is that a worker keeps up to 256 MiB of free memory
    mapped after its largest step, in each malloc arena a thread of it allocates from: the
    reason a worker reads ahead on one long-lived thread (ClientWorker._reader). Linux glibc
    only; False where it does not apply."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    # 32 MiB is glibc's largest mmap threshold on 64-bit machines
    return bool(mallopt(m_mmap_threshold, 32 << 20)) and bool(mallopt(m_trim_threshold,
                                                                      256 << 20))
