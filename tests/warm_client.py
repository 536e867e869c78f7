"""The client of tests/warm_python.py: a stand-in for `python` whose programs start with torch
already imported. Never imported: WarmPython writes it into an executable file, after a shebang
with `-S` (the client itself starts in milliseconds) and before a call of main.

It passes its arguments, environment, working directory and inherited file descriptors to the
server, which forks a child that becomes `python ARGS` (warm_python.become). It forwards the
signals a launcher sends (torchrun's SIGTERM, Ctrl-C) to that child and exits as the child
did, with the same code or killed by the same signal. When the server cannot reproduce the
run exactly (an interpreter option it does not know, an environment variable read at start
that differs), it replaces itself with the real interpreter: the run is then only slower.
"""

import json
import os
import signal
import socket
import struct
import sys

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def cold(python: str):
    os.execv(python, [python, *sys.argv[1:]])


def inherited_fds() -> list[int]:
    """The descriptors `python` would have inherited: those open here without close-on-exec."""
    fds = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.get_inheritable(int(name)):
                fds.append(int(name))
        except OSError:  # the listing's own descriptor, closed by now
            pass
    return sorted(fds)


def read_line(sock: socket.socket, buffer: bytearray) -> dict | None:
    while b"\n" not in buffer:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        buffer += chunk
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    return json.loads(line)


def main(server: str, python: str):
    """Run `python ARGS` (sys.argv[1:]) through the server at socket path `server`, or run
    `python` itself when the server cannot."""
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(server)
    except OSError:
        cold(python)
    fds = inherited_fds()
    # Signals ignored here stay ignored in `python` (SIGINT of a background job, nohup's SIGHUP),
    # and blocked ones stay blocked: python starts with the mask it was executed with.
    ignored = [int(s) for s in signal.valid_signals()
               if s not in (signal.SIGKILL, signal.SIGSTOP) and signal.getsignal(s) is signal.SIG_IGN]
    blocked = sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, []))
    # Forwarding starts before the child exists: the program can run (and install a handler)
    # before the server's reply arrives here, and a signal in between must reach it, not end
    # this client by default. Until the child's number is known, signals wait in `pending`.
    child = None
    pending = []

    def forward(signum, frame):
        if child is None:
            pending.append(signum)
            return
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    forwarded = [s for s in FORWARDED if signal.getsignal(s) is not signal.SIG_IGN]
    for signum in forwarded:
        signal.signal(signum, forward)
    request = json.dumps({"args": sys.argv[1:], "env": dict(os.environ), "cwd": os.getcwd(), "fds": fds,
                          "ignored": ignored, "blocked": blocked}).encode()
    socket.send_fds(sock, [struct.pack("!I", len(request)) + request], fds)
    buffer = bytearray()
    reply = read_line(sock, buffer)
    if reply is None or "cold" in reply:  # what it could not reproduce: reply["cold"]
        sock.close()
        for signum in forwarded:
            signal.signal(signum, signal.SIG_DFL)
        if pending:  # no program has started: the signal ends this process as it would python
            os.kill(os.getpid(), pending[0])
        cold(python)
    for fd in fds:  # the child has them now; a pipe's reader must see EOF when the child closes it
        if fd > 2:
            os.close(fd)
    child = reply["pid"]
    for signum in pending:
        forward(signum, None)
    reply = read_line(sock, buffer)
    if reply is None:  # the server died: the child was killed with it
        os._exit(70)
    status = reply["status"]
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        os._exit(128 + signum)
    os._exit(os.waitstatus_to_exitcode(status))
