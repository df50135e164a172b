"""A checkpoint whose header holds values no run can have written is refused as corrupt, in
one line, rather than resumed into negative rounds or failing inside the driver (issue 39,
item 15)."""

import json

import pytest
import torch
from safetensors.torch import save as save_safetensors

from fedray.errors import FedrayError
from fedray.state.checkpoint import decode

GOOD = {"round": 3, "metrics": ['{"round": 1}\n', '{"round": 2}\n', '{"round": 3}\n']}


def _file(meta, tensors=None) -> bytes:
    tensors = tensors or {"weights": torch.ones(4)}
    text = meta if isinstance(meta, str) else json.dumps(meta)
    return save_safetensors(tensors, metadata={"fedray_checkpoint": text})


def test_a_possible_header_is_read():
    ckpt = decode(_file(GOOD), "here")
    assert ckpt.round == 3 and len(ckpt.metrics_lines) == 3


@pytest.mark.parametrize("meta", [
    GOOD | {"round": -5}, GOOD | {"round": 0}, GOOD | {"round": 2.5},
    GOOD | {"round": "3"}, GOOD | {"round": True}, GOOD | {"round": None},
    {"metrics": []}, GOOD | {"metrics": "x"}, GOOD | {"metrics": None},
    GOOD | {"metrics": ['{"round": 1}'] * 4},  # more lines than rounds
    GOOD | {"metrics": ["not json"]}, GOOD | {"metrics": ["[1, 2]"]}, GOOD | {"metrics": [7]},
    GOOD | {"metrics": ['{"round": 0}']}, GOOD | {"metrics": ['{"round": 9}']},
    GOOD | {"metrics": ['{"round": "1"}']}, GOOD | {"metrics": ['{"round": NaN}']},
    [1, 2], "null", "3",
], ids=lambda m: json.dumps(m)[:60])
def test_impossible_header_values_are_refused(meta):
    with pytest.raises(FedrayError, match=r"^checkpoint here is corrupt: ") as info:
        decode(_file(meta), "here")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("clients, versions", [
    (-1, [1]), ("10", [1]), (None, [1]), (10, [4]),  # a version after round 3
], ids=str)
def test_impossible_client_state_is_refused(clients, versions):
    tensors = {"weights": torch.ones(4), "client_state.ids": torch.tensor([2]),
               "client_state.versions": torch.tensor(versions, dtype=torch.int32)}
    with pytest.raises(FedrayError, match=r"^checkpoint here is corrupt: "):
        decode(_file(GOOD | {"clients": clients}, tensors), "here")
