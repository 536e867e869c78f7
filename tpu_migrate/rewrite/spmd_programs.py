"""Which modules of the project an SPMD program imports: their process queries meant hosts too.

Under `xr.use_spmd()` one process drove every TPU of a host, so `xr.world_size()` and
`xr.global_ordinal()` counted hosts (or answered 1 and 0), in the program's own file and in
every module it imports. A file alone does not show that it is imported by such a program, so
this pass looks at the whole project before the rewrite: the Python files and notebooks under
the project root (the run's own files where there is none) that name SPMD, the files that
import those (a `setup()` that calls `xr.use_spmd()` runs SPMD in the program that calls it),
and the project's modules they import, directly or through others. The rewrite then leaves
those modules' process queries with a TODO that says why (transforms/common.py `spmd_reason`).

The pass reads every Python file and notebook of the project (a byte search; a parse only
where SPMD, or a module found to run it, is named), on every run: a pre-commit run that passes
only a helper module must still know that the training script beside it runs SPMD. The result
is part of the rewrite's settings, so the result cache of a file stays valid only while the
project's SPMD programs import the same modules.
"""

from __future__ import annotations

import ast
import json
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

from tpu_migrate.rewrite.names import is_xla_name

# Bytes a file that runs SPMD holds (a file without any of them is not parsed).
# (b"spmd": also `from torch_xla.distributed import spmd`, which names no module path whole.)
_MARKERS = (b"spmd", b"fsdp_v2", b"XLA_USE_SPMD")
_SPMD_MODULES = ("torch_xla.distributed.spmd", "optimum.tpu.fsdp_v2")
# What turns SPMD on (`xr.is_spmd()` only asks: a library may ask and run either way), and the
# environment variable that did the same before torch_xla started.
_SPMD_CALLS = frozenset({"use_spmd", "use_fsdp_v2"})
SPMD_ENV = "XLA_USE_SPMD"
# Directories that hold no module of the project: installed packages, caches, version control.
_SKIPPED = frozenset({"__pycache__", "node_modules", "site-packages", "dist-packages", "build"})
MAX_FILES = 20_000  # a tree larger than this is not a project to scan whole: the run's files only
# The files that may run SPMD: modules and scripts, and notebooks (their code cells).
_SOURCES = (".py", ".ipynb")


def spmd_modules(run_files: Iterable[str], root: Path | None) -> tuple[tuple[str, str], ...]:
    """(module's real path, why it runs SPMD) for each module of the project that runs SPMD
    without naming it, sorted; the why ends the TODOs of its process queries. `root`: the
    project root, None where there is none (then only `run_files` are looked at)."""
    root = Path(os.path.realpath(root)) if root is not None else None
    candidates = list(_source_files(root)) if root is not None else None
    if candidates is None or len(candidates) > MAX_FILES:
        candidates = [os.path.realpath(f) for f in run_files if f.endswith(_SOURCES)]
    bases = [str(root), str(root / "src")] if root is not None else []

    def shown(path: str) -> str:
        return os.path.relpath(path, root) if root is not None else os.path.basename(path)

    texts = _Texts()
    programs = {path: tree for path in candidates if (tree := _spmd_tree(path, texts.read(path))) is not None}
    found: dict[str, str] = {}
    if programs:
        for path, (tree, origin) in _importers(programs, candidates, bases, texts).items():
            programs[path] = tree
            found[path] = f"this file imports {shown(origin)}, which turns SPMD on (one process per host)"
    trees: dict[str, ast.Module | None] = dict(programs)
    for program, tree in sorted(programs.items()):
        why = f"{shown(program)} imports this module and runs SPMD (one process per host)"
        seen = {program}
        queue = [(program, tree)]
        while queue:
            path, module = queue.pop()
            for imported in _local_imports(path, module, bases):
                if imported in seen:
                    continue
                seen.add(imported)
                found.setdefault(imported, why)
                if imported not in trees:  # a module several programs import is parsed once
                    trees[imported] = _parse(imported, texts.read(imported))
                parsed = trees[imported]
                if parsed is not None:
                    queue.append((imported, parsed))
    return tuple(sorted(found.items()))


# How many modules up a chain of imports a module that turns SPMD on makes programs SPMD
# (main.py imports trainer.py, which imports the setup module that calls xr.use_spmd()).
MAX_LEVELS = 8


class _Texts:
    """The files' bytes, read once: kept for the search of importers (a second pass over the
    project's files) while they fit in KEPT_BYTES, read again beyond."""

    KEPT_BYTES = 64 << 20

    def __init__(self):
        self._kept: dict[str, bytes | None] = {}
        self._size = 0

    def read(self, path: str) -> bytes | None:
        if path in self._kept:
            return self._kept[path]
        data = _read(path)
        if self._size + len(data or b"") <= self.KEPT_BYTES:
            self._kept[path] = data
            self._size += len(data or b"")
        return data


def _importers(programs: dict[str, ast.Module], candidates: list[str], bases: list[str],
               texts: _Texts) -> dict[str, tuple[ast.Module, str]]:
    """The files that import an SPMD module (`from utils import setup_spmd`), directly or through
    others, each with the SPMD module it reaches: a module that turns SPMD on in a function turns
    it on for the program that calls it, so that program's process queries, and its other
    modules', counted hosts too. A file is parsed only where it names such a module."""
    found: dict[str, tuple[ast.Module, str]] = {}
    origins = {path: path for path in programs}  # a module of the chain -> the SPMD module it reaches
    for _ in range(MAX_LEVELS):
        names = {_module_name(path).encode() for path in origins}
        new = {}
        for path in candidates:
            if path in programs or path in found:
                continue
            data = texts.read(path)
            if data is None or not any(name in data for name in names):
                continue
            tree = _parse(path, data)
            reached = [m for m in _local_imports(path, tree, bases) if m in origins] if tree else []
            if reached:
                new[path] = (tree, origins[reached[0]])
        if not new:
            break
        found.update(new)
        origins = {path: origin for path, (_, origin) in new.items()}
    return found


def _module_name(path: str) -> str:
    """The last part of the dotted name a file is imported by: a package's for its __init__.py."""
    stem = os.path.splitext(os.path.basename(path))[0]
    return os.path.basename(os.path.dirname(path)) if stem == "__init__" else stem


def _source_files(root: Path) -> Iterator[str]:
    for directory, subdirectories, names in os.walk(root):
        # Hidden directories (.git, .venv, .tox) and virtual environments hold no project module.
        subdirectories[:] = [d for d in subdirectories if not d.startswith(".") and d not in _SKIPPED
                             and not os.path.exists(os.path.join(directory, d, "pyvenv.cfg"))]
        for name in names:
            if name.endswith(_SOURCES):  # real already below a real root (walk follows no links)
                yield os.path.join(directory, name)


def _spmd_tree(path: str, data: bytes | None) -> ast.Module | None:
    """The parsed file (its bytes `data`), if it runs SPMD: it imports torch_xla's or Optimum's
    SPMD modules, names use_spmd / use_fsdp_v2 and imports torch_xla or optimum.tpu, or names
    "XLA_USE_SPMD" (a launcher that sets it need not import torch_xla itself)."""
    if data is None or not any(marker in data for marker in _MARKERS):
        return None
    tree = _parse(path, data)
    if tree is None:
        return None
    imported, called, environment = set(), False, False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.update([node.module, *(f"{node.module}.{alias.name}" for alias in node.names)])
        elif isinstance(node, ast.Attribute) and node.attr in _SPMD_CALLS or \
                isinstance(node, ast.Name) and node.id in _SPMD_CALLS:
            called = True
        elif isinstance(node, ast.Constant) and node.value == SPMD_ENV or \
                isinstance(node, ast.keyword) and node.arg == SPMD_ENV:  # os.environ.update(XLA_USE_SPMD="1")
            environment = True
    if environment or any(name.startswith(_SPMD_MODULES) for name in imported):
        return tree
    return tree if called and any(is_xla_name(name) for name in imported) else None


def _read(path: str) -> bytes | None:
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


def _parse(path: str, data: bytes | None = None) -> ast.Module | None:
    data = _read(path) if data is None else data
    if data is None:
        return None
    try:
        return ast.parse(_notebook_code(data) if path.endswith(".ipynb") else data, path)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


# Cell magics whose cell is still the kernel's Python (the first line goes).
_PYTHON_CELL_MAGICS = ("%%time", "%%timeit", "%%capture", "%%prun")


def _notebook_code(data: bytes) -> str:
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


def _local_imports(path: str, tree: ast.Module, bases: list[str]) -> Iterator[str]:
    """The project's files that `tree` (the file at `path`) imports: modules found beside it,
    under the project root or its src/, in directories the file adds to sys.path, and the
    packages' __init__.py files on the way."""
    here = os.path.dirname(path)
    bases = [*bases, *_added_paths(path, tree)]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield from _module_files(alias.name, [here, *bases])
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here
                for _ in range(node.level - 1):
                    base = os.path.dirname(base)
                prefix, roots = node.module or "", [base]
            else:
                prefix, roots = node.module or "", [here, *bases]
            if prefix:
                yield from _module_files(prefix, roots)
            for alias in node.names:  # `from pkg import module`
                yield from _module_files(f"{prefix}.{alias.name}".lstrip("."), roots)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) and not node.args[0].value.startswith(".") \
                and ast.unparse(node.func) in _IMPORT_CALLS:
            yield from _module_files(node.args[0].value, [here, *bases])  # a name given whole


def _added_paths(path: str, tree: ast.Module) -> list[str]:
    """The directories `sys.path.append(...)` / `sys.path.insert(i, ...)` add, where the argument
    is a path computed from the file's own (pytorch/xla's examples: `os.path.dirname(os.path.dirname(
    os.path.abspath(sys.argv[0])))`, or `Path(__file__).parent.parent`), or a name assigned one."""
    assigned = {target.id: node.value for node in tree.body if isinstance(node, ast.Assign)
                for target in node.targets if isinstance(target, ast.Name)}
    added = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args \
                and node.func.attr in ("append", "insert") and ast.unparse(node.func.value) == "sys.path":
            value = _path_value(node.args[-1], path, assigned)
            if value is not None:
                added.append(os.path.normpath(value))
    return added


# The calls a path to a directory of the project goes through: the directory is the same.
_SAME_PATH = frozenset({"os.path.abspath", "os.path.realpath", "os.path.normpath", "str", "Path",
                        "pathlib.Path"})


def _path_value(node: ast.expr, path: str, assigned: dict[str, ast.expr], seen: frozenset = frozenset()) -> str | None:
    """The value of a path expression built from the file's own path (or a literal, taken as
    relative to the file's directory), or None."""
    if isinstance(node, ast.Name) and node.id == "__file__" or ast.unparse(node) == "sys.argv[0]":
        return path
    if isinstance(node, ast.Name) and node.id in assigned and node.id not in seen:
        return _path_value(assigned[node.id], path, assigned, seen | {node.id})
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return os.path.join(os.path.dirname(path), node.value)
    if isinstance(node, ast.Attribute) and node.attr == "parent":
        inner = _path_value(node.value, path, assigned, seen)
        return os.path.dirname(inner) if inner is not None else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):  # Path(...) / "lib"
        left, right = _path_value(node.left, path, assigned, seen), _literal(node.right)
        return os.path.join(left, right) if left is not None and right is not None else None
    if not isinstance(node, ast.Call) or not node.args and not isinstance(node.func, ast.Attribute):
        return None
    called = ast.unparse(node.func)
    if called.endswith((".resolve", ".absolute")) and not node.args:
        return _path_value(node.func.value, path, assigned, seen)
    if called == "os.path.join" and node.args:
        first = _path_value(node.args[0], path, assigned, seen)
        rest = [_literal(arg) for arg in node.args[1:]]
        return os.path.join(first, *rest) if first is not None and None not in rest else None
    if len(node.args) != 1 or called not in (*_SAME_PATH, "os.path.dirname"):
        return None
    value = _path_value(node.args[0], path, assigned, seen)
    return os.path.dirname(value) if value is not None and called == "os.path.dirname" else value


def _literal(node: ast.expr) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


# Calls that import a module named by a string: `importlib.import_module("spmd_setup")`.
_IMPORT_CALLS = frozenset({"importlib.import_module", "import_module", "__import__"})


def _module_files(dotted: str, roots: list[str]) -> Iterator[str]:
    parts = dotted.split(".")
    for root in roots:
        for depth in range(1, len(parts) + 1):
            stem = os.path.join(root, *parts[:depth])
            for candidate in (os.path.join(stem, "__init__.py"), stem + ".py"):
                if os.path.isfile(candidate):
                    yield os.path.realpath(candidate)
