"""The checkpoint file and the config check of --resume, without Ray."""

import numpy as np
import pytest
import torch
from conftest import blobs, fixed_linear
from omegaconf import OmegaConf

import fedray
from fedray.config import load_config
from fedray.errors import FedrayError
from fedray.state.checkpoint import (
    CHECKPOINT_FILE,
    Checkpoint,
    check_same_config,
    decode,
    encode,
    masked_keys,
    read_checkpoint,
    saved_run_id,
)
from fedray.state.run_dir import RunDir


def _ckpt() -> Checkpoint:
    return Checkpoint(round=7, weights=torch.randn(11),
                      server_state={"server_opt.step": torch.tensor(7),
                                    "server_opt.m": torch.randn(11, dtype=torch.float64),
                                    "aggregator.c": torch.randn(11)},
                      client_versions=np.array([0, 3, 7, 0], np.int32),
                      metrics_lines=['{"round": 1}\n', '{"round": 2, "x": "\\u00e9"}\n'])


def test_round_trip_is_exact(tmp_path):
    a = _ckpt()
    RunDir(str(tmp_path)).write_bytes("checkpoint.safetensors", encode(a))
    b = read_checkpoint(str(tmp_path))
    assert b.round == 7 and b.metrics_lines == a.metrics_lines
    assert torch.equal(a.weights, b.weights)
    assert a.server_state.keys() == b.server_state.keys()
    assert all(torch.equal(a.server_state[k], b.server_state[k]) for k in a.server_state)
    assert b.client_versions.dense().tolist() == [0, 3, 7, 0]  # stored sparse: clients 1, 2
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.safetensors"]  # no temporaries


def test_no_checkpoint_and_corrupt_checkpoint(tmp_path):
    assert read_checkpoint(str(tmp_path)) is None
    data = encode(_ckpt())
    for bad in (data[: len(data) // 2], b"nonsense", b""):
        with pytest.raises(FedrayError, match="checkpoint here is corrupt"):
            decode(bad, "here")


def test_config_check_names_keys_and_allows_each_named_one():
    saved = load_config({"rounds": 10, "output": {"dir": "/runs/a"}})
    same = load_config({"rounds": 10, "output": {"dir": "/elsewhere"}})
    assert check_same_config("/runs/a", saved, same) == []  # output.dir is never compared
    new = load_config({"rounds": 20, "client": {"lr": 0.5}})
    with pytest.raises(FedrayError, match=r"in client.lr \(0.1 -> 0.5\), rounds \(10 -> 20\) "
                       r"\(to continue under the new value, name each key with "
                       r"--allow-change KEY\)$"):
        check_same_config("/runs/a", saved, new)
    with pytest.raises(FedrayError, match=r"in client.lr \(0.1 -> 0.5\) \("):
        check_same_config("/runs/a", saved, new, ["rounds"])
    assert check_same_config("/runs/a", saved, new, ["rounds", "client.lr"]) == [
        "client.lr", "rounds"]  # named: allowed (check_resume says what it changes)
    with pytest.raises(FedrayError, match=r"^--allow-change client.lrr: not a config key$"):
        check_same_config("/runs/a", saved, new, ["rounds", "client.lrr"])
    more = load_config({"rounds": 20, "runtime": {"num_workers": 3}})
    assert check_same_config("/runs/a", saved, more, ["rounds", "runtime.num_workers"]) == [
        "rounds", "runtime.num_workers"]


def test_masked_credentials_are_found_and_compare_equal():
    secret = load_config({"data": {"partition": "s3://key:hunter2@bucket/store"}})
    saved = OmegaConf.create({**OmegaConf.to_container(secret),
                              "data": {**OmegaConf.to_container(secret.data),
                                       "partition": "s3://key:***@bucket/store"}})
    assert masked_keys(saved) == ["data.partition"]
    assert check_same_config("/runs/a", saved, secret) == []


# --resume proves it continues the same run: the run id on config.yaml's first line and in
# every checkpoint, and the resolved config the checkpoint records (fedray.state.checkpoint
# check_resume). Inline backend, in-memory clients: each run takes about a second.

def _job(tmp_path, name: str, seed: int = 2) -> dict:
    return {"name": name, "seed": seed, "rounds": 2,
            "client": {"lr": 0.1, "batch_size": 4, "local_steps": 2},
            "sampling": {"clients_per_round": 4}, "checkpoint": {"every": 1},
            "runtime": {"backend": "inline", "num_workers": 1,
                        "worker": {"num_cpus": 0.5, "vectorize": "off"}},
            "output": {"dir": str(tmp_path / name)}}


def _run(job=None, **kw):
    return fedray.run(job, model_fn=fixed_linear()[0], client_data=blobs(8, seed=4), **kw)


def test_a_run_records_its_id_and_config_in_every_checkpoint(tmp_path):
    from fedray.state.checkpoint import config_fingerprint, read_checkpoint_header, saved_run_id

    result = _run(_job(tmp_path, "a"))
    run = result.run_dir
    ckpt, head = read_checkpoint(run), read_checkpoint_header(run)
    run_id = saved_run_id(run)
    assert len(run_id) == 16 and ckpt.run_id == head.run_id == run_id
    assert result.summary["run_id"] == run_id
    assert ckpt.config == head.config and head.config["client"]["lr"] == 0.1
    assert head.round == 2 and (tmp_path / "a" / "config.yaml").read_text().startswith(
        f"# fedray run {run_id}: ")
    # the fingerprint leaves out what a resume may change without changing the rounds
    moved = {**head.config, "rounds": 9, "output": {**head.config["output"], "dir": "/x"}}
    assert config_fingerprint(moved) == config_fingerprint(head.config)
    assert config_fingerprint({**head.config, "seed": 3}) != config_fingerprint(head.config)
    # a second run, even of the same job, is another run
    assert saved_run_id(_run(_job(tmp_path, "b")).run_dir) != run_id


def _edit(path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1
    path.write_text(text.replace(old, new))


def test_a_hand_edited_config_is_refused_unless_the_key_is_allowed(tmp_path, capfd):
    run = _run(_job(tmp_path, "a")).run_dir
    _edit(tmp_path / "a" / "config.yaml", "lr: 0.1\n", "lr: 0.2\n")
    before = (tmp_path / "a" / CHECKPOINT_FILE).read_bytes()
    with pytest.raises(FedrayError) as err:
        _run(resume=run, overrides=["rounds=3"], allow_changes=["rounds"])
    assert str(err.value) == (
        f"--resume {run}: the config differs from the run's checkpoint (after round 2) in "
        "client.lr (0.1 -> 0.2) (to continue under the new value, name each key with "
        "--allow-change KEY)")
    assert (tmp_path / "a" / CHECKPOINT_FILE).read_bytes() == before  # nothing written
    capfd.readouterr()
    more = _run(resume=run, overrides=["rounds=3"], allow_changes=["rounds", "client.lr"])
    assert [m["round"] for m in more.metrics] == [3]
    assert (f"fedray: --resume {run}: client.lr changes (0.1 -> 0.2) after round 2"
            in capfd.readouterr().err)
    # the run now records 0.2: resuming it again needs nothing named
    assert read_checkpoint(run).config["client"]["lr"] == 0.2
    _run(resume=run, overrides=["rounds=4"], allow_changes=["rounds"])


def test_an_extended_run_stopped_before_its_next_checkpoint_resumes_as_is(tmp_path):
    """A resume that extended ``rounds`` rewrote config.yaml; stopped before its next
    checkpoint, the checkpoint still records the old rounds: a safe key config.yaml
    already holds needs no --allow-change again."""
    run = _run(_job(tmp_path, "a")).run_dir
    _edit(tmp_path / "a" / "config.yaml", "rounds: 2\n", "rounds: 3\n")
    assert [m["round"] for m in _run(resume=run).metrics] == [3]


def test_a_checkpoint_copied_from_another_run_is_refused(tmp_path):
    run = _run(_job(tmp_path, "a")).run_dir
    other = _run(_job(tmp_path, "b", seed=5)).run_dir  # another seed
    twin = _run(_job(tmp_path, "c")).run_dir  # the same config, another run
    mine = saved_run_id(run)
    for source in (other, twin):
        (tmp_path / "a" / CHECKPOINT_FILE).write_bytes(
            (tmp_path / source.rsplit("/", 1)[-1] / CHECKPOINT_FILE).read_bytes())
        with pytest.raises(FedrayError) as err:
            _run(resume=run, overrides=["rounds=3"], allow_changes=["rounds"])
        theirs = read_checkpoint(run).run_id
        assert str(err.value) == (
            f"--resume {run}: its checkpoint.safetensors was written by another run (run id "
            f"{theirs}; this directory's config.yaml is run {mine}'s): a checkpoint copied "
            "from another run directory is not continued here; resume that run's own "
            "directory, or start a new run")


def test_a_checkpoint_of_an_earlier_fedray_resumes_against_config_yaml(tmp_path, capfd):
    """No run id, no recorded config (written before they existed): accepted with a note,
    compared with config.yaml as then."""
    run = _run(_job(tmp_path, "a")).run_dir
    old = read_checkpoint(run)
    old.run_id = old.config = None
    RunDir(run).write_bytes(CHECKPOINT_FILE, encode(old))
    with pytest.raises(FedrayError, match=r"differs from the run's config.yaml in client.lr"):
        _run(resume=run, overrides=["rounds=3", "client.lr=0.3"], allow_changes=["rounds"])
    capfd.readouterr()
    assert [m["round"] for m in _run(resume=run, overrides=["rounds=3"],
                                     allow_changes=["rounds"]).metrics] == [3]
    assert "records no config: the config is compared with config.yaml only" in \
        capfd.readouterr().err
    assert read_checkpoint(run).run_id == saved_run_id(run)  # it has one from now on


def test_a_recorded_config_edited_in_the_checkpoint_is_corrupt(tmp_path):
    from fedray.state.checkpoint import read_checkpoint_header

    run = _run(_job(tmp_path, "a")).run_dir
    path = tmp_path / "a" / CHECKPOINT_FILE
    data = path.read_bytes()
    path.write_bytes(data.replace(b'\\"lr\\": 0.1', b'\\"lr\\": 0.7', 1))
    assert path.read_bytes() != data
    with pytest.raises(FedrayError, match="is corrupt: ValueError: its recorded config does "
                       r"not match its fingerprint \(config_sha256\)$"):
        read_checkpoint_header(run)
