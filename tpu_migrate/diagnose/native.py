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
import json
import logging
import os
import re
import sys
import time

from tpu_migrate.diagnose import call_timing, guards, inheritance, placement, recording
from tpu_migrate.diagnose.events import Kind
from tpu_migrate.diagnose.modes import leave_dispatch_mode
from tpu_migrate.diagnose.read_places import ReadPlaces, program_files

TENSOR_DYNAMIC = ("nonzero", "masked_select", "unique", "argwhere")
GRAPH_BREAK_ID = re.compile(r"/gb/(gb\d+)\.html")
GRAPH_BREAK_HINT = re.compile(r"^\s*Hint: (.*)$", re.MULTILINE)
DYNAMIC_OPERATOR = re.compile(r"Operator `aten\.(?P<op>\w+?)(?:\.\w+)?`'s output shape depends")
LIMIT_FUNCTION = re.compile(r"'(?P<name>.*)' \((?P<file>.*):(?P<line>\d+)\)$")
DATALOADER_WORKER = "_worker_loop"

CALLED_HERE = "(called here)"  # the op of a recompile of code outside the user's files
UNKNOWN = placement.UNKNOWN

HOOKS: "NativeHooks | None" = None


def op_table() -> dict[str, str]:
    """Aten overload -> how TorchTPU 0.2.0 runs it ("device", "composite-explicit",
    "composite-implicit" or "none"); empty when the table is missing."""
    from tpu_migrate.rules import rules_dir

    try:
        with open(os.path.join(rules_dir(), "torchtpu-ops.json"), encoding="utf-8") as handle:
            return json.load(handle)["ops"]
    except (OSError, ValueError, KeyError):
        return {}


_PENDING_SKIPS: list = []  # wrappers made before torch._dynamo was imported


def _dynamo_skips(function):
    """Tell Dynamo never to compile this frame or what it calls (it would otherwise compile our
    wrapper when the eager remainder of a graph break calls it, and add graph breaks). Importing
    torch._dynamo costs about 1.5 s, so an eager program never pays it: the wrappers are marked
    when something else imports it, before anything can compile."""
    if "torch._dynamo" not in sys.modules:
        _PENDING_SKIPS.append(function)
        return function
    try:
        from torch._C._dynamo.eval_frame import set_code_exec_strategy
        from torch._dynamo.types import FrameAction, FrameExecStrategy

        set_code_exec_strategy(function.__code__, FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP))
    except (ImportError, AttributeError):
        pass
    return function


class NativeHooks:
    def __init__(self, recorder: recording.Recorder, warmup_steps: int, scan_sources: bool = True):
        import torch

        self.torch = torch
        self.recorder = recorder
        self.sample_steps = warmup_steps + 1  # op coverage: the warm-up and one steady step
        self.scan_sources = scan_sources  # at exit, for incompatible.py (not in-process)
        accelerator = _accelerator(torch)
        self.device_types = {accelerator} if accelerator else {"cpu"}
        self.cpu_stands_in = accelerator is None
        self.recorder.emit({"kind": Kind.BACKEND, "op": "native", "file": None, "line": None,
                            "device": accelerator or "cpu", "started": recorder.started})
        self.method_originals: dict[str, object] = {}  # Tensor.__dict__ entries (None: inherited)
        self.method_wrappers: dict[str, object] = {}
        self.function_originals: dict[str, object] = {}
        self.mode = None
        self.compile_started: float | None = None
        self.compiles = 0  # compiles Dynamo started: a timed call that saw one compiled
        self.timer = call_timing.CallTimer(recorder, torch, lambda: self.compiles)
        recorder.finishers.append(self.timer.report)
        self.table: dict[str, str] | None = None  # rules/torchtpu-ops.json, read when first needed
        self.verdicts: dict[object, str] = {}  # OpOverload -> its name if TorchTPU cannot run it
        self.optimizer_hook = None
        self.saved = []  # (owner, name, original) patched once, restored by uninstall
        self.places = ReadPlaces(self.device_types, self.cpu_stands_in)  # would a read wait for the TPU
        self.last_read: float | None = None  # perf_counter at the end of the last counted host read
        self.compiling = 0.0  # seconds Dynamo spent compiling so far
        self.compiling_at_read = 0.0  # ... at the end of the last counted host read

    # -- installation ----------------------------------------------------------------------
    def install(self) -> None:
        torch = self.torch
        for name in (*recording.SYNC_METHODS, *TENSOR_DYNAMIC, "__getitem__"):
            if getattr(torch.Tensor, name, None) is None:
                continue
            self.method_originals[name] = torch.Tensor.__dict__.get(name)
            kind = Kind.SYNC if name in recording.SYNC_METHODS else Kind.DYNAMIC
            self.method_wrappers[name] = self._method_wrapper(getattr(torch.Tensor, name), name, kind)
        # `t.to("cpu")`: a copy to the host, which waits for the device as `t.cpu()` does.
        self.method_originals["to"] = torch.Tensor.__dict__.get("to")
        self.method_wrappers["to"] = self._method_wrapper(torch.Tensor.to, "to", Kind.SYNC, only_if=self.places.host_copy)
        self._put_methods(wrapped=True)
        for name in TENSOR_DYNAMIC:
            original = getattr(torch, name, None)
            if original is not None:
                self.function_originals[name] = original
                setattr(torch, name, self._function_wrapper(original, name))
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.optimizer_hook = register_optimizer_step_post_hook(_dynamo_skips(self._optimizer_step))
        self._patch(torch, "compile", self._compile_wrapper(torch.compile))
        self._patch(torch, "save", self._save_wrapper(torch.save))
        import multiprocessing
        import multiprocessing.process

        self._patch(multiprocessing.process.BaseProcess, "start",
                    self._process_start_wrapper(multiprocessing.process.BaseProcess.start))
        self._start_op_coverage()
        from tpu_migrate.diagnose import library_compiles
        from tpu_migrate.diagnose.import_hooks import after_import

        after_import(library_compiles.GENERATION,
                     lambda: library_compiles.install_generate_hook(self.recorder, _compile_problems))
        if "torch._dynamo" in sys.modules:
            self.install_dynamo_hooks()
        if self.scan_sources and multiprocessing.parent_process() is None:  # once, by the main process
            from tpu_migrate.diagnose import incompatible

            atexit.register(incompatible.report_sources, self.recorder)  # runs before finish()
            atexit.register(self._report_dynamic_calls)

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
        and taken out at compile time would fail those guards and recompile."""
        for name, original in self.function_originals.items():
            setattr(self.torch, name, original)
            self.functions_dropped = True
        self.function_originals.clear()

    functions_dropped = False

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
                    self.recorder.emit({"kind": Kind.DYNAMIC, "op": name, "file": os.path.abspath(filename),
                                        "line": line, "count": 0, "static": True, "traced": True})

    def uninstall(self) -> None:
        """Back to the untraced program (auto backend: the program turned out to use torch_xla)."""
        self._put_methods(wrapped=False)
        self._drop_function_wrappers()
        self._stop_op_coverage()
        if self.optimizer_hook is not None:
            self.optimizer_hook.remove()
        from tpu_migrate.diagnose import incompatible

        atexit.unregister(incompatible.report_sources)
        atexit.unregister(self._report_dynamic_calls)
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

    def install_dynamo_hooks(self) -> None:
        """Dynamo's own signals: recompile reasons, graph breaks, the recompile limit, and the
        compile callbacks that take our wrappers out while it traces."""
        import torch._dynamo.convert_frame as convert_frame
        import torch._dynamo.symbolic_convert as symbolic_convert
        from torch._dynamo.callback import on_compile_end, on_compile_start

        pending, _PENDING_SKIPS[:] = list(_PENDING_SKIPS), []
        for function in pending:
            _dynamo_skips(function)

        if hasattr(convert_frame, "_compile"):
            self._patch(convert_frame, "_compile", self._inference_mode_wrapper(convert_frame._compile))
        if hasattr(convert_frame, "get_and_maybe_log_recompilation_reasons"):
            self._patch(convert_frame, "get_and_maybe_log_recompilation_reasons",
                        self._recompile_wrapper(convert_frame.get_and_maybe_log_recompilation_reasons))
        from torch._dynamo.output_graph import OutputGraph

        if hasattr(OutputGraph, "call_user_compiler"):
            self._patch(OutputGraph, "call_user_compiler", self._graph_ops_wrapper(OutputGraph.call_user_compiler))
        if hasattr(symbolic_convert, "log_graph_break"):
            self._patch(symbolic_convert, "log_graph_break",
                        self._graph_break_wrapper(symbolic_convert.log_graph_break))
        self.limit_handler = _RecompileLimitHandler(self)
        logging.getLogger(convert_frame.__name__).addHandler(self.limit_handler)
        # Dynamo runs these holding a plain lock; a lazily compiled backward runs them while the
        # compiled caller's frames are still being converted, so a Python call in them (our
        # methods, the optimizer-hook registration) would start a nested compile and deadlock.
        _dynamo_skips(self._compile_started)
        _dynamo_skips(self._compile_ended)
        on_compile_start(self._compile_started)
        on_compile_end(self._compile_ended)
        self.dynamo_hooked = True

    # -- compile windows ---------------------------------------------------------------------
    def _compile_started(self, args) -> None:
        self._stop_op_coverage()
        self._drop_function_wrappers()
        self._put_methods(wrapped=False)
        if self.optimizer_hook is not None:  # a compiled optimizer step would trace our hook
            self.optimizer_hook.remove()
            self.optimizer_hook = None
        self.recorder.emit({"kind": Kind.COMPILE, "op": str(getattr(args, "compile_id", "")),
                            "file": None, "line": None})
        self.compiles += 1
        self.compile_started = time.perf_counter()

    def _compile_ended(self, args) -> None:
        if self.compile_started is not None:  # Dynamo's compile time, for the cost of a recompile
            seconds = time.perf_counter() - self.compile_started
            self.compiling += seconds
            self.recorder.emit({"kind": Kind.COMPILE_TIME, "op": None, "file": None, "line": None,
                                "seconds": seconds})
            self.compile_started = None
        self._put_methods(wrapped=True)
        if self.optimizer_hook is None:
            from torch.optim.optimizer import register_optimizer_step_post_hook

            self.optimizer_hook = register_optimizer_step_post_hook(_dynamo_skips(self._optimizer_step))

    # -- op coverage -------------------------------------------------------------------------
    def _coverage_mode(self, found):
        """A dispatch mode that calls `found(op name, args)` for each op TorchTPU cannot run, or
        None without the op table."""
        if self.table is None:
            self.table = op_table()
        table = self.table
        if not table:
            return None
        from torch.utils._python_dispatch import TorchDispatchMode

        verdicts = self.verdicts  # OpOverload -> its name if TorchTPU cannot run it, else ""

        class OpCoverageMode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                key = verdicts.get(func)
                if key is None:
                    key = verdicts[func] = unsupported_on_tpu(func, table)
                if key:
                    found(key, args)
                return func(*args, **(kwargs or {}))

        return OpCoverageMode()

    def _start_op_coverage(self) -> None:
        def found(key, args):
            if self._on_device(args):
                self.recorder.at_user_line(Kind.UNSUPPORTED, key, 4)

        self.mode = self._coverage_mode(found)
        if self.mode is not None:
            self.mode.__enter__()

    def _graph_ops_wrapper(self, original):
        hooks = self

        @functools.wraps(original)
        def call_user_compiler(output_graph, gm, example_inputs, *args, **kwargs):
            try:
                hooks._check_graph(gm, example_inputs)
            except Exception:  # noqa: BLE001 - never break the compile we observe
                pass
            return original(output_graph, gm, example_inputs, *args, **kwargs)

        return _dynamo_skips(call_user_compiler)

    def _inference_mode_wrapper(self, original):
        """Dynamo's frame conversion, which sees the caller's torch.inference_mode() (the graph
        compiler runs with it switched off): compiled code under it crashes on TorchTPU
        (torchtpu-target-api.md: use torch.no_grad()). Placed at the user's call."""
        hooks = self

        @functools.wraps(original)
        def _compile(*args, **kwargs):
            try:
                import torch

                if torch.is_inference_mode_enabled():  # at the user's call: Dynamo's frames are no "via"
                    hooks.recorder.at_user_line(Kind.INCOMPATIBLE, INFERENCE_MODE, via=[])
            except Exception:  # noqa: BLE001 - never break the compile we observe
                pass
            return original(*args, **kwargs)

        return _compile

    def _check_graph(self, gm, example_inputs) -> None:
        """The ops of a graph Dynamo captured, at the aten level AOTAutograd hands a backend
        (forward and backward), run on fresh fake tensors so that nothing Dynamo compiles or
        holds changes. Each op is placed at the user's line the graph node came from."""
        import torch
        from torch._subclasses.fake_tensor import FakeTensorMode

        node = [None]
        call_site = recording.user_frame(3)
        found_ops: set = set()

        def found(key, args):
            file, line = _node_line(node[0]) or call_site
            if file is not None and (key, file, line) not in found_ops:
                found_ops.add((key, file, line))
                self.recorder.emit({"kind": Kind.UNSUPPORTED, "op": key, "file": file, "line": line,
                                    "reason": "compiled"})

        coverage = self._coverage_mode(found)
        if coverage is None:
            return
        fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
        inputs = [_fresh_fake(fake_mode, t) for t in example_inputs]

        class Runner(torch.fx.Interpreter):
            def run_node(self, n):
                node[0] = n
                return super().run_node(n)

        with fake_mode, coverage:
            outputs = Runner(gm).run(*inputs)
            node[0] = None  # backward ops: the line that called the compiled code
            leaves = [o for o in torch.utils._pytree.tree_leaves(outputs)
                      if isinstance(o, torch.Tensor) and o.requires_grad]
            wants = [i for i in inputs if isinstance(i, torch.Tensor) and i.requires_grad]
            if leaves and wants:
                torch.autograd.grad(leaves, wants, [torch.ones_like(o) for o in leaves], allow_unused=True)

    def _stop_op_coverage(self) -> None:
        leave_dispatch_mode(self.mode)
        self.mode = None

    def _on_device(self, args) -> bool:
        if self.cpu_stands_in:
            return True
        Tensor = self.torch.Tensor
        return any(isinstance(a, Tensor) and a.device.type in self.device_types for a in args)

    # -- wrappers ----------------------------------------------------------------------------
    def _method_wrapper(self, original, name, kind, only_if=None):
        """`only_if(args, kwargs)`: the calls that count (`to` only when it copies to the host)."""
        # The fast path runs on every host read in the program (the optimizer's own reads of
        # its step counters too): it is kept to attribute reads and one dict lookup.
        recorder = self.recorder
        local = recorder.local
        counts = self.places.counts
        label = {"__getitem__": "boolean mask indexing", "to": "to('cpu')"}.get(name, name)
        torch = self.torch
        masks_only = name == "__getitem__"
        copies, places = name == "to", self.places
        hooks, stands_in = self, self.cpu_stands_in

        @functools.wraps(original)
        def wrapper(self, *args, **kwargs):
            if getattr(local, "busy", False) or (masks_only and not (
                    isinstance(args[0], torch.Tensor) and args[0].dtype == torch.bool)) or (
                    only_if is not None and not only_if(args, kwargs)):
                return original(self, *args, **kwargs)
            where = counts(self, 2)
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
                recorder.at_user_line(kind, label, wait=waited, **extra)
                local.busy = False

        return _dynamo_skips(wrapper)

    def _function_wrapper(self, original, name):
        recorder = self.recorder
        counts = self.places.counts

        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            if args and not recorder.busy() and counts(args[0], 2) is not None:
                recorder.at_user_line(Kind.DYNAMIC, name)
            return original(*args, **kwargs)

        return _dynamo_skips(wrapper)

    def _optimizer_step(self, optimizer, args, kwargs) -> None:
        recorder = self.recorder
        # Written by hand: json.dumps of the event was most of this hook's cost per step.
        recorder.emit_line(f'{{"kind": "{Kind.OPT_STEP}", "op": null, "file": null, "line": null, '
                           f'"time": {time.perf_counter()!r}, "step": {recorder.steps}, '
                           f'"ostep": {recorder.optimizer_steps}}}')
        recorder.optimizer_steps += 1
        if recorder.optimizer_steps >= self.sample_steps:
            self._stop_op_coverage()
        recorder.flush_soon()  # what a killed program did up to its last steps survives

    def _save_wrapper(self, original):
        """torch.save of tensors on the device copies each to the host before it writes: a
        sync (issue 27, item 5). With the CPU standing in, the source says whether the saved
        object would be on the TPU (placement.py), as for a read at that line."""
        hooks = self

        @functools.wraps(original)
        def save(obj, *args, **kwargs):
            recorder = hooks.recorder
            if recorder is None or recorder.busy():
                return original(obj, *args, **kwargs)
            try:
                device = hooks._device_object(obj, sys._getframe(1))
            except Exception:  # noqa: BLE001 - never break the program's save
                device = False
            recorder.local.busy = True  # torch.save's own reads of the tensors are not the user's
            started = time.perf_counter()
            try:
                return original(obj, *args, **kwargs)
            finally:
                recorder.local.busy = False
                if device:
                    recorder.at_user_line(Kind.SYNC, "torch.save", wait=time.perf_counter() - started)

        return save

    def _device_object(self, obj, caller) -> bool:
        """Whether `obj` (a tensor, or a state dict, list or tuple of them) holds tensors on the
        device; with the CPU standing in, whether the user's line `caller` saves such."""
        if self.cpu_stands_in:
            return not recording.is_library(caller.f_code.co_filename) and \
                self.places.read_place(caller.f_code.co_filename, caller.f_lineno) == placement.DEVICE
        pending, seen = [obj], 0
        while pending and seen < 10_000:  # a state dict is flat; the bound keeps odd objects cheap
            item, seen = pending.pop(), seen + 1
            if isinstance(item, self.torch.Tensor):
                if item.device.type != "cpu":
                    return True
            elif isinstance(item, dict):
                pending.extend(item.values())
            elif isinstance(item, (list, tuple)):
                pending.extend(item)
        return False

    def _compile_wrapper(self, original):
        hooks = self

        @functools.wraps(original)
        def compile(*args, **kwargs):
            hooks._stop_op_coverage()  # a dispatch mode makes Dynamo skip compiling
            hooks._drop_function_wrappers()
            if not recording.is_library(sys._getframe(1).f_code.co_filename):  # not torch's own re-call
                for problem in _compile_problems(kwargs):
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

    dynamo_hooked = False

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

    def _recompile_wrapper(self, original):
        recorder = self.recorder

        @functools.wraps(original)
        def reasons_of(cache_entry, frame, *args, **kwargs):
            reasons = original(cache_entry, frame, *args, **kwargs)
            if kwargs.get("skip_logging") or (args and args[0]):
                return reasons
            code = frame.f_code
            file, line = os.path.abspath(code.co_filename), _def_line(code)
            name = _function_name(code.co_name)
            caller_file, caller_line = recording.user_frame(2)  # the user's line that called it
            if recording.is_library(code.co_filename):  # a compiled nn.Module: torch's own call code
                file, line = caller_file, caller_line
                name = CALLED_HERE
            if file is not None:
                reason = guard_reason(reasons[0]) if reasons else "unknown guard failure"
                origin = _shape_origin(reason, frame)
                if origin:
                    reason += f"; the new shape comes from {origin}"
                recorder.emit({"kind": Kind.RECOMPILE, "op": name, "file": file, "line": line,
                               "reason": reason,
                               "caller": f"{caller_file}:{caller_line}" if caller_file else None})
            return reasons

        return reasons_of

    def _graph_break_wrapper(self, original):
        recorder = self.recorder

        @functools.wraps(original)
        def log_graph_break(code_options, reason="", *args, **kwargs):
            try:
                user_stack = kwargs.get("user_stack") or (args[1] if len(args) > 1 else None)
                if user_stack is None:
                    import torch._guards

                    user_stack = torch._guards.TracingContext.extract_stack()
                frame = next((f for f in reversed(user_stack) if not recording.is_library(f.filename)), None)
                # A break inside library code (a compiled DDP module, say): the user's call of it.
                file, line = ((os.path.abspath(frame.filename), frame.lineno) if frame is not None
                              else recording.user_frame(2))
                if file is not None:
                    match = GRAPH_BREAK_ID.search(reason)
                    hint = " ".join(m.strip() for m in GRAPH_BREAK_HINT.findall(reason)) or None
                    recorder.emit({"kind": Kind.GRAPH_BREAK, "op": reason.strip().splitlines()[0],
                                   "file": file, "line": line, "gb": match[1].upper() if match else None,
                                   "hint": hint})
                    dynamic = DYNAMIC_OPERATOR.search(reason)
                    if dynamic:  # torch.nonzero(x) in compiled code: data-dependent on a TPU too
                        recorder.emit({"kind": Kind.DYNAMIC, "op": dynamic["op"], "file": file, "line": line,
                                       "traced": True})
            except Exception:  # noqa: BLE001 - never break the compile we observe
                pass
            return original(code_options, reason, *args, **kwargs)

        return log_graph_break


def _shape_origin(reason: str, frame) -> str | None:
    """`file:line` of the user's statement that made the input whose shape failed the guard: the
    assignment, in the calling function, of the variable passed in (or the call itself)."""
    guard = guards.shape_guard(reason)
    if guard is None:
        return None
    try:
        tensor = guard.find(frame.f_locals)  # `x`, `args[0]`, `kwargs['input_ids']`, ...
    except Exception:  # noqa: BLE001 - a frame Dynamo has not materialized, a short tuple
        return None
    caller = sys._getframe(2)
    while caller is not None and recording.is_library(caller.f_code.co_filename):
        caller = caller.f_back
    if caller is None or tensor is None:
        return None
    filename = os.path.abspath(caller.f_code.co_filename)
    names = [n for n, v in caller.f_locals.items() if v is tensor]
    parsed = placement.module(caller.f_code.co_filename)
    line = next((found for found in (parsed.assignment_line(n, caller.f_lineno) if parsed else None
                                     for n in names) if found), None)
    return f"{filename}:{line or caller.f_lineno}"


class _RecompileLimitHandler(logging.Handler):
    """Dynamo's "hit config.recompile_limit" warning: after it the function runs eagerly."""

    def __init__(self, hooks: NativeHooks):
        super().__init__(logging.WARNING)
        self.hooks = hooks

    def emit(self, record: logging.LogRecord) -> None:
        if not str(record.msg).startswith("torch._dynamo hit config.") or len(record.args or ()) < 4:
            return
        limit_type, limit, function, reason = record.args[:4]
        match = LIMIT_FUNCTION.search(str(function))
        if match is None:
            return
        file, line = os.path.abspath(match["file"]), _def_line_of(match["file"], int(match["line"]))
        if recording.is_library(file):
            file, line = recording.user_frame(2)
        self.hooks.recorder.emit({"kind": Kind.RECOMPILE_LIMIT, "op": f"{limit_type}={limit}",
                                  "file": file, "line": line, "reason": guard_reason(str(reason))})


GUARD = re.compile(r"^(?:\d+/\d+: )?(?P<guard>.*?)(?:\s{2,}#\s*(?P<source>.*?)\s{2,}#\s*(?P<where>\S+:\d+)(?: in \S+)?)?$")


def guard_reason(text: str) -> str:
    """Dynamo's first failed guard, readable: "tensor 'x' size mismatch at index 0. expected 16,
    actual 12", or "name == 'relu' (guarding `return ... if name == "relu" ...` at f.py:30)"."""
    first = text.strip().splitlines()[0] if text.strip() else text
    match = GUARD.match(first.strip())
    if match is None:
        return first.strip()
    guard = re.sub(r"\s+", " ", match["guard"]).strip()
    if match["source"]:
        return f"{guard} (guarding `{match['source'].strip()}` at {match['where']})"
    return guard


RESUME_FUNCTION = re.compile(r"^torch_dynamo_resume_in_(?P<name>\w+?)_at_(?P<line>\d+)$")


def _function_name(code_name: str) -> str:
    """Dynamo compiles the rest of a function after a graph break as a function of its own."""
    match = RESUME_FUNCTION.match(code_name)
    return f"{match['name']} after line {match['line']}" if match else code_name


def _def_line(code) -> int:
    return _def_line_of(code.co_filename, code.co_firstlineno)


def _def_line_of(filename: str, line: int) -> int:
    """A decorated function's code starts at its first decorator; point at its `def`."""
    import linecache

    for offset in range(50):
        text = linecache.getline(filename, line + offset).lstrip()
        if not text.startswith("@"):
            return line + offset if text.startswith(("def ", "async def ")) else line
    return line


def as_torchtpu_compiles(kwargs: dict) -> dict:
    """torch.compile's arguments as TorchTPU's torch.compile takes them: `dynamic=False` unless
    told otherwise (it refuses dynamic=True), and no `mode=` (refused). On the CPU, Dynamo's
    automatic dynamic shapes would otherwise compile a shape-generic graph after the second
    shape, and hide the recompile per shape (up to the recompile limit) a TPU goes through."""
    kwargs = {k: v for k, v in kwargs.items() if k != "mode"}
    if kwargs.get("dynamic") is not False:
        kwargs["dynamic"] = False
    return kwargs


# CPU-only kernels that a TPU never dispatches: the op it dispatches instead, when one is known.
TPU_INSTEAD = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": "aten::_scaled_dot_product_fused_attention_overrideable",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward":
        "aten::_scaled_dot_product_fused_attention_overrideable_backward",
}
CPU_ONLY = re.compile(r"^aten::(?:_?mkldnn_|_?mkl_|_?fbgemm_|.*_for_cpu(?:_|$|\.))")


def unsupported_on_tpu(func, table: dict[str, str]) -> str:
    """The name of the aten op a TPU would dispatch for `func` if TorchTPU cannot run it, else "".
    Ops run as the CPU dispatches them: where the CPU picks a kernel of its own (SDPA's
    flash-attention-for-CPU), the TPU picks its own, so the op checked is the TPU's, and a
    CPU-only kernel with no known TPU counterpart is never reported missing."""
    name, overload = func._schema.name, func._overloadname
    key = name if overload == "default" else f"{name}.{overload}"
    key = TPU_INSTEAD.get(key, key)
    if CPU_ONLY.match(key):
        return ""
    return key if table.get(key) == "none" else ""


def _node_line(node) -> tuple[str, int] | None:
    """The user's line an FX node of a Dynamo graph came from (its recorded stack trace)."""
    trace = node.meta.get("stack_trace") if node is not None else None
    for file, line in reversed(STACK_LINE.findall(trace or "")):
        if not recording.is_library(file):
            return os.path.abspath(file), int(line)
    return None


STACK_LINE = re.compile(r'File "([^"]+)", line (\d+)')


def _fresh_fake(fake_mode, value):
    """A fake tensor like Dynamo's example input, in our own fake mode (sizes as hinted)."""
    import torch

    if isinstance(value, torch.SymInt):
        return value.node.hint
    if not isinstance(value, torch.Tensor):
        return value
    size = [int(s.node.hint) if isinstance(s, torch.SymInt) else s for s in value.size()]
    stride = [int(s.node.hint) if isinstance(s, torch.SymInt) else s for s in value.stride()]
    with fake_mode:
        fresh = torch.empty_strided(size, stride, dtype=value.dtype, device=value.device)
    return fresh.requires_grad_(value.requires_grad) if value.dtype.is_floating_point else fresh


INFERENCE_MODE = "torch.compile under torch.inference_mode()"


def _compile_problems(kwargs: dict) -> list[str]:
    problems = []
    if kwargs.get("mode") is not None:
        problems.append(f"torch.compile(mode={kwargs['mode']!r})")
    if kwargs.get("dynamic") is True:
        problems.append("torch.compile(dynamic=True)")
    if kwargs.get("backend") == "inductor":
        problems.append("torch.compile(backend='inductor')")
    return problems


def _accelerator(torch) -> str | None:
    """The device type the program computes on: tpu/cuda/..., or None (the CPU stands in)."""
    try:
        current = torch.accelerator.current_accelerator(check_available=True)
    except (AttributeError, RuntimeError, TypeError):
        return None
    return current.type if current is not None else None


def install(recorder: recording.Recorder, warmup_steps: int | None = None, scan_sources: bool = True) -> None:
    global HOOKS
    if HOOKS is not None:
        return
    if warmup_steps is None:
        warmup = os.environ.get(recording.ENV_WARMUP, "2")  # in-process, or a traced process:
        warmup_steps = int(inheritance.setting(recording.ENV_WARMUP, warmup))
    HOOKS = NativeHooks(recorder, warmup_steps, scan_sources)
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
