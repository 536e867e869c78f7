"""The kinds of finding `diagnose` reports: one table that the analysis, the CLI (`--fail-on`,
`explain`), the pytest plugin and the SARIF / GitHub formats all read.

The table's order is the report's: findings are listed by kind in this order.
"""

from __future__ import annotations

from dataclasses import dataclass

SEVERITIES = ("error", "warning", "note")  # SARIF's levels
GITHUB_LEVELS = {"error": "error", "warning": "warning", "note": "notice"}  # workflow commands


@dataclass(frozen=True)
class FindingKind:
    name: str
    summary: str  # one line: SARIF's shortDescription
    explanation: str  # What / Why / How to fix (`tpu-migrate explain KIND`)
    severity: str  # one of SEVERITIES
    backends: tuple[str, ...]  # the backends that report it: "xla", "native"

    @property
    def fails(self) -> bool:
        """--fail-on and the pytest marker count it (information never fails a run)."""
        return self.severity != "note"


CATALOG = (
    FindingKind(
        "recompile",
        "A line whose graph compiled before compiles again after warm-up.",
        "**What.** A line whose graph compiled before compiles again after the warm-up steps "
        "(torch_xla), or a function that torch.compile traced again because a guard failed "
        "(native: Dynamo's own reason, at the compiled function's `def` line).\n\n"
        "**Why.** Compiling takes seconds to minutes, and a graph that keeps changing keeps "
        "compiling: the step that recompiles is that much slower, every time.\n\n"
        "**How to fix.** Keep shapes fixed (DataLoader(drop_last=True), pad or bucket variable "
        "lengths), pass numbers that change every step as tensors, and read tensor values after "
        "the step's sync (a host read before it cuts the graph).",
        "warning", ("xla", "native")),
    FindingKind(
        "recompile-limit",
        "torch.compile hit its recompile limit and runs the function eagerly.",
        "**What.** Dynamo recompiled a function until its recompile limit (8) and gave up on "
        "it.\n\n"
        "**Why.** From then on the function runs eagerly, silently: it is no longer compiled.\n\n"
        "**How to fix.** Remove the cause of the recompiles (see the recompile findings) rather "
        "than raising the limit.",
        "warning", ("native",)),
    FindingKind(
        "graph-break",
        "torch.compile splits the function at this line (a Dynamo graph break).",
        "**What.** torch.compile splits the function at this line: the code before and after "
        "compiles as separate graphs, with Dynamo's reason, its id (GB0124) and hint.\n\n"
        "**Why.** The line runs in Python between the graphs, every call; a host read there "
        "(.item(), print, `if tensor`) also waits for the device.\n\n"
        "**How to fix.** Keep the line out of the compiled function, or follow Dynamo's hint and "
        "the graph-break page.",
        "warning", ("native",)),
    FindingKind(
        "sync",
        "The host waits for the device to read a tensor value, step after step.",
        "**What.** A host read of a device tensor (.item(), .tolist(), .cpu(), .numpy(), bool(), "
        "print) that happens step after step; reads seen in one step only are listed in a note.\n\n"
        "**Why.** The host waits for the device to finish all queued work before it can read "
        "the value, every step (and under torch_xla it cuts the step's lazy graph).\n\n"
        "**How to fix.** Log less often: accumulate on the device and read every N steps, or "
        "move the read into xm.add_step_closure.",
        "warning", ("xla", "native")),
    FindingKind(
        "dynamic-shape",
        "An op whose output shape depends on the data.",
        "**What.** An op whose output's shape depends on the values: nonzero, masked_select, "
        "unique, boolean-mask indexing.\n\n"
        "**Why.** The host waits for the device to learn the shape; XLA cannot compile it ahead, "
        "and under torch.compile it breaks the graph or recompiles per shape.\n\n"
        "**How to fix.** Prefer fixed-shape forms: torch.where(mask, x, 0), masked sums, padding "
        "to a maximum size.",
        "warning", ("xla", "native")),
    FindingKind(
        "fallback",
        "An op with no XLA lowering ran on the CPU.",
        "**What.** An op with no XLA lowering (aten::linalg_eig, say) ran on the CPU, at the line "
        "that called it (or where its step ended; --explain records every call's line).\n\n"
        "**Why.** Each call copies its inputs to the host and its result back, and splits the "
        "step's graph.\n\n"
        "**How to fix.** Replace it with an op that has a lowering, or move it out of the "
        "training step.",
        "warning", ("xla",)),
    FindingKind(
        "unsupported-op",
        "An aten op TorchTPU cannot run on the tpu device.",
        "**What.** An aten op TorchTPU 0.2.0 has no kernel for on the tpu device, and no "
        "composite kernel covers (rules/torchtpu-ops.json), seen in the sampled warm-up steps or "
        "in a graph torch.compile captured.\n\n"
        "**Why.** On TorchTPU it raises \"operator ... is not implemented for TPU\", or with "
        "enable_cpu_fallback runs on the CPU with a copy each way.\n\n"
        "**How to fix.** Replace it with a supported op, or compute it on CPU tensors outside "
        "the step.",
        "warning", ("native",)),
    FindingKind(
        "tpu-incompatible",
        "A call that raises on TorchTPU.",
        "**What.** A call that runs here but raises on TorchTPU: torch.compile(mode=...), "
        "dynamic=True, backend=\"inductor\", compiled code under torch.inference_mode(), "
        "processes started with the fork start method, "
        "torch.tpu.is_available() and its siblings, device indices tpu:N with N > 0.\n\n"
        "**Why.** The program stops with an error on a TPU.\n\n"
        "**How to fix.** Drop mode= and dynamic=True, pass backend='tpu' or none, use "
        "torch.no_grad() for inference, start "
        "processes with spawn, call torch.accelerator.* instead of torch.tpu.*, and use "
        "torch.device('tpu') with one process per device.",
        "warning", ("native",)),
    FindingKind(
        "compile",
        "A graph first compiled after warm-up, or changed once for a known reason (information).",
        "**What.** Information: a graph first compiled after warm-up (an evaluation step), a "
        "graph that changed once for a known reason (the optimizer created its state, an "
        "accumulator started as a Python number), or a second torch.compile graph for calls "
        "under torch.no_grad().\n\n"
        "**Why.** A one-time compile is expected; only one that repeats costs step after step, "
        "and that one is reported as a recompile.\n\n"
        "**How to fix.** Nothing, unless it repeats.",
        "note", ("xla", "native")),
    FindingKind(
        "closure-read",
        "A host read in an xm.add_step_closure callback, after the step ran (information).",
        "**What.** Information: a host read in an xm.add_step_closure callback.\n\n"
        "**Why.** The callback runs after the step's graph executed, so the read neither cuts "
        "the graph nor compiles; with run_async=False the host still waits for that step to "
        "finish before it traces the next one.\n\n"
        "**How to fix.** Nothing; throttle it (every N steps) if the wait shows.",
        "note", ("xla",)),
)

BY_NAME = {kind.name: kind for kind in CATALOG}
KINDS = tuple(BY_NAME)  # the report's order
INFO_KINDS = tuple(k.name for k in CATALOG if not k.fails)
FAIL_KINDS = tuple(k.name for k in CATALOG if k.fails)  # --fail-on's names, besides "any"


def documentation_order() -> list[FindingKind]:
    """The kinds torch_xla programs get (problems, then information), then those of the native
    backend only: the order of SARIF's rules array."""
    return sorted(CATALOG, key=lambda k: (k.backends == ("native",), not k.fails))
