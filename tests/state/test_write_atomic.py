"""fedray.state.storage.write_atomic, the one way fedray writes finished files (run
directories' files, reports, plots): whole or not at all (issue 39, item 15: a report on a
full disk left a truncated PNG)."""

import errno
import json
import os

import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem

from fedray.errors import FedrayError
from fedray.state.storage import write_atomic


def _full_disk_after(monkeypatch, limit: int) -> None:
    """Local writes of temporary files fail with ENOSPC after ``limit`` bytes, as on a
    full disk: the bytes before it are on disk, the rest is not."""
    real_open = LocalFileSystem.open

    class Full:
        def __init__(self, f):
            self.f, self.n = f, 0

        def write(self, data):
            room = max(0, limit - self.n)
            self.f.write(data[:room])
            self.n += min(len(data), room)
            if len(data) > room:
                raise OSError(errno.ENOSPC, "No space left on device")
            return len(data)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    def open_(self, path, mode="rb", **kw):
        f = real_open(self, path, mode, **kw)
        return Full(f) if "w" in mode and str(path).endswith(".tmp") else f

    monkeypatch.setattr(LocalFileSystem, "open", open_)


def test_all_files_or_none(tmp_path, monkeypatch):
    fs = fsspec.filesystem("file")
    (tmp_path / "b").write_bytes(b"old b")
    _full_disk_after(monkeypatch, 100)
    files = [(str(tmp_path / "a"), b"x" * 50), (str(tmp_path / "b"), b"y" * 500)]
    with pytest.raises(OSError) as info:
        write_atomic(fs, files)
    assert info.value.errno == errno.ENOSPC
    assert sorted(os.listdir(tmp_path)) == ["b"]  # no a, no temporary file
    assert (tmp_path / "b").read_bytes() == b"old b"
    monkeypatch.undo()
    write_atomic(fs, files)
    assert (tmp_path / "a").read_bytes() == b"x" * 50
    assert (tmp_path / "b").read_bytes() == b"y" * 500
    assert sorted(os.listdir(tmp_path)) == ["a", "b"]


def test_a_target_that_is_not_a_regular_file_is_refused(tmp_path):
    fs = fsspec.filesystem("file")
    (tmp_path / "d").mkdir()
    for target, code in ((tmp_path / "d", errno.EISDIR), ("/dev/null", errno.EINVAL)):
        with pytest.raises(OSError) as info:
            write_atomic(fs, [(str(target), b"png")])
        assert info.value.errno == code
    assert os.path.exists("/dev/null") and not os.path.isfile("/dev/null")  # not replaced
    assert [p.name for p in tmp_path.iterdir()] == ["d"]


def test_a_report_on_a_full_disk_leaves_nothing(tmp_path, monkeypatch):
    from fedray.tracking.report import build_report

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("name: a\nseed: 0\n")
    (run / "metrics.jsonl").write_text(json.dumps({"round": 1, "test_accuracy": 0.5}) + "\n")
    _full_disk_after(monkeypatch, 1000)  # the PNG is larger
    with pytest.raises(FedrayError, match=r"--out .*new/report: writing the report failed: "
                                          r"No space left on device; nothing was written$"):
        build_report([str(run)], str(tmp_path / "new" / "report"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # new/ made, then removed
