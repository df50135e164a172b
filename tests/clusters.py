"""Ray clusters started by tests: separate processes, on 127.0.0.1 only, and stopped by
killing exactly the processes they started (never `ray stop`, which would stop every Ray on
the machine, another session's included).

``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` makes Ray take the loopback address as every node's
IP (it is what Ray does on a laptop), so the fake autoscaler's worker nodes, which get no
``--node-ip-address``, stay on 127.0.0.1 as well. Processes that join a cluster started here
need ``client_env()``; ``LocalNode`` adds a worker node of its own (``ray start --address``),
with the head's token or, to see a refused one, another environment.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

# token authentication (Ray's default for a new cluster) with a token of the test's own, so
# that nothing is read from or written to ~/.ray; clients are given the same environment
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0",
                "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def client_env(**extra: str) -> dict[str, str]:
    """The environment of a process joining a test cluster (loopback, the token)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(LOOPBACK_ENV, **extra)
    # as in an activated virtual environment: `python` (a Ray job's entrypoint) is this one
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def _ray_cli() -> str:
    return str(Path(sys.executable).with_name("ray"))


class _RayStart:
    """A ``ray start --block`` process in its own session, with its own temp dir and log,
    stopped by signalling exactly it and what it started."""

    proc: subprocess.Popen
    temp_dir: str
    log: object
    _config_file: str | None = None

    def _start(self, cmd: list[str], env: dict[str, str]) -> None:
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def output(self) -> str:
        """What ``ray start`` printed so far."""
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def listening(self) -> set[str]:
        """The addresses this node's processes listen on (TCP), to check they are loopback."""
        out = set()
        for p in [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(
                recursive=True)]:
            try:
                out |= {c.laddr.ip for c in p.net_connections("tcp")
                        if c.status == psutil.CONN_LISTEN}
            except psutil.Error:
                continue
        return out

    def stop(self) -> None:
        """SIGTERM the process (Ray then stops what it started), then SIGKILL any process
        it started that is still there -- found as its descendants before the SIGTERM."""
        try:
            started = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            started = []
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for p in started:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(started, timeout=10)
        if self._config_file:
            os.unlink(self._config_file)
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class LocalHead(_RayStart):
    """``ray start --head --block`` on 127.0.0.1 with free ports, in its own session."""

    def __init__(self, num_cpus: float, *, dashboard: bool = False, port: int | None = None,
                 autoscaling_config: dict | None = None, extra_env: dict | None = None):
        self.port = port or free_port()
        self.dashboard_port = free_port() if dashboard else None
        self.address = f"127.0.0.1:{self.port}"
        self.env = client_env(**(extra_env or {}))
        # its own temp dir: `ray start` records the cluster there (ray_current_cluster),
        # not in /tmp/ray, where a later ray.init() would find it and try to join
        self.temp_dir = tempfile.mkdtemp(prefix="fr", dir="/tmp")  # short: socket paths
        cmd = [_ray_cli(), "start", "--head", "--block", "--node-ip-address=127.0.0.1",
               f"--temp-dir={self.temp_dir}",
               f"--port={self.port}", f"--num-cpus={num_cpus}", "--num-gpus=0",
               "--disable-usage-stats"]
        if dashboard:  # the job agent's port too: its default (52365) may be another
            # Ray's on this machine, and then jobs find "no available agent"
            cmd += ["--include-dashboard=true", "--dashboard-host=127.0.0.1",
                    f"--dashboard-port={self.dashboard_port}",
                    f"--dashboard-agent-listen-port={free_port()}"]
        else:
            cmd += ["--include-dashboard=false"]
        self._config_file = None
        if autoscaling_config is not None:
            fd, self._config_file = tempfile.mkstemp(suffix=".json")
            with os.fdopen(fd, "w") as f:
                json.dump(autoscaling_config, f)
            cmd.append(f"--autoscaling-config={self._config_file}")
        self._start(cmd, self.env)
        self._wait_ready()

    @property
    def job_server(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def _wait_ready(self, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                said = self.output()[-2000:]
                self.stop()
                raise RuntimeError(f"ray start exited: {said}")
            ports = [self.port] + ([self.dashboard_port] if self.dashboard_port else [])
            if all(_listening(p) for p in ports):
                return
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"the Ray head on {self.address} did not start in {timeout_s:.0f}s")

    def __enter__(self) -> LocalHead:
        return self


# `ray start --address` in local-only mode: Ray refuses to add a node there ("Multi-node Ray
# clusters are not supported on Windows and OSX"), and outside it turns the node's
# --node-ip-address=127.0.0.1 into the machine's routable address. This process lets the
# node join and keeps its address as given; the environment keeps local-only mode on for
# every process the node starts, so they bind to loopback as the head's do.
_JOIN = """
import sys
import ray._private.services as services
from ray._private import ray_constants
ray_constants.ENABLE_RAY_CLUSTER = True
services.resolve_ip_for_localhost = lambda host: host
from ray.scripts.scripts import main
sys.argv = ["ray", *sys.argv[1:]]
main()
"""


class LocalNode(_RayStart):
    """A worker node joining ``head`` (``ray start --address --block``, run by ``_JOIN``) on
    127.0.0.1, with free ports for its agents (another Ray on this machine may hold the
    defaults). ``env`` replaces the head's environment: a node without the head's token is
    refused by its GCS, which Ray retries for about 20 s before ``ray start`` gives up.
    ``wait``: return once the node has started (its ``ray start`` says so), else at once."""

    READY = "Ray runtime started"

    def __init__(self, head: LocalHead, num_cpus: float, *, env: dict | None = None,
                 wait: bool = True):
        self.temp_dir = tempfile.mkdtemp(prefix="frn", dir="/tmp")  # short: socket paths
        cmd = [sys.executable, "-c", _JOIN, "start", f"--address={head.address}", "--block",
               "--node-ip-address=127.0.0.1", f"--temp-dir={self.temp_dir}",
               f"--num-cpus={num_cpus}", "--num-gpus=0", "--disable-usage-stats",
               f"--dashboard-agent-listen-port={free_port()}",
               f"--dashboard-agent-grpc-port={free_port()}",
               f"--runtime-env-agent-port={free_port()}", f"--metrics-export-port={free_port()}"]
        self._start(cmd, head.env if env is None else env)
        if wait:
            self.wait_started()

    def wait_started(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.READY in self.output():
                return
            if self.proc.poll() is not None:
                said = self.output()[-2000:]
                self.stop()  # what it started, and its temp dir
                raise RuntimeError(f"ray start --address exited: {said}")
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"the worker node did not start in {timeout_s:.0f}s")

    def __enter__(self) -> LocalNode:
        return self


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def autoscaling_cluster(worker_node_types: dict, head_cpus: float = 0,
                        idle_timeout_minutes: float = 0.5) -> LocalHead:
    """A fake multi-node autoscaling cluster (Ray's ``AutoscalingCluster`` config, started on
    loopback): the autoscaler adds worker nodes -- real raylets on this machine -- when
    tasks or placement groups need them, and removes idle ones."""
    from ray.cluster_utils import AutoscalingCluster

    port = free_port()

    class Loopback(AutoscalingCluster):
        def _generate_config(self, head_resources, worker_node_types, autoscaler_v2=False,
                             **config_kwargs):
            # Ray's wheel lacks the fake_multi_node/example.yaml this method reads; these
            # are its keys, with the provider pointed at the loopback head
            config = {
                "cluster_name": "fedray-test", "max_workers": 8, "upscaling_speed": 1.0,
                "idle_timeout_minutes": idle_timeout_minutes, "docker": {}, "auth": {},
                "provider": {"type": "fake_multinode", "use_node_id_as_ip": True,
                             "disable_node_updaters": True,
                             "disable_launch_config_check": True,
                             "gcs_address": f"127.0.0.1:{port}"},
                "available_node_types": {
                    **worker_node_types,
                    "ray.head.default": {"resources": head_resources, "node_config": {},
                                         "max_workers": 0}},
                "head_node_type": "ray.head.default",
                "initialization_commands": [], "setup_commands": [],
                "head_setup_commands": [], "worker_setup_commands": [],
                "head_start_ray_commands": [], "worker_start_ray_commands": [],
                "file_mounts": {}, "cluster_synced_files": [],
                "file_mounts_sync_continuously": False, "rsync_exclude": [],
                "rsync_filter": []}
            config.update(config_kwargs)
            return config

    spec = Loopback(head_resources={"CPU": head_cpus}, worker_node_types=worker_node_types)
    return LocalHead(head_cpus, port=port, autoscaling_config=spec._config,
                     extra_env={"RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1"})
