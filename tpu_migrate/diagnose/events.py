"""The events file: what a traced process records, and how the parent reads it back.

Each traced process appends JSON lines to $TPU_MIGRATE_DIAGNOSE/events.<pid>.jsonl, one event a
line, each an object whose first key is `kind` (the recorder's counting mode relies on that), then
`op`, `file`, `line` (the user's line, or null), the fields of its kind, and last `step` and
`ostep` (the XLA step and optimizer step it happened in). The event kinds:

- `step`: a step boundary (torch_xla.sync / xm.mark_step, each MpDeviceLoader batch, the end of
  `with torch_xla.step()`), with the size of torch_xla's PT_XLA_DEBUG_FILE at that moment so the
  parent can place each compilation in its step;
- `opt_step`: an optimizer step (the step count when the program has no XLA step marker);
- `sync`: a host read of a device tensor (`.item()`, `.tolist()`, `.cpu()`, `.numpy()`, `bool()`,
  `int()`, `float()`, `print`/format);
- `dynamic`: an op with a data-dependent output shape (`nonzero`, `masked_select`, `unique`,
  boolean-mask indexing);
- `fallback`: `aten::*` counters (ops torch_xla ran on the CPU) that moved during a step;
- `accumulator`, `opt_state`: what changes the next step's graph once (causes.py);
- `backend`, `rank`, `end`: which backend traced the process, its rank, its end;
- `device_tensor`: the TorchTPU stand-in only: the process made its first tensor on the `tpu`
  device (a run without one computed on the host, and could make no host sync);
- `host_only`: the native backend with the CPU standing in: every place the program's source names
  is the host (`device = torch.device("cpu")`), so every tensor was judged a host tensor;
- native backend only: `compile`, `compile_time`, `recompile`, `graph_break`, `recompile_limit`,
  `unsupported`, `incompatible` (native.py), and `call_time` at the process's end: per call site
  and input signature of a compiled function, its first call apart from the later ones
  (call_timing.py).

Past its event limit a process counts events in tally.<pid>.json instead (recording.Recorder);
read_events turns the tally back into events: a `counted` event, and each tally entry as one
event with its count multiplied and the number of steps it was seen in (`in_steps`).

The types below are TypedDicts, not classes: the recorder builds these dicts on every host read
of the traced program, where an object per event would cost time, and the parent reads the same
dicts back. Each writer builds its event with its type's constructor (`StepEvent(kind=...)`,
a plain dict at run time), so a type checker holds writers and readers to one schema.
"""

from __future__ import annotations

import glob
import json
import os
from typing import NotRequired, TypedDict


class Kind:
    """The event kinds (each event's `kind`)."""

    STEP = "step"
    OPT_STEP = "opt_step"
    OPT_STATE = "opt_state"
    SYNC = "sync"
    DYNAMIC = "dynamic"
    FALLBACK = "fallback"
    ACCUMULATOR = "accumulator"
    BACKEND = "backend"
    RANK = "rank"
    END = "end"
    COMPILE = "compile"
    COMPILE_TIME = "compile_time"
    RECOMPILE = "recompile"
    GRAPH_BREAK = "graph_break"
    RECOMPILE_LIMIT = "recompile_limit"
    UNSUPPORTED = "unsupported"
    INCOMPATIBLE = "incompatible"
    CALL_TIME = "call_time"
    DEVICE_TENSOR = "device_tensor"  # standin: the process made its first tpu tensor
    HOST_ONLY = "host_only"  # native, the CPU standing in: the program places every tensor on the host
    COUNTED = "counted"  # made by read_events, never written


BOUNDARY_KINDS = (Kind.STEP, Kind.OPT_STEP)


class Event(TypedDict):
    """What every event has. `step` and `ostep` are added by the recorder when it writes."""

    kind: str
    op: str | None
    file: str | None
    line: int | None
    via: NotRequired[list[str]]  # the library call the user's line made ("path:line in function")
    static: NotRequired[bool]  # found in the source (no rank, no step of its own)
    step: NotRequired[int]
    ostep: NotRequired[int]
    # A tally entry (read_events): the steps and optimizer steps it was seen in.
    count: NotRequired[int]
    in_steps: NotRequired[int]
    in_osteps: NotRequired[int]


class StepEvent(Event):
    """`step` (op: the marker) and `opt_step` (the xla backend adds the log offsets)."""

    time: float
    debug_offset: NotRequired[int]
    fallback_offset: NotRequired[int]
    compiles: NotRequired[int]  # torch_xla's UncachedCompile counter (`step` only)
    compile_time: NotRequired[float]  # torch_xla's CompileTime so far, in seconds


class ReadEvent(Event):
    """`sync`, `dynamic` (op: the method or function) and `accumulator`."""

    wait: NotRequired[float]  # seconds the host waited for the value or the shape
    queued: NotRequired[float]  # native, the CPU standing in: seconds of work since the last read
    closure: NotRequired[str]  # "sync" / "async": read in an xm.add_step_closure callback
    graph: NotRequired[bool]  # a closure's read that ran a graph (it computed on the device)
    placement: NotRequired[str]  # native, the CPU standing in: placement.UNKNOWN
    traced: NotRequired[bool]  # found where the code is traced, recurs with every call


class FallbackEvent(Event):
    """`fallback` (op: the aten counter) and `opt_state` (op: the optimizer's class), always
    with their `count`."""

    exact: NotRequired[bool]  # at the line that called the op, not at its step's end


class BackendEvent(Event):
    """`backend` (op: "xla", "native" or "standin")."""

    started: float  # perf_counter when recording started
    device: NotRequired[str]  # native: the device type, "cpu" when the CPU stands in


class RankEvent(Event):
    """`rank` (torch.multiprocessing.spawn's index) and `end` (with its time)."""

    rank: int | None
    time: NotRequired[float]
    compile_time: NotRequired[float]  # `end`, xla: torch_xla's CompileTime at the end (compiles after the last step)


class DynamoEvent(Event):
    """Native: `recompile` (op: the function), `recompile_limit` (op: `limit=N`), `graph_break`
    (op: Dynamo's reason), `unsupported` (op: the aten op), `compile` (op: Dynamo's compile id),
    `compile_time`, `incompatible` (op: the call)."""

    reason: NotRequired[str]  # a guard's failure; "compiled" for an op seen in a captured graph
    caller: NotRequired[str | None]  # recompile: "path:line" of the call that ran the function
    gb: NotRequired[str | None]  # the graph break's id (GB0001)
    hint: NotRequired[str | None]
    seconds: NotRequired[float]  # compile_time


class CallTimeEvent(Event):
    """Native: `call_time` (op: the compiled function's name), at the user's line that called it."""

    inputs: str  # the tensors it got: "arg0 (16, 12) float32, attention_mask (1, 7) int64"
    first_seconds: float  # the first call with these inputs (compile + run)
    first_compiled: bool  # Dynamo compiled during it
    later_calls: int  # calls with the same inputs after it (steady state)
    later_seconds: float  # their total
    later_min_seconds: float | None
    later_compiled: int  # later calls that compiled all the same (another guard failed)


class CountedEvent(Event):
    """`counted`: the process went past its event limit at `step`; it ran `steps` in all."""

    steps: int
    osteps: int


encode = json.dumps  # one event as its line (without the newline)


def events_path(directory: str, pid: int) -> str:
    return os.path.join(directory, f"events.{pid}.jsonl")


def tally_path(directory: str, pid: int) -> str:
    return os.path.join(directory, f"tally.{pid}.json")


def lost_path(directory: str, pid: int, error: str) -> str:
    """The empty file a process makes when it cannot write its events (`error`: ENOSPC, ...)."""
    return os.path.join(directory, f"lost.{pid}.{error}")


def lost_writes(directory: str) -> dict[int, str]:
    """pid -> the error name, for each process that could not write all its events."""
    lost = {}
    for path in glob.glob(os.path.join(directory, "lost.*.*")):
        _, pid, error = os.path.basename(path).split(".", 2)
        if pid.isdigit():
            lost[int(pid)] = error
    return lost


def read_events(directory: str) -> dict[int, list[Event]]:
    return read_events_counting(directory)[0]


def read_events_counting(directory: str) -> tuple[dict[int, list[Event]], int]:
    """The events every traced process wrote, by process id, in order; then, for a process that
    went on counting (recording.Recorder), a `counted` event and one event per tally entry.
    A line that is not an event (cut short by SIGKILL or a full disk, damaged) is skipped; the
    second value counts them."""
    events: dict[int, list[Event]] = {}
    bad = 0
    for path in sorted(glob.glob(os.path.join(directory, "events.*.jsonl"))):
        pid = int(path.rsplit(".", 2)[1])
        events[pid] = []
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                for line in handle:
                    try:
                        event = json.loads(line)
                    except ValueError:
                        event = None
                    if _is_event(event):
                        events[pid].append(event)
                    elif line.strip():
                        bad += 1
        except OSError:  # not a file any more: that process's writes failed (lost_writes says)
            pass
        events[pid].extend(_tally_events(tally_path(directory, pid)))
    return events, bad


def _is_event(event) -> bool:
    return (isinstance(event, dict) and isinstance(event.get("kind"), str)
            and isinstance(event.get("step"), int) and isinstance(event.get("ostep"), int))


def _tally_events(path: str) -> list[Event]:
    """A tally entry as one event at its first step, its count multiplied, and the number of
    steps it was seen in (`in_steps`, `in_osteps`)."""
    try:
        with open(path, encoding="utf-8") as handle:
            tally = json.load(handle)
    except (OSError, ValueError):
        return []
    events: list[Event] = [CountedEvent(kind=Kind.COUNTED, op=None, file=None, line=None,
                                        step=tally["from_step"], ostep=tally["from_ostep"],
                                        steps=tally["steps"], osteps=tally["osteps"])]
    for key, count, first_step, first_ostep, _, _, in_steps, in_osteps in tally["events"]:
        event = json.loads(key)
        event.update(step=first_step, ostep=first_ostep, count=event.get("count", 1) * count,
                     in_steps=in_steps, in_osteps=in_osteps)
        events.append(event)
    return events
