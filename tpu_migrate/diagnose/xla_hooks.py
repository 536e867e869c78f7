"""The torch_xla backend of `diagnose`: wrappers of torch / torch_xla that record host reads,
data-dependent shapes, step boundaries and optimizer steps (events.py has the events).

Installed when the program imports torch_xla (tracer.py), never before: the program's own
environment set-up (PJRT_DEVICE, ...) must run first. Cost: a wrapper call per host read and
per step; the counters are read once per step.
"""

from __future__ import annotations

import functools
import os
import sys
import time

from tpu_migrate.diagnose import recording
from tpu_migrate.diagnose.events import FallbackEvent, Kind, StepEvent
from tpu_migrate.diagnose.recording import DYNAMIC_FUNCTIONS, SYNC_METHODS, log_size


def _sync_wrapper(original, name):
    @functools.wraps(original)
    def wrapper(self, *args, **kwargs):
        recorder = recording.RECORDER
        if recorder is None or recorder.busy() or getattr(self, "device", None) is None or self.device.type != "xla":
            return original(self, *args, **kwargs)
        return _host_read(recorder, name, self, original, self, *args, **kwargs)
    return wrapper


def _host_read(recorder, op, tensor, read, *args, **kwargs):
    """`read(*args, **kwargs)`, a host read of the xla tensor `tensor`, recorded as a sync named
    `op` once it returned, with how long the host waited for it; inside a step closure
    (_step_closure_wrapper) as the closure's read, which runs a graph of its own only when the
    tensor is more than the step's computed data."""
    recorder.local.busy = True
    closure = getattr(recorder.local, "closure", None)  # "sync" / "async" in a step closure
    runs_graph = closure is not None and _pending(tensor)
    started = time.perf_counter()
    try:
        return read(*args, **kwargs)
    finally:
        waited = time.perf_counter() - started
        if closure is None:
            recorder.at_user_line(Kind.SYNC, op, wait=waited)
        elif runs_graph:
            recorder.at_user_line(Kind.SYNC, op, closure=closure, graph=True, wait=waited)
        else:
            recorder.at_user_line(Kind.SYNC, op, closure=closure, wait=waited)
        recorder.local.busy = False


def _pending(tensor) -> bool:
    """Whether reading `tensor` runs a graph: its IR is more than the device data the step
    computed (a step closure that computes on the device before it reads)."""
    import torch_xla

    try:
        text = torch_xla._XLAC._get_xla_tensors_text([tensor])
    except Exception:  # noqa: BLE001 (an internal API: never break the program)
        return False
    return text.count(" = ") > 1 or "xla::device_data()" not in text


def _dynamic_wrapper(original, name):
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        recorder = recording.RECORDER
        first = args[0] if args else None
        if recorder is None or recorder.busy() or getattr(getattr(first, "device", None), "type", None) != "xla":
            return original(*args, **kwargs)
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:  # with how long the host waited to learn the shape
            recorder.at_user_line(Kind.DYNAMIC, name, wait=time.perf_counter() - started)
    return wrapper


def _getitem_wrapper(original):
    import torch

    @functools.wraps(original)
    def wrapper(self, index):
        recorder = recording.RECORDER
        if recorder is None or not isinstance(index, torch.Tensor) or recorder.busy():
            return original(self, index)
        if index.dtype == torch.bool:
            if self.device.type == "xla":
                recorder.at_user_line(Kind.DYNAMIC, "boolean mask indexing")
            return original(self, index)
        if index.dim() != 0 or index.device.type != "xla" or index.is_floating_point():
            return original(self, index)
        # table[t], t a 0-d integer xla tensor: torch reads t in C++ (aten::_local_scalar_dense)
        # to select with it, whatever device the table is on, and the host waits for the device.
        return _host_read(recorder, SCALAR_INDEXING, index, original, self, index)
    return wrapper


SCALAR_INDEXING = recording.scalar_indexing("device")


# torch.compile(backend="openxla") syncs while it compiles: not a step of the program.
_COMPILER_SYNC = os.sep + os.path.join("torch_xla", "_dynamo") + os.sep


def _step_wrapper(original, marker):
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        recorder = recording.RECORDER
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
            recorder = recording.RECORDER
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
        recorder = recording.RECORDER
        if (recorder is not None and type(other) in (int, float) and other == 0 and not recorder.busy()
                and getattr(self, "device", None) is not None and self.device.type == "xla"):
            recorder.at_user_line(Kind.ACCUMULATOR, "+=")
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
        recording.RECORDER.local.in_step_context = True
        try:
            return self.inner.__enter__()
        finally:
            recording.RECORDER.local.in_step_context = False

    def __exit__(self, *exc):
        recording.RECORDER.local.in_step_context = True
        try:
            result = self.inner.__exit__(*exc)
        finally:
            recording.RECORDER.local.in_step_context = False
        recording.RECORDER.step_boundary("torch_xla.step")
        return result


_HOOKED = False


def install_torch_xla_hooks() -> None:
    """Wrap torch / torch_xla once per process; the wrappers pass through while recording.RECORDER is None."""
    global _HOOKED
    import torch_xla.debug.metrics as met

    recording.RECORDER.metrics = met
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
        recorder = recording.RECORDER
        if recorder is None:
            return
        recorder.emit(StepEvent(kind=Kind.OPT_STEP, op=None, file=None, line=None,
                                debug_offset=log_size(recorder.debug_file),
                                fallback_offset=log_size(recorder.fallback_file),
                                compile_time=recorder.compile_seconds(), time=time.perf_counter()))
        size, known = optimizer_state_size(optimizer), state_sizes.get(id(optimizer), 0)
        if size > known:
            state_sizes[id(optimizer)] = size
            recorder.emit(FallbackEvent(kind=Kind.OPT_STATE, op=type(optimizer).__name__, file=None,
                                        line=None, count=size - known))
        recorder.optimizer_steps += 1
        recorder.flush()  # the step boundary of programs without an XLA step marker

    register_optimizer_step_post_hook(optimizer_step)
