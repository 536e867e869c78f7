"""Leaving a torch dispatch mode the tracer entered (the fallback locator, native op coverage)."""

from __future__ import annotations


def leave_dispatch_mode(mode) -> None:
    """Exit `mode` if it is the innermost mode: never pop a mode the program entered since."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    if mode is not None and _get_current_dispatch_mode() is mode:
        mode.__exit__(None, None, None)
