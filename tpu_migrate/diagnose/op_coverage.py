"""Op coverage for `diagnose`'s native backend: the aten ops TorchTPU 0.2.0 cannot run
(rules/torchtpu-ops.json), seen by a TorchDispatchMode during the warm-up steps and one step after
them, and in each graph Dynamo captures (run once more on fake tensors of our own).

`OpCoverage` is a part of native.NativeHooks (which holds the recorder, the device types and the
places of reads); the functions here need none of it.
"""

from __future__ import annotations

import functools
import json
import os
import re

from tpu_migrate.diagnose import recording
from tpu_migrate.diagnose.dynamo_hooks import dynamo_skips
from tpu_migrate.diagnose.events import DynamoEvent, Kind
from tpu_migrate.diagnose.modes import leave_dispatch_mode


def op_table() -> dict[str, str]:
    """Aten overload -> how TorchTPU 0.2.0 runs it ("device", "composite-explicit",
    "composite-implicit" or "none"); empty when the table is missing."""
    from tpu_migrate.rules import rules_dir

    try:
        with open(os.path.join(rules_dir(), "torchtpu-ops.json"), encoding="utf-8") as handle:
            return json.load(handle)["ops"]
    except (OSError, ValueError, KeyError):
        return {}



class OpCoverage:
    """The op-coverage part of native.NativeHooks."""

    def _coverage_mode(self, found):
        """A dispatch mode that calls `found(op name, args)` for each op TorchTPU cannot run, or
        None without the op table."""
        if self.table is None:
            self.table = op_table()
        table = self.table
        if not table:
            return None
        from torch.utils._python_dispatch import TorchDispatchMode

        verdicts = self.verdicts  # OpOverload -> its name if TorchTPU cannot run it, else ""

        class OpCoverageMode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                key = verdicts.get(func)
                if key is None:
                    key = verdicts[func] = unsupported_on_tpu(func, table)
                if key:
                    found(key, args)
                return func(*args, **(kwargs or {}))

        return OpCoverageMode()

    def _start_op_coverage(self) -> None:
        def found(key, args):
            if self._on_device(args):
                self.recorder.at_user_line(Kind.UNSUPPORTED, key, 4)

        self.mode = self._coverage_mode(found)
        if self.mode is not None:
            self.mode.__enter__()

    def _graph_ops_wrapper(self, original):
        hooks = self

        @functools.wraps(original)
        def call_user_compiler(output_graph, gm, example_inputs, *args, **kwargs):
            try:
                hooks._check_graph(gm, example_inputs)
            except Exception:  # noqa: BLE001 - never break the compile we observe
                pass
            return original(output_graph, gm, example_inputs, *args, **kwargs)

        return dynamo_skips(call_user_compiler)


    def _check_graph(self, gm, example_inputs) -> None:
        """The ops of a graph Dynamo captured, at the aten level AOTAutograd hands a backend
        (forward and backward), run on fresh fake tensors so that nothing Dynamo compiles or
        holds changes. Each op is placed at the user's line the graph node came from."""
        import torch
        from torch._subclasses.fake_tensor import FakeTensorMode

        node = [None]
        call_site = recording.user_frame(3)
        found_ops: set = set()

        def found(key, args):
            file, line = _node_line(node[0]) or call_site
            if file is not None and (key, file, line) not in found_ops:
                found_ops.add((key, file, line))
                self.recorder.emit(DynamoEvent(kind=Kind.UNSUPPORTED, op=key, file=file, line=line,
                                               reason="compiled"))

        coverage = self._coverage_mode(found)
        if coverage is None:
            return
        fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
        inputs = [_fresh_fake(fake_mode, t) for t in example_inputs]

        class Runner(torch.fx.Interpreter):
            def run_node(self, n):
                node[0] = n
                return super().run_node(n)

        with fake_mode, coverage:
            outputs = Runner(gm).run(*inputs)
            node[0] = None  # backward ops: the line that called the compiled code
            leaves = [o for o in torch.utils._pytree.tree_leaves(outputs)
                      if isinstance(o, torch.Tensor) and o.requires_grad]
            wants = [i for i in inputs if isinstance(i, torch.Tensor) and i.requires_grad]
            if leaves and wants:
                torch.autograd.grad(leaves, wants, [torch.ones_like(o) for o in leaves], allow_unused=True)

    def _stop_op_coverage(self) -> None:
        leave_dispatch_mode(self.mode)
        self.mode = None

    def _on_device(self, args) -> bool:
        if self.cpu_stands_in:
            return True
        Tensor = self.torch.Tensor
        return any(isinstance(a, Tensor) and a.device.type in self.device_types for a in args)



# CPU-only kernels that a TPU never dispatches: the op it dispatches instead, when one is known.
TPU_INSTEAD = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": "aten::_scaled_dot_product_fused_attention_overrideable",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward":
        "aten::_scaled_dot_product_fused_attention_overrideable_backward",
}
CPU_ONLY = re.compile(r"^aten::(?:_?mkldnn_|_?mkl_|_?fbgemm_|.*_for_cpu(?:_|$|\.))")


def unsupported_on_tpu(func, table: dict[str, str]) -> str:
    """The name of the aten op a TPU would dispatch for `func` if TorchTPU cannot run it, else "".
    Ops run as the CPU dispatches them: where the CPU picks a kernel of its own (SDPA's
    flash-attention-for-CPU), the TPU picks its own, so the op checked is the TPU's, and a
    CPU-only kernel with no known TPU counterpart is never reported missing."""
    name, overload = func._schema.name, func._overloadname
    key = name if overload == "default" else f"{name}.{overload}"
    key = TPU_INSTEAD.get(key, key)
    if CPU_ONLY.match(key):
        return ""
    return key if table.get(key) == "none" else ""


def _node_line(node) -> tuple[str, int] | None:
    """The user's line an FX node of a Dynamo graph came from (its recorded stack trace)."""
    trace = node.meta.get("stack_trace") if node is not None else None
    for file, line in reversed(STACK_LINE.findall(trace or "")):
        if not recording.is_library(file):
            return os.path.abspath(file), int(line)
    return None


STACK_LINE = re.compile(r'File "([^"]+)", line (\d+)')


def _fresh_fake(fake_mode, value):
    """A fake tensor like Dynamo's example input, in our own fake mode (sizes as hinted)."""
    import torch

    if isinstance(value, torch.SymInt):
        return value.node.hint
    if not isinstance(value, torch.Tensor):
        return value
    size = [int(s.node.hint) if isinstance(s, torch.SymInt) else s for s in value.size()]
    stride = [int(s.node.hint) if isinstance(s, torch.SymInt) else s for s in value.stride()]
    with fake_mode:
        fresh = torch.empty_strided(size, stride, dtype=value.dtype, device=value.device)
    return fresh.requires_grad_(value.requires_grad) if value.dtype.is_floating_point else fresh
