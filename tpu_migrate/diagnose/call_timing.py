"""Times every call of what `torch.compile` returned (native backend, in the traced process).

A compiled function's first call at a new input shape compiles (Dynamo traces, the backend
compiles) and then runs; a later call at a shape already seen runs what was compiled. The two
are different measurements: averaged together, one 40 s compile hides in a thousand 4 ms
calls. So each call is filed under its call site (the user's line that called it, through any
library: a `generate` that calls a compiled forward is the `generate` line) and its input
signature (the shapes and dtypes of its tensor arguments), and the process reports, per site
and signature, the first call apart from the later ones. A program without optimizer steps
(generation, a pipeline, evaluation) is timed too: these figures need no step.

The time is the host's time in the call: with the CPU standing in it is the whole computation;
on an accelerator the call may return before the device finishes (the next host read waits).
"""

from __future__ import annotations

import functools
import time

from tpu_migrate.diagnose import recording
from tpu_migrate.diagnose.events import CallTimeEvent, Kind

MAX_TENSORS = 32  # per call: a signature names at most this many input tensors
MAX_DEPTH = 3  # through nested lists, tuples and dicts


class CallTimer:
    def __init__(self, recorder: recording.Recorder, torch, compiles) -> None:
        self.recorder = recorder
        self.torch = torch
        self.compiles = compiles  # () -> how many compiles Dynamo started so far
        # (file, line, name, signature) -> [first seconds, first compiled, later calls, later
        # seconds, later fastest, later calls that compiled]
        self.stats: dict[tuple, list] = {}
        # tensor_places.TensorPlaces (the CPU standing in), off the mode stack inside each call:
        # Dynamo would trace the mode, and guard on it.
        self.aside = None

    def wrap(self, compiled, model):
        """What torch.compile returned for `model`, with its calls timed (a module's forward, or
        the function itself)."""
        name = getattr(model, "__qualname__", None) or type(model).__name__
        if isinstance(compiled, self.torch.nn.Module):
            forward = compiled.__dict__.get("forward")
            if forward is not None:  # OptimizedModule keeps the compiled forward on the instance
                compiled.forward = self._timed(forward, name)
            return compiled
        if callable(compiled):
            return self._timed(compiled, name)
        return compiled

    def _timed(self, function, name):
        timer = self

        @functools.wraps(function)
        def timed(*args, **kwargs):
            if timer.torch.compiler.is_compiling():  # traced inside another compiled region
                return function(*args, **kwargs)
            file, line = recording.user_frame()
            signature = timer.signature(args, kwargs)
            compiles = timer.compiles()
            marks = timer.aside
            aside = marks is not None and marks.suspend()
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                if aside:
                    marks.resume()
                timer.record((file, line, name, signature), time.perf_counter() - started,
                             timer.compiles() > compiles)

        timed._tpu_migrate_timed = True
        return timed

    def record(self, key: tuple, seconds: float, compiled: bool) -> None:
        stats = self.stats.get(key)
        if stats is None:
            self.stats[key] = [seconds, compiled, 0, 0.0, None, 0]
            return
        stats[2] += 1
        stats[3] += seconds
        stats[4] = seconds if stats[4] is None else min(stats[4], seconds)
        stats[5] += compiled

    def signature(self, args, kwargs) -> str:
        """"arg0 (16, 12) float32, attention_mask (1, 7) int64": the tensors a call got."""
        parts: list[str] = []
        Tensor, Module = self.torch.Tensor, self.torch.nn.Module

        def visit(value, name: str, depth: int) -> None:
            if len(parts) >= MAX_TENSORS:
                return
            if isinstance(value, Tensor):
                parts.append(f"{name} {tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}")
            elif depth < MAX_DEPTH and isinstance(value, (list, tuple)):
                for index, item in enumerate(value):
                    visit(item, f"{name}[{index}]", depth + 1)
            elif depth < MAX_DEPTH and isinstance(value, dict):
                for key, item in value.items():
                    visit(item, f"{name}[{key!r}]", depth + 1)
            elif depth < MAX_DEPTH and hasattr(value, "__dict__") and not isinstance(value, (Module, type)):
                # An object holding tensors (Transformers' cache: past_key_values.layers[0].keys),
                # whose shapes Dynamo guards on; never a module (its parameters do not change).
                for key, item in vars(value).items():
                    if isinstance(item, (Tensor, list, tuple, dict)) or hasattr(item, "__dict__"):
                        visit(item, f"{name}.{key}", depth + 1)

        for index, value in enumerate(args):
            visit(value, f"arg{index}", 0)
        for key, value in kwargs.items():
            visit(value, key, 0)
        return ", ".join(parts) or "no tensors"

    def report(self) -> None:
        """One event per call site and signature (at the process's end), in the order of their
        first calls (costs.py tells the warm-up compile from the recompiles by it)."""
        for (file, line, name, signature), (first, compiled, later, total, fastest, recompiled) in self.stats.items():
            event: CallTimeEvent = {
                "kind": Kind.CALL_TIME, "op": name, "file": file, "line": line, "inputs": signature,
                "first_seconds": first, "first_compiled": compiled, "later_calls": later,
                "later_seconds": total, "later_min_seconds": fastest, "later_compiled": recompiled}
            self.recorder.emit(event)
        self.stats.clear()
