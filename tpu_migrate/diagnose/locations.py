"""How a finding's place is shown: paths relative to the working directory, the source line."""

from __future__ import annotations

import linecache
import os


def relative(path: str) -> str:
    """A path under the working directory, relative to it; others as they are."""
    try:
        shown = os.path.relpath(path)
    except ValueError:  # another drive
        return path
    return path if shown.startswith("..") else shown


def source_line(path: str, line: int) -> str:
    return linecache.getline(path, line).strip()


# Where installed packages live: a path under one is shown from the package on.
PACKAGE_ROOTS = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)


def library_location(filename: str, line: int, function: str) -> str:
    """`torch/nn/utils/clip_grad.py:52 in clip_grad_norm_`: an installed package's file from
    the package on, any other relative to the working directory when under it."""
    for root in PACKAGE_ROOTS:
        if root in filename:
            return f"{filename.rsplit(root, 1)[1]}:{line} in {function}"
    return f"{relative(filename)}:{line} in {function}"


def via_text(via: list[str]) -> str:
    """How the user's line reached the library line where it happened."""
    return "via " + " -> ".join(via)


EXCHANGES = ("mesh_reduce", "rendezvous")


def exchange_of(via: list[str] | None) -> str | None:
    """The torch_xla call that exchanges Python values through the host (xm.mesh_reduce,
    xm.rendezvous) a read happened in, from its `via`, or None."""
    for place in via or ():
        for name in EXCHANGES:
            if place.endswith(f" in {name}"):
                return name
    return None
