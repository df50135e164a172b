"""benchmarks/cnn_client.py: every row it times is also checked bit-identical, and the script
fails (exit 1) where a row is not (no Ray; one pass of each part)."""

import json

from benchmark_scripts import loaded


def test_every_part_runs_and_is_bit_identical(tmp_path):
    out = tmp_path / "cnn.json"
    with loaded("cnn_client") as bench:
        code = bench.main(["--repeat", "1", "--models", "emnist_cnn", "--json", str(out)])
    rows = json.loads(out.read_text())
    assert code == 0
    assert [r["part"] for r in rows] == ["pooling"] * 3 + ["fold", "local training"]
    assert all(r["bit_identical"] and r["before_ms"] > 0 and r["after_ms"] > 0 for r in rows)


def test_a_row_that_differs_fails_the_script(monkeypatch):
    with loaded("cnn_client") as bench:
        monkeypatch.setattr(bench, "add_scaled_", lambda acc, v, a: acc.add_(v, alpha=a + 1))
        assert bench.main(["--part", "fold", "--repeat", "1"]) == 1
