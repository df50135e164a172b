"""output.wandb: the config, every round's metrics under the TensorBoard tags and the summary,
in the calling process -- with the real wandb package in offline mode (no network, no login),
read back from the run's W&B transaction log (``run-<id>.wandb``)."""

import glob
import json
import os
import struct
import sys

import pytest
from conftest import tiny_job

import fedray
from fedray.api import prepare
from fedray.errors import FedrayError
from fedray.tracking.callbacks import Callback
from fedray.tracking.tags import metric_tag, run_name


def test_missing_wandb_is_refused_before_anything_starts(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    with pytest.raises(FedrayError, match=r"^config key 'output.wandb': Weights & Biases is not "
                                          r"installed; pip install 'fedray\[wandb\]' or set "
                                          r"output.wandb=false$"):
        prepare(tiny_job(tmp_path, output__wandb=True))
    assert not (tmp_path / "run").exists()


def test_a_sweep_trial_is_named_by_its_trial():
    from types import SimpleNamespace

    cfg = SimpleNamespace(name="tiny")
    assert run_name(cfg, "/runs/tiny-1") == "tiny"
    assert run_name(cfg, "s3://b/sweeps/s/trials/lr=0.1,seed=0/") == "lr=0.1,seed=0"


@pytest.fixture
def wandb_offline(tmp_path, monkeypatch):
    """W&B in offline mode with its settings and caches under tmp_path, and no way to reach
    a server: an attempt to would fail, not hang (nothing listens on port 9). W&B reads its
    environment once per process (its setup singleton): torn down before and after."""
    wandb = pytest.importorskip("wandb")
    wandb.teardown()
    home = tmp_path / "wandb-home"
    home.mkdir()
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(home))
    monkeypatch.setenv("NETRC", str(home / "netrc"))
    yield
    wandb.teardown()


def _records(run_dir) -> list:
    """The records of the run's W&B transaction log: a 7-byte header (``:W&B``, magic,
    version), then LevelDB-log blocks of 32 KiB, each record a 7-byte header (CRC, length,
    type: full, first, middle, last) and a serialized ``wandb_internal.Record``."""
    import wandb
    from wandb.proto import wandb_internal_pb2

    wandb.teardown()  # W&B's service writes the log behind finish(): complete once it stops
    (path,) = glob.glob(os.path.join(run_dir, "wandb", "offline-run-*", "run-*.wandb"))
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B", data[:7]
    block, pos, out, part = 32768, 7, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:  # padding to the end of the block
            pos += left
            continue
        part += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # full, or last of a record split over blocks
            record = wandb_internal_pb2.Record()
            record.ParseFromString(part)
            out.append(record)
            part = b""
    return out


def _items(update) -> dict:
    return {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in update}


def test_a_run_reaches_wandb_offline(tmp_path, wandb_offline):
    """A run with output.wandb: one W&B run named after the job, in RUN_DIR/wandb/, holding
    the config, each round's metrics at step = round under the TensorBoard tags (the same
    float64 values as metrics.jsonl), summary.json's numbers, and exit code 0."""
    result = fedray.run(tiny_job(tmp_path, rounds=3, output__wandb=True,
                                 runtime__backend="inline"))
    records = _records(result.run_dir)
    kinds = [r.WhichOneof("record_type") for r in records]
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.display_name == "tiny" and run.project == "fedray"
    assert run.notes == f"fedray run directory: {result.run_dir}"
    config = _items(run.config.update)
    assert config["client"]["lr"] == 0.05 and config["sampling"]["clients_per_round"] == 8
    assert config["output"]["wandb"] is True
    history = [r.history for r in records if r.WhichOneof("record_type") == "history"]
    assert [h.step.num for h in history] == [1, 2, 3]
    for h, m in zip(history, result.metrics, strict=True):
        logged = {k: v for k, v in _items(h.item).items() if not k.startswith("_")}
        expected = {metric_tag(k): v for k, v in m.items() if k != "round"}
        assert logged == expected  # JSON round-trips a float64 exactly
    summary = {}
    for r in records:
        if r.WhichOneof("record_type") == "summary":
            summary.update(_items(r.summary.update))
    assert summary["total_s"] == result.summary["total_s"]
    assert summary["test/test_accuracy"] == result.summary["final"]["test_accuracy"]
    assert kinds[-1] == "exit" and records[-1].exit.exit_code == 0


class _Fails(Callback):
    def on_round_end(self, round, metrics, weights):
        if round == 2:
            raise RuntimeError("a user's callback fails")


def test_a_failed_run_ends_its_wandb_run_failed(tmp_path, wandb_offline):
    """fedray's writers come before the user's callbacks: round 2 is logged before the
    user's callback fails the run, and the W&B run ends with exit code 1."""
    job = tiny_job(tmp_path, rounds=3, output__wandb=True, runtime__backend="inline")
    with pytest.raises(RuntimeError, match="a user's callback fails"):
        fedray.run(job, callbacks=[_Fails()])
    records = _records(str(tmp_path / "run"))
    steps = [r.history.step.num for r in records if r.WhichOneof("record_type") == "history"]
    assert steps == [1, 2]
    assert records[-1].WhichOneof("record_type") == "exit" and records[-1].exit.exit_code == 1


def test_wandb_without_a_login_is_one_line(tmp_path, wandb_offline, monkeypatch):
    """Online mode without an API key: W&B's own error, as one line that says what to do."""
    import wandb

    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc with a key
    wandb.teardown()  # W&B reads the environment again
    job = tiny_job(tmp_path, rounds=1, output__wandb=True, runtime__backend="inline")
    with pytest.raises(FedrayError) as info:
        fedray.run(job)
    message = str(info.value)
    assert message.startswith("config key 'output.wandb': W&B could not start a run: ")
    assert message.endswith("(log in with `wandb login`, or set WANDB_MODE=offline to log "
                            "without a network)") and "\n" not in message
