"""One finding of `diagnose`: a kind of problem at one user line, with what was measured about
it (analysis.py makes them, messages.py words them, costs.py prices them)."""

from __future__ import annotations

import linecache
from dataclasses import dataclass, field


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
    changed: str | None = field(default=None, repr=False)  # --explain: what changed in the graph
    reasons: list = field(default_factory=list, repr=False)  # native: each recompile's guard failure
    callers: list = field(default_factory=list, repr=False)  # native: the user's line of each recompile's call
    exact: bool = field(default=False, repr=False)  # a fallback at its own line (--explain)
    counted_steps: int = field(default=0, repr=False)  # steps seen in past the event limit, less one
    hint: str | None = field(default=None, repr=False)  # native graph break: Dynamo's hint
    placement_unknown: bool = field(default=False, repr=False)  # native sync: maybe a host tensor
    total_steps: int = field(default=0, repr=False)  # steps the program ran
    per_call: bool = field(default=False, repr=False)  # the program has no steps: counted per call
    # Found where the code is traced (a Dynamo graph break) or read (the source), not per call:
    # it recurs with every call whatever the count says.
    traced: bool = field(default=False, repr=False)
    runs_graph: bool = field(default=False, repr=False)  # a closure's read that ran a graph of its own
    waited: float | None = field(default=None, repr=False)  # seconds the host waited in its calls
    # The CPU standing in: seconds of work before its reads that a TPU would have queued.
    queued: float | None = field(default=None, repr=False)
    # Native: Dynamo's compile time of its recompiles (analysis._mark_compile_times).
    compile_seconds: float | None = field(default=None, repr=False)
    # The CPU standing in: seconds removing its reads could save at most (analysis._mark_overlaps).
    overlap: float | None = field(default=None, repr=False)
    # A read repeated at one line outside the step loop: "after the last", "before the first" or
    # "within one" (optimizer step); None for a read step after step.
    loop: str | None = field(default=None, repr=False)
    cost: object = field(default=None, repr=False)  # costs.Cost, once measured
    # Inside a library: the call the user's line made and the library line it happened at.
    via: list = field(default_factory=list, repr=False)
    # A read made inside library code: its count per library line ("path:line in function").
    library_reads: dict = field(default_factory=dict, repr=False)
    library_vias: dict = field(default_factory=dict, repr=False)  # library line -> its `via`

    @property
    def step_count(self) -> int:
        """The number of steps the finding was seen in."""
        return len(self.steps) + self.counted_steps

    def to_json(self) -> dict:
        document = {"kind": self.kind, "file": self.file, "line": self.line, "count": self.count,
                    "first_step": self.first_step, "op": self.op, "rank": self.rank,
                    "message": self.message, "explanation": self.explanation,
                    "source": linecache.getline(self.file, self.line).strip() or None,
                    "via": self.via}
        if self.library_reads:
            document["library_reads"] = dict(self.library_reads)
        if self.cost is not None:
            document["cost"] = self.cost.to_json()
        return document
