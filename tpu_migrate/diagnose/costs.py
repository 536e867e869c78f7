"""What the findings cost, measured from the run: warm-up against steady state, and the time
each finding took. The report ranks what makes the program fail on TorchTPU first (an op with
no TPU kernel, a call that raises), then the rest by what fixing it saves.

- A step's wall time is the time between two step boundaries; steady state is the steps after
  warm-up, and a step slower than SLOW times their median is a slow step.
- A compile or recompile costs, first, the first calls of compiled code at the new input shapes
  it compiled for (the compiled-calls table: compile and first run, over a later call's time),
  in whichever step they came, step 0 and after the last step included; without such calls
  (torch_xla), the steps it compiled in over the steady-state median, or the compile time those
  steps (or the time after the last step) spent.
- A host read or a data-dependent shape costs the time the host waited in the call (the
  wrapper times each call). With the CPU standing in there is no device to wait for: each read
  waits for the work queued since the previous read, and removing it saves at most the overlap
  it loses, the shorter of the work before it and the work after it (analysis._mark_overlaps).
- Anything else is not timed by the backend: the report says so instead of a number.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from tpu_migrate.diagnose import compiled_calls
from tpu_migrate.diagnose.analysis import Finding, StepRecord, Summary, busiest_process
from tpu_migrate.diagnose.compiled_calls import CallSite
from tpu_migrate.diagnose.events import Event, Kind
from tpu_migrate.diagnose.locations import relative

SLOW = 1.5  # a step this many times the steady-state median is slow
MIN_STEADY = 3  # fewer steady steps give no median to compare with
COMPILE_KINDS = ("recompile", "compile")
WAIT_KINDS = ("sync", "dynamic-shape", "closure-read")
FAILS_KINDS = ("unsupported-op", "tpu-incompatible")  # the program stops there on TorchTPU


@dataclass
class Cost:
    seconds: float | None  # None: not measurable here (`why` says why); reads: what removing them saves at most
    share: float | None = None  # of the run's wall time
    why: str = ""
    steps: list[int] = field(default_factory=list)  # the slow steps it was in
    estimate: bool = False  # from the CPU standing in for the TPU, not measured on it
    waits: float | None = None  # estimated reads: the work queued before them, which they wait for
    fails: bool = False  # the program fails here on TorchTPU: ranked first, whatever else costs
    in_steps: bool = False  # the time its steps took over the median (_lost_together counts it per step)

    def text(self) -> str:
        if self.fails:
            return f"fails on TorchTPU, so it ranks first: {self.why}"
        if self.seconds is None:
            return f"cost not measured: {self.why}"
        share = f" ({_share(self.share)} of the run)" if self.share is not None else ""
        if self.waits is not None:
            return (f"estimated: waits for {_duration(self.waits)} in all; removing it saves at most "
                    f"{_duration(self.seconds)}{share}: {self.why}")
        what = "estimated cost" if self.estimate else "cost"
        return f"{what} {_duration(self.seconds)}{share}{': ' + self.why if self.why else ''}"

    def to_json(self) -> dict:
        return {"seconds": self.seconds, "share": self.share, "how": self.why,
                "slow_steps": self.steps, "estimate": self.estimate, "waits_seconds": self.waits,
                "fails_on_tpu": self.fails}


@dataclass
class RunCosts:
    run_seconds: float | None  # from the tracer's start to the process's end
    first_step_seconds: float | None
    compile_seconds: float
    compile_source: str
    steady_median: float | None
    steady_low: float | None  # 10th and 90th percentiles of steady-state step time
    steady_high: float | None
    slow_steps: dict[int, list[str]]  # step -> why it was slow (compile, sync, ...)
    headline: str = ""
    compiled_calls: list[CallSite] = field(default_factory=list)

    def lines(self) -> list[str]:
        first = "n/a" if self.first_step_seconds is None else _duration(self.first_step_seconds)
        lines = [f"warm-up: first step after {first}; compiling {_duration(self.compile_seconds)} "
                 f"({self.compile_source})"]
        if self.steady_median is None:
            lines.append(f"steady state: fewer than {MIN_STEADY} steady-state steps, no median")
        else:
            reasons: dict[str, int] = {}
            for why in self.slow_steps.values():
                for reason in why:
                    reasons[reason] = reasons.get(reason, 0) + 1
            because = ", ".join(f"{n} with {'' if r.startswith('no ') else 'a '}{r}" for r, n in reasons.items())
            lines.append(f"steady state: median step {_duration(self.steady_median)} (10-90%: "
                         f"{_duration(self.steady_low)}-{_duration(self.steady_high)}); "
                         f"{len(self.slow_steps)} step(s) slower than {SLOW}x the median"
                         + (f": {because}" if because else ""))
        if self.headline:
            lines.append(self.headline)
        return lines + compiled_calls.lines(self.compiled_calls)

    def to_json(self) -> dict:
        return {"run_seconds": self.run_seconds, "first_step_seconds": self.first_step_seconds,
                "compile_seconds": self.compile_seconds, "compile_source": self.compile_source,
                "steady_median_seconds": self.steady_median, "steady_p10_seconds": self.steady_low,
                "steady_p90_seconds": self.steady_high,
                "slow_steps": [{"step": s, "why": why} for s, why in sorted(self.slow_steps.items())],
                "summary": self.headline, "compiled_calls": [site.to_json() for site in self.compiled_calls]}


_duration = compiled_calls.duration


def _share(fraction: float) -> str:
    return f"{fraction:.0%}" if fraction >= 0.1 else f"{fraction:.1%}"


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(fraction * len(ordered)), len(ordered) - 1)]


def _why_slow(record: StepRecord) -> list[str]:
    reasons = [name for name, present in (
        ("compile", record.compiles or record.compile_seconds > 0.001), ("sync", record.syncs),
        ("fallback", record.fallbacks), ("dynamic shape", record.dynamic)) if present]
    return reasons or ["no recorded cause"]


def _run_times(events_by_process: dict[int, list[Event]], records: list[StepRecord]):
    """(run seconds, seconds to the first step) of the process with the most steps."""
    best = None
    for events in events_by_process.values():
        boundaries = [e for e in events if e["kind"] in (Kind.STEP, Kind.OPT_STEP) and "time" in e]
        if best is None or len(boundaries) > len(best[1]):
            best = (events, boundaries)
    if best is None:
        return None, None
    events, boundaries = best
    started = next((e["started"] for e in events if e["kind"] == Kind.BACKEND and "started" in e), None)
    ended = next((e["time"] for e in events if e["kind"] == Kind.END and "time" in e), None)
    if started is None:
        return None, None
    first = boundaries[0]["time"] - started if boundaries else None
    if ended is None:
        ended = boundaries[-1]["time"] if boundaries else None
    return (ended - started if ended is not None else None), first


def measure(summary: Summary, records: list[StepRecord], events_by_process: dict[int, list[Event]],
            backend: str, device: str | None) -> RunCosts:
    """Cost every finding (finding.cost), rank the findings costliest first (ties keep their
    order) and return what the run cost as a whole."""
    run_seconds, first = _run_times(events_by_process, records)
    steady = [r.seconds for r in records if r.index >= max(summary.warmup_end, 1)]
    median = statistics.median(steady) if len(steady) >= MIN_STEADY and any(steady) else None
    slow = ({r.index: _why_slow(r) for r in records
             if r.index >= max(summary.warmup_end, 1) and r.seconds > SLOW * median}
            if median else {})
    compile_steps: dict[int, int] = {}  # step -> compile findings in it (which share its cost)
    for f in summary.findings:
        if f.kind in COMPILE_KINDS:
            for step in f.steps:
                compile_steps[step] = compile_steps.get(step, 0) + 1
    sites = compiled_calls.collect(events_by_process)
    first_calls = _compiles_first_calls(summary.findings, sites)
    # (past the event limit the records stop early: no step is known to be after the last)
    after_last = (_compile_after_last_step(busiest_process(events_by_process), records)
                  if len(records) == summary.steps else 0.0)
    # A host read that recompiles compiles inside the read: its wait holds that compile.
    compiling_reads = {(f.file, f.line) for f in summary.findings if f.kind == "recompile" and f.op == "host read"}
    for f in summary.findings:
        f.cost = _finding_cost(f, records, median, compile_steps, backend, device,
                               first_calls.get(id(f), []), after_last)
        if f.kind == "sync" and f.cost.seconds is not None and (f.file, f.line) in compiling_reads:
            f.cost.why += ", including the recompiles at this line"
        if f.cost.seconds is not None and run_seconds:
            f.cost.share = f.cost.seconds / run_seconds
        f.cost.steps = sorted(s for s in f.steps if s in slow) if f.kind in COMPILE_KINDS else []
        f.message = f"{f.message}; {f.cost.text()}"
    # What fails on TorchTPU first, then what fixing saves most (stable: ties keep their order).
    summary.findings.sort(key=lambda f: (not f.cost.fails, -(f.cost.seconds or 0.0)))
    costs = RunCosts(run_seconds, first, _compile_seconds(records, events_by_process),
                     "torch_xla CompileTime" if backend == "xla" else "Dynamo compile time",
                     median, _percentile(steady, 0.1) if median else None,
                     _percentile(steady, 0.9) if median else None, slow,
                     compiled_calls=sites)
    lost = _lost_together(summary.findings, records, median, busiest_process(events_by_process))
    costs.headline = _headline(summary.findings, lost, run_seconds)
    return costs


def _places(f: Finding) -> set[str]:
    """The lines a compile finding's calls came from: its own, and its compiled function's callers."""
    return {f"{f.file}:{f.line}", *f.callers}


def _compiles_first_calls(findings: list[Finding], sites: list[CallSite]) -> dict[int, list]:
    """id(finding) -> the compiled-calls table's first calls that were its compiles, as (site,
    signature). Per compiled function, in the order the calls came, the first call that compiled
    is the function's warm-up; every later one that compiled goes to a compile finding at its
    call's place (a second graph for a new grad mode, which comes first there, as often as it
    compiled), else to the recompile there."""
    calls = sorted(((s.order, site, s) for site in sites for s in site.signatures if s.first_compiled),
                   key=lambda call: call[0])
    compiles = [f for f in findings if f.kind in COMPILE_KINDS and not f.traced]
    left = {id(f): f.count for f in compiles if f.kind == "compile"}
    warmed: set[str] = set()
    owned: dict[int, list] = {}
    for _, site, signature in calls:
        if site.function not in warmed:
            warmed.add(site.function)
            continue
        place = f"{site.file}:{site.line}"
        here = sorted((f for f in compiles if place in _places(f)), key=lambda f: f.kind != "compile")
        owner = next((f for f in here if left.get(id(f), 1) > 0), None)
        if owner is not None:
            owned.setdefault(id(owner), []).append((site, signature))
            if id(owner) in left:
                left[id(owner)] -= 1
    return owned


def _first_calls_cost(calls: list) -> Cost:
    seconds = sum(max(s.first_seconds - s.steady_seconds(site), 0.0) for site, s in calls)
    return Cost(seconds, why=f"the first calls at {len(calls)} new input shape(s) in the compiled-calls table, "
                             "over a later call's time (compile and first run)")


def _compile_after_last_step(events: list[Event], records: list[StepRecord]) -> float:
    """torch_xla's compile time after the last step (the `end` event's CompileTime over the last
    step boundary's): the compiles of generation or evaluation after training."""
    end = next((e for e in events if e["kind"] == Kind.END and "compile_time" in e), None)
    boundaries = [e for e in events if e["kind"] in (Kind.STEP, Kind.OPT_STEP) and "compile_time" in e]
    if end is None or not records:
        return 0.0
    return max(end["compile_time"] - (boundaries[-1]["compile_time"] if boundaries else 0.0), 0.0)


def _compile_seconds(records: list[StepRecord], events_by_process: dict[int, list[Event]]) -> float:
    """The compile time of the steps, or of the whole run where there are none (a generation or
    evaluation program: all of its compiles, which no step holds, of its busiest process)."""
    if records:
        return sum(r.compile_seconds for r in records)
    return max((sum(e.get("seconds", 0.0) for e in events if e["kind"] == Kind.COMPILE_TIME)
                for events in events_by_process.values()), default=0.0)


def _finding_cost(f: Finding, records: list[StepRecord], median: float | None,
                  compile_steps: dict[int, int], backend: str, device: str | None,
                  first_calls: list = (), after_last: float = 0.0) -> Cost:
    if f.kind in FAILS_KINDS:
        return Cost(None, fails=True, why=("TorchTPU has no kernel for it on the tpu device" if f.kind == "unsupported-op"
                                           else "the call raises there"))
    if f.kind in COMPILE_KINDS and not f.traced:
        return _compile_cost(f, records, median, compile_steps, first_calls, after_last)
    if f.kind in WAIT_KINDS:
        # The call's time is the CPU's compute: with the CPU standing in, and on the TorchTPU
        # stand-in (whose tpu device the CPU computes, op by op).
        if (backend == "native" and device == "cpu") or backend == "standin":
            if f.queued:
                return Cost(f.overlap or 0.0, estimate=True, waits=f.queued, why=(
                    "each read waits for the work queued since the previous read; without it the host would "
                    "queue the work after it meanwhile, so it saves at most the shorter of the two, read by "
                    "read (from the CPU run, which stood in for the TPU: a TPU computes faster, the host "
                    "still waits)"))
            return Cost(None, why="the CPU stands in for the TPU, so there is no device to wait for")
        if f.waited is not None:
            return Cost(f.waited, why="time the host waited in the call (removing it saves at most that)")
        return Cost(None, why=f"the {backend} backend does not time this call")
    if f.kind == "fallback" and backend == "xla":
        return Cost(None, why="torch_xla does not time the ops it runs on the CPU")
    return Cost(None, why=f"the {backend} backend does not time it")


def _compile_cost(f: Finding, records: list[StepRecord], median: float | None, compile_steps: dict[int, int],
                  first_calls: list, after_last: float) -> Cost:
    """A compile finding's cost from what was measured, whichever step it came in: its first calls
    in the compiled-calls table; else its steps over the steady-state median; else the compile
    time of its own recompiles (Dynamo's), or of its steps and of the time after the last step."""
    if first_calls:
        return _first_calls_cost(first_calls)
    inside = [records[s] for s in sorted(f.steps) if 0 < s < len(records)]
    if median is not None and inside and len(inside) == len(f.steps):
        compiled = sum(r.compile_seconds / compile_steps[r.index] for r in inside)
        over = sum(max(r.seconds - median, 0.0) / compile_steps[r.index] for r in inside)
        if over == 0.0:  # it compiled, within a step no slower than the others
            return Cost(0.0, in_steps=True, why=f"its {len(inside)} step(s) no slower than steady state, though "
                                                f"compiling {_duration(compiled)}")
        return Cost(over, in_steps=True, why=f"its {len(inside)} step(s) over the steady-state median, of which "
                                             f"compiling {_duration(compiled)}")
    if f.compile_seconds:
        return Cost(f.compile_seconds, why=f"Dynamo's compile time of its {f.count} compile(s)")
    total_steps = len(records)
    compiled = sum((records[s].compile_seconds if s < total_steps else after_last if s == total_steps else 0.0)
                   / compile_steps[s] for s in f.steps if 0 < s)
    if compiled:
        return Cost(compiled, why=f"compile time of its step(s), {_duration(compiled)}")
    return Cost(None, why="no compile time was recorded for it")


def _lost_together(findings: list[Finding], records: list[StepRecord], median: float | None,
                   events: list[dict]) -> float:
    """The time the costed findings lost together, each second once: a host read inside a step
    that a compile slowed is already in that step's time over the median, so a step counts the
    larger of the two. Reads the busiest process's events do not show one by one (another
    process, past the event limit) count as measured."""
    compiled: dict[int, float] = {}  # step -> time the compile findings in it lost
    for f in findings:
        if f.kind in COMPILE_KINDS and f.cost.seconds and f.cost.in_steps:
            for step in f.steps:
                if 0 < step < len(records):
                    record = records[step]
                    compiled[step] = max(record.seconds - median, 0.0) if median else record.compile_seconds
    reads = {(f.file, f.line, f.op) for f in findings if f.kind in WAIT_KINDS and f.cost.seconds}
    waited: dict[int, float] = {}  # step -> time the host waited in those reads
    # The records count optimizer steps when the program has no XLA step marker.
    step_key = "step" if any(e["kind"] == Kind.STEP for e in events) else "ostep"
    for event in events:
        if "wait" in event and (event.get("file"), event.get("line"), event.get("op")) in reads:
            step = event.get(step_key, 0)
            waited[step] = waited.get(step, 0.0) + event["wait"]
    unplaced = sum(f.cost.seconds for f in findings if f.kind in WAIT_KINDS and f.cost.seconds) - sum(waited.values())
    # A compile costed from its first calls or its compile time: its own time.
    own = sum(f.cost.seconds for f in findings if f.kind in COMPILE_KINDS and f.cost.seconds and not f.cost.in_steps)
    return (sum(max(compiled.get(step, 0.0), waited.get(step, 0.0)) for step in compiled.keys() | waited.keys())
            + max(unplaced, 0.0) + own)


def _headline(findings: list[Finding], lost: float, run_seconds: float | None) -> str:
    failing = [f for f in findings if f.cost.fails]
    fails = (f"{len(failing)} finding(s) fail on TorchTPU, fix them first (the {failing[0].kind} at "
             f"{relative(failing[0].file)}:{failing[0].line})" if failing else "")
    costed = [f for f in findings if f.cost.seconds]
    if not costed or not run_seconds:
        return fails
    top = costed[0]
    estimated = (" (reads estimated from the CPU run: what removing them saves at most)"
                 if any(f.cost.estimate for f in costed) else "")
    return (f"{fails}; " if fails else "") + (
        f"{len(costed)} finding(s) cost {_share(min(lost / run_seconds, 1.0))} of the run "
        f"({_duration(run_seconds)}){estimated}; the {top.kind} at {relative(top.file)}:{top.line} alone "
        f"{_share(top.cost.share)}")
