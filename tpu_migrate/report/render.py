"""Human and machine output for `rewrite`: findings lines, diffs, the summary, JSON."""

from __future__ import annotations

import difflib
import json
import os
import sys
from collections import Counter
from dataclasses import dataclass, field

from tpu_migrate.findings import FileResult
from tpu_migrate.rewrite.files import MISSING, shown
from tpu_migrate.printable import git_quote, printable, shell_quote
from tpu_migrate.rules import Catalog

JSON_VERSION = 1


@dataclass
class Summary:
    files: int = 0
    changed: int = 0
    errors: int = 0
    fixes: Counter = field(default_factory=Counter)
    manual: Counter = field(default_factory=Counter)

    def add(self, result: FileResult) -> None:
        self.files += result.error != MISSING  # a path that does not exist was not scanned
        self.changed += result.changed
        self.errors += result.error is not None
        self.fixes.update(f.code for f in result.fixes)
        self.manual.update(m.code for m in result.manual)

    def to_json(self) -> dict:
        return {
            "files": self.files,
            "changed": self.changed,
            "errors": self.errors,
            "fixes": sum(self.fixes.values()),
            "manual": sum(self.manual.values()),
            "fixes_by_rule": dict(sorted(self.fixes.items())),
            "manual_by_rule": dict(sorted(self.manual.items())),
        }


def unified_diff(result: FileResult, notebook_cells: bool = False) -> str:
    """The diff of one changed file; line endings are shown as they are in the file. A notebook's
    is the diff of its .ipynb file, which `git apply` and `patch -p1` take like any other;
    `notebook_cells`: one diff per changed code cell instead, named `path:cell N`, for reading."""
    assert result.original is not None and result.output is not None
    if result.cell_diffs is not None and notebook_cells:
        return "".join(
            "".join(difflib.unified_diff(
                (old + "\n").splitlines(keepends=True), (new + "\n").splitlines(keepends=True),
                *_diff_names(f"{result.path}:cell {cell}"),
            ))
            for cell, (old, new) in sorted(result.cell_diffs.items())
        )
    old = _decode_for_diff(result.original).splitlines(keepends=True)
    new = _decode_for_diff(result.output).splitlines(keepends=True)
    lines = difflib.unified_diff(old, new, *_diff_names(result.path))
    text = "".join(line if line.endswith(("\n", "\r")) else line + "\n\\ No newline at end of file\n" for line in lines)
    return text


def _diff_names(path: str) -> tuple[str, str]:
    """`a/x`, `b/x` with x relative to the working directory, however the path was spelled
    (`./src/x.py`, `src//x.py`, an absolute path inside it), which `git apply` and `patch -p1`
    take from the working directory; a path outside it stays absolute (`patch -p0`)."""
    spelled = path.split(":cell ", 1)  # a notebook's cell: `nb.ipynb:cell 3`
    name = ":cell ".join([diff_path(spelled[0]), *spelled[1:]])
    if os.path.isabs(name):
        return git_quote(name), git_quote(name)
    return git_quote(f"a/{name}"), git_quote(f"b/{name}")


def diff_path(path: str) -> str:
    """`path` relative to the working directory, in `/` form, or absolute when outside it (as
    findings and every other line name files: files.shown)."""
    return shown(path)


def relative_inside(path: str, base: str) -> str | None:
    """`path` relative to the directory `base`, in `/` form, or None when it lies outside."""
    relative = os.path.relpath(os.path.abspath(path), base)
    if relative == os.pardir or relative.startswith(os.pardir + os.sep):
        return None
    return relative.replace(os.sep, "/")


def _decode_for_diff(data: bytes) -> str:
    return data.decode("utf-8", errors="surrogateescape")


def finding_lines(result: FileResult) -> list[str]:
    return [
        printable(f"{result.path}:{'' if m.cell is None else f'cell {m.cell}:'}{m.line}:{m.col} {m.code} {m.message}")
        for m in result.manual
    ]


def fix_lines(result: FileResult, catalog: Catalog) -> list[str]:
    """--check: where each pending fix is, as findings are shown (`path:line:col CODE ...`), so
    that a failing hook points at lines, not only at counts."""
    return [
        printable(f"{result.path}:{'' if f.cell is None else f'cell {f.cell}:'}{f.line}:{f.col} {f.code} fixable: "
                  f"{catalog.by_code(f.code).summary}")
        for f in result.fixes
    ]


# Past this many files the next command names the paths given, not each file.
NEXT_COMMAND_FILES = 10


def next_command_line(results: list[FileResult], mode: str, options: list[str], paths: list[str]) -> str | None:
    """--check / --diff with changes pending: the command that applies them (with the options
    given that decide what a write does)."""
    changed = [result.path for result in results if result.changed]
    if mode == "write" or not changed:
        return None
    targets = changed if len(changed) <= NEXT_COMMAND_FILES else paths
    # A name that starts with "-" would read as an option.
    targets = [f"./{target}" if str(target).startswith("-") else str(target) for target in targets]
    return "run: " + " ".join(shell_quote(part) for part in ["tpu-migrate", "rewrite", *options, *targets])


def error_line(result: FileResult) -> str:
    return printable(f"{result.path}: error: {result.error}")


def json_document(results: list[FileResult], summary: Summary, target: str, diffs: bool,
                  migration: dict | None = None, notebook_cells: bool = False) -> str:
    """`migration`: the migration report's object (report/migration.py), under that key."""
    files = []
    for result in results:
        entry = result.to_json()
        if diffs:
            entry["diff"] = unified_diff(result, notebook_cells) if result.changed else None
        files.append(entry)
    return json.dumps(
        {"version": JSON_VERSION, "target": target, "files": files, "summary": summary.to_json(),
         **({} if migration is None else {"migration": migration})},
        indent=2,
    )


def changed_file_lines(results: list[FileResult], mode: str) -> list[str]:
    """One line per file written (`Rewrote: path`) or that would be (`Would rewrite: path`)."""
    label = "Rewrote" if mode == "write" else "Would rewrite"
    return [printable(f"{label}: {result.path}") for result in results if result.changed]


def note_lines(result: FileResult) -> list[str]:
    """Warnings about the input (stderr): `path:line: warning: message`."""
    return [printable(f"{result.path}:{'' if n.cell is None else f'cell {n.cell}:'}{n.line}: warning: {n.message}")
            for n in result.notes]


def print_summary(summary: Summary, catalog: Catalog, mode: str, on_terminal: bool) -> None:
    """A rich table on a terminal, plain lines otherwise (CI logs, pipes; rich is not imported
    for them: report/terminal.py). Fixes are "fixed" only when written; --check and --diff show
    them as "fixable"."""
    verb = {"write": "changed", "diff": "would change", "check": "would change"}[mode]
    fixed = "fixed" if mode == "write" else "fixable"
    names = {r.code: r.name for r in catalog.rules}
    if not on_terminal:
        out = sys.stdout
        out.write(
            f"{summary.files} file(s) scanned, {summary.changed} {verb}, "
            f"{summary.errors} error(s), {sum(summary.fixes.values())} fix(es), "
            f"{sum(summary.manual.values())} manual finding(s)\n"
        )
        for code, count in sorted(summary.fixes.items()):
            out.write(f"  {fixed:<7} {code} {names.get(code, '')}: {count}\n")
        for code, count in sorted(summary.manual.items()):
            out.write(f"  manual  {code} {names.get(code, '')}: {count}\n")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="tpu-migrate rewrite", show_header=True, header_style="bold")
    table.add_column("")
    table.add_column("rule")
    table.add_column("count", justify="right")
    table.add_row("files scanned", "", str(summary.files))
    table.add_row(f"files {verb}", "", str(summary.changed), style="green" if summary.changed else None)
    table.add_row("errors", "", str(summary.errors), style="red" if summary.errors else None)
    for code, count in sorted(summary.fixes.items()):
        table.add_row(fixed, f"{code} {names.get(code, '')}", str(count))
    for code, count in sorted(summary.manual.items()):
        table.add_row("manual", f"{code} {names.get(code, '')}", str(count), style="yellow")
    Console(highlight=False, soft_wrap=True).print(table)


def unscanned_lines(mentions) -> list[str]:
    """The scripts and configs a directory run did not rewrite that mention torch_xla (text
    output, after the summary): information, not findings; the exit status ignores them."""
    if not mentions:
        return []
    lines = [f"not rewritten: {len(mentions)} script or config file(s) mention torch_xla (port them by hand):"]
    lines += [printable(f"  {m.path}:{m.line}: {m.text}") for m in mentions]
    return lines
