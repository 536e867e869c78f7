"""process_exit.py: the tool's own process ends without Python's teardown, and otherwise as
Python ends it (atexit functions, flushed output, status 120 when flushing fails)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow  # subprocesses

PROBE = """
import atexit, sys, threading, time
from tpu_migrate import process_exit

class Noisy:
    def __del__(self):
        print("freed", flush=True)

kept = Noisy()
atexit.register(print, "atexit ran")
print("output", end="")
if "thread" in sys.argv:
    threading.Thread(target=time.sleep, args=(0.5,)).start()
process_exit.owns_process = "owned" in sys.argv
process_exit.leave(3)
"""


def probe(*args: str, stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTHONUNBUFFERED", None)  # buffered, as on most machines: the flush at exit matters
    return subprocess.run([sys.executable, "-c", PROBE, *args], stdout=stdout, stderr=subprocess.PIPE,
                          text=True, env=env, timeout=60)


def test_the_tool_s_own_process_skips_the_teardown_only():
    owned = probe("owned")
    assert (owned.returncode, owned.stdout) == (3, "outputatexit ran\n")  # flushed; nothing freed
    for args in ([], ["owned", "thread"]):  # called from other code, or a thread Python would wait for
        plain = probe(*args)
        assert plain.returncode == 3 and plain.stdout.startswith("outputatexit ran\n"), args
        assert "freed" in plain.stdout, args


def test_a_failed_flush_exits_120_as_python_does():
    with open("/dev/full", "w") as full:
        owned = probe("owned", stdout=full)
        python = probe(stdout=full)
    assert owned.returncode == python.returncode == 120
    assert "tpu-migrate: cannot write to stdout: [Errno 28] No space left on device" in owned.stderr


def test_a_closed_stdout_is_not_a_failed_flush():
    """Python skips a closed stream at exit: a program that closed stdout exits with its status."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = "import sys\nfrom tpu_migrate import process_exit\nsys.stdout.close()\nprocess_exit.owns_process = {}\nprocess_exit.leave(3)\n"
    for owned in (True, False):
        run = subprocess.run([sys.executable, "-c", code.format(owned)], capture_output=True, text=True, env=env, timeout=60)
        assert (run.returncode, run.stderr) == (3, ""), (owned, run.stderr)


def test_the_command_ends_through_it(tmp_path):
    """`python -m tpu_migrate rewrite` owns its process; runpy.run_module from a program does
    not (the program goes on: tests/test_cache.py's probe prints after it)."""
    (tmp_path / "train.py").write_text("import torch_xla.core.xla_model as xm\n\nxm.mark_step()\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTHONUNBUFFERED", None)
    with open("/dev/full", "w") as full:
        run = subprocess.run([sys.executable, "-m", "tpu_migrate", "rewrite", "--check", "--no-cache", "train.py"],
                             cwd=tmp_path, stdout=full, stderr=subprocess.PIPE, text=True, env=env, timeout=300)
    assert run.returncode == 120 and "tpu-migrate: cannot write to stdout" in run.stderr, run.stderr
    embedded = subprocess.run(
        [sys.executable, "-c", "import runpy, sys\nsys.argv = ['tpu-migrate', 'rewrite', '--check', '--no-cache', 'train.py']\n"
         "try:\n    runpy.run_module('tpu_migrate', run_name='__main__')\nexcept SystemExit as exit:\n"
         "    print('went on after', exit.code)\n"],
        cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert embedded.stdout.endswith("went on after 1\n"), embedded.stdout + embedded.stderr
