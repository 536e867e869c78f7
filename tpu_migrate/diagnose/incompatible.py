"""Calls in the program's source that raise on TorchTPU but cannot even run here.

`torch.tpu.is_available()` and its siblings raise on TorchTPU when user code calls them (they are
internal to the framework there), and `"tpu:1"` names a device a TorchTPU process never sees (one
process per device, always index 0). Without torch_tpu installed neither runs on this machine,
so the native backend finds them in the source of the modules the program loaded, at exit.
"""

from __future__ import annotations

import ast
import re
import sys

from tpu_migrate.diagnose import recording
from tpu_migrate.diagnose.events import DynamoEvent, Kind

# torch.tpu.X -> what to call instead (torchtpu-target-api.md section 1.2)
LEGACY_DEVICE_API = {
    "is_available": "torch.accelerator.is_available()",
    "device_count": "torch.accelerator.device_count()",
    "current_device": "torch.accelerator.current_device_index()",
    "set_device": "torch.accelerator.set_device_index(i)",
    "synchronize": "torch.accelerator.synchronize()",
    "current_stream": "torch.accelerator.current_stream()",
    "set_stream": "torch.accelerator.set_stream(s)",
    "device": "torch.accelerator.device_index(i)",
    "get_rng_state": "torch.get_rng_state() / torch.manual_seed",
    "initial_seed": "torch.initial_seed()",
}
DEVICE_INDEX = re.compile(r"^tpu:([1-9]\d*)$")


def scan(source: str | bytes, filename: str = "<string>") -> list[tuple[int, str]]:
    """(line, problem) for each legacy torch.tpu call and each TPU device index above 0."""
    try:
        tree = ast.parse(source, filename)
    except (SyntaxError, ValueError):
        return []
    torch_names, tpu_names = {"torch"}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            torch_names.update(a.asname for a in node.names if a.name == "torch" and a.asname)
        elif isinstance(node, ast.ImportFrom) and node.module == "torch":
            tpu_names.update(a.asname or a.name for a in node.names if a.name == "tpu")
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _legacy_call(node.func, torch_names, tpu_names)
            if name is not None:
                problems.append((node.lineno, f"torch.tpu.{name}()"))
            elif _tpu_device_with_index(node, torch_names):
                problems.append((node.lineno, "device index tpu:N with N > 0"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and DEVICE_INDEX.match(node.value):
            problems.append((node.lineno, f"device index '{node.value}'"))
    return sorted(set(problems))


def _legacy_call(func, torch_names, tpu_names) -> str | None:
    if not isinstance(func, ast.Attribute) or func.attr not in LEGACY_DEVICE_API:
        return None
    owner = func.value
    if isinstance(owner, ast.Name) and owner.id in tpu_names:
        return func.attr
    if (isinstance(owner, ast.Attribute) and owner.attr == "tpu"
            and isinstance(owner.value, ast.Name) and owner.value.id in torch_names):
        return func.attr
    return None


def _tpu_device_with_index(call: ast.Call, torch_names) -> bool:
    """torch.device("tpu", N) with a literal N > 0."""
    func = call.func
    if not (isinstance(func, ast.Attribute) and func.attr == "device"
            and isinstance(func.value, ast.Name) and func.value.id in torch_names):
        return False
    args = call.args
    return (len(args) == 2 and isinstance(args[0], ast.Constant) and args[0].value == "tpu"
            and isinstance(args[1], ast.Constant) and isinstance(args[1].value, int) and args[1].value > 0)


def user_sources() -> list[str]:
    """The program's own files among the loaded modules (the script first)."""
    files = []
    for module in list(sys.modules.values()):
        filename = getattr(module, "__file__", None)
        if filename and filename.endswith(".py") and not recording.is_library(filename):
            files.append(filename)
    return sorted(set(files))


def report_sources(recorder: recording.Recorder) -> None:
    """At exit: one `incompatible` event per problem in the program's own files."""
    import os

    for filename in user_sources():
        try:
            with open(filename, "rb") as handle:
                source = handle.read()
        except OSError:
            continue
        if b"tpu" not in source:
            continue
        for line, problem in scan(source, filename):
            recorder.emit(DynamoEvent(kind=Kind.INCOMPATIBLE, op=problem, file=os.path.abspath(filename),
                                      line=line, static=True))
