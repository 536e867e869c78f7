"""Jupyter notebooks: rewrite the code cells as one module, then put them back.

The code cells are joined with a marker comment between them, so imports are managed across the
notebook (an `import torch` added once, at the top of the first cell; a torch_xla import in the
first cell removed only when no later cell uses it). IPython syntax is not Python: a cell that
starts with a cell magic (`%%writefile`, `%%bash`) is kept whole, and line magics and shell lines
(`%matplotlib`, `!pip install`) are swapped for a placeholder statement and restored afterwards.
Outputs and metadata are kept; a notebook with nothing to change is not written at all, so it
stays byte-identical. Findings name the cell: line numbers are within the cell.
"""

from __future__ import annotations

import re
from dataclasses import replace

from tpu_migrate.findings import FileResult, Manual
from tpu_migrate.rewrite import dependencies
from tpu_migrate.rewrite.context import Options
from tpu_migrate.rewrite.engine import rewrite_bytes
from tpu_migrate.rewrite.files import prefilter
from tpu_migrate.rules import Catalog

CELL_MARKER = "# tpu-migrate-cell "
MAGIC = re.compile(r"^(\s*)([%!].*)$")
PLACEHOLDER = "pass  # tpu-migrate-magic "


def rewrite_notebook(data: bytes, path: str, options: Options, catalog: Catalog | None = None) -> FileResult:
    import nbformat  # imported here: only notebooks need it

    result = FileResult(path)
    if not prefilter(data):
        return result
    try:
        notebook = nbformat.reads(data.decode("utf-8"), as_version=nbformat.NO_CONVERT)
    except Exception as exc:  # noqa: BLE001 - nbformat raises many kinds for a bad file
        result.error = f"not a readable notebook: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return result
    installs = _install_findings(notebook, options)
    cells = [i for i, cell in enumerate(notebook.cells)
             if cell.cell_type == "code" and not cell.source.lstrip().startswith("%%")]
    if not cells:
        result.manual.extend(installs)
        return result
    magics: list[str] = []
    parts: list[str] = []
    starts: dict[int, int] = {}  # notebook cell index -> first line of its code in the module
    line = 1
    for index in cells:
        parts.append(f"{CELL_MARKER}{index}")
        line += 1
        starts[index] = line
        source_lines = []
        for text in notebook.cells[index].source.split("\n"):
            match = MAGIC.match(text)
            if match:
                source_lines.append(f"{match[1]}{PLACEHOLDER}{len(magics)}")
                magics.append(text)
            else:
                source_lines.append(text)
        parts.append("\n".join(source_lines))
        line += len(source_lines)
    module = "\n".join(parts) + "\n"
    inner = rewrite_bytes(module.encode("utf-8"), path, options, catalog)
    result.error = f"{inner.error} (lines counted in the notebook's code cells)" if inner.error else None

    def cell_of(module_line: int) -> tuple[int, int]:
        owner = max((i for i in cells if starts[i] <= module_line), default=cells[0], key=lambda i: starts[i])
        return owner, module_line - starts[owner] + 1

    for finding in inner.fixes:
        cell, within = cell_of(finding.line)
        result.fixes.append(replace(finding, line=within, cell=cell))
    for finding in inner.manual:
        cell, within = cell_of(finding.line)
        result.manual.append(replace(finding, line=within, cell=cell))
    for note in inner.notes:
        cell, within = cell_of(note.line)
        result.notes.append(replace(note, line=within, cell=cell))
    result.imports_xla = inner.imports_xla
    for kept in inner.kept_imports:
        cell, within = cell_of(kept.line)
        result.kept_imports.append(replace(kept, line=within, cell=cell))
    if inner.error_line is not None:  # name the cell, as findings do
        result.error_cell, result.error_line = cell_of(inner.error_line)
        result.error = inner.error.replace(f"at line {inner.error_line}:",
                                           f"at cell {result.error_cell}, line {result.error_line}:", 1)
    if not result.error and installs:
        result.manual.extend(installs)
        result.manual.sort(key=lambda m: (m.cell, m.line, m.col, m.code))
    if not inner.changed:
        return result
    new_sources = _split_cells(inner.output.decode("utf-8"), magics)
    diffs = {}
    for index, source in new_sources.items():
        old = notebook.cells[index].source
        if old.rstrip("\n") != source.rstrip("\n"):
            diffs[index] = (old, source)
            notebook.cells[index].source = source
    if diffs:
        result.changed = True
        result.original = data
        result.output = nbformat.writes(notebook).encode("utf-8")
        if not result.output.endswith(b"\n"):
            result.output += b"\n"
        result.cell_diffs = diffs
    return result


def _install_findings(notebook, options: Options) -> list[Manual]:
    """TPU098 for the shell lines and magics that install torch_xla / optimum-tpu
    (`!pip install torch_xla[tpu]`, `%pip install torch-xla`, or such a line in a `%%bash`
    cell): a report line, the cell is left as it is."""
    if not options.enabled(dependencies.CODE):
        return []
    found = []
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        shell_cell = cell.source.lstrip().startswith(("%%bash", "%%sh", "%%script", "%%capture"))
        for number, text in enumerate(cell.source.split("\n"), start=1):
            if not (shell_cell or MAGIC.match(text)):
                continue
            install = dependencies.install_line(text)
            if install is not None:
                column, package = install
                found.append(Manual(dependencies.CODE, number, column + 1,
                                    dependencies.message(text.strip().lstrip("!%")), cell=index))
    return found


def _split_cells(module: str, magics: list[str]) -> dict[int, str]:
    """The rewritten module back into cell sources, magics restored."""
    sources: dict[int, list[str]] = {}
    current: int | None = None
    preamble: list[str] = []  # lines the rewriter put above the first marker (added imports)
    for text in module.split("\n"):
        stripped = text.strip()
        if stripped.startswith(CELL_MARKER):
            current = int(stripped[len(CELL_MARKER):])
            sources[current] = list(preamble)
            preamble = []
            continue
        if PLACEHOLDER in text:
            number = int(text.split(PLACEHOLDER, 1)[1].split()[0])
            text = magics[number]
        if current is None:
            preamble.append(text)
        else:
            sources[current].append(text)
    result = {}
    for index, lines in sources.items():
        while lines and lines[-1] == "":
            lines.pop()
        result[index] = "\n".join(lines)
    return result
