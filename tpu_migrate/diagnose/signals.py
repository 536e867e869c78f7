"""Which signals the program received itself: so that the tool relays a signal at most once.

`kill -TERM -PGID` (a job scheduler) reaches the tool and the program at once, and so does
`kill -TERM TOOL` followed by nothing: the tool cannot tell the two apart from what it receives
(the sender's pid is the same). The program can: its bootstrap points Python's wakeup fd
(`signal.set_wakeup_fd`) at a pipe the tool reads. Python's C-level handler writes the signal's
number there the moment the signal arrives, even while the main thread is busy in a compile,
for every signal the program handles in Python (SIGINT's KeyboardInterrupt included). A signal
the program handles and did not report within HEARD_WINDOW_S did not reach it: the tool relays
it. One it does not handle ends it (or is ignored), and a relay changes nothing.

A program that sets its own wakeup fd (asyncio's `add_signal_handler`) takes the channel over:
it is told the previous fd was -1, as without the tool, and the tool hears that the channel is
lost and falls back to relaying after a grace period (runner.RELAY_GRACE_S). So does a program
that closes the channel's descriptor: it is moved out of the range programs close
(`os.closerange(3, 1024)`, see _out_of_reach), and where the program closes it all the same, the
tool sees the pipe's end and relays a signal the program handled (or handled a moment before:
a program ending in its handler has its handlers reset) only after the grace period.
"""

from __future__ import annotations

import os
import signal
import time

ENV_SIGNALS = "TPU_MIGRATE_DIAGNOSE_SIGNALS"  # the write end's fd number, in the program
HEARD_WINDOW_S = 0.5  # a signal sent to both arrives in both within this
_LIVE = 0  # bytes the bootstrap writes itself: no signal has number 0 or 255
_LOST = 255


def report_received() -> None:
    """In the program (bootstrap): Python's wakeup fd is the tool's pipe."""
    value = os.environ.pop(ENV_SIGNALS, "")
    if not value.isdigit():
        return
    fd = _out_of_reach(int(value))
    try:
        os.set_inheritable(fd, False)  # the program's subprocesses do not get it
        os.set_blocking(fd, False)
        signal.set_wakeup_fd(fd, warn_on_full_buffer=False)
        os.write(fd, bytes([_LIVE]))
    except (OSError, ValueError):
        return
    original = signal.set_wakeup_fd

    def set_wakeup_fd(new_fd, *, warn_on_full_buffer=True):
        previous = original(new_fd, warn_on_full_buffer=warn_on_full_buffer)
        if previous != fd:
            return previous
        try:
            os.write(fd, bytes([_LOST]))
        except OSError:
            pass
        return -1  # as without the tool

    set_wakeup_fd.__doc__ = original.__doc__
    signal.set_wakeup_fd = set_wakeup_fd


# Where the channel's descriptor moves to (from HIGH_FD // 2 up): a program that closes the descriptors it
# inherited (`os.closerange(3, 1024)`, `closerange(3, SC_OPEN_MAX)`) leaves it open, so Python's
# C-level handler neither fails on it ("Exception ignored ... wakeup fd") nor writes signal
# numbers into a file the program opened later under the same number. Capped: the kernel's
# descriptor table grows to the highest number in use.
HIGH_FD = 16384


def _out_of_reach(fd: int) -> int:
    """`fd` moved to the first free number from half of min(RLIMIT_NOFILE's hard limit, HIGH_FD)
    up (8192 where the hard limit allows); the soft limit the program sees is unchanged (a descriptor above it stays usable)."""
    try:
        import fcntl
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        top = min(HIGH_FD if hard == resource.RLIM_INFINITY else hard, HIGH_FD)
        if top <= 3 or fd >= top // 2:
            return fd
        raise_soft = soft != resource.RLIM_INFINITY and soft < top
        if raise_soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (top, hard))
        try:
            moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, top // 2)
        finally:
            if raise_soft:
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    except (ImportError, OSError, ValueError):
        return fd
    os.close(fd)
    return moved


class SignalsHeard:
    """In the tool: what the program reported through the pipe (`read_fd`, non-blocking)."""

    def __init__(self, read_fd: int | None):
        self.fd = read_fd
        self.live = False
        self._arrivals: list[tuple[float, int]] = []  # (when read, signal number)

    def read(self) -> None:
        if self.fd is None:
            return
        while True:
            try:
                data = os.read(self.fd, 4096)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:  # every holder closed it: nothing more can come
                self.live = False
                os.close(self.fd)
                self.fd = None
                return
            now = time.monotonic()
            for number in data:
                if number == _LIVE:
                    self.live = True
                elif number == _LOST:
                    self.live = False
                else:
                    self._arrivals.append((now, number))

    def received(self, signum: int, taken_at: float) -> bool:
        """Whether the program reported `signum` near `taken_at` (when the tool took it); the
        report is used up, so two signals sent to both are two reports."""
        self.read()
        for entry in self._arrivals:
            if entry[1] == signum and abs(entry[0] - taken_at) <= HEARD_WINDOW_S:
                self._arrivals.remove(entry)
                return True
        return False

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
