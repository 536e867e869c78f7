"""The in-process half of `diagnose`: hooks installed in the traced program (and its workers).

It records events as JSON lines in $TPU_MIGRATE_DIAGNOSE/events.<pid>.jsonl:

- `step`: a step boundary (torch_xla.sync / xm.mark_step, each MpDeviceLoader batch, the end of
  `with torch_xla.step()`), with the size of torch_xla's PT_XLA_DEBUG_FILE at that moment so the
  parent can place each compilation in its step;
- `opt_step`: an optimizer step (the step count when the program has no XLA step marker);
- `sync`: a host read of a device tensor (`.item()`, `.tolist()`, `.cpu()`, `.numpy()`, `bool()`,
  `int()`, `float()`, `print`/format);
- `dynamic`: an op with a data-dependent output shape (`nonzero`, `masked_select`, `unique`,
  boolean-mask indexing);
- `fallback`: `aten::*` counters (ops torch_xla ran on the CPU) that moved during a step.

After $TPU_MIGRATE_DIAGNOSE_EVENT_LIMIT events (200,000: tens of MB) a process stops writing
them one by one and counts them in tally.<pid>.json instead, with the first step and the number
of steps of each; step boundaries are then written only when they carry news (a compile). A
long or endless program would otherwise fill the disk (about 400 bytes a step) and the report's
memory. The findings stay exact; the per-step timeline ends where counting began.

Hooks are installed when the program imports torch_xla (a meta-path finder), never before: the
program's own environment set-up (PJRT_DEVICE, ...) must run first. Each event carries the first
frame of the user's code. Cost: a wrapper call per host read and per step; the counters are read
once per step.
"""

from __future__ import annotations

import atexit
import functools
import importlib.abc
import importlib.machinery
import json
import os
import sys
import sysconfig
import threading
import time

from tpu_migrate.diagnose.locations import library_location
from tpu_migrate.diagnose.modes import leave_dispatch_mode

ENV_DIR = "TPU_MIGRATE_DIAGNOSE"
ENV_DEBUG_FILE = "PT_XLA_DEBUG_FILE"
ENV_BACKEND = "TPU_MIGRATE_DIAGNOSE_BACKEND"  # xla, native or auto (see install_backend)
ENV_WARMUP = "TPU_MIGRATE_DIAGNOSE_WARMUP"  # native: how many steps the op-coverage mode samples
ENV_EVENT_LIMIT = "TPU_MIGRATE_DIAGNOSE_EVENT_LIMIT"
DEFAULT_EVENT_LIMIT = 200_000
BOUNDARY_KINDS = ("step", "opt_step")

# Frames in these paths are never "the user's line".
_LIBRARY_MARKERS = (
    os.sep + "site-packages" + os.sep,
    os.sep + "dist-packages" + os.sep,
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
    frame = sys._getframe(start_depth)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not is_library(filename):
            return os.path.abspath(filename), frame.f_lineno
        frame = frame.f_back
    return None, None


def call_site(start_depth: int = 2):
    """(file, line, via): the user's frame, and when the event happened inside a library, the
    library call the user's line made and the library line it happened at ("path:line in
    function", outermost first; one entry when they are the same frame). The tool's own frames
    and the standard library's are not shown."""
    frame = sys._getframe(start_depth)
    innermost = outermost = None
    while frame is not None:
        filename = frame.f_code.co_filename
        if not is_library(filename):
            shown = [f for f in (outermost, innermost) if f is not None]
            return os.path.abspath(filename), frame.f_lineno, [
                library_location(f.f_code.co_filename, f.f_lineno, f.f_code.co_name)
                for f in dict.fromkeys(shown)]
        if is_shown_library(filename):
            innermost = innermost or frame
            outermost = frame
        frame = frame.f_back
    return None, None, []


def is_shown_library(filename: str) -> bool:
    """A library frame worth naming in `via`: not the tool's own wrappers, not the standard
    library (contextlib, threading), not generated code."""
    if not is_library(filename) or _TOOL in filename or filename.startswith("<"):
        return False
    # A venv's platstdlib is a prefix of its site-packages.
    return not filename.startswith(_STDLIB) or any(root in filename for root in _LIBRARY_MARKERS[:2])


_TOOL = os.sep + "tpu_migrate" + os.sep


class Recorder:
    """Collects events and appends them to this process's JSON-lines file."""

    def __init__(self, directory: str):
        self.path = os.path.join(directory, f"events.{os.getpid()}.jsonl")
        self.debug_file = os.environ.get(ENV_DEBUG_FILE)
        self.fallback_file = os.environ.get("XLA_FNTRACKER_FILE")  # --explain
        # Reentrant: os._exit from a signal handler that interrupted emit() flushes in that thread.
        self.lock = threading.RLock()
        self.buffer: list[str] = []
        self.last_flush = time.monotonic()
        self.finished = False  # finish() ran: later events (threads still running) go out at once
        self.forked = False  # a fork() child of a traced process (see _after_fork_in_child)
        self.recorded = False  # this process emitted an event
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

    # Re-entrancy: printing a tensor calls .tolist()/.item() internally; count the outer call only.
    def busy(self) -> bool:
        return getattr(self.local, "busy", False)

    def emit(self, event: dict) -> None:
        event["step"] = self.steps
        event["ostep"] = self.optimizer_steps
        self.emit_line(json.dumps(event))

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
        if kind in BOUNDARY_KINDS or kind in ("end", "backend"):
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
            except OSError:  # the run's directory is gone (a process outliving the run): carry on
                pass
        if self.tally is not None and (self.finished or self.last_flush - self.tally_written >= 1.0):
            self._write_tally_locked()

    def tally_path(self) -> str:
        return os.path.join(os.path.dirname(self.path), f"tally.{os.getpid()}.json")

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
        except OSError:
            pass

    def flush(self) -> None:
        with self.lock:
            self._flush_locked()

    def flush_soon(self) -> None:
        """Flush at a step boundary that may come every few hundred microseconds (an eager
        step): at most every 50 ms, which a program killed at any moment loses at worst."""
        if time.monotonic() - self.last_flush >= 0.05:
            self.flush()

    def at_user_line(self, kind: str, op: str, depth: int = 3, **extra) -> None:
        filename, line, via = call_site(depth)
        if filename is not None:
            event = {"kind": kind, "op": op, "file": filename, "line": line}
            if via:  # before the wait, which an event counted past the limit drops
                event["via"] = via
            self.emit({**event, **extra})

    def step_boundary(self, marker: str) -> None:
        self.read_fallbacks()
        filename, line = user_frame(3)
        compiles = self.metrics.counter_value("UncachedCompile") or 0 if self.metrics else 0
        self.emit({"kind": "step", "op": marker, "file": filename, "line": line,
                   "debug_offset": _size(self.debug_file), "fallback_offset": _size(self.fallback_file),
                   "compiles": compiles, "compile_time": self.compile_seconds(), "time": time.perf_counter()})
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
                self.fallbacks.moved({"kind": "fallback", "op": name, "file": filename, "line": line,
                                      "count": delta, "step": self.steps, "ostep": self.optimizer_steps})
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
        try:
            self.read_fallbacks()
        except Exception:  # noqa: BLE001 - the runtime may already be shutting down
            pass
        self.fallbacks.step_ended()  # ops whose call was never seen stay at their step's end
        rank = os.environ.get("RANK") or os.environ.get("PJRT_LOCAL_PROCESS_RANK")
        self.emit({"kind": "end", "op": None, "file": None, "line": None,
                   "rank": int(rank) if rank is not None and rank.isdigit() else self.rank,
                   "time": time.perf_counter()})
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
        self.recorder.emit_line(json.dumps({**event, "step": step, "ostep": ostep}))

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
    recorder.path = os.path.join(os.path.dirname(recorder.path), f"events.{os.getpid()}.jsonl")
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


def _size(path: str | None) -> int:
    """Bytes torch_xla has written to one of its logs: where the current step starts in it."""
    return os.path.getsize(path) if path and os.path.exists(path) else 0


def _sync_wrapper(original, name):
    @functools.wraps(original)
    def wrapper(self, *args, **kwargs):
        recorder = RECORDER
        if recorder is None or recorder.busy() or getattr(self, "device", None) is None or self.device.type != "xla":
            return original(self, *args, **kwargs)
        recorder.local.busy = True
        started = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:  # recorded once the read returned, with how long the host waited for it
            waited = time.perf_counter() - started
            closure = getattr(recorder.local, "closure", None)  # "sync" / "async" in a step closure
            if closure is None:
                recorder.at_user_line("sync", name, wait=waited)
            else:
                recorder.at_user_line("sync", name, closure=closure, wait=waited)
            recorder.local.busy = False
    return wrapper


def _dynamic_wrapper(original, name):
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        recorder = RECORDER
        first = args[0] if args else None
        if recorder is None or recorder.busy() or getattr(getattr(first, "device", None), "type", None) != "xla":
            return original(*args, **kwargs)
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:  # with how long the host waited to learn the shape
            recorder.at_user_line("dynamic", name, wait=time.perf_counter() - started)
    return wrapper


def _getitem_wrapper(original):
    import torch

    @functools.wraps(original)
    def wrapper(self, index):
        recorder = RECORDER
        if (
            recorder is not None
            and isinstance(index, torch.Tensor)
            and index.dtype == torch.bool
            and self.device.type == "xla"
            and not recorder.busy()
        ):
            recorder.at_user_line("dynamic", "boolean mask indexing")
        return original(self, index)
    return wrapper


# torch.compile(backend="openxla") syncs while it compiles: not a step of the program.
_COMPILER_SYNC = os.sep + os.path.join("torch_xla", "_dynamo") + os.sep


def _step_wrapper(original, marker):
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        recorder = RECORDER
        if (recorder is None or getattr(recorder.local, "in_step_context", False)
                or _COMPILER_SYNC in sys._getframe(1).f_code.co_filename):
            return original(*args, **kwargs)
        result = original(*args, **kwargs)
        recorder.step_boundary(marker)
        return result
    return wrapper


def _step_closure_wrapper(original):
    """Reads in a step closure run after the step's graph executed: they are recorded as such
    (`closure`: "sync" or "async"), not as reads that cut the step's graph."""
    @functools.wraps(original)
    def add_step_closure(closure, args=(), run_async=False):
        mode = "async" if run_async else "sync"

        @functools.wraps(closure)
        def marked(*closure_args):
            recorder = RECORDER
            if recorder is None:
                return closure(*closure_args)
            outer, recorder.local.closure = getattr(recorder.local, "closure", None), mode
            try:
                return closure(*closure_args)
            finally:
                recorder.local.closure = outer

        return original(marked, args, run_async)
    return add_step_closure


def _accumulator_wrapper(original):
    """`total = 0; total += t.sum()`: a Python number that becomes a device tensor changes the
    graph of the next step once (the sum first reads the constant 0, then the last total). Only
    a 0 is such a start: `1 + x` in a model costs no more than the two checks."""
    @functools.wraps(original)
    def __radd__(self, other):
        recorder = RECORDER
        if (recorder is not None and type(other) in (int, float) and other == 0 and not recorder.busy()
                and getattr(self, "device", None) is not None and self.device.type == "xla"):
            recorder.at_user_line("accumulator", "+=")
        return original(self, other)
    return __radd__


def optimizer_state_size(optimizer) -> int:
    """How many parameters have optimizer state (SGD momentum, Adam moments): created lazily
    in the first step, when it changes the graph of the step after."""
    try:
        return len(optimizer.state)
    except TypeError:
        return 0


class _StepContext:
    """`with torch_xla.step():` syncs on entry and exit; it is one step, ending at exit."""

    def __init__(self, inner):
        self.inner = inner

    def __enter__(self):
        RECORDER.local.in_step_context = True
        try:
            return self.inner.__enter__()
        finally:
            RECORDER.local.in_step_context = False

    def __exit__(self, *exc):
        RECORDER.local.in_step_context = True
        try:
            result = self.inner.__exit__(*exc)
        finally:
            RECORDER.local.in_step_context = False
        RECORDER.step_boundary("torch_xla.step")
        return result


_HOOKED = False


def install_torch_xla_hooks() -> None:
    """Wrap torch / torch_xla once per process; the wrappers pass through while RECORDER is None."""
    global _HOOKED
    import torch_xla.debug.metrics as met

    RECORDER.metrics = met
    if _HOOKED:
        return
    _HOOKED = True
    import torch
    import torch_xla

    for name in SYNC_METHODS:
        original = getattr(torch.Tensor, name, None)
        if original is not None:
            setattr(torch.Tensor, name, _sync_wrapper(original, name))
    for name in DYNAMIC_FUNCTIONS:
        for owner in (torch, torch.Tensor):
            original = getattr(owner, name, None)
            if original is not None:
                setattr(owner, name, _dynamic_wrapper(original, name))
    torch.Tensor.__getitem__ = _getitem_wrapper(torch.Tensor.__getitem__)
    torch.Tensor.__radd__ = _accumulator_wrapper(torch.Tensor.__radd__)
    import torch_xla.core.xla_model as xm

    xm.add_step_closure = _step_closure_wrapper(xm.add_step_closure)
    sync = _step_wrapper(torch_xla.sync, "torch_xla.sync")
    torch_xla.sync = sync
    if hasattr(torch_xla, "torch_xla"):
        torch_xla.torch_xla.sync = sync
    original_step = torch_xla.step

    @functools.wraps(original_step)
    def step(*args, **kwargs):
        return _StepContext(original_step(*args, **kwargs))

    torch_xla.step = step
    from torch.optim.optimizer import register_optimizer_step_post_hook

    state_sizes: dict[int, int] = {}  # id(optimizer) -> parameters with state so far

    def optimizer_step(optimizer, args, kwargs):
        recorder = RECORDER
        if recorder is None:
            return
        recorder.emit({"kind": "opt_step", "op": None, "file": None, "line": None,
                       "debug_offset": _size(recorder.debug_file),
                       "fallback_offset": _size(recorder.fallback_file),
                       "compile_time": recorder.compile_seconds(), "time": time.perf_counter()})
        size, known = optimizer_state_size(optimizer), state_sizes.get(id(optimizer), 0)
        if size > known:
            state_sizes[id(optimizer)] = size
            recorder.emit({"kind": "opt_state", "op": type(optimizer).__name__, "file": None,
                           "line": None, "count": size - known})
        recorder.optimizer_steps += 1
        recorder.flush()  # the step boundary of programs without an XLA step marker

    register_optimizer_step_post_hook(optimizer_step)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a callback right after `import NAME` finishes: the hooks go in only once the
    program's own set-up before that import (PJRT_DEVICE, ...) has run."""

    def __init__(self, name: str, callback):
        self.name = name
        self.callback = callback

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original_exec = loader.exec_module

        def exec_module(module):
            original_exec(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            self.callback()

        loader.exec_module = exec_module
        return spec


def _after_import(name: str, callback) -> None:
    if name in sys.modules:
        callback()
    elif not any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, callback))


def _safely(what: str, install_hooks) -> None:
    """The tracer must never break the program it diagnoses: a failure is one line on stderr."""
    try:
        install_hooks()
    except Exception as exc:  # noqa: BLE001
        sys.stderr.write(f"tpu-migrate diagnose: {what} tracing disabled: {type(exc).__name__}: {exc}\n")


def _install_xla() -> None:
    from tpu_migrate.diagnose import native

    native.uninstall()  # auto backend: the program uses torch_xla after all
    _safely("torch_xla", install_torch_xla_hooks)
    RECORDER.emit({"kind": "backend", "op": "xla", "file": None, "line": None, "started": RECORDER.started})


def _install_native() -> None:
    from tpu_migrate.diagnose import native

    if "torch_xla" not in sys.modules:
        _safely("native", lambda: native.install(RECORDER))


def _dynamo_imported() -> None:
    from tpu_migrate.diagnose import native

    _safely("torch.compile", native.dynamo_imported)


def _spawn_rank_hook() -> None:
    """torch.multiprocessing.spawn starts each worker through `_wrap(fn, i, ...)`: `i` is the
    worker's rank, which a report must show even for a worker that never ends by itself. The
    module attribute is replaced, which the spawn start method's pickled target resolves to."""
    import torch.multiprocessing.spawn as spawn

    original = spawn._wrap
    if getattr(original, "_tpu_migrate", False):
        return

    @functools.wraps(original)
    def _wrap(fn, i, *args, **kwargs):
        recorder = RECORDER
        if recorder is not None and isinstance(i, int):
            recorder.rank = i
            recorder.emit({"kind": "rank", "op": None, "file": None, "line": None, "rank": i})
        return original(fn, i, *args, **kwargs)

    _wrap._tpu_migrate = True
    spawn._wrap = _wrap


def install_backend(backend: str) -> None:
    """xla: hooks when torch_xla is imported; native: hooks when torch is imported; auto:
    native, replaced by xla if the program imports torch_xla."""
    if backend in ("xla", "auto"):
        _after_import("torch_xla", _install_xla)
    if backend in ("native", "auto"):
        _after_import("torch", _install_native)
        _after_import("torch._dynamo", _dynamo_imported)


def install() -> bool:
    """Start recording in this process when the diagnose environment is set."""
    global RECORDER
    directory = os.environ.get(ENV_DIR)
    if not directory or RECORDER is not None:
        return False
    RECORDER = Recorder(directory)
    atexit.register(RECORDER.finish)
    install_exit_hooks()
    install_backend(os.environ.get(ENV_BACKEND, "xla"))
    _after_import("torch.multiprocessing.spawn", lambda: _safely("spawn rank", _spawn_rank_hook))
    return True


class InProcess:
    """Trace a block of code in this process (the pytest plugin): no child process, no
    PT_XLA_DEBUG file; torch_xla compiles are counted per step from its counters instead.
    Code without torch_xla gets the native backend."""

    def __init__(self, directory: str, warmup_steps: int = 2):
        self.directory = directory
        self.warmup_steps = warmup_steps

    def __enter__(self) -> "InProcess":
        global RECORDER
        RECORDER = Recorder(self.directory)
        RECORDER.debug_file = RECORDER.fallback_file = None
        if "torch_xla" in sys.modules:
            install_torch_xla_hooks()
            RECORDER.aten = {name: RECORDER.metrics.counter_value(name)
                             for name in RECORDER.metrics.counter_names() if name.startswith("aten::")}
            RECORDER.emit({"kind": "backend", "op": "xla", "file": None, "line": None, "started": RECORDER.started})
        else:
            _after_import("torch_xla", _install_xla)  # hooks once the test imports torch_xla
            if "torch" in sys.modules:
                from tpu_migrate.diagnose import native

                native.install(RECORDER, self.warmup_steps, scan_sources=False)
                _after_import("torch._dynamo", _dynamo_imported)
        return self

    def __exit__(self, *exc) -> None:
        global RECORDER
        from tpu_migrate.diagnose import native

        native.uninstall()
        recorder, RECORDER = RECORDER, None
        recorder.flush()
