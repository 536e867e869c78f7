"""The temporary directory of one diagnose run, and the removal of those a dead run left behind.

A run removes its own directory when it ends, whatever the program did. Only a tool that was
itself killed (SIGKILL, the OOM killer) cannot; its program ends with it (bootstrap's
_end_with_the_tool), and the next run removes what is left. The directory's name carries the
tool's process id for that.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time

PREFIX = "tpu-migrate-diagnose-"
_NAME = re.compile(re.escape(PREFIX) + r"(?P<pid>\d+)-")
# A directory whose tool looks dead is left alone until nothing in it has changed for this long:
# a tool in another PID namespace that shares this temporary directory looks dead from here.
STALE_AFTER_S = 600.0


def make() -> str:
    remove_stale()
    return tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-")


def remove_stale(now: float | None = None) -> list[str]:
    """Remove the run directories of dead tools that nothing has written to for STALE_AFTER_S;
    returns their paths. Never fails the run that calls it."""
    now = time.time() if now is None else now
    removed = []
    root = tempfile.gettempdir()
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        match = _NAME.match(entry.name)
        if not match or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            if entry.stat(follow_symlinks=False).st_uid != os.geteuid():
                continue
            if _alive(int(match["pid"])) or now - _last_change(entry.path) < STALE_AFTER_S:
                continue
        except OSError:
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(entry.path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _last_change(path: str) -> float:
    latest = os.stat(path).st_mtime
    for directory, _, files in os.walk(path):
        for name in files:
            try:
                latest = max(latest, os.stat(os.path.join(directory, name)).st_mtime)
            except OSError:
                pass
    return latest
