"""`python -m tpu_migrate` and the `tpu-migrate` command (pyproject.toml's script)."""

import sys

from tpu_migrate import process_exit
from tpu_migrate.cli import main


def run() -> None:
    """The tool as its own process: a rewrite may end it without Python's teardown
    (process_exit.py)."""
    process_exit.owns_process = True
    main()


if __name__ == "__main__":
    # The process's own __main__ (not runpy.run_module from other code, which goes on after).
    if vars(sys.modules.get("__main__", sys)) is globals():
        run()
    else:
        main()
