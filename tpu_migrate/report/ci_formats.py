"""Machine output for CI: SARIF 2.1.0 (code scanning) and GitHub workflow annotations.

Both `rewrite` and `diagnose` use them. In rewrite, a manual finding is a warning, a pending fix
a note, a file the tool could not process an error; in diagnose every finding is a warning
(`compile`, information only, a note).

GitHub attaches an annotation or a code-scanning alert to a file only by its path relative to
the repository, so every file is named that way (RepositoryPaths): relative to the nearest
directory above the working directory that holds `.git` (else the working directory itself),
with `/` between parts. A file outside it keeps its absolute path.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tpu_migrate import __version__
from tpu_migrate.diagnose import kinds
from tpu_migrate.findings import FileResult
from tpu_migrate.printable import printable
from tpu_migrate.report.render import relative_inside
from tpu_migrate.rules import Catalog

HOME = "https://github.com/tpu-migrate/tpu-migrate"
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


SOURCE_ROOT = "SRCROOT"  # SARIF's uriBaseId for the repository root (GitHub's own name for it)


def repository_root(start: str | None = None) -> str:
    """The nearest directory at or above `start` (the working directory) holding `.git`, else
    `start` itself."""
    here = os.path.abspath(start or os.getcwd())
    probe = here
    while not os.path.exists(os.path.join(probe, ".git")):
        parent = os.path.dirname(probe)
        if parent == probe:
            return here
        probe = parent
    return probe


class RepositoryPaths:
    """File names as GitHub matches them: relative to the repository root, `/`-separated."""

    def __init__(self, root: str | None = None):
        self.root = root or repository_root()

    def relative(self, path: str) -> str | None:
        """`path` relative to the root, or None if it lies outside."""
        return relative_inside(path, self.root)

    def name(self, path: str) -> str:
        """The name an annotation gives: relative where it can be, else absolute."""
        relative = self.relative(path)
        return relative if relative is not None else os.path.abspath(path).replace(os.sep, "/")

    def artifact(self, path: str) -> dict:
        """A SARIF artifactLocation: a URI relative to SRCROOT, or an absolute one."""
        relative = self.relative(path)
        if relative is None:
            return {"uri": Path(os.path.abspath(path)).as_uri()}
        return {"uri": relative, "uriBaseId": SOURCE_ROOT}

    def base_ids(self) -> dict:
        """SARIF's originalUriBaseIds: where SRCROOT was (a directory URI ends in `/`)."""
        return {SOURCE_ROOT: {"uri": Path(self.root).as_uri().rstrip("/") + "/"}}


def _location(paths: RepositoryPaths, path: str, line: int, col: int | None = None) -> dict:
    region = {"startLine": max(line, 1)}
    if col:
        region["startColumn"] = col
    return {"physicalLocation": {"artifactLocation": paths.artifact(path), "region": region}}


def _cell_location(paths: RepositoryPaths, path: str, cell: int, line: int, col: int | None) -> dict:
    """A finding inside a notebook cell: the notebook, plus the cell as a logical location and
    properties. Its line is not the .ipynb file's line, so no region claims one: the region is
    the file's first line, a file-level anchor (code scanning requires a start line)."""
    location = _location(paths, path, 1)
    location["logicalLocations"] = [{"name": f"cell {cell}", "fullyQualifiedName": f"{paths.name(path)}:cell {cell}",
                                     "kind": "element"}]
    location["properties"] = {"cell": cell, "cellLine": line, **({"cellColumn": col} if col else {})}
    return location


def _where(cell: int | None, line: int | None, col: int | None) -> str:
    """The prefix that names a notebook cell in a message: `cell 3, line 2, col 5: `."""
    if cell is None:
        return ""
    return f"cell {cell}" + (f", line {line}" if line else "") + (f", col {col}" if col else "") + ": "


def _finding_location(paths: RepositoryPaths, path: str, line: int, col: int | None, cell: int | None) -> dict:
    return _location(paths, path, line, col) if cell is None else _cell_location(paths, path, cell, line, col)


def _sarif(paths: RepositoryPaths, driver: dict, results: list[dict], notifications: list[dict]) -> str:
    run = {"tool": {"driver": driver}, "originalUriBaseIds": paths.base_ids(), "results": results}
    run["invocations"] = [{"executionSuccessful": not notifications,
                           "toolExecutionNotifications": notifications}]
    return json.dumps({"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}, indent=2)


def rewrite_sarif(results: list[FileResult], catalog: Catalog) -> str:
    rules = [
        {
            "id": rule.code,
            "name": rule.name,
            "shortDescription": {"text": rule.summary},
            "fullDescription": {"text": rule.explanation},
            "helpUri": f"{HOME}/blob/main/rules/{rule.source}",
            "properties": {"safety": rule.safety},
        }
        for rule in catalog.rules
    ]
    summaries = {rule.code: rule.summary for rule in catalog.rules}
    paths = RepositoryPaths()
    sarif_results, notifications = [], []
    for result in results:
        if result.error is not None:  # at the error's own line (a syntax error's), else the first
            notifications.append({"level": "error", "message": {"text": f"{result.path}: {result.error}"},
                                  "locations": [_finding_location(paths, result.path, result.error_line or 1, None,
                                                                  result.error_cell)]})
        for fix in result.fixes:
            text = f"{_where(fix.cell, fix.line, fix.col)}fixable: {summaries.get(fix.code, fix.code)}"
            sarif_results.append({"ruleId": fix.code, "level": "note", "message": {"text": text},
                                  "locations": [_finding_location(paths, result.path, fix.line, fix.col, fix.cell)]})
        for manual in result.manual:
            text = f"{_where(manual.cell, manual.line, manual.col)}{manual.message}"
            sarif_results.append({"ruleId": manual.code, "level": "warning", "message": {"text": text},
                                  "locations": [_finding_location(paths, result.path, manual.line, manual.col,
                                                                  manual.cell)]})
    driver = {"name": "tpu-migrate", "version": __version__, "informationUri": HOME, "rules": rules}
    return _sarif(paths, driver, sarif_results, notifications)


def diagnose_sarif(findings: list[dict]) -> str:
    rules = [{"id": kind.name, "name": kind.name, "shortDescription": {"text": kind.summary},
              "helpUri": f"{HOME}#diagnose"}
             for kind in kinds.documentation_order()]
    paths = RepositoryPaths()
    results = [
        {"ruleId": f["kind"], "level": kinds.BY_NAME[f["kind"]].severity,
         "message": {"text": f["message"] + (f"\n{f['explanation']}" if f.get("explanation") else "")},
         "locations": [_location(paths, f["file"], f["line"])]}
        for f in findings
    ]
    driver = {"name": "tpu-migrate diagnose", "version": __version__, "informationUri": HOME, "rules": rules}
    return _sarif(paths, driver, results, [])


def _escape(text: str, property_value: bool = False) -> str:
    """GitHub's workflow-command escaping."""
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    if property_value:
        text = text.replace(":", "%3A").replace(",", "%2C")
    return text


def _annotation(level: str, path: str, line: int | None, col: int | None, title: str, message: str) -> str:
    """`path`: as RepositoryPaths names it. `line` None: a file-level annotation (a notebook
    cell's line is not the file's)."""
    props = f"file={_escape(path, True)}"
    if line is not None:
        props += f",line={line}"
    if line is not None and col:
        props += f",col={col}"
    props += f",title={_escape(title, True)}"
    return f"::{level} {props}::{_escape(printable(message))}"


def rewrite_github(results: list[FileResult], catalog: Catalog) -> str:
    summaries = {rule.code: rule.summary for rule in catalog.rules}
    paths = RepositoryPaths()
    lines = []
    for result in results:
        name = paths.name(result.path)
        if result.error is not None:
            line = None if result.error_cell is not None else result.error_line or 1
            lines.append(_annotation("error", name, line, None, "tpu-migrate", result.error))
        for fix in result.fixes:
            lines.append(_annotation("notice", name, *_file_line(fix.line, fix.col, fix.cell), fix.code,
                                     f"{_where(fix.cell, fix.line, fix.col)}fixable: "
                                     f"{summaries.get(fix.code, fix.code)}"))
        for manual in result.manual:
            lines.append(_annotation("warning", name, *_file_line(manual.line, manual.col, manual.cell),
                                     manual.code, f"{_where(manual.cell, manual.line, manual.col)}{manual.message}"))
    return "\n".join(lines) + ("\n" if lines else "")


def _file_line(line: int, col: int, cell: int | None) -> tuple[int | None, int | None]:
    """The file's line and column for an annotation; none for a notebook cell's (the message
    names the cell instead)."""
    return (line, col) if cell is None else (None, None)


def diagnose_github(findings: list[dict]) -> str:
    paths = RepositoryPaths()
    lines = [
        _annotation(kinds.GITHUB_LEVELS[kinds.BY_NAME[f["kind"]].severity], paths.name(f["file"]), f["line"], None,
                    f"tpu-migrate {f['kind']}", f["message"])
        for f in findings
    ]
    return "\n".join(lines) + ("\n" if lines else "")
