"""The user's code beside each finding (issue 17, point 4): paths relative to the working
directory everywhere in the text and HTML reports, and when a problem happens inside a library,
the library call the user's line made and the library line where it happened (`via`)."""

from __future__ import annotations

import json
import textwrap

import pytest

from test_diagnose import diagnose

pytestmark = pytest.mark.slow  # torch_xla programs under diagnose

# A library the program calls: a directory named site-packages is library code to the tracer,
# as an installed package is.
LIBRARY = '''\
def log_every_step(loss):
    return _read(loss)


def _read(loss):
    return loss.item()  # the host read, two calls deep in the library
'''

PROGRAM = '''\
import sys

sys.path.insert(0, "site-packages")
import torch
import torch_xla
import trainlib

device = torch_xla.device()
weight = torch.ones(4, device=device, requires_grad=True)
for step in range(6):
    loss = (weight * step).sum()
    trainlib.log_every_step(loss)  # the user's line
    torch_xla.sync()
'''


def _project(tmp_path):
    (tmp_path / "site-packages").mkdir()
    (tmp_path / "site-packages" / "trainlib.py").write_text(LIBRARY)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text(textwrap.dedent(PROGRAM))


def test_a_read_inside_a_library_names_the_call_and_the_library_line(tmp_path):
    _project(tmp_path)
    result = diagnose("--format", "json", "src/train.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (read,) = [f for f in json.loads(result.stdout)["findings"] if f["kind"] == "sync"]
    assert read["line"] == 12 and read["source"] == "trainlib.log_every_step(loss)  # the user's line"
    # Outermost first: the function the user called, then the line that read.
    assert read["via"] == ["trainlib.py:2 in log_every_step", "trainlib.py:6 in _read"]


def test_text_and_html_show_relative_paths_and_the_library_call(tmp_path):
    _project(tmp_path)
    result = diagnose("--html", "report.html", "src/train.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    text = result.stderr  # the program's own output keeps stdout
    assert "src/train.py:12: sync: host sync `item` at src/train.py:12:" in text
    assert "    via trainlib.py:2 in log_every_step -> trainlib.py:6 in _read" in text
    assert str(tmp_path) not in text  # every path in the report, messages included, is relative
    page = (tmp_path / "report.html").read_text()
    assert '<div class="via">via trainlib.py:2 in log_every_step -&gt; trainlib.py:6 in _read</div>' in page
    assert str(tmp_path) not in page


def test_a_compile_in_torch_xla_names_the_library_call(tmp_path):
    """A graph compiled at the user's MpDeviceLoader loop compiles in torch_xla's own code: the
    loop header alone would not say why."""
    (tmp_path / "loop.py").write_text(textwrap.dedent('''\
        import torch
        import torch_xla
        import torch_xla.distributed.parallel_loader as pl

        device = torch_xla.device()
        batches = [torch.ones(8, 4) * i for i in range(8)] + [torch.ones(3, 4)]
        total = torch.zeros((), device=device)
        for batch in pl.MpDeviceLoader(batches, device):
            total = total + batch.sum()
        print(total.item())
    '''))
    result = diagnose("--format", "json", "loop.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    compiles = [f for f in json.loads(result.stdout)["findings"] if f["kind"] in ("compile", "recompile")]
    assert compiles, result.stdout
    for finding in compiles:
        assert finding["line"] == 8 and finding["via"], finding
        assert finding["via"][0].startswith("torch_xla/distributed/parallel_loader.py:"), finding["via"]
        assert finding["via"][0].endswith(" in __next__") and str(tmp_path) not in finding["message"]
