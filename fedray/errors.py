"""One exception type for every problem a user can fix.

The CLI prints a FedrayError as a single line and exits non-zero; anything else is a bug
and keeps its traceback. Keeping the distinction in one place means every module can raise
a user-facing error without knowing how it will be shown.
"""


class FedrayError(Exception):
    """A problem with the user's input or environment, shown as one line."""


class ConfigError(FedrayError):
    """An invalid configuration, detected before Ray starts."""
