"""SARIF 2.1.0 (validated against the published schema, shipped in tests/data) and GitHub
workflow annotations, for rewrite and diagnose."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jsonschema
import pytest

from conftest import FIXTURES, ROOT

pytestmark = pytest.mark.slow  # the CLI and diagnose as subprocesses

SCHEMA = json.loads((ROOT / "tests" / "data" / "sarif-2.1.0.json").read_text())
MANUAL = FIXTURES / "TPU099-unconverted-api" / "basic.in.py"
FIXABLE = FIXTURES / "TPU001-xla-device" / "basic.in.py"


def in_repository(path) -> str:
    """How GitHub names a file of this repository: relative to its root, `/`-separated."""
    return path.relative_to(ROOT).as_posix()


def test_rewrite_sarif_is_valid_and_complete(cli, tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("import torch_xla\ndef (:\n")
    result = cli("rewrite", "--check", "--format", "sarif", str(MANUAL), str(FIXABLE), str(broken))
    assert result.returncode == 2
    doc = json.loads(result.stdout)  # nothing else on stdout
    jsonschema.validate(doc, SCHEMA)
    run = doc["runs"][0]
    rules = {r["id"]: r for r in run["tool"]["driver"]["rules"]}
    assert rules["TPU099"]["helpUri"].endswith("rules/unconverted.toml")
    assert rules["TPU099"]["shortDescription"]["text"]
    levels = {(r["ruleId"], r["level"]) for r in run["results"]}
    assert ("TPU099", "warning") in levels and ("TPU001", "note") in levels
    first = next(r for r in run["results"] if r["ruleId"] == "TPU099")
    region = first["locations"][0]["physicalLocation"]["region"]
    assert (region["startLine"], region["startColumn"]) == (7, 15)
    notes = run["invocations"][0]["toolExecutionNotifications"]
    assert notes and "syntax error at line 2" in notes[0]["message"]["text"]
    # At the line the message names, not at line 1.
    assert notes[0]["locations"][0]["physicalLocation"]["region"]["startLine"] == 2


def test_rewrite_github_annotations(cli):
    result = cli("rewrite", "--check", "--format", "github", str(MANUAL), str(FIXABLE))
    lines = result.stdout.decode().splitlines()
    assert f"::warning file={in_repository(MANUAL)},line=7,col=15,title=TPU099::`xu.TimedScope`" in lines[0]
    assert any(l.startswith(f"::notice file={in_repository(FIXABLE)},line=5,col=10,title=TPU001::fixable")
               for l in lines)
    assert all(l.startswith("::") for l in lines)


def test_syntax_error_annotation_is_at_its_line(cli, tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("import torch_xla\n\ndef (:\n")
    result = cli("rewrite", "--check", "--format", "github", str(broken))
    assert result.stdout.decode().startswith(f"::error file={broken},line=3,title=tpu-migrate::syntax error at line 3")


def notebook(tmp_path, *sources: str):
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps({
        "cells": [{"cell_type": "code", "id": f"c{i}", "execution_count": None, "metadata": {}, "outputs": [],
                   "source": source} for i, source in enumerate(sources)],
        "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def test_notebook_findings_name_the_cell_not_a_line_of_the_ipynb(cli, tmp_path):
    path = notebook(tmp_path, "import torch_xla.core.xla_model as xm", "x = 1\nt = xm.unlazy()")
    sarif = json.loads(cli("rewrite", "--check", "--format", "sarif", str(path)).stdout)
    jsonschema.validate(sarif, SCHEMA)
    [finding] = [r for r in sarif["runs"][0]["results"] if r["ruleId"] == "TPU099"]
    location = finding["locations"][0]
    assert location["physicalLocation"]["artifactLocation"] == {"uri": path.as_uri()}  # outside the repository
    assert location["physicalLocation"]["region"] == {"startLine": 1}  # the notebook, not line 2 of its JSON
    assert location["logicalLocations"][0]["name"] == "cell 1"
    assert location["properties"] == {"cell": 1, "cellLine": 2, "cellColumn": 5}
    assert finding["message"]["text"].startswith("cell 1, line 2, col 5: `xm.unlazy`")
    github = cli("rewrite", "--check", "--format", "github", str(path)).stdout.decode()
    assert f"::warning file={path},title=TPU099::cell 1, line 2, col 5: `xm.unlazy`" in github
    assert ",line=" not in github


def test_notebook_syntax_error_names_its_cell(cli, tmp_path):
    path = notebook(tmp_path, "import torch_xla", "x = 1\ndef (:")
    result = cli("rewrite", "--check", "--format", "sarif", str(path))
    doc = json.loads(result.stdout)
    jsonschema.validate(doc, SCHEMA)
    [note] = doc["runs"][0]["invocations"][0]["toolExecutionNotifications"]
    assert "syntax error at cell 1, line 2:" in note["message"]["text"]
    assert note["locations"][0]["properties"] == {"cell": 1, "cellLine": 2}
    github = cli("rewrite", "--check", "--format", "github", str(path)).stdout.decode()
    assert github.startswith(f"::error file={path},title=tpu-migrate::syntax error at cell 1, line 2:")


def test_diagnose_sarif_and_github(tmp_path):
    # A native program (no torch_xla to import: a third of the cold start) with syncs, an op
    # TorchTPU lacks and a call that raises there: several kinds in one SARIF document.
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    program = ROOT / "fixtures" / "diagnose" / "native" / "eager_problems.py"
    item_line = 23  # print(f"... {loss.item():.4f}"): a sync every step
    assert "expect: sync (item)" in program.read_text().splitlines()[item_line - 1]
    sarif = subprocess.run([sys.executable, "-m", "tpu_migrate", "diagnose", "--format", "sarif", str(program)],
                           capture_output=True, text=True, env=env, timeout=600)
    doc = json.loads(sarif.stdout)
    jsonschema.validate(doc, SCHEMA)
    results = doc["runs"][0]["results"]
    result = next(r for r in results
                  if r["locations"][0]["physicalLocation"]["region"]["startLine"] == item_line)
    assert result["ruleId"] == "sync"
    assert {r["ruleId"] for r in results} >= {"sync", "unsupported-op", "tpu-incompatible"}
    github = subprocess.run([sys.executable, "-m", "tpu_migrate", "diagnose", "--format", "github", str(program)],
                            capture_output=True, text=True, env=env, timeout=600)
    assert github.stdout.startswith("::")
    assert f"::warning file={in_repository(program)},line={item_line},title=tpu-migrate sync::" in github.stdout
    location = result["locations"][0]["physicalLocation"]["artifactLocation"]
    assert location == {"uri": in_repository(program), "uriBaseId": "SRCROOT"}


def test_diagnose_sarif_declares_every_finding_kind():
    from tpu_migrate.diagnose.kinds import KINDS
    from tpu_migrate.report import ci_formats

    findings = [{"kind": kind, "file": "/src/train.py", "line": 3 + i, "message": kind, "explanation": None}
                for i, kind in enumerate(KINDS)]
    doc = json.loads(ci_formats.diagnose_sarif(findings))
    jsonschema.validate(doc, SCHEMA)
    declared = {rule["id"] for rule in doc["runs"][0]["tool"]["driver"]["rules"]}
    assert declared == set(KINDS)


def git_repository(tmp_path):
    """A repository with a torch_xla file two directories down, and the directory above it."""
    repo = tmp_path / "repo"
    (repo / "src" / "pkg").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "src" / "pkg" / "train.py").write_text(
        "import torch_xla.core.xla_model as xm\n\ndevice = xm.xla_device()\nt = xm.unlazy([])\n")
    return repo


@pytest.mark.parametrize("cwd, spelled", [
    ("", "."),                      # `--format github .` at the root
    ("", "./src/pkg/train.py"),     # ./ in front
    ("src", "pkg"),                 # from a subdirectory
    ("src/pkg", "ABSOLUTE"),        # an absolute path
])
def test_annotations_and_sarif_name_files_relative_to_the_repository(cli, tmp_path, cwd, spelled):
    """GitHub matches annotations and code-scanning alerts to files by their path relative to
    the repository root, wherever the tool runs and however the file was named."""
    repo = git_repository(tmp_path)
    where = repo / cwd
    target = str(repo / "src" / "pkg" / "train.py") if spelled == "ABSOLUTE" else spelled
    github = cli("rewrite", "--check", "--format", "github", target, cwd=where).stdout.decode()
    files = {line.split("file=", 1)[1].split(",", 1)[0] for line in github.splitlines()}
    assert files == {"src/pkg/train.py"}, github
    sarif = json.loads(cli("rewrite", "--check", "--format", "sarif", target, cwd=where).stdout)
    jsonschema.validate(sarif, SCHEMA)
    run = sarif["runs"][0]
    assert {json.dumps(r["locations"][0]["physicalLocation"]["artifactLocation"], sort_keys=True)
            for r in run["results"]} == {json.dumps({"uri": "src/pkg/train.py", "uriBaseId": "SRCROOT"}, sort_keys=True)}
    assert run["originalUriBaseIds"] == {"SRCROOT": {"uri": repo.as_uri() + "/"}}


def test_without_a_repository_files_are_named_from_the_working_directory(cli, tmp_path):
    (tmp_path / "work" / "src").mkdir(parents=True)
    (tmp_path / "work" / "src" / "train.py").write_text("import torch_xla.core.xla_model as xm\nd = xm.xla_device()\n")
    (tmp_path / "elsewhere.py").write_text("import torch_xla.core.xla_model as xm\nd = xm.xla_device()\n")
    github = cli("rewrite", "--check", "--format", "github", "src", str(tmp_path / "elsewhere.py"),
                 cwd=tmp_path / "work").stdout.decode()
    files = {line.split("file=", 1)[1].split(",", 1)[0] for line in github.splitlines()}
    assert files == {"src/train.py", (tmp_path / "elsewhere.py").as_posix()}  # outside it: absolute
