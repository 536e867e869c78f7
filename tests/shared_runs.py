"""Expensive runs made once per test session and shared by every pytest-xdist worker.

A torch_xla original, a torchrun world or a `diagnose` of a fixture program takes seconds to
minutes, and several tests (often in several modules) assert on the same run. `once(key, make)`
returns the result of `make()` computed once per test session: the first process that asks
makes it while holding a lock on the key's file and pickles the result there; a process that
asks for it later (another xdist worker, or the same one) waits for the lock and reads it.

Within one process the result is also kept in memory, so a test reading a run it made costs
nothing. Without xdist the session directory is pytest's base temporary directory; under xdist
it is the controller's, which every worker's base directory sits in (`popen-gwN`), so the
results are shared by exactly the workers of one test run and deleted with it by pytest.

Keys name what is run and everything it depends on (the program, its arguments, the options):
two callers with the same key must want the same run.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import pickle
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, TypeVar

T = TypeVar("T")

_directory: Path | None = None
_memory: dict[str, object] = {}
_locks: dict[str, threading.Lock] = {}
_locks_lock = threading.Lock()


def configure(session_base: Path) -> None:
    """Called once per process by conftest with pytest's base temporary directory."""
    global _directory
    shared = session_base.parent if os.environ.get("PYTEST_XDIST_WORKER") else session_base
    _directory = shared / "shared-runs"
    _directory.mkdir(exist_ok=True)


def _shared_directory() -> Path:
    global _directory
    if _directory is None:  # a harness used outside pytest (python tests/differential.py)
        _directory = Path(tempfile.mkdtemp(prefix="tpu-migrate-shared-runs-"))
    return _directory


def _path(key: str) -> Path:
    return _shared_directory() / (hashlib.sha256(key.encode()).hexdigest()[:32] + ".pickle")


def session_directory(name: str) -> Path:
    """A directory every process of this test session shares (and pytest deletes with it)."""
    directory = _shared_directory() / name
    directory.mkdir(exist_ok=True)
    return directory


def once(key: str, make: Callable[[], T]) -> T:
    """make() once per test session for `key`, whichever process or thread asks first."""
    if key in _memory:
        return _memory[key]  # type: ignore[return-value]
    with _locks_lock:  # threads of one process (the differential pools) wait on a thread lock:
        lock = _locks.setdefault(key, threading.Lock())  # flock is per open file, not per thread
    with lock:
        if key in _memory:
            return _memory[key]  # type: ignore[return-value]
        path = _path(key)
        with open(path.with_suffix(".lock"), "w") as lock_file:
            fcntl.flock(lock_file, fcntl.LOCK_EX)
            try:
                if path.exists():
                    result = pickle.loads(path.read_bytes())
                else:
                    started = time.monotonic()
                    result = make()
                    _log_timing(key, time.monotonic() - started)
                    partial = path.with_suffix(".partial")
                    partial.write_bytes(pickle.dumps(result))
                    partial.replace(path)  # a reader never sees half a result
            finally:
                fcntl.flock(lock_file, fcntl.LOCK_UN)
        _memory[key] = result
        return result


def _log_timing(key: str, seconds: float) -> None:
    """timings.log beside the results: what each shared run cost, and which worker paid (one
    line each, appended whole), for profiling the suite."""
    line = f"{seconds:8.1f} s  {os.environ.get('PYTEST_XDIST_WORKER', '-'):<5} {key}\n"
    with open(_shared_directory() / "timings.log", "a") as log:
        log.write(line)


def file_key(path: Path) -> str:
    """A key part that changes when the file's content does (a program edited in the session)."""
    return f"{path.resolve()}@{hashlib.sha256(path.read_bytes()).hexdigest()[:16]}"
