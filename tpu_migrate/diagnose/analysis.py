"""Turn the recorded evidence into findings: recompiles, host syncs, dynamic shapes, fallbacks.

Each finding is tied to the user's line and deduplicated by (kind, file, line, op), with a count,
the first step it was seen and, in multi-process programs, the rank. torch_xla's debug files are
read by xla_logs.py, what changed between two graphs by graph_change.py, and what each finding
says is written by messages.py.
"""

from __future__ import annotations

import bisect
import os
import re
from dataclasses import dataclass, field

from tpu_migrate.diagnose import causes
from tpu_migrate.diagnose.events import CountedEvent, Event, Kind, StepEvent
from tpu_migrate.diagnose.finding import Finding
from tpu_migrate.diagnose.graph_change import graph_change
from tpu_migrate.diagnose.kinds import KINDS
from tpu_migrate.diagnose.messages import describe
from tpu_migrate.diagnose.locations import exchange_of, library_location, relative
from tpu_migrate.diagnose.recording import is_shown_library
from tpu_migrate.diagnose.runner import Evidence
from tpu_migrate.diagnose.xla_logs import FRAME, Compile, parse_compiles, parse_fallbacks, parse_graphs

# Recorded event kind -> finding kind. Recompiles of the native backend come with Dynamo's
# reason; those of the xla backend come from torch_xla's compile log (parse_compiles).
EVENT_KINDS = {Kind.SYNC: "sync", Kind.DYNAMIC: "dynamic-shape", Kind.FALLBACK: "fallback",
               Kind.UNSUPPORTED: "unsupported-op", Kind.INCOMPATIBLE: "tpu-incompatible",
               Kind.GRAPH_BREAK: "graph-break", Kind.RECOMPILE_LIMIT: "recompile-limit",
               Kind.RECOMPILE: "recompile"}
HOST_READ_CAUSE = "most likely user code trying to access tensor value"
HOST_ONLY_NOTE = ("every tensor stayed on the host: the program put no tensor on the tpu device (it computes "
                  "on the CPU, e.g. with torch.device(\"cpu\")), and a host tensor's read waits for nothing, so "
                  "this run cannot show the host syncs, data-dependent shapes or unsupported ops of a TPU run. "
                  "For a meaningful report, put the model and the data on the TPU (torch.device(\"tpu\"), "
                  ".to(\"tpu\")), which the TorchTPU stand-in runs here, and diagnose again")
HOST_ONLY_NATIVE_NOTE = ("every tensor was judged a host tensor: the program puts every tensor it places on the CPU "
                         "(torch.device(\"cpu\")), so with the CPU standing in for the TPU no read waits for a "
                         "device, and this run cannot show the host syncs or data-dependent shapes of a TPU run. "
                         "For a meaningful report, set the device to the accelerator "
                         "(torch.accelerator.current_accelerator(), or torch.device(\"tpu\") as `tpu-migrate "
                         "rewrite` writes it) and diagnose again: on the tpu device the program runs on the TorchTPU "
                         "stand-in here, which counts its syncs exactly")
GRAD_MODE_GUARD = re.compile(r"GLOBAL_STATE changed: grad_mode\s*$")


def native_recompile_kind(reason: str | None) -> str:
    """A recompile because only the grad mode changed (evaluation under torch.no_grad) is one more
    graph, compiled once: information, like a first compile after warm-up."""
    return "compile" if reason and GRAD_MODE_GUARD.search(reason) else "recompile"


def step_boundaries(events: list[Event]) -> list[StepEvent]:
    """The events that end a step: XLA step markers, or without any, optimizer steps."""
    steps = [e for e in events if e["kind"] == Kind.STEP]
    return steps or [e for e in events if e["kind"] == Kind.OPT_STEP]


def _process_steps(events: list[Event]) -> tuple[int, list[StepEvent]]:
    """Steps the process ran, and the events that ended them. Without an XLA step marker,
    optimizer steps are the steps (and events are renumbered by them). Past the event limit
    the boundaries skip the steps that brought no news: their `step` field is the step."""
    boundaries = step_boundaries(events)
    counted = _counted(events)
    by_optimizer = (boundaries[0]["kind"] == Kind.OPT_STEP if boundaries else
                    counted is not None and counted["steps"] == 0 and counted["osteps"] > 0)
    if by_optimizer:
        for event in events:
            event["step"] = event.get("ostep", 0)
            if "in_osteps" in event:
                event["in_steps"] = event["in_osteps"]
            if event["kind"] == Kind.COUNTED:
                event["steps"] = event["osteps"]
    total = len(boundaries)
    for event in events:
        if event["kind"] in (Kind.COUNTED, Kind.END):
            total = max(total, event["steps"] if event["kind"] == Kind.COUNTED else event["step"])
    return total, boundaries


def _optimizer_steps(events: list[Event]) -> int:
    """How many optimizer steps the process took: its events carry the count so far (`ostep`),
    past the event limit too."""
    return max((max(e.get("ostep", 0) + (e["kind"] == Kind.OPT_STEP), e.get("osteps", 0)) for e in events),
               default=0)


def _counted(events: list[Event]) -> CountedEvent | None:
    """The `counted` event of a process that went past the event limit (events.read_events)."""
    return next((e for e in events if e["kind"] == Kind.COUNTED), None)


def _step_finder(boundaries: list[StepEvent], key: str, total: int):
    """offset -> the step in which a log (`key`: the boundaries' offset field) reached it: the
    first step at whose end the log was longer."""
    offsets = [b.get(key, 0) for b in boundaries]

    def step_at(offset: int) -> int:
        index = bisect.bisect_right(offsets, offset)
        return boundaries[index]["step"] if index < len(boundaries) else total

    return step_at


def _traced_something(events: list[Event]) -> bool:
    """Helper processes that ran no step and read nothing (torch.compile's compile workers, say)
    are not ranks of the program."""
    return any(e["kind"] not in (Kind.BACKEND, Kind.END, Kind.RANK) for e in events)


def _rank(events: list[Event], fallback: int | None) -> int | None:
    """The rank the process declared (RANK, PJRT_LOCAL_PROCESS_RANK, or its index from
    torch.multiprocessing.spawn, recorded when it started: a worker may never end by itself)."""
    for kind in (Kind.END, Kind.RANK):
        declared = [e["rank"] for e in events if e["kind"] == kind and e.get("rank") is not None]
        if declared:
            return declared[-1]
    return fallback


@dataclass
class StepRecord:
    """One step of the busiest process, for the timelines (terminal and HTML)."""

    index: int
    seconds: float
    compiles: int = 0
    syncs: int = 0
    dynamic: int = 0
    fallbacks: int = 0
    compile_seconds: float = 0.0  # torch_xla's CompileTime, or Dynamo's, in the step


def backend(evidence: Evidence) -> tuple[str, str | None]:
    """The backend that traced the program, and the device of a native run (cpu: no
    accelerator, the CPU stood in for the TPU)."""
    chosen = ("xla", None)
    for events in evidence.events.values():
        for event in events:
            if event["kind"] == Kind.BACKEND:
                chosen = (event["op"], event.get("device"))
    return chosen


def busiest_process(events_by_process: dict[int, list[dict]]) -> list[dict]:
    """The events of the process that ran the most steps: the one the timelines and costs read."""
    return max(events_by_process.values(), key=lambda e: len(step_boundaries(e)), default=[])


def step_records(evidence: Evidence) -> list[StepRecord]:
    """The steps recorded one by one (up to the event limit) of the process that ran the most."""
    events = busiest_process(evidence.events)
    boundaries = step_boundaries(events)
    by_optimizer = bool(boundaries) and boundaries[0]["kind"] == Kind.OPT_STEP
    counted = _counted(events)
    if counted is not None:
        boundaries = boundaries[: counted["ostep" if by_optimizer else "step"]]
    records = []
    previous = None
    compiled = 0.0
    for index, boundary in enumerate(boundaries):
        now = boundary.get("time")
        seconds = (now - previous) if (now is not None and previous is not None) else 0.0
        record = StepRecord(index, max(seconds, 0.0))
        if "compile_time" in boundary:
            record.compile_seconds = max(boundary["compile_time"] - compiled, 0.0)
            compiled = boundary["compile_time"]
        records.append(record)
        previous = now
    for event in events:
        step = event.get("ostep", 0) if by_optimizer else event.get("step", 0)
        if step < len(records) and "in_steps" not in event:
            if event["kind"] == Kind.COMPILE:
                records[step].compiles += 1
            elif event["kind"] == Kind.SYNC and not event.get("closure"):  # a step closure's: after the step
                records[step].syncs += 1
            elif event["kind"] == Kind.DYNAMIC:
                records[step].dynamic += 1
            elif event["kind"] == Kind.FALLBACK:
                records[step].fallbacks += event.get("count", 1)
            elif event["kind"] == Kind.COMPILE_TIME:
                records[step].compile_seconds += event["seconds"]
    offsets = [b.get("debug_offset", 0) for b in boundaries]
    for compile_ in parse_compiles(evidence.debug_log, evidence.debug_base) if evidence.debug_log else []:
        step = bisect.bisect_right(offsets, compile_.offset)
        if step < len(records):
            records[step].compiles += 1
    return records


def timeline(records: list[StepRecord]) -> str:
    """One character per step: C compile, d dynamic shape, f fallback, s host sync, . nothing."""
    def mark(r: StepRecord) -> str:
        return "C" if r.compiles else "d" if r.dynamic else "f" if r.fallbacks else "s" if r.syncs else "."

    return "".join(mark(r) for r in records)


@dataclass
class Summary:
    """What `analyze` found, and what the report must say about how it looked."""

    findings: list[Finding]
    steps: int  # of the process that ran the most
    warmup_end: int  # the first step after warm-up (later when optimizer state came late)
    notes: list[str] = field(default_factory=list)
    # Optimizer steps of that process: "steps" counts every step marker, evaluation included.
    optimizer_steps: int = 0
    # On the TorchTPU stand-in: no process made a tpu tensor, so nothing a TPU would do showed.
    host_only: bool = False


def steps_text(steps: int, optimizer_steps: int) -> str:
    """"104 steps, 80 optimizer steps": a step marker ends evaluation steps too, so the steps
    alone overstate the training (the issue's "129 steps" of a 32-step training run)."""
    if optimizer_steps and optimizer_steps != steps:
        return f"{steps} steps, {optimizer_steps} optimizer step{'s' if optimizer_steps != 1 else ''}"
    return f"{steps} steps"


def analyze(evidence: Evidence, warmup_steps: int) -> tuple[list[Finding], int]:
    """Findings (worst first) and the number of steps (of the process that ran the most)."""
    summary = summarize(evidence, warmup_steps)
    return summary.findings, summary.steps


def summarize(evidence: Evidence, warmup_steps: int) -> Summary:
    findings: dict[tuple, Finding] = {}
    processes = [(pid, events) for pid, events in sorted(evidence.events.items()) if _traced_something(events)]
    multi = len(processes) > 1
    main_steps = 0
    compile_process = None
    exact_fallbacks = bool(evidence.fallback_log)
    step_sites: dict[int, tuple] = {}  # step -> (file, line) where it ended, busiest process
    warmup = warmup_steps
    optimizer_steps = 0
    for index, (pid, events) in enumerate(processes):
        steps, boundaries = _process_steps(events)
        if steps >= main_steps:
            step_sites = {b["step"]: (b.get("file"), b.get("line")) for b in boundaries}
            optimizer_steps = _optimizer_steps(events)
        main_steps = max(main_steps, steps)  # spawned workers run the steps
        rank = _rank(events, index if multi else None)
        end = causes.warmup_end(events, warmup_steps)
        if any(b.get("debug_offset") for b in boundaries) and compile_process is None:
            compile_process = (rank, boundaries, steps, causes.expected_changes(events), end)
            warmup = end
        _mark_overlaps(events)
        _mark_compile_times(events)
        for event in events:
            _merge_event(findings, event, rank, exact_fallbacks)
    stepless = main_steps == 0
    if not evidence.debug_log and backend(evidence)[0] == "xla":
        _add_counted_compiles(findings, processes, warmup_steps)
    if evidence.debug_log:
        _add_logged_compiles(findings, evidence, compile_process, warmup_steps, multi, stepless)
    if exact_fallbacks:
        _add_exact_fallbacks(findings, evidence, main_steps)
    for finding in findings.values():
        if finding.kind == "sync":
            finding.counted_steps += causes.steps_of_one_call(finding.steps, step_sites, (finding.file, finding.line)) - len(finding.steps)
            finding.via = _busiest_via(finding) or finding.via
    _merge_exchange_reads(findings)
    for finding in findings.values():
        if finding.kind == "sync" and not stepless and finding.step_count == 1 and _repeats(finding):
            finding.loop = "after the last" if main_steps in finding.steps else (
                "before the first" if 0 in finding.steps else "within one")
    result = [f for f in findings.values() if _reportable(f, stepless)]
    notes = _notes(findings.values(), result, stepless, warmup, warmup_steps, processes)
    backend_name = backend(evidence)[0]
    kinds = {e["kind"] for events in evidence.events.values() for e in events}
    host_only = (backend_name == "standin" and Kind.DEVICE_TENSOR not in kinds) or Kind.HOST_ONLY in kinds
    if host_only:
        notes.insert(0, HOST_ONLY_NOTE if backend_name == "standin" else HOST_ONLY_NATIVE_NOTE)
    for finding in result:
        finding.total_steps = main_steps
        finding.per_call = stepless
        finding.message, finding.explanation = describe(finding, backend_name)
    order = {kind: i for i, kind in enumerate(KINDS)}
    # A read in every step before one in evaluation steps only, however often that one reads.
    result.sort(key=lambda f: (order[f.kind], -f.step_count if f.kind == "sync" else 0,
                               f.placement_unknown, -f.count, f.file, f.line))
    return Summary(result, main_steps, warmup, notes, optimizer_steps, host_only)


def _merge_event(findings: dict[tuple, Finding], event: Event, rank: int | None, exact_fallbacks: bool) -> None:
    """One event of a process into the finding of its kind and line."""
    kind = EVENT_KINDS.get(event["kind"])
    if kind is None or event.get("file") is None or (kind == "fallback" and exact_fallbacks):
        return
    if kind == "recompile":
        kind = native_recompile_kind(event.get("reason"))
    # A Dynamo recompile is one whatever the step: the first compile of a frame is its
    # warm-up, each later one is for guards that failed.
    if kind == "sync" and event.get("closure"):
        kind = "closure-read"
    finding = _add(findings, kind, event["file"], event["line"], event["op"], event["step"],
                   None if event.get("static") else rank, event.get("count", 1),
                   event.get("in_steps", 1))
    finding.changed = finding.changed or event.get("reason") or event.get("gb") or event.get("closure")
    if event.get("reason") and kind == "recompile":
        finding.reasons.append(event["reason"])
    if event.get("reason") and kind in ("recompile", "compile") and event.get("caller"):
        finding.callers.append(event["caller"])
    if "compile_seconds" in event:
        finding.compile_seconds = (finding.compile_seconds or 0.0) + event["compile_seconds"]
    finding.hint = finding.hint or event.get("hint")
    finding.via = finding.via or event.get("via", [])
    if kind == "sync" and event.get("via"):
        inner = event["via"][-1]
        finding.library_reads[inner] = finding.library_reads.get(inner, 0) + event.get("count", 1)
        finding.library_vias.setdefault(inner, event["via"])
    finding.placement_unknown |= event.get("placement") == "unknown"
    finding.exact = finding.exact or bool(event.get("exact"))
    finding.traced |= bool(event.get("traced"))
    finding.runs_graph |= bool(event.get("graph"))
    if "wait" in event:
        finding.waited = (finding.waited or 0.0) + event["wait"]
    if "queued" in event:
        finding.queued = (finding.queued or 0.0) + event["queued"]
    if "overlap" in event:
        finding.overlap = (finding.overlap or 0.0) + event["overlap"]


READ_KINDS = (Kind.SYNC, Kind.DYNAMIC)


def _mark_overlaps(events: list[Event]) -> None:
    """With the CPU standing in, each read's `overlap`: what removing it could save at most. A
    read makes the host wait for the work queued before it (`queued`, up to the previous read);
    without it, the host would go on to queue the work after it (up to the next read) while the
    device computed, so the two overlap by at most the shorter of them. The last read of a
    process has nothing measured after it: it could save nothing."""
    reads = [e for e in events if e["kind"] in READ_KINDS and "wait" in e]  # each moved the previous-read mark
    for read, following in zip(reads, reads[1:] + [None]):
        if "queued" in read:
            after = following.get("queued", 0.0) if following is not None else 0.0
            read["overlap"] = max(min(read["queued"], after), 0.0)


def _mark_compile_times(events: list[Event]) -> None:
    """Native: each recompile's own compile time (`compile_seconds`), from the compile Dynamo
    timed right after the guard failure that caused it, in whichever step it came (step 0, after
    the last step)."""
    pending = None
    for event in events:
        if event["kind"] == Kind.RECOMPILE:
            pending = event
        elif event["kind"] == Kind.COMPILE_TIME and pending is not None:
            pending["compile_seconds"] = event.get("seconds", 0.0)
            pending = None


def _repeats(finding: Finding) -> bool:
    """A read repeated at one line within one stretch between steps (before the first, after the
    last, or in one): a loop, when the user's line itself read more than once, or one library line
    did (generate's per-token stop check), never an exchange of values through the host."""
    if exchange_of(finding.via):
        return False
    if finding.library_reads:
        return max(finding.library_reads.values()) >= 2
    return finding.count >= 2


def _busiest_via(finding: Finding) -> list[str]:
    """The `via` of the library line that read most often (generate's per-token stop check, not
    the read that prepared it once)."""
    if not finding.library_reads:
        return []
    inner = max(finding.library_reads, key=finding.library_reads.get)
    return finding.library_vias.get(inner, [])


def _merge_exchange_reads(findings: dict[tuple, Finding]) -> None:
    """One xm.mesh_reduce call reads its value through several tensor methods (item, cpu, int):
    one finding per call line, not one per method."""
    groups: dict[tuple, list[tuple]] = {}
    for key, f in findings.items():
        if f.kind == "sync" and exchange_of(f.via):
            groups.setdefault((f.file, f.line, f.rank, exchange_of(f.via)), []).append(key)
    for (_, _, _, exchange), keys in groups.items():
        if len(keys) < 2:
            continue
        ops = [findings[k].op.strip("_") for k in keys]
        # The method read most often is read once per call, in the step the call began: the
        # exchange's own syncs end steps between its reads, which are still one call.
        keys.sort(key=lambda k: (-findings[k].count, findings[k].step_count))
        merged = findings[keys[0]]
        for key in keys[1:]:
            other = findings.pop(key)
            merged.first_step = min(merged.first_step, other.first_step)
            for inner, count in other.library_reads.items():
                merged.library_reads[inner] = merged.library_reads.get(inner, 0) + count
            merged.waited = None if merged.waited is None and other.waited is None else (
                (merged.waited or 0.0) + (other.waited or 0.0))
            for measured in ("queued", "overlap"):
                mine, theirs = getattr(merged, measured), getattr(other, measured)
                if theirs is not None:
                    setattr(merged, measured, (mine or 0.0) + theirs)
        merged.op = f"{exchange} ({', '.join(ops)})"


def _add_logged_compiles(findings, evidence: Evidence, compile_process, warmup_steps: int, multi: bool,
                         stepless: bool) -> None:
    """The compiles of torch_xla's debug log, which one process (the local master) writes."""
    rank, boundaries, steps, changes, end = compile_process if compile_process else (None, [], 0, {}, warmup_steps)
    graphs = parse_graphs(evidence.graphs) if evidence.graphs else {}
    _add_compiles(findings, parse_compiles(evidence.debug_log, evidence.debug_base), boundaries, steps, end,
                  graphs, rank if multi else None, changes, stepless,
                  _user_file_names(evidence) if graphs else frozenset())


def _add_exact_fallbacks(findings, evidence: Evidence, main_steps: int) -> None:
    """The CPU fallbacks of torch_xla's function tracker, each at its step."""
    boundaries = sorted((e for events in evidence.events.values() for e in events
                         if e["kind"] in (Kind.STEP, Kind.OPT_STEP) and e.get("fallback_offset")),
                        key=lambda e: e["fallback_offset"])
    step_at = _step_finder(boundaries, "fallback_offset", main_steps)
    for offset, op, file, line in parse_fallbacks(evidence.fallback_log, evidence.fallback_base):
        _add(findings, "fallback", file, line, op, step_at(offset), None).exact = True


def _notes(found, reported, stepless: bool, warmup: int, warmup_steps: int, processes) -> list[str]:
    """What the report says about how it looked: no steps, a longer warm-up, one-off reads."""
    notes = []
    if stepless:
        notes.append("no steps found (no torch_xla.sync / xm.mark_step / MpDeviceLoader batch, no "
                     "optimizer step): checked anyway, per call: recompiles (the first compile of "
                     "each line or compiled function is its warm-up, every later one is a "
                     "recompile), and host reads, data-dependent shapes and CPU fallbacks repeated "
                     "at the same line (a loop)")
    if warmup > warmup_steps:
        created = sorted({e["op"] for _, events in processes for e in events if e["kind"] == Kind.OPT_STATE})
        notes.append(f"warm-up extended to {warmup} steps: the {', '.join(created)} optimizer "
                     f"created its state in its first step, which changes the graph of the next "
                     f"step once")
    once = [f for f in found if f.kind == "sync" and f not in reported]
    if once:
        reads = ", ".join(f"{relative(f.file)}:{f.line} {f.op.strip('_')} x{f.count}"
                          for f in sorted(once, key=lambda f: (f.file, f.line))[:8])
        notes.append(f"host reads not repeated step after step (not findings): {reads}")
    return notes


def _add(findings, kind, file, line, op, step, rank, count=1, in_steps=1):
    """Count `count` occurrences, the first in `step`, seen in `in_steps` steps (a tally entry)."""
    key = (kind, file, line, op, rank)
    finding = findings.get(key)
    if finding is None:
        finding = findings[key] = Finding(kind, file, line, 0, step, op, rank, "")
    finding.count += count
    finding.first_step = min(finding.first_step, step)
    finding.steps.add(step)
    finding.counted_steps += in_steps - 1
    return finding


def _add_compiles(findings, compiles: list[Compile], boundaries: list[StepEvent], steps: int,
                  warmup_steps: int, graphs: dict[str, str], rank: int | None,
                  changes: dict[int, str] | None = None, stepless: bool = False,
                  user_files: frozenset[str] = frozenset()) -> None:
    """A site that compiled before and compiles again after warm-up recompiles; a first compile
    of a new site after warm-up is reported as information (kind "compile"), and so is a graph
    that changed once for a known reason (`changes`: optimizer state, an accumulator). Without
    steps, a site's first compile is its warm-up and each later one recompiles. A site is the
    user's line and the library frames under it (two graphs of one torch_xla call are two)."""
    previous: dict[tuple, str | None] = {}
    step_at = _step_finder(boundaries, "debug_offset", steps)
    changes = changes or {}
    for compile_ in compiles:
        compile_.step = step_at(compile_.offset)
        if compile_.file is None:
            continue
        site = (compile_.file, compile_.line, compile_.origin)
        if compile_.step >= warmup_steps or (stepless and site in previous):
            kind = "recompile" if site in previous else "compile"
            op = "host read" if compile_.cause.startswith(HOST_READ_CAUSE) else None
            expected = changes.get(compile_.step) if kind == "recompile" and not stepless else None
            if expected is not None:
                kind, op = "compile", "changed once"
            finding = _add(findings, kind, compile_.file, compile_.line, op, compile_.step, rank)
            finding.changed = finding.changed or expected
            finding.via = finding.via or _origin_via(compile_.origin)
            if kind == "recompile" and finding.changed is None and graphs:
                finding.changed = graph_change(graphs.get(previous[site] or ""), graphs.get(compile_.graph_hash or ""),
                                               user_files)
        previous[site] = compile_.graph_hash


def _origin_via(origin: str | None) -> list[str]:
    """The `via` of a compile from torch_xla's frames (innermost first) under the user's line,
    without the tool's wrappers."""
    frames = [FRAME.match(f" {text}") for text in (origin or "").split("|") if text]
    library = [library_location(m["file"], int(m["line"]), m["fn"]) for m in frames
               if m and is_shown_library(m["file"])]
    return list(dict.fromkeys(library[-1:] + library[:1]))


def _add_counted_compiles(findings, processes, warmup_steps: int) -> None:
    """Without torch_xla's compile analysis (in-process tracing): a step after warm-up whose
    UncachedCompile counter moved recompiled, at the line where the step ended."""
    for _, events in processes:
        boundaries = [e for e in events if e["kind"] == Kind.STEP and "compiles" in e]
        for previous, current in zip(boundaries, boundaries[1:]):
            delta = current["compiles"] - previous["compiles"]
            if delta > 0 and current["step"] >= warmup_steps and current.get("file"):
                _add(findings, "recompile", current["file"], current["line"], None, current["step"], None, delta)


def _user_file_names(evidence: Evidence) -> frozenset[str]:
    """The names of the program's own source files: those of its lines the events name, and
    the other Python files beside them (a model module whose lines made no event)."""
    directories = {os.path.dirname(e["file"]) for events in evidence.events.values() for e in events
                   if e.get("file")}
    names = set()
    for directory in directories:
        try:
            names.update(name for name in os.listdir(directory) if name.endswith(".py"))
        except OSError:
            continue
    return frozenset(names)


def _reportable(finding: Finding, stepless: bool = False) -> bool:
    if finding.traced:
        return True
    if finding.kind in ("sync", "dynamic-shape", "fallback") and stepless:
        return finding.count >= 2  # no steps: repeated at one line, in a loop
    if finding.kind == "sync":
        # Inside the step loop it recurs step after step; outside it (generate after training),
        # a loop of its own.
        return finding.step_count >= 2 or finding.loop is not None
    return True
