"""Killing what a run left behind without killing a stranger.

A run starts in a session of its own (start_new_session=True), so its process group's id is its
leader's pid, and os.killpg(leader) kills whatever the run left (torchrun's workers, spawned
children). But once the leader is reaped and no member is left, Linux may give that number to a
new process: pid_max is 32768 on these machines, and one suite run goes through it several
times (every thread takes a number). A stranger that starts a session of its own then leads a
group with that id, and a late os.killpg SIGKILLs it: once a concurrent test's program.

So: kill the group while the leader is not reaped yet (a zombie keeps its number, and with it
the group's), which `wait_unreaped` makes possible; after reaping, kill only members of a group
whose id no process holds as its own pid (a group's id stays reserved while it has members).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time


def wait_unreaped(process: subprocess.Popen, timeout: float | None = None) -> bool:
    """Wait until `process` has exited, without reaping it; False if `timeout` passed first."""
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = 0.001
    while process.returncode is None:
        try:
            if os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:  # reaped elsewhere (Popen.poll from another thread)
            return True
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
    return True


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL every process in the group `process` leads (it was started with
    start_new_session=True), whether or not it was reaped."""
    if process.returncode is None:  # not reaped: the number is still its group's
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        return
    members = group_members(process.pid)
    if process.pid in members:  # a new process holds the number, and leads a group with it
        return
    for pid in members:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def alive(pid: int) -> bool:
    """Running, not a zombie (from /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def group_members(pgid: int) -> list[int]:
    """The processes whose process group is `pgid` (from /proc)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # after the name: state, ppid, pgrp
            members.append(int(entry))
    return members
