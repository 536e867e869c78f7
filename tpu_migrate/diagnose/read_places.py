"""Would a host read, or a copy to the host, wait for the TPU? (native backend)

On an accelerator the tensor says where it lives. With the CPU standing in, every tensor is a
CPU tensor, and the program's source says which would live on the TPU (placement.py): a read
by the user's code is placed by the statement that reads; torch's own reads are of host tensors
(the optimizer's step counter stays on the host on a TPU too); another library's read
(Transformers' `generate` checking whether to stop, every token) is placed by the user's
statement that called into the library. A library's copy to the host is one where the library
names the CPU itself on the way (a pipeline's `device=torch.device("cpu")` for its outputs);
its copies' storages are remembered, so reads of them, or of views of them, wait for nothing.

Every decision is cached per (code, line): this runs on every host read of the program.
"""

from __future__ import annotations

import os
import sys
import weakref

from tpu_migrate.diagnose import placement, recording

_LIBRARY = "library"  # a read_places value: a library's read, placed by the user's call into it
MAX_HOST_COPIES = 4096  # host copies remembered at once (the dead ones are dropped past it)
_TORCH = tuple(os.sep + name + os.sep for name in ("torch", "torch_xla", "torchvision", "torchaudio"))


def storage_of(tensor) -> int | None:
    """Where a tensor's data lives (views share it), or None for one without storage (a DTensor)."""
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError, AttributeError):
        return None


def is_torch(filename: str) -> bool:
    return any(marker in filename for marker in _TORCH)


def to_the_host(args, kwargs) -> bool:
    """Whether `t.to(*args, **kwargs)` copies to the CPU and waits for it (`non_blocking=True`
    does not wait)."""
    if kwargs.get("non_blocking") or (len(args) > 2 and args[2] is True):
        return False
    device = kwargs.get("device", args[0] if args else None)
    if isinstance(device, str):
        return device == "cpu" or device.startswith("cpu:")
    return getattr(device, "type", None) == "cpu"


def program_files(files: list[str]) -> list[str]:
    """The program's own files: those under its script's folder (not the modules torch writes to
    a temporary folder and imports, nor our sitecustomize). The script is argv[0]: at exit
    runpy has given `__main__` back to our bootstrap."""
    main = sys.argv[0] if sys.argv and os.path.isfile(sys.argv[0]) else \
        getattr(sys.modules.get("__main__"), "__file__", None)
    if not main:
        return files
    root = os.path.join(os.path.dirname(os.path.abspath(main)), "")
    return [f for f in files if os.path.abspath(f).startswith(root)]


class ReadPlaces:
    def __init__(self, device_types: set[str], cpu_stands_in: bool):
        self.device_types = device_types
        self.cpu_stands_in = cpu_stands_in
        self.read_places: dict[tuple, str] = {}  # (code, line) -> where the tensors read there live
        self.host_copies: dict[tuple, object] = {}  # (code, line) -> does it write .to("cpu")
        # A library's copies to the host, by their storage's address, while the copy lives (an
        # address is reused once its storage is freed: a later device tensor is no copy).
        self.host_storages: dict[int, weakref.ref] = {}
        self.program_places: bool | None = None  # does the program name a device anywhere
        # With the CPU standing in: the tensors that stand for host tensors (tensor_places.py),
        # while the program names a device (one that names none runs wholly on it).
        self.tensor_places = None
        # (code, line[, "index"]) -> whether what the line read was a host tensor, while
        # tensor_places followed tensors (None: both); after it stepped aside, the line's answer.
        self.host_sites: dict[tuple, bool | None] = {}

    def places_anything(self) -> bool:
        if self.program_places is None:
            from tpu_migrate.diagnose import incompatible

            self.program_places = placement.program_places(program_files(incompatible.user_sources()))
        return self.program_places

    def is_host(self, tensor) -> bool:
        """Whether `tensor`, a CPU tensor standing in for the TPU's, is a host tensor of the
        program's (tensor_places.py): its reads wait for nothing, whoever reads it."""
        marks = self.tensor_places
        return marks is not None and marks.is_host(tensor)

    def counts(self, tensor, caller_depth: int) -> str | None:
        """Would this read of `tensor` wait for the TPU: placement.DEVICE, placement.UNKNOWN
        (counted, with a note), or None (it would not)."""
        device = getattr(tensor, "device", None)
        if device is None or device.type not in self.device_types:
            return None
        if not self.cpu_stands_in:
            return placement.DEVICE
        frame = sys._getframe(caller_depth)
        if self.tensor_places is not None and self._host_read(tensor, (frame.f_code, frame.f_lineno)):
            return None
        key = (frame.f_code, frame.f_lineno)
        kind = self.read_places.get(key)
        if kind is None:  # once per reading line: this runs on every host read
            kind = self.read_places[key] = self.read_place(frame.f_code.co_filename, frame.f_lineno)
        if kind == _LIBRARY:
            if self.host_storages and self._host_copy_of(tensor):
                return None  # the library copied it to the host itself (a pipeline's outputs)
            kind = self.library_read_place(frame)
        return None if kind == placement.HOST else kind

    def read_place(self, filename: str, line: int) -> str:
        """With the CPU standing in, every tensor is a CPU tensor: the source says which would be
        on the TPU (placement.py). Reads by torch's own code are of host tensors (the optimizer's
        step counter stays on the host on a TPU too); another library's read (Transformers'
        `generate` checking whether to stop, every token) is decided by the user's call into it
        (_LIBRARY)."""
        if recording.is_library(filename):
            return _LIBRARY if recording.is_shown_library(filename) and not is_torch(filename) else placement.HOST
        return placement.read_kind(filename, line, self.places_anything())

    def _host_read(self, tensor, key: tuple) -> bool:
        """Whether a read at `key` is of a host tensor: its mark while tensor_places follows
        tensors (learned for the line); once it stepped aside, the mark of a tensor made before,
        or what the line read while followed. (tensor_places exists only in a program that
        places tensors: native.py.)"""
        marks = self.tensor_places
        if marks.on:
            host = marks.is_host(tensor)
            seen = self.host_sites.get(key, host)
            self.host_sites[key] = host if seen == host else None
            return host
        return marks.is_host(tensor) or self.host_sites.get(key) is True

    def scalar_index(self, index, caller_depth: int) -> str | None:
        """`table[index]` with a 0-d integer tensor `index`: torch reads the index in C++
        (`.item()`) to select with it, which waits for the device when the index is on it,
        wherever the table lives (a scheduler's host `alphas_cumprod[t]`, a device
        `timesteps[i + 1]`). Where the read counts, as `counts` answers for `index.item()` at
        the same line: placement.DEVICE, placement.UNKNOWN, or None. Never torch's own indexing;
        with the CPU standing in, not a host tensor's (tensor_places.py); once tensor_places
        stepped aside, only at a line it saw indexing with device scalars alone."""
        if index.is_floating_point() or index.is_complex():
            return None
        frame = sys._getframe(caller_depth)
        if recording.is_library(frame.f_code.co_filename) and (
                not recording.is_shown_library(frame.f_code.co_filename) or is_torch(frame.f_code.co_filename)):
            return None
        marks = self.tensor_places
        if not self.cpu_stands_in or marks is None:  # the device, or the source, says (a program
            return self.counts(index, caller_depth + 1)  # that places nothing runs on the device)
        key = (frame.f_code, frame.f_lineno, "index")
        if marks.on:
            return None if self._host_read(index, key) else placement.DEVICE
        if marks.is_host(index) or self.host_sites.get(key) is not False:
            return None
        return placement.DEVICE

    def destination_is_host(self, frame) -> bool:
        """Whether a tensor made or moved at `frame` (`.to(device)`, `device=`; a user's or a
        library's frame) goes to the host: the user's statement sends it there (its `.to("cpu")`,
        or a device the source puts on the host), or a library names the CPU on its way from
        the user's call (else it moves to the user's device, which the CPU only stands in for)."""
        key = (frame.f_code, frame.f_lineno, "to")
        found = self.host_copies.get(key)
        if found is None:  # once per line: this runs on every move and factory given a device
            filename = frame.f_code.co_filename
            if recording.is_library(filename):
                found = _LIBRARY
            else:
                found = placement.host_copy_at(filename, frame.f_lineno) or \
                    self.read_place(filename, frame.f_lineno) == placement.HOST
            self.host_copies[key] = found
        if found != _LIBRARY:
            return found
        names_cpu, frame = self._library_names_the_cpu(frame)
        return names_cpu or (frame is not None and self.library_read_place(frame) == placement.HOST)

    def _library_names_the_cpu(self, frame):
        """(whether a library frame from `frame` out names the CPU, the first frame outside the
        library: the user's call, or None)."""
        names_cpu = False
        while frame is not None and recording.is_library(frame.f_code.co_filename):
            key = (frame.f_code, frame.f_lineno, "cpu")
            named = self.host_copies.get(key)
            if named is None:
                named = self.host_copies[key] = placement.names_the_cpu(frame.f_code.co_filename, frame.f_lineno)
            names_cpu = names_cpu or named
            frame = frame.f_back
        return names_cpu, frame

    def remember_host_copy(self, copy) -> None:
        """`copy` is a library's copy to the host (see library_host_copy)."""
        storage = storage_of(copy)
        if storage is None:
            return
        if len(self.host_storages) >= MAX_HOST_COPIES:  # keep the live ones (a copy a step adds one)
            live = {key: ref for key, ref in self.host_storages.items() if ref() is not None}
            self.host_storages = live if len(live) < MAX_HOST_COPIES else {}
        self.host_storages[storage] = weakref.ref(copy)

    def _host_copy_of(self, tensor) -> bool:
        """Whether `tensor` is (a view of) a library's copy to the host that is still alive."""
        copy = self.host_storages.get(storage_of(tensor))
        return copy is not None and copy() is not None

    def library_read_place(self, frame) -> str:
        """A library's read, in a call from the user's line: on the TPU when that statement works
        on what the source put there (`model.generate(prompt)` with the model moved to the
        device): the library computes with the user's tensors, and reads what it computed."""
        while frame is not None and recording.is_library(frame.f_code.co_filename):
            frame = frame.f_back
        if frame is None:
            return placement.HOST
        key = (frame.f_code, frame.f_lineno, _LIBRARY)
        kind = self.read_places.get(key)
        if kind is None:
            kind = self.read_places[key] = self.read_place(frame.f_code.co_filename, frame.f_lineno)
        return placement.HOST if kind == placement.UNKNOWN else kind

    def host_copy(self, args, kwargs) -> bool:
        """`t.to(...)` that copies to the CPU as the source writes it (placement.host_copy_at):
        the CPU given by name at run time, and by name in the statement."""
        if not to_the_host(args, kwargs):
            return False
        if not self.cpu_stands_in:
            return True
        frame = sys._getframe(2)  # the caller of Tensor.to
        key = (frame.f_code, frame.f_lineno)
        found = self.host_copies.get(key)
        if found is None:  # once per line: this runs on every .to("cpu")
            filename = frame.f_code.co_filename
            if not recording.is_library(filename):
                found = placement.host_copy_at(filename, frame.f_lineno)
            elif recording.is_shown_library(filename) and not is_torch(filename):
                found = _LIBRARY
            else:
                found = False
            self.host_copies[key] = found
        if found == _LIBRARY:
            return self.library_host_copy(frame)
        return found

    def library_host_copy(self, frame) -> bool:
        """A library's `.to(...)` that the CPU answers: a copy to the host where the library names
        the CPU itself on the way (a pipeline's `device=torch.device("cpu")` for its outputs),
        in a call from a user line that works on the device; else the library moving a tensor to
        the user's device, which the CPU only stands in for."""
        names_cpu, frame = self._library_names_the_cpu(frame)
        return names_cpu and frame is not None and self.library_read_place(frame) != placement.HOST
