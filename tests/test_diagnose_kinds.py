"""The kinds of diagnose finding come from one table (tpu_migrate/diagnose/kinds.py): `explain`
shows each, and --fail-on, the pytest marker and the SARIF / GitHub formats read the same one."""

from __future__ import annotations

import json

import pytest

from tpu_migrate.diagnose import kinds
from tpu_migrate.report import ci_formats


@pytest.mark.parametrize("kind", kinds.CATALOG, ids=lambda k: k.name)
def test_explain_shows_each_finding_kind(cli, kind):
    result = cli("explain", kind.name.upper())
    assert result.returncode == 0, result.stderr
    out = result.stdout.decode()
    assert out.startswith(f"{kind.name} (diagnose finding, {kind.severity})\n{kind.summary}\n")
    for part in ("**What.**", "**Why.**", "**How to fix.**"):
        assert part in out
    assert ("`--fail-on" in out and "exits 1" in out) == kind.fails


def test_explain_still_refuses_an_unknown_name(cli):
    result = cli("explain", "recompiles")
    assert result.returncode == 2 and b"unknown rule 'recompiles'" in result.stderr


def test_fail_on_names_are_the_catalog_problems(cli):
    result = cli("diagnose", "--fail-on", "bogus", "train.py")
    assert result.returncode == 2
    listed = result.stderr.decode().split("; use ")[1].split(" or any")[0].split(", ")
    assert listed == [k.name for k in kinds.CATALOG if k.severity != "note"]
    assert set(kinds.INFO_KINDS) == {"compile", "closure-read"}


def test_every_finding_the_analysis_makes_is_in_the_catalog():
    from tpu_migrate.diagnose import analysis

    assert set(analysis.EVENT_KINDS.values()) | {"compile", "closure-read"} <= set(kinds.KINDS)


def test_pytest_marker_accepts_the_fail_on_names():
    from tpu_migrate import pytest_plugin

    assert pytest_plugin.KINDS == kinds.FAIL_KINDS


def test_ci_formats_take_levels_and_rules_from_the_catalog():
    findings = [{"kind": k.name, "file": "/src/train.py", "line": i + 1, "message": k.name, "explanation": None}
                for i, k in enumerate(kinds.CATALOG)]
    run = json.loads(ci_formats.diagnose_sarif(findings))["runs"][0]
    rules = {r["id"]: r["shortDescription"]["text"] for r in run["tool"]["driver"]["rules"]}
    assert rules == {k.name: k.summary for k in kinds.CATALOG}
    assert [r["level"] for r in run["results"]] == [k.severity for k in kinds.CATALOG]
    github = ci_formats.diagnose_github(findings).splitlines()
    assert [line.split(" ", 1)[0] for line in github] == [
        "::notice" if k.severity == "note" else "::warning" for k in kinds.CATALOG]
