"""Rewrite files by path: a notebook, a dependency file (reported, never written) or Python
source, chosen by name; many files through a process pool.

This sits above engine.py (one Python file's bytes) and notebooks.py (which rewrites each
notebook through engine.py), so neither of them needs the other's caller.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping

from tpu_migrate.findings import FileResult
from tpu_migrate.rewrite.context import Options
from tpu_migrate.rewrite.dependencies import CODE as DEPENDENCY_CODE
from tpu_migrate.rewrite.dependencies import is_dependency_file, scan_dependency_file
from tpu_migrate.rewrite.engine import rewrite_bytes
from tpu_migrate.rewrite.gc_settings import fewer_collections
from tpu_migrate.rewrite.files import read_regular
from tpu_migrate.rewrite.notebooks import rewrite_notebook


def rewrite_path(path: str, options: Options, data: bytes | None = None, real: str | None = None) -> FileResult:
    """`data`: the file's bytes, when the caller has read them (the result cache, which then
    sets the result's inode). `real`: where the file was found (files.discover's `reals`): the
    file read is the one there, never what a link swapped in since leads to."""
    inode = None
    try:
        if data is None:
            data, st = read_regular(path, real)  # a FIFO or device is refused, not waited on
            inode = st.st_ino
    except IsADirectoryError:
        return FileResult(path, error="is a directory")
    except OSError as exc:
        return FileResult(path, error=f"cannot read: {exc.strerror or exc}")
    try:
        if path.endswith(".ipynb"):
            result = rewrite_notebook(data, path, options)
        elif is_dependency_file(path):  # requirements*.txt, pyproject.toml: reported, never written
            manual = scan_dependency_file(path, data) if options.enabled(DEPENDENCY_CODE) else []
            result = FileResult(path, manual=manual)
        else:
            result = rewrite_bytes(data, path, options)
    except Exception as exc:  # noqa: BLE001 - one file's bug must not stop the run
        return FileResult(path, error=f"internal error: {type(exc).__name__}: {exc}")
    result.inode = inode
    return result


def _worker(args: tuple[str, Options, bytes | None, str | None]) -> FileResult:
    return rewrite_path(*args)


def rewrite_paths(
    paths: Iterable[str], options: Options, jobs: int | None = None,
    on_result: Callable[[FileResult], None] | None = None,
    sources: Mapping[str, bytes] | None = None, reals: Mapping[str, str] | None = None,
) -> Iterator[FileResult]:
    """Results in input order. `jobs=1` runs in this process (no pool start-up cost).

    `sources`: bytes already read for some paths (the others are read from disk). `reals`: the
    real path each was found at (see `rewrite_path`)."""
    paths = list(paths)
    sources = sources or {}
    reals = reals or {}
    jobs = jobs or os.cpu_count() or 1
    with fewer_collections():  # forked workers inherit it
        if jobs == 1 or len(paths) < 2:
            for path in paths:
                yield rewrite_path(path, options, sources.get(path), reals.get(path))
            return
        from tpu_migrate.rewrite.pool import run_tasks  # multiprocessing: only for more than one job

        yield from run_tasks(_worker, [(p, options, sources.get(p), reals.get(p)) for p in paths], jobs)
