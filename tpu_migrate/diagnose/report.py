"""The diagnose report: a rich table on stderr, and the JSON document."""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table

from tpu_migrate.diagnose.analysis import Finding

JSON_VERSION = 1


def json_document(script: str, exit_code: int, steps: int, warmup_steps: int,
                  findings: list[Finding]) -> str:
    return json.dumps({
        "version": JSON_VERSION,
        "script": script,
        "backend": "xla",
        "exit_code": exit_code,
        "steps": steps,
        "warmup_steps": warmup_steps,
        "findings": [f.to_json() for f in findings],
    }, indent=2)


def print_report(console: Console, script: str, steps: int, warmup_steps: int,
                 findings: list[Finding]) -> None:
    console.print(f"tpu-migrate diagnose: {script} (backend xla, {steps} steps, "
                  f"{warmup_steps} warm-up)", style="bold", markup=False, highlight=False)
    if not findings:
        console.print("no recompilation, host sync, dynamic shape or CPU fallback after warm-up",
                      markup=False)
        return
    if not console.is_terminal:
        for f in findings:
            rank = f" rank {f.rank}" if f.rank is not None else ""
            console.print(f"{f.file}:{f.line}: {f.kind}{rank}: {f.message}", markup=False, highlight=False)
            if f.explanation:
                console.print(f"    {f.explanation}", markup=False, highlight=False)
        return
    table = Table(show_header=True, header_style="bold", show_lines=True)
    for column in ("kind", "where", "count", "first step", "what and what to do"):
        table.add_column(column)
    for f in findings:
        rank = f"\nrank {f.rank}" if f.rank is not None else ""
        table.add_row(f.kind, f"{f.file}:{f.line}{rank}", str(f.count), str(f.first_step),
                      f"{f.message}\n{f.explanation or ''}")
    console.print(table)
