"""Whether output goes to a terminal, decided as rich decides it, without importing rich where
the answer is no.

`rewrite` in CI, in pre-commit or into a pipe writes plain lines; rich draws only on a terminal
(the summary table, the progress bar). Importing rich costs about 40 ms of every start, a few
percent of a whole check of a project, so the plain path never imports it.
"""

from __future__ import annotations

import os
from typing import TextIO


def is_terminal(stream: TextIO) -> bool:
    """rich's `Console(file=stream).is_terminal`. Only a stream that is a tty, or an environment
    that overrides the answer (TTY_COMPATIBLE, FORCE_COLOR), can make rich say yes; for those,
    rich itself decides (it also says no to IDLE and Jupyter)."""
    if "TTY_COMPATIBLE" not in os.environ and "FORCE_COLOR" not in os.environ and not _isatty(stream):
        return False
    from rich.console import Console

    return Console(file=stream).is_terminal


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or closed: rich says no as well
        return False


def write_line(stream: TextIO, line: str) -> None:
    """One plain line: what `Console.print(line, markup=False)` wrote, less rich's emoji codes
    (a path with `:cat:` in it is printed as it is spelled)."""
    stream.write(line + "\n")
