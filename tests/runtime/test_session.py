"""End-to-end runs through Ray: determinism, placement, the FedAvg arithmetic, the API."""

import json
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from conftest import blobs, fixed_linear, softmax_grad, tiny_job
from safetensors.torch import load_file
from tolerance import ULPS_PER_STEP, f32_atol, merge_ulps
from torch import nn

import fedray
from fedray.errors import FedrayError


def _max_diff(a, b):
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _weights_atol(weights, ulps: float) -> float:
    return f32_atol(*weights.values(), ulps=ulps)


def test_run_directory_contents(ray_cluster, tmp_path):
    res = fedray.run(tiny_job(tmp_path, eval__every=2, eval__federated_clients=5,
                              runtime__worker__vectorize="auto"))
    assert res.summary["vectorized"]  # the default, for logistic regression
    run = tmp_path / "run"
    assert {p.name for p in run.iterdir()} == {"config.yaml", "metrics.jsonl", "summary.json",
                                                "model.safetensors", "server_state.safetensors",
                                                "checkpoint.safetensors",
                                                "events.out.tfevents.fedray", "client_eval"}
    # federated evaluation's per-client table, every eval round (fedray.tracking.client_eval)
    assert sorted(p.name for p in (run / "client_eval").iterdir()) == \
        ["round_000002.arrow", "round_000003.arrow"]
    assert int(load_file(run / "server_state.safetensors")["server_opt.step"]) == 3
    lines = [json.loads(s) for s in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["round"] for m in lines] == [1, 2, 3]
    for m in lines:
        assert {"round", "wall_s", "clients", "train_loss", "updates_per_s"} <= m.keys()
    assert "test_accuracy" in lines[1] and "test_accuracy" in lines[2]
    assert "test_accuracy" not in lines[0] and "fed_test_accuracy" in lines[2]
    assert lines == res.metrics
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final"]["test_accuracy"] == lines[-1]["test_accuracy"]
    saved = load_file(run / "model.safetensors")
    assert _max_diff(saved, res.weights) == 0
    # also loadable the torch way, without executing code
    torch.save(saved, tmp_path / "w.pt")
    assert torch.load(tmp_path / "w.pt", weights_only=True).keys() == saved.keys()
    assert "seed: 3" in (run / "config.yaml").read_text()


def _cnn_job(tmp_path) -> dict:
    # the CNN has dropout: per-client seeds must make it placement-independent too
    return tiny_job(tmp_path, model__name="emnist_cnn", rounds=2, eval__central=False,
                    client__local_epochs=2, runtime__worker__num_cpus=0.5)


@pytest.fixture(scope="module")
def cnn_on_two_workers(ray_cluster, tmp_path_factory) -> fedray.RunResult:
    """The CNN job on 2 workers, run once for the two tests below: the first of the same
    seed's two runs, and the 2-worker run among 1, 2 and 4."""
    return fedray.run(_cnn_job(tmp_path_factory.mktemp("cnn")),
                      overrides=["runtime.num_workers=2"])


def test_same_seed_twice_identical(cnn_on_two_workers, tmp_path):
    a = cnn_on_two_workers
    job = _cnn_job(tmp_path)
    b = fedray.run(job, overrides=["runtime.num_workers=2", f"output.dir={tmp_path / 'b'}"])
    assert _max_diff(a.weights, b.weights) == 0
    c = fedray.run(job, overrides=["runtime.num_workers=2", f"output.dir={tmp_path / 'c'}",
                                   "seed=4"])
    assert _max_diff(a.weights, c.weights) > 0


def test_worker_count_does_not_change_result(cnn_on_two_workers, tmp_path):
    job = _cnn_job(tmp_path)
    results = [cnn_on_two_workers if n == 2 else
               fedray.run(job, overrides=[f"runtime.num_workers={n}",
                                          f"output.dir={tmp_path / str(n)}"])
               for n in (1, 2, 4)]
    assert [r.summary["num_workers"] for r in results] == [1, 2, 4]
    # sequential workers (tiny_job) of 1 thread each: every client's float32 arithmetic is
    # the same; the workers' float64 partial sums merge in another grouping
    atol = _weights_atol(results[0].weights, merge_ulps(2))
    for other in results[1:]:
        assert _max_diff(results[0].weights, other.weights) <= atol


def test_vectorized_workers_match_sequential_at_another_worker_count(ray_cluster, tmp_path):
    job = tiny_job(tmp_path, model__name="mlp", rounds=2, eval__central=False,
                   runtime__worker__num_cpus=0.5)
    runs = {(v, n): fedray.run(job, overrides=[f"runtime.worker.vectorize={v}",
                                               f"runtime.num_workers={n}",
                                               f"output.dir={tmp_path / f'{v}{n}'}"])
            for v, n in (("off", 1), ("on", 3))}
    assert [r.summary["vectorized"] for r in runs.values()] == [False, True]
    # a client's update is the same in any group (tests/kernels/test_vectorized.py), and its
    # sequential one whichever worker trains it, up to rounding: the batched products round
    # otherwise at each local step (at most 4 a round: 30 examples in batches of 8)
    steps, rounds = 4, 2
    atol = _weights_atol(runs[("off", 1)].weights, ULPS_PER_STEP * (steps + 1) * rounds)
    assert _max_diff(runs[("off", 1)].weights, runs[("on", 3)].weights) <= atol


def test_fractional_gpu_placement(ray_cluster, tmp_path):
    job = tiny_job(tmp_path, rounds=1, runtime={"num_workers": 4,
                                                "worker": {"num_cpus": 0.5, "num_gpus": 0.25}})
    res = fedray.run(job)
    workers = res.summary["workers"]
    assert len({w["pid"] for w in workers}) == 4
    assert all(w["gpu_ids"] == ["0"] for w in workers)  # four workers share the one GPU
    assert all(w["device"] == ("cuda" if torch.cuda.is_available() else "cpu") for w in workers)
    with pytest.raises(FedrayError,
                       match=r"'runtime.num_workers': 5 workers need 2.5 CPUs and 1.25 GPUs"):
        fedray.run(job, overrides=["runtime.num_workers=5",
                                   f"output.dir={tmp_path / 'five'}"])
    with pytest.raises(FedrayError,
                       match="'runtime.worker.num_gpus': the Ray cluster has 1 GPUs, got 2"):
        fedray.run(job, overrides=["runtime.worker.num_gpus=2",
                                   f"output.dir={tmp_path / 'two'}"])


def test_fedavg_aggregate_equals_hand_computed_weighted_mean(tmp_path):
    """In process (runtime.backend=inline: bit-identical to Ray at the same worker count,
    tests/runtime/test_inline.py), so the arithmetic is checked without a worker's start-up."""
    clients = blobs(6, dim=5, classes=3, seed=1)
    lr, server_lr = 0.3, 0.7
    model_fn, w0, b0 = fixed_linear()

    job = {"rounds": 1, "client": {"lr": lr, "batch_size": 100, "local_steps": 1},
           "server": {"lr": server_lr}, "sampling": {"clients_per_round": 6},
           "runtime": {"backend": "inline"}, "output": {"dir": str(tmp_path / "run")}}
    res = fedray.run(job, model_fn=model_fn, client_data=clients)
    # by hand: one full-batch gradient step per client, example-weighted mean of the deltas
    dw, db, total = np.zeros_like(w0), np.zeros_like(b0), 0
    for x, y in clients.values():
        gw, gb = softmax_grad(w0, b0, x.astype(np.float64), y)
        dw += len(y) * (-lr * gw)
        db += len(y) * (-lr * gb)
        total += len(y)
    # float32 (vectorized workers, by default) against float64: one step, then the float64
    # mean rounded to float32 once; ulps of the weights' size
    atol = f32_atol(w0, b0, ulps=ULPS_PER_STEP * 2)
    np.testing.assert_allclose(res.weights["weight"].numpy(), w0 + server_lr * dw / total,
                               rtol=0, atol=atol)
    np.testing.assert_allclose(res.weights["bias"].numpy(), b0 + server_lr * db / total,
                               rtol=0, atol=atol)


def test_in_memory_api(tmp_path):
    """The API's in-memory route, in process (the Ray side of client_data: test_examples,
    test_callbacks and the benchmarks' tests)."""
    clients = {f"writer{i}": xy for i, xy in blobs(12, seed=2).items()}
    test = blobs(1, seed=3)[0]

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 3))

        def forward(self, x):
            return self.fc(x)

    res = fedray.run({"rounds": 4, "sampling": {"clients_per_round": 5},
                      "runtime": {"backend": "inline"}, "output": {"dir": str(tmp_path / "run")}},
                     model_fn=Net, client_data=clients, test_data=test)
    assert isinstance(res, fedray.RunResult)
    assert set(res.weights) == set(Net().state_dict())
    assert len(res.metrics) == 4 and "test_accuracy" in res.metrics[-1]
    assert res.config.data.partition == "memory" and res.config.model.name == "custom"
    assert res.summary["population"] == 12


def test_existing_run_directory_is_refused(ray_cluster, tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("keep me\n")
    with pytest.raises(FedrayError, match="already holds files"):
        fedray.run(tiny_job(tmp_path))
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == "keep me\n"


def test_model_that_does_not_fit_the_data(ray_cluster, tmp_path):
    try:
        fedray.run({"model": {"name": "emnist_cnn"}, "sampling": {"clients_per_round": 2},
                    "output": {"dir": str(tmp_path / "run")}}, client_data=blobs(3))
    except FedrayError as exc:  # checked while the error (and its traceback) is still alive
        assert str(exc).startswith("config key 'model.name': the emnist_cnn model cannot be "
                                   "built for the inputs of client_data, of shape (5,)"), exc
        # the workers fedray.run started beside the driver are gone too: their CPUs are free
        total = ray_cluster.cluster_resources()["CPU"]
        deadline = time.monotonic() + 10
        while ray_cluster.available_resources().get("CPU", 0.0) < total:
            assert time.monotonic() < deadline, ray_cluster.available_resources()
            time.sleep(0.05)
    else:
        pytest.fail("a model that does not fit the data was accepted")


def test_population_scale_driver_memory(ray_cluster, tmp_path):
    """1,000 vs 100,000 clients: the driver's memory must not grow with the population
    (one worker each: the driver is what is measured)."""
    rss = {}
    for n in (1_000, 100_000):
        res = fedray.run(tiny_job(tmp_path, rounds=3, data__synthetic__num_clients=n,
                                  sampling__clients_per_round=20, eval__central=False,
                                  runtime__num_workers=1, output__dir=str(tmp_path / str(n))))
        rss[n] = res.summary["driver_mem_mb"]
    assert abs(rss[100_000] - rss[1_000]) < 100, rss


_LISTENERS = """
import sys, psutil
from fedray.config import load_config
from fedray.runtime.session import ray_session
cfg = load_config({"runtime": {"num_cpus": 1, "dashboard": sys.argv[1] == "on"}})
with ray_session(cfg.runtime):
    me = psutil.Process()
    found = set()
    for p in me.children(recursive=True):
        try:
            cmd = p.cmdline()
            if any("dashboard.py" in part for part in cmd):  # its --port: UI and job server
                port = int(next(a for a in cmd if a.startswith("--port=")).split("=")[1])
                found |= {c.laddr.ip for c in p.net_connections("tcp")
                          if c.status == psutil.CONN_LISTEN and c.laddr.port == port}
        except psutil.NoSuchProcess:
            pass
    print("listening on:", ",".join(sorted(found)))
"""


@pytest.mark.parametrize("dashboard,listening", [("off", ""), ("on", "127.0.0.1")])
def test_local_dashboard_and_job_server_listen_on_loopback_only(dashboard, listening):
    """A Ray that fedray starts has no dashboard or job server (which runs submitted code)
    listening; asked for one, it listens on loopback only (runtime.dashboard_host)."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run([sys.executable, "-c", _LISTENERS, dashboard], capture_output=True,
                         text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == f"listening on: {listening}".strip()


_PROCESSES = """
import json, sys, psutil
from ray._private import node, utils
from fedray.config import load_config
from fedray.runtime.session import ray_session
before = (node.Node.start_api_server, node.Node.start_monitor,
          utils.get_dashboard_dependency_error)
cfg = load_config({"runtime": {"num_cpus": 1, "dashboard": sys.argv[1] == "on"}})
with ray_session(cfg.runtime):
    for p in psutil.Process().children(recursive=True):
        try:
            print(json.dumps(p.cmdline()))
        except psutil.NoSuchProcess:
            pass
after = (node.Node.start_api_server, node.Node.start_monitor,
         utils.get_dashboard_dependency_error)
print("put back:", after == before)
"""


@pytest.mark.parametrize("dashboard", ["off", "on"])
def test_a_private_ray_without_a_dashboard_starts_what_runs_use(dashboard):
    """Without runtime.dashboard a private Ray starts no dashboard head and no autoscaler
    monitor, and its dashboard agent is the minimal one (start-up time: session._lean_start);
    with it, Ray starts as it would. Ray's functions are put back after ray.init."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run([sys.executable, "-c", _PROCESSES, dashboard], capture_output=True,
                         text=True, timeout=180, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    *procs, put_back = out.stdout.strip().splitlines()
    assert put_back == "put back: True"
    lines = [" ".join(json.loads(p)) for p in procs]
    head = [c for c in lines if "dashboard/dashboard.py" in c]
    monitor = [c for c in lines if "autoscaler/_private/monitor.py" in c]
    # the dashboard agent renames itself once started; the raylet's command line has the
    # agent's, as the raylet starts it
    (raylet,) = [c for c in map(json.loads, procs) if c and c[0].endswith("/raylet")]
    (agent,) = [a for a in raylet if a.startswith("--dashboard_agent_command=")]
    assert "dashboard/agent.py" in agent, raylet
    if dashboard == "off":
        assert not head and not monitor and "--minimal" in agent, lines
    else:
        assert len(head) == 1 and len(monitor) == 1 and "--minimal" not in agent, lines


def _listening(pid: int) -> list[tuple[str, int, str]]:
    """(address, port, process name) of every listening TCP socket and bound UDP socket of
    process ``pid`` and of its descendants."""
    import psutil

    root = psutil.Process(pid)
    found = []
    for proc in [root, *root.children(recursive=True)]:
        try:
            cmd = proc.cmdline()  # Ray's actors title themselves: ray::ClientWorker.train
            name = cmd[0].rsplit("/", 1)[-1] if cmd else proc.name()
            found += [(c.laddr.ip, c.laddr.port, name) for c in proc.net_connections("inet")
                      if c.status == psutil.CONN_LISTEN or (c.status == psutil.CONN_NONE
                                                           and c.laddr and not c.raddr)]
        except psutil.Error:  # ended meanwhile
            continue
    return found


def _loopback(address: str) -> bool:
    import ipaddress

    ip = ipaddress.ip_address(address.split("%")[0])
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:127.0.0.1, a dual-stack socket's
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


@pytest.mark.cluster
def test_a_private_ray_listens_on_loopback_only_during_a_run(tmp_path):
    """`fedray run` without runtime.address starts a private Ray: while it runs, every
    socket of every process of it (GCS server, raylet, the driver and worker actors, the
    dashboard and runtime-env agents, the metrics exporter, the CLI itself) listens on
    loopback only; Ray's default is every interface, unauthenticated."""
    import os
    import signal

    import yaml

    # backend ray: under auto, 400 tiny rounds on an idle machine finish in the CLI's own
    # process (about 9 s, below runtime.auto_inline_s) and no Ray ever starts; only a loaded
    # machine handed them over, so the test passed or failed with the machine's load
    job = tiny_job(tmp_path, rounds=400, eval__every=0, runtime__num_cpus=1,
                   runtime__num_workers=1, runtime__backend="ray")
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen([sys.executable, "-m", "fedray.cli", "run", str(tmp_path / "job.yaml"),
                             "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)
    metrics = tmp_path / "run" / "metrics.jsonl"
    try:
        deadline = time.monotonic() + 180
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
            time.sleep(0.05)
        seen = set()
        for _ in range(3):  # rounds under way: the workers and the driver are busy
            seen |= set(_listening(proc.pid))
            time.sleep(0.3)
        assert proc.poll() is None, "the run ended before its sockets were all listed"
    finally:
        proc.send_signal(signal.SIGTERM)  # an orderly stop: Ray shut down, the run kept
        proc.communicate(timeout=120)
    names = {name for _, _, name in seen}
    assert {"gcs_server", "raylet"} <= names and any("Worker" in n for n in names), seen
    exposed = sorted(s for s in seen if not _loopback(s[0]))
    assert not exposed, f"listening beyond loopback: {exposed}"


def test_ray_address_from_the_environment_is_probed():
    """An inherited RAY_ADDRESS is honoured (Ray Jobs sets it) but probed, as
    runtime.address is: before, an unreachable one left `fedray run` in Ray's retries."""
    from fedray.runtime.session import probe

    with pytest.raises(FedrayError, match=r"^RAY_ADDRESS=127.0.0.1:1 \(from the environment\): "
                       r"cannot reach Ray at 127.0.0.1:1: Connection refused; unset "
                       r"RAY_ADDRESS to start a private Ray, or set runtime.address$"):
        probe("127.0.0.1:1", source="RAY_ADDRESS")
    with pytest.raises(FedrayError, match=r"is a job server's address \(fedray submit's\)"):
        probe("http://127.0.0.1:8265", source="RAY_ADDRESS")
    with pytest.raises(FedrayError, match=r"^config key 'runtime.address': cannot reach Ray"):
        probe("127.0.0.1:1")


def test_actor_lost_names_the_memory_monitor():
    from ray import exceptions as rx

    from fedray.runtime.session import actor_lost

    oom = actor_lost(rx.OutOfMemoryError("Task was killed due to the node running low on "
                                         "memory."), "the driver actor")
    assert str(oom).startswith("the driver actor was killed by Ray's memory monitor: this "
                               "machine ran low on memory")
    died = actor_lost(rx.ActorDiedError(), "the driver actor")
    assert str(died).startswith("the driver actor died (ActorDiedError: ")


def test_object_store_minimum_is_rays():
    from ray._private import ray_constants

    from fedray.config import RAY_MIN_OBJECT_STORE_MB

    assert RAY_MIN_OBJECT_STORE_MB * 2**20 == ray_constants.OBJECT_STORE_MINIMUM_MEMORY_BYTES


@pytest.mark.parametrize("env,says", [
    ({"RAY_ADDRESS": "127.0.0.1:1"},
     "fedray: error: RAY_ADDRESS=127.0.0.1:1 (from the environment): cannot reach Ray at "
     "127.0.0.1:1: Connection refused; unset RAY_ADDRESS to start a private Ray, or set "
     "runtime.address"),
    ({"RAY_DEFAULT_OBJECT_STORE_MAX_MEMORY_BYTES": "1000"},
     "fedray: error: cannot start a private Ray: Attempting to cap object store memory usage "
     "at 1000 bytes, but the minimum allowed is 78643200 bytes."),
], ids=["unreachable-ray-address", "object-store-capped"])
def test_an_environment_that_breaks_ray_ends_in_one_line(tmp_path, env, says):
    """Before: an unreachable RAY_ADDRESS hung in Ray's retries; an object store Ray
    refuses (here capped below its minimum by Ray's own variable) ended in a traceback."""
    import os

    import yaml

    (tmp_path / "job.yaml").write_text(yaml.safe_dump(tiny_job(tmp_path, rounds=1,
                                                              runtime__backend="ray")))
    full = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", **env)
    if "RAY_ADDRESS" not in env:
        full.pop("RAY_ADDRESS", None)
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "fedray.cli", "run", str(tmp_path / "job.yaml"),
                          "--quiet"], capture_output=True, text=True, env=full, timeout=180)
    assert (out.returncode, out.stderr.strip()) == (2, says), out.stderr[-3000:]
    assert time.monotonic() - start < 90
    assert not (tmp_path / "run").exists()


def test_a_hand_over_to_a_ray_that_cannot_start_ends_in_one_line(tmp_path):
    """runtime.backend auto: round 1 in the CLI's process, then Ray refuses to start (its
    object store capped below its minimum): the same one line as a run on Ray from the
    start, exit 2, and round 1 kept with its checkpoint."""
    import os

    import yaml

    from fedray.state.checkpoint import read_checkpoint

    job = tiny_job(tmp_path, rounds=2, runtime__backend="auto", runtime__auto_inline_s=0)
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    full = dict(os.environ, RAY_USAGE_STATS_ENABLED="0",
                RAY_DEFAULT_OBJECT_STORE_MAX_MEMORY_BYTES="1000")
    full.pop("RAY_ADDRESS", None)
    out = subprocess.run([sys.executable, "-m", "fedray.cli", "run", str(tmp_path / "job.yaml"),
                          "--quiet"], capture_output=True, text=True, env=full, timeout=180)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, out.stderr[-3000:]
    assert lines[0].startswith("fedray: runtime.backend=auto: round 1 took "), lines
    assert lines[1:] == ["fedray: error: cannot start a private Ray: Attempting to cap object "
                         "store memory usage at 1000 bytes, but the minimum allowed is "
                         "78643200 bytes."], lines
    assert read_checkpoint(str(tmp_path / "run")).round == 1


_FREED = """
import sys, psutil, torch
from fedray.runtime.session import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
rss = lambda: psutil.Process().memory_info().rss / 2**20
base = rss()
xs = [torch.ones(1 << 19) for _ in range(100)]  # 100 x 2 MB, as a group's per-step tensors
del xs
print(rss() - base)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's allocator")
def test_workers_keep_freed_tensor_memory_instead_of_remapping_it():
    kept = {mode: float(subprocess.run([sys.executable, "-c", _FREED, mode], check=True,
                                       capture_output=True, text=True).stdout)
            for mode in ("keep", "default")}
    assert kept["keep"] > 150  # reused by the next step, no page faults
    assert kept["default"] < 50  # glibc unmapped it: the next step faults it in again
