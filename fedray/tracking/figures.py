"""Figures as files: how every fedray command that draws (``fedray report``, ``fedray
partition --describe --plot``, ``fedray privacy epsilon --plot``) turns a matplotlib figure
into a file a user named.

Three things go wrong with matplotlib's own ``savefig(path)``, each a traceback or a broken
file before this module: a name whose extension matplotlib cannot write (``--plot x.xyz``)
is found only after all the work; a user's text in a figure (a report's ``--title``, a
run's name in a legend, a store's source name) is read as mathematics when it holds ``$``
(``--title "cost in $ and $$"`` fails to parse at savefig); and a full disk leaves a
truncated image behind. So: the format is checked first (``figure_format``), figures are
drawn with user text as plain text (``plain_text``), rendered to memory and written whole
or not at all (``figure_bytes``, fedray.state.storage.write_atomic).
"""

from __future__ import annotations

import contextlib
import io
import os
import warnings
from collections.abc import Iterator
from typing import Any

from fedray.errors import FedrayError

# the image types matplotlib writes without anything outside the Python packages fedray
# installs (its pgf needs a LaTeX, its webp and avif a Pillow built with them)
FORMATS = ("png", "pdf", "svg", "svgz", "eps", "ps", "jpg", "jpeg", "tif", "tiff")


def figure_format(path: str, option: str) -> str:
    """The image type ``path``'s extension names (png without one), or one line naming
    ``option`` and the types there are."""
    ext = os.path.splitext(path.rstrip("/"))[1].lstrip(".").lower()
    if not ext:
        return "png"
    if ext not in FORMATS:
        raise FedrayError(f"{option} {path}: cannot write a .{ext} image; give a file name "
                          f"ending in {', '.join('.' + f for f in FORMATS)}")
    return ext


@contextlib.contextmanager
def plain_text() -> Iterator[None]:
    """Figures made inside read ``$`` as a dollar sign, not as the start of mathematics
    (matplotlib's text.parse_math, read when each text is created), and a glyph the font
    lacks (a title in a script DejaVu Sans does not cover) is drawn as a box without a
    warning on stderr, where fedray prints only its result or one error line."""
    import matplotlib

    with matplotlib.rc_context({"text.parse_math": False, "text.usetex": False}), \
            warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from",
                                category=UserWarning)
        warnings.filterwarnings("ignore", message=r"Matplotlib currently does not support",
                                category=UserWarning)
        yield


def figure_bytes(fig: Any, fmt: str, dpi: int) -> bytes:
    """``fig`` rendered as a ``fmt`` image in memory (then closed): a file is written only
    once the whole image exists."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    try:
        with plain_text():
            fig.savefig(buf, format=fmt, dpi=dpi)
    finally:
        plt.close(fig)
    return buf.getvalue()


def write_figure(fig: Any, path: str, option: str, dpi: int) -> None:
    """Render ``fig`` and write it to the local or fsspec ``path`` whole or not at all; one
    line naming ``option`` when it cannot be written (a directory, a full disk)."""
    # imported when used (start-up time): fsspec, which `fedray --help` does not load
    from fedray.state.storage import filesystem, write_atomic

    data = figure_bytes(fig, figure_format(path, option), dpi)
    fs, target = filesystem(path, option, durable=True, what=None)
    try:
        write_atomic(fs, [(target, data)])
    except OSError as exc:
        raise FedrayError(f"{option} {path}: cannot write it: "
                          f"{exc.strerror or type(exc).__name__}") from None
