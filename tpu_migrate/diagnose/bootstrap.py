"""Runs the user's program as `python SCRIPT ARGS` (or `python -m MODULE ARGS`) would, with the
tracer installed: same arguments, `__main__`, absolute `__file__`, sys.path[0], cwd, stdio and exit
status.

    python -m tpu_migrate.diagnose.bootstrap script PATH [ARGS...]
    python -m tpu_migrate.diagnose.bootstrap module NAME [ARGS...]
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import traceback

from tpu_migrate.diagnose import recording, tracer

# The signals the tool blocked before it started this process (runner._block_signals).
ENV_UNBLOCK = "TPU_MIGRATE_DIAGNOSE_UNBLOCK"
# The tool's process id: the program ends when the tool does (see _end_with_the_tool).
ENV_TOOL = "TPU_MIGRATE_DIAGNOSE_TOOL"
PR_SET_PDEATHSIG = 1


def _end_with_the_tool() -> None:
    """A tool that dies (SIGKILL, the OOM killer) can neither read what the program records nor
    remove the run's directory, and an endless program would record until the disk is full: the
    program gets SIGTERM then, as if the tool had relayed it (PR_SET_PDEATHSIG, Linux only)."""
    tool = os.environ.pop(ENV_TOOL, "")
    if not tool.isdigit() or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            return
    except (OSError, AttributeError):
        return
    if os.getppid() != int(tool):  # the tool was gone before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


def main() -> None:
    mode, target, *args = sys.argv[1:]
    # The program starts with the tool's caller's signal mask; one that arrived while they were
    # blocked is delivered now.
    unblock = os.environ.pop(ENV_UNBLOCK, "")
    if unblock:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {int(s) for s in unblock.split(",")})
    _end_with_the_tool()
    tracer.install()
    if mode == "script":
        sys.argv = [target, *args]
        sys.path[0] = os.path.dirname(os.path.abspath(target))
        # As python does, __file__ and the code's file name are absolute: a program that changes
        # directory must still find itself, and we its lines. (runpy makes argv[0] the same
        # absolute path; python keeps it as typed. Either is the script.)
        path = os.path.abspath(target)
        runner = lambda: runpy.run_path(path, run_name="__main__")  # noqa: E731
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
        while tb is not None and recording.is_library(tb.tb_frame.f_code.co_filename):
            tb = tb.tb_next
        traceback.print_exception(type(exc), exc, tb or exc.__traceback__)
        sys.exit(1)


if __name__ == "__main__":
    main()
