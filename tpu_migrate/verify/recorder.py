"""What `verify` records inside each process of the program: per optimizer step, the losses
passed to `backward()` since the previous step, the learning rates, the squared norm of the
gradients the optimizer steps with (read just before the step) and a checksum of the
parameters (just after it).

Installed by the sitecustomize that `verify` puts on PYTHONPATH (runs.py), so every Python
process of the program records: xmp.spawn's and torchrun's workers as well. The hooks go in
when the program has imported torch (diagnose's after_import), and each process appends JSON
lines to a file of its own in $TPU_MIGRATE_VERIFY_DIR, one per optimizer step, before the step
returns (a process that dies later keeps what it recorded).

Each process also keeps what it prints on stdout (`stdout-*.txt`, named by its start time,
pid and launcher rank; printed.py compares the numbers in it), and a process that passed losses
to `backward()` but never stepped an optimizer (a hand-written update, a loop without an
optimizer) records them at exit, one per call, to be compared call by call.

Where the program does not seed torch's and Python's generators itself, they start from 0 in
every process of every run, and torch uses its deterministic algorithms: an unseeded program is
deterministic too (its own settings still win).

FSDP2 shards parameters and gradients (DTensors): their local shards' sums are recorded apart
(`*_sharded`), to be added over the ranks; the other tensors are whole in every rank.
Reading a value is a device sync; under torch_xla that cuts the graph where the program did
not, which changes no value beyond float rounding (verify's tolerance). On the TorchTPU stand-in
(a `tpu` device whose tensors the CPU computes) the values are read the same way: what it reads
are copies (`.cpu()`), never the program's tensors.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time

ENV_DIR = "TPU_MIGRATE_VERIFY_DIR"

_losses: list = []
_steps: dict[int, int] = {}  # id(optimizer) -> its last step's index, in order of first step
_pending: dict[int, tuple[float, float]] = {}  # id(optimizer) -> its gradients' squared norm


def install() -> None:
    directory = os.environ.get(ENV_DIR)
    if directory:
        from tpu_migrate.diagnose.tracer import after_import

        rank = os.environ.get("RANK", "-")  # a launcher's worker; "-": no launcher (or the launcher)
        sys.stdout = _Tee(sys.stdout, os.path.join(directory, f"stdout-{time.time_ns()}-{os.getpid()}-{rank}.txt"))
        import random

        random.seed(0)
        after_import("torch", lambda: _hook(os.path.join(directory, f"steps-{os.getpid()}.jsonl")))


class _Tee:
    """sys.stdout, also written to a file as it is printed (unbuffered: a process that dies
    keeps what it printed). A forked child (a DataLoader worker) prints to the terminal only."""

    def __init__(self, stream, path: str):
        self._stream = stream
        self._pid = os.getpid()
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def write(self, text):
        written = self._stream.write(text)
        if os.getpid() == self._pid and isinstance(text, str):
            os.write(self._fd, text.encode("utf-8", "replace"))
        return written

    def writelines(self, texts):
        for text in texts:
            self.write(text)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _hook(path: str) -> None:
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    backward = torch.Tensor.backward

    def recording_backward(self, *args, **kwargs):
        if self.numel() == 1:  # a loss (a tensor's backward needs a gradient argument)
            _losses.append(self.detach())
        return backward(self, *args, **kwargs)

    torch.Tensor.backward = recording_backward
    register_optimizer_step_pre_hook(_before_step)
    register_optimizer_step_post_hook(lambda optimizer, args, kwargs: _after_step(optimizer, path))
    atexit.register(_backward_only, path)
    # Before the program's code, which may set its own: its seed replaces this one, and its
    # use_deterministic_algorithms(False) this choice (warn_only: an op without a deterministic
    # kernel warns instead of failing the run).
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True, warn_only=True)


def _backward_only(path: str) -> None:
    """At exit, in a process that never stepped an optimizer: the losses of its backward() calls."""
    if _steps or not _losses:
        return
    rank, world = _rank_and_world()
    record = {"backward": [float(loss.float().cpu()) for loss in _losses], "rank": rank, "world": world}
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")


def _params(optimizer) -> list:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _sums(tensors, power: int) -> tuple[float, float]:
    """(sum over the whole tensors, sum over the DTensor shards this rank holds) of each
    element to `power`, in float64: one device read for each, per device the tensors are on
    (a model split between the host and a device: tensors of two devices do not stack)."""
    import torch

    whole, sharded = {}, {}
    for tensor in tensors:
        is_shard = hasattr(tensor, "placements") and hasattr(tensor, "to_local")
        local = (tensor.to_local() if is_shard else tensor).detach().to(torch.float64)
        (sharded if is_shard else whole).setdefault(local.device, []).append(
            (local if power == 1 else local.pow(power)).sum())
    return tuple(sum((float(torch.stack(sums).sum().cpu()) for sums in part.values()), 0.0)
                 for part in (whole, sharded))


def _before_step(optimizer, args, kwargs) -> None:
    _pending[id(optimizer)] = _sums([p.grad for p in _params(optimizer) if p.grad is not None], 2)


def _caller() -> str | None:
    """The program's line that stepped the optimizer (past torch's, libraries' and the tool's
    frames: xm.optimizer_step's caller), as `file:line: code`."""
    import linecache

    from tpu_migrate.diagnose.recording import user_frame

    filename, line = user_frame(2)
    if filename is None:
        return None
    return f"{os.path.basename(filename)}:{line}: {linecache.getline(filename, line).strip()}"


def _after_step(optimizer, path: str) -> None:
    key = id(optimizer)
    _steps[key] = _steps.get(key, -1) + 1
    grad_sq, grad_sq_sharded = _pending.pop(key, (0.0, 0.0))
    param_sum, param_sum_sharded = _sums(_params(optimizer), 1)
    losses = [float(loss.float().cpu()) for loss in _losses]
    _losses.clear()
    rank, world = _rank_and_world()
    record = {"optimizer": list(_steps).index(key), "step": _steps[key], "rank": rank, "world": world,
              "losses": losses, "lr": [float(group.get("lr", 0.0)) for group in optimizer.param_groups], "grad_sq": grad_sq, "grad_sq_sharded": grad_sq_sharded,
              "param_sum": param_sum, "param_sum_sharded": param_sum_sharded, "where": _caller()}
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")


def _rank_and_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
