"""Dynamo's own signals for `diagnose`'s native backend: recompile reasons (its guard
failures, with where the new shape came from), graph breaks (its log call and hint), the
recompile limit (its warning), torch.compile under inference mode, and the compile windows in
which every wrapper of native.py is taken out, so that Dynamo compiles exactly what it would
without us.

`DynamoHooks` is a part of native.NativeHooks; `dynamo_skips` marks the tool's wrapper frames so
that Dynamo never compiles them.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import sys
import time

from tpu_migrate.diagnose import guards, placement, recording
from tpu_migrate.diagnose.events import DynamoEvent, Kind, ReadEvent
from tpu_migrate.diagnose.locations import relative

GRAPH_BREAK_ID = re.compile(r"/gb/(gb\d+)\.html")
GRAPH_BREAK_HINT = re.compile(r"^\s*Hint: (.*)$", re.MULTILINE)
DYNAMIC_OPERATOR = re.compile(r"Operator `aten\.(?P<op>\w+?)(?:\.\w+)?`'s output shape depends")
LIMIT_FUNCTION = re.compile(r"'(?P<name>.*)' \((?P<file>.*):(?P<line>\d+)\)$")
CALLED_HERE = "(called here)"  # the op of a recompile of code outside the user's files


_PENDING_SKIPS: list = []  # wrappers made before torch._dynamo was imported


def dynamo_skips(function):
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


def _run_first(end_callback) -> None:
    """Dynamo runs its compile-end callbacks in order, and one that raises (the program's, or
    another tool's) skips those after it: ours runs first, so that a compile whose end failed
    still gets our wrappers, the optimizer hook and tensor_places' mode back (a lazily compiled
    backward would otherwise leave them out for the rest of the run)."""
    from torch._dynamo.callback import callback_handler

    ends = getattr(callback_handler, "end_callbacks", None)
    if isinstance(ends, list) and end_callback in ends:
        ends.remove(end_callback)
        ends.insert(0, end_callback)


class DynamoHooks:
    """The Dynamo part of native.NativeHooks."""

    dynamo_hooked = False

    def install_dynamo_hooks(self) -> None:
        """Dynamo's own signals: recompile reasons, graph breaks, the recompile limit, and the
        compile callbacks that take our wrappers out while it traces."""
        import torch._dynamo.convert_frame as convert_frame
        import torch._dynamo.symbolic_convert as symbolic_convert
        from torch._dynamo.callback import on_compile_end, on_compile_start

        pending, _PENDING_SKIPS[:] = list(_PENDING_SKIPS), []
        for function in pending:
            dynamo_skips(function)

        if hasattr(convert_frame, "_compile"):
            self._patch(convert_frame, "_compile", self._inference_mode_wrapper(convert_frame._compile))
        if hasattr(convert_frame, "get_and_maybe_log_recompilation_reasons"):
            self._patch(convert_frame, "get_and_maybe_log_recompilation_reasons",
                        self._recompile_wrapper(convert_frame.get_and_maybe_log_recompilation_reasons))
        from torch._dynamo.output_graph import OutputGraph

        if hasattr(OutputGraph, "call_user_compiler"):
            self._patch(OutputGraph, "call_user_compiler", self._graph_ops_wrapper(OutputGraph.call_user_compiler))
        translator = getattr(symbolic_convert, "InstructionTranslatorBase", None)
        if hasattr(symbolic_convert, "log_graph_break"):  # torch 2.9: a function of the module
            self._patch(symbolic_convert, "log_graph_break",
                        self._graph_break_wrapper(symbolic_convert.log_graph_break))
        elif hasattr(translator, "log_graph_break"):  # torch 2.11 and later: the translator's method
            self._patch(translator, "log_graph_break", self._graph_break_method_wrapper(translator.log_graph_break))
        self.limit_handler = _RecompileLimitHandler(self)
        logging.getLogger(convert_frame.__name__).addHandler(self.limit_handler)
        # Dynamo runs these holding a plain lock; a lazily compiled backward runs them while the
        # compiled caller's frames are still being converted, so a Python call in them (our
        # methods, the optimizer-hook registration) would start a nested compile and deadlock.
        dynamo_skips(self._compile_started)
        dynamo_skips(self._compile_ended)
        on_compile_start(self._compile_started)
        on_compile_end(self._compile_ended)
        _run_first(self._compile_ended)
        self.dynamo_hooked = True

    def _marks_aside(self, args) -> None:
        """tensor_places' mode (native.py, the CPU standing in) is off the stack inside each call of
        what torch.compile returned (call_timing.py). A backward Dynamo compiles lazily, in the
        program's `loss.backward()`, compiles a graph already traced: the mode steps aside for
        that compile only. Any other compile while it is on the stack (`torch._dynamo.optimize`,
        a frame compiled outside those calls) traces it: it goes for good (its marks stay)."""
        marks = self.places.tensor_places
        if marks is None or not marks.on_this_stack():
            return
        trigger = getattr(getattr(args, "callback_trigger", None), "name", None)
        if trigger == "LAZY_BACKWARD":
            self.marks_resume = marks.suspend()
        else:
            marks.uninstall()

    def in_standin(self, filename: str) -> bool:
        """Whether the file is the TorchTPU stand-in's (standin backend): Dynamo traces into its
        Python device guard and dispatch, which a TPU runs in C++; what breaks or recompiles
        there is the emulation's, not the program's."""
        reads = getattr(self, "device_reads", None)
        return reads is not None and filename.startswith(reads.standin_dir)

    def _compile_started(self, args) -> None:
        self._stop_op_coverage()
        self._drop_function_wrappers()
        self._marks_aside(args)
        self._put_methods(wrapped=False)
        if self.optimizer_hook is not None:  # a compiled optimizer step would trace our hook
            self.optimizer_hook.remove()
            self.optimizer_hook = None
        self.recorder.emit(DynamoEvent(kind=Kind.COMPILE, op=str(getattr(args, "compile_id", "")),
                                       file=None, line=None))
        self.compiles += 1
        self.compile_started = time.perf_counter()

    def _compile_ended(self, args) -> None:
        """Everything _compile_started took out goes back, whatever else fails here."""
        try:
            if self.compile_started is not None:  # Dynamo's compile time, for the cost of a recompile
                seconds = time.perf_counter() - self.compile_started
                self.compiling += seconds
                self.compile_started = None
                self.recorder.emit(DynamoEvent(kind=Kind.COMPILE_TIME, op=None, file=None, line=None,
                                               seconds=seconds))
        finally:
            self._put_methods(wrapped=True)
            if self.marks_resume:
                self.marks_resume = False
                self.places.tensor_places.resume()
            if self.optimizer_hook is None:
                from torch.optim.optimizer import register_optimizer_step_post_hook

                self.optimizer_hook = register_optimizer_step_post_hook(dynamo_skips(self._optimizer_step))


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


    def _recompile_wrapper(self, original):
        recorder, hooks_ = self.recorder, self

        @functools.wraps(original)
        def reasons_of(cache_entry, frame, *args, **kwargs):
            reasons = original(cache_entry, frame, *args, **kwargs)
            # skip_logging: the third argument in torch 2.9, the fourth (after the backend) later
            if kwargs.get("skip_logging") or any(arg is True for arg in args):
                return reasons
            code = frame.f_code
            if hooks_.in_standin(code.co_filename):  # the stand-in's own Python (its device guard)
                return reasons
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
                recorder.emit(DynamoEvent(kind=Kind.RECOMPILE, op=name, file=file, line=line,
                                          reason=reason,
                                          caller=f"{caller_file}:{caller_line}" if caller_file else None))
            return reasons

        return reasons_of

    def _graph_break_wrapper(self, original):
        """torch 2.9's log_graph_break(code_options, reason, exc_info, user_stack)."""
        hooks = self

        @functools.wraps(original)
        def log_graph_break(code_options, reason="", *args, **kwargs):
            user_stack = kwargs.get("user_stack") or (args[1] if len(args) > 1 else None)
            hooks._graph_break(reason, reason, user_stack)
            return original(code_options, reason, *args, **kwargs)

        return log_graph_break

    def _graph_break_method_wrapper(self, original):
        """torch 2.11 and later: InstructionTranslatorBase.log_graph_break(code_options, reason,
        exc), once per exception (`exc.logged`); the reason starts with what Dynamo was tracing,
        the exception says what broke."""
        hooks = self

        @functools.wraps(original)
        def log_graph_break(translator, code_options, reason="", exc=None, *args, **kwargs):
            if exc is not None and not getattr(exc, "logged", False):
                first = str(exc).strip() or reason
                hooks._graph_break(first, reason, getattr(exc, "real_stack", None))
            return original(translator, code_options, reason, exc, *args, **kwargs)

        return log_graph_break

    def _graph_break(self, message: str, reason: str, user_stack) -> None:
        """A graph break at the user's line: `message`'s first line, Dynamo's id and hint."""
        try:
            if user_stack is None:
                import torch._guards

                user_stack = torch._guards.TracingContext.extract_stack()
            if user_stack and self.in_standin(user_stack[-1].filename):
                return  # Dynamo traced into the stand-in's Python (a TPU's device code is C++)
            frame = next((f for f in reversed(user_stack) if not recording.is_library(f.filename)), None)
            # A break inside library code (a compiled DDP module, say): the user's call of it.
            file, line = ((os.path.abspath(frame.filename), frame.lineno) if frame is not None
                          else recording.user_frame(3))
            if file is None:
                return
            match = GRAPH_BREAK_ID.search(reason)
            hint = " ".join(m.strip() for m in GRAPH_BREAK_HINT.findall(reason)) or None
            self.recorder.emit(DynamoEvent(kind=Kind.GRAPH_BREAK, op=message.strip().splitlines()[0],
                                           file=file, line=line, gb=match[1].upper() if match else None,
                                           hint=hint))
            dynamic = DYNAMIC_OPERATOR.search(reason)
            # torch.nonzero(x) in compiled code: data-dependent on a TPU too (the stand-in reports
            # each eager call of it after the break itself).
            if dynamic and not getattr(self, "standin", False):
                self.recorder.emit(ReadEvent(kind=Kind.DYNAMIC, op=dynamic["op"], file=file, line=line,
                                             traced=True))
        except Exception:  # noqa: BLE001 - never break the compile we observe
            pass


def _shape_origin(reason: str, frame) -> str | None:
    """`file:line` of the user's statement that made the input whose shape failed the guard: the
    assignment, in the calling function, of the variable passed in (or the call itself), and the
    lines that assigned the sizes and tensors it was made from ("train.py:28 (fed by line 27)":
    `for length in ...` feeding `batch = torch.randint(0, 64, (2, length))`), relative to the
    working directory."""
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
    filename = relative(os.path.abspath(caller.f_code.co_filename))
    names = [n for n, v in caller.f_locals.items() if v is tensor]
    parsed = placement.module(caller.f_code.co_filename)
    line = next((found for found in (parsed.assignment_line(n, caller.f_lineno) if parsed else None
                                     for n in names) if found), None)
    if line is None or parsed is None:
        return f"{filename}:{line or caller.f_lineno}"
    fed = _feeding_lines(parsed, line, caller.f_locals, tensor)
    return f"{filename}:{line}" + (f" (fed by line{'s' if len(fed) > 1 else ''} {', '.join(map(str, fed))})"
                                   if fed else "")


def _feeding_lines(parsed, line: int, local_values: dict, tensor) -> list[int]:
    """The lines that assigned the sizes, sequences and tensors the statement at `line` reads (a
    module, a function or a device does not feed a shape)."""
    import torch

    fed = set()
    for name in parsed.names_read_at(line):
        value = local_values.get(name)
        if value is tensor or not isinstance(value, (int, float, list, tuple, range, torch.Tensor)) \
                or isinstance(value, bool):
            continue
        found = parsed.assignment_line(name, line)
        if found == line:  # `x = x[:n]`: the assignment before this one
            found = parsed.assignment_line(name, line - 1)
        if found is not None and found != line:
            fed.add(found)
    return sorted(fed)


class _RecompileLimitHandler(logging.Handler):
    """Dynamo's "hit config.recompile_limit" warning: after it the function runs eagerly."""

    def __init__(self, hooks: DynamoHooks):
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
        self.hooks.recorder.emit(DynamoEvent(kind=Kind.RECOMPILE_LIMIT, op=f"{limit_type}={limit}",
                                             file=file, line=line, reason=guard_reason(str(reason))))


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


INFERENCE_MODE = "torch.compile under torch.inference_mode()"


def compile_problems(kwargs: dict) -> list[str]:
    problems = []
    if kwargs.get("mode") is not None:
        problems.append(f"torch.compile(mode={kwargs['mode']!r})")
    if kwargs.get("dynamic") is True:
        problems.append("torch.compile(dynamic=True)")
    if kwargs.get("backend") == "inductor":
        problems.append("torch.compile(backend='inductor')")
    return problems
