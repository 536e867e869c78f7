"""The native backend of `diagnose`: eager and torch.compile programs on tpu, cuda or cpu.

Installed in the traced process right after `import torch` (tracer.install picks the backend).
It records, as events for the same JSON-lines file the torch_xla backend writes:

- `sync` / `dynamic`: host reads of device tensors and data-dependent shapes, from wrappers of the
  Tensor methods (`item`, `tolist`, `__bool__`, `print`, ..., `nonzero`, boolean-mask indexing).
  Without an accelerator the CPU stands in for the TPU; then only reads made directly by the
  user's code count, since the CPU tensors that torch's own code reads (the optimizer's step
  counter, say) stay on the host on a TPU too.
- `recompile` / `graph_break` / `recompile_limit`: Dynamo's own signals (its guard-failure
  reasons, its graph-break log call, its recompile-limit warning) with the user's line.
- `unsupported`: aten ops TorchTPU 0.2.0 cannot run (rules/torchtpu-ops.json), seen by a
  TorchDispatchMode during the warm-up steps and one step after them.
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

from tpu_migrate.diagnose import tracer

TENSOR_DYNAMIC = ("nonzero", "masked_select", "unique", "argwhere")
GRAPH_BREAK_ID = re.compile(r"/gb/(gb\d+)\.html")
LIMIT_FUNCTION = re.compile(r"'(?P<name>.*)' \((?P<file>.*):(?P<line>\d+)\)$")
DATALOADER_WORKER = "_worker_loop"

CALLED_HERE = "(called here)"  # the op of a recompile of code outside the user's files

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
    def __init__(self, recorder: tracer.Recorder, warmup_steps: int, scan_sources: bool = True):
        import torch

        self.torch = torch
        self.recorder = recorder
        self.sample_steps = warmup_steps + 1  # op coverage: the warm-up and one steady step
        self.scan_sources = scan_sources  # at exit, for incompatible.py (not in-process)
        accelerator = _accelerator(torch)
        self.device_types = {accelerator} if accelerator else {"cpu"}
        self.cpu_stands_in = accelerator is None
        self.recorder.emit({"kind": "backend", "op": "native", "file": None, "line": None,
                            "device": accelerator or "cpu"})
        self.method_originals: dict[str, object] = {}  # Tensor.__dict__ entries (None: inherited)
        self.method_wrappers: dict[str, object] = {}
        self.function_originals: dict[str, object] = {}
        self.mode = None
        self.optimizer_hook = None
        self.saved = []  # (owner, name, original) patched once, restored by uninstall
        self.library_code: dict[object, bool] = {}  # code object -> is it torch's or a library's

    # -- installation ----------------------------------------------------------------------
    def install(self) -> None:
        torch = self.torch
        for name in (*tracer.SYNC_METHODS, *TENSOR_DYNAMIC, "__getitem__"):
            if getattr(torch.Tensor, name, None) is None:
                continue
            self.method_originals[name] = torch.Tensor.__dict__.get(name)
            kind = "sync" if name in tracer.SYNC_METHODS else "dynamic"
            self.method_wrappers[name] = self._method_wrapper(getattr(torch.Tensor, name), name, kind)
        self._put_methods(wrapped=True)
        for name in TENSOR_DYNAMIC:
            original = getattr(torch, name, None)
            if original is not None:
                self.function_originals[name] = original
                setattr(torch, name, self._function_wrapper(original, name))
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.optimizer_hook = register_optimizer_step_post_hook(_dynamo_skips(self._optimizer_step))
        self._patch(torch, "compile", self._compile_wrapper(torch.compile))
        import multiprocessing
        import multiprocessing.process

        self._patch(multiprocessing.process.BaseProcess, "start",
                    self._process_start_wrapper(multiprocessing.process.BaseProcess.start))
        self._start_op_coverage()
        if "torch._dynamo" in sys.modules:
            self.install_dynamo_hooks()
        if self.scan_sources and multiprocessing.parent_process() is None:  # once, by the main process
            from tpu_migrate.diagnose import incompatible

            atexit.register(incompatible.report_sources, self.recorder)  # runs before finish()

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
        self.function_originals.clear()

    def uninstall(self) -> None:
        """Back to the untraced program (auto backend: the program turned out to use torch_xla)."""
        self._put_methods(wrapped=False)
        self._drop_function_wrappers()
        self._stop_op_coverage()
        if self.optimizer_hook is not None:
            self.optimizer_hook.remove()
        from tpu_migrate.diagnose import incompatible

        atexit.unregister(incompatible.report_sources)
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

        if hasattr(convert_frame, "get_and_maybe_log_recompilation_reasons"):
            self._patch(convert_frame, "get_and_maybe_log_recompilation_reasons",
                        self._recompile_wrapper(convert_frame.get_and_maybe_log_recompilation_reasons))
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
        self.recorder.emit({"kind": "compile", "op": str(getattr(args, "compile_id", "")),
                            "file": None, "line": None})

    def _compile_ended(self, args) -> None:
        self._put_methods(wrapped=True)
        if self.optimizer_hook is None:
            from torch.optim.optimizer import register_optimizer_step_post_hook

            self.optimizer_hook = register_optimizer_step_post_hook(_dynamo_skips(self._optimizer_step))

    # -- op coverage -------------------------------------------------------------------------
    def _start_op_coverage(self) -> None:
        table = op_table()
        if not table:
            return
        from torch.utils._python_dispatch import TorchDispatchMode

        hooks = self
        verdicts: dict[object, str] = {}  # OpOverload -> its name if TorchTPU cannot run it, else ""

        class OpCoverageMode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                key = verdicts.get(func)
                if key is None:
                    name, overload = func._schema.name, func._overloadname
                    key = name if overload == "default" else f"{name}.{overload}"
                    key = verdicts[func] = key if table.get(key) == "none" else ""
                unsupported = bool(key)
                if unsupported and hooks._on_device(args):
                    hooks.recorder.at_user_line("unsupported", key, 3)
                return func(*args, **(kwargs or {}))

        self.mode = OpCoverageMode()
        self.mode.__enter__()

    def _stop_op_coverage(self) -> None:
        if self.mode is None:
            return
        from torch.utils._python_dispatch import _get_current_dispatch_mode

        if _get_current_dispatch_mode() is self.mode:  # never pop someone else's mode
            self.mode.__exit__(None, None, None)
        self.mode = None

    def _on_device(self, args) -> bool:
        if self.cpu_stands_in:
            return True
        Tensor = self.torch.Tensor
        return any(isinstance(a, Tensor) and a.device.type in self.device_types for a in args)

    # -- wrappers ----------------------------------------------------------------------------
    def _counts(self, tensor, caller_depth: int) -> bool:
        """Is this read of `tensor` one that would wait for the TPU?"""
        device = getattr(tensor, "device", None)
        if device is None or device.type not in self.device_types:
            return False
        if self.cpu_stands_in:
            code = sys._getframe(caller_depth).f_code
            library = self.library_code.get(code)
            if library is None:  # once per calling function: this runs on every host read
                library = self.library_code[code] = tracer.is_library(code.co_filename)
            return not library
        return True

    def _method_wrapper(self, original, name, kind):
        # The fast path runs on every host read in the program (the optimizer's own reads of
        # its step counters too): it is kept to attribute reads and one dict lookup.
        recorder = self.recorder
        local = recorder.local
        counts = self._counts
        label = "boolean mask indexing" if name == "__getitem__" else name
        torch = self.torch
        masks_only = name == "__getitem__"

        @functools.wraps(original)
        def wrapper(self, *args, **kwargs):
            if getattr(local, "busy", False) or (masks_only and not (
                    isinstance(args[0], torch.Tensor) and args[0].dtype == torch.bool)):
                return original(self, *args, **kwargs)
            if not counts(self, 2):
                return original(self, *args, **kwargs)
            local.busy = True
            try:
                recorder.at_user_line(kind, label)
                return original(self, *args, **kwargs)
            finally:
                local.busy = False

        return _dynamo_skips(wrapper)

    def _function_wrapper(self, original, name):
        recorder = self.recorder
        counts = self._counts

        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            if args and not recorder.busy() and counts(args[0], 2):
                recorder.at_user_line("dynamic", name)
            return original(*args, **kwargs)

        return _dynamo_skips(wrapper)

    def _optimizer_step(self, optimizer, args, kwargs) -> None:
        recorder = self.recorder
        # Written by hand: json.dumps of the event was most of this hook's cost per step.
        recorder.emit_line(f'{{"kind": "opt_step", "op": null, "file": null, "line": null, '
                           f'"time": {time.perf_counter()!r}, "step": {recorder.steps}, '
                           f'"ostep": {recorder.optimizer_steps}}}')
        recorder.optimizer_steps += 1
        if recorder.optimizer_steps >= self.sample_steps:
            self._stop_op_coverage()
        recorder.flush_soon()  # what a killed program did up to its last steps survives

    def _compile_wrapper(self, original):
        hooks = self

        @functools.wraps(original)
        def compile(*args, **kwargs):
            hooks._stop_op_coverage()  # a dispatch mode makes Dynamo skip compiling
            hooks._drop_function_wrappers()
            if not tracer.is_library(sys._getframe(1).f_code.co_filename):  # not torch's own re-call
                for problem in _compile_problems(kwargs):
                    hooks.recorder.at_user_line("incompatible", problem)
            importlib.import_module("torch._dynamo")  # torch.compile imports it anyway; hook it first
            if not hooks.dynamo_hooked:
                hooks.install_dynamo_hooks()
            return original(*args, **kwargs)

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
                recorder.at_user_line("incompatible", "fork start method")
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
            if tracer.is_library(code.co_filename):  # a compiled nn.Module: torch's own call code
                file, line = tracer.user_frame(2)
                name = CALLED_HERE
            if file is not None:
                reason = guard_reason(reasons[0]) if reasons else "unknown guard failure"
                recorder.emit({"kind": "recompile", "op": name, "file": file, "line": line,
                               "reason": reason})
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
                frame = next((f for f in reversed(user_stack) if not tracer.is_library(f.filename)), None)
                # A break inside library code (a compiled DDP module, say): the user's call of it.
                file, line = ((os.path.abspath(frame.filename), frame.lineno) if frame is not None
                              else tracer.user_frame(2))
                if file is not None:
                    match = GRAPH_BREAK_ID.search(reason)
                    recorder.emit({"kind": "graph_break", "op": reason.strip().splitlines()[0],
                                   "file": file, "line": line, "gb": match[1].upper() if match else None})
            except Exception:  # noqa: BLE001 - never break the compile we observe
                pass
            return original(code_options, reason, *args, **kwargs)

        return log_graph_break


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
        if tracer.is_library(file):
            file, line = tracer.user_frame(2)
        self.hooks.recorder.emit({"kind": "recompile_limit", "op": f"{limit_type}={limit}",
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


def install(recorder: tracer.Recorder, warmup_steps: int | None = None, scan_sources: bool = True) -> None:
    global HOOKS
    if HOOKS is not None:
        return
    if warmup_steps is None:
        warmup_steps = int(os.environ.get(tracer.ENV_WARMUP, "2"))
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
