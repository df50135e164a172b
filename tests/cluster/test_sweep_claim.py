"""fedray sweep claims its ``output`` before Ray starts (issue 39, item 1): two sweeps to one
directory, and the second is refused in one line; no training is run (Ray's session is
replaced by a stand-in that ends the first sweep where Ray would start)."""

from __future__ import annotations

import contextlib
import os
import socket

import yaml
from conftest import tiny_job

from fedray import cli
from fedray.cluster import sweep
from fedray.errors import FedrayError
from fedray.state.storage import LOCK_FILE


class RayWouldStart(FedrayError):
    """Raised by the stand-in for ray_session: the sweep got as far as starting Ray."""


def test_a_second_sweep_to_the_same_output_is_refused_before_ray_starts(tmp_path, capsys,
                                                                        monkeypatch):
    out = tmp_path / "sweep"
    job = tiny_job(tmp_path)
    del job["output"]
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(
        {"name": "t", "job": job, "parameters": {"seed": [0]}, "output": str(out)}))
    sweeps: list[str] = []  # the sweeps that reached Ray
    second: list = []

    @contextlib.contextmanager
    def ray_session(runtime):
        sweeps.append("started Ray")
        if len(sweeps) == 1:  # the first sweep: the second one starts now, to the same output
            capsys.readouterr()
            second.append((cli.main(["sweep", str(tmp_path / "s.yaml")]),
                           capsys.readouterr().err.splitlines()))
        raise RayWouldStart("Ray would start here")
        yield

    monkeypatch.setattr(sweep, "ray_session", ray_session)  # where the sweep starts Ray
    code = cli.main(["sweep", str(tmp_path / "s.yaml")])
    assert code == 2 and "Ray would start here" in capsys.readouterr().err
    assert sweeps == ["started Ray"]  # the second sweep never got that far (before: both did)
    code2, err2 = second[0]
    assert code2 == 2 and len(err2) == 1, err2
    since = err2[0].split("since ")[1].split(")")[0]
    assert err2[0] == (f"fedray: error: sweep key 'output': {out} is in use by another sweep "
                       f"(pid {os.getpid()} on {socket.gethostname()}, since {since}); if that "
                       f"sweep is gone, delete {out}/{LOCK_FILE}")
    assert not out.exists()  # the first sweep failed before writing anything: no directory
