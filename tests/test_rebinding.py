"""A torch_xla name that the program binds again is the program's own from there on: the
migrated fixture programs (portable target, torch_xla blocked) make the same calls as the
originals (torch_xla on its CPU backend), and none of them raises NameError."""

from __future__ import annotations

import shutil

import pytest

import differential as harness
from fixture_spec import FIXTURES, expected_path

pytestmark = pytest.mark.slow  # real torch_xla programs and their migrations

CASES = [FIXTURES / "TPU010-step-marker" / f"{name}.in.py" for name in ("leave_alone_rebound", "rebound")]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name[:-6])
def test_rebound_names_run_as_before(case, tmp_path):
    original = harness.run_original(case)
    copy = tmp_path / "migrated.py"
    shutil.copyfile(expected_path(case, "portable"), copy)
    migrated = harness.run_migrated(copy, tmp_path)
    assert original.returncode == 0, original.output[-3000:]
    assert migrated.returncode == 0, migrated.output[-3000:]
    calls = [r["calls"] for r in original.records]
    assert calls and calls[0], original.output[-3000:]
    assert [r["calls"] for r in migrated.records] == calls
