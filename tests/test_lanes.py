"""The fast lane's guard (conftest.pytest_runtest_makereport): with TPU_MIGRATE_FAST_LIMIT set, a
test that is not marked slow fails when it takes longer; marked ones and quick ones pass."""

from __future__ import annotations

from conftest import ROOT

pytest_plugins = ["pytester"]

TESTS = '''
import time

import pytest


def test_quick():
    pass


def test_dawdles():
    time.sleep(0.3)


@pytest.mark.slow
def test_marked_slow():
    time.sleep(0.3)
'''


def test_fast_lane_limit_fails_only_slow_unmarked_tests(pytester, monkeypatch):
    pytester.makeconftest((ROOT / "tests" / "conftest.py").read_text())
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n")
    pytester.makepyfile(test_timing=TESTS)
    monkeypatch.setenv("TPU_MIGRATE_FAST_LIMIT", "0.1")
    limited = pytester.runpytest("-q", "-p", "no:tpu_migrate")
    limited.assert_outcomes(passed=2, failed=1)
    limited.stdout.fnmatch_lines(["*call took 0.* s, over TPU_MIGRATE_FAST_LIMIT=0.1*", "FAILED *test_dawdles*"])
    monkeypatch.delenv("TPU_MIGRATE_FAST_LIMIT")
    pytester.runpytest("-q", "-p", "no:tpu_migrate").assert_outcomes(passed=3)
