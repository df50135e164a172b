"""One exception type for every problem a user can fix.

The CLI prints a FedrayError as a single line and exits non-zero; anything else is a bug
and keeps its traceback. Keeping the distinction in one place means every module can raise
a user-facing error without knowing how it will be shown.
"""


def one_line(exc: BaseException) -> str:
    """The first line of an exception's message (or its type's name), for a one-line error
    that wraps a library's multi-line one."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class FedrayError(Exception):
    """A problem with the user's input or environment, shown as one line."""


class ConfigError(FedrayError):
    """An invalid configuration, detected before Ray starts."""
