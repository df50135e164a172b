"""fedray's version, in a module of its own: the CLI's --version, the run summary and the
store manifest record it without importing the package's entry points (fedray.api)."""

__version__ = "0.1.0"
