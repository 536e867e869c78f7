"""The `tpu` tensor: a tensor whose device is `tpu:0`, holding a CPU tensor that does the work.

Every op on a `tpu` tensor reaches `TpuTensor.__torch_dispatch__`, below autograd: it runs the op
on the CPU tensors inside and wraps the results again, so autograd, optimizers, `torch.compile`
(a traceable wrapper subclass) and the dispatcher all see a real `tpu` device. Factory calls with
`device="tpu"` reach the PrivateUse1 fallback (`install_factories`). What crosses from the device to
the host is reported to `events` exactly, as a TPU would make it cross.
"""

import torch
from torch.utils import _pytree as pytree

from torch_tpu._standin import events

aten = torch.ops.aten
_CPU = torch.device("cpu")

# Ops whose output size depends on the tensor's values: on a TPU the host must wait for it.
_DYNAMIC_SHAPE_OPS = {
    aten.nonzero.default,
    aten.masked_select.default,
    aten._unique2.default,
    aten.unique_dim.default,
    aten.unique_consecutive.default,
    aten.repeat_interleave.Tensor,
}
# Ops that may mix the devices, as they may on any accelerator: copies across devices, and
# indexing with indices kept on the host.
_CROSS_DEVICE_OPS = {
    aten.copy_.default,
    aten._to_copy.default,
    aten._copy_from.default,
    aten._copy_from_and_resize.default,
    aten.index.Tensor,
    aten.index_put_.default,
    aten.index_put.default,
    aten._index_put_impl_.default,
    aten.set_.source_Tensor,
    aten.lift_fresh.default,
}


def is_tpu_device(device):
    return device is not None and torch.device(device).type == "tpu"


def check_index(device):
    """TorchTPU binds one chip per process, seen as index 0."""
    index = torch.device(device).index
    if index not in (None, 0):
        raise RuntimeError(
            f"tpu:{index} is not this process's TPU: TorchTPU binds one chip per process, "
            "seen as tpu:0 (tpu-migrate stand-in)"
        )


class TpuTensor(torch.Tensor):
    """A tensor on the emulated `tpu` device; `_inner` is the CPU tensor that holds its values."""

    _inner: torch.Tensor
    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, inner, requires_grad=False):
        outer = torch.Tensor._make_wrapper_subclass(
            cls,
            inner.size(),
            strides=inner.stride(),
            storage_offset=inner.storage_offset(),
            dtype=inner.dtype,
            layout=inner.layout,
            device=torch.device("tpu", 0),
            requires_grad=requires_grad,
        )
        outer._inner = inner
        return outer

    def __repr__(self, *, tensor_contents=None):
        # Printing reads the values on the host, once, as on a TPU; the rest is torch's own repr.
        if tensor_contents is None:
            events.emit("copy", "repr")
            tensor_contents = torch._tensor_str._tensor_str(self._inner.detach(), len("tensor("))
        text = torch._tensor_str._str(self, tensor_contents=tensor_contents)
        # torch names a subclass in its repr; a tpu tensor prints as a tensor, as on a TPU.
        prefix = type(self).__name__ + "("
        return "tensor(" + text[len(prefix):] if text.startswith(prefix) else text

    def __format__(self, spec):
        # torch formats a 0-d tensor as its number (f"{loss:.4f}"), but only a plain Tensor: a
        # host read, as on a TPU.
        if self.dim() == 0 and not self.is_meta:
            return self.item().__format__(spec)
        return object.__format__(self, spec)

    def tolist(self):
        return self.cpu().tolist()

    def numpy(self, *, force=False):
        if not force:  # PyTorch's words for any device tensor
            raise TypeError(f"can't convert {self.device} device type tensor to numpy. Use Tensor.cpu() to "
                            "copy the tensor to host memory first.")
        return self.cpu().numpy()

    def untyped_storage(self):
        # The device memory is the CPU tensor's: FSDP2 frees and re-allocates unsharded
        # parameters by resizing it. While torch.compile traces, its fake copy of the tensor is
        # made from the wrapper's own storage, and the inner tensor may itself be fake.
        if torch.compiler.is_compiling() or torch._subclasses.fake_tensor.is_fake(self._inner):
            return super().untyped_storage()
        return self._inner.untyped_storage()

    def __reduce_ex__(self, protocol):
        # Saved as torch saves any device tensor without host storage: a CPU copy and the
        # device's name, which torch.load (weights_only too) moves back to `tpu`.
        return (
            torch._utils._rebuild_device_tensor_from_cpu_tensor,
            (self.cpu(), self.dtype, str(self.device), self.requires_grad),
        )

    def __tensor_flatten__(self):
        return ["_inner"], None

    @staticmethod
    def __tensor_unflatten__(inner_tensors, meta, outer_size, outer_stride):
        return TpuTensor(inner_tensors["_inner"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        seen = _Unwrapped()
        cpu_args = seen.unwrap(args)
        cpu_kwargs = {name: seen.unwrap(value) for name, value in kwargs.items()}
        if seen.tpu_inputs and seen.host_tensors and func not in _CROSS_DEVICE_OPS:
            _refuse_mixed_devices(func)
        if seen.tpu_inputs and func.namespace == "c10d":
            _check_group_serves_tpu(args)
        if func is aten._to_copy.default and "device" in kwargs:
            return _to_copy(func, args[0], cpu_args, cpu_kwargs, kwargs["device"])
        if func is aten._local_scalar_dense.default:
            events.emit("read", func.__name__)
        elif func in _DYNAMIC_SHAPE_OPS or _is_mask_index(func, cpu_args):
            events.emit("dynamic", func.__name__)
        elif func is aten.copy_.default and not isinstance(args[0], TpuTensor):
            events.emit("copy", func.__name__)
        result = func(*cpu_args, **cpu_kwargs)
        return seen.wrap(result, on_device=seen.tpu_inputs or is_tpu_device(kwargs.get("device")))


class _Unwrapped:
    """One op's arguments as the CPU runs them, and what they were. Ops take tensors, devices and
    numbers, alone or in lists and tuples: a walk of those (pytree's general one cost a third of
    a small training step)."""

    __slots__ = ("originals", "tpu_inputs", "host_tensors")

    def __init__(self):
        self.originals = {}  # id of what the op gets -> what the caller passed, for in-place results
        self.tpu_inputs = False
        self.host_tensors = False  # a CPU tensor with dimensions among the arguments

    def unwrap(self, value):
        if isinstance(value, TpuTensor):
            self.tpu_inputs = True
            self.originals[id(value._inner)] = value
            return value._inner
        if isinstance(value, torch.Tensor):
            self.originals[id(value)] = value
            self.host_tensors = self.host_tensors or value.dim() > 0
            return value
        if isinstance(value, (list, tuple)):
            return _rebuilt(value, [self.unwrap(item) for item in value])
        if isinstance(value, torch.device) and value.type == "tpu":
            return _CPU
        return value

    def wrap(self, value, on_device):
        if isinstance(value, torch.Tensor):
            if id(value) in self.originals:  # an in-place or out= op returns what it was given
                return self.originals[id(value)]
            return TpuTensor(value) if on_device else value
        if isinstance(value, (list, tuple)):
            return _rebuilt(value, [self.wrap(item, on_device) for item in value])
        return value


def _rebuilt(sequence, items):
    """A list or tuple of the same kind (a named tuple, or torch.return_types' struct sequences)."""
    kind = type(sequence)
    if kind is list or kind is tuple:
        return kind(items)
    return kind(*items) if hasattr(sequence, "_fields") and not hasattr(sequence, "n_fields") else kind(items)


def _to_copy(func, source, cpu_args, cpu_kwargs, device):
    cpu_kwargs = dict(cpu_kwargs, device=_CPU)
    result = func(*cpu_args, **cpu_kwargs)
    if is_tpu_device(device):
        check_index(device)
        return TpuTensor(result)
    if isinstance(source, TpuTensor):
        events.emit("copy", "_to_copy")
    return result


def _is_mask_index(func, cpu_args):
    if func not in (aten.index.Tensor, aten.index_put_.default, aten.index_put.default):
        return False
    return any(
        index is not None and index.dtype in (torch.bool, torch.uint8) for index in cpu_args[1]
    )


def _refuse_mixed_devices(func):
    """A host tensor with dimensions beside a tpu tensor is an error on a TPU, as on CUDA."""
    raise RuntimeError(
        "Expected all tensors to be on the same device, but found at least two devices, "
        f"tpu:0 and cpu! (when running {func.__name__} on the tpu-migrate TorchTPU stand-in)"
    )


def _check_group_serves_tpu(args):
    """A collective on tpu tensors needs a group with a backend for the `tpu` device (tpu_dist):
    c10d asks the group for it and raises, as it does for TorchTPU's tensors, where the group was
    made with another backend only (`new_group(backend="gloo")`). Here gloo would carry them."""
    for value in args:
        if isinstance(value, torch.ScriptObject) and value._type().qualified_name().endswith(".ProcessGroup"):
            group = torch.distributed.ProcessGroup.unbox(value)
            group._get_backend(torch.device("tpu"))  # "No backend type associated with device type tpu"


def _factory_fallback(op, *args, **kwargs):
    """Factory ops asked for `device="tpu"`: made on the CPU, returned on the device."""
    device = kwargs.get("device")
    if device is not None:
        check_index(device)
        kwargs = dict(kwargs, device=_CPU)
    kwargs.pop("pin_memory", None)
    result = op(*args, **kwargs)
    return pytree.tree_map(
        lambda value: TpuTensor(value) if isinstance(value, torch.Tensor) else value, result
    )


_libraries = []  # torch.library registrations live as long as their Library object


def _copy_from(source, destination, non_blocking=False):
    """copy_ into a tpu tensor where the Python key is off (torch.tensor(data, device="tpu"))."""
    inner = lambda value: value._inner if isinstance(value, TpuTensor) else value
    if isinstance(source, TpuTensor) and not isinstance(destination, TpuTensor):
        events.emit("copy", "_copy_from")
    inner(destination).copy_(inner(source))
    return destination


def install_factories():
    fallback = torch.library.Library("_", "IMPL")
    fallback.fallback(_factory_fallback, "PrivateUse1")
    copies = torch.library.Library("aten", "IMPL")
    copies.impl("_copy_from", _copy_from, "PrivateUse1")
    _libraries.extend((fallback, copies))
