"""Ending the tool's own process without freeing, one by one, everything it built.

At exit Python frees every object and module: with libcst's classes and a rewrite's trees that
is about 50 ms, a few percent of checking a whole project. Where the process is the tool's
(`tpu-migrate`, `python -m tpu_migrate`: `run` in __main__.py says so) the rewrite command ends
as Python does up to that point (its atexit functions run, stdout and stderr are flushed, and a
failed flush makes the status 120, with a line saying so) and then leaves with os._exit, as mypy does. It
falls back to a plain exit where a thread other than the main one is alive (Python would wait
for it), and wherever the tool is called from other code.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading

# Set by the entry point when the process is the tool's own.
owns_process = False


def leave(status: int) -> None:
    """Exit with `status`: without the teardown where that is safe (see the module)."""
    if not owns_process or threading.active_count() > 1:
        sys.exit(status)
    atexit._run_exitfuncs()
    for name in ("stdout", "stderr"):
        try:
            stream = getattr(sys, name)
            if stream is not None and not stream.closed:  # Python skips a closed one too
                stream.flush()
        except (OSError, ValueError) as exc:
            status = 120  # what Python gives when flushing either fails at exit
            try:
                os.write(2, f"tpu-migrate: cannot write to {name}: {exc}\n".encode(errors="replace"))
            except OSError:
                pass
    os._exit(status)
