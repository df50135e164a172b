"""Escape codes belong on a terminal: a run whose output goes to a file gets plain Ray log
lines, including the note Ray's log deduplication appends to repeated lines."""

from __future__ import annotations

import io
import re

from fedray.runtime import session

ESCAPE = re.compile(r"\x1b\[")


def test_repeated_line_note_is_plain_when_output_is_not_a_terminal(monkeypatch):
    from ray._private import ray_logging

    monkeypatch.setattr(ray_logging, "_color", ray_logging._color)  # restored afterwards
    monkeypatch.delenv("RAY_COLOR_PREFIX", raising=False)
    batch = ray_logging.DedupState(0.0, 2, "(Worker pid=1) same line", {}, set())
    assert ESCAPE.search(batch.formatted())  # what Ray prints by default
    monkeypatch.setattr("sys.stdout", io.StringIO())  # a redirected log: not a terminal
    session._plain_log_prefixes()
    assert not ESCAPE.search(batch.formatted()), batch.formatted()
    assert "[repeated 2x across cluster]" in batch.formatted()
