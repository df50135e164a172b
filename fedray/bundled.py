"""The jobs and partition recipes that come with fedray, by name: ``fedray run quickstart``,
``fedray partition femnist source.path=...``, ``fedray jobs``, ``fedray recipes``.

One copy of each file: the repository's top-level ``jobs/`` and ``partitions/`` are the
canonical ones (the mission's layout, where people read and edit them). A wheel or sdist build
copies both into the package as ``fedray/_bundled/jobs`` and ``fedray/_bundled/partitions``
(setup.py's build_py), so an installed fedray has them without the repository. Run from a
checkout (an editable install, or the source tree on ``sys.path``), nothing is copied and the
top-level folders are read in place, so an edited job is the job that runs.

A bare name (not an existing file, not a URL, not ending in ``.yaml``) is looked up here:
``quickstart`` is ``jobs/quickstart.yaml``, ``femnist/fedavg`` is
``jobs/femnist/fedavg.yaml``. A path to an existing file always means
that file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from fedray.config import FILE_COMMANDS, file_kind
from fedray.errors import FedrayError

KINDS = {"jobs": "job", "partitions": "recipe"}


def root(folder: str) -> Path | None:
    """Where the bundled ``folder`` (jobs or partitions) is: inside the installed package,
    else the checkout's top level; None when neither has it."""
    package = Path(__file__).resolve().parent
    # the top level only of a checkout (its setup.py beside the package): an installed
    # fedray's parent is site-packages, whose jobs/ would be another package's
    checkout = [package.parent] if (package.parent / "setup.py").is_file() else []
    for base in (package / "_bundled", *checkout):
        if (base / folder).is_dir() and any((base / folder).rglob("*.yaml")):
            return base / folder
    return None


@dataclass(frozen=True)
class Bundled:
    name: str  # quickstart, femnist/fedavg
    path: Path
    summary: str  # the file's leading comment, its first sentence
    command: str  # what runs it: fedray run, fedray sweep, fedray partition


SUMMARY_WIDTH = 110  # characters of a file's first sentence that ``fedray jobs`` shows


def _summary(path: Path) -> str:
    """The leading comment up to the first line that ends a sentence (its indented lines are
    examples of a command, not prose), cut at a word to ``SUMMARY_WIDTH``: a sentence may run
    over several lines, and a full stop inside a line is often an abbreviation (Sec., i.i.d.)."""
    words: list[str] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            text = line.strip()
            if not text.startswith("#"):
                break
            body = text[1:]
            if not body.strip() or body.startswith("  "):
                break
            words.extend(body.split())
            if body.rstrip().endswith("."):
                break
    sentence = " ".join(words)
    if len(sentence) > SUMMARY_WIDTH:
        sentence = sentence[:SUMMARY_WIDTH - 3].rsplit(" ", 1)[0] + "..."
    return sentence


def listing(folder: str) -> list[Bundled]:
    """Every bundled YAML file of ``folder``, by name, sorted."""
    base = root(folder)
    if base is None:
        return []
    out = [Bundled(p.relative_to(base).with_suffix("").as_posix(), p, _summary(p),
                   _command(folder, p))
           for p in base.rglob("*.yaml")]
    return sorted(out, key=lambda b: b.name)


def _command(folder: str, path: Path) -> str:
    """What runs the file: a sweep file lives among the jobs but runs with ``fedray sweep``.
    Its top-level keys are read as text, so that listing parses no YAML."""
    with open(path, encoding="utf-8") as f:
        top = {line.split(":", 1)[0] for line in f if line[:1].isalpha()}
    return FILE_COMMANDS[file_kind(top) or KINDS[folder]]


def is_name(arg: str) -> bool:
    """Whether ``arg`` asks for a bundled file rather than naming a file: it is not an
    existing path, has no URL scheme, and does not end in .yaml/.yml."""
    return (not os.path.exists(arg) and "://" not in arg
            and not arg.endswith((".yaml", ".yml")))


def resolve(folder: str, arg: str) -> str:
    """``arg`` as a file path: itself, unless it is a bundled name (``is_name``), which
    must exist; the error lists what does."""
    if not is_name(arg):
        return arg
    # looked up among the listing's names, never joined to a path: ``../../x`` or an
    # absolute name is no bundled file, whatever exists where the join would point
    path = {b.name: b.path for b in listing(folder)}.get(arg)
    if path is None:
        kind = KINDS[folder]
        names = ", ".join(b.name for b in listing(folder) if "/" not in b.name)
        raise FedrayError(f"no file {arg!r} and no bundled {kind} of that name (fedray "
                          f"{'jobs' if folder == 'jobs' else 'recipes'} lists them"
                          + (f"; top level: {names}" if names else "") + ")")
    return str(path)


def show(folder: str, name: str) -> str:
    """A bundled file's text, to copy out and edit: ``fedray jobs show quickstart > my.yaml``."""
    path = Path(resolve(folder, name)) if is_name(name) else None
    if path is None:
        raise FedrayError(f"{name!r} is a file, not a bundled name: read it directly")
    return path.read_text(encoding="utf-8")


def table(folder: str) -> str:
    """One line per bundled file: its name and what it is; a file that another command
    than the folder's usual one runs (a sweep among the jobs) says which."""
    items = listing(folder)
    if not items:
        return f"(no bundled {folder}: this fedray was installed without them)"
    width = max(len(b.name) for b in items)
    usual = FILE_COMMANDS[KINDS[folder]]
    return "\n".join(f"{b.name:<{width}}  "
                     + (f"[{b.command}] " if b.command != usual else "") + b.summary
                     for b in items)
