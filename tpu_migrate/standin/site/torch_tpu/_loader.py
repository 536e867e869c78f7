"""Sets the stand-in's `tpu` device up in this process, as TorchTPU's `_loader.load()` does on a TPU VM.

On a TPU VM, TorchTPU renames PrivateUse1 to "tpu", registers `torch.tpu`, the `tpu_dist`
backend, the `"tpu"` compile backend and autocast kernels, and patches `torch.compile`. The stand-in
does the same with the CPU computing (see the docstrings of `torch_tpu._standin.*`).
"""

import os
import sys

_LOADED = False


def load():
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    import torch

    version = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    if not (2, 11) <= version <= (2, 15):
        raise ImportError(
            f"the tpu-migrate TorchTPU stand-in needs torch 2.11 to 2.15, as torch-tpu 0.2.0 does; "
            f"this Python ({sys.executable}) has torch {torch.__version__}"
        )
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    from torch_tpu._standin import accelerator, amp, autograd, compile, distributed, public_api, tensor

    device_module = public_api.install()
    _setup_privateuseone_for_python_backend(
        rename="tpu",
        backend_module=device_module,
        hook=accelerator.Hooks(),
        device_guard=accelerator.DeviceGuard(),
    )
    sys.modules["torch.tpu"] = device_module
    accelerator.install()
    tensor.install_factories()
    amp.install()
    autograd.install()
    compile.install()
    distributed.install()
    if os.environ.get("TORCH_TPU_STANDIN_QUIET") != "1":
        print(
            "Successfully renamed PrivateUse1 backend to 'tpu' (tpu-migrate TorchTPU stand-in: "
            "the CPU computes)",
            file=sys.stderr,
        )
