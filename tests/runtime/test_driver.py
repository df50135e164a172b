"""The driver's divergence guard (guard.non_finite) and a round that kept no update.

A global model with NaN or Inf, or a round whose every client update was non-finite, is an
error, not a result: the run stops with one line naming the round and the likely cause,
and the last checkpoint -- written while the model was finite -- stays as it was, byte for
byte. Inline backend, in-memory clients and a tiny MLP: each run takes about a second."""

from __future__ import annotations

import json
import os
import textwrap

import pytest
import torch
from conftest import blobs
from torch import nn

import fedray
from fedray.errors import DivergedError
from fedray.state.checkpoint import CHECKPOINT_FILE, read_checkpoint
from fedray.state.run_dir import SERVER_STATE_FILE, WEIGHTS_FILE, read_metrics
from fedray.tracking.callbacks import Callback
from fedray.tracking.tensorboard import EVENTS_FILE, read_scalars

CLIENTS = blobs(12, seed=4)
TEST = blobs(1, seed=9)[0]


def _mlp_fn():
    """A tiny MLP's model_fn, a closure so that Ray ships it by value (not by this test
    module's name, which a Ray worker cannot import)."""
    def model_fn() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 3))

    return model_fn


def _job(tmp_path, name: str = "run", **extra) -> dict:
    job = {"name": name, "seed": 2, "rounds": 4,
           "client": {"lr": 0.1, "batch_size": 4, "local_steps": 3},
           "sampling": {"clients_per_round": 6}, "checkpoint": {"every": 1},
           "runtime": {"backend": "inline", "num_workers": 2,
                       "worker": {"num_cpus": 0.5, "vectorize": "off"}},
           "output": {"dir": str(tmp_path / name)}}
    for key, value in extra.items():
        node = job
        *parents, last = key.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return job


class _Snapshot(Callback):
    """The checkpoint file's bytes after each round, as the run leaves it."""

    def __init__(self) -> None:
        self.after: dict[int, bytes] = {}

    def on_run_start(self, info) -> None:
        self.dir = info.run_dir

    def on_round_end(self, round: int, metrics: dict, weights) -> None:
        with open(os.path.join(self.dir, CHECKPOINT_FILE), "rb") as f:
            self.after[round] = f.read()


def _run(job: dict, callbacks=()) -> fedray.RunResult:
    return fedray.run(job, model_fn=_mlp_fn(), client_data=CLIENTS, test_data=TEST,
                      callbacks=list(callbacks))


def test_a_huge_server_lr_stops_within_two_rounds_and_keeps_the_finite_checkpoint(tmp_path):
    snap = _Snapshot()
    with pytest.raises(DivergedError) as err:
        _run(_job(tmp_path, server__lr=1e30), [snap])
    # round 1 moves the weights to ~1e28, still finite; round 2's clients overflow, and
    # the guard drops every update
    assert str(err.value) == (
        "round 2: every client update was non-finite (6 of 6 clients, all dropped by the "
        "guard); likely cause: a learning rate too large (client.lr 0.1, server.lr 1e+30) "
        "or non-finite data; the checkpoint after round 1 is intact")
    assert (err.value.round, err.value.checkpoint) == (2, 1)
    run = tmp_path / "run"  # round 1's checkpoint, exactly as round 1 left it
    assert (run / CHECKPOINT_FILE).read_bytes() == snap.after[1]
    ckpt = read_checkpoint(str(run))
    assert ckpt.round == 1 and torch.isfinite(ckpt.weights).all()
    assert [m["round"] for m in read_metrics(str(run))] == [1]
    # nothing non-finite was written: no final weights, no server state, no summary
    assert not (run / WEIGHTS_FILE).exists() and not (run / SERVER_STATE_FILE).exists()
    assert not (run / "summary.json").exists()


NAN_AGGREGATOR = """
    import torch
    from fedray.algorithms.fedavg import Proportional

    class NanAfterTwo(Proportional):
        name = "nan_after_two"
        rounds = 0

        def finish(self, acc):
            self.rounds += 1
            mean = super().finish(acc)
            return mean * float("nan") if self.rounds >= 3 else mean
"""


def _nan_aggregator(tmp_path) -> str:
    path = tmp_path / "nan_aggregator.py"
    path.write_text(textwrap.dedent(NAN_AGGREGATOR))
    return f"{path}:NanAfterTwo"


def test_an_aggregator_returning_nan_never_overwrites_the_last_good_checkpoint(tmp_path):
    snap = _Snapshot()
    job = _job(tmp_path, algorithm__aggregator=_nan_aggregator(tmp_path))
    with pytest.raises(DivergedError) as err:
        _run(job, [snap])
    # the aggregator made it so, and is named (issue 40, item 6), not a learning rate
    assert str(err.value) == (
        "round 3: the global model has non-finite weights (NaN or Inf) after the server "
        f"update: algorithm.aggregator {tmp_path / 'nan_aggregator.py'}:NanAfterTwo: "
        "finish() returned non-finite values (NaN or Inf) from a finite sum; the "
        "checkpoint after round 2 is intact")
    assert (err.value.round, err.value.checkpoint) == (3, 2)
    assert (tmp_path / "run" / CHECKPOINT_FILE).read_bytes() == snap.after[2]


def test_warn_goes_on_but_writes_nothing_non_finite(tmp_path, capfd):
    job = _job(tmp_path, algorithm__aggregator=_nan_aggregator(tmp_path),
               guard__non_finite="warn")
    result = _run(job)
    err = capfd.readouterr().err
    assert err.count("guard.non_finite=warn") == 1 and "fedray: round 3: " in err
    assert [m["round"] for m in result.metrics] == [1, 2, 3, 4]
    assert result.metrics[2]["diverged"].startswith("round 3: the global model")
    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["diverged_at_round"] == 3 and summary["weights_file"] is None
    assert read_checkpoint(str(run)).round == 2  # the last finite one
    assert not (run / WEIGHTS_FILE).exists() and not (run / SERVER_STATE_FILE).exists()


def test_a_round_without_kept_updates_has_no_train_loss(tmp_path):
    """Every update above guard.max_update_norm: dropped, and none of them non-finite, so
    the run goes on; such a round's train_loss is missing (not 0.0), and TensorBoard, the
    progress line and fedray report cope with the gap."""
    from fedray.tracking.progress import Progress

    lines = []

    class Stream:
        def isatty(self):
            return False

        def write(self, s):
            lines.append(s)

        def flush(self):
            pass

    result = _run(_job(tmp_path, rounds=2, guard__max_update_norm=1e-9),
                  [Progress(2, stream=Stream())])
    for m in result.metrics:
        assert m["updates"] == 0 and m["dropped_updates"] == m["clients"] > 0
        assert "train_loss" not in m
    assert all("train_loss" not in m for m in read_metrics(str(tmp_path / "run")))
    assert "train_loss" not in read_scalars(str(tmp_path / "run" / EVENTS_FILE))
    assert any("loss   -  " in line for line in lines)
    assert result.summary["diverged_at_round"] is None


def test_a_round_with_kept_updates_still_has_its_train_loss(tmp_path):
    result = _run(_job(tmp_path, rounds=2))
    assert all(m["train_loss"] > 0 for m in result.metrics)


@pytest.mark.slow
def test_the_ray_backend_raises_the_same_diverged_error(tmp_path, ray_cluster):
    """Through the driver actor: fedray.run raises DivergedError itself (a caller can catch
    it alone), with its round and checkpoint, not a plain error or a Ray one."""
    job = _job(tmp_path, rounds=3, algorithm__aggregator=_nan_aggregator(tmp_path),
               runtime__backend="ray")
    with pytest.raises(DivergedError) as err:
        _run(job)
    assert (err.value.round, err.value.checkpoint) == (3, 2)
    assert str(err.value).startswith("round 3: the global model has non-finite weights")
