"""The recorder every backend writes through: one per traced process, in its events file
(events.py has the format). Also what every hook needs: which frame is the user's line.

After $TPU_MIGRATE_DIAGNOSE_EVENT_LIMIT events (200,000: tens of MB) a process stops writing
them one by one and counts them in tally.<pid>.json instead, with the first step and the number
of steps of each; step boundaries are then written only when they carry news (a compile). A
long or endless program would otherwise fill the disk (about 400 bytes a step) and the report's
memory. The findings stay exact; the per-step timeline ends where counting began.

Each event carries the first frame of the user's code. RECORDER is the process's recorder while
it is traced (tracer.install, inprocess.InProcess); the hooks pass through while it is None.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import sys
import sysconfig
import threading
import time

from tpu_migrate.diagnose import events
from tpu_migrate.diagnose.events import BOUNDARY_KINDS, FallbackEvent, Kind, RankEvent, StepEvent
from tpu_migrate.diagnose.locations import PACKAGE_ROOTS, library_location
from tpu_migrate.diagnose.modes import leave_dispatch_mode

ENV_DIR = "TPU_MIGRATE_DIAGNOSE"
ENV_DEBUG_FILE = "PT_XLA_DEBUG_FILE"
ENV_BACKEND = "TPU_MIGRATE_DIAGNOSE_BACKEND"  # xla, native, standin or auto (see tracer.install_backend)
ENV_WARMUP = "TPU_MIGRATE_DIAGNOSE_WARMUP"  # native: how many steps the op-coverage mode samples
ENV_EVENT_LIMIT = "TPU_MIGRATE_DIAGNOSE_EVENT_LIMIT"
# What every traced process passes on to its Python children, and hides from the program
# (diagnose/inheritance.py).
INHERITED = (ENV_DIR, ENV_BACKEND, ENV_WARMUP, ENV_EVENT_LIMIT)
DEFAULT_EVENT_LIMIT = 200_000

# Frames in these paths are never "the user's line".
_LIBRARY_MARKERS = (
    *PACKAGE_ROOTS,
    os.sep + "torch" + os.sep,
    os.sep + "torch_xla" + os.sep,
    os.sep + "tpu_migrate" + os.sep,
    "<frozen",
    os.sep + "runpy.py",
    os.sep + "multiprocessing" + os.sep,
    os.sep + "threading.py",
)
SYNC_METHODS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__",
                "__repr__", "__format__")
DYNAMIC_FUNCTIONS = ("nonzero", "masked_select", "unique", "argwhere")


def scalar_indexing(device: str) -> str:
    """The op of a read torch makes in C++ (`table[t]`, t a 0-d integer tensor on `device`: it
    reads t to select with it), as every backend names it: "device" for torch_xla's xla
    tensors, the device type elsewhere ("tpu" on the stand-in and where the CPU stands in)."""
    return f"indexing with a {device} scalar"
EXPECTED_ATEN = {"aten::_local_scalar_dense": "sync", "aten::nonzero": "dynamic",
                 "aten::masked_select": "dynamic", "aten::_unique2": "dynamic",
                 "aten::unique_consecutive": "dynamic", "aten::unique_dim": "dynamic"}


# The standard library is never the user's line either (a graph break inside DDP's forward is
# reported by Dynamo at contextlib.py, for one).
_STDLIB = tuple({os.path.join(path, "") for key in ("stdlib", "platstdlib")
                 for path in (sysconfig.get_paths()[key], os.path.realpath(sysconfig.get_paths()[key]))})


def is_library(filename: str) -> bool:
    return (filename.startswith("<") or filename.startswith(_STDLIB)
            or any(marker in filename for marker in _LIBRARY_MARKERS))


def user_frame(start_depth: int = 2):
    """(file, line) of the first frame outside torch, torch_xla, site-packages and the tool."""
    filename, line, _ = call_site(start_depth + 1)
    return filename, line


def call_site(start_depth: int = 2, frame=None):
    """(file, line, via): the user's frame, and when the event happened inside a library, the
    library call the user's line made and the library line it happened at ("path:line in
    function", outermost first; one entry when they are the same frame). The tool's own frames
    and the standard library's are not shown. `frame`: where the event happened, if not
    `start_depth` frames up."""
    frame = sys._getframe(start_depth) if frame is None else frame
    innermost = outermost = None
    while frame is not None:
        filename = frame.f_code.co_filename
        if not is_library(filename):
            shown = [f for f in (outermost, innermost) if f is not None]
            return os.path.abspath(filename), frame.f_lineno, [
                library_location(f.f_code.co_filename, f.f_lineno, _frame_name(f.f_code))
                for f in dict.fromkeys(shown)]
        if is_shown_library(filename):
            innermost = innermost or frame
            outermost = frame
        frame = frame.f_back
    return None, None, []


def _frame_name(code) -> str:
    """A function's name, with its class where the name alone says nothing (`StopCheck.__call__`,
    not `__call__`)."""
    return code.co_qualname if code.co_name.startswith("__") else code.co_name


# Decorator plumbing in site-packages: a frame there says nothing about which library call
# synced (typing_extensions' `deprecated` wrapper was named as "via typing_extensions.py:3140").
_PLUMBING_FILES = (os.sep + "typing_extensions.py", os.sep + "decorator.py")
_PLUMBING_PACKAGES = (os.sep + "wrapt" + os.sep,)


def is_shown_library(filename: str) -> bool:
    """A library frame worth naming in `via`: not the tool's own wrappers, not the standard
    library (contextlib, threading), not decorator plumbing, not generated code."""
    if not is_library(filename) or _TOOL in filename or filename.startswith("<"):
        return False
    if filename.endswith(_PLUMBING_FILES) or any(package in filename for package in _PLUMBING_PACKAGES):
        return False
    # A venv's platstdlib is a prefix of its site-packages.
    return not filename.startswith(_STDLIB) or any(root in filename for root in PACKAGE_ROOTS)


_TOOL = os.sep + "tpu_migrate" + os.sep


class Recorder:
    """Collects events and appends them to this process's JSON-lines file."""

    def __init__(self, directory: str):
        self.path = events.events_path(directory, os.getpid())
        self.debug_file = os.environ.get(ENV_DEBUG_FILE)
        self.fallback_file = os.environ.get("XLA_FNTRACKER_FILE")  # --explain
        # Reentrant: os._exit from a signal handler that interrupted emit() flushes in that thread.
        self.lock = threading.RLock()
        self.buffer: list[str] = []
        self.last_flush = time.monotonic()
        self.finished = False  # finish() ran: later events (threads still running) go out at once
        self.forked = False  # a fork() child of a traced process (see _after_fork_in_child)
        self.recorded = False  # this process emitted an event
        self.lost = False  # a write of events failed (_mark_lost)
        self.steps = 0
        self.optimizer_steps = 0  # the step count of programs without an XLA step marker
        self.local = threading.local()
        self.aten: dict[str, int] = {}
        self.fallbacks = FallbackLocator(self)
        self.metrics = None
        self.rank: int | None = None  # the process index torch.multiprocessing.spawn gave it
        self.limit = _event_limit()
        self.written = 0  # events written one by one
        # Counting mode (past the limit): event without its step -> [count, first step, first
        # optimizer step, last step, last optimizer step, steps seen in, optimizer steps seen in].
        self.tally: dict[str, list[int]] | None = None
        self.tally_start = (0, 0)
        self.tally_written = 0.0
        self.last_boundary: dict[str, tuple] = {}
        self.started = time.perf_counter()  # the time to the first step counts from here
        self.finishers: list = []  # called first by finish(): what a backend reports at the end

    # Re-entrancy: printing a tensor calls .tolist()/.item() internally; count the outer call only.
    def busy(self) -> bool:
        return getattr(self.local, "busy", False)

    def emit(self, event: events.Event) -> None:
        event["step"] = self.steps
        event["ostep"] = self.optimizer_steps
        self.emit_line(events.encode(event))

    def emit_line(self, line: str) -> None:
        """An event already written as one JSON object (with its step and ostep)."""
        with self.lock:
            self.recorded = True
            if self.tally is not None:
                self._count_locked(line)
                return
            self.buffer.append(line)
            self.written += 1
            if self.written >= self.limit:
                self._flush_locked()
                self.tally = {}
                self.tally_start = (self.steps, self.optimizer_steps)
            # Unwritten events die with the process (SIGKILL, a crash): they are written at every
            # step boundary, at least once a second, and at once after finish().
            elif len(self.buffer) >= 256 or self.finished or time.monotonic() - self.last_flush >= 1.0:
                self._flush_locked()

    def _count_locked(self, line: str) -> None:
        kind = line[10 : line.index('"', 10)]  # every event starts with {"kind": "...
        if kind in BOUNDARY_KINDS:
            # Written only when it differs from the last one but for its time and numbers: a
            # moved compile counter or log offset places a compile in its step.
            event = json.loads(line)
            for name in ("time", "step", "ostep"):
                event.pop(name, None)
            signature = tuple(event.items())
            if self.last_boundary.get(kind) == signature:
                return
            self.last_boundary[kind] = signature
        if kind in BOUNDARY_KINDS or kind in (Kind.END, Kind.BACKEND):
            self.buffer.append(line)
            self._flush_locked()
            return
        key = line[: line.rindex(', "step": ')]  # events end with their step and ostep
        if ', "wait": ' in key:  # a host read's wait is not counted past the limit
            key = key[: key.rindex(', "wait": ')]
        key += "}"
        step, ostep = self.steps, self.optimizer_steps
        entry = self.tally.get(key)
        if entry is None:
            self.tally[key] = [1, step, ostep, step, ostep, 1, 1]
        else:
            entry[0] += 1
            if entry[3] != step:
                entry[3], entry[5] = step, entry[5] + 1
            if entry[4] != ostep:
                entry[4], entry[6] = ostep, entry[6] + 1
        if self.finished or time.monotonic() - self.tally_written >= 1.0:
            self._flush_locked()

    def _flush_locked(self) -> None:
        # Take the lines first: a reentrant flush (os._exit in a signal handler) writes only its own.
        lines, self.buffer = self.buffer, []
        self.last_flush = time.monotonic()
        if lines:
            try:
                with open(self.path, "a", encoding="utf-8") as handle:
                    handle.write("\n".join(lines) + "\n")
            except OSError as exc:  # a full disk, the run's directory gone: the program carries on
                self._mark_lost(exc)
        if self.tally is not None and (self.finished or self.last_flush - self.tally_written >= 1.0):
            self._write_tally_locked()

    def tally_path(self) -> str:
        return events.tally_path(os.path.dirname(self.path), os.getpid())

    def _write_tally_locked(self) -> None:
        """The counts so far, replacing the last ones whole (a kill loses at most a second)."""
        self.tally_written = time.monotonic()
        document = {"from_step": self.tally_start[0], "from_ostep": self.tally_start[1],
                    "steps": self.steps, "osteps": self.optimizer_steps,
                    "events": [[key, *entry] for key, entry in self.tally.items()]}
        path = self.tally_path()
        try:
            with open(path + ".tmp", "w", encoding="utf-8") as handle:
                json.dump(document, handle)
            os.replace(path + ".tmp", path)
        except OSError as exc:
            self._mark_lost(exc)

    def _mark_lost(self, error: OSError) -> None:
        """Tell the tool that events of this process were lost, and why: an empty file (on a
        full disk a name still fits where a line does not), made once."""
        if self.lost:
            return
        self.lost = True
        name = errno.errorcode.get(error.errno or 0, "EIO")
        try:
            os.close(os.open(events.lost_path(os.path.dirname(self.path), os.getpid(), name),
                             os.O_WRONLY | os.O_CREAT, 0o600))
        except OSError:  # the directory is gone: the tool sees that itself
            pass

    def flush(self) -> None:
        with self.lock:
            self._flush_locked()

    def flush_soon(self) -> None:
        """Flush at a step boundary that may come every few hundred microseconds (an eager
        step): at most every 50 ms, which a program killed at any moment loses at worst."""
        if time.monotonic() - self.last_flush >= 0.05:
            self.flush()

    def at_user_line(self, kind: str, op: str, depth: int = 3, frame=None, **extra) -> None:
        filename, line, via = call_site(depth, frame)
        if filename is not None:
            event = events.Event(kind=kind, op=op, file=filename, line=line)
            if via:  # before the wait, which an event counted past the limit drops
                event["via"] = via
            event.update(extra)  # type: ignore[typeddict-item]  # the keys of the caller's kind (wait, ...)
            self.emit(event)

    def step_boundary(self, marker: str) -> None:
        self.read_fallbacks()
        filename, line = user_frame(3)
        compiles = self.metrics.counter_value("UncachedCompile") or 0 if self.metrics else 0
        self.emit(StepEvent(kind=Kind.STEP, op=marker, file=filename, line=line,
                            debug_offset=log_size(self.debug_file), fallback_offset=log_size(self.fallback_file),
                            compiles=compiles, compile_time=self.compile_seconds(), time=time.perf_counter()))
        self.steps += 1
        self.flush()

    def compile_seconds(self) -> float:
        """torch_xla's CompileTime so far (its accumulator is in nanoseconds): the difference
        between two step ends is the time that step spent compiling."""
        if self.metrics is None:
            return 0.0
        data = self.metrics.metric_data("CompileTime")
        return data[1] / 1e9 if data else 0.0

    def read_fallbacks(self) -> None:
        """aten:: counters that moved since the last step: ops that ran on the CPU."""
        if self.metrics is None:
            return
        current = {name: self.metrics.counter_value(name)
                   for name in self.metrics.counter_names() if name.startswith("aten::")}
        filename, line = user_frame(4)
        self.fallbacks.step_ended()
        for name, value in current.items():
            delta = value - self.aten.get(name, 0)
            if delta > 0 and name not in EXPECTED_ATEN:
                self.fallbacks.moved(FallbackEvent(kind=Kind.FALLBACK, op=name, file=filename, line=line,
                                                   count=delta, step=self.steps, ostep=self.optimizer_steps))
        self.fallbacks.watch_next_step()
        self.aten = current

    def finish(self) -> None:
        """The process's last event: at exit (atexit) or os._exit. Once; a forked child that
        recorded nothing (a DataLoader worker) writes no file."""
        with self.lock:
            if self.finished:
                return
            self.finished = True
        if self.forked and not self.recorded:
            return
        for finisher in self.finishers:
            try:
                finisher()
            except Exception:  # noqa: BLE001 - a report's fault must not cost the others
                pass
        try:
            self.read_fallbacks()
        except Exception:  # noqa: BLE001 - the runtime may already be shutting down
            pass
        self.fallbacks.step_ended()  # ops whose call was never seen stay at their step's end
        rank = os.environ.get("RANK") or os.environ.get("PJRT_LOCAL_PROCESS_RANK")
        self.emit(RankEvent(kind=Kind.END, op=None, file=None, line=None,
                            rank=int(rank) if rank is not None and rank.isdigit() else self.rank,
                            time=time.perf_counter(), compile_time=self.compile_seconds()))
        self.flush()


class FallbackLocator:
    """The line of each CPU fallback, at small cost: torch_xla counts fallbacks per op, read at
    each step's end. When an op's counter first moves, a dispatch mode watches that op for one
    step, records the user's line that calls it, and steps aside; the first step's count waits
    for that line, and later counts go to it. An op not seen again stays at its step's end
    (--explain records every call's line)."""

    def __init__(self, recorder: "Recorder"):
        self.recorder = recorder
        self.sites: dict[str, tuple[str, int]] = {}  # op -> the user's line that called it
        self.pending: list[dict] = []  # first counts, waiting one step for their line
        self.watched: set[str] = set()
        self.mode = None

    def moved(self, event: dict) -> None:
        site = self.sites.get(event["op"])
        if site is None:
            self.pending.append(event)
            self.watched.add(event["op"])
        else:
            self._emit(event, site)

    def _emit(self, event: dict, site: tuple[str, int] | None) -> None:
        if site is not None:
            event["file"], event["line"], event["exact"] = site[0], site[1], True
        step, ostep = event.pop("step"), event.pop("ostep")
        self.recorder.emit_line(events.encode({**event, "step": step, "ostep": ostep}))

    def step_ended(self) -> None:
        """The watched step is over: the mode steps aside, the waiting counts go out."""
        self._stop()
        for event in self.pending:
            self._emit(event, self.sites.get(event["op"]))
        self.pending = []
        self.watched -= set(self.sites)

    def watch_next_step(self) -> None:
        # A dispatch mode makes Dynamo skip compiling (torch.compile(backend="openxla")): never
        # once the program has compiled a graph with it.
        if self.watched and self.mode is None and not self.recorder.finished and not _dynamo_compiled():
            try:
                self.mode = _fallback_watch(self)
                self.mode.__enter__()
            except Exception:  # noqa: BLE001 - no watch: the counts stay at the step's end
                self.mode = None

    def seen(self, op: str) -> None:
        if op in self.watched and op not in self.sites:
            filename, line = user_frame(3)
            if filename is not None:
                self.sites[op] = (filename, line)

    def _stop(self) -> None:
        leave_dispatch_mode(self.mode)
        self.mode = None


def _dynamo_compiled() -> bool:
    utils = sys.modules.get("torch._dynamo.utils")
    return utils is not None and bool(utils.counters["stats"].get("unique_graphs"))


def _fallback_watch(locator: FallbackLocator):
    from torch.utils._python_dispatch import TorchDispatchMode

    class FallbackWatch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            locator.seen(func._schema.name)  # "aten::linalg_eig", as torch_xla's counter
            return func(*args, **(kwargs or {}))

    return FallbackWatch()


RECORDER: Recorder | None = None


def _after_fork_in_child() -> None:
    """A fork() child (multiprocessing's fork start method, DataLoader workers) inherits the
    recorder: it gets its own file, not the parent's unwritten events (the parent writes them),
    a fresh lock (another thread may have held it), and no XLA counters (no runtime after fork)."""
    recorder = RECORDER
    if recorder is None:
        return
    recorder.path = events.events_path(os.path.dirname(recorder.path), os.getpid())
    recorder.lock = threading.RLock()
    recorder.buffer = []
    recorder.forked, recorder.recorded, recorder.finished = True, False, False
    recorder.metrics = None
    recorder.written, recorder.tally, recorder.last_boundary = 0, None, {}


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _exit_wrapper(original):
    """os._exit skips atexit (multiprocessing's fork children leave this way too): finish first."""
    @functools.wraps(original)
    def _exit(status):
        recorder = RECORDER
        if recorder is not None:
            try:
                recorder.finish()
            except Exception:  # noqa: BLE001 - never stand between the program and its exit
                pass
        original(status)
    return _exit


def install_exit_hooks() -> None:
    if not getattr(os._exit, "_tpu_migrate", False):
        os._exit = _exit_wrapper(os._exit)
        os._exit._tpu_migrate = True


def _event_limit() -> int:
    value = os.environ.get(ENV_EVENT_LIMIT, "")
    return int(value) if value.isdigit() and int(value) > 0 else DEFAULT_EVENT_LIMIT


def log_size(path: str | None) -> int:
    """Bytes torch_xla has written to one of its logs: where the current step starts in it."""
    return os.path.getsize(path) if path and os.path.exists(path) else 0
