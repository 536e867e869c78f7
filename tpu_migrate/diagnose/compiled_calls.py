"""The timings of compiled calls (call_timing.py's `call_time` events), per call site: the
first call at each new input signature (compile + run) apart from the later calls at a
signature already seen (steady state), never averaged together."""

from __future__ import annotations

from dataclasses import dataclass, field

from tpu_migrate.diagnose.events import Event, Kind
from tpu_migrate.diagnose.locations import relative

SHOWN_SIGNATURES = 4  # per call site in the text report (the JSON has them all)
SHOWN_INPUTS = 160  # characters of a signature in the text report


def duration(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


@dataclass
class SignatureTiming:
    inputs: str
    first_seconds: float  # the slowest process's first call
    first_compiled: bool
    later_calls: int = 0
    later_seconds: float = 0.0
    later_min_seconds: float | None = None
    later_compiled: int = 0
    processes: int = 1
    order: int = 0  # when its first call came, among the process's first calls (costs.py attributes them)

    def steady_seconds(self, site: "CallSite") -> float:
        """What a call at this shape costs once compiled: its fastest later call, or without one
        the fastest later call at the site's other shapes (0 without any)."""
        if self.later_min_seconds is not None:
            return self.later_min_seconds
        later = [t.later_min_seconds for t in site.signatures if t.later_min_seconds is not None]
        return min(later) if later else 0.0

    @property
    def later_mean(self) -> float | None:
        return self.later_seconds / self.later_calls if self.later_calls else None

    def to_json(self) -> dict:
        return {"inputs": self.inputs, "first_call_seconds": self.first_seconds,
                "first_call_compiled": self.first_compiled, "later_calls": self.later_calls,
                "later_mean_seconds": self.later_mean, "later_min_seconds": self.later_min_seconds,
                "later_calls_that_compiled": self.later_compiled, "processes": self.processes}


@dataclass
class CallSite:
    file: str
    line: int
    function: str
    signatures: list[SignatureTiming] = field(default_factory=list)

    @property
    def first_calls(self) -> int:
        return len(self.signatures)

    @property
    def first_seconds(self) -> float:
        return sum(s.first_seconds for s in self.signatures)

    @property
    def later_calls(self) -> int:
        return sum(s.later_calls for s in self.signatures)

    def lines(self) -> list[str]:
        compiled = sum(s.first_compiled for s in self.signatures)
        head = (f"  {relative(self.file)}:{self.line} {self.function}: {self.first_calls} first call(s) at a new "
                f"input shape, {duration(self.first_seconds)} in all ({compiled} compiled)")
        later = self.later_calls
        if later:
            mean = sum(s.later_seconds for s in self.signatures) / later
            head += f"; {later} later call(s) at a shape seen before, {duration(mean)} each on average"
        else:
            head += "; no call at a shape seen before (every call was a first)"
        lines = [head]
        for s in self.signatures[:SHOWN_SIGNATURES]:
            steady = (f"then {s.later_calls} x {duration(s.later_mean)}" if s.later_calls else "no later call")
            recompiled = f" ({s.later_compiled} of them compiled again)" if s.later_compiled else ""
            inputs = s.inputs if len(s.inputs) <= SHOWN_INPUTS else s.inputs[:SHOWN_INPUTS - 3] + "..."
            lines.append(f"    {inputs}: first {duration(s.first_seconds)}"
                         f"{' (compiled)' if s.first_compiled else ''}, {steady}{recompiled}")
        if len(self.signatures) > SHOWN_SIGNATURES:
            lines.append(f"    ... {len(self.signatures) - SHOWN_SIGNATURES} more input shape(s) (the JSON lists all)")
        return lines

    def to_json(self) -> dict:
        return {"file": self.file, "line": self.line, "function": self.function,
                "first_calls": self.first_calls, "first_calls_seconds": self.first_seconds,
                "later_calls": self.later_calls, "signatures": [s.to_json() for s in self.signatures]}


def collect(events_by_process: dict[int, list[Event]]) -> list[CallSite]:
    """The call sites of every process's `call_time` events, the costliest first calls first.
    A signature seen by several processes (ranks) keeps its slowest first call and adds up the
    later ones."""
    sites: dict[tuple, CallSite] = {}
    timings: dict[tuple, SignatureTiming] = {}
    for events in events_by_process.values():
        for order, event in enumerate(events):
            if event["kind"] != Kind.CALL_TIME or event.get("file") is None:
                continue
            site_key = (event["file"], event["line"], event["op"])
            site = sites.get(site_key)
            if site is None:
                site = sites[site_key] = CallSite(event["file"], event["line"], event["op"] or "?")
            key = (*site_key, event["inputs"])
            timing = timings.get(key)
            if timing is None:
                timing = timings[key] = SignatureTiming(event["inputs"], event["first_seconds"],
                                                        event["first_compiled"], processes=0, order=order)
                site.signatures.append(timing)
            elif event["first_seconds"] > timing.first_seconds:
                timing.first_seconds, timing.first_compiled = event["first_seconds"], event["first_compiled"]
            timing.processes += 1
            timing.later_calls += event["later_calls"]
            timing.later_seconds += event["later_seconds"]
            timing.later_compiled += event["later_compiled"]
            fastest = event["later_min_seconds"]
            if fastest is not None:
                timing.later_min_seconds = fastest if timing.later_min_seconds is None else min(
                    timing.later_min_seconds, fastest)
    return sorted(sites.values(), key=lambda s: -s.first_seconds)


def lines(sites: list[CallSite]) -> list[str]:
    if not sites:
        return []
    out = ["compiled calls (host time; a first call at a new input shape compiles and runs, a later "
           "call at a shape seen before only runs):"]
    for site in sites:
        out.extend(site.lines())
    return out
