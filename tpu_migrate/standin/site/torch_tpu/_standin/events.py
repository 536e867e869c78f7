"""Device-to-host transfers, as they happen: what a tracer needs to count host syncs exactly.

The stand-in knows which tensors live on the `tpu` device, so every transfer it reports is one a
TPU would make. Kinds:
  "read"     a value read on the host: `.item()`, `bool(t)`, `int(t)`, a tpu scalar used as a
             Python index (aten._local_scalar_dense)
  "copy"     a tensor copied to the host: `.cpu()`, `.to("cpu")`, `.tolist()`, `torch.save`,
             `cpu_tensor.copy_(tpu_tensor)`
  "dynamic"  an op whose output shape depends on the data (`nonzero`, `masked_select`, `unique`):
             the device must report the shape to the host before the program can go on
Listeners are called as listener(kind, op_name) on the thread that made the transfer.
"""

import collections

counts = collections.Counter()
_listeners = []


def add_listener(listener):
    _listeners.append(listener)


def remove_listener(listener):
    _listeners.remove(listener)


def emit(kind, op_name):
    counts[kind] += 1
    for listener in tuple(_listeners):
        listener(kind, op_name)
