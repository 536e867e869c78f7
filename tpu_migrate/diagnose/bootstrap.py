"""Runs the user's program as `python SCRIPT ARGS` (or `python -m MODULE ARGS`) would, with the
tracer installed: same sys.argv, `__main__`, sys.path[0], cwd, stdio and exit status.

    python -m tpu_migrate.diagnose.bootstrap script PATH [ARGS...]
    python -m tpu_migrate.diagnose.bootstrap module NAME [ARGS...]
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import traceback

from tpu_migrate.diagnose import tracer

# The signals the tool blocked before it started this process (runner._block_signals).
ENV_UNBLOCK = "TPU_MIGRATE_DIAGNOSE_UNBLOCK"


def main() -> None:
    mode, target, *args = sys.argv[1:]
    # The program starts with the tool's caller's signal mask; one that arrived while they were
    # blocked is delivered now.
    unblock = os.environ.pop(ENV_UNBLOCK, "")
    if unblock:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {int(s) for s in unblock.split(",")})
    tracer.install()
    if mode == "script":
        sys.argv = [target, *args]
        sys.path[0] = os.path.dirname(os.path.abspath(target))
        runner = lambda: runpy.run_path(target, run_name="__main__")  # noqa: E731
    else:
        sys.argv = [target, *args]
        sys.path[0] = os.getcwd()
        runner = lambda: runpy.run_module(target, run_name="__main__", alter_sys=True)  # noqa: E731
    try:
        runner()
    except SystemExit:
        raise
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # print it as Python would, without the bootstrap's frames
        tb = exc.__traceback__
        while tb is not None and tracer.is_library(tb.tb_frame.f_code.co_filename):
            tb = tb.tb_next
        traceback.print_exception(type(exc), exc, tb or exc.__traceback__)
        sys.exit(1)


if __name__ == "__main__":
    main()
