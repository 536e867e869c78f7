"""Backward passes on the stand-in, without the GIL's 5 ms hand-offs.

The autograd engine runs a device's part of a backward pass on a thread of that device, and the
`tpu` device's ops are Python (TpuTensor.__torch_dispatch__), so that thread and the caller's
trade the GIL. At Python's default switch interval (5 ms) a small training step spent most of
its time waiting (bench_standin.py: backward 8 ms a step, 3 ms at 0.1 ms). The interval is
lowered for the backward pass only and put back after, so the program's own threads are
scheduled as they would be.
"""

import functools
import sys

import torch
import torch.autograd.graph

_BACKWARD_SWITCH_INTERVAL = 1e-4  # seconds


def _quick_hand_offs(run_backward):
    @functools.wraps(run_backward)
    def wrapper(*args, **kwargs):
        interval = sys.getswitchinterval()
        sys.setswitchinterval(min(interval, _BACKWARD_SWITCH_INTERVAL))
        try:
            return run_backward(*args, **kwargs)
        finally:
            sys.setswitchinterval(interval)

    return wrapper


def install():
    # torch.autograd took its own reference to the function when it imported it.
    wrapped = _quick_hand_offs(torch.autograd.graph._engine_run_backward)
    torch.autograd.graph._engine_run_backward = wrapped
    torch.autograd._engine_run_backward = wrapped
