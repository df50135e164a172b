"""runtime.backend=inline: the driver and its workers in the test's own process, no Ray.

Its results must be the Ray backend's bit for bit at the same worker count: the same
clients on the same workers, the same float32 training, the same float64 partial sums
merged in the same slot order. Only these comparisons need Ray; the rest runs without it."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from conftest import blobs, fixed_linear

import fedray
from fedray.state.checkpoint import read_checkpoint
from fedray.state.client_state import ClientStateStore
from fedray.state.run_dir import SERVER_STATE_FILE, load_tensors, read_metrics
from fedray.tracking.callbacks import Callback
from fedray.tracking.tensorboard import EVENTS_FILE, read_scalars

CLIENTS = blobs(12, seed=4)
TEST = blobs(1, seed=9)[0]


def job(tmp_path, name: str, backend: str, *, algorithm: dict | None = None,
        workers: int | None = 2, vectorize: str = "off", rounds: int = 3, **extra) -> dict:
    return {"name": name, "seed": 2, "rounds": rounds,
            "algorithm": algorithm or {"name": "fedavg"},
            "client": {"lr": 0.1, "batch_size": 4, "local_steps": 3},
            "sampling": {"clients_per_round": 6},
            "runtime": {"backend": backend, "num_workers": workers,
                        "worker": {"num_cpus": 0.5, "vectorize": vectorize}},
            "output": {"dir": str(tmp_path / name)}, **extra}


def run(tmp_path, name: str, backend: str, callbacks=(), **kw) -> fedray.RunResult:
    model_fn = fixed_linear()[0]
    return fedray.run(job(tmp_path, name, backend, **kw), model_fn=model_fn,
                      client_data=CLIENTS, test_data=TEST, callbacks=list(callbacks))


def _files(root: str) -> dict[str, bytes]:
    out = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            out[os.path.relpath(path, root)] = open(path, "rb").read()
    return out


def _same_metrics(a: list[dict], b: list[dict]) -> None:
    """Every metric a round computes (not its timings or memory) equal, exactly."""
    timing = ("_s", "_mb")
    assert [m["round"] for m in a] == [m["round"] for m in b]
    for x, y in zip(a, b, strict=True):
        keys = [k for k in x if not k.endswith(timing) and k != "updates_per_s"]
        assert {k: x[k] for k in keys} == {k: y[k] for k in keys}


@pytest.mark.parametrize("algorithm, vectorize", [
    ({"name": "fedavg"}, "off"),
    ({"name": "scaffold"}, "off"),  # client state, written and read back by the workers
    ({"name": "fedprox", "fedprox": {"mu": 0.3}}, "on"),  # batched training
], ids=["fedavg", "scaffold", "fedprox-vectorized"])
def test_inline_equals_ray_bit_for_bit(ray_cluster, tmp_path, algorithm, vectorize):
    on_ray = run(tmp_path, "ray", "ray", algorithm=algorithm, vectorize=vectorize)
    inline = run(tmp_path, "inline", "inline", algorithm=algorithm, vectorize=vectorize)
    assert inline.weights.keys() == on_ray.weights.keys()
    for k in on_ray.weights:
        assert torch.equal(inline.weights[k], on_ray.weights[k]), k
    assert not torch.equal(on_ray.weights["weight"], torch.from_numpy(  # the model moved
        fixed_linear()[1]).float())
    _same_metrics(inline.metrics, on_ray.metrics)
    assert "test_accuracy" in inline.metrics[-1]
    assert inline.summary["vectorized"] == on_ray.summary["vectorized"] == (vectorize == "on")
    a, b = (load_tensors(r.run_dir, SERVER_STATE_FILE) for r in (inline, on_ray))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    if algorithm["name"] == "scaffold":
        assert "aggregator.c" in a
        stores = [ClientStateStore(f"{r.run_dir}/client_state") for r in (inline, on_ray)]
        assert stores[0].clients() == stores[1].clients() != []
        files = [_files(os.path.join(r.run_dir, "client_state")) for r in (inline, on_ray)]
        assert files[0] == files[1]  # every client's every state version, byte for byte
    pids = {w["pid"] for w in inline.summary["workers"]}
    assert pids == {os.getpid()} and len(inline.summary["workers"]) == 2
    assert os.getpid() not in {w["pid"] for w in on_ray.summary["workers"]}


@pytest.fixture
def no_ray(monkeypatch):
    """Any Ray call fails the test (an earlier test may have started the session's Ray, so
    ray.is_initialized() alone would prove nothing)."""
    import ray

    def refuse(*args, **kwargs):
        raise AssertionError("the inline backend called Ray")

    for name in ("init", "put", "get", "wait", "remote", "kill", "get_gpu_ids",
                 "get_runtime_context"):
        monkeypatch.setattr(ray, name, refuse)


def test_inline_makes_no_ray_call_and_restores_the_process(tmp_path, no_ray):
    model_fn = fixed_linear()[0]  # (seeds torch itself)
    torch.manual_seed(123)
    expected_draw = torch.rand(3)
    torch.manual_seed(123)
    threads = torch.get_num_threads()
    result = fedray.run(job(tmp_path, "scaffold", "inline", algorithm={"name": "scaffold"},
                            workers=None, eval={"every": 1}),
                        model_fn=model_fn, client_data=CLIENTS, test_data=TEST)
    assert result.summary["num_workers"] == 1  # runtime.num_workers null: one worker
    assert [w["device"] for w in result.summary["workers"]] == ["cpu"]
    assert len(read_metrics(result.run_dir)) == 3
    # the driver seeds torch and sets its thread count, as in its own process: this
    # process gets both back
    assert torch.get_num_threads() == threads
    assert torch.equal(torch.rand(3), expected_draw)


def test_a_part_error_is_raised_where_it_happened(tmp_path, no_ray):
    """What makes inline the backend to debug on: a client part's exception reaches the
    caller as itself, its traceback going through the part's own code (pdb's post-mortem
    lands there), not as a Ray error from another process."""
    part = tmp_path / "boom.py"
    part.write_text("from fedray.algorithms.base import ClientWork\n\n\n"
                    "class Boom(ClientWork):\n"
                    "    def terms(self, env, ctx):\n"
                    "        raise ValueError(f'boom in client {ctx.cid}')\n")
    with pytest.raises(ValueError, match="boom in client") as info:
        run(tmp_path, "boom", "inline", algorithm={"name": "fedavg", "client": f"{part}:Boom"})
    assert any(entry.path == part for entry in info.traceback)
    assert not (tmp_path / "boom").exists()  # failed in round 1: nothing kept


class _Crash(Callback):
    """A process killed after round ``at``'s metrics were written (the callbacks run after
    the round's records, TensorBoard's event included)."""

    def __init__(self, at: int):
        self.at = at

    def on_round_end(self, round, metrics, weights):
        if round == self.at:
            raise KeyboardInterrupt


def test_inline_resume_is_bit_identical(tmp_path, no_ray):
    kw = {"algorithm": {"name": "scaffold"}, "rounds": 5, "checkpoint": {"every": 2}}
    whole = run(tmp_path, "whole", "inline", **kw)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, "cut", "inline", callbacks=[_Crash(3)], **kw)
    run_dir = str(tmp_path / "cut")
    assert read_checkpoint(run_dir).round == 2 and len(read_metrics(run_dir)) == 3
    resumed = fedray.run(resume=run_dir, model_fn=fixed_linear()[0], client_data=CLIENTS,
                         test_data=TEST)
    assert resumed.summary["resumed_from_round"] == 2
    assert [m["round"] for m in resumed.metrics] == [3, 4, 5]
    for k in whole.weights:
        assert torch.equal(resumed.weights[k], whole.weights[k]), k
    _same_metrics(read_metrics(run_dir), whole.metrics)
    # round 3's event of the killed run is gone with its metrics line: no duplicate point
    events = read_scalars(os.path.join(run_dir, EVENTS_FILE))
    assert [s for s, _ in events["train_loss"]] == [1, 2, 3, 4, 5]
    assert [v for _, v in events["train_loss"]] == pytest.approx(
        [m["train_loss"] for m in whole.metrics], rel=1e-6)  # events hold float32


def test_inline_trains_on_the_cpu_and_says_so(tmp_path, no_ray, capfd):
    """A GPU share asks Ray for a device; the inline workers stay on this process's CPU."""
    j = job(tmp_path, "gpu", "inline", rounds=1)
    j["runtime"]["worker"]["num_gpus"] = 0.5
    result = fedray.run(j, model_fn=fixed_linear()[0], client_data=CLIENTS, test_data=TEST)
    assert [w["device"] for w in result.summary["workers"]] == ["cpu", "cpu"]
    assert "runtime.worker.num_gpus is not used" in capfd.readouterr().err
    assert np.isfinite(result.metrics[0]["train_loss"])
