"""The parent half of `diagnose`: start the program under the tracer, wait, collect the evidence.

The program runs in a child interpreter (tpu_migrate.diagnose.bootstrap) with torch_xla's own
compile analysis switched on (PT_XLA_DEBUG_LEVEL=1, measured at no overhead, written to a file)
and a sitecustomize on PYTHONPATH, so worker processes started by xmp.spawn / torch_xla.launch /
torch.multiprocessing are traced too. Everything lives in a temporary directory that is removed
afterwards, however the program or the tool ends (see _wait for signals).

The program runs in the tool's own process group and session, not a new one: a terminal's Ctrl-C
(and hang-up) reaches both, the program can read the terminal (a background process group is
stopped by SIGTTIN when it reads it) and job control (Ctrl-Z, fg) works on the whole. What it
leaves running is found another way: on Linux the tool is a child subreaper while it runs, so the
program's orphans (the workers of a killed parent, their children) become the tool's children,
and they are stopped after the program ends. A process group would miss workers that start their
own session, and killing ours would hit the rest of a shell pipeline (`echo data | tpu-migrate
...`).
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from tpu_migrate import standin
from tpu_migrate.diagnose import debug_env, rundir
from tpu_migrate.diagnose.events import Event, lost_writes, read_events_counting
from tpu_migrate.diagnose.bootstrap import ENV_TOOL, ENV_UNBLOCK
from tpu_migrate.diagnose.recording import ENV_BACKEND, ENV_DIR, ENV_WARMUP
from tpu_migrate.diagnose.signals import ENV_SIGNALS, HEARD_WINDOW_S, SignalsHeard

# Signals the tool takes while the program runs (blocked, then read with sigtimedwait), and how
# long one that some process sent to the tool waits before it is relayed to a program that
# handles it (a torch_xla program takes about 2 s to exit after Ctrl-C).
RELAYED = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")
                if hasattr(signal, name))
RELAY_GRACE_S = 5.0
SI_KERNEL = 0x80  # si_code of a signal the kernel sent: a terminal's Ctrl-C, Ctrl-\ or hang-up

# The rest of every sitecustomize the tool writes: it shadows the program's own.
SITECUSTOMIZE_CHAIN = '''def _tpu_migrate_user_sitecustomize():
    """This file shadows the program's own sitecustomize (further on sys.path): run it, as site
    would have, with site's message if it fails."""
    import importlib.machinery
    import importlib.util
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.stderr.write(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\\n{type(exc).__name__}: {exc}\\n")


_tpu_migrate_user_sitecustomize()
'''


def sitecustomize(purpose: str, module: str) -> str:
    """A sitecustomize that runs `module`.install() in every Python process of the program (the
    workers it starts inherit PYTHONPATH), then the program's own sitecustomize."""
    return (f"# Written by tpu-migrate {purpose}.\n"
            "try:\n"
            f"    from {module.rpartition('.')[0]} import {module.rpartition('.')[2]} as _tpu_migrate_hooks\n"
            "    _tpu_migrate_hooks.install()\n"
            "except Exception:  # never break the program\n"
            "    pass\n\n\n" + SITECUSTOMIZE_CHAIN)


SITECUSTOMIZE = sitecustomize("diagnose: trace every Python process of the diagnosed program",
                              "tpu_migrate.diagnose.tracer")


@dataclass
class Evidence:
    exit_code: int
    events: dict[int, list[Event]] = field(default_factory=dict)  # pid -> events in order
    debug_log: bytes = b""  # torch_xla's PT_XLA_DEBUG_FILE (byte offsets matter)
    graphs: str = ""  # --explain: XLA_SAVE_TENSORS_FILE, every synced graph's IR
    fallback_log: bytes = b""  # --explain: XLA_FNTRACKER_FILE, one record per CPU-fallback call
    # Where the logs read start in their files (a file of the user's, appended to by the run):
    # the events' debug_offset / fallback_offset are positions in the whole file.
    debug_base: int = 0
    fallback_base: int = 0
    # What could not be recorded or read, and why: the report says it before its findings.
    notes: list[str] = field(default_factory=list)


def run(target: str, args: list[str], module: bool, stdout=None, explain: bool = False,
        backend: str = "xla", warmup_steps: int = 2, python: str | None = None) -> Evidence:
    """Run the program to completion (Ctrl-C stops the program, not the report).

    `explain` also records the IR of every graph with the Python line of each node
    (XLA_IR_DEBUG + XLA_SAVE_TENSORS_FILE): what changed between two compiles of a line. It
    costs about 2-3x, so it is opt-in.

    Backend `standin`: the program runs under `python` (torch 2.11-2.15) with the TorchTPU
    stand-in loaded (standin.environment), and the tracer imported from the run's site
    directory, where this package is linked (that Python need not have the tool installed).
    The site directory comes first on PYTHONPATH, before the stand-in's (standin.SITE): its
    sitecustomize starts the tracer, then chains to the stand-in's, which chains to the
    program's own. Both hook `import torch`; the tracer loads the stand-in itself right after it
    (idempotent), then installs its hooks, whichever hook runs first (tracer.install_backend).
    The program sees the stand-in's PYTHONPATH, as under `tpu-migrate run` (inheritance.take),
    and its Python children get the tracer back.
    """
    # Signals wait in line from here on, so the temporary directory is always removed. The
    # program unblocks them in its bootstrap: it starts with the caller's signal mask.
    waited = _block_signals()
    heard = SignalsHeard(None)
    subreaper = False
    workdir = process = None
    try:
        subreaper = _set_subreaper(True)
        workdir = rundir.make()
        site = os.path.join(workdir, "site")
        os.mkdir(site)
        with open(os.path.join(site, "sitecustomize.py"), "w", encoding="utf-8") as handle:
            handle.write(SITECUSTOMIZE)
        base = os.environ
        if backend == "standin":
            os.symlink(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       os.path.join(site, "tpu_migrate"), target_is_directory=True)
            base = standin.environment(os.environ)
        python_path = os.pathsep.join(p for p in (site, base.get("PYTHONPATH")) if p)
        # torch_xla's debug variables only where torch_xla may run (the user's own settings win).
        debug = debug_env.plan(os.environ, workdir, explain, torch_xla=backend in ("xla", "auto"))
        env = {
            **base,
            ENV_DIR: workdir,
            ENV_BACKEND: backend,
            ENV_WARMUP: str(warmup_steps),
            ENV_TOOL: str(os.getpid()),
            "PYTHONPATH": python_path,
            **debug.env,
        }
        command = [python or sys.executable, "-m", "tpu_migrate.diagnose.bootstrap",
                   "module" if module else "script", target, *args]
        report_fd = None
        if waited:
            env[ENV_UNBLOCK] = ",".join(str(int(s)) for s in waited)
            heard, report_fd = _signal_pipe()
            env[ENV_SIGNALS] = str(report_fd)
        try:
            process = subprocess.Popen(command, env=env, stdout=stdout,
                                       pass_fds=() if report_fd is None else (report_fd,))
        finally:
            if report_fd is not None:
                os.close(report_fd)  # the program holds the write end now
        exit_code = _wait(process, waited, subreaper, heard) if waited is not None else _wait_plain(process)
        stopped = _stop_leftovers() if subreaper else 0
        if stopped:
            sys.stderr.write(f"tpu-migrate diagnose: stopped {stopped} process(es) that the program "
                             "left running\n")
        found, damaged = read_events_counting(workdir)
        evidence = Evidence(exit_code=exit_code, events=found)
        # Read with a bound, regular files only, never waiting (the user's names any file).
        if debug.compiles is not None:
            evidence.debug_log, evidence.debug_base = debug.compiles.read(debug.notes), debug.compiles.base
        if debug.fallbacks is not None:
            evidence.fallback_log, evidence.fallback_base = debug.fallbacks.read(debug.notes), debug.fallbacks.base
        evidence.graphs = debug.read_graphs()
        evidence.notes = [*debug.notes, *_lost_evidence(workdir, damaged)]
        return evidence
    finally:
        try:
            if process is not None and process.poll() is None:  # the tool failed while it waited
                process.kill()
                process.wait()
            if subreaper:
                _stop_leftovers()
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)
            heard.close()
            if subreaper:
                _set_subreaper(False)
        finally:
            # Whatever failed above (no run directory, say): the caller gets its signals back,
            # or a Ctrl-C would do nothing in it from then on.
            if waited:  # what arrived after the program ended was for it: taken, not delivered
                while signal.sigtimedwait(waited, 0) is not None:
                    pass
                signal.pthread_sigmask(signal.SIG_UNBLOCK, waited)


def _lost_evidence(workdir: str, damaged: int) -> list[str]:
    """Notes on evidence lost while the program ran: the report must not pass off what is left
    as the whole run (a full disk's "1001 steps" of 3000)."""
    if not os.path.isdir(workdir):
        return [f"the run's directory {workdir} was deleted while the program ran: what it recorded "
                "is lost, and nothing below is measured"]
    notes = []
    lost = lost_writes(workdir)
    if lost:
        reasons = ", ".join(sorted({os.strerror(getattr(errno, name, errno.EIO)) for name in lost.values()}))
        notes.append(f"{len(lost)} process(es) could not write what they recorded ({reasons}, in "
                     f"{workdir}): steps, counts and findings stop where writing failed")
    if damaged:
        notes.append(f"{damaged} recorded line(s) could not be read (cut short or damaged) and were skipped")
    return notes


def _block_signals() -> set | None:
    """Block the relayed signals and SIGCHLD (the wake-up) in this thread; returns those this
    call blocked, or None where signals cannot be taken this way (not Linux, not the main
    thread), and _wait_plain is used."""
    if not hasattr(signal, "sigtimedwait") or threading.current_thread() is not threading.main_thread():
        return None
    wanted = {*RELAYED, signal.SIGCHLD}
    return wanted - signal.pthread_sigmask(signal.SIG_BLOCK, wanted)


def _signal_pipe() -> tuple[SignalsHeard, int]:
    """The pipe the program reports its signals through (signals.py): our reading end, and the
    write end it inherits."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    return SignalsHeard(read_fd), write_fd


def _wait(process: subprocess.Popen, waited: set, subreaper: bool, heard: SignalsHeard) -> int:
    """Wait for the program while taking the tool's signals (RELAYED); each reaches the program
    once, and its handlers decide how it ends.

    A signal the terminal sent (Ctrl-C, Ctrl-\\, hang-up) went to the whole foreground process
    group, the program included: it is not relayed. A signal a process sent (`kill TOOL`,
    `timeout`, or a job scheduler's `kill -TERM -PGID`, which reached the program too) is relayed
    at once where the program does not handle it (a second SIGTERM to a dying program changes
    nothing). Where it does, the program reports what it received (signals.py): the signal is
    relayed only if the program did not get it itself, HEARD_WINDOW_S later; a program that took
    that channel over gets it if still running RELAY_GRACE_S later, so that a program that got
    the signal is not interrupted again while it acts on it (KeyboardInterrupt, a checkpoint on
    SIGTERM). The tool then reports, and exits with the program's status.
    """
    relay: list[tuple[float, int, float]] = []  # (when to decide, signal, when taken)
    handled_before = 0  # the program's handled signals (SigCgt), sampled before each wait
    while process.poll() is None:
        due = min((r[0] for r in relay), default=None)
        timeout = 0.25 if due is None else min(0.25, max(0.0, due - time.monotonic()))
        if not heard.live:
            handled_before = _handled(process.pid)
        info = signal.sigtimedwait(waited, timeout)
        heard.read()
        now = time.monotonic()
        if info is not None and info.si_signo != signal.SIGCHLD and info.si_code != SI_KERNEL:
            # Without the channel, a program that got the signal too may be ending in its
            # handler already, its handlers reset to the default: what it handled a moment
            # before counts (a relay would end it by the signal instead of its own status).
            if not (_handles(process.pid, info.si_signo)
                    or (not heard.live and handled_before >> (info.si_signo - 1) & 1)):
                wait = 0.0
            else:
                wait = HEARD_WINDOW_S if heard.live else RELAY_GRACE_S
            relay.append((now + wait, info.si_signo, now))
        elif info is not None and info.si_signo == signal.SIGCHLD and subreaper:
            _reap_orphans(process.pid)
        for entry in [r for r in relay if r[0] <= now]:
            relay.remove(entry)
            _, signum, taken = entry
            if heard.received(signum, taken):
                continue  # the program got it itself
            if not heard.live and now < taken + RELAY_GRACE_S and _handles(process.pid, signum):
                relay.append((taken + RELAY_GRACE_S, signum, taken))  # the channel was taken over
                continue
            if process.poll() is None:
                process.send_signal(signum)
    return process.returncode


def _handles(pid: int, signum: int) -> bool:
    """Whether the process has a handler for the signal (SigCgt in /proc/PID/status)."""
    return bool(_handled(pid) >> (signum - 1) & 1)


def _handled(pid: int) -> int:
    """The signals the process has a handler for, as a bit mask (SigCgt); all where unknown."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("SigCgt:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        pass
    return -1


def _wait_plain(process: subprocess.Popen) -> int:
    # Ignore Ctrl-C here only now: an ignored SIGINT would be inherited by the program. The
    # terminal signals the whole process group; the program stops, and we still report.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        try:
            return process.wait()
        except KeyboardInterrupt:
            return process.wait()
    finally:
        signal.signal(signal.SIGINT, previous)


def _set_subreaper(on: bool) -> bool:
    """PR_SET_CHILD_SUBREAPER (Linux): the program's orphans become this process's children."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(36, int(on), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _children() -> list[int]:
    """This process's children, from /proc."""
    me = str(os.getpid()).encode()
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as handle:
                    stat = handle.read()
            except OSError:
                continue
            if stat[stat.rfind(b")") + 2 :].split()[1:2] == [me]:
                pids.append(int(entry))
    return pids


def _reap_orphans(program: int) -> None:
    """Reap the orphans that ended while the program runs (zombies otherwise), never the program."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid == program:
            return
        os.waitpid(info.si_pid, 0)


def _reap(pids: list[int], timeout: float) -> list[int]:
    """Reap those of pids that end within timeout seconds; returns the ones still running."""
    deadline = time.monotonic() + timeout
    live = list(pids)
    while True:
        for pid in list(live):
            try:
                done = os.waitpid(pid, os.WNOHANG)[0]
            except ChildProcessError:
                done = pid
            if done:
                live.remove(pid)
        if not live or time.monotonic() >= deadline:
            return live
        time.sleep(0.02)


def _stop_leftovers() -> int:
    """Stop the processes the program left running (orphans reparented to this subreaper): a
    moment to end by themselves (a resource tracker whose pipe closed), then SIGTERM, then
    SIGKILL 2 s later; their children are the next round. Returns how many were signalled."""
    signalled: set[int] = set()
    for _ in range(32):
        live = [pid for pid in _reap(_children(), 0.5) if pid not in signalled]  # not one stuck in D
        if not live:
            break
        signalled.update(live)
        for signum, timeout in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
            for pid in live:
                try:
                    os.kill(pid, signum)
                except ProcessLookupError:
                    pass
            live = _reap(live, timeout)
            if not live:
                break
    return len(signalled)
