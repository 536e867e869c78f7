"""Which CPU tensors stand for host tensors, where the CPU stands in for the TPU (native backend).

Every tensor is a CPU tensor then, so the device cannot say where a tensor would live on a TPU.
This TorchFunctionMode follows each tensor from where it is made, as a TPU would place it:

- a factory without `device=` (`torch.linspace`, `torch.zeros(n)`; `torch.from_numpy`, which
  torch dispatches to no mode, is wrapped) makes a host tensor; with `device=`, and a move (`.to(device)`, `.cuda()`), the tensor goes where the
  call's site sends it (read_places: the user's statement, or for a library the user's call into
  it, unless the library names the CPU on the way);
- a copy to the host (`.cpu()`, `.to("cpu")`) is a host tensor; the CPU answers it with the tensor
  itself, so it gets an alias of its own (a view: same data) to be told apart from its source
  (not a leaf that requires grad nor a Parameter, which the program must get back themselves);
- any other op makes host tensors when all its tensor inputs are host tensors (a scheduler's
  tables and timesteps, the losses a program collects), else device tensors; an in-place op
  leaves its tensor where it was.

Only host tensors are marked; the rest (a device tensor, one made in another thread, in compiled
code, in C++ by autograd) counts as it did without the marks: the source decides (read_places).
So a library's read of its own host tensors (Diffusers' DDPMScheduler: `if t > 0`, the
`nonzero` of its timesteps) is no sync, `.numpy()` of a copy `.cpu()` just made is none either,
and a device scalar indexing a table (a read torch makes in C++) is told from a host one.

The mode costs Python per torch call (about 4 us: a tiny MLP's eager step took 1.6x as long): it
follows tensors during the warm-up steps and one more, as op coverage checks ops, and is taken off
for good then. The marks made until then stay, and each line that read keeps what it read
(read_places.ReadPlaces.host_sites); a program without optimizer steps is followed to its end.
Dynamo traces modes and guards on them, so the mode steps off the stack for each call of what
torch.compile returned (call_timing.py: `suspend`, `resume`; what the compiled code makes counts
as the source places it) and for a backward Dynamo compiles lazily (back at the compile's end,
even when another end callback fails: dynamo_hooks runs ours first); a compile it did not see
coming (`torch._dynamo.optimize`, a frame compiled outside those calls) takes it off for good.
Taken off from another thread than the one that installed it (mode stacks are per thread), it
passes calls through on its own thread until a compile or compiled call there takes it off.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import weakref

from torch.overrides import TorchFunctionMode

from tpu_migrate.diagnose import recording
from tpu_migrate.diagnose.dynamo_hooks import dynamo_skips
from tpu_migrate.diagnose.read_places import is_torch

MOVES = frozenset(("to", "cuda", "tpu", "xpu"))
COPIES = frozenset(("cpu",))
SPECIAL = MOVES | COPIES  # ops whose result is not where their first input is
UNSEEN_FACTORIES = ("from_numpy", "frombuffer")
_TOOL = os.sep + "tpu_migrate" + os.sep


class _Ref(weakref.ref):
    __slots__ = ("key",)


def _tensors(values, tensor_type):
    """The tensors among `values`, and one level into the lists and tuples among them
    (`torch.cat([a, b])`)."""
    for value in values:
        if isinstance(value, tensor_type):
            yield value
        elif isinstance(value, (list, tuple)):
            for item in value:
                if isinstance(item, tensor_type):
                    yield item


class TensorPlaces(TorchFunctionMode):
    def __init__(self, torch, places) -> None:
        super().__init__()
        self.torch = torch
        self.tensor_type = torch.Tensor
        self.places = places  # read_places.ReadPlaces: where a call's site sends what it makes
        self.host: dict[int, _Ref] = {}  # id(tensor) -> weak reference, for host tensors
        self.on = False  # following tensors: from install() to uninstall()
        self.stacked = False  # on the torch function mode stack (off it inside compiled calls)
        self.above = 0  # while suspended: how many of the program's modes were above it
        self.thread = None  # the thread whose mode stack holds it
        self.unseen: dict[str, object] = {}  # torch.<name> -> the original, while wrapped
        self.wrapped: dict[str, object] = {}  # torch.<name> -> its wrapper

    # -- the marks ----------------------------------------------------------------------------
    def is_host(self, tensor) -> bool:
        ref = self.host.get(id(tensor))
        return ref is not None and ref() is tensor

    def _forget(self, ref: _Ref) -> None:
        """A host tensor's weakref callback: in any thread, maybe while another drops the entry
        (pop, never a del that could raise into the program's stderr)."""
        if self.host.get(ref.key) is ref:
            self.host.pop(ref.key, None)

    def _mark(self, tensor, host: bool) -> None:
        if host:
            if not self.is_host(tensor):
                ref = _Ref(tensor, self._forget)
                ref.key = id(tensor)
                self.host[ref.key] = ref
        elif ref := self.host.get(id(tensor)):  # an in-place op, a move of the tensor itself
            if ref() is tensor:
                self.host.pop(id(tensor), None)

    # -- the mode -----------------------------------------------------------------------------
    def install(self) -> None:
        self.__enter__()
        self.on = self.stacked = True
        self.thread = threading.get_ident()
        # Factories of host tensors that torch dispatches to no mode.
        self.unseen = {name: getattr(self.torch, name) for name in UNSEEN_FACTORIES if hasattr(self.torch, name)}
        self.wrapped = {name: self._host_factory(original) for name, original in self.unseen.items()}
        self._wrap_factories()

    def _wrap_factories(self) -> None:
        for name, wrapper in self.wrapped.items():
            setattr(self.torch, name, wrapper)

    def _unwrap_factories(self) -> None:
        for name, original in self.unseen.items():  # Dynamo guards on torch.* functions too
            setattr(self.torch, name, original)

    def _host_factory(self, original):
        marks = self

        @functools.wraps(original)
        def factory(*args, **kwargs):
            tensor = original(*args, **kwargs)
            if marks.on:
                marks._mark(tensor, True)
            return tensor

        return dynamo_skips(factory)

    def uninstall(self) -> None:
        """Off for good (its marks stay): it follows no more tensors, and leaves the torch
        function mode stack. Each thread has its own stack: called from another thread than the
        installer's, the mode stays on the installer's, passing every call through, until that
        thread's next compile or compiled call takes it off (`suspend`, which no `resume` undoes)."""
        if self.on:
            self.on = False
            self._unwrap_factories()
        if self.on_this_stack():
            self._off_stack()

    def suspend(self) -> bool:
        """Off the stack for a compiled call or a compile (Dynamo would trace the mode, and guard
        on it), the factories unwrapped; whether it was on it (then `resume()` after)."""
        if not self.on_this_stack():
            return False
        self.above = self._off_stack()
        return True

    def on_this_stack(self) -> bool:
        """Whether it is on this thread's mode stack (each thread has its own)."""
        return self.stacked and threading.get_ident() == self.thread

    def resume(self) -> None:
        """Back where `suspend()` took it from, under the program's modes that were above it."""
        if not self.on or self.stacked:
            return
        C = self.torch._C
        above = [C._pop_torch_function_stack() for _ in range(min(self.above, C._len_torch_function_stack()))]
        C._push_on_torch_function_stack(self)
        for mode in reversed(above):
            C._push_on_torch_function_stack(mode)
        self.stacked = True
        self._wrap_factories()

    def _off_stack(self) -> int:
        """Off the torch function mode stack, wherever the program's own modes put it: how many
        were above it."""
        self.stacked = False
        self._unwrap_factories()
        C = self.torch._C
        above = []
        while C._len_torch_function_stack() > 0:
            mode = C._pop_torch_function_stack()
            if mode is self:
                break
            above.append(mode)
        for mode in reversed(above):
            C._push_on_torch_function_stack(mode)
        return len(above)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        result = func(*args, **kwargs)
        first = args[0] if args else None
        # The common case, kept cheap (it runs on every torch call): an op of a device tensor
        # (its first input) makes a device tensor, which is not marked.
        if isinstance(first, self.tensor_type) and id(first) not in self.host and "device" not in kwargs \
                and getattr(func, "__name__", None) not in SPECIAL:
            return result
        if not self.on:  # uninstalled from another thread: still on this one's stack (uninstall)
            return result
        try:
            return self._place(func, args, kwargs, result)
        except Exception:  # noqa: BLE001 - a mark we could not make costs the report, never the run
            return result

    def _place(self, func, args, kwargs, result):
        Tensor = self.torch.Tensor
        name = getattr(func, "__name__", None)
        receiver = args[0] if args and isinstance(args[0], Tensor) else None
        if name in COPIES and receiver is not None:
            host, result = True, self._own(result, receiver)
            if result is None:
                return receiver
        elif name in MOVES and receiver is not None:
            target = self._target(name, args, kwargs)
            if target is None:  # .to(torch.float16): where it was
                host = self.is_host(receiver)
            elif isinstance(target, Tensor):  # .to(other): where `other` is
                host = self.is_host(target)
            else:
                host = sends_to_the_host(self.places, sys._getframe(2))
                if host:
                    result = self._own(result, receiver)
                    if result is None:
                        return receiver
        elif kwargs.get("device") is not None:  # a factory given a device
            host = sends_to_the_host(self.places, sys._getframe(2))
        elif result is receiver:  # in place (`buffer.copy_(x)`): a tensor keeps its place
            return result
        else:
            host = True
            for tensor in _tensors((*args, *kwargs.values()), Tensor):
                if not self.is_host(tensor):
                    host = False
                    break
        if isinstance(result, Tensor):
            self._mark(result, host)
        elif isinstance(result, (tuple, list)):
            for item in result:
                if isinstance(item, Tensor):
                    self._mark(item, host)
        return result

    def _target(self, name, args, kwargs):
        """Where `.to(...)` / `.cuda(...)` sends a tensor: None (nowhere new: a dtype only), a
        tensor (`.to(other)`), or a device."""
        if name != "to":
            return "device"
        device = kwargs.get("device")
        if device is not None:
            return device
        for value in args[1:]:
            if isinstance(value, (str, int, self.torch.device, self.torch.Tensor)) and not isinstance(value, bool):
                return value
        return None

    def _own(self, result, receiver):
        """The CPU answers a copy to the host with the tensor itself: an alias (same data) of its
        own, so the device tensor it came from keeps its place. None where the program must get
        the tensor itself, unmarked: a leaf that requires grad (an alias is no leaf, so an
        optimizer refuses it) or a subclass such as a Parameter (an alias is a plain Tensor); a
        host tensor is already where it goes."""
        if result is not receiver or self.is_host(receiver):
            return result
        if (receiver.requires_grad and receiver.is_leaf) or type(receiver) is not self.torch.Tensor:
            return None
        try:
            return receiver.view_as(receiver)
        except RuntimeError:  # a layout without views: the tensor itself
            return result


def sends_to_the_host(places, frame) -> bool:
    """Whether the call at `frame` (inside torch or the tool: the first frame out of both) makes
    or moves a tensor to the host. The user's statement decides (its `.to("cpu")`, or a device
    the source puts on the host: `device = torch.device("cpu")`); in a library, the library when
    it names the CPU on the way, else the user's call into it."""
    while frame is not None:
        filename = frame.f_code.co_filename
        if _TOOL in filename or (recording.is_library(filename) and not recording.is_shown_library(filename)) \
                or is_torch(filename):
            frame = frame.f_back
            continue
        break
    if frame is None:
        return False
    return places.destination_is_host(frame)
