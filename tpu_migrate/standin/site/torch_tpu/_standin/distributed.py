"""The `tpu_dist` process-group backend (alias `tpu`), carried by gloo on the CPU.

A collective on tpu tensors reaches `TpuTensor.__torch_dispatch__`, which hands the CPU tensors
inside to the same op; this backend serves both device types, so gloo carries them and the tpu
tensors see the result in place. `init_process_group()` without a backend picks it for `tpu`, as
after TorchTPU's device init. Not modelled: TorchTPU's ZMQ handshake and its timeout.
"""

import torch.distributed as dist


def _create_process_group(store, rank, world_size, timeout):
    return dist.ProcessGroupGloo(store, rank, world_size, timeout)


def install():
    if not dist.is_available():
        return
    for name in ("tpu_dist", "tpu"):
        dist.Backend.register_backend(name, _create_process_group, devices=["tpu", "cpu"])
    dist.Backend.default_device_backend_map["tpu"] = "tpu_dist"
