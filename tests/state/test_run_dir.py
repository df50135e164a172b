import pytest
import torch

from fedray.errors import FedrayError
from fedray.state.run_dir import RunDir, load_weights, read_metrics
from fedray.state.storage import RunClaim


@pytest.mark.parametrize("scheme", ["local", "memory"])
def test_write_read_roundtrip(tmp_path, scheme):
    url = str(tmp_path / "r") if scheme == "local" else f"memory://fedray-test/{tmp_path.name}"
    d = RunDir(url)
    d.create("seed: 1\n")
    for r in (1, 2, 3):
        d.append_metrics({"round": r})
    d.save_weights({"w": torch.arange(3.0)})
    assert [m["round"] for m in read_metrics(url)] == [1, 2, 3]
    assert torch.equal(load_weights(url)["w"], torch.arange(3.0))
    assert not [p for p in d.fs.ls(d.path, detail=False) if p.endswith(".tmp")]
    if scheme == "local":
        with pytest.raises(FedrayError, match="already holds files"):
            RunClaim(url).acquire(new=True)


def test_a_failed_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    """A write that fails half-way (a full disk) removes its temporary file; the file it
    would have replaced stays as it was."""
    d = RunDir(str(tmp_path / "r"))
    d.create("seed: 1\n")
    d.save_weights({"w": torch.arange(3.0)})
    before = (tmp_path / "r" / "model.safetensors").read_bytes()

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(d.fs, "mv", full)
    with pytest.raises(OSError, match="No space"):
        d.save_weights({"w": torch.arange(5.0)})
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["config.yaml",
                                                                 "model.safetensors"]
    assert (tmp_path / "r" / "model.safetensors").read_bytes() == before
