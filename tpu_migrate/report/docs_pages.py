"""The documentation pages made from data (docs/hooks.py adds them to the MkDocs site): one page
per rule from its table and its own test fixture, as ruff's rule pages are, the rule index, and
the kinds of diagnose finding. Nothing here is written by hand, so no count or example drifts
from what the tool does."""

from __future__ import annotations

from tpu_migrate.diagnose.kinds import CATALOG as KINDS
from tpu_migrate.report.explain import example_diffs
from tpu_migrate.rules import TARGETS, Catalog, Rule

SAFETY = {
    "safe": "Safe fix: applied by default and at `--fix-level safe`.",
    "unsafe": "Unsafe fix: applied by default, held back at `--fix-level safe`.",
    "manual": "Manual: never applied; the code is marked with a TODO and a finding.",
}


def rule_path(rule: Rule) -> str:
    return f"rules/{rule.code}.md"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def rule_page(rule: Rule) -> str:
    """What a rule does, why, how safe its fix is, and its example, for both targets."""
    safety = SAFETY[rule.safety]
    if rule.also_on_torch_xla:
        safety += " Its code also runs on torch_xla, so it applies even while a file's unsafe fixes wait."
    lines = [f"# {rule.code} {rule.name}", "", rule.summary, "", f"*{safety}* Targets: "
             + ", ".join(f"`{t}`" for t in TARGETS) + f". Table: `rules/{rule.source}`.", "",
             rule.explanation, ""]
    for title, diff in example_diffs(rule):
        lines += [f"## Example, `{title}`", "", "```diff", diff.rstrip("\n"), "```", ""]
    lines += ["`tpu-migrate explain " + rule.code + "` prints this page in a terminal.", ""]
    return "\n".join(lines)


def code_ranges(catalog: Catalog, family: str) -> str:
    """The family's codes, runs of three neighbours in the catalog or more as ranges: `TPU020-TPU025,
    TPU060, TPU070`."""
    runs: list[list[str]] = []
    previous = None
    for rule in catalog.rules:
        if rule.family == family:
            if previous == family:
                runs[-1].append(rule.code)
            else:
                runs.append([rule.code])
        previous = rule.family
    return ", ".join(", ".join(run) if len(run) < 3 else f"{run[0]}-{run[-1]}" for run in runs)


def families_table(catalog: Catalog) -> list[str]:
    """One row per family, from its table's `[family]`: so no range or example drifts from the rules."""
    rows = [f"| {code_ranges(catalog, f.name)} | {f.title} (`rules/{f.name}.toml`) | {_cell(f.summary)} |"
            for f in catalog.families.values()]
    return ["| codes | family | what it converts |", "|---|---|---|", *rows]


def rules_index(catalog: Catalog) -> str:
    rows = [f"| [{r.code}]({r.code}.md) | {r.name} | {r.safety} | {_cell(r.summary)} |" for r in catalog.rules]
    return "\n".join([
        "# Rules", "",
        f"{len(catalog.rules)} rules in {len(catalog.families)} families, generated from `rules/*.toml` "
        "(how to read them: [the families](../rule-families.md)).", "", "## Families", "",
        *families_table(catalog), "", "## Every rule", "",
        "| code | name | fix | what it does |", "|---|---|---|---|", *rows, ""])


def kinds_page() -> str:
    lines = ["# Kinds of diagnose finding", "",
             "`tpu-migrate explain KIND` prints one of these; `--fail-on` takes their names.", ""]
    for kind in KINDS:
        counted = (f"`--fail-on {kind.name}` (and `any`) exits 1 when it is found." if kind.fails
                   else "Information: `--fail-on` never counts it.")
        lines += [f"## {kind.name}", "", f"*{kind.severity}; reported by the "
                  f"{' and '.join(kind.backends)} backend{'s' if len(kind.backends) > 1 else ''}.* {counted}",
                  "", kind.summary, "", kind.explanation, ""]
    return "\n".join(lines)


def generated_pages(catalog: Catalog) -> dict[str, str]:
    """path under docs/ -> Markdown, for every generated page."""
    pages = {rule_path(rule): rule_page(rule) for rule in catalog.rules}
    pages["rules/index.md"] = rules_index(catalog)
    pages["diagnose-kinds.md"] = kinds_page()
    return pages
