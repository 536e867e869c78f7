"""Leaving a torch dispatch mode the tracer entered (the fallback locator, native op coverage)."""

from __future__ import annotations


def leave_dispatch_mode(mode) -> None:
    """Exit `mode` if it is the innermost mode: never pop a mode the program entered since.
    No mode, no import: at exit, a program that never imported torch must not import it now."""
    if mode is None:
        return
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    if _get_current_dispatch_mode() is mode:
        mode.__exit__(None, None, None)
