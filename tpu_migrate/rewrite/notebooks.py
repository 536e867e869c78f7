"""Jupyter notebooks: rewrite the code cells as one module, then put them back.

The code cells are joined with a marker comment between them, so imports are managed across the
notebook (an `import torch` added once, at the top of the first cell; a torch_xla import in the
first cell removed only when no later cell uses it; an import the new code needs that the
notebook makes only in a later cell added at the top too). IPython syntax is not Python:

- line magics and shell lines (`%matplotlib`, `!pip install`) are swapped for a placeholder
  statement and restored afterwards. One that names what a torch_xla import bound
  (`%time xm.mark_step()`) or XLA_USE_BF16 (`%env XLA_USE_BF16=1`) gets a placeholder that
  names them too: the rules mark it with a TODO, and the imports it needs stay;
- a cell magic that runs its cell as Python (`%%time`, `%%capture`) is a magic line above
  Python: the cell is converted with the others;
- a `%%writefile x.py` cell is the file it writes: converted as a module of its own;
- any other cell magic (`%%bash`) keeps its cell whole.

Outputs and metadata are kept; a notebook with nothing to change is not written at all, so it
stays byte-identical. Findings name the cell: line numbers are within the cell.
"""

from __future__ import annotations

import ast
import json
import re
import warnings
from dataclasses import replace

from tpu_migrate.findings import FileResult, Manual, Note
from tpu_migrate.rewrite import dependencies
from tpu_migrate.rewrite.context import Options
from tpu_migrate.rewrite.engine import rewrite_bytes
from tpu_migrate.rewrite.files import prefilter
from tpu_migrate.rewrite.names import is_xla_name
from tpu_migrate.rewrite.transforms.environment import BF16_ENV
from tpu_migrate.rules import Catalog

CELL_MARKER = "# tpu-migrate-cell "
MAGIC = re.compile(r"^(\s*)([%!].*)$")
MAGIC_MARKER = "  # tpu-migrate-magic "  # ends each placeholder line (imports.py knows it too)
# Cell magics whose body IPython runs as Python, in the notebook's namespace.
PYTHON_CELL_MAGICS = frozenset({"time", "timeit", "capture", "prun"})
# Line magics whose argument is a Python statement (`%time xm.mark_step()`).
PYTHON_LINE_MAGICS = frozenset({"%time", "%timeit", "%prun"})
WRITEFILE = re.compile(r"^%%writefile\s+(?P<path>[^\s-]\S*\.py)\s*$")  # not -a: a part of a file
_WORD = re.compile(r"[A-Za-z_]\w*")


def rewrite_notebook(data: bytes, path: str, options: Options, catalog: Catalog | None = None) -> FileResult:
    import nbformat  # imported here: only notebooks need it

    result = FileResult(path)
    if not prefilter(data):
        return result
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            notebook = nbformat.reads(data.decode("utf-8"), as_version=nbformat.NO_CONVERT)
    except Exception as exc:  # noqa: BLE001 - nbformat raises many kinds for a bad file
        result.error = f"not a readable notebook: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return result
    installs = _install_findings(notebook, options)
    cells, files = [], []
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        magic = _cell_magic(cell.source)
        if magic is None or magic in PYTHON_CELL_MAGICS:
            cells.append(index)
        elif WRITEFILE.match(cell.source.lstrip().split("\n", 1)[0]):
            files.append(index)
    written = {index: _rewrite_written_file(index, notebook.cells[index].source, options, catalog, result)
               for index in files}
    if not cells:
        result.manual.extend(installs)
        return _write(result, notebook, data, {i: s for i, s in written.items() if s is not None}, caught)
    xla_names = _xla_bound_names(notebook, cells)
    magics: list[str] = []
    parts: list[str] = []
    starts: dict[int, int] = {}  # notebook cell index -> first line of its code in the module
    magic_columns: dict[int, int] = {}  # a placeholder's line in the module -> its magic's column
    line = 1
    for index in cells:
        parts.append(f"{CELL_MARKER}{index}")
        line += 1
        starts[index] = line
        source_lines = []
        for text in notebook.cells[index].source.split("\n"):
            match = MAGIC.match(text)
            if match:
                magic_columns[line + len(source_lines)] = len(match[1]) + 1
                source_lines.append(f"{match[1]}{_placeholder(match[2], xla_names)}{MAGIC_MARKER}{len(magics)}")
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

    def in_cell(finding):
        cell, within = cell_of(finding.line)
        # A finding on a magic's placeholder points at the magic, not into the placeholder.
        return replace(finding, line=within, cell=cell, col=magic_columns.get(finding.line, finding.col))

    result.fixes.extend(in_cell(finding) for finding in inner.fixes)
    result.manual.extend(in_cell(finding) for finding in inner.manual)
    for note in inner.notes:
        cell, within = cell_of(note.line)
        result.notes.append(replace(note, line=within, cell=cell))
    result.imports_xla = result.imports_xla or inner.imports_xla
    for kept in inner.kept_imports:
        cell, within = cell_of(kept.line)
        result.kept_imports.append(replace(kept, line=within, cell=cell))
    if inner.error_line is not None:  # name the cell, as findings do
        result.error_cell, result.error_line = cell_of(inner.error_line)
        result.error = inner.error.replace(f"at line {inner.error_line}:",
                                           f"at cell {result.error_cell}, line {result.error_line}:", 1)
    if result.error:  # left as it is, the cells it writes included
        return result
    result.manual.extend(installs)
    result.manual.sort(key=lambda m: (m.cell, m.line, m.col, m.code))
    result.fixes.sort(key=lambda f: (f.cell, f.line, f.col))
    changed = dict(_split_cells(inner.output.decode("utf-8"), magics)) if inner.changed else {}
    for index, source in changed.items():
        changed[index] = _own_import_kept(notebook.cells[index].source, source)
    changed.update({i: s for i, s in written.items() if s is not None})
    return _write(result, notebook, data, changed, caught)


def _write(result: FileResult, notebook, data: bytes, new_sources: dict[int, str],
           read_warnings: list[warnings.WarningMessage]) -> FileResult:
    """`result` with the notebook whose cells get `new_sources`, where one differs.
    `read_warnings`: nbformat's, as it read the notebook."""
    import nbformat

    diffs = {}
    for index, source in sorted(new_sources.items()):
        old = notebook.cells[index].source
        if old.rstrip("\n") != source.rstrip("\n"):
            diffs[index] = (old, source)
            notebook.cells[index].source = source
    if diffs:
        result.changed = True
        result.original = data
        # A code cell the rewrite emptied (it only printed the metrics) goes, outputs and all,
        # as a reviewer would delete it; a cell the user left empty stays.
        emptied = {i for i, (old, new) in diffs.items() if old.strip() and not new.strip()}
        if emptied:
            notebook.cells = [cell for i, cell in enumerate(notebook.cells) if i not in emptied]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result.output = _in_input_order(nbformat.writes(notebook), data).encode("utf-8")
        # What nbformat repaired (`read_warnings`) shows in what is written: said, in our words.
        result.notes.extend(_nbformat_notes([*read_warnings, *caught], data))
        if not result.output.endswith(b"\n"):
            result.output += b"\n"
        result.cell_diffs = diffs
    return result


def _own_import_kept(old: str, new: str) -> str:
    """A cell whose own top-level import (`import torch`) comes after the code that now needs it
    gets the import added above that code: the cell's own one then goes, rather than be
    imported twice (the added line is the cell's import, moved up)."""
    lines = new.split("\n")
    for statement in dict.fromkeys(t for t in lines if t.startswith("import ") and t == t.rstrip()):
        had, has = old.split("\n").count(statement), lines.count(statement)
        if 1 <= had < has:
            extra = has - had
            for i in range(len(lines) - 1, -1, -1):  # the later ones: the cell's own, below
                if extra and lines[i] == statement:
                    del lines[i]
                    extra -= 1
    return "\n".join(lines)


def _in_input_order(written: str, data: bytes) -> str:
    """nbformat's text with the input's key order and its form of each cell's source (one
    string or a list of lines): a notebook not written by Jupyter (keys not sorted) shows only
    its changed cells in the diff. A Jupyter notebook (sorted keys, sources as lists) is
    written as nbformat writes it."""
    try:
        before = json.loads(data.decode("utf-8"))
        after = json.loads(written)
    except ValueError:
        return written
    return json.dumps(_ordered(after, before), sort_keys=False, indent=1, ensure_ascii=False,
                      separators=(",", ": "))


def _ordered(after, before):
    if isinstance(after, dict) and isinstance(before, dict):
        keys = [k for k in before if k in after] + [k for k in after if k not in before]
        return {k: (_source(after[k], before[k]) if k == "source" else _ordered(after[k], before.get(k)))
                for k in keys}
    if isinstance(after, list) and isinstance(before, list):
        if len(after) == len(before):
            return [_ordered(a, b) for a, b in zip(after, before)]
        ids = {b.get("id"): b for b in before if isinstance(b, dict) and b.get("id")}
        return [_ordered(a, ids.get(a.get("id")) if isinstance(a, dict) else None) for a in after]
    return after


def _source(after, before):
    if isinstance(before, str) and isinstance(after, list):
        return "".join(after)
    return after


def _nbformat_notes(caught: list[warnings.WarningMessage], data: bytes) -> list[Note]:
    """nbformat's warnings (kept off stderr) in the tool's words: what it repaired in the
    notebook it read, which the rewritten notebook keeps."""
    notes, said = [], set()
    for warning in caught:
        kind = type(warning.message).__name__
        if kind in said:
            continue
        said.add(kind)
        if kind == "MissingIDFieldWarning":
            try:
                missing = [i for i, cell in enumerate(json.loads(data)["cells"]) if "id" not in cell]
            except (ValueError, KeyError, TypeError):
                missing = []
            which = f"{len(missing)} cell(s), the first cell {missing[0]}," if missing else "cells"
            notes.append(Note(1, f"{which} have no `id`, which notebook format 4.5 requires: the rewritten "
                                 "notebook gives each one (nbformat does so, as Jupyter does when it saves)"))
        elif kind == "DuplicateCellId":
            notes.append(Note(1, "cells share an `id`: the rewritten notebook gives each repeat a new one "
                                 f"(nbformat: {str(warning.message).splitlines()[0]})"))
        else:
            notes.append(Note(1, f"nbformat: {str(warning.message).splitlines()[0]}"))
    return notes


def _cell_magic(source: str) -> str | None:
    """The name of the cell magic a cell starts with (`%%time` -> "time"), if any."""
    stripped = source.lstrip()
    if not stripped.startswith("%%"):
        return None
    return stripped[2:].split(None, 1)[0] if stripped[2:].strip() else ""


def _rewrite_written_file(index: int, source: str, options: Options, catalog: Catalog | None,
                          result: FileResult) -> str | None:
    """The new source of cell `index`, a `%%writefile x.py` cell (None: unchanged): its body
    rewritten as the module it writes. Its findings go into `result` under the cell, with the
    cell's line numbers (the magic is line 1); an error in it is a note, as the other cells
    still convert."""
    lead = source[:len(source) - len(source.lstrip())]
    magic, _, body = source[len(lead):].partition("\n")
    offset = lead.count("\n") + 1
    # Under the written file's name: a module of its own (a setup.py is one), not a notebook.
    inner = rewrite_bytes(body.encode("utf-8"), WRITEFILE.match(magic)["path"], options, catalog)
    if inner.error:
        line = inner.error_line + offset if inner.error_line else 1
        result.notes.append(Note(line, f"the file this cell writes ({magic}) is not converted: {inner.error}",
                                 cell=index))
        return None
    result.fixes.extend(replace(f, line=f.line + offset, cell=index) for f in inner.fixes)
    result.manual.extend(replace(m, line=m.line + offset, cell=index) for m in inner.manual)
    result.notes.extend(replace(n, line=n.line + offset, cell=index) for n in inner.notes)
    result.imports_xla = result.imports_xla or inner.imports_xla
    result.kept_imports.extend(replace(k, line=k.line + offset, cell=index) for k in inner.kept_imports)
    if not inner.changed:
        return None
    return f"{lead}{magic}\n{inner.output.decode('utf-8')}"


def _xla_bound_names(notebook, cells: list[int]) -> frozenset[str]:
    """The names the notebook's imports of torch_xla / optimum.tpu bind (`xm`, `torch_xla`),
    in the cells that parse."""
    found = set()
    for index in cells:
        source = "\n".join("pass" if MAGIC.match(text) else text for text in notebook.cells[index].source.split("\n"))
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found.update(alias.asname or alias.name.split(".")[0] for alias in node.names if is_xla_name(alias.name))
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and is_xla_name(node.module or ""):
                found.update(alias.asname or alias.name for alias in node.names if alias.name != "*")
    return frozenset(found)


def _placeholder(magic: str, xla_names: frozenset[str]) -> str:
    """The statement that stands for an IPython line: `pass`, or a tuple of the torch_xla names
    (in a magic whose argument is Python) and bf16 variables it names, for the rules to mark
    (and to keep those imports)."""
    words = set(_WORD.findall(magic))
    python = magic.split(None, 1)[0] in PYTHON_LINE_MAGICS
    named = [*sorted(words & xla_names if python else ()), *(repr(name) for name in sorted(words & BF16_ENV))]
    return f"({', '.join(named)},)" if named else "pass"


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
        if MAGIC_MARKER in text:
            number = int(text.rsplit(MAGIC_MARKER, 1)[1].split()[0])
            text = magics[number]
        if current is None:
            preamble.append(text)
        else:
            sources[current].append(text)
    result = {}
    for index, lines in sources.items():
        # A cell magic must stay the cell's first line: what was added above it goes below.
        magic = next((i for i, text in enumerate(lines) if text.startswith("%%")), None)
        if magic:
            lines.insert(0, lines.pop(magic))
        while lines and lines[-1] == "":
            lines.pop()
        result[index] = "\n".join(lines)
    return result
