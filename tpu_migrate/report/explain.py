"""`tpu-migrate rules` and `tpu-migrate explain`: the catalog, and one rule with its example (or
one kind of `diagnose` finding).

The example is the rule's own test fixture, so the documentation cannot drift from what the
tool does: the before/after shown is what the test suite checks byte for byte.
"""

from __future__ import annotations

import difflib
import json

from rich.console import Console
from rich.markdown import Markdown
from rich.syntax import Syntax
from rich.table import Table

from tpu_migrate.diagnose.kinds import FindingKind
from tpu_migrate.rules import TARGETS, Catalog, Rule, rule_examples


def stdout_console() -> Console:
    return Console(highlight=False, soft_wrap=True)


def rules_json(catalog: Catalog) -> str:
    return json.dumps(
        [
            {"code": r.code, "name": r.name, "safety": r.safety, "targets": list(TARGETS),
             "summary": r.summary}
            for r in catalog.rules
        ],
        indent=2,
    )


def print_rules(catalog: Catalog, console: Console) -> None:
    if not console.is_terminal:
        for r in catalog.rules:
            console.print(f"{r.code}  {r.name:28} {r.safety:7} {','.join(TARGETS):13} {r.summary}",
                          markup=False)
        return
    table = Table(show_header=True, header_style="bold")
    for column in ("code", "name", "safety", "targets", "summary"):
        table.add_column(column)
    for r in catalog.rules:
        table.add_row(r.code, r.name, r.safety, ", ".join(TARGETS), r.summary)
    console.print(table)


def example_diffs(rule: Rule) -> list[tuple[str, str]]:
    """(title, unified diff) per target for the rule's first fixture case."""
    cases = rule_examples(rule)
    if not cases:
        return []
    case = cases[0]
    before = case.read_text(encoding="utf-8").splitlines(keepends=True)
    out = []
    for target in TARGETS:
        expected = case.with_name(case.name.replace(".in.py", f".{target}.py"))
        after = expected.read_text(encoding="utf-8").splitlines(keepends=True)
        diff = "".join(difflib.unified_diff(before, after, "before.py", f"after ({target}).py", n=2))
        out.append((f"--target {target}", diff or "(no change)\n"))
    return out


def _print_heading_and_text(console: Console, heading: str, summary: str, explanation: str) -> None:
    """The explanation of a rule or a finding kind: Markdown on a terminal, plain text otherwise."""
    console.print(heading, style="bold", markup=False)
    console.print(summary, markup=False)
    console.print()
    if console.is_terminal:
        console.print(Markdown(explanation))
    else:
        console.print(explanation, markup=False)


def print_explanation(rule: Rule, console: Console) -> None:
    # Whether `--fix-level safe` applies it in a file whose unsafe fixes wait (docs/commands/rewrite.md).
    safety = f"{rule.safety}, also on torch_xla" if rule.also_on_torch_xla else rule.safety
    _print_heading_and_text(console, f"{rule.code} {rule.name} ({safety})", rule.summary, rule.explanation)
    for title, diff in example_diffs(rule):
        console.print()
        console.print(f"Example, {title}:", style="bold", markup=False)
        if console.is_terminal:
            console.print(Syntax(diff, "diff", theme="ansi_dark"))
        else:
            console.print(diff.rstrip("\n"), markup=False, highlight=False)


def print_kind_explanation(kind: FindingKind, console: Console) -> None:
    _print_heading_and_text(console, f"{kind.name} (diagnose finding, {kind.severity})", kind.summary,
                            kind.explanation)
    console.print()
    backends = " and ".join(kind.backends)
    counted = (f"`--fail-on {kind.name}` (and `any`) exits 1 when it is found" if kind.fails
               else "information: `--fail-on` never counts it")
    console.print(f"Reported by the {backends} backend{'s' if len(kind.backends) > 1 else ''}; {counted}.",
                  markup=False)
