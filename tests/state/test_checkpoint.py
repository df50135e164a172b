"""The checkpoint file and the config check of --resume, without Ray."""

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from fedray.config import load_config
from fedray.errors import FedrayError
from fedray.state.checkpoint import (
    Checkpoint,
    check_same_config,
    decode,
    encode,
    masked_keys,
    read_checkpoint,
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


def test_config_check_names_keys_and_allows_only_safe_ones():
    saved = load_config({"rounds": 10, "output": {"dir": "/runs/a"}})
    same = load_config({"rounds": 10, "output": {"dir": "/elsewhere"}})
    assert check_same_config("/runs/a", saved, same) == []  # output.dir is never compared
    new = load_config({"rounds": 20, "client": {"lr": 0.5}})
    with pytest.raises(FedrayError, match=r"in client.lr \(0.1 -> 0.5\), rounds \(10 -> 20\)"):
        check_same_config("/runs/a", saved, new)
    with pytest.raises(FedrayError, match=r"in client.lr \(0.1 -> 0.5\)$"):
        check_same_config("/runs/a", saved, new, ["rounds"])
    with pytest.raises(FedrayError, match="--allow-change client.lr: only keys"):
        check_same_config("/runs/a", saved, new, ["rounds", "client.lr"])
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
