"""One exception type for every problem a user can fix, and the one format it names a key in.

The CLI prints a FedrayError as a single line and exits non-zero; anything else is a bug
and keeps its traceback. Keeping the distinction in one place means every module can raise
a user-facing error without knowing how it will be shown. ``key_error`` is the only way a
message names a bad key of a job, a recipe or a sweep (``config key 'client.lr': must be
> 0, got -1.0``), so a user meets one format whichever module found the mistake.
"""

from __future__ import annotations

from typing import Any

_UNSET: Any = object()


def one_line(exc: BaseException) -> str:
    """The first line of an exception's message (or its type's name), for a one-line error
    that wraps a library's multi-line one."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# what ends or rewrites a terminal line: C0 and C1 controls (newline, carriage return,
# escape sequences), DEL, and Unicode's line and paragraph separators
_LINE_BREAKERS = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))} | {
    0x2028: "\\u2028", 0x2029: "\\u2029", 0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}


def printable_line(text: str) -> str:
    """``text`` as one line on a terminal: a control character or a line separator that a
    user's value brought into a message (a name with a newline, an escape sequence in a
    path) is shown escaped, as repr shows it, so that an error stays one line and cannot
    rewrite what the terminal shows."""
    return text.translate(_LINE_BREAKERS)


class FedrayError(Exception):
    """A problem with the user's input or environment, shown as one line."""


class ConfigError(FedrayError):
    """An invalid configuration, detected before Ray starts."""


class DivergedError(FedrayError):
    """The global model became non-finite (or every client update of a round was), under
    ``guard.non_finite: stop``. Its own type so that a caller of fedray.run -- a sweep, a
    notebook -- can tell a diverged run (a result about the learning rate) from a broken
    one; ``round`` is the round that diverged, ``checkpoint`` the round of the last
    checkpoint, which holds finite values and is intact (0: none)."""

    def __init__(self, message: str, round: int = 0, checkpoint: int = 0):
        super().__init__(message)
        self.round, self.checkpoint = round, checkpoint

    def __reduce__(self) -> tuple:  # pickled through Ray with its fields, not just args
        return (type(self), (str(self), self.round, self.checkpoint))


class PartError(FedrayError):
    """A part of the job's algorithm (a user's client part, aggregator, update stage or
    server optimizer) that failed, or returned what the runtime cannot use; the message
    names it as the job does (``algorithm.aggregator my_algos:Median: ...``). ``detail``
    is the part's own traceback where it raised one, shown with ``--debug`` (a note of the
    exception) -- the one line is what a Ray worker's error becomes on the way to the user."""

    def __init__(self, message: str, detail: str = ""):
        super().__init__(message)
        self.detail = detail
        if detail and hasattr(self, "add_note"):  # Python >= 3.11
            self.add_note(detail)

    def __reduce__(self) -> tuple:  # pickled through Ray with its traceback text
        return (type(self), (str(self), self.detail))


def key_error(key: str, problem: str, value: Any = _UNSET, *,
              what: str = "config") -> ConfigError:
    """``{what} key 'KEY': PROBLEM[, got VALUE]``: what is wrong with one key's value.

    ``what`` names the kind of file the key belongs to (config, recipe, sweep)."""
    got = "" if value is _UNSET else f", got {value!r}"
    return ConfigError(f"{what} key '{key}': {problem}{got}")


def yaml_problem(exc: BaseException) -> str:
    """A YAML error as one line that keeps what PyYAML says is wrong and where (line and
    column, 1-based), e.g. ``found duplicate key a (line 2, column 1)``; PyYAML's own
    message spreads that over several lines whose first says only what it was parsing."""
    problem = getattr(exc, "problem", None)
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if problem is None:
        return one_line(exc)
    text = " ".join(str(problem).split())
    context = getattr(exc, "context", None)
    if context and "duplicate" not in text:
        text = f"{' '.join(str(context).split())}: {text}"
    if mark is not None:
        text += f" (line {mark.line + 1}, column {mark.column + 1})"
    return text
