"""`torch.tpu` and its submodules, with torch-tpu 0.2.0's public names, API stages and messages.

`install()` builds the modules and returns `torch.tpu`; the loader registers it as the `tpu`
device module. Every module lists exactly 0.2.0's names (`dir()`, `__all__`); any other public
name raises AttributeError, and private `torch.tpu._x` names resolve through a private fallback,
as in 0.2.0. Submodules load on first use (`import torch.tpu.ops`, `torch.tpu.ops`), as in 0.2.0,
so that `python -m torch.tpu.distributed` finds its module not yet loaded.

The emulated TPU VM (see launch.py for the variables that describe the host): one process per
chip, bound to device index 0. Every process answers `device_count()` with the chips on its host
(TORCH_TPU_DEVICES_PER_HOST, default 4: a TPU v4 host), which is what 0.2.0 answers before its
runtime starts (it counts the chips on the PCI bus; the stand-in's runtime is the CPU, which never
starts). The device's random generator is the CPU's: the stand-in computes on CPU tensors.

API stages, as 0.2.0: the legacy device APIs (is_available, device_count, current_device,
set_device, synchronize, current_stream, set_stream, device; get_rng_state and initial_seed on
torch >= 2.13) raise RuntimeError when called from outside torch and torch_tpu, or warn once with
TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS=1; experimental APIs warn once; topology_aware_mesh warns as
deprecated. Nothing is checked while torch.compile traces. Names whose behaviour the stand-in does
not model raise NotImplementedError when called; NOT_MODELLED lists them.
"""

import contextlib
import dataclasses
import enum
import functools
import importlib
import importlib.abc
import importlib.util
import itertools
import math
import os
import re
import sys
import time
import types
import warnings

import torch

from torch_tpu._standin import launch

# ---------------------------------------------------------------------------------------------
# API stages: who may call, and the warnings and errors (0.2.0's message formats)
# ---------------------------------------------------------------------------------------------

_PREFIXES = {
    "internal": "<TorchTpu/ApiStage/InternalApi/> ",
    "experimental": "<TorchTpu/ApiStage/ExperimentalApi/> ",
    "deprecated": "<TorchTpu/ApiStage/DeprecatedApi/> ",
}
_TORCH_VERSION = tuple(int(part) for part in re.findall(r"\d+", torch.__version__)[:2])
# absl's boolean spellings (TorchTPU reads the variable in C++).
_TRUE = {"1", "t", "true", "y", "yes"}
# Read once, when TorchTPU's device module is imported.
_STRICT = os.environ.get("TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS", "").strip().lower() not in _TRUE


def _is_framework(frame):
    """Whether the frame's code belongs to torch or torch_tpu (TorchTPU's tests do not)."""
    name = frame.f_globals.get("__name__") if frame is not None else None
    if not isinstance(name, str) or name == "torch_tpu.tests" or name.startswith("torch_tpu.tests."):
        return False
    return name in ("torch", "torch_tpu") or name.startswith(("torch.", "torch_tpu."))


def _caller_of_caller():
    try:
        return sys._getframe(2)
    except ValueError:
        return None


def _message(stage, name, reason, version=None):
    if stage == "internal":
        text = f"{name} is internal to TorchTPU and may change or be removed without notice."
        return f"{text} {reason}" if reason else text
    if stage == "experimental":
        return f"{name} is experimental and subject to change: {reason}"
    return (f"{name} is deprecated as of TorchTPU {version} and will be removed in a future"
            f" release: {reason}")


def _warn(stage, message, stacklevel):
    category = DeprecationWarning if stage == "deprecated" else UserWarning
    warnings.warn(_PREFIXES[stage] + message, category, stacklevel=stacklevel + 1)


def _wrap(fn, name, stage, reason, version, strict):
    warned = False

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        nonlocal warned
        # Dynamo cannot trace the frame lookup: 0.2.0 checks nothing while compiling.
        if (strict or not warned) and not torch.compiler.is_compiling():
            if not _is_framework(_caller_of_caller()):
                if strict:
                    text = (f"{name} is internal to TorchTPU and can only be called by the"
                            " PyTorch framework (torch and torch_tpu).")
                    raise RuntimeError(f"{text} {reason}" if reason else text)
                _warn(stage, _message(stage, name, reason, version), stacklevel=2)
                warned = True
        return fn(*args, **kwargs)

    return wrapper


def _staged(stage, reason, *, version=None, strict=False, name=None):
    """Decorator: a call from outside torch/torch_tpu warns once (or raises: strict internal).
    On a class, instantiating it is the call."""
    def decorate(target):
        shown = name or target.__name__
        if isinstance(target, type):
            target.__init__ = _wrap(target.__init__, shown, stage, reason, version, strict)
            return target
        return _wrap(target, shown, stage, reason, version, strict)
    return decorate


def _experimental(reason, name=None):
    return _staged("experimental", reason, name=name)


def _legacy(since, prefer, experimental_msg):
    """0.2.0's internal_or_experimental: internal (strict) once torch.accelerator has `prefer`."""
    if _TORCH_VERSION < since:
        return _experimental(experimental_msg)
    return _staged("internal", f"Use {prefer} instead.", strict=_STRICT)


def _experimental_property(name, reason, getter, setter=None):
    """A property whose getter and setter each warn once, as `name`."""
    getter = _experimental(reason, name)(getter)
    return property(getter, _experimental(reason, name)(setter) if setter else None)

# ---------------------------------------------------------------------------------------------
# Not modelled: the name exists, a call raises
# ---------------------------------------------------------------------------------------------


def _not_modelled(dotted):
    return NotImplementedError(
        f"{dotted} is not modelled by the tpu-migrate TorchTPU stand-in (the CPU computes here);"
        " run it on a TPU VM")


def _not_modelled_function(dotted):
    def placeholder(*args, **kwargs):
        raise _not_modelled(dotted)
    placeholder.__name__ = placeholder.__qualname__ = dotted.rpartition(".")[2]
    placeholder.__doc__ = f"{dotted}: not modelled by the stand-in; calling it raises."
    return placeholder


def _not_modelled_class(dotted):
    def __init__(self, *args, **kwargs):
        raise _not_modelled(dotted)
    module, _, name = dotted.rpartition(".")
    return type(name, (), {"__init__": __init__, "__module__": module,
                           "__doc__": f"{dotted}: not modelled by the stand-in; creating one raises."})


def _not_modelled_property(dotted):
    def fail(*args):
        raise _not_modelled(dotted)
    return property(fail, fail)

# ---------------------------------------------------------------------------------------------
# torch.tpu: the device
# ---------------------------------------------------------------------------------------------

_BOUND_INDEX = 0  # one chip a process, seen as index 0
# What 0.2.0's get_amp_supported_dtype answers.
_AMP_DTYPES = (
    torch.bfloat16, torch.bool, torch.complex128, torch.complex64, torch.float16, torch.float32,
    torch.float64, torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2,
    torch.float8_e5m2fnuz, torch.float8_e8m0fnu, torch.int16, torch.int32, torch.int64, torch.int8,
    torch.uint16, torch.uint32, torch.uint64, torch.uint8,
)


def _index_of(device, optional=False):
    """The device index `device` names (int, "tpu[:i]", torch.device); -1 for None if optional."""
    if device is None and optional:
        return -1
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, _DeviceContext):
        return device._idx
    if not isinstance(device, torch.device) or device.type != "tpu":
        raise ValueError(f"Expected a tpu device, but got: {device}")
    return _BOUND_INDEX if device.index is None else device.index


@_legacy((2, 11), "torch.accelerator.device_index",
         "device() context manager is experimental and subject to change without notice.")
class _DeviceContext:
    """`torch.tpu.device(i)`: selects device i for the block; only this process's own index."""

    def __init__(self, device):
        self._idx = _index_of(device, optional=True)
        self._prev_idx = -1

    def __enter__(self):
        self._prev_idx = _Private._exchange_device(self._idx)

    def __exit__(self, *exc):
        self._idx = _Private._maybe_exchange_device(self._prev_idx)
        return False


@_experimental("device_of() context manager is experimental and subject to change without notice.")
class _DeviceOfContext(_DeviceContext):
    """`torch.tpu.device_of(obj)`: selects the device of a tpu tensor; a no-op for others."""

    def __init__(self, obj):
        on_tpu = getattr(obj, "is_tpu", False) or getattr(getattr(obj, "device", None), "type", None) == "tpu"
        super().__init__(obj.get_device() if on_tpu else -1)


@_legacy((2, 11), "torch.accelerator.current_device_index",
         "current_device() is experimental and subject to change without notice.")
def current_device():
    return _BOUND_INDEX


@_legacy((2, 11), "torch.accelerator.set_device_index",
         "set_device() is experimental and subject to change without notice.")
def set_device(device):
    """Only checks: a process cannot change its device."""
    if isinstance(device, str):
        if device != "tpu":
            raise ValueError(f"Invalid device string {device}")
        index = _BOUND_INDEX
    elif isinstance(device, torch.device):
        if device.type != "tpu":
            raise ValueError(f"Invalid device type {device.type}")
        index = _BOUND_INDEX if device.index is None else device.index
    elif isinstance(device, int):
        index = device
    else:
        raise TypeError(f"Got unrecognized device type, {device}")
    if index != _BOUND_INDEX:
        raise ValueError(
            f"Cannot set TPU device to index {index}, current process is "
            f"bound to device index {_BOUND_INDEX}. Changing the active TPU "
            "device within a process is not supported.")


@_legacy((2, 11), "torch.accelerator.is_available",
         "is_available() is experimental and subject to change without notice.")
def is_available():
    return device_count() > 0


@_legacy((2, 11), "torch.accelerator.device_count",
         "device_count() is experimental and subject to change without notice.")
def device_count():
    return launch.host_chip_count()


@_legacy((2, 11), "torch.accelerator.synchronize",
         "synchronize() is experimental and subject to change without notice.")
def synchronize(device=None):
    """A no-op: the CPU finished every op when it was dispatched."""


@_experimental("is_initialized() is experimental and subject to change without notice.")
def is_initialized():
    return not _Private._is_in_bad_fork()


@_experimental("get_device_name() is experimental and subject to change without notice.")
def get_device_name(device=None):
    return launch.GENERATION


@_experimental("_TpuDeviceProperties is experimental and subject to change without notice.")
@dataclasses.dataclass(frozen=True)
class _TpuDeviceProperties:
    """Static device properties, as torch.cuda.get_device_properties; HBM of one device."""

    name: str
    total_memory: int
    multi_processor_count: int = 1


@_experimental("get_device_properties() is experimental and subject to change without notice.")
def get_device_properties(device=None):
    return _TpuDeviceProperties(name=get_device_name(device), total_memory=launch.HBM_BYTES_PER_CHIP)


@_experimental("get_amp_supported_dtype() is experimental and may change or be removed without notice.")
def get_amp_supported_dtype():
    return list(_AMP_DTYPES)

# Random numbers: the device generator is the CPU's.


def _check_rng_device(device):
    """0.2.0 only gives the RNG state of this process's own device."""
    name, index = None, None
    if isinstance(device, str):
        name = device
    elif isinstance(device, torch.device):
        name, index = device.type, device.index
    elif isinstance(device, int):
        index = device
    else:
        raise TypeError(f"got unrecognized device type: {device}")
    if name is not None and name != "tpu":
        raise ValueError(f"expected device type 'tpu' for RNG state access, got '{name}'")
    if index is not None and index != _BOUND_INDEX:
        raise ValueError(
            f"expected local device index {_BOUND_INDEX}, got {index}:"
            " accessing RNG state of a non-current TPU device is not supported")


@_experimental("manual_seed() is experimental and may change or be removed without notice.")
def manual_seed(seed):
    if is_available():
        torch.default_generator.manual_seed(int(seed))


@_experimental("manual_seed_all() is experimental and may change or be removed without notice.")
def manual_seed_all(seed):
    if is_available():
        torch.default_generator.manual_seed(int(seed))


@_legacy((2, 13), "torch.accelerator.random.initial_seed",
         "initial_seed() is experimental and may change or be removed without notice.")
def initial_seed():
    return torch.default_generator.initial_seed()


@_legacy((2, 13), "torch.accelerator.random.get_rng_state",
         "get_rng_state() is experimental and subject to change without notice.")
def get_rng_state(device="tpu"):
    _check_rng_device(device)
    return torch.default_generator.get_state()


@_experimental("set_rng_state() is experimental and subject to change without notice.")
def set_rng_state(new_state, device="tpu"):
    _check_rng_device(device)
    torch.default_generator.set_state(new_state.to("cpu"))


_default_generators = None


def _get_default_generators():
    """One entry a device of the host, every one the CPU generator (cached: the same tuple)."""
    global _default_generators
    if _default_generators is None:
        _default_generators = (torch.default_generator,) * device_count()
    return _default_generators

# Execution mode and precision: recorded, and read by nothing (the CPU runs each op at once, in
# float32 at full precision).


class EagerMode(enum.Enum):
    """How TorchTPU dispatches eager ops."""

    DEFER_AND_FUSE = "DEFER_AND_FUSE"
    DEFER_NEVER = "DEFER_NEVER"
    DEFER_NEVER_AND_LAUNCH_BLOCKING = "DEFER_NEVER_AND_LAUNCH_BLOCKING"
    _INTERNAL_COMPILE_FX_GRAPH = "INTERNAL_COMPILE_FX_GRAPH"


class Precision(enum.Enum):
    """StableHLO's precision of matmuls and convolutions."""

    DEFAULT = 0
    HIGH = 1
    HIGHEST = 2


_eager_modes = [EagerMode.DEFER_NEVER]  # a stack: set_eager_mode pushes
_precisions = [Precision.DEFAULT]
_allow_excess_precision = None  # from XLA_FLAGS on first read


def _check_eager_mode(mode):
    if not isinstance(mode, EagerMode):
        raise TypeError(f"expected a torch.tpu.EagerMode, got {mode!r}")
    return mode


def _get_eager_mode(module):
    return _eager_modes[-1]


def _set_eager_mode(module, mode):
    _eager_modes[-1] = _check_eager_mode(mode)


@_experimental("Context manager for setting the eager mode.")
@contextlib.contextmanager
def set_eager_mode(mode):
    _eager_modes.append(_check_eager_mode(mode))
    try:
        yield
    finally:
        _eager_modes.pop()


@_experimental("Op precision context manager.")
@contextlib.contextmanager
def precision(mode):
    if mode not in (Precision.DEFAULT, Precision.HIGH, Precision.HIGHEST):
        raise ValueError(
            "expected to be one of 'PrecisionConfig.DEFAULT',"
            f" 'PrecisionConfig.HIGH', or 'PrecisionConfig.HIGHEST', got '{mode}'")
    _precisions.append(mode)
    try:
        yield
    finally:
        _precisions.pop()


def _get_allow_excess_precision(module):
    global _allow_excess_precision
    if _allow_excess_precision is None:
        found = re.findall(r"--xla_allow_excess_precision(?:=(\S*))?", os.environ.get("XLA_FLAGS", ""))
        _allow_excess_precision = bool(found) and found[-1].lower() in ("", "1", "true")
    return _allow_excess_precision


def _set_allow_excess_precision(module, value):
    global _allow_excess_precision
    _allow_excess_precision = bool(value)

# Streams and events: placeholders, as in 0.2.0. One stream runs everything; an event completes
# when it is recorded (the CPU has finished the work by then).


_STREAMS_MESSAGE = ("Streams and Events are not fully implemented in TorchTPU. Please file a"
                    " feature request describing your use case.")
_PRIVATEUSE1 = int(torch._C._autograd.DeviceType.PrivateUse1)
_stream_ids = itertools.count(1)
_current_stream_id = 0
_PINNING = {"none": "unpinned", "unpinned": "unpinned", "tensorcore": "tensor_core",
            "tensor_core": "tensor_core", "tc": "tensor_core", "tensor": "tensor_core",
            "dense": "tensor_core", "sparse": "sparse_core", "sparse_core": "sparse_core",
            "sparsecore": "sparse_core", "sc": "sparse_core", "sparseoffload": "sparse_core"}


def _stream_device_index(device):
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    index = getattr(device, "index", None)
    return _BOUND_INDEX if index is None else index


def _parse_pinned(pinned):
    if pinned is None:
        return "unpinned"
    if not isinstance(pinned, str):
        raise ValueError(f"pinned must be a CorePinningMode or a string, got {type(pinned)}")
    if pinned.lower() not in _PINNING:
        raise ValueError(f"Unknown device pinning mode: {pinned}")
    return _PINNING[pinned.lower()]


def _stream_method(name):
    return _experimental(f"{name}() is experimental and may change or be removed without notice.")


class TpuStream(torch.Stream):
    """A stream of a TPU device; a torch.Stream, so torch.accelerator.set_stream takes it."""

    def __new__(cls, device=None, priority=0, stream_id=None, *, pinned=None, **kwargs):
        index = _stream_device_index(device)
        stream_id = next(_stream_ids) if stream_id is None else stream_id
        return super().__new__(cls, stream_id=stream_id, device_index=index,
                               device_type=_PRIVATEUSE1, priority=priority)

    def __init__(self, device=None, priority=0, stream_id=None, *, pinned=None, **kwargs):
        self.pinned = _parse_pinned(pinned)

    @_stream_method("wait_event")
    def wait_event(self, event):
        event.wait()

    @_stream_method("wait_stream")
    def wait_stream(self, stream):
        self.wait_event(stream.record_event())

    @_stream_method("record_event")
    def record_event(self, event=None):
        event = TpuEvent() if event is None else event
        event.record(self)
        return event

    @_stream_method("query")
    def query(self):
        raise NotImplementedError(_STREAMS_MESSAGE)

    @_stream_method("synchronize")
    def synchronize(self):
        pass

    @_stream_method("priority_range")
    def priority_range(self):
        raise NotImplementedError(_STREAMS_MESSAGE)

    def __repr__(self):
        return "<torch.tpu.TpuStream>"

    is_sparse = _experimental_property(
        "is_sparse", "is_sparse is experimental and may change or be removed without notice.",
        lambda self: self.pinned == "sparse_core")
    is_dense = _experimental_property(
        "is_dense", "is_dense is experimental and may change or be removed without notice.",
        lambda self: self.pinned == "tensor_core")


class TpuEvent(torch.Event):
    """An event of a TPU device: complete once recorded; its time is the host's."""

    def __new__(cls, enable_timing=False, blocking=False, interprocess=False, external=False, device=None):
        device = torch.device("tpu") if device is None else device
        return super().__new__(cls, device=device, enable_timing=enable_timing, blocking=blocking,
                               interprocess=interprocess)

    def __init__(self, enable_timing=False, blocking=False, interprocess=False, external=False, device=None):
        self._timing = enable_timing
        self._recorded_ns = None

    @_stream_method("record")
    def record(self, stream=None):
        if stream is not None and not isinstance(stream, torch.Stream):
            raise TypeError(f"expected torch.Stream, but got {type(stream).__name__}")
        self._recorded_ns = time.perf_counter_ns()
        return self

    @_stream_method("wait")
    def wait(self, stream=None):
        pass

    @_stream_method("query")
    def query(self):
        return True

    @_stream_method("elapsed_time")
    def elapsed_time(self, end_event):
        if not (self._timing and getattr(end_event, "_timing", False)):
            raise ValueError("Both events must be created with argument 'enable_timing=True'.")
        if self._recorded_ns is None or getattr(end_event, "_recorded_ns", None) is None:
            raise ValueError("Both events must be recorded before calculating elapsed time.")
        return (end_event._recorded_ns - self._recorded_ns) / 1e6

    @_stream_method("synchronize")
    def synchronize(self):
        pass

    @classmethod
    @_stream_method("from_ipc_handle")
    def from_ipc_handle(cls, device, handle):
        raise NotImplementedError(_STREAMS_MESSAGE)

    @_stream_method("ipc_handle")
    def ipc_handle(self):
        raise NotImplementedError(_STREAMS_MESSAGE)

    def __repr__(self):
        return "<torch.tpu.TpuEvent>"


@_experimental("Stream() is experimental and may change or be removed without notice.")
def Stream(device=None, priority=0, **kwargs):  # noqa: N802 (0.2.0's name)
    return TpuStream(device=device, priority=priority, **kwargs)


@_experimental("Event() is experimental and may change or be removed without notice.")
def Event(enable_timing=False, blocking=False, interprocess=False, external=False, device=None):  # noqa: N802
    return TpuEvent(enable_timing=enable_timing, blocking=blocking, interprocess=interprocess,
                    external=external, device=device)


@_legacy((2, 11), "torch.accelerator.current_stream",
         "current_stream() is experimental and subject to change without notice.")
def current_stream(device=None):
    return TpuStream(device=device, stream_id=_current_stream_id)


@_legacy((2, 11), "torch.accelerator.set_stream",
         "set_stream() is experimental and subject to change without notice.")
def set_stream(stream):
    global _current_stream_id
    _current_stream_id = stream.stream_id


@_experimental("default_stream() is experimental and subject to change without notice.")
def default_stream(device=None):
    return TpuStream(device=device, stream_id=0)


class _StreamContext:
    def __init__(self, stream):
        self.stream = stream
        self.prev_stream_id = None

    def __enter__(self):
        global _current_stream_id
        if self.stream is not None:
            self.prev_stream_id, _current_stream_id = _current_stream_id, self.stream.stream_id

    def __exit__(self, *exc):
        global _current_stream_id
        if self.stream is not None and self.prev_stream_id is not None:
            _current_stream_id = self.prev_stream_id


@_experimental("stream() is experimental and subject to change without notice.")
def stream(stream):
    return _StreamContext(stream)

# ---------------------------------------------------------------------------------------------
# torch.tpu private names (0.2.0 serves `torch.tpu._x` from its device class)
# ---------------------------------------------------------------------------------------------


class _Private:
    _device_type = "tpu"
    _autocast_enabled = False
    _autocast_dtype = torch.bfloat16

    @classmethod
    def _public_module(cls):
        return getattr(torch, "tpu", cls)

    @staticmethod
    def _is_in_bad_fork():
        return False  # no device state that a fork could break

    @classmethod
    def _lazy_init(cls):
        pass

    @staticmethod
    def _get_generator(device):
        index = _BOUND_INDEX if device.index is None else device.index
        return _get_default_generators()[index]

    @staticmethod
    def _exchange_device(device):
        if device < 0:
            return -1
        set_device(device)
        return _BOUND_INDEX

    _maybe_exchange_device = _exchange_device

    @staticmethod
    def _is_triton_capable(device=None):
        return False

    @staticmethod
    def _is_gpu():
        return False

    @staticmethod
    def _get_multi_processor_count(device=None):
        return 1

    @staticmethod
    def _get_compute_capability(device=None):
        return ""

    @classmethod
    def _is_autocast_enabled(cls):
        return cls._public_module()._autocast_enabled

    @classmethod
    def _get_autocast_dtype(cls):
        return cls._public_module()._autocast_dtype

    @classmethod
    def _set_autocast_enabled(cls, enabled):
        cls._autocast_enabled = enabled
        cls._public_module().__dict__.pop("_autocast_enabled", None)

    @classmethod
    def _set_autocast_dtype(cls, dtype):
        supported = get_amp_supported_dtype()
        if dtype not in supported:
            raise ValueError(f"Unsupported dtype {dtype} for AMP. Supported dtypes are: {supported}")
        cls._autocast_dtype = dtype
        cls._public_module().__dict__.pop("_autocast_dtype", None)

    @staticmethod
    def _init_runtime_options():
        pass  # the CPU needs no runtime

    @staticmethod
    def _shutdown_runtime():
        pass


# The compilation cache's private APIs: the stand-in has no XLA cache to report on.
NOT_MODELLED_PRIVATE = [
    f"torch.tpu.{name}" for name in (
        "_clear_cache", "_get_cache_hits", "_get_cache_misses", "_get_cache_requests",
        "_get_cache_stats", "_get_dump_on_cache_miss", "_get_local_device_attributes",
        "_hbm_usage_summary", "_set_allow_cache", "_set_cache_only", "_set_dump_on_cache_miss")
]
for _name in NOT_MODELLED_PRIVATE:
    setattr(_Private, _name.rpartition(".")[2], staticmethod(_not_modelled_function(_name)))
del _name

# ---------------------------------------------------------------------------------------------
# torch.tpu.distributed and torch.tpu.ops: what the stand-in models
# ---------------------------------------------------------------------------------------------

_MULTI_SLICE_MESSAGE = (
    "but the PJRT devices do "
    "not expose a 'slice_index' attribute. That attribute is published "
    "only by the MegaScale PJRT client, which the TPU plugin installs "
    "when --megascale_port >= 0 and SKIP_MEGASCALE_PJRT_CLIENT is "
    "unset; do not set it at launch, TorchTPU sets it itself after "
    "creating its client. libtpu sets --megascale_port to "
    "MEGASCALE_PORT once MEGASCALE_COORDINATOR_ADDRESS, "
    "MEGASCALE_SLICE_ID and MEGASCALE_NUM_SLICES are set. Give the "
    "coordinator address a port, e.g. <MASTER_ADDR>:8080, since libtpu "
    "otherwise appends each process's own MEGASCALE_PORT.")


def _rank_layout(mesh_shape, dcn_mesh_shape):
    """Ranks in order: emulated chips have no physical layout to follow; one slice."""
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError("PyTorch distributed process group must be initialized before calling "
                           "topology_aware_mesh.")
    world = dist.get_world_size()
    if dcn_mesh_shape is not None and math.prod(dcn_mesh_shape) > 1:
        raise RuntimeError(
            f"A multi-slice layout was requested (dcn_mesh_shape={tuple(dcn_mesh_shape)}), "
            + _MULTI_SLICE_MESSAGE)
    shape = tuple(int(size) for size in mesh_shape)
    if math.prod(shape) != world:
        raise ValueError(f"Number of devices {world} must equal the product of mesh_shape {shape}")
    return torch.arange(world, dtype=torch.int64).reshape(shape)


@_staged("deprecated", "Use torch.tpu.distributed.topology_aware_mesh instead.", version="0.2.0")
def topology_aware_mesh(mesh_shape, *, dcn_mesh_shape=None, allow_split_physical_axes=False,
                        contiguous_submeshes=False):
    return _rank_layout(mesh_shape, dcn_mesh_shape)


@_experimental("torch.tpu.distributed.topology_aware_mesh is experimental and subject to change.",
               name="topology_aware_mesh")
def _distributed_topology_aware_mesh(mesh_shape, *, dcn_mesh_shape=None,
                                     allow_split_physical_axes=False, contiguous_submeshes=False):
    return _rank_layout(mesh_shape, dcn_mesh_shape)


@_experimental("torch.tpu.distributed.spmd_safe is experimental and subject to change.")
def spmd_safe(func):
    """Fuses nothing here (the CPU runs each op at once): the function, called as it is."""
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        return func(*args, **kwargs)
    return wrapper


def _group(group):
    import torch.distributed as dist

    group = dist.group.WORLD if group is None else group
    if group is None:
        raise ValueError("Default process group has not been initialized, please make sure to"
                         " call init_process_group.")
    return group


@_experimental("torch.tpu.ops.all_gather_dim is experimental and subject to change.")
def all_gather_dim(input, dim, group=None):  # noqa: A002 (0.2.0's signature)
    import torch.distributed as dist

    group = _group(group)
    front = input.movedim(dim, 0).contiguous()
    out = front.new_empty((front.shape[0] * group.size(), *front.shape[1:]))
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, front, group=group)
    return out.movedim(0, dim).contiguous()


_REDUCE_OPS = ("sum", "avg", "product", "min", "max", "band", "bor", "bxor")


@_experimental("torch.tpu.ops.reduce_scatter_dim is experimental and subject to change.")
def reduce_scatter_dim(input, dim, group=None, reduce_op="sum"):  # noqa: A002
    import torch.distributed as dist

    group = _group(group)
    if reduce_op not in _REDUCE_OPS:
        raise ValueError(
            f"reduce_scatter_dim(): expected reduce_op to be one of {_REDUCE_OPS}, got {reduce_op!r}")
    op = getattr(dist.ReduceOp, reduce_op.upper())
    front = input.movedim(dim, 0).contiguous()
    out = front.new_empty((front.shape[0] // group.size(), *front.shape[1:]))
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    scatter(out, front, op=op, group=group)
    return out.movedim(0, dim).contiguous()


@_experimental("torch.tpu.ops.optimization_barrier is experimental and subject to change.")
def optimization_barrier(inputs):
    """No compiler to fence here: the same values, as new tensors, in order."""
    return [tensor.view_as(tensor) for tensor in inputs]


class _Works:
    """The pending point-to-point transfers of several tensors, waited on together."""

    def __init__(self, works):
        self._works = works

    def wait(self, timeout=None):
        for work in self._works:
            work.wait() if timeout is None else work.wait(timeout)
        return True

    def is_completed(self):
        return all(work.is_completed() for work in self._works)


def _point_to_point(transfer, tensors, peer, tag):
    works = [transfer(tensor, peer, tag=tag) for tensor in tensors]
    return works[0] if len(works) == 1 else _Works(works)


@_experimental("torch.tpu.ops.send is experimental and subject to change.")
def send(tensors, dst, tag):
    import torch.distributed as dist
    return _point_to_point(dist.isend, tensors, dst, tag)


@_experimental("torch.tpu.ops.recv is experimental and subject to change.")
def recv(tensors, src, tag):
    import torch.distributed as dist
    return _point_to_point(dist.irecv, tensors, src, tag)


@_experimental("align_jagged_to_multiple is experimental and subject to change.")
def align_jagged_to_multiple(nt, multiple=128, padding_value=0.0):
    """Pads a jagged tensor's values buffer with rows to a multiple of `multiple` rows."""
    from torch.nested._internal.nested_tensor import nested_view_from_values_offsets

    values = nt.values()
    missing = -values.size(0) % multiple
    if not missing:
        return nt
    padding = values.new_full((missing, *values.shape[1:]), padding_value)
    return nested_view_from_values_offsets(torch.cat([values, padding]), nt.offsets())


@_experimental("strip_jagged_padding is experimental and subject to change.")
def strip_jagged_padding(nt, valid_tokens=None):
    """Drops the values rows past the last offset (a view)."""
    from torch.nested._internal.nested_tensor import nested_view_from_values_offsets

    offsets = nt.offsets()
    if valid_tokens is None:
        valid_tokens = int(offsets[-1].item()) if offsets.numel() else 0
    if nt.values().size(0) == valid_tokens:
        return nt
    return nested_view_from_values_offsets(nt.values()[:valid_tokens], offsets)

# ---------------------------------------------------------------------------------------------
# The module table: 0.2.0's public names
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Spec:
    doc: str
    exports: dict = dataclasses.field(default_factory=dict)  # name -> object
    properties: dict = dataclasses.field(default_factory=dict)  # name -> property
    staged: dict = dataclasses.field(default_factory=dict)  # name -> (reason, value factory)
    private: type = None  # serves `_x` names
    main: str = None  # module `python -m` runs


_NOT_MODELLED_NAMES = {
    "torch.tpu.compiler": ["custom_compiler_options"],
    "torch.tpu.distributed": [],
    "torch.tpu.ops": [
        "max_pool1d", "max_pool1d_backward", "max_pool2d", "max_pool2d_backward", "max_pool3d",
        "max_pool3d_backward", "ragged_all_to_all", "ragged_dot", "ragged_dot_weight_grad",
        "sparse_dense_matmul", "sparse_dense_matmul_activation_unstack",
        "sparse_dense_matmul_grad_with_adagrad", "sparse_dense_matmul_grad_with_adam",
        "sparse_dense_matmul_grad_with_sgd", "sparse_dense_matmul_gradient_stack",
        "sparse_gather", "sparse_gather_backward", "sparse_iota", "sparse_map_row",
        "splash_sdpa"],
    "torch.tpu.pallas": ["get_pallas_mesh", "jax_op"],
}
_NOT_MODELLED_CLASSES = {
    "torch.tpu.optimizers": ["AdamW", "Muon", "Optimizer", "Sgd", "SingleTraceTrainer"],
    "torch.tpu.profiler": ["TpuProfilerConfig"],
}
_NOT_MODELLED_PROPERTIES = {
    "torch.tpu.distributed": ["window_num_stripes", "window_stripe_chunk_mb"],
}
# The public dotted names that exist and only raise NotImplementedError.
NOT_MODELLED = sorted(
    f"{module}.{name}"
    for table in (_NOT_MODELLED_NAMES, _NOT_MODELLED_CLASSES, _NOT_MODELLED_PROPERTIES)
    for module, names in table.items() for name in names)


def _specs():
    specs = {
        "torch.tpu": _Spec(
            doc="Public TorchTPU device module (`torch.tpu`).",
            exports={
                "Event": Event, "Stream": Stream, "current_device": current_device,
                "current_stream": current_stream, "default_stream": default_stream,
                "device": _DeviceContext, "device_count": device_count,
                "device_of": _DeviceOfContext, "get_amp_supported_dtype": get_amp_supported_dtype,
                "get_device_name": get_device_name, "get_device_properties": get_device_properties,
                "get_rng_state": get_rng_state, "initial_seed": initial_seed,
                "is_available": is_available, "is_initialized": is_initialized,
                "manual_seed": manual_seed, "manual_seed_all": manual_seed_all,
                "precision": precision, "set_device": set_device, "set_eager_mode": set_eager_mode,
                "set_rng_state": set_rng_state, "set_stream": set_stream, "stream": stream,
                "synchronize": synchronize, "topology_aware_mesh": topology_aware_mesh,
            },
            properties={
                "allow_excess_precision": _experimental_property(
                    "allow_excess_precision",
                    "allow_excess_precision is experimental and may change or be removed without notice.",
                    _get_allow_excess_precision, _set_allow_excess_precision),
                "eager_mode": _experimental_property(
                    "eager_mode", "eager_mode is experimental and may change or be removed without notice.",
                    _get_eager_mode, _set_eager_mode),
            },
            staged={
                "EagerMode": ("TPU eager execution mode configuration.", lambda: EagerMode),
                "Precision": ("StableHLO precision configuration.", lambda: Precision),
                "default_generators": ("Default generators for TPU devices.", _get_default_generators),
            },
            private=_Private),
        "torch.tpu.compiler": _Spec("Public compiler API for TorchTPU (`torch.tpu.compiler`)."),
        "torch.tpu.distributed": _Spec(
            "Public TorchTPU distributed namespace (`torch.tpu.distributed`).",
            exports={
                "set_tpu_launch_env": _experimental(
                    "torch.tpu.distributed.set_tpu_launch_env is experimental and subject to change."
                )(launch.set_tpu_launch_env),
                "spmd_safe": spmd_safe,
                "topology_aware_mesh": _distributed_topology_aware_mesh,
            },
            main=launch.__name__),
        "torch.tpu.ops": _Spec(
            "Public custom ops API for TorchTPU (`torch.tpu.ops`).",
            exports={
                "align_jagged_to_multiple": align_jagged_to_multiple, "all_gather_dim": all_gather_dim,
                "optimization_barrier": optimization_barrier, "recv": recv,
                "reduce_scatter_dim": reduce_scatter_dim, "send": send,
                "strip_jagged_padding": strip_jagged_padding,
            }),
        "torch.tpu.optimizers": _Spec("Public optimizers API for TorchTPU (`torch.tpu.optimizers`)."),
        "torch.tpu.pallas": _Spec("Public Pallas API for TorchTPU (`torch.tpu.pallas`)."),
        "torch.tpu.profiler": _Spec("Public profiler API for TorchTPU (`torch.tpu.profiler`)."),
    }
    for module, names in _NOT_MODELLED_NAMES.items():
        specs[module].exports.update({n: _not_modelled_function(f"{module}.{n}") for n in names})
    for module, names in _NOT_MODELLED_CLASSES.items():
        specs[module].exports.update({n: _not_modelled_class(f"{module}.{n}") for n in names})
    for module, names in _NOT_MODELLED_PROPERTIES.items():
        specs[module].properties.update({n: _not_modelled_property(f"{module}.{n}") for n in names})
    return specs

# ---------------------------------------------------------------------------------------------
# The modules, their import machinery, install()
# ---------------------------------------------------------------------------------------------


def _warn_staged(name, reason, warned):
    """0.2.0 warns on the first access from outside torch/torch_tpu (the import system's
    frames, as in `from torch.tpu import EagerMode`, are passed over)."""
    if name in warned or torch.compiler.is_compiling():
        return
    frame = sys._getframe(2)
    while frame is not None and frame.f_globals.get("__name__") in ("importlib._bootstrap",
                                                                     "_frozen_importlib"):
        frame = frame.f_back
    if not _is_framework(frame):
        warned.add(name)
        _warn("experimental", _message("experimental", f"'{name}'", reason), stacklevel=3)


class _PublicModule(types.ModuleType):
    """A public module: its exports in its namespace, the rest served by __getattr__."""

    def __init__(self, name, spec, children):
        super().__init__(name, spec.doc)
        self.__dict__.update(spec.exports)
        names = sorted({*spec.exports, *spec.properties, *spec.staged, *children})
        self.__dict__["__standin__"] = {"spec": spec, "children": set(children), "names": names,
                                        "warned": set()}
        self.__all__ = list(names)

    def __getattr__(self, name):
        own = self.__dict__["__standin__"]
        spec = own["spec"]
        if name in spec.staged:
            reason, value = spec.staged[name]
            _warn_staged(name, reason, own["warned"])
            return value()
        if name in own["children"]:
            return importlib.import_module(f"{self.__name__}.{name}")
        if spec.private is not None and name.startswith("_") and not name.startswith("__"):
            try:
                return getattr(spec.private, name)
            except AttributeError:
                pass
        raise AttributeError(f"module '{self.__name__}' has no attribute '{name}'")

    def __dir__(self):
        return list(self.__dict__["__standin__"]["names"])


class _Loader(importlib.abc.Loader):
    """Makes one public module."""

    def __init__(self, name, spec, children):
        self.name, self.spec, self.children = name, spec, children

    def is_package(self, fullname):
        return bool(self.children)

    def create_module(self, module_spec):
        # Properties act on a module only from its type: one type a module.
        module_type = _PublicModule
        if self.spec.properties:
            type_name = f"_{self.name.replace('.', '_')}_Module"
            module_type = type(type_name, (_PublicModule,), dict(self.spec.properties))
        return module_type(self.name, self.spec, self.children)

    def exec_module(self, module):
        for child in self.children:
            if f"{self.name}.{child}" in sys.modules:
                setattr(module, child, sys.modules[f"{self.name}.{child}"])


class _MainLoader(_Loader):
    """A public module's loader that `python -m` can run: it gives the code of `spec.main`."""

    def _main_loader(self):
        return importlib.util.find_spec(self.spec.main).loader

    def get_filename(self, fullname):
        return self._main_loader().get_filename(self.spec.main)

    def get_source(self, fullname):
        return self._main_loader().get_source(self.spec.main)

    def get_code(self, fullname):
        return self._main_loader().get_code(self.spec.main)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the public modules by name (they have no files of their own)."""

    def __init__(self):
        self.loaders = {}

    def find_spec(self, fullname, path=None, target=None):
        loader = self.loaders.get(fullname)
        if loader is None:
            return None
        main = importlib.util.find_spec(loader.spec.main) if loader.spec.main else None
        module_spec = importlib.util.spec_from_loader(
            fullname, loader, origin=main.origin if main else None, is_package=loader.is_package(fullname))
        if main is not None:
            module_spec.has_location, module_spec.cached = main.has_location, main.cached
        return module_spec


_FINDER = _Finder()


def install():
    """Builds torch.tpu and registers its submodules (loaded on first use); returns torch.tpu.

    Sets `sys.modules["torch.tpu"]` but not `torch.tpu`: the device module's registration does.
    A second call returns the same module.
    """
    existing = sys.modules.get("torch.tpu")
    if isinstance(existing, _PublicModule):
        return existing
    specs = _specs()
    for name, spec in specs.items():
        children = {other.rpartition(".")[2] for other in specs if other.rpartition(".")[0] == name}
        _FINDER.loaders[name] = (_MainLoader if spec.main else _Loader)(name, spec, children)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    module_spec = _FINDER.find_spec("torch.tpu")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules["torch.tpu"] = module
    module_spec.loader.exec_module(module)
    return module
