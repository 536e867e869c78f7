"""Which children of a traced program get the tracer's environment (diagnose/inheritance.py):
what is or may start Python does, nothing else. The whole path, through real processes, is
tests/test_diagnose_stress.py::test_only_python_children_get_the_tracer_s_environment."""

from __future__ import annotations

import os
import shutil
import sys

import pytest

from tpu_migrate.diagnose import inheritance


def script(tmp_path, name: str, first_line: str) -> str:
    path = tmp_path / name
    path.write_text(f"{first_line}\nprint('hi')\n")
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize("first_line", ["#!/usr/bin/python3", "#!/usr/bin/env python3.11", "#!/usr/bin/env -S python3 -u",
                                        "#!/bin/bash", "#!/bin/sh -e"])
def test_scripts_run_by_python_or_a_shell_get_it(tmp_path, first_line):
    assert inheritance.wants_tracer(script(tmp_path, "run", first_line))


@pytest.mark.parametrize("first_line", ["#!/usr/bin/perl", "#!/usr/bin/env node", "", "#!"])
def test_other_scripts_do_not(tmp_path, first_line):
    assert not inheritance.wants_tracer(script(tmp_path, "run", first_line))


def test_interpreters_shells_and_launchers_get_it_other_programs_do_not(tmp_path):
    assert inheritance.wants_tracer(sys.executable)
    assert inheritance.wants_tracer(os.path.realpath(sys.executable))  # python3.11 itself
    assert inheritance.wants_tracer("/bin/sh") and inheritance.wants_tracer("/usr/bin/timeout")
    for program in ("git", "ls", "true"):
        assert not inheritance.wants_tracer(shutil.which(program), [program])
    assert not inheritance.wants_tracer(tmp_path / "missing")


def test_env_is_judged_by_the_command_it_runs():
    env = shutil.which("env")
    assert not inheritance.wants_tracer(env, ["env"])  # prints the environment
    assert not inheritance.wants_tracer(env, ["env", "-i", "A=1", "ls"])
    assert inheritance.wants_tracer(env, ["env", "A=1", "python3", "-c", "pass"])


def test_a_child_s_environment_gets_them_back_with_the_tool_first_on_its_path(monkeypatch):
    monkeypatch.setattr(inheritance, "_carried", {"TPU_MIGRATE_DIAGNOSE": "/run"})
    monkeypatch.setattr(inheritance, "_site", "/run/site")
    assert inheritance.with_tracer({"A": "1"}) == {"A": "1", "TPU_MIGRATE_DIAGNOSE": "/run", "PYTHONPATH": "/run/site"}
    child = inheritance.with_tracer({"PYTHONPATH": "/mine"})
    assert child["PYTHONPATH"] == f"/run/site{os.pathsep}/mine"
