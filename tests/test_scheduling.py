"""The xdist scheduler of tests/scheduling.py on a real two-worker run: the tests of a grouped
module (and of a module that joins it), and of a group of single tests, all run on one worker, and the others are spread
(xdist's own `--dist loadgroup` stopped grouping on pytest 9.2: see scheduling.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a pytest run with two workers

TESTS = Path(__file__).resolve().parent

CONFTEST = f'''
import sys
sys.path.insert(0, {str(TESTS)!r})
import pytest


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    import scheduling
    pinned = {{f"test_apart.py::test_apart[{{i}}]": "pair" for i in (0, 5)}}
    return scheduling.Groups(config, log, {{"test_together": "test_together", "test_joins": "test_together"}}, pinned)
'''

MODULE = '''
import os
import time

import pytest


@pytest.mark.parametrize("i", range({count}))
def test_{name}(i):
    time.sleep(0.3)  # long enough that one worker cannot take every test alone
    with open(os.path.join(os.path.dirname(__file__), "ran.log"), "a") as log:  # workers' output is not shown
        log.write(f"{{os.environ['PYTEST_XDIST_WORKER']}} {name} {{i}}\\n")
'''


def test_grouped_tests_share_one_worker(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    for name, count in (("together", 6), ("apart", 6), ("joins", 2)):  # joins: together's unit
        (tmp_path / f"test_{name}.py").write_text(textwrap.dedent(MODULE.format(name=name, count=count)))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist",
                           "loadgroup", "-q", "-c", "/dev/null", "--rootdir", str(tmp_path), str(tmp_path)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ran = [line.split() for line in (tmp_path / "ran.log").read_text().splitlines()]
    workers = {(name, int(i)): worker for worker, name, i in ran}
    assert len(workers) == 14, proc.stdout
    assert len({workers["together", i] for i in range(6)} | {workers["joins", i] for i in range(2)}) == 1, workers
    assert workers["apart", 0] == workers["apart", 5], workers
    assert set(workers.values()) == {"gw0", "gw1"}, workers
