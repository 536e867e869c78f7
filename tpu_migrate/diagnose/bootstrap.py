"""Runs the user's program as `python SCRIPT ARGS` (or `python -m MODULE ARGS`) would, with the
tracer installed: same arguments (`sys.argv[0]` as typed), `__main__` with python's `__file__`
(absolute), `__loader__`, `__package__` and `__spec__`, sys.path[0] (the script's real directory,
a symlink resolved; none under PYTHONSAFEPATH), cwd, stdio, `sys.excepthook` for an uncaught
exception, exit status (an uncaught KeyboardInterrupt ends the process by SIGINT, as python's
does), and how deep the program may recurse (the limit it sees and sets is its own; the tool's
frames above it do not count). A zip with `__main__.py` runs through runpy, as python runs it.

    python -m tpu_migrate.diagnose.bootstrap script PATH [ARGS...]
    python -m tpu_migrate.diagnose.bootstrap module NAME [ARGS...]
"""

from __future__ import annotations

import builtins
import importlib.machinery
import io
import os
import runpy
import signal
import sys
import types
import zipfile

from tpu_migrate.diagnose import recording, signals, tracer

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
    signals.report_received()  # before the unblock: a signal waiting there is reported too
    unblock = os.environ.pop(ENV_UNBLOCK, "")
    if unblock:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {int(s) for s in unblock.split(",")})
    _end_with_the_tool()
    tracer.install()
    sys.argv = [target, *args]
    _as_python_was_started(mode, target, args)
    if mode == "script":
        if not sys.flags.safe_path:  # python puts the script's real directory first
            sys.path[0] = os.path.dirname(os.path.realpath(target))
        # As python does, __file__ and the code's file name are absolute: a program that changes
        # directory must still find itself, and we its lines.
        path = os.path.abspath(target)
        # A directory or zip with __main__.py runs through runpy, as python runs it.
        runner = (lambda: _run_file(path)) if os.path.isfile(path) and not zipfile.is_zipfile(path) else (  # noqa: E731
            lambda: _as_deep_as_python(_RUN_PATH_LEVELS) or runpy.run_path(path, run_name="__main__"))
    else:
        if not sys.flags.safe_path:
            sys.path[0] = os.getcwd()
        runner = lambda: (_as_deep_as_python(_RUN_MODULE_LEVELS)  # noqa: E731
                          or runpy.run_module(target, run_name="__main__", alter_sys=True))
    try:
        runner()
    except SystemExit:
        raise
    except BaseException as exc:  # as python reports it: sys.excepthook, without our frames
        tb = exc.__traceback__
        while tb is not None and recording.is_library(tb.tb_frame.f_code.co_filename):
            tb = tb.tb_next
        # The hook prints the exception's own traceback (the argument only where it has none).
        exc.__traceback__ = tb or exc.__traceback__
        sys.excepthook(type(exc), exc, exc.__traceback__)
        if isinstance(exc, KeyboardInterrupt):  # python then ends by SIGINT, for its parent to see
            sys.stdout.flush()
            sys.stderr.flush()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        sys.exit(1)


def _as_python_was_started(mode: str, target: str, args: list[str]) -> None:
    """`sys.orig_argv` as `python [OPTIONS] SCRIPT ARGS` (or `-m MODULE`) gives it, not this
    bootstrap's command line; and the run's site directory (its sitecustomize starts the tracer
    in every Python process, and is done) leaves `sys.path`. Under the stand-in backend it stays:
    the tracer imports itself from there in that interpreter."""
    original = list(getattr(sys, "orig_argv", []))
    if "tpu_migrate.diagnose.bootstrap" in original:
        at = original.index("tpu_migrate.diagnose.bootstrap") - 1  # its `-m`
        sys.orig_argv = [*original[:at], *(["-m"] if mode == "module" else []), target, *args]
    if tracer.keeps_site_on_path():
        return
    site = tracer.site_directory()
    if site:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != site]


# How much deeper than its caller the program's module code starts counting towards the
# recursion limit, less what python's own start puts above it (Python 3.11, measured; the
# stress tests compare with python): exec's own levels for a script; runpy's frames and exec
# less python's own runpy frames for `-m` and a zip.
_EXEC_LEVELS = 2
_RUN_MODULE_LEVELS = 2
_RUN_PATH_LEVELS = 1


def _as_deep_as_python(levels: int) -> None:
    """The program's module frame runs some frames deep here (runpy, this bootstrap); under
    `python` it is the first frame. Raise the recursion limit by as many, and show the program
    the limit it set (sys.getrecursionlimit / setrecursionlimit), so that it recurses exactly as
    deep as under python before RecursionError. `levels`: how much deeper than its caller the
    program's module code starts, less what python's own start puts above it (the _LEVELS)."""
    depth, frame = 0, sys._getframe(1)
    while frame is not None:
        depth, frame = depth + 1, frame.f_back
    extra = depth + levels
    get, set_ = sys.getrecursionlimit, sys.setrecursionlimit

    def getrecursionlimit():
        return get() - extra

    def setrecursionlimit(limit):
        set_(limit + extra)

    getrecursionlimit.__doc__, setrecursionlimit.__doc__ = get.__doc__, set_.__doc__
    set_(get() + extra)
    sys.getrecursionlimit, sys.setrecursionlimit = getrecursionlimit, setrecursionlimit
    _threads_start_as_deep(extra)


def _threads_start_as_deep(extra: int) -> None:
    """The limit is the interpreter's, and a thread starts with none of the tool's frames: it
    would recurse `extra` frames deeper than under python. Its start (Thread._bootstrap, above
    the frames a thread's traceback shows) goes through as many frames of ours."""
    import threading

    start = threading.Thread._bootstrap

    def _bootstrap(self, levels=extra - 1):
        if levels > 0:
            return _bootstrap(self, levels - 1)
        return start(self)

    if extra > 0:
        threading.Thread._bootstrap = _bootstrap


def _run_file(path: str) -> None:
    """`python PATH`'s `__main__`: a fresh module with python's attributes, the code compiled
    under the absolute path (runpy's run_path would make argv[0] absolute and give another
    `__loader__` and `__package__`)."""
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=path, __cached__=None, __package__=None, __spec__=None,
                         __loader__=importlib.machinery.SourceFileLoader("__main__", path),
                         __builtins__=builtins)
    sys.modules["__main__"] = main
    with io.open_code(path) as handle:
        code = compile(handle.read(), path, "exec", dont_inherit=True)
    _as_deep_as_python(_EXEC_LEVELS)
    exec(code, main.__dict__)


if __name__ == "__main__":
    main()
