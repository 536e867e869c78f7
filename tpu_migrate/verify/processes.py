"""A run's processes: started in a session of their own, read with a bound, and stopped as a
whole.

A run ends when its program exits, or at `--timeout`. Whatever it started and left running is
stopped then, and named in the run's output: torchrun's workers (torch's elastic agent starts
each in a session of its own, so killing the agent's process group misses them, and killing the
agent alone leaves them running with ppid 1), a background process that keeps the program's
stdout open (reading that pipe to its end would wait for it, up to the timeout).

The run's processes are found three ways, before the program itself is reaped (while it is a
zombie its number, and so its group's and session's, cannot go to another process): the
members of its process group and its session, its descendants (by parent, from /proc), and
every process whose environment carries the run's marker, a variable with a value no other
process has (an orphan that its parent's death moved under init, a daemon in a session of its
own). Each is opened as a pidfd and checked again before it is signalled, so a number that
went to another process meanwhile is never killed. They are stopped (SIGSTOP) until a pass finds
no new one, so none can start another meanwhile, then killed.

Linux only (/proc), as the rest of the tool's process handling; pidfds where the kernel has them
(5.3 and later; before, a process is signalled by its number).
"""

from __future__ import annotations

import os
import secrets
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass, field

MARKER = "TPU_MIGRATE_VERIFY_RUN"
GRACE = 1.0    # seconds after the program exits for what still holds its output to end by itself
DRAIN = 0.5    # seconds for the output still in the pipes once the rest was stopped
KEPT = 256 * 1024  # bytes of each stream kept (the end): the report shows the last few thousand


@dataclass
class Finished:
    returncode: int          # the program's (killed at the timeout: -9)
    timed_out: bool
    stdout: str
    stderr: str
    left: list[str] = field(default_factory=list)  # what it left running, stopped: "pid N: command"


def run(command: list[str], env: dict[str, str], timeout: float) -> Finished:
    """Run `command` under `env` until it exits or `timeout` seconds pass, then stop everything
    it left running. Its stdin is /dev/null (it runs in a session of its own, away from the
    terminal)."""
    env = {**env, MARKER: secrets.token_hex(16)}  # every process of the run inherits it
    marker = f"{MARKER}={env[MARKER]}".encode()
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env=env, start_new_session=True)
    streams = _Streams(process)
    left: list[str] = []
    done = False
    try:
        exited = streams.read_until_exit(time.monotonic() + timeout)
        if exited:
            # What still holds the program's stdout or stderr gets a moment to end by itself
            # (multiprocessing's resource tracker, a compile worker: each ends with its parent).
            streams.read_until_eof(time.monotonic() + GRACE)
        left = [what for pid, what in stop(process, marker) if pid != process.pid]
        done = True
        streams.read_until_eof(time.monotonic() + DRAIN)
    finally:
        if not done:  # interrupted (Ctrl-C): leave nothing running
            stop(process, marker)
        streams.close()
        process.wait()
    return Finished(process.returncode, not exited, streams.text(process.stdout), streams.text(process.stderr), left)


class _Streams:
    """The program's stdout and stderr, read as they come (the end of each kept), and its exit,
    without reaping it."""

    def __init__(self, process: subprocess.Popen):
        self.process = process
        self.selector = selectors.DefaultSelector()
        self.data = {process.stdout: bytearray(), process.stderr: bytearray()}
        for stream in self.data:
            os.set_blocking(stream.fileno(), False)
            self.selector.register(stream, selectors.EVENT_READ)
        try:
            self.pidfd = os.pidfd_open(process.pid)  # readable when the process exits
            self.selector.register(self.pidfd, selectors.EVENT_READ)
        except (AttributeError, OSError):  # before Linux 5.3: its exit is polled
            self.pidfd = None

    def read_until_exit(self, deadline: float) -> bool:
        """Read until the program exits (True) or the deadline passes (False)."""
        while not _exited(self.process):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._read(min(remaining, 0.05 if self.pidfd is None else remaining))
        return True

    def read_until_eof(self, deadline: float) -> None:
        while any(stream in self.data and self._open(stream) for stream in self.data):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._read(remaining)

    def _open(self, stream) -> bool:
        try:
            self.selector.get_key(stream)
            return True
        except KeyError:
            return False

    def _read(self, timeout: float) -> None:
        for key, _ in self.selector.select(timeout):
            if key.fileobj == self.pidfd:
                continue
            try:
                chunk = os.read(key.fileobj.fileno(), 65536)
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""
            if not chunk:
                self.selector.unregister(key.fileobj)
                continue
            buffer = self.data[key.fileobj]
            buffer += chunk
            if len(buffer) > 2 * KEPT:
                del buffer[:-KEPT]

    def text(self, stream) -> str:
        return bytes(self.data[stream][-KEPT:]).decode(errors="replace")

    def close(self) -> None:
        self.selector.close()
        for stream in self.data:
            stream.close()
        if self.pidfd is not None:
            os.close(self.pidfd)


def _exited(process: subprocess.Popen) -> bool:
    """Whether the program has exited, without reaping it (its number stays its own)."""
    if process.returncode is not None:
        return True
    try:
        return os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def stop(process: subprocess.Popen, marker: bytes) -> list[tuple[int, str]]:
    """Stop every process of the run (the program too, if it still runs), before the program is
    reaped; (pid, "pid N: command") of each."""
    stopped: dict[int, tuple[int | None, str]] = {}  # pid -> (its pidfd, what it is)
    try:
        for _ in range(100):  # a pass finds what the processes of the last one started meanwhile
            found = {pid: started for pid, started in members(process.pid, marker).items() if pid not in stopped}
            if not found:
                break
            for pid, started in found.items():
                pidfd = _open(pid)
                # The same process as the one found (its start time): once opened, the number
                # stays its own for as long as the pidfd is open.
                fields = _stat(pid)
                if fields is None or fields[4] != started or (pidfd is None and _has_pidfds()):
                    if pidfd is not None:
                        os.close(pidfd)
                    continue
                stopped[pid] = (pidfd, _described(pid))
                _signal(pid, pidfd, signal.SIGSTOP)
        for pid, (pidfd, _) in stopped.items():
            _signal(pid, pidfd, signal.SIGKILL)
    finally:
        for pidfd, _ in stopped.values():
            if pidfd is not None:
                os.close(pidfd)
    return [(pid, what) for pid, (_, what) in stopped.items()]


def members(leader: int, marker: bytes) -> dict[int, int]:
    """The live processes of the run led by `leader` (not reaped), with their start times: its
    group, its session, its descendants and those whose environment holds `marker`."""
    table = {}  # pid -> (ppid, pgid, sid, start time)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields is not None and fields[0] != "Z":  # a zombie has exited: nothing to stop
                table[int(entry)] = fields[1:]
    found = {pid for pid, (_, pgid, sid, _) in table.items() if leader in (pgid, sid)}
    children: dict[int, list[int]] = {}
    for pid, (ppid, *_) in table.items():
        children.setdefault(ppid, []).append(pid)
    queue = [leader]
    while queue:
        for child in children.get(queue.pop(), ()):
            if child not in found:
                found.add(child)
                queue.append(child)
    found |= {pid for pid in table if pid not in found and _carries(pid, marker)}
    found.discard(os.getpid())
    return {pid: table[pid][3] for pid in sorted(found) if pid in table}


def _stat(pid: int) -> tuple[str, int, int, int, int] | None:
    """(state, ppid, pgid, sid, start time) from /proc/PID/stat."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        return fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _carries(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return marker in handle.read().split(b"\0")
    except OSError:  # another user's, or gone
        return False


def _described(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            command = handle.read().rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        command = "?"
    command = "".join(c if c.isprintable() else "?" for c in command)
    return f"pid {pid}: {command[:200]}"


_PIDFDS: list[bool] = []


def _has_pidfds() -> bool:
    """Whether this system has pidfds (Linux 5.3)."""
    if not _PIDFDS:
        try:
            os.close(os.pidfd_open(os.getpid()))
            _PIDFDS.append(True)
        except (AttributeError, OSError):
            _PIDFDS.append(False)
    return _PIDFDS[0]


def _open(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _signal(pid: int, pidfd: int | None, signum: int) -> None:
    try:
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, signum)
        else:
            os.kill(pid, signum)
    except (ProcessLookupError, PermissionError, OSError):
        pass
