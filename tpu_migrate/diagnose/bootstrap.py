"""Runs the user's program as `python SCRIPT ARGS` (or `python -m MODULE ARGS`) would, with the
tracer installed: same sys.argv, `__main__`, sys.path[0], cwd, stdio and exit status.

    python -m tpu_migrate.diagnose.bootstrap script PATH [ARGS...]
    python -m tpu_migrate.diagnose.bootstrap module NAME [ARGS...]
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback

from tpu_migrate.diagnose import tracer


def main() -> None:
    mode, target, *args = sys.argv[1:]
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
