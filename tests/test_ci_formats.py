"""SARIF 2.1.0 (validated against the published schema, shipped in tests/data) and GitHub
workflow annotations, for rewrite and diagnose."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jsonschema

from conftest import FIXTURES, ROOT

SCHEMA = json.loads((ROOT / "tests" / "data" / "sarif-2.1.0.json").read_text())
MANUAL = FIXTURES / "TPU099-unconverted-api" / "basic.in.py"
FIXABLE = FIXTURES / "TPU001-xla-device" / "basic.in.py"


def test_rewrite_sarif_is_valid_and_complete(cli, tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("import torch_xla\ndef (:\n")
    result = cli("rewrite", "--check", "--format", "sarif", str(MANUAL), str(FIXABLE), str(broken))
    assert result.returncode == 2
    doc = json.loads(result.stdout)  # nothing else on stdout
    jsonschema.validate(doc, SCHEMA)
    run = doc["runs"][0]
    rules = {r["id"]: r for r in run["tool"]["driver"]["rules"]}
    assert rules["TPU099"]["helpUri"].endswith("rules/core.toml")
    assert rules["TPU099"]["shortDescription"]["text"]
    levels = {(r["ruleId"], r["level"]) for r in run["results"]}
    assert ("TPU099", "warning") in levels and ("TPU001", "note") in levels
    first = next(r for r in run["results"] if r["ruleId"] == "TPU099")
    region = first["locations"][0]["physicalLocation"]["region"]
    assert (region["startLine"], region["startColumn"]) == (7, 15)
    notes = run["invocations"][0]["toolExecutionNotifications"]
    assert notes and "syntax error" in notes[0]["message"]["text"]


def test_rewrite_github_annotations(cli):
    result = cli("rewrite", "--check", "--format", "github", str(MANUAL), str(FIXABLE))
    lines = result.stdout.decode().splitlines()
    assert f"::warning file={MANUAL},line=7,col=15,title=TPU099::`xm.RateTracker`" in lines[0]
    assert any(l.startswith(f"::notice file={FIXABLE},line=5,col=10,title=TPU001::fixable") for l in lines)
    assert all(l.startswith("::") for l in lines)


def test_diagnose_sarif_and_github(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PJRT_DEVICE": "CPU"}
    program = ROOT / "fixtures" / "diagnose" / "host_sync_item.py"
    sarif = subprocess.run([sys.executable, "-m", "tpu_migrate", "diagnose", "--format", "sarif", str(program)],
                           capture_output=True, text=True, env=env, timeout=600)
    doc = json.loads(sarif.stdout)
    jsonschema.validate(doc, SCHEMA)
    result = doc["runs"][0]["results"][0]
    assert result["ruleId"] == "sync"
    assert result["locations"][0]["physicalLocation"]["region"]["startLine"] == 15
    github = subprocess.run([sys.executable, "-m", "tpu_migrate", "diagnose", "--format", "github", str(program)],
                            capture_output=True, text=True, env=env, timeout=600)
    assert github.stdout.startswith(f"::warning file={program},line=15,title=tpu-migrate sync::")


def test_diagnose_sarif_declares_every_finding_kind():
    from tpu_migrate.diagnose.analysis import KINDS
    from tpu_migrate.report import ci_formats

    findings = [{"kind": kind, "file": "/src/train.py", "line": 3 + i, "message": kind, "explanation": None}
                for i, kind in enumerate(KINDS)]
    doc = json.loads(ci_formats.diagnose_sarif(findings))
    jsonschema.validate(doc, SCHEMA)
    declared = {rule["id"] for rule in doc["runs"][0]["tool"]["driver"]["rules"]}
    assert declared == set(KINDS)
