"""jobs/paper/local_update_quadratics/figures.py end to end on a coarse grid: every figure of
seed 002 it promises is written, and the headline numbers keep their shape."""

from __future__ import annotations

import importlib.util
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "jobs" / "paper" / "local_update_quadratics" / "figures.py"


def test_figures_script_writes_every_figure(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("local_update_figures", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--out", str(tmp_path), "--points", "20", "--noise-draws", "4"]) == 0
    names = ["fig1", "fig2", "fig3", "fig4", "fig5", "fig7", "fig8", "fig9", "fig10"]
    for name in names:
        png = tmp_path / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines[:-1]] == names  # one line per figure
    checks = json.loads((tmp_path / "checks.json").read_text())
    assert checks["fig2"]["L=10"]["max_mirror_residual"]["heavy_ball"] < 1e-12
    assert checks["fig5"]["d=100"]["max_residual_K_below_threshold"] < 1e-12
