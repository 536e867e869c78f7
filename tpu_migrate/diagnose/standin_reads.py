"""Host syncs on the TorchTPU stand-in, as its device reports them (the `standin` backend).

The stand-in (tpu_migrate/standin/site/torch_tpu) knows which tensors live on the `tpu` device,
and reports each transfer to the host as it happens (`torch_tpu._standin.events`): a value read
("read": `.item()`, `bool(t)`, `float(t)`, a tpu scalar used as an index), a copy ("copy":
`.cpu()`, `.to("cpu")`, `.tolist()`, `torch.save`, printing) and a data-dependent shape
("dynamic": nonzero, masked_select, unique, boolean-mask indexing). So a read is a sync exactly
when its tensor is a tpu tensor: a host tensor's read reports nothing, reads that torch makes in
C++ (a CPU tensor indexed with a tpu scalar) are reported, and placement.py's guesses are not
used.

Each transfer is recorded at the user's line (recording.call_site, as the native backend records
its reads) under the name of what made it: the Tensor method the program (or a library it
called) used, the stand-in's own method (`tolist`, `__repr__`), or indexing with a tpu scalar.
The native backend's method wrappers stay only to name the call and to count it once (`.cpu()`
of a tensor is one sync; so is `torch.save` of a state dict, which copies each tensor): a call
that made no transfer records nothing. Events while Dynamo compiles come from its fake tensors,
not from transfers, and are left out.
"""

from __future__ import annotations

import dis
import functools
import os
import sys
import time

from tpu_migrate.diagnose import recording
from tpu_migrate.diagnose.dynamo_hooks import dynamo_skips
from tpu_migrate.diagnose.events import Event, Kind

# The stand-in's ops (OpOverload names) that make a data-dependent shape, by what the user wrote.
DYNAMIC_NAMES = {
    "nonzero": "nonzero", "masked_select": "masked_select", "_unique2": "unique", "unique_dim": "unique",
    "unique_consecutive": "unique_consecutive", "repeat_interleave": "repeat_interleave",
    "index": "boolean mask indexing", "index_put_": "boolean mask indexing",
    "index_put": "boolean mask indexing",
}
# The stand-in's own methods that copy to the host, by the name the native backend gives the call.
STANDIN_METHODS = {"tolist": "tolist", "__repr__": "__repr__", "__reduce_ex__": "pickle"}
INDEXING = recording.scalar_indexing("tpu")
_SUBSCRIPT_OPS = frozenset(dis.opmap[name] for name in (
    "BINARY_SUBSCR", "STORE_SUBSCR", "DELETE_SUBSCR", "BINARY_SLICE", "STORE_SLICE") if name in dis.opmap)
_TOOL = os.sep + "tpu_migrate" + os.sep
_TORCH = os.sep + "torch" + os.sep


# torch's frames between a dispatch mode's __torch_dispatch__ and the op it dispatches.
_DISPATCH_PLUMBING = tuple(os.sep + os.path.join("torch", *path) for path in (
    ("_ops.py",), ("_compile.py",), ("_dynamo", "eval_frame.py"), ("utils", "_python_dispatch.py")))


def _is_torch(filename: str) -> bool:
    return _TORCH in filename


def _is_dispatch_plumbing(filename: str) -> bool:
    return filename.endswith(_DISPATCH_PLUMBING)


class DeviceReads:
    """The stand-in part of native.NativeHooks (`hooks`): its listener, and the wrappers that name
    the calls."""

    def __init__(self, hooks) -> None:
        import torch_tpu
        from torch_tpu._standin import events as device_events
        from torch_tpu._standin.tensor import TpuTensor

        self.hooks = hooks
        self.recorder = hooks.recorder
        self.local = hooks.recorder.local
        self.device_events = device_events
        self.standin_dir = os.path.join(os.path.dirname(os.path.abspath(torch_tpu.__file__)), "")
        self.subscripts: dict[tuple, bool] = {}  # (code, offset) -> is it a subscript
        self.listener = dynamo_skips(self._transfer)
        device_events.add_listener(self.listener)
        self._watch_first_device_tensor(TpuTensor)

    def uninstall(self) -> None:
        try:
            self.device_events.remove_listener(self.listener)
        except ValueError:
            pass
        if self.tensor_class is not None:
            self.tensor_class.__new__ = self.tensor_new
            self.tensor_class = None

    # -- did the program put anything on the device? --------------------------------------------
    tensor_class = None

    def _watch_first_device_tensor(self, tensor_class) -> None:
        """One `device_tensor` event when the process makes its first tpu tensor (then the class
        is as it was): a run without any computed on the host, and the report must say so."""
        original = tensor_class.__dict__["__new__"]
        make = original.__func__ if isinstance(original, staticmethod) else original
        reads = self

        def first_tensor(cls, *args, **kwargs):
            if reads.tensor_class is not None:
                reads.tensor_class.__new__ = original
                reads.tensor_class = None
                reads.recorder.emit(Event(kind=Kind.DEVICE_TENSOR, op="tpu", file=None, line=None))
            return make(cls, *args, **kwargs)

        self.tensor_class, self.tensor_new = tensor_class, original
        tensor_class.__new__ = staticmethod(first_tensor)

    # -- the device's reports ---------------------------------------------------------------------
    def _transfer(self, kind: str, op: str) -> None:
        """The stand-in's listener: `kind` "read", "copy" or "dynamic", `op` the aten op."""
        if self.hooks.compile_started is not None:  # Dynamo tracing on fake tensors
            return
        if kind == "dynamic":
            self.recorder.at_user_line(Kind.DYNAMIC, DYNAMIC_NAMES.get(op.split(".")[0], op))
            return
        transfers = getattr(self.local, "transfers", None)
        if transfers is not None:  # inside a call a wrapper names: one sync for the call
            self.local.transfers = transfers + 1
            return
        started = time.perf_counter()
        frame, method = self._origin()
        if method is None and op.startswith("_local_scalar_dense") and self._subscript(frame):
            method = INDEXING
        self._record(method or op.split(".")[0], started, self._queued(started), frame)

    def _origin(self):
        """(the frame that made a transfer no wrapper saw, the stand-in's method that made it or
        None). The frame is the first one out of the tool's and the stand-in's own frames, and out
        of torch's under them (op coverage's dispatch mode calls the op through torch/_ops.py):
        the user's line, or the library line that called into torch (torch.save's pickling)."""
        frame, method = sys._getframe(3), None
        start = frame
        while frame is not None:
            filename = frame.f_code.co_filename
            if _TOOL in filename:  # the stand-in's frames are the tool's too
                if filename.startswith(self.standin_dir):
                    method = method or STANDIN_METHODS.get(frame.f_code.co_name)
                start = frame.f_back
            elif not _is_torch(filename):
                break
            frame = frame.f_back
        while start is not None and _is_dispatch_plumbing(start.f_code.co_filename):
            start = start.f_back  # what called the tool's dispatch mode
        return start, method

    def _subscript(self, frame) -> bool:
        """Whether the frame is at a subscript (`host_table[t]`: torch reads the tpu scalar `t`)."""
        if frame is None or _is_torch(frame.f_code.co_filename):
            return False
        key = (frame.f_code, frame.f_lasti)
        found = self.subscripts.get(key)
        if found is None:
            code = frame.f_code.co_code
            found = self.subscripts[key] = 0 <= frame.f_lasti < len(code) and code[frame.f_lasti] in _SUBSCRIPT_OPS
        return found

    def _queued(self, started: float) -> float | None:
        """The work since the last read, which a TPU would have queued and this read waits for
        (the CPU computes for the stand-in); Dynamo's compiling left out."""
        hooks = self.hooks
        if hooks.last_read is None:
            return None
        return started - hooks.last_read - (hooks.compiling - hooks.compiling_at_read)

    def _record(self, name: str, started: float, queued: float | None, frame=None) -> None:
        hooks = self.hooks
        hooks.last_read, hooks.compiling_at_read = time.perf_counter(), hooks.compiling
        extra = {"wait": hooks.last_read - started}
        if queued is not None:
            extra["queued"] = queued
        self.recorder.at_user_line(Kind.SYNC, name, 4, frame, **extra)

    # -- wrappers that name the call --------------------------------------------------------------
    def method_wrapper(self, original, name: str):
        """A Tensor method (`item`, `cpu`, `to`, ...): one sync per call that transferred to the
        host, under the method's name (`to` with non_blocking=True does not wait: not a sync)."""
        label = "to('cpu')" if name == "to" else name
        return dynamo_skips(self._grouping(original, label, lambda tensor: tensor.is_cpu,
                                           _non_blocking if name == "to" else None))

    def save_wrapper(self, original):
        """torch.save: one sync per call that copied tensors of the device to the host."""
        return self._grouping(original, "torch.save", lambda obj: False, None)

    def _grouping(self, original, label: str, on_host, waits_not):
        reads, local = self, self.local

        @functools.wraps(original)
        def wrapper(first, *args, **kwargs):
            if getattr(local, "transfers", None) is not None or on_host(first):
                return original(first, *args, **kwargs)
            local.transfers = 0
            started = time.perf_counter()
            queued = reads._queued(started)
            try:
                return original(first, *args, **kwargs)
            finally:
                transfers, local.transfers = local.transfers, None
                if transfers and not (waits_not is not None and waits_not(args, kwargs)):
                    caller = sys._getframe(1)  # the stand-in's tolist calls .cpu(): a tolist
                    method = caller.f_code.co_filename.startswith(reads.standin_dir) and \
                        STANDIN_METHODS.get(caller.f_code.co_name)
                    reads._record(method or label, started, queued)

        return wrapper


def _non_blocking(args, kwargs) -> bool:
    return bool(kwargs.get("non_blocking") or (len(args) > 2 and args[2] is True))
