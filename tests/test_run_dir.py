import pytest
import torch

from fedray.errors import FedrayError
from fedray.run_dir import RunDir, load_weights, read_metrics


@pytest.mark.parametrize("scheme", ["local", "memory"])
def test_write_read_roundtrip(tmp_path, scheme):
    url = str(tmp_path / "r") if scheme == "local" else f"memory://fedray-test/{tmp_path.name}"
    d = RunDir(url)
    d.check_new()
    d.create("seed: 1\n")
    for r in (1, 2, 3):
        d.append_metrics({"round": r})
    d.save_weights({"w": torch.arange(3.0)})
    assert [m["round"] for m in read_metrics(url)] == [1, 2, 3]
    assert torch.equal(load_weights(url)["w"], torch.arange(3.0))
    assert not [p for p in d.fs.ls(d.path, detail=False) if p.endswith(".tmp")]
    with pytest.raises(FedrayError, match="already holds files"):
        RunDir(url).check_new()


def test_output_path_that_is_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(FedrayError, match="not a directory"):
        RunDir(str(tmp_path / "f")).check_new()
