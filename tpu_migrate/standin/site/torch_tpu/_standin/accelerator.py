"""`torch.accelerator` on the emulated TPU VM: one chip per process, seen as index 0.

torch answers `is_available`, `device_count` and `current_accelerator` from the backend module
(`torch.tpu`) and the hooks below. Two calls reach C++ parts that a Python backend cannot supply
(the guard's device switch and stream synchronization), so they are wrapped here to do what
TorchTPU does: `set_device_index(k)` for k != 0 raises TorchTPU's ValueError, and
`synchronize()` returns once the device's work is done (the CPU did it when it was dispatched).
`Tensor.pin_memory()` is a no-op (see pin_memory below).
"""

import contextlib
import functools

import torch


def bound_index_error(index):
    return ValueError(
        f"Cannot set TPU device to index {index}, current process is "
        "bound to device index 0. Changing the active TPU "
        "device within a process is not supported."
    )


class DeviceGuard(torch._C._acc.DeviceGuard):
    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


class Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self):
        return True

    def has_primary_context(self, index):
        return index == 0

    def is_built(self):
        return True


def _index(device):
    if isinstance(device, int):
        return device
    device = torch.device(device)
    return 0 if device.index is None else device.index


def install():
    accelerator = torch.accelerator
    original_set = accelerator.set_device_index
    original_synchronize = accelerator.synchronize

    @functools.wraps(original_set)
    def set_device_index(device, /):
        index = _index(device)
        if index >= 0 and index != 0:
            raise bound_index_error(index)
        original_set(device)

    @functools.wraps(original_synchronize)
    def synchronize(device=None, /):
        if device is not None and _index(device) != 0:
            raise bound_index_error(_index(device))

    @contextlib.contextmanager
    def device_index(device, /):
        if device is not None and _index(device) >= 0 and _index(device) != 0:
            raise bound_index_error(_index(device))
        yield

    def pin_memory(self, device=None):
        """Pinning only speeds up host-to-device copies, and here the device's memory is the host's:
        a DataLoader with pin_memory=True (PyTorch asks the tpu hooks for a pinned allocator, which a
        Python backend cannot give) runs with its batches as they are."""
        return self

    torch.Tensor.pin_memory = pin_memory
    accelerator.set_device_index = set_device_index
    accelerator.set_device_idx = set_device_index
    accelerator.synchronize = synchronize
    accelerator.device_index = device_index
