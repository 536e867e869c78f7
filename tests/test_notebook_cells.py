"""Notebooks run cell by cell, top to bottom: what the rewrite adds must be defined before the
first cell that uses it, and IPython's magics that hold Python (`%%time`, `%time`,
`%%writefile x.py`) are converted or marked, never left needing an import that went away."""

from __future__ import annotations

import contextlib
import io
import os

import nbformat
import pytest

from tpu_migrate.rewrite.context import Options
from tpu_migrate.rewrite.notebooks import rewrite_notebook

TODO = "# TODO(tpu-migrate): "


def convert(*sources: str, target: str = "tpu"):
    """The result of rewriting a notebook of these code cells (after a markdown cell, so that a
    cell's index is its position in `sources` plus one), and the new cell sources."""
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_markdown_cell("# notes")] + [nbformat.v4.new_code_cell(s) for s in sources]
    result = rewrite_notebook(nbformat.writes(notebook).encode(), "nb.ipynb", Options(target=target))
    assert result.error is None, result.error
    written = nbformat.reads(result.output.decode(), as_version=4) if result.changed else notebook
    return result, [cell.source for cell in written.cells[1:]]


def run_cells(sources: list[str]) -> str:
    """Run the cells in order in one namespace, as a kernel does (the magics used here done by
    hand), and return what they printed."""
    namespace = {"__name__": "__main__"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for index, source in enumerate(sources):
            if source.startswith("%%time\n"):
                source = source.split("\n", 1)[1]
            lines = [line.removeprefix("%time ") for line in source.split("\n")]
            exec(compile("\n".join(lines), f"<cell {index + 1}>", "exec"), namespace)
    return out.getvalue()


def test_what_the_rewrite_adds_is_defined_before_the_first_cell_that_uses_it():
    """The class for xm.RateTracker and the rank helpers go into the first cell, and so does
    `import os` for them, though the notebook imports os only in its last cell: run in order,
    the cells print what torch_xla printed in one process (pytorch/xla's mnist-training
    notebook failed with a NameError in its training cell)."""
    result, cells = convert(
        "import time\nimport torch_xla.core.xla_model as xm\nimport torch_xla.runtime as xr\n"
        "def train(n):\n    t = xm.RateTracker()\n    t.add(n)\n    return t.rate()",
        "print(train(8) >= 0, xm.get_ordinal(), xr.world_size())",
        "import os\nimport json\nprint(json.dumps([os.sep]))",
        target="portable")
    assert "class _RateTracker" in cells[0] and "def _rank" in cells[0] and "\nimport os\n" in f"\n{cells[0]}"
    assert cells[1] == "print(train(8) >= 0, _rank(), _world_size())"
    assert cells[2] == "import os\nimport json\nprint(json.dumps([os.sep]))"
    assert run_cells(cells) == f'True 0 1\n["{os.sep}"]\n'


def test_an_import_made_before_any_code_runs_is_used_as_it_is():
    result, cells = convert("import os\nimport torch\nimport torch_xla.core.xla_model as xm\nprint(xm.get_ordinal())")
    assert cells[0].count("import os") == 1 and "print(_rank())" in cells[0]


def test_a_cell_run_under_a_cell_magic_is_converted_below_its_magic():
    result, cells = convert(
        "%%time\nimport torch\nimport torch_xla.core.xla_model as xm\nprint(xm.get_ordinal())",
        "%%capture\ndevice = xm.xla_device()")
    # What the rewrite adds goes below the magic, which must stay the cell's first line.
    assert cells[0].startswith("%%time\nimport os\n") and "def _rank" in cells[0]
    assert cells[0].endswith("\nprint(_rank())")
    assert cells[1] == '%%capture\ndevice = torch.device("tpu")'
    assert [(f.code, f.cell, f.line) for f in result.fixes] == [("TPU021", 1, 4), ("TPU001", 2, 2)]


def test_a_python_line_magic_keeps_its_torch_xla_import_and_gets_a_todo():
    source = "import torch\nimport torch_xla.core.xla_model as xm\ndevice = xm.xla_device()\n%time xm.mark_step()"
    result, cells = convert(source)
    assert cells[0] == (
        'import torch\nimport torch_xla.core.xla_model as xm\ndevice = torch.device("tpu")\n'
        f"{TODO}TPU099 `xm` (torch_xla.core.xla_model) has no automatic TorchTPU conversion\n%time xm.mark_step()")
    assert [(m.code, m.cell, m.line, m.col) for m in result.manual] == [("TPU099", 1, 4, 1)]
    # Converted once, the notebook is what a second run leaves (the TODO is not added again).
    again, cells_again = convert(*cells)
    assert cells_again == cells and [(m.code, m.line) for m in again.manual] == [("TPU099", 5)]


def test_shell_lines_name_torch_xla_without_being_python():
    """`!pip install torch_xla` is not a use of the `torch_xla` module: only TPU098 reports it."""
    result, cells = convert("!pip install torch_xla[tpu]\nimport torch_xla\nimport torch_xla.core.xla_model as xm\n"
                            "device = xm.xla_device()")
    assert [m.code for m in result.manual] == ["TPU098"]
    assert cells[0] == '!pip install torch_xla[tpu]\nimport torch\ndevice = torch.device("tpu")'


def test_xla_use_bf16_set_by_a_magic_or_a_shell_line_is_marked():
    result, cells = convert("import torch_xla.core.xla_model as xm\n%env XLA_USE_BF16=1\ndevice = xm.xla_device()",
                            "!XLA_USE_BF16=1 python train.py")
    assert [(m.code, m.cell, m.line) for m in result.manual] == [("TPU141", 1, 2), ("TPU141", 2, 1)]
    assert cells[1].startswith(f"{TODO}TPU141 XLA_USE_BF16 is set or read here") and \
        cells[1].endswith("\n!XLA_USE_BF16=1 python train.py")


def test_a_writefile_cell_is_converted_as_the_file_it_writes():
    """Kaggle notebooks write their training script with %%writefile and run it with !python:
    the script is what must change, converted on its own (its imports are its own)."""
    script = "%%writefile train.py\nimport torch_xla.core.xla_model as xm\nprint(xm.xla_device())"
    result, cells = convert("import os", script, "%%writefile -a train.py\nprint(xm.xla_device())",
                            "%%writefile broken.py\nimport torch_xla.core.xla_model as xm\nprint(")
    assert cells[1] == '%%writefile train.py\nimport torch\nprint(torch.device("tpu"))'
    assert cells[2] == "%%writefile -a train.py\nprint(xm.xla_device())"  # a part of a file: left alone
    assert cells[3].endswith("print(")  # not Python: left as it is, with a note
    assert [(f.code, f.cell, f.line, f.col) for f in result.fixes] == [("TPU001", 2, 3, 7)]
    assert [(n.cell, n.line) for n in result.notes] == [(4, 3)]
    assert "%%writefile broken.py" in result.notes[0].message


@pytest.mark.parametrize("magic", ["%%bash", "%%html"])
def test_other_cell_magics_stay_whole(magic):
    result, cells = convert(f"{magic}\nimport torch_xla.core.xla_model as xm")
    assert not result.changed and cells == [f"{magic}\nimport torch_xla.core.xla_model as xm"]


def test_a_cell_s_own_import_is_used_not_doubled():
    """Issue 51: the `import torch` the rewrite adds above a cell's code landed above the cell's
    own `import torch` (further down, after a use that became torch's): imported twice."""
    _, sources = convert("import torch_xla.core.xla_model as xm\ndev = xm.xla_device()\nimport torch\n"
                         "x = torch.ones(2).to(dev)")
    assert sources[0].split("\n").count("import torch") == 1
    assert sources[0].startswith("import torch\n")


def test_a_notebook_not_written_by_jupyter_keeps_its_key_order():
    """Issue 51: nbformat writes sorted keys and sources as lists of lines: a notebook written
    otherwise (keys in another order, a source as one string) showed every cell in the diff."""
    import json

    cell = {"source": "import torch_xla.core.xla_model as xm\ndev = xm.xla_device()", "outputs": [],
            "cell_type": "code", "metadata": {}, "execution_count": None, "id": "c1"}
    kept = {"source": "print(1)", "outputs": [], "cell_type": "code", "metadata": {},
            "execution_count": None, "id": "c2"}
    data = json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [cell, kept]}, indent=1)
    result = rewrite_notebook(data.encode(), "nb.ipynb", Options(target="tpu"))
    assert result.changed
    before, after = data.splitlines(), result.output.decode().splitlines()
    assert len(before) == len(after)
    assert [i for i, (a, b) in enumerate(zip(before, after)) if a != b] == [before.index(
        next(line for line in before if "xla_device" in line))]


def test_a_cell_the_rewrite_empties_goes_and_an_empty_cell_of_the_user_stays():
    """A cell that only printed torch_xla's metrics (or a flag that only guarded that print)
    has nothing left: it is deleted, with its outputs, as a reviewer would; the findings still
    name the cells of the notebook as it was."""
    result, sources = convert(
        "import torch\nimport torch_xla.debug.metrics as met\ncfg = {'metrics': True}",
        "if cfg.get('metrics'):\n    print(met.metrics_report())",
        "",
        "print(met.metrics_report())",
        "print(torch.ones(2).sum())",
    )
    assert sources == ["import torch\ncfg = {'metrics': True}", "", "print(torch.ones(2).sum())"]
    assert sorted(f.cell for f in result.fixes if f.code == "TPU157") == [2, 4]
