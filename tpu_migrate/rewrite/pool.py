"""Rewrite many files in worker processes, and survive a worker's death.

A worker can die without a Python exception: the OOM killer, a crash in native code, a stray
SIGKILL. ProcessPoolExecutor then fails every pending file (BrokenProcessPool), and a run that
let that escape would end with a traceback and no report. Instead, the files not yet done go
again: the first of them in a process of its own, so that a file that kills every process that
rewrites it is named in a one-line error and the others are still rewritten, then the rest in a
fresh pool. Workers only compute: the writing happens in the parent, so a dead worker leaves
every file untouched.

The other way round, a parent killed without a chance to stop its pool (SIGKILL, the OOM killer)
would leave its workers computing for nobody, then waiting forever on a queue whose other end
they hold themselves: each worker watches its parent and ends the moment the parent does
(`_die_with_parent`).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from tpu_migrate.findings import FileResult

Task = tuple  # the arguments of one call of `work`: (path, ...)


def run_tasks(work: Callable[[Task], FileResult], tasks: Sequence[Task], jobs: int) -> Iterator[FileResult]:
    """`work(task)` for every task, results in task order, in up to `jobs` worker processes."""
    remaining = list(tasks)
    chunk = max(1, min(64, len(remaining) // (jobs * 4) or 1))
    while remaining:
        done = 0
        try:
            with ProcessPoolExecutor(max_workers=min(jobs, len(remaining)), initializer=_pool_worker) as pool:
                # Chunks submitted here rather than through pool.map, whose iterator cancels
                # what is queued when it is interrupted: the pool, ended then (`_stop`), would
                # fail those futures again and print concurrent.futures' InvalidStateError.
                chunks = [pool.submit(_run_chunk, work, remaining[start:start + chunk])
                          for start in range(0, len(remaining), chunk)]
                try:
                    for future in chunks:
                        for result in future.result():
                            done += 1
                            yield result
                except BrokenProcessPool:
                    raise
                except BaseException:  # Ctrl-C, or the caller stopped: not one more file
                    _stop(pool)
                    raise
            return
        except BrokenProcessPool:
            remaining = remaining[done:]
        yield _in_own_process(work, remaining[0])
        remaining = remaining[1:]
        chunk = 1  # from now on a death costs the files in flight, not whole chunks


def _run_chunk(work: Callable[[Task], FileResult], tasks: Sequence[Task]) -> list[FileResult]:
    return [work(task) for task in tasks]


def _stop(pool: ProcessPoolExecutor) -> None:
    """End the pool now: its workers are ended (the pool then fails its queued files itself),
    so that leaving the `with` does not wait for every file of the run to be rewritten for
    nobody."""
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        process.terminate()
    manager = getattr(pool, "_executor_manager_thread", None)
    pool.shutdown(wait=False)
    # Its manager thread closes the pool's wake-up pipe as it ends; concurrent.futures' exit
    # handler writes to that pipe unlocked (CPython 3.11), and a close between its check and its
    # write printed "OSError: Bad file descriptor" under a Ctrl-C. The workers are ended: it ends soon.
    if manager is not None and manager is not threading.current_thread():
        manager.join(timeout=5)


def _in_own_process(work: Callable[[Task], FileResult], task: Task) -> FileResult:
    receive, send = multiprocessing.Pipe(duplex=False)
    process = multiprocessing.Process(target=_send, args=(work, task, send), daemon=True)
    process.start()
    send.close()
    try:
        result = receive.recv()
    except EOFError:  # it died before it could answer
        result = None
    finally:
        receive.close()
        process.join()
    if isinstance(result, FileResult):
        return result
    return FileResult(task[0], error=f"the process rewriting it died ({_how(process.exitcode)}); "
                                     "the file is unchanged")


def _pool_worker() -> None:
    """A pool's worker: Ctrl-C left to the parent, which ends the pool (_stop): a terminal's
    Ctrl-C reaches the whole group, and a worker interrupted before the parent ended it printed
    its own traceback ("Process ForkProcess-1:"). It dies with its parent."""
    if multiprocessing.parent_process() is not None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()


def _die_with_parent() -> None:
    """In a worker: a thread that waits for the parent's end (multiprocessing's sentinel for it,
    whatever the start method) and then ends this process at once."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        os._exit(1)

    threading.Thread(target=watch, name="tpu-migrate-parent-watch", daemon=True).start()


def _send(work: Callable[[Task], FileResult], task: Task, connection) -> None:
    _die_with_parent()
    connection.send(work(task))
    connection.close()


def _how(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}: out of memory, or a crash"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit status {exitcode}"
