"""What the clocked-run tests share: a run killed after a round, then resumed, must equal
the uninterrupted run -- its schedule (the keys given) and its weights, bit for bit."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from conftest import fixed_linear

import fedray
from fedray.state.run_dir import read_metrics
from fedray.tracking.callbacks import Callback


class CrashAfter(Callback):
    """The process killed after round ``at``'s metrics were written."""

    def __init__(self, at: int):
        self.at = at

    def on_round_end(self, round, metrics, weights):
        if round == self.at:
            raise KeyboardInterrupt


def check_resume(tmp_path, run: Callable[..., fedray.RunResult], keys: tuple[str, ...],
                 clients: dict) -> None:
    """``run(tmp_path, name, callbacks=...)`` whole, and cut after round 3 (checkpoint
    every 2 rounds) then resumed: the same metrics under ``keys`` and the same weights."""
    whole = run(tmp_path, "whole")
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, "cut", callbacks=[CrashAfter(3)])
    resumed = fedray.run(resume=str(tmp_path / "cut"), model_fn=fixed_linear()[0],
                         client_data=clients)
    assert resumed.summary["resumed_from_round"] == 2
    for x, y in zip(read_metrics(str(tmp_path / "cut")), whole.metrics, strict=True):
        assert {k: x[k] for k in keys} == {k: y[k] for k in keys}
    for k in whole.weights:
        assert torch.equal(resumed.weights[k], whole.weights[k]), k
