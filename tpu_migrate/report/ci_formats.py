"""Machine output for CI: SARIF 2.1.0 (code scanning) and GitHub workflow annotations.

Both `rewrite` and `diagnose` use them. In rewrite, a manual finding is a warning, a pending fix
a note, a file the tool could not process an error; in diagnose every finding is a warning
(`compile`, information only, a note).
"""

from __future__ import annotations

import json
import os

from tpu_migrate import __version__
from tpu_migrate.findings import FileResult
from tpu_migrate.rules import Catalog

HOME = "https://github.com/tpu-migrate/tpu-migrate"
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"

DIAGNOSE_KINDS = {
    "recompile": "A line whose graph compiled before compiles again after warm-up.",
    "sync": "The host waits for the device to read a tensor value, step after step.",
    "dynamic-shape": "An op whose output shape depends on the data.",
    "fallback": "An op with no XLA lowering ran on the CPU.",
    "compile": "A graph first compiled after warm-up (information).",
    "recompile-limit": "torch.compile hit its recompile limit and runs the function eagerly.",
    "graph-break": "torch.compile splits the function at this line (a Dynamo graph break).",
    "unsupported-op": "An aten op TorchTPU cannot run on the tpu device.",
    "tpu-incompatible": "A call that raises on TorchTPU.",
}


def _uri(path: str) -> str:
    return path.replace(os.sep, "/")


def _location(path: str, line: int, col: int | None = None) -> dict:
    region = {"startLine": max(line, 1)}
    if col:
        region["startColumn"] = col
    return {"physicalLocation": {"artifactLocation": {"uri": _uri(path)}, "region": region}}


def _sarif(driver: dict, results: list[dict], notifications: list[dict]) -> str:
    run = {"tool": {"driver": driver}, "results": results}
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
    sarif_results, notifications = [], []
    for result in results:
        if result.error is not None:
            notifications.append({"level": "error", "message": {"text": f"{result.path}: {result.error}"},
                                  "locations": [_location(result.path, 1)]})
        for fix in result.fixes:
            sarif_results.append({"ruleId": fix.code, "level": "note",
                                  "message": {"text": f"fixable: {summaries.get(fix.code, fix.code)}"},
                                  "locations": [_location(result.path, fix.line, fix.col)]})
        for manual in result.manual:
            sarif_results.append({"ruleId": manual.code, "level": "warning",
                                  "message": {"text": manual.message},
                                  "locations": [_location(result.path, manual.line, manual.col)]})
    driver = {"name": "tpu-migrate", "version": __version__, "informationUri": HOME, "rules": rules}
    return _sarif(driver, sarif_results, notifications)


def diagnose_sarif(findings: list[dict]) -> str:
    rules = [{"id": kind, "name": kind, "shortDescription": {"text": text}, "helpUri": f"{HOME}#diagnose"}
             for kind, text in DIAGNOSE_KINDS.items()]
    results = [
        {"ruleId": f["kind"], "level": "note" if f["kind"] == "compile" else "warning",
         "message": {"text": f["message"] + (f"\n{f['explanation']}" if f.get("explanation") else "")},
         "locations": [_location(f["file"], f["line"])]}
        for f in findings
    ]
    driver = {"name": "tpu-migrate diagnose", "version": __version__, "informationUri": HOME, "rules": rules}
    return _sarif(driver, results, [])


def _escape(text: str, property_value: bool = False) -> str:
    """GitHub's workflow-command escaping."""
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    if property_value:
        text = text.replace(":", "%3A").replace(",", "%2C")
    return text


def _annotation(level: str, path: str, line: int, col: int | None, title: str, message: str) -> str:
    props = f"file={_escape(path, True)},line={line}"
    if col:
        props += f",col={col}"
    props += f",title={_escape(title, True)}"
    return f"::{level} {props}::{_escape(message)}"


def rewrite_github(results: list[FileResult], catalog: Catalog) -> str:
    summaries = {rule.code: rule.summary for rule in catalog.rules}
    lines = []
    for result in results:
        if result.error is not None:
            lines.append(_annotation("error", result.path, 1, None, "tpu-migrate", result.error))
        for fix in result.fixes:
            lines.append(_annotation("notice", result.path, fix.line, fix.col, fix.code,
                                     f"fixable: {summaries.get(fix.code, fix.code)}"))
        for manual in result.manual:
            lines.append(_annotation("warning", result.path, manual.line, manual.col, manual.code, manual.message))
    return "\n".join(lines) + ("\n" if lines else "")


def diagnose_github(findings: list[dict]) -> str:
    lines = [
        _annotation("notice" if f["kind"] == "compile" else "warning", f["file"], f["line"], None,
                    f"tpu-migrate {f['kind']}", f["message"])
        for f in findings
    ]
    return "\n".join(lines) + ("\n" if lines else "")
