"""Which of verify's runs go at once. The first run of the original goes alone (the migration of
its copy beside it): what it did decides the rest. The others (the original again, the migrated
program at each process count) share the working directory, so they go at once only where the
original wrote no file: its processes opened none for writing (the recorder's `writes-*`) and
nothing under the working directory changed while it ran (a C++ writer the recorder does not
see). Then as many go at once as this machine has cores for their processes; else one after
another, as before. A run that failed beside others runs again alone, with the whole timeout:
a crash may be a collision (a port, a file), a timeout (exit status 124) the cores the others
took; only its failure alone is reported as its own.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

SKIPPED = {".git", ".hg", ".svn", "__pycache__", ".venv", "venv", "node_modules"}
TIMED_OUT = 124   # a run's exit status at the timeout (runs.py)
INTERRUPTED = 130  # Ctrl-C: not run again
LARGEST_TREE = 20000  # entries: a larger working directory is not watched (its runs go one by one)


def snapshot(directory: Path, skip: Path) -> dict[str, tuple[int, int]] | None:
    """(modification time, size) of every file under `directory` (not under `skip`, the
    workspace, nor version-control, environment and bytecode folders); None where it holds
    more than LARGEST_TREE entries (not watched)."""
    seen: dict[str, tuple[int, int]] = {}
    skip_text = str(skip.resolve())
    folders = [str(directory.resolve())]
    while folders:
        folder = folders.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if len(seen) >= LARGEST_TREE:
                return None
            try:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name not in SKIPPED and entry.path != skip_text:
                        folders.append(entry.path)
                        seen[entry.path + os.sep] = (0, 0)
                else:
                    status = entry.stat(follow_symlinks=False)
                    seen[entry.path] = (status.st_mtime_ns, status.st_size)
            except OSError:
                continue
    return seen


def waves(plan: list, cores: int) -> list[list]:
    """The plan's runs (tuples whose fourth item is the run's processes) in groups that go at
    once, in order: as many as `cores` has room for their processes (one run at least)."""
    groups, used = [], 0
    for item in plan:
        if groups and used + item[3] <= cores:
            groups[-1].append(item)
            used += item[3]
        else:
            groups.append([item])
            used = item[3]
    return groups


def run_wave(wave: list, run, echo) -> list:
    """The runs of one wave (waves()), at once, in the plan's order: `run(item)` runs one and
    returns its Run. A run that failed beside others (its exit status, a timeout's 124 too) runs
    again alone, with the whole timeout; the Run kept is the one alone, its `beside_others` the
    exit status it had beside them."""
    names = [item[0] for item in wave]
    echo(f"verify: running the {' and the '.join(names)}{' at once' if len(wave) > 1 else ''} ...")
    if len(wave) == 1:
        return [run(wave[0])]
    with ThreadPoolExecutor(len(wave)) as pool:
        done = list(pool.map(run, wave))
    for index, finished in enumerate(done):
        if finished.returncode not in (0, INTERRUPTED):
            what = "timed out" if finished.returncode == TIMED_OUT else "failed"
            echo(f"verify: the {finished.name} run {what} beside the others (exit status {finished.returncode}): "
                 "running it again alone ...")
            done[index] = run(wave[index])
            done[index].beside_others = finished.returncode
    return done


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
