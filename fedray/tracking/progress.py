"""Terminal progress for ``fedray run``: one live line on a terminal, sparse lines in logs.

A callback (fedray.tracking.callbacks) of the run; also a plain function of a round's metrics, as
``fedray.run(progress=...)`` was given before callbacks existed."""

from __future__ import annotations

import sys
from typing import TextIO

from fedray.tracking.callbacks import Callback


class Progress(Callback):
    def __init__(self, total_rounds: int, stream: TextIO | None = None, width: int = 24):
        self.total = total_rounds
        self.stream = stream or sys.stderr
        self.width = width
        self.tty = self.stream.isatty()
        self.accuracy: float | None = None
        self.every = max(1, total_rounds // 20)

    def line(self, m: dict) -> str:
        r = m["round"]
        done = round(self.width * r / self.total)
        bar = "#" * done + "." * (self.width - done)
        acc = "  -  " if self.accuracy is None else f"{self.accuracy:.3f}"
        # a round that kept no client update has no train_loss
        loss = f"{m['train_loss']:.3f}" if m.get("train_loss") is not None else "  -  "
        return (f"round {r:>{len(str(self.total))}}/{self.total} [{bar}] acc {acc} | "
                f"{m['updates_per_s']:7.1f} client updates/s | loss {loss} | "
                f"{m['elapsed_s']:6.1f}s")

    def __call__(self, m: dict) -> None:
        if "test_accuracy" in m:
            self.accuracy = m["test_accuracy"]
        if self.tty:
            self.stream.write("\r" + self.line(m) + "\x1b[K")  # clear leftovers
        elif "test_accuracy" in m or m["round"] % self.every == 0:
            self.stream.write(self.line(m) + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()

    def on_round_end(self, round: int, metrics: dict, weights: dict | None) -> None:
        self(metrics)

    def on_run_end(self, summary: dict) -> None:
        self.close()  # the live line ends before the command's result is printed

    def on_run_failed(self, error: BaseException) -> None:
        self.close()  # ... or its error
