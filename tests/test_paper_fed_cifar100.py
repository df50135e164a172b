"""Reproduction 8: jobs/paper/fed_cifar100/invariants.py on small generated CIFAR-100 files."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import sys

import numpy as np
import pytest

import fedray.data.partitioners
from fedray.data.partition import Partition

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "jobs" / "paper" / "fed_cifar100" / "invariants.py"
QUICK = ["--generate", "--per-fine-train", "10"]


@pytest.fixture(scope="module")
def invariants():
    spec = importlib.util.spec_from_file_location("fed_cifar100_invariants", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def test_generated_store_meets_every_invariant(invariants, tmp_path, capsys):
    out = tmp_path / "out"
    assert invariants.main([*QUICK, "--out", str(out)]) == 0
    doc = json.loads((out / "invariants.json").read_text())
    rows = doc["rows"]
    assert len(rows) > 30 and not doc["failed"]
    for row in rows:
        # With 10 images per fine label a label runs out during the first client, so the
        # no-depletion (Dirichlet reference) rows have no clients to test; all else applies.
        if "Dirichlet ref." in row["name"]:
            assert row["status"] == "skip", row
        else:
            assert row["status"] == "pass", row
    names = " ".join(r["name"] for r in rows)
    for what in ("train clients", "coarse == FINE_TO_COARSE", "exactly once",
                 "same seed, rebuilt", "different pixels, same labels", "sequential ref."):
        assert what in names
    md = (out / "invariants.md").read_text()
    assert "--per-fine-train 10" in md and "| **FAIL** |" not in md
    png = (out / "labels.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    printed = capsys.readouterr().out
    assert "building the store" in printed and "all " in printed


def test_a_client_with_99_examples_is_caught(invariants, tmp_path, monkeypatch, capsys):
    real = fedray.data.partitioners.partition

    def one_example_moved(*args, **kwargs) -> Partition:
        p = real(*args, **kwargs)
        train = list(p.train)
        train[1] = np.concatenate([train[1], train[0][-1:]])
        train[0] = train[0][:-1]
        return Partition(p.client_names, train, p.test, p.train_labels, p.info)

    monkeypatch.setattr(fedray.data.partitioners, "partition", one_example_moved)
    out = tmp_path / "out"
    code = invariants.main([*QUICK, "--out", str(out), "--replicates", "4",
                            "--reference-clients", "1000"])
    assert code == 1
    failed = json.loads((out / "invariants.json").read_text())["failed"]
    assert "train examples per client" in failed
    assert not any("exactly once" in name or "coarse ==" in name for name in failed)
    assert "FAILED" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["--cifar", "/nonexistent/cifar-100-python"], "/nonexistent/cifar-100-python"),
    (["--generate", "--cifar", "/tmp"], "not allowed with argument"),
    ([], "one of the arguments --cifar --generate is required"),
    (["--generate", "--per-fine-train", "4"], "--per-fine-train must be >= 5"),
])
def test_bad_input_exits_2_with_one_line(invariants, tmp_path, capsys, args, message):
    assert invariants.main([*args, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_files_that_are_not_cifar_exit_2(invariants, tmp_path, capsys):
    (tmp_path / "train").write_bytes(b"not a pickle")
    (tmp_path / "test").write_bytes(b"not a pickle")
    assert invariants.main(["--cifar", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "not a CIFAR-100 pickle" in capsys.readouterr().err
