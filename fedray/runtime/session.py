"""Starting or joining Ray for one fedray run, and noticing when it fails under the run.

``runtime.address`` (or RAY_ADDRESS, as set by Ray Jobs; ``auto`` finds a ``ray start`` on
this machine) joins an existing cluster; both are probed first, so an address where nothing
answers ends in one line instead of Ray's minutes of retries, and so does a cluster with
token authentication that refuses this machine's token, or gets none (``token_refusal``:
Ray itself retries for 20 s, logging a line a second, and then says only that it failed to
connect). Otherwise a private local Ray
starts with ``runtime.num_cpus`` / ``runtime.num_gpus`` (a declared GPU count works on
machines without one, which is how fractional placement is tested) and
``runtime.object_store_mb``, without a dashboard or job server unless ``runtime.dashboard``
asks for them, and then listening on ``runtime.dashboard_host`` (loopback by default);
without a dashboard it also starts without the dashboard's head process and the
autoscaler's monitor, and with the dashboard agent's minimal mode (``_lean_start``: seconds
of a short run's start-up). A Ray that was already initialised by the caller is reused and
left running.

A private Ray listens on loopback only: its GCS server, raylet, object manager, workers,
dashboard agent, metrics exporter and runtime-env agent are nobody else's business, and
Ray's gRPC services are unauthenticated. Ray binds them to loopback when the node's address
is a loopback one, but turns ``ray.init(_node_ip_address="127.0.0.1")`` into the machine's
routable address (``resolve_ip_for_localhost``); what it does honour is its local-only mode,
the one it uses on macOS and Windows (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``), which
``_loopback_only`` switches on while ``ray.init`` starts the processes.

What Ray does to the calling process beyond that is undone or bounded here: ``ray.init``
replaces the process's SIGTERM handler with one that dumps a C++ stack and aborts, so the
caller's handlers are put back (the CLI's turns SIGTERM into an orderly stop); Ray's
coloured ``(Driver pid=...)`` prefixes are plain text unless both output streams are
terminals; and a private instance gets a reaper (fedray.runtime.reaper), so its processes end with
the process that started them, even after ``kill -9``.

A private instance also gets a health watch (``_Health``): when its GCS server or raylet
dies, Ray itself would leave the run waiting (a dead GCS takes the raylet down a minute
later; a dead raylet surfaces as an actor error a quarter of a minute later, after pages of
the raylet's log), so ``get`` -- how fedray.run waits for its driver -- ends at once with a
``RayFailure`` naming what died, Ray's console output is silenced from then on, and the
rest of that Ray is ended whole (fedray.run adds which checkpoint is intact and the resume
command).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

from fedray.config import RuntimeConfig
from fedray.errors import FedrayError, key_error, one_line
from fedray.runtime import reaper as reapers

POLL_S = 0.2  # how often the health watch looks, and how long get() waits between looks
# Ray's switch for its local-only mode (ray._private.ray_constants.ENABLE_RAY_CLUSTER)
LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


class RayFailure(FedrayError):
    """The Ray under a run failed: its GCS server or raylet died, or the driver actor's
    process did. fedray.run turns it into one line with the resume command."""


def probe(address: str, timeout_s: float = 5.0, source: str = "runtime.address") -> None:
    """Fail fast when a ``host:port`` (or ``ray://host:port``) address does not answer: Ray
    itself retries an unreachable GCS for minutes, logging as it goes. ``source`` is where
    the address came from: the config key, or ``RAY_ADDRESS`` (the environment)."""
    def error(problem: str, got: bool = False) -> FedrayError:
        if source == "RAY_ADDRESS":
            return FedrayError(f"RAY_ADDRESS={address} (from the environment): {problem}; "
                               "unset RAY_ADDRESS to start a private Ray, or set "
                               "runtime.address")
        return key_error(source, problem, address) if got else key_error(source, problem)

    if source == "RAY_ADDRESS" and address.startswith(("http://", "https://")):
        raise error("that is a job server's address (fedray submit's), not a Ray cluster's "
                    "(host:port, ray://host:port or auto)")
    if address in ("auto", "local") or "://" in address and not address.startswith("ray://"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise error("must be host:port, ray://host:port or auto", got=True)
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise error(f"cannot reach Ray at {address}: {reason}") from None
    if not address.startswith("ray://"):  # a GCS; Ray Client's server is another protocol
        if _gcs_refuses(f"{host}:{port}", timeout_s):
            where = f"the Ray cluster at {address}"
            problem = token_refusal(where)
            raise (FedrayError(f"RAY_ADDRESS (from the environment): {problem}")
                   if source == "RAY_ADDRESS" else key_error(source, problem))


TOKEN_DOC = "docs/cluster.md"
_GET_TOKEN = "ray get-auth-token prints it on the head"


def token_source() -> tuple[str | None, str | None]:
    """Where Ray takes this machine's token from, as Ray looks (RAY_AUTH_TOKEN, else the
    file RAY_AUTH_TOKEN_PATH names, else ~/.ray/auth_token; a RAY_AUTH_TOKEN_PATH that names
    no file is an error to Ray, not a fall-through), and what is wrong when there is none:
    ``(source, None)`` or ``(None, problem)``. Only names and paths: the token itself is
    never read here, so no message can carry it."""
    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return "RAY_AUTH_TOKEN", None
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if path:
        full = os.path.expanduser(path)
        if os.path.isfile(full) and os.path.getsize(full) > 0:
            return path, None
        return None, f"RAY_AUTH_TOKEN_PATH names {path}, which is missing or empty"
    default = os.path.join(os.path.expanduser("~"), ".ray", "auth_token")
    if os.path.isfile(default) and os.path.getsize(default) > 0:
        return "~/.ray/auth_token", None
    return None, "neither RAY_AUTH_TOKEN nor ~/.ray/auth_token holds one"


def token_refusal(where: str) -> str:
    """Why ``where`` ("the Ray cluster at URL") refused this machine, and the fix, for a
    cluster with token authentication that refused it. The cluster's answer does not say
    whether a token came (its gRPC servers say "missing or incorrect"), so this machine's
    own settings decide: Ray sends a token only with RAY_AUTH_MODE=token, even when one is
    in RAY_AUTH_TOKEN or ~/.ray/auth_token (a ``ray start --head`` turns the mode on by itself
    when it finds the file; ``ray start --address``, ``ray.init(address=...)`` and the job
    client do not), so without the mode none was sent; with it, the one sent was wrong, or
    there was none to send. No "token:" in the text: fedray.state.redact.mask would take
    the word after it for a credential."""
    source, problem = token_source()
    fix = (f"put the cluster's token ({_GET_TOKEN}) in ~/.ray/auth_token or RAY_AUTH_TOKEN "
           f"({TOKEN_DOC})")
    if os.environ.get("RAY_AUTH_MODE", "").strip().lower() != "token":
        if source is not None:
            return (f"{where} requires token authentication and this machine sent no token, "
                    f"as Ray sends the one in {source} only with RAY_AUTH_MODE=token; export "
                    f"RAY_AUTH_MODE=token ({TOKEN_DOC})")
        return (f"{where} requires token authentication and this machine sent no token; "
                f"export RAY_AUTH_MODE=token and {fix}")
    if source is None:
        path = os.environ.get("RAY_AUTH_TOKEN_PATH")
        if path:  # Ray reads that file and no other
            fix = f"put the cluster's token ({_GET_TOKEN}) in {path} ({TOKEN_DOC})"
        return (f"RAY_AUTH_MODE=token, but this machine has no token to send to {where}: "
                f"{problem}; {fix}")
    replace = ("set RAY_AUTH_TOKEN to the cluster's token" if source == "RAY_AUTH_TOKEN"
               else f"put the cluster's token in {source}")
    return (f"{where} refused this machine's token (from {source}): it is not the "
            f"cluster's; {replace} ({_GET_TOKEN}; {TOKEN_DOC})")


def _gcs_refuses(target: str, timeout_s: float) -> bool:
    """Whether the GCS server at ``target`` (host:port) refuses this machine's token, asked
    the way ``ray.init`` first asks it (its cluster id), with the header Ray would send.
    Without the token a GCS answers
    UNAUTHENTICATED at once, while ``ray.init`` retries for 20 s and then raises a
    ConnectionError that does not mention authentication. A local RAY_AUTH_MODE=token with
    no token to send is the same refusal (``ray.init`` would raise AuthenticationError).
    Anything else -- a Ray without token authentication, a server that is not a GCS, a
    timeout -- is left to ``ray.init`` to report."""
    try:
        import grpc
        from ray._raylet import AuthenticationTokenLoader
        from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc
    except ImportError:  # a Ray without token authentication
        return False
    try:
        header = AuthenticationTokenLoader.instance().get_token_for_http_header()
    except Exception:  # AuthenticationError: token mode, and no token here
        return True
    try:
        with grpc.insecure_channel(target) as channel:
            gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(
                gcs_service_pb2.GetClusterIdRequest(), timeout=timeout_s,
                metadata=tuple(header.items()))
    except grpc.RpcError as exc:
        return exc.code() == grpc.StatusCode.UNAUTHENTICATED
    except Exception:  # a probe: ray.init says what is wrong, if anything
        return False
    return False


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
def _loopback_only() -> Iterator[None]:
    """Ray's local-only mode while ``ray.init`` starts a private instance: the node's
    address is loopback, so every server Ray starts binds to loopback. Ray reads the mode
    from ray_constants when it picks the node's address (set here, since Ray may have been
    imported before) and its Python processes from the environment (set for the processes
    ``ray.init`` starts; the workers inherit the raylet's). Both are put back afterwards:
    joining a cluster later in this process is unaffected."""
    from ray._private import ray_constants

    saved_env = os.environ.get(LOCAL_ONLY_ENV)
    saved = ray_constants.ENABLE_RAY_CLUSTER
    os.environ[LOCAL_ONLY_ENV] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved
        if saved_env is None:
            os.environ.pop(LOCAL_ONLY_ENV, None)
        else:
            os.environ[LOCAL_ONLY_ENV] = saved_env


def _silent(*args: Any, **kwargs: Any) -> None:
    return None


def _no_dashboard(*args: Any, **kwargs: Any) -> ImportError:
    return ImportError("fedray: a private Ray without a dashboard")


@contextlib.contextmanager
def _lean_start() -> Iterator[None]:
    """A private Ray without a dashboard, started without what no fedray run uses (start-up
    time: docs/performance.md, "Start-up by phase"), while ``ray.init`` starts it:

    - the dashboard head (``Node.start_api_server``). Without a dashboard it loads only the
      usage-stats module, and usage stats are off here; yet ``ray.init`` waits for it to boot
      (Python, aiohttp, grpc) before it starts the raylet.
    - the autoscaler's monitor (``Node.start_monitor``): one node of fixed size has nothing
      to scale, and ``ray.shutdown`` waits about a second for it to end.
    - Ray's check that the dashboard's packages are installed
      (``utils.get_dashboard_dependency_error``), answered "not installed": this process
      then does not import aiohttp, opentelemetry, prometheus_client and pydantic only to
      check they are there, and the raylet's dashboard agent starts in its minimal mode, with
      no HTTP or gRPC server (nothing reads them without a dashboard) and so no fixed port
      (52365) to wait for when another Ray on the machine holds it.

    Each is put back afterwards; where Ray no longer has one of them, it is left alone."""
    from ray._private import node, utils

    patches = [(node.Node, "start_api_server", _silent), (node.Node, "start_monitor", _silent),
               (utils, "get_dashboard_dependency_error", _no_dashboard)]
    saved = [(owner, name, owner.__dict__[name]) for owner, name, _ in patches
             if name in owner.__dict__]
    for owner, name, replacement in patches:
        if name in owner.__dict__:
            setattr(owner, name, replacement)
    try:
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


class _Health:
    """Watches the GCS server and the raylet of the private Ray this process started, from
    a daemon thread, every POLL_S. The first to die is recorded in ``failure``; from then
    on Ray's console output in this process is silenced (its error listener would print the
    dead raylet's last log pages, and its teardown more), since the run ends with one line."""

    NAMES = {"gcs_server": "GCS server", "raylet": "raylet"}

    def __init__(self, procs: dict[str, Any]):
        self.procs = procs  # {"raylet": psutil.Process, ...}
        self.failure: str | None = None
        self._stop = threading.Event()
        self._printer: Any = None
        self._thread = threading.Thread(target=self._watch, name="fedray-ray-health",
                                        daemon=True)
        self._thread.start()

    @classmethod
    def start(cls, ray_dir: str) -> _Health | None:
        """A watch over this process's Ray GCS server and raylet (its children running
        Ray's binaries); None where they cannot be found (psutil missing, another layout)."""
        try:
            import psutil

            procs = {}
            for child in psutil.Process().children(recursive=True):
                with contextlib.suppress(psutil.Error, IndexError):
                    exe = child.cmdline()[0]
                    name = os.path.basename(exe)
                    if name in cls.NAMES and exe.startswith(ray_dir):
                        procs[name] = child
        except ImportError:
            return None
        return cls(procs) if len(procs) == len(cls.NAMES) else None

    def _alive(self, proc: Any) -> bool:
        import psutil

        try:
            return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def _watch(self) -> None:
        while not self._stop.wait(POLL_S):
            for name, proc in self.procs.items():
                if not self._alive(proc):
                    self._mute()
                    self.failure = (f"fedray's private Ray failed: its {self.NAMES[name]} "
                                    f"(process {proc.pid}) died")
                    return

    def _mute(self) -> None:
        with contextlib.suppress(ImportError, AttributeError):
            from ray._private import worker as ray_worker

            self._printer = ray_worker.print_to_stdstream  # looked up per message
            ray_worker.print_to_stdstream = _silent
            ray_worker.global_worker_stdstream_dispatcher.remove_handler("ray_print_logs")

    def settle(self, timeout_s: float = 1.0) -> str | None:
        """The failure, waiting up to ``timeout_s`` for the watch to notice one: an actor
        error may reach the caller a moment before the dead raylet behind it is seen."""
        deadline = time.monotonic() + timeout_s
        while self.failure is None and time.monotonic() < deadline and \
                self._thread.is_alive():
            time.sleep(POLL_S / 4)
        return self.failure

    def stop(self) -> None:
        """Stop watching: an orderly shutdown ends the processes on purpose."""
        self._stop.set()
        self._thread.join(timeout=5)

    def unmute(self) -> None:
        """Give Ray its console output back, once the session is over."""
        if self._printer is not None:
            from ray._private import worker as ray_worker

            ray_worker.print_to_stdstream = self._printer
            self._printer = None


_HEALTH: _Health | None = None  # the watch over the private Ray this process started


def get(ref: Any) -> Any:
    """``ray.get(ref)``, but in slices of POLL_S while this process's private Ray is
    watched, so that the death of its GCS server or raylet ends the wait at once with a
    RayFailure rather than after Ray's own timeouts."""
    import ray

    health = _HEALTH
    if health is None:
        return ray.get(ref)
    while True:
        if health.failure is not None:
            raise RayFailure(health.failure)
        ready, _ = ray.wait([ref], timeout=POLL_S)
        if ready:
            return ray.get(ref)


def actor_lost(exc: BaseException, what: str) -> RayFailure:
    """A Ray error that says the process of an actor (``what``: "the driver actor") is
    gone, as the one line it deserves: the private Ray's own failure where that is the cause
    (a dead raylet takes its actors with it), Ray's memory monitor where it killed it."""
    from ray import exceptions as rx

    health = _HEALTH
    if health is not None and health.settle() is not None:
        return RayFailure(health.failure)
    text = str(exc)
    if isinstance(exc, rx.OutOfMemoryError) or "low on memory" in text:
        return RayFailure(f"{what} was killed by Ray's memory monitor: this machine ran low on "
                          "memory (fewer or smaller workers, runtime.worker.cache_mb, or a "
                          "machine with more memory)")
    return RayFailure(f"{what} died ({type(exc).__name__}: {one_line(exc)})")


def kill_actors(actors: Iterable[Any]) -> None:
    """End a run's actors; nothing to do when the private Ray itself failed (the session
    ends its processes whole, and asking a dead GCS would wait for its timeouts)."""
    import ray

    if _HEALTH is not None and _HEALTH.failure is not None:
        return
    for actor in actors:
        with contextlib.suppress(Exception):  # already gone: nothing to end
            ray.kill(actor)


def _init_failure(exc: BaseException, address: str | None, private: bool) -> FedrayError:
    """ray.init's failure as one line: Ray raises whatever it meets (ValueError for an object
    store below its minimum or above /dev/shm, a bare Exception when the raylet does not
    register in time, ConnectionError for a cluster that is not there)."""
    if private:
        return FedrayError(f"cannot start a private Ray: {one_line(exc)}")
    if type(exc).__name__ == "AuthenticationError":  # ray.exceptions': a token problem
        where = address or os.environ.get("RAY_ADDRESS") or "auto"
        problem = token_refusal(f"the Ray cluster at {where}")
        return (key_error("runtime.address", problem) if address else
                FedrayError(f"RAY_ADDRESS (from the environment): {problem}"))
    if address:
        return key_error("runtime.address", f"cannot start or reach Ray at {address}: "
                         f"{one_line(exc)}")
    return FedrayError(f"RAY_ADDRESS={os.environ.get('RAY_ADDRESS')} (from the environment): "
                       f"cannot reach Ray: {one_line(exc)}")


@contextlib.contextmanager
def ray_session(runtime: RuntimeConfig) -> Iterator[None]:
    """Ray for a job: joined at ``runtime.address`` (or the RAY_ADDRESS Ray Jobs sets), or a
    private local instance sized by ``runtime`` and ended when the job is."""
    global _HEALTH
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    if ray.is_initialized():
        yield
        return
    _plain_log_prefixes()
    kwargs: dict = {"logging_level": logging.ERROR, "include_dashboard": False}
    address = runtime.address
    inherited = os.environ.get("RAY_ADDRESS") if not address else None
    if address:
        probe(address)
        kwargs["address"] = address
    elif inherited and inherited != "local":  # Ray Jobs' entrypoint joins its cluster
        probe(inherited, source="RAY_ADDRESS")
    else:  # a private instance, even if `ray start` ran here
        rt = runtime
        kwargs.update(address="local", num_cpus=rt.num_cpus, num_gpus=rt.num_gpus,
                      include_dashboard=rt.dashboard, dashboard_host=rt.dashboard_host)
        if rt.object_store_mb is not None:
            kwargs["object_store_memory"] = int(rt.object_store_mb) * 2**20
    private = kwargs.get("address") == "local"
    ray_dir = os.path.dirname(ray.__file__)
    reaper = None
    if private:  # before init: what init starts is ours to end
        reaper = reapers.start(ray_dir)
    handlers = _signal_handlers()
    try:
        try:
            with contextlib.ExitStack() as stack:
                if private:
                    stack.enter_context(_loopback_only())
                    if not kwargs["include_dashboard"]:
                        stack.enter_context(_lean_start())
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
        if isinstance(exc, Exception) and not isinstance(exc, FedrayError):
            raise _init_failure(exc, address, private) from None
        raise
    health = _Health.start(ray_dir) if private else None
    _HEALTH = health
    try:
        yield
    finally:
        _HEALTH = None
        if health is not None:
            health.stop()
        if health is not None and health.failure is not None and reaper is not None:
            reaper.stop()  # the broken Ray's processes first: shutdown finds none to wait for
        ray.shutdown()
        if reaper is not None:
            reaper.stop()
        if health is not None:
            health.unmute()


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
