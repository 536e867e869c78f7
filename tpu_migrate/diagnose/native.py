"""The native backend of `diagnose`: eager and torch.compile programs on tpu, cuda or cpu.

Installed in the traced process right after `import torch` (tracer.install picks the backend).
It records, as events for the same JSON-lines file the torch_xla backend writes:

- `sync` / `dynamic`: host reads of device tensors and data-dependent shapes, from wrappers of the
  Tensor methods (`item`, `tolist`, `__bool__`, `print`, ..., `nonzero`, boolean-mask indexing).
  Without an accelerator the CPU stands in for the TPU; then only reads made directly by the
  user's code count, since the CPU tensors that torch's own code reads (the optimizer's step
  counter, say) stay on the host on a TPU too, and only of tensors the source puts on the
  device (placement.py). Once the program compiles, torch.nonzero & co. are found in its source.
- `recompile` / `graph_break` / `recompile_limit`: Dynamo's own signals (its guard-failure
  reasons, its graph-break log call and hint, its recompile-limit warning) with the user's line.
  With the CPU standing in, torch.compile is called with TorchTPU's arguments (dynamic=False), so
  Dynamo recompiles per shape as it would on a TPU.
- `unsupported`: aten ops TorchTPU 0.2.0 cannot run (rules/torchtpu-ops.json), as a TPU would
  dispatch them, seen by a TorchDispatchMode during the warm-up steps and one step after them,
  and in each graph Dynamo captures (run once more on fake tensors of our own).
- `incompatible`: calls that run here but raise on TorchTPU (torch.compile mode=/dynamic=True/
  backend="inductor", fork-started processes; source-only ones are found by incompatible.py).

Dynamo must compile exactly what it would without us: while it compiles (its on_compile_start/
end callbacks) every wrapper is taken out, our wrapper frames are marked "skip" so Dynamo never
compiles them, the torch.* function wrappers (which Dynamo would guard on) and the dispatch mode
(which makes Dynamo skip compiling) are dropped for good once the program compiles anything.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import logging
import os
import sys
import time

from tpu_migrate.diagnose import call_timing, inheritance, placement, recording, standin_reads
from tpu_migrate.diagnose.dynamo_hooks import DynamoHooks, as_torchtpu_compiles, compile_problems, dynamo_skips
from tpu_migrate.diagnose.events import BackendEvent, Event, Kind, ReadEvent
from tpu_migrate.diagnose.op_coverage import OpCoverage
from tpu_migrate.diagnose.read_places import ReadPlaces, program_files

TENSOR_DYNAMIC = ("nonzero", "masked_select", "unique", "argwhere")
DATALOADER_WORKER = "_worker_loop"
UNKNOWN = placement.UNKNOWN

HOOKS: "NativeHooks | None" = None


class NativeHooks(OpCoverage, DynamoHooks):
    """The eager wrappers (host reads, data-dependent ops, torch.save, torch.compile's
    arguments, fork starts), with op coverage (op_coverage.py) and Dynamo's signals
    (dynamo_hooks.py) as parts."""

    def __init__(self, recorder: recording.Recorder, warmup_steps: int, scan_sources: bool = True,
                 standin: bool = False):
        import torch

        self.torch = torch
        self.recorder = recorder
        self.sample_steps = warmup_steps + 1  # op coverage: the warm-up and one steady step
        self.scan_sources = scan_sources  # at exit, for incompatible.py (not in-process)
        # On the TorchTPU stand-in the device reports every transfer to the host itself
        # (standin_reads.py): no placement is guessed.
        self.standin = standin
        accelerator = "tpu" if standin else _accelerator(torch)
        self.device_types = {accelerator} if accelerator else {"cpu"}
        self.cpu_stands_in = accelerator is None
        # table[t] with a device scalar t, named as the stand-in names it (the CPU stands in for a tpu)
        self.scalar_indexing = recording.scalar_indexing(accelerator or "tpu")
        self.recorder.emit(BackendEvent(kind=Kind.BACKEND, op="standin" if standin else "native", file=None,
                                        line=None, device=accelerator or "cpu", started=recorder.started))
        self.method_originals: dict[str, object] = {}  # Tensor.__dict__ entries (None: inherited)
        self.method_wrappers: dict[str, object] = {}
        self.function_originals: dict[str, object] = {}
        self.mode = None
        self.compile_started: float | None = None
        self.compiles = 0  # compiles Dynamo started: a timed call that saw one compiled
        self.timer = call_timing.CallTimer(recorder, torch, lambda: self.compiles)
        self.marks_resume = False  # tensor_places stepped aside for a lazily compiled backward
        recorder.finishers.append(self.timer.report)
        self.table: dict[str, str] | None = None  # rules/torchtpu-ops.json, read when first needed
        self.verdicts: dict[object, str] = {}  # OpOverload -> its name if TorchTPU cannot run it
        self.optimizer_hook = None
        self.saved = []  # (owner, name, original) patched once, restored by uninstall
        self.places = ReadPlaces(self.device_types, self.cpu_stands_in)  # would a read wait for the TPU
        if self.cpu_stands_in and not standin and _places_anything_yet():  # which CPU tensors stand for host ones
            from tpu_migrate.diagnose.tensor_places import TensorPlaces

            self.places.tensor_places = self.timer.aside = TensorPlaces(torch, self.places)
            self.places.program_places = True  # what places_anything() will find: said once
        self.last_read: float | None = None  # perf_counter at the end of the last counted host read
        self.compiling = 0.0  # seconds Dynamo spent compiling so far
        self.compiling_at_read = 0.0  # ... at the end of the last counted host read

    # -- installation ----------------------------------------------------------------------
    def install(self) -> None:
        torch = self.torch
        if self.standin:
            # The stand-in reports each transfer and data-dependent shape (standin_reads.py); the
            # method wrappers only name the call that made a transfer (`item`, `cpu`, ...).
            self.device_reads = standin_reads.DeviceReads(self)
            names = recording.SYNC_METHODS
        else:
            names = (*recording.SYNC_METHODS, *TENSOR_DYNAMIC, "__getitem__")
        for name in names:
            if getattr(torch.Tensor, name, None) is None:
                continue
            self.method_originals[name] = torch.Tensor.__dict__.get(name)
            kind = Kind.SYNC if name in recording.SYNC_METHODS else Kind.DYNAMIC
            self.method_wrappers[name] = self._method_wrapper(getattr(torch.Tensor, name), name, kind)
        # `t.to("cpu")`: a copy to the host, which waits for the device as `t.cpu()` does.
        self.method_originals["to"] = torch.Tensor.__dict__.get("to")
        self.method_wrappers["to"] = self._method_wrapper(torch.Tensor.to, "to", Kind.SYNC, only_if=self.places.host_copy)
        self._put_methods(wrapped=True)
        for name in () if self.standin else TENSOR_DYNAMIC:
            original = getattr(torch, name, None)
            if original is not None:
                self.function_originals[name] = original
                setattr(torch, name, self._function_wrapper(original, name))
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.optimizer_hook = register_optimizer_step_post_hook(dynamo_skips(self._optimizer_step))
        self._patch(torch, "compile", self._compile_wrapper(torch.compile))
        self._patch(torch, "save", self._save_wrapper(torch.save))
        import multiprocessing
        import multiprocessing.process

        self._patch(multiprocessing.process.BaseProcess, "start",
                    self._process_start_wrapper(multiprocessing.process.BaseProcess.start))
        self._start_op_coverage()
        if self.places.tensor_places is not None:
            self.places.tensor_places.install()
        from tpu_migrate.diagnose import library_compiles
        from tpu_migrate.diagnose.import_hooks import after_import

        after_import(library_compiles.GENERATION,
                     lambda: library_compiles.install_generate_hook(self.recorder, compile_problems))
        if "torch._dynamo" in sys.modules:
            self.install_dynamo_hooks()
        if self.scan_sources and multiprocessing.parent_process() is None:  # once, by the main process
            from tpu_migrate.diagnose import incompatible

            atexit.register(incompatible.report_sources, self.recorder)  # runs before finish()
            atexit.register(self._report_dynamic_calls)
            if self.cpu_stands_in and not self.standin:
                atexit.register(self._report_host_only)

    def _patch(self, owner, name, replacement) -> None:
        self.saved.append((owner, name, owner.__dict__.get(name)))
        setattr(owner, name, replacement)

    def _put_methods(self, wrapped: bool) -> None:
        Tensor = self.torch.Tensor
        for name, original in self.method_originals.items():
            if wrapped:
                setattr(Tensor, name, self.method_wrappers[name])
            elif original is None:  # inherited from TensorBase: delete, never shadow it
                if name in Tensor.__dict__:
                    delattr(Tensor, name)
            else:
                setattr(Tensor, name, original)

    def _drop_function_wrappers(self) -> None:
        """Dynamo guards on the identity of torch.* functions: a wrapper installed at run time
        and taken out at compile time would fail those guards and recompile. (tensor_places'
        mode steps aside for each compiled call instead: see _compile_started.)"""
        for name, original in self.function_originals.items():
            setattr(self.torch, name, original)
            self.functions_dropped = True
        self.function_originals.clear()

    functions_dropped = False
    device_reads: "standin_reads.DeviceReads | None" = None

    def _report_dynamic_calls(self) -> None:
        """At exit, in a program whose torch.nonzero & co. wrappers went when it compiled: the
        calls of those functions in its source (uncounted: count 0), unless they read host
        tensors. Inside compiled code Dynamo's graph break reports them too."""
        if not self.functions_dropped:
            return
        from tpu_migrate.diagnose import incompatible

        files = program_files(incompatible.user_sources())
        places = placement.program_places(files)
        for filename in files:
            parsed = placement.module(filename)
            for line, name in parsed.calls_of(TENSOR_DYNAMIC) if parsed else ():
                if placement.read_kind(filename, line, places) != placement.HOST:
                    self.recorder.emit(ReadEvent(kind=Kind.DYNAMIC, op=name, file=os.path.abspath(filename),
                                                 line=line, count=0, static=True, traced=True))

    def _report_host_only(self) -> None:
        """At exit: a program whose every place is the host (`device = torch.device("cpu")`) had
        each of its tensors judged a host tensor; the report must say so, not "no host sync"."""
        from tpu_migrate.diagnose import incompatible

        if placement.host_only(program_files(incompatible.user_sources())):
            self.recorder.emit(Event(kind=Kind.HOST_ONLY, op="cpu", file=None, line=None))

    def uninstall(self) -> None:
        """Back to the untraced program (auto backend: the program turned out to use torch_xla)."""
        self._put_methods(wrapped=False)
        self._drop_function_wrappers()
        if self.places.tensor_places is not None:
            self.places.tensor_places.uninstall()
        self._stop_op_coverage()
        if self.optimizer_hook is not None:
            self.optimizer_hook.remove()
        from tpu_migrate.diagnose import incompatible

        atexit.unregister(incompatible.report_sources)
        atexit.unregister(self._report_dynamic_calls)
        atexit.unregister(self._report_host_only)
        if self.device_reads is not None:
            self.device_reads.uninstall()
        if self.dynamo_hooked:
            from torch._dynamo.callback import callback_handler

            callback_handler.remove_start_callback(self._compile_started)
            callback_handler.remove_end_callback(self._compile_ended)
            logging.getLogger("torch._dynamo.convert_frame").removeHandler(self.limit_handler)
        for owner, name, original in reversed(self.saved):
            if original is None:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        self.saved.clear()

    # -- wrappers ----------------------------------------------------------------------------
    def _method_wrapper(self, original, name, kind, only_if=None):
        """`only_if(args, kwargs)`: the calls that count (`to` only when it copies to the host)."""
        if self.standin:
            return self.device_reads.method_wrapper(original, name)
        # The fast path runs on every host read in the program (the optimizer's own reads of
        # its step counters too): it is kept to attribute reads and one dict lookup.
        recorder = self.recorder
        local = recorder.local
        counts = self.places.counts
        label = {"__getitem__": "boolean mask indexing", "to": "to('cpu')"}.get(name, name)
        torch = self.torch
        indexing = name == "__getitem__"
        copies, places = name == "to", self.places
        hooks, stands_in = self, self.cpu_stands_in
        scalar_indexing = self.scalar_indexing

        @functools.wraps(original)
        def wrapper(self, *args, **kwargs):
            if getattr(local, "busy", False) or (only_if is not None and not only_if(args, kwargs)):
                return original(self, *args, **kwargs)
            op, found = label, kind
            if not indexing:
                where = counts(self, 2)
            elif not isinstance(args[0], torch.Tensor):
                return original(self, *args, **kwargs)
            elif args[0].dtype == torch.bool:
                where = counts(self, 2)
            elif args[0].dim() == 0:
                # table[t]: torch reads the scalar t in C++, as t.item() does, and counts as that would
                where, op, found = places.scalar_index(args[0], 2), scalar_indexing, Kind.SYNC
            else:
                return original(self, *args, **kwargs)
            if where is None:
                return original(self, *args, **kwargs)
            local.busy = True
            started = time.perf_counter()
            # With the CPU standing in, the work since the last read is what a TPU would have
            # queued and this read would wait for (the first read has no such mark).
            queued = None if hooks.last_read is None or not stands_in else (
                started - hooks.last_read - (hooks.compiling - hooks.compiling_at_read))  # not Dynamo's time
            try:
                result = original(self, *args, **kwargs)
                if copies:  # a copy to the host: later reads of it (or of views of it) wait for nothing
                    places.remember_host_copy(result)
                return result
            finally:  # with how long the host waited (on a real accelerator; costs.py knows)
                hooks.last_read, hooks.compiling_at_read = time.perf_counter(), hooks.compiling
                waited = hooks.last_read - started
                extra = {"placement": UNKNOWN} if where == UNKNOWN else {}
                if queued is not None:
                    extra["queued"] = queued
                recorder.at_user_line(found, op, wait=waited, **extra)
                local.busy = False

        return dynamo_skips(wrapper)

    def _function_wrapper(self, original, name):
        recorder = self.recorder
        counts = self.places.counts

        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            if args and not recorder.busy() and counts(args[0], 2) is not None:
                recorder.at_user_line(Kind.DYNAMIC, name)
            return original(*args, **kwargs)

        return dynamo_skips(wrapper)

    def _optimizer_step(self, optimizer, args, kwargs) -> None:
        recorder = self.recorder
        # Written by hand: json.dumps of the event was most of this hook's cost per step.
        recorder.emit_line(f'{{"kind": "{Kind.OPT_STEP}", "op": null, "file": null, "line": null, '
                           f'"time": {time.perf_counter()!r}, "step": {recorder.steps}, '
                           f'"ostep": {recorder.optimizer_steps}}}')
        recorder.optimizer_steps += 1
        if recorder.optimizer_steps >= self.sample_steps:
            self._stop_op_coverage()
            if self.places.tensor_places is not None:  # its cost per torch call ends with the sample
                self.places.tensor_places.uninstall()
        recorder.flush_soon()  # what a killed program did up to its last steps survives

    def _save_wrapper(self, original):
        """torch.save of tensors on the device copies each to the host before it writes: a
        sync (issue 27, item 5). With the CPU standing in, the source says whether the saved
        object would be on the TPU (placement.py), as for a read at that line."""
        hooks = self

        if self.standin:
            return self.device_reads.save_wrapper(original)

        @functools.wraps(original)
        def save(obj, *args, **kwargs):
            recorder = hooks.recorder
            if recorder is None or recorder.busy():
                return original(obj, *args, **kwargs)
            try:
                where = hooks._device_object(obj, sys._getframe(1))
            except Exception:  # noqa: BLE001 - never break the program's save
                where = None
            recorder.local.busy = True  # torch.save's own reads of the tensors are not the user's
            started = time.perf_counter()
            try:
                return original(obj, *args, **kwargs)
            finally:
                recorder.local.busy = False
                if where is not None:
                    extra = {"placement": UNKNOWN} if where == UNKNOWN else {}
                    recorder.at_user_line(Kind.SYNC, "torch.save", wait=time.perf_counter() - started, **extra)

        return save

    def _device_object(self, obj, caller) -> str | None:
        """Whether `obj` (a tensor, or a state dict, list or tuple of them) holds tensors on the
        device: placement.DEVICE, UNKNOWN (counted, with a note) or None. With the CPU standing
        in, the user's line `caller` says, as for a read there; where the source cannot place
        it (a model moved by `self.model.to(device)`), the save counts unless every tensor it
        holds is a host tensor (tensor_places.py)."""
        tensors = _tensors_in(self.torch, obj)
        if self.cpu_stands_in:
            if recording.is_library(caller.f_code.co_filename):
                return None
            where = self.places.read_place(caller.f_code.co_filename, caller.f_lineno)
            if where == placement.UNKNOWN and self.places.tensor_places is not None:
                return UNKNOWN if any(not self.places.is_host(t) for t in tensors) else None
            return where if where == placement.DEVICE else None
        return placement.DEVICE if any(t.device.type != "cpu" for t in tensors) else None

    def _compile_wrapper(self, original):
        hooks = self

        @functools.wraps(original)
        def compile(*args, **kwargs):
            hooks._stop_op_coverage()  # a dispatch mode makes Dynamo skip compiling
            hooks._drop_function_wrappers()
            if not recording.is_library(sys._getframe(1).f_code.co_filename):  # not torch's own re-call
                for problem in compile_problems(kwargs):
                    hooks.recorder.at_user_line(Kind.INCOMPATIBLE, problem)
                if hooks.cpu_stands_in:
                    kwargs = as_torchtpu_compiles(kwargs)
            importlib.import_module("torch._dynamo")  # torch.compile imports it anyway; hook it first
            if not hooks.dynamo_hooked:
                hooks.install_dynamo_hooks()
            compiled = original(*args, **kwargs)
            model = args[0] if args else kwargs.get("model")
            # `torch.compile(mode=...)` returns a decorator, which calls torch.compile(fn) again.
            return compiled if model is None else hooks.timer.wrap(compiled, model)

        return compile

    def _process_start_wrapper(self, original):
        recorder = self.recorder

        @functools.wraps(original)
        def start(process):
            import multiprocessing

            method = getattr(type(process), "_start_method", None) or multiprocessing.get_start_method()
            target = getattr(getattr(process, "_target", None), "__name__", "")
            if method == "fork" and target != DATALOADER_WORKER:  # DataLoader workers stay on the host
                recorder.at_user_line(Kind.INCOMPATIBLE, "fork start method")
            return original(process)

        return start




def _tensors_in(torch, obj) -> list:
    """The tensors of `obj`: a tensor, or a state dict, list or tuple of them."""
    tensors, pending, seen = [], [obj], 0
    while pending and seen < 10_000:  # a state dict is flat; the bound keeps odd objects cheap
        item, seen = pending.pop(), seen + 1
        if isinstance(item, torch.Tensor):
            tensors.append(item)
        elif isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, (list, tuple)):
            pending.extend(item)
    return tensors


def _places_anything_yet() -> bool:
    """Whether the program's files loaded so far (its script, when torch is imported) place a
    tensor anywhere. One that places none runs wholly on the device: every tensor is a device
    tensor, and following them (tensor_places.py, a cost per torch call) would tell nothing."""
    from tpu_migrate.diagnose import incompatible

    return placement.program_places(program_files(incompatible.user_sources()))


def _accelerator(torch) -> str | None:
    """The device type the program computes on: tpu/cuda/..., or None (the CPU stands in)."""
    try:
        current = torch.accelerator.current_accelerator(check_available=True)
    except (AttributeError, RuntimeError, TypeError):
        return None
    return current.type if current is not None else None


def install(recorder: recording.Recorder, warmup_steps: int | None = None, scan_sources: bool = True,
            standin: bool = False) -> None:
    """`standin`: the program runs on the TorchTPU stand-in (torch_tpu loaded), whose device
    reports its transfers to the host exactly (standin_reads.py)."""
    global HOOKS
    if HOOKS is not None:
        return
    if warmup_steps is None:
        warmup = os.environ.get(recording.ENV_WARMUP, "2")  # in-process, or a traced process:
        warmup_steps = int(inheritance.setting(recording.ENV_WARMUP, warmup))
    HOOKS = NativeHooks(recorder, warmup_steps, scan_sources, standin)
    HOOKS.install()


def uninstall() -> None:
    global HOOKS
    if HOOKS is not None:
        HOOKS.uninstall()
        HOOKS = None


def dynamo_imported() -> None:
    """torch._dynamo finished importing (the program is about to compile)."""
    if HOOKS is not None and not HOOKS.dynamo_hooked:
        HOOKS.install_dynamo_hooks()
