"""Notebooks: code cells rewritten as one module, magics kept, outputs kept, cells named."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow  # the CLI as a subprocess

NOTEBOOKS = ROOT / "fixtures" / "notebooks"


def cells(path):
    return json.loads(path.read_text())["cells"]


def text(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def test_notebook_is_rewritten_across_cells(cli, tmp_path):
    notebook = tmp_path / "train.ipynb"
    shutil.copyfile(NOTEBOOKS / "train_xla.ipynb", notebook)
    before = cells(notebook)
    result = cli("rewrite", str(notebook))
    assert result.returncode == 1  # changed, and one manual finding
    after = cells(notebook)
    source = [text(c) for c in after]
    # Shell lines and magics survive untouched; a %%writefile cell is converted as the file it writes.
    assert source[1] == "!pip install torch-xla\n%env PJRT_DEVICE=TPU"
    assert "%matplotlib inline" in source[2] and 'device = torch.device("tpu")' in source[2]
    assert source[3] == '%%writefile helper.py\nimport torch\nprint(torch.device("tpu"))'
    # Imports are managed across the notebook: xm is still used in the last cell, so it stays.
    assert "import torch_xla.core.xla_model as xm" in source[2]
    assert "import torch.distributed as dist" in source[2]
    assert "xm.mark_step()" not in source[4] and "print(x)" in source[4]
    assert "# TODO(tpu-migrate): TPU099" in source[5]
    # Outputs, execution counts and metadata are kept.
    assert after[4]["outputs"] == before[4]["outputs"] and after[4]["execution_count"] == 3
    assert json.loads(notebook.read_text())["metadata"] == json.loads(
        (NOTEBOOKS / "train_xla.ipynb").read_text())["metadata"]
    # A second run changes nothing.
    again = notebook.read_bytes()
    cli("rewrite", str(notebook))
    assert notebook.read_bytes() == again


def test_findings_and_diffs_name_the_cell(cli, tmp_path):
    notebook = tmp_path / "train.ipynb"
    shutil.copyfile(NOTEBOOKS / "train_xla.ipynb", notebook)
    result = cli("rewrite", "--diff", "--notebook-diff", "cells", str(notebook))
    out = result.stdout.decode()
    assert f"--- {notebook}:cell 2\n+++ {notebook}:cell 2\n" in out
    assert f"{notebook}:cell 5:2:7 TPU099" in out
    doc = json.loads(cli("rewrite", "--check", "--format", "json", str(notebook)).stdout)
    manual = doc["files"][0]["manual"]
    # `!pip install torch-xla` (cell 1) is reported too: the notebook still installs torch_xla.
    assert [(m["code"], m["cell"], m["line"]) for m in manual] == [("TPU098", 1, 1), ("TPU099", 5, 2)]


def test_install_lines_of_torch_xla_are_reported_and_kept(tmp_path):
    import nbformat

    from tpu_migrate.rewrite.context import Options
    from tpu_migrate.rewrite.notebooks import rewrite_notebook

    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell("!pip install -q torch_xla[tpu] -f https://example.com\n%pip install numpy"),
        nbformat.v4.new_code_cell("%%bash\npip install optimum-tpu"),
        nbformat.v4.new_code_cell("!pip install torch torchvision\n%conda install torch-xla"),
        nbformat.v4.new_markdown_cell("!pip install torch_xla"),
    ]
    data = nbformat.writes(notebook).encode()
    result = rewrite_notebook(data, "nb.ipynb", Options())
    assert not result.changed and result.error is None  # a report line; the cells stay
    assert [(m.code, m.cell, m.line, m.col) for m in result.manual] == [
        ("TPU098", 0, 1, 17), ("TPU098", 1, 2, 13), ("TPU098", 2, 2, 16),
    ]
    assert "torch_xla[tpu]" in result.manual[0].message
    assert rewrite_notebook(data, "nb.ipynb", Options(ignore=frozenset({"TPU098"}))).manual == []


def test_notebook_with_nothing_to_change_stays_byte_identical(cli, tmp_path):
    for name in ("clean.ipynb", "train_xla.ipynb"):
        shutil.copyfile(NOTEBOOKS / name, tmp_path / name)
    original = (tmp_path / "clean.ipynb").read_bytes()
    result = cli("rewrite", str(tmp_path))  # directories include *.ipynb
    assert result.returncode == 1
    assert (tmp_path / "clean.ipynb").read_bytes() == original
    assert (tmp_path / "train_xla.ipynb").read_bytes() != (NOTEBOOKS / "train_xla.ipynb").read_bytes()


def test_broken_notebook_is_an_error(cli, tmp_path):
    bad = tmp_path / "bad.ipynb"
    bad.write_text('{"cells": [ "xla"')
    result = cli("rewrite", str(bad))
    assert result.returncode == 2
    assert f"{bad}: error: not a readable notebook" in result.stderr.decode()
    assert bad.read_text() == '{"cells": [ "xla"'


def notebook_with(tmp_path, *sources: str):
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps({
        "cells": [{"cell_type": "markdown", "id": "m0", "metadata": {}, "source": "# notes"}] + [
            {"cell_type": "code", "id": f"c{i}", "execution_count": None, "metadata": {}, "outputs": [],
             "source": source} for i, source in enumerate(sources, start=1)],
        "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def test_an_open_todo_in_a_cell_is_manual_work_named_by_its_cell(cli, tmp_path):
    notebook = notebook_with(tmp_path, "import torch", "x = 1\n# TODO(tpu-migrate): TPU060 start the workers\nrun()")
    result = cli("rewrite", "--check", str(notebook))
    assert result.returncode == 1
    assert f"{notebook}:cell 2:2:1 TPU060 start the workers\n".encode() in result.stdout
    assert b"1 manual finding(s)" in result.stdout


def test_a_rewritten_notebook_reports_its_todo_once(cli, tmp_path):
    notebook = tmp_path / "train.ipynb"
    shutil.copyfile(NOTEBOOKS / "train_xla.ipynb", notebook)
    cli("rewrite", str(notebook))
    again = cli("rewrite", "--check", str(notebook))
    assert again.returncode == 1
    assert again.stdout.decode().count("TPU099") == 2  # the finding line and the summary line
    # and the notebook's `!pip install` of torch_xla (TPU098), which no comment can mark
    assert again.stdout.decode().count("TPU098") == 2
    assert b"2 manual finding(s)" in again.stdout


@pytest.mark.parametrize("tool", ["git apply", "patch -p1"])
def test_the_diff_of_a_tree_with_a_notebook_applies_as_it_is(cli, tmp_path, tool):
    """`--diff . > x.diff && git apply x.diff` (or `patch -p1`) gives what a write run gives:
    the notebook's diff is its .ipynb file's, not per-cell sections whose headers are no paths."""
    import subprocess

    tree = tmp_path / "tree"
    tree.mkdir()
    shutil.copyfile(NOTEBOOKS / "train_xla.ipynb", tree / "train.ipynb")
    (tree / "train.py").write_text("import torch_xla.core.xla_model as xm\n\ndevice = xm.xla_device()\n")
    written = tmp_path / "written"
    shutil.copytree(tree, written)
    cli("rewrite", ".", cwd=written)
    diff = cli("rewrite", "--diff", ".", cwd=tree).stdout
    headers = [line for line in diff.decode().splitlines() if line.startswith(("--- ", "+++ "))]
    assert headers == ["--- a/train.ipynb", "+++ b/train.ipynb", "--- a/train.py", "+++ b/train.py"]
    (tmp_path / "x.diff").write_bytes(diff)
    command = ["git", "apply", str(tmp_path / "x.diff")] if tool == "git apply" else \
        ["patch", "-p1", "-s", "-i", str(tmp_path / "x.diff")]
    applied = subprocess.run(command, cwd=tree, capture_output=True, text=True)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    for name in ("train.ipynb", "train.py"):
        assert (tree / name).read_bytes() == (written / name).read_bytes(), name
