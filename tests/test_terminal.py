"""report/terminal.py: the rewrite decides "terminal or not" as rich does, and its plain output
(CI, pre-commit, pipes) never imports rich."""

from __future__ import annotations

import io
import itertools
import os
import subprocess
import sys

import pytest
from rich.console import Console

from conftest import ROOT
from tpu_migrate.report import terminal

ENVIRONMENTS = [
    {name: value for name, value in zip(("TTY_COMPATIBLE", "FORCE_COLOR"), values) if value is not None}
    for values in itertools.product([None, "0", "1", ""], [None, "", "1"])
]


@pytest.mark.parametrize("environment", ENVIRONMENTS, ids=lambda e: ",".join(f"{k}={v}" for k, v in e.items()) or "none")
@pytest.mark.parametrize("stream_kind", ["tty", "pipe", "stringio"])
def test_the_answer_is_rich_s(monkeypatch, environment, stream_kind):
    for name in ("TTY_COMPATIBLE", "FORCE_COLOR"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    if stream_kind == "stringio":
        stream = io.StringIO()
    else:
        reading, writing = os.openpty() if stream_kind == "tty" else os.pipe()
        os.close(reading)
        stream = open(writing, "w")
    with stream:
        assert terminal.is_terminal(stream) == Console(file=stream).is_terminal


def test_a_closed_stream_is_no_terminal():
    stream = io.StringIO()
    stream.close()
    assert terminal.is_terminal(stream) is False


@pytest.mark.slow
def test_a_check_into_a_pipe_never_imports_rich(tmp_path):
    """rich costs about 40 ms of every start; the plain output does not need it. On a terminal
    (as FORCE_COLOR makes rich believe) the summary is rich's table."""
    (tmp_path / "train.py").write_text("import torch_xla.core.xla_model as xm\n\nxm.mark_step()\n")
    probe = ("import runpy, sys\n"
             "sys.argv = ['tpu-migrate', 'rewrite', '--check', '--no-cache', 'train.py']\n"
             "try:\n    runpy.run_module('tpu_migrate', run_name='__main__')\n"
             "except SystemExit:\n    pass\n"
             "print('rich imported:', any(m.split('.')[0] == 'rich' for m in sys.modules))\n")
    environment = {name: value for name, value in os.environ.items() if name not in ("TTY_COMPATIBLE", "FORCE_COLOR")}
    environment["PYTHONPATH"] = str(ROOT)
    plain = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True,
                           env=environment, timeout=300)
    assert "1 file(s) scanned, 1 would change" in plain.stdout, plain.stdout + plain.stderr
    assert plain.stdout.endswith("rich imported: False\n"), plain.stdout[-2000:]
    drawn = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True,
                           env={**environment, "FORCE_COLOR": "1"}, timeout=300)
    assert "┃" in drawn.stdout and "file(s) scanned" not in drawn.stdout, drawn.stdout
    assert drawn.stdout.endswith("rich imported: True\n")
