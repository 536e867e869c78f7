"""The project the rewrite's project-wide passes read, read once for all of them.

Three passes look past the files being rewritten, before the rewrite: the SPMD programs
(spmd_programs.py), the parameters that reach torch_xla calls (parameter_flows.py) and the
launches that stay torch_xla's (kept_launches.py). Each needs the project's root, its Python
files and notebooks, the directories its imports are searched from, the files' bytes, some of
their trees and their imports. `Project` holds those, so one run walks the tree once, reads each
file once, finds each file's imports once (spmd_programs.import_graph, kept on the project) and
resolves each `from ... import` line one way for every pass.

Trees are kept only for the run's own files, which the rewrite parses again after the passes
(parsed_trees.py: it takes them instead). Keeping every tree (this repository's 1,276 files as
its own project, 3.6 MB) saved 184 of 569 parses and made the passes slower (2.25 s of CPU
against 1.61 s): every collection of the oldest generation walked the kept trees' millions of
objects.
"""

from __future__ import annotations

import ast
import json
import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from tpu_migrate.rewrite import parsed_trees

# Directories that hold no module of the project: installed packages, caches, version control.
SKIPPED = frozenset({"__pycache__", "node_modules", "site-packages", "dist-packages", "build"})
MAX_FILES = 20_000  # a tree larger than this is not a project to scan whole: the run's files only
# The files that may run SPMD: modules and scripts, and notebooks (their code cells).
SOURCES = (".py", ".ipynb")


class Project:
    """The project root (None where there is none: then the run's own files are the project),
    its files (`sources`, in the walk's order), the directories imports are searched from
    (`bases`), what the walk did not list (`unseen`, None where no tree was walked), and the
    files' bytes and `from ... import` lines, each read once."""

    def __init__(self, run_files: Iterable[str], root: Path | str | None):
        self.root = Path(os.path.realpath(root)) if root is not None else None
        self.unseen: set[str] | None = set()  # what the walk did not list (links, skipped directories)
        sources = list(source_files(self.root, self.unseen)) if self.root is not None else None
        if sources is None or len(sources) > MAX_FILES:
            sources = [os.path.realpath(f) for f in run_files if f.endswith(SOURCES)]
            self.unseen = None  # the run's files' directories were not listed
        self.sources = sources
        self.python_files = [path for path in sources if path.endswith(".py")]
        self.bases = [str(self.root), str(self.root / "src")] if self.root is not None else []
        self.texts = Texts()
        self.graph = None  # the import graph, made by spmd_programs.import_graph where asked
        self._files: dict[str, str | None] = {}
        self._dirs: dict[str, bool] = {}
        self._modules: dict[tuple[str, ...], tuple[str, ...]] = {}
        self._from_imports: dict[str, list] = {}
        self._xla_files: list[str] | None = None

    def read(self, path: str) -> bytes | None:
        return self.texts.read(path)

    def tree(self, path: str, data: bytes | None = None) -> ast.Module | None:
        """The parsed file (None: it does not parse). Kept only where the rewrite parses the same
        bytes after the passes (parsed_trees.py: the run's own files), not otherwise, see above."""
        data = self.read(path) if data is None else data
        if data is None:
            return None
        tree = parsed_trees.kept(data)
        if tree is None:
            tree = parse(path, data)
            if tree is not None:
                parsed_trees.keep(path, data, tree)
        return tree

    def shown(self, path: str) -> str:
        """The path as the TODOs print it: relative to the project root (its name where none)."""
        return os.path.relpath(path, self.root) if self.root is not None else os.path.basename(path)

    def xla_files(self) -> list[str]:
        """The Python files whose bytes name torch_xla, in the walk's order."""
        if self._xla_files is None:
            self._xla_files = [path for path in self.python_files if b"torch_xla" in (self.read(path) or b"")]
        return self._xla_files

    def real_file(self, candidate: str) -> str | None:
        """The candidate path's real path, None where it is no file (the disk asked once)."""
        if candidate not in self._files:
            self._files[candidate] = os.path.realpath(candidate) if os.path.isfile(candidate) else None
        return self._files[candidate]

    def is_dir(self, path: str) -> bool:
        """Whether the path is a directory (the disk asked once)."""
        if path not in self._dirs:
            self._dirs[path] = os.path.isdir(path)
        return self._dirs[path]

    def module_files(self, dotted: str, roots: list[str]) -> tuple[str, ...]:
        """`module_files`, found once for each name and roots: files of one directory import
        the same modules."""
        key = (dotted, *roots)
        if key not in self._modules:
            self._modules[key] = tuple(module_files(dotted, roots, self.real_file, self.is_dir))
        return self._modules[key]

    def from_imports(self, path: str) -> list[tuple[int, str, list[tuple[str, str]]]]:
        """The file's `from ... import` lines (`from_imports`), found once."""
        if path not in self._from_imports:
            self._from_imports[path] = list(from_imports(self.read(path) or b""))
        return self._from_imports[path]

    def imported_files(self, path: str, level: int, dotted: str) -> Iterator[str]:
        """The files `dotted` may be where the file at `path` imports it `from` (`level` dots
        before it): searched from the file's package (`level` > 0), or from its own directory
        and the project's import roots."""
        here = os.path.dirname(path)
        for _ in range(max(level - 1, 0)):
            here = os.path.dirname(here)
        return iter(self.module_files(dotted, [here] if level else [here, *self.bases]))


class Texts:
    """The files' bytes, read once: kept while they fit in KEPT_BYTES, read again beyond."""

    KEPT_BYTES = 64 << 20

    def __init__(self):
        self._kept: dict[str, bytes | None] = {}
        self._size = 0

    def read(self, path: str) -> bytes | None:
        if path in self._kept:
            return self._kept[path]
        data = read(path)
        if self._size + len(data or b"") <= self.KEPT_BYTES:
            self._kept[path] = data
            self._size += len(data or b"")
        return data


def source_files(root: Path, unseen: set[str] | None = None) -> Iterator[str]:
    """The project's Python files and notebooks. `unseen`, when given, gets the names of what
    an import may pass through that the walk did not list: symbolic links (to files and
    directories) and the directories it skips, but for hidden ones (`.venv`: no import names
    them, a dotted name holds no dot)."""
    for directory, subdirectories, names in os.walk(root):
        kept = [d for d in subdirectories if not d.startswith(".") and d not in SKIPPED
                and not os.path.exists(os.path.join(directory, d, "pyvenv.cfg"))]
        if unseen is not None:
            unseen.update(d for d in subdirectories if not d.startswith(".") and
                          (d not in kept or os.path.islink(os.path.join(directory, d))))
        # Hidden directories (.git, .venv, .tox) and virtual environments hold no project module.
        subdirectories[:] = kept
        for name in names:
            if name.endswith(SOURCES):  # real already below a real root (walk follows no links)
                path = os.path.join(directory, name)
                if unseen is not None and os.path.islink(path):
                    unseen.add(os.path.splitext(name)[0])
                yield path


def read(path: str) -> bytes | None:
    """The file's bytes (None: unreadable). os.read, not open(): the buffered file object costs
    more than the read for the small files a project is made of (benchmarks/bench_spmd_scan.py)."""
    try:
        # O_NONBLOCK: a FIFO named *.py opens without a writer (and is then refused), not hangs.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO, a device: no module of the project
            return None
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def parse(path: str, data: bytes | None = None) -> ast.Module | None:
    data = read(path) if data is None else data
    if data is None:
        return None
    try:
        return ast.parse(notebook_code(data) if path.endswith(".ipynb") else data, path)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


# Cell magics whose cell is still the kernel's Python (the first line goes).
_PYTHON_CELL_MAGICS = ("%%time", "%%timeit", "%%capture", "%%prun")


def notebook_code(data: bytes) -> str:
    """A notebook's code cells as one module: a cell of another language (`%%bash`, `%%writefile`)
    left out, line magics and shell lines (`%env`, `!pip`) as `pass`. Raises ValueError for a
    file that is not a notebook."""
    try:
        cells = json.loads(data)["cells"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"not a notebook: {exc}") from None
    parts = []
    for cell in cells if isinstance(cells, list) else ():
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        lines = ("".join(source) if isinstance(source, list) else str(source)).splitlines()
        if lines and lines[0].startswith("%%"):
            if not lines[0].startswith(_PYTHON_CELL_MAGICS):
                continue
            lines = lines[1:]
        parts.extend(line[:len(line) - len(line.lstrip())] + "pass" if line.lstrip().startswith(("%", "!"))
                     else line for line in lines)
    return "\n".join(parts) + "\n"


def _real_file(path: str) -> str | None:
    return os.path.realpath(path) if os.path.isfile(path) else None


def module_files(dotted: str, roots: list[str], real_file: Callable[[str], str | None] = _real_file,
                 is_dir: Callable[[str], bool] = os.path.isdir) -> Iterator[str]:
    """The files the dotted name may be, under each root (`real_file`: a candidate path's real
    path, None where it is no file; `is_dir`: whether a path is a directory)."""
    parts = dotted.split(".")
    for root in roots:
        stem = root
        for part in parts:
            stem = os.path.join(stem, part)
            real = real_file(os.path.join(stem, "__init__.py"))
            if real is not None:
                yield real
            real = real_file(stem + ".py")
            if real is not None:
                yield real
            if not is_dir(stem):
                break  # nothing below a path that is no directory is a file


# `from module import a, b as c` / `from . import (a,\n b)`, at any indentation: the pattern
# from `from` on (a pattern that starts with its literal is searched for as bytes; one that starts
# with `^` tried every position, 9 times the time), its line's start checked after (`_from_lines`).
_FROM_IMPORT = re.compile(rb"from[ \t]+(\.*)([\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#;]*)")


def _from_lines(data: bytes) -> Iterator[re.Match]:
    """The matches of `^[ \t]*` and _FROM_IMPORT (multiline), in order: each search goes on after
    a match whose `from` does not start its line (only blanks before it) at the next byte, as a
    search anchored at line starts would not have stopped there."""
    search, start = _FROM_IMPORT.search, 0
    while (match := search(data, start)) is not None:
        line = data.rfind(b"\n", 0, match.start()) + 1
        if data[line:match.start()].strip(b" \t"):
            start = match.start() + 1
        else:
            yield match
            start = match.end()


def from_imports(data: bytes) -> Iterator[tuple[int, str, list[tuple[str, str]]]]:
    """(level, module, [(name, bound name)]) of each `from ... import ...` line in the bytes (a
    byte search, no parse; a line in a string counts too, which at worst reads one more module)."""
    for match in _from_lines(data):
        level, module, names = len(match[1]), match[2].decode("ascii", "replace"), match[3]
        if not module:
            continue  # `from . import x`: x is a module, not a function
        pairs = []
        for part in names.strip(b"()").replace(b"\\\n", b" ").split(b","):
            words = part.split()
            if len(words) == 1:
                pairs.append((words[0].decode(), words[0].decode()))
            elif len(words) == 3 and words[1] == b"as":
                pairs.append((words[0].decode(), words[2].decode()))
        yield level, module, pairs
