"""Turn the recorded evidence into findings: recompiles, host syncs, dynamic shapes, fallbacks.

Each finding is tied to the user's line and deduplicated by (kind, file, line, op), with a count,
the first step it was seen and, in multi-process programs, the rank.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from dataclasses import dataclass, field

from tpu_migrate.diagnose.runner import Evidence
from tpu_migrate.diagnose.tracer import is_library

KINDS = ("recompile", "sync", "dynamic-shape", "fallback", "compile")
FRAME = re.compile(r"^\s+(?P<fn>.+?) \((?P<file>.+):(?P<line>\d+)\)$")
HOST_READ_CAUSE = "most likely user code trying to access tensor value"


@dataclass
class Compile:
    offset: int
    cause: str
    graph_hash: str | None
    file: str | None
    line: int | None
    step: int = 0


@dataclass
class Finding:
    kind: str
    file: str
    line: int
    count: int
    first_step: int
    op: str | None
    rank: int | None
    message: str
    explanation: str | None = None
    steps: set = field(default_factory=set, repr=False)

    def to_json(self) -> dict:
        return {"kind": self.kind, "file": self.file, "line": self.line, "count": self.count,
                "first_step": self.first_step, "op": self.op, "rank": self.rank,
                "message": self.message, "explanation": self.explanation}


def parse_compiles(log: bytes) -> list[Compile]:
    """The "Compilation Analysis" blocks of PT_XLA_DEBUG_FILE, with their byte offsets."""
    compiles = []
    marker = b"Compilation Analysis: Compilation Cause"
    start = log.find(marker)
    while start != -1:
        end = log.find(marker, start + 1)
        block = log[start : end if end != -1 else len(log)].decode("utf-8", "replace")
        lines = [l.split("Compilation Analysis:", 1)[1] for l in block.splitlines()
                 if l.startswith("Compilation Analysis:")]
        cause = lines[1].strip() if len(lines) > 1 else ""
        graph_hash = next((l.split(":", 1)[1].strip() for l in lines if "Graph Hash:" in l), None)
        file = line = None
        if "Python Frame Triggered Execution:" in block:
            frames_at = next(i for i, l in enumerate(lines) if "Python Frame Triggered Execution" in l)
            for text in lines[frames_at + 1 :]:
                match = FRAME.match(text)
                if match and not is_library(match["file"]):
                    file, line = os.path.abspath(match["file"]), int(match["line"])
                    break
        compiles.append(Compile(start, cause, graph_hash, file, line))
        start = end
    return compiles


def _process_steps(events: list[dict]) -> tuple[int, list[int]]:
    """Steps the process ran, and the debug-log offsets at which its steps ended."""
    boundaries = [e for e in events if e["kind"] == "step"]
    if boundaries:
        return len(boundaries), [e.get("debug_offset", 0) for e in boundaries]
    return sum(1 for e in events if e["kind"] == "opt_step"), []


def _rank(events: list[dict], fallback: int | None) -> int | None:
    ends = [e for e in events if e["kind"] == "end"]
    if ends and ends[-1].get("rank") is not None:
        return ends[-1]["rank"]
    return fallback


def analyze(evidence: Evidence, warmup_steps: int) -> tuple[list[Finding], int]:
    """Findings (worst first) and the number of steps (of the process that ran the most)."""
    findings: dict[tuple, Finding] = {}
    processes = sorted(evidence.events.items())
    multi = len(processes) > 1
    main_steps = 0
    compile_process = None
    for index, (pid, events) in enumerate(processes):
        steps, offsets = _process_steps(events)
        main_steps = max(main_steps, steps)  # spawned workers run the steps
        if offsets and any(offsets) and compile_process is None:
            compile_process = (pid, offsets)
        rank = _rank(events, index if multi else None)
        for event in events:
            kind = {"sync": "sync", "dynamic": "dynamic-shape", "fallback": "fallback"}.get(event["kind"])
            if kind is None or event.get("file") is None:
                continue
            _add(findings, kind, event["file"], event["line"], event["op"], event["step"], rank,
                 event.get("count", 1))
    if evidence.debug_log:
        offsets = compile_process[1] if compile_process else []
        _add_compiles(findings, parse_compiles(evidence.debug_log), offsets, warmup_steps)
    result = [f for f in findings.values() if _reportable(f)]
    for finding in result:
        finding.message, finding.explanation = describe(finding)
    order = {kind: i for i, kind in enumerate(KINDS)}
    result.sort(key=lambda f: (order[f.kind], -f.count, f.file, f.line))
    return result, main_steps


def _add(findings, kind, file, line, op, step, rank, count=1):
    key = (kind, file, line, op, rank)
    finding = findings.get(key)
    if finding is None:
        finding = findings[key] = Finding(kind, file, line, 0, step, op, rank, "")
    finding.count += count
    finding.first_step = min(finding.first_step, step)
    finding.steps.add(step)


def _add_compiles(findings, compiles: list[Compile], offsets: list[int], warmup_steps: int) -> None:
    """A site that compiled before and compiles again after warm-up recompiles; a first compile
    of a new site after warm-up is reported as information (kind "compile")."""
    seen: dict[tuple, int] = defaultdict(int)
    for compile_ in compiles:
        compile_.step = sum(1 for offset in offsets if offset <= compile_.offset)
        if compile_.file is None:
            continue
        site = (compile_.file, compile_.line)
        if compile_.step >= warmup_steps:
            kind = "recompile" if seen[site] else "compile"
            op = "host read" if compile_.cause.startswith(HOST_READ_CAUSE) else None
            _add(findings, kind, compile_.file, compile_.line, op, compile_.step, None)
        seen[site] += 1


def _reportable(finding: Finding) -> bool:
    if finding.kind == "sync":
        return len(finding.steps) >= 2  # inside the step loop: it recurs step after step
    return True


def describe(f: Finding) -> tuple[str, str]:
    where = f"{f.file}:{f.line}"
    if f.kind == "recompile":
        message = f"recompiled {f.count} time(s) after warm-up at {where} (first in step {f.first_step})"
        if f.op == "host read":
            return message, ("A host read of a tensor before the step's sync (.item(), print, bool()) "
                             "cuts the lazy graph here, and the cut moves with pending work: read the "
                             "value after torch_xla.sync(), or in xm.add_step_closure.")
        return message, ("The graph traced at this line changed after warm-up. Usual causes: an "
                         "input whose shape changes (a shorter last batch: DataLoader(drop_last=True); "
                         "variable sequence lengths: pad or bucket them), or a Python number that "
                         "changes every step and is baked into the graph (pass it as a tensor).")
    if f.kind == "compile":
        return (f"first compile of a new graph after warm-up at {where} (step {f.first_step})",
                "Information: a graph first seen after warm-up, such as an evaluation step. "
                "Expected once; if it repeats it is reported as a recompile.")
    if f.kind == "sync":
        method = f.op.strip("_")
        return (f"host sync `{method}` at {where}: {f.count} time(s) in {len(f.steps)} steps",
                "The host waits for the device to finish before it can read the value, every "
                "step. Log less often, accumulate on the device and read every N steps, or move "
                "the read into xm.add_step_closure.")
    if f.kind == "dynamic-shape":
        return (f"data-dependent shape `{f.op}` at {where}: {f.count} time(s)",
                "The output's shape depends on the values, so XLA cannot compile it ahead: it "
                "runs on the CPU with a device round trip, and shapes that differ recompile. "
                "Prefer fixed-shape forms: torch.where(mask, x, 0), masked sums, padding to a "
                "maximum size.")
    return (f"`{f.op}` fell back to the CPU {f.count} time(s) in the step ending at {where}",
            f"{f.op} has no XLA lowering: it ran on the CPU, with a copy to the host and back. "
            "Replace it with an op that has one, or move it out of the training step.")
