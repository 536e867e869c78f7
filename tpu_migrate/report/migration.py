"""The migration report of `rewrite` (`--html FILE`, and `migration` in `--format json`): the
shape of a migration before anyone runs it, for planning.

Per rule family (a rules/*.toml file) and per file: what converts automatically, what a person
must port and what each item needs, and the files that cannot run without torch_xla after the
rewrite (they keep a torch_xla / optimum.tpu import). Everything comes from the per-file results,
which the workers compute and the result cache keeps: building the report re-reads no file.
"""

from __future__ import annotations

import html
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache

from tpu_migrate.findings import FileResult, with_cell
from tpu_migrate.report import svg_charts
from tpu_migrate.html_page import inline, page
from tpu_migrate.rewrite.registry import rule_code
from tpu_migrate.rules import Catalog

# SPMD sharding and FSDP wrappers (a different parallelism model: rules/spmd.toml, rules/fsdp.toml
# and Optimum's fsdp_v2): their manual items are counted apart.
SPMD_FSDP = frozenset({rule_code("TPU170"), rule_code("TPU171"), rule_code("TPU172"), rule_code("TPU173"),
                       rule_code("TPU174"), rule_code("TPU175"), rule_code("TPU176"), rule_code("TPU177"),
                       rule_code("TPU178"), rule_code("TPU179"), rule_code("TPU180")})
OTHER_FAMILY = "other"  # codes no rule has (a TODO comment naming a retired rule)
OTHER_LABEL = "retired rules (open TODOs)"
# The files the picture ranks by the manual work left in them.
RANKED_FILES = 12


@dataclass
class FamilyCounts:
    fixes: Counter = field(default_factory=Counter)  # code -> count
    manual: Counter = field(default_factory=Counter)


@dataclass
class Migration:
    results: list[FileResult]
    catalog: Catalog
    mode: str  # write, check or diff
    families: dict[str, FamilyCounts] = field(default_factory=dict)
    # Scripts and configs the run did not rewrite that mention torch_xla (rewrite/unscanned.py).
    unscanned: list = field(default_factory=list)

    @classmethod
    def build(cls, results: list[FileResult], catalog: Catalog, mode: str, unscanned=()) -> Migration:
        report = cls(results, catalog, mode, unscanned=list(unscanned))
        family_of = {rule.code: rule.family for rule in catalog.rules}
        order = [*catalog.families, OTHER_FAMILY]  # by their first code
        counts = {name: FamilyCounts() for name in order}
        for result in results:
            for fix in result.fixes:
                counts[family_of.get(fix.code, OTHER_FAMILY)].fixes[fix.code] += 1
            for item in result.manual:
                counts[family_of.get(item.code, OTHER_FAMILY)].manual[item.code] += 1
        report.families = {name: c for name, c in counts.items() if c.fixes or c.manual}
        return report

    def family_label(self, family: str) -> str:
        """What users call the family (its table's `[family] title`): the page's words, not file names."""
        known = self.catalog.families.get(family)
        return known.title if known is not None else OTHER_LABEL

    @property
    def blocked(self) -> list[FileResult]:
        return [r for r in self.results if r.kept_imports]

    def totals(self) -> dict:
        fixes = sum(len(r.fixes) for r in self.results)
        manual = sum(len(r.manual) for r in self.results)
        return {
            "files": len(self.results),
            "files_with_xla": sum(r.imports_xla for r in self.results),
            "files_with_work": sum(bool(r.fixes or r.manual) for r in self.results),
            "files_changed": sum(r.changed for r in self.results),
            "errors": sum(r.error is not None for r in self.results),
            "fixes": fixes,
            "manual": manual,
            "manual_spmd_fsdp": sum(m.code in SPMD_FSDP for r in self.results for m in r.manual),
            "blocked_files": len(self.blocked),
            "converted_share": round(fixes / (fixes + manual), 4) if fixes + manual else None,
        }

    def to_json(self) -> dict:
        names = self._names()
        return {
            "mode": self.mode,
            **self.totals(),
            "families": [
                {"family": family, "label": self.family_label(family),
                 "fixes": sum(c.fixes.values()), "manual": sum(c.manual.values()),
                 "manual_spmd_fsdp": sum(n for code, n in c.manual.items() if code in SPMD_FSDP),
                 "rules": [{"code": code, "name": names.get(code, ""), "fixes": c.fixes[code],
                            "manual": c.manual[code]} for code in sorted(c.fixes | c.manual)]}
                for family, c in self.families.items()
            ],
            "blocked": [
                {"path": r.path, "imports": [with_cell({"line": k.line, "module": k.module}, k.cell)
                                             for k in r.kept_imports]}
                for r in self.blocked
            ],
            "not_rewritten": [{"path": m.path, "line": m.line, "text": m.text} for m in self.unscanned],
        }

    def html(self, target: str, paths: list[str]) -> str:
        totals = self.totals()
        applied = "applied" if self.mode == "write" else f"the rewrite would apply (--{self.mode}: nothing written)"
        share = "n/a" if totals["converted_share"] is None else f"{totals['converted_share']:.0%}"
        rows = [
            ("files scanned", totals["files"]),
            ("files that import torch_xla / optimum.tpu", totals["files_with_xla"]),
            ("files with fixes or manual items", totals["files_with_work"]),
            (f"fixes {applied}", totals["fixes"]),
            ("manual items", totals["manual"]),
            ("&nbsp;&nbsp;of which SPMD / FSDP (manual by design)", totals["manual_spmd_fsdp"]),
            ("files that still import torch_xla after the rewrite (cannot run without it)", totals["blocked_files"]),
            ("share of references converted (fixes / (fixes + manual items))", share),
            ("files that could not be processed (errors)", totals["errors"]),
        ]
        summary = "".join(f'<tr><th scope="row">{label}</th><td class="count">{value}</td></tr>'
                          for label, value in rows)
        body = (
            f"<p>target {html.escape(target)} &middot; {html.escape(' '.join(paths))} &middot; "
            f"{html.escape(self.mode)} run</p>\n"
            f'<h2>Summary</h2>\n<table id="summary" class="narrow">{summary}</table>\n'
            f"<h2>At a glance</h2>\n{self._charts_html()}\n"
            f"<h2>By rule family</h2>\n{self._families_html()}\n"
            f"<h2>Files that block running without torch_xla</h2>\n{self._blocked_html()}\n"
            f"<h2>Scripts and configs not rewritten that mention torch_xla</h2>\n{self._unscanned_html()}\n"
            f"<h2>Files</h2>\n{self._files_html()}"
        )
        return page("tpu-migrate migration report", STYLE, body)

    def _charts_html(self) -> str:
        """Inline SVG: the work per family, the files with most manual work left, and the
        references before and after the rewrite."""
        if not self.families:
            return '<p class="none">Nothing to draw: nothing to convert.</p>'
        families = [
            (self.family_label(family), [(sum(c.fixes.values()), "auto"),
                                    (sum(n for code, n in c.manual.items() if code not in SPMD_FSDP), "manual"),
                                    (sum(n for code, n in c.manual.items() if code in SPMD_FSDP), "design")])
            for family, c in self.families.items()
        ]
        ranked = sorted((r for r in self.results if r.manual), key=lambda r: (-len(r.manual), r.path))[:RANKED_FILES]
        files = [(r.path, [(sum(m.code not in SPMD_FSDP for m in r.manual), "manual"),
                           (sum(m.code in SPMD_FSDP for m in r.manual), "design")]) for r in ranked]
        totals = self.totals()
        before_after = [("before", [(totals["fixes"] + totals["manual"], "before")]),
                        ("after", [(totals["manual"], "after")])]
        parts = [svg_charts.bars("chart-families", "automatic and manual work per rule family", families)]
        if files:
            parts.append(f"<h3>Files with the most manual work left (top {len(files)})</h3>")
            parts.append(svg_charts.bars("chart-files", "manual items left per file", files))
        parts.append("<h3>Before and after</h3>")
        parts.append(svg_charts.bars("chart-before-after", "torch_xla references before and after", before_after))
        return "\n".join(parts)

    def _names(self) -> dict[str, str]:
        return {rule.code: rule.name for rule in self.catalog.rules}

    def _families_html(self) -> str:
        if not self.families:
            return '<p class="none" id="families">Nothing to convert.</p>'
        summaries = {rule.code: rule.summary for rule in self.catalog.rules}
        names = self._names()
        rows = []
        for family, c in self.families.items():
            rows.append(f'<tr class="family"><th>{html.escape(self.family_label(family))}</th>'
                        f'<th class="count">{sum(c.fixes.values())}</th>'
                        f'<th class="count">{sum(c.manual.values())}</th><th></th></tr>')
            for code in sorted(c.fixes | c.manual):
                by_design = ' <span class="design">SPMD / FSDP</span>' if code in SPMD_FSDP else ""
                rows.append(f'<tr class="rule"><td><code>{code}</code> {html.escape(names.get(code, ""))}'
                            f'{by_design}</td><td class="count">{c.fixes[code]}</td>'
                            f'<td class="count">{c.manual[code]}</td><td>{inline(summaries.get(code, ""))}</td></tr>')
        return ('<table id="families"><thead><tr><th>family / rule</th><th>automatic</th><th>manual</th>'
                f'<th>what the rule does</th></tr></thead><tbody>{"".join(rows)}</tbody></table>')

    def _blocked_html(self) -> str:
        if not self.blocked:
            return '<p class="none" id="blocked">None: no file keeps a torch_xla import.</p>'
        rows = "".join(
            f'<tr class="blocked"><td>{html.escape(r.path)}</td><td>'
            + "<br>".join(f"line {_where(k.cell, k.line)}: <code>{html.escape(k.module)}</code>"
                          for k in r.kept_imports)
            + "</td></tr>"
            for r in self.blocked
        )
        return ('<table id="blocked"><thead><tr><th>file</th><th>torch_xla imports left</th></tr></thead>'
                f"<tbody>{rows}</tbody></table>")

    def _unscanned_html(self) -> str:
        if not self.unscanned:
            return ('<p class="none" id="not-rewritten">None: no launch script or config of the '
                    "directories searched mentions torch_xla.</p>")
        rows = "".join(f'<tr class="not-rewritten"><td>{html.escape(m.path)}</td><td class="count">{m.line}</td>'
                       f"<td><code>{html.escape(m.text)}</code></td></tr>" for m in self.unscanned)
        return ('<p>The rewrite reads Python files, notebooks and dependency files; port these by hand.</p>'
                '<table id="not-rewritten"><thead><tr><th>file</th><th>line</th><th>the first mention</th>'
                f"</tr></thead><tbody>{rows}</tbody></table>")

    def _files_html(self) -> str:
        listed = [r for r in self.results if r.fixes or r.manual or r.imports_xla or r.error is not None]
        listed.sort(key=lambda r: (r.error is None, not r.kept_imports, -len(r.manual), -len(r.fixes), r.path))
        labels = {code: f"<code>{code}</code> {html.escape(name)}" for code, name in self._names().items()}
        rows = "".join(self._file_row(r, labels) for r in listed)
        unlisted = len(self.results) - len(listed)
        note = f"<p>{unlisted} file(s) without torch_xla or findings are not listed.</p>" if unlisted else ""
        if not listed:
            return note
        return (note + '<table id="files"><thead><tr><th>file (open for its manual items)</th><th>automatic</th>'
                '<th>manual</th><th>SPMD / FSDP</th><th>blocks</th></tr></thead>'
                f"<tbody>{rows}</tbody></table>")

    def _file_row(self, result: FileResult, labels: dict[str, str]) -> str:
        path = html.escape(result.path)
        if result.error is not None:
            return (f'<tr class="file error"><td>{path}<div class="explanation">error: '
                    f'{html.escape(result.error)}</div></td><td></td><td></td><td></td><td></td></tr>')
        if result.manual:
            items = "".join(
                f'<tr class="manual"><td>{_where(m.cell, m.line)}</td>'
                f"<td>{labels.get(m.code) or html.escape(m.code)}</td><td>{_message(m.message)}</td></tr>"
                for m in result.manual
            )
            cell = (f"<details><summary>{path}</summary><table class=\"items\"><thead><tr><th>line</th>"
                    f"<th>rule</th><th>what it needs</th></tr></thead><tbody>{items}</tbody></table></details>")
        else:
            cell = path
        design = sum(m.code in SPMD_FSDP for m in result.manual)
        return (f'<tr class="file"><td>{cell}</td><td class="count">{len(result.fixes)}</td>'
                f'<td class="count">{len(result.manual)}</td><td class="count">{design}</td>'
                f'<td>{"yes" if result.kept_imports else ""}</td></tr>')


STYLE = """
table.narrow { width: auto; } #families, #files { table-layout: fixed; }
#families th:nth-child(1) { width: 16rem; } #families th:nth-child(2), #families th:nth-child(3) { width: 6.5rem; }
#files > thead th:nth-child(n+2) { width: 6.5rem; } #blocked th:nth-child(1) { width: 40%; }
details > summary { cursor: pointer; } table.items { margin: .4rem 0; font-size: .9rem; table-layout: fixed; }
table.items th:nth-child(1) { width: 4.5rem; } table.items th:nth-child(2) { width: 13rem; }
tr.family th { background: #e8eef4; } .design { color: #8c564b; font-size: .85rem; }
tr.rule td:first-child { padding-left: 1.2rem; } tr.error td:first-child { color: #d62728; }
"""


STYLE += svg_charts.STYLE


# Many items share a message (every device loader's TODO): convert each once.
_message = lru_cache(maxsize=4096)(inline)


def _where(cell: int | None, line: int) -> str:
    return str(line) if cell is None else f"cell {cell}, line {line}"
