"""The diagnose report: a rich table on stderr, and the JSON document."""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table

from tpu_migrate.diagnose.analysis import Finding, steps_text
from tpu_migrate.diagnose.kinds import KINDS
from tpu_migrate.diagnose.locations import relative, source_line, via_text
from tpu_migrate.printable import printable

JSON_VERSION = 1


def json_document(script: str, exit_code: int, steps: int, warmup_steps: int,
                  findings: list[Finding], rank: int | None = None, backend: str = "xla",
                  device: str | None = None, notes: list[str] | None = None, costs=None,
                  optimizer_steps: int = 0) -> str:
    document = {
        "version": JSON_VERSION,
        "script": script,
        "backend": backend,
        "exit_code": exit_code,
        "steps": steps,
        "optimizer_steps": optimizer_steps,
        "warmup_steps": warmup_steps,
        "findings": [f.to_json() for f in findings],
    }
    if device is not None:
        document["device"] = device
    if notes:
        document["notes"] = notes
    if rank is not None:
        document["rank"] = rank
    if costs is not None:
        document["costs"] = costs.to_json()
    return json.dumps(document, indent=2)


def print_report(console: Console, script: str, steps: int, warmup_steps: int,
                 findings: list[Finding], timeline: str = "", backend: str = "xla",
                 device: str | None = None, notes: list[str] | None = None, costs=None,
                 optimizer_steps: int = 0, host_only: bool = False) -> None:
    console.print(printable(f"tpu-migrate diagnose: {relative(script)} (backend {backend}, "
                            f"{steps_text(steps, optimizer_steps)}, {warmup_steps} warm-up)"),
                  style="bold", markup=False, highlight=False)
    if backend == "native" and device == "cpu":
        console.print("device: cpu - no accelerator here, so the CPU stands in for the TPU: the "
                      "findings are what would wait for, recompile on or fail on a TPU",
                      markup=False, highlight=False)
    if backend == "standin":
        console.print("device: tpu - the TorchTPU stand-in (the CPU computes for the tpu device): host syncs "
                      "and data-dependent shapes are the device's own transfers to the host, counted exactly; "
                      "costs are estimated from the CPU run", markup=False, highlight=False)
    if timeline:
        shown = timeline[:warmup_steps].lower() + "|" + timeline[warmup_steps:]
        if len(shown) > 120:
            shown = shown[:117] + "..."
        console.print(f"steps: {shown}   (C compile, d dynamic shape, f fallback, s host sync; "
                      "warm-up before |)", markup=False, highlight=False)
    for note in notes or ():
        console.print(printable(f"note: {note}"), markup=False, highlight=False)
    for line in costs.lines() if costs is not None else ():
        console.print(printable(line), markup=False, highlight=False)
    if not findings:
        if host_only:  # never "no host sync" for a run that put nothing on the device
            console.print("not diagnosed for a TPU: every tensor stayed on the host (see the note above), so "
                          "finding no host sync here says nothing about a TPU run", markup=False)
        elif steps == 0:  # never "no problems" for a program whose steps were not found
            console.print("nothing repeated: no recompilation, repeated host read, dynamic shape "
                          "or CPU fallback, graph break, unsupported op or TorchTPU "
                          "incompatibility", markup=False)
        else:
            console.print("no recompilation, graph break, host sync, dynamic shape, CPU fallback, "
                          "unsupported op or TorchTPU incompatibility after warm-up", markup=False)
        return
    if not console.is_terminal:
        for f in findings:
            rank = f" rank {f.rank}" if f.rank is not None else ""
            console.print(printable(f"{relative(f.file)}:{f.line}: {f.kind}{rank}: {f.message}"), markup=False,
                          highlight=False)
            code = source_line(f.file, f.line)
            if code:
                console.print(printable(f"    > {code}"), markup=False, highlight=False)
            if f.via:
                console.print(printable(f"    {via_text(f.via)}"), markup=False, highlight=False)
            if f.explanation:
                console.print(f"    {f.explanation}", markup=False, highlight=False)
        return
    table = Table(show_header=True, header_style="bold", show_lines=True)
    for column in ("kind", "where", "count", "first step", "what and what to do"):
        table.add_column(column)
    for f in findings:
        rank = f"\nrank {f.rank}" if f.rank is not None else ""
        code = source_line(f.file, f.line)
        table.add_row(f.kind, f"{relative(f.file)}:{f.line}{rank}" + (f"\n> {code}" if code else "")
                      + (f"\n{via_text(f.via)}" if f.via else ""),
                      str(f.count), str(f.first_step), f"{f.message}\n{f.explanation or ''}")
    console.print(table)


def merge_documents(documents: list[dict]) -> dict:
    """One report from the per-rank reports of a torchrun job (`tpu-migrate report merge`)."""
    findings = []
    for document in documents:
        findings.extend(document["findings"])
    order = {kind: index for index, kind in enumerate(KINDS)}
    findings.sort(key=lambda f: (order.get(f["kind"], 9), f["rank"] if f["rank"] is not None else -1,
                                 -f["count"], f["file"], f["line"]))
    codes = [d["exit_code"] for d in documents]
    return {
        "version": JSON_VERSION,
        "script": documents[0]["script"],
        "backend": documents[0]["backend"],
        "exit_code": next((c for c in codes if c != 0), 0),
        "steps": max(d["steps"] for d in documents),
        "warmup_steps": documents[0]["warmup_steps"],
        "ranks": sorted({f["rank"] for f in findings if f["rank"] is not None}
                        | {d.get("rank") for d in documents if d.get("rank") is not None}),
        "findings": findings,
    }


def print_merged(console: Console, document: dict) -> None:
    console.print(printable(f"tpu-migrate diagnose (merged, ranks {document['ranks']}): {document['script']}"),
                  style="bold", markup=False, highlight=False)
    for f in document["findings"]:
        console.print(printable(f"{f['file']}:{f['line']}: {f['kind']} rank {f['rank']}: {f['message']}"),
                      markup=False, highlight=False)
