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
where the names the walk looks for are spelled, `_may_run_spmd`, or where a module found to
run SPMD is named as an import could name it, with its folder where an import needs that:
`_Named`), on every run: a pre-commit run that passes only a helper module must still know
that the training script beside it runs SPMD. The project (its files and their bytes) is read
once for this pass and the other project passes (project.py), and the import graph it makes
(`import_graph`) serves kept_launches.py too. The result is part of the rewrite's settings, so
the result cache of a file stays valid only while the project's SPMD programs import the same
modules.
"""

from __future__ import annotations

import ast
import os
import re
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from tpu_migrate.rewrite.names import is_xla_name, walk
from tpu_migrate.rewrite.project import Project, module_files

# Bytes a file that runs SPMD holds (a file without any of them is not parsed).
# (b"spmd": also `from torch_xla.distributed import spmd`, which names no module path whole.)
_MARKERS = (b"spmd", b"fsdp_v2", b"XLA_USE_SPMD")
_SPMD_MODULES = ("torch_xla.distributed.spmd", "optimum.tpu.fsdp_v2")
# What turns SPMD on (`xr.is_spmd()` only asks: a library may ask and run either way), and the
# environment variable that did the same before torch_xla started.
_SPMD_CALLS = frozenset({"use_spmd", "use_fsdp_v2"})
SPMD_ENV = "XLA_USE_SPMD"


def spmd_modules(run_files: Iterable[str], root: Path | None,
                 project: Project | None = None) -> tuple[tuple[str, str], ...]:
    """(module's real path, why it runs SPMD) for each module of the project that runs SPMD
    without naming it, sorted; the why ends the TODOs of its process queries. `root`: the
    project root, None where there is none (then only `run_files` are looked at); `project`:
    the project already read (project.py), shared with the other project passes."""
    project = project if project is not None else Project(run_files, root)
    programs = {path: tree for path in project.sources
                if (tree := _spmd_tree(path, project.read(path), project)) is not None}
    found: dict[str, str] = {}
    if not programs:
        return ()
    imports = import_graph(project)
    for path, tree in programs.items():
        imports.add(path, tree, project.read(path))
    importers = _importers(programs, project)
    for path, origin in importers.items():
        found[path] = f"this file imports {project.shown(origin)}, which turns SPMD on (one process per host)"
    for module, program in _first_importers([*programs, *importers], imports.of).items():
        found.setdefault(module, f"{project.shown(program)} imports this module and runs SPMD (one process per host)")
    return tuple(sorted(found.items()))


def import_graph(project: Project) -> _Imports:
    """The project's import graph, made once and kept on the project (kept_launches.py reads it too)."""
    if project.graph is None:
        project.graph = _Imports(project)
    return project.graph


def _first_importers(programs: list[str], imports_of: Callable[[str], list[str] | None]) -> dict[str, str]:
    """module -> the first program (in sorted order) that imports it, directly or through other
    modules; a program counts for another only (itself: never, even through a cycle of imports).
    Linear in the import graph: the graph's strongly connected components carry the two first
    programs that reach them down the graph (one walk per program made this quadratic: 2,900
    programs that import 2,900 modules in transformers' own tree)."""
    graph: dict[str, list[str]] = {}
    todo = list(programs)
    while todo:
        node = todo.pop()
        if node not in graph:
            graph[node] = list(dict.fromkeys(imports_of(node) or ()))
            todo.extend(graph[node])
    components = _components(graph)
    component_of = {node: i for i, component in enumerate(components) for node in component}
    is_program = set(programs)
    reaching: list[list[str]] = [[] for _ in components]  # the two first programs that reach it
    for i in reversed(range(len(components))):  # a component after every one that imports it
        component = components[i]
        own = sorted(node for node in component if node in is_program)[:2]
        if len(component) > 1 or component[0] in graph[component[0]]:  # its programs import themselves too
            reaching[i] = _two_first(reaching[i] + own)
        passed = _two_first(reaching[i] + own)
        for j in {component_of[child] for node in component for child in graph[node]} - {i}:
            reaching[j] = _two_first(reaching[j] + passed)
    found = {}
    for i, component in enumerate(components):
        for node in component:
            first = next((program for program in reaching[i] if program != node), None)
            if first is not None:
                found[node] = first
    return found


def _two_first(programs: list[str]) -> list[str]:
    return sorted(set(programs))[:2]


def _components(graph: dict[str, list[str]]) -> list[list[str]]:
    """The strongly connected components of `graph` (every node a key), each after the components
    it reaches (Tarjan's, without recursion: import chains are deep)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def enter(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)

    for root in graph:
        if root in index:
            continue
        enter(root)
        work = [(root, iter(graph[root]))]
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    enter(child)
                    work.append((child, iter(graph[child])))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    components.append(component)
    return components


# How many modules up a chain of imports a module that turns SPMD on makes programs SPMD
# (main.py imports trainer.py, which imports the setup module that calls xr.use_spmd()).
MAX_LEVELS = 8


class _Imports:
    """The project's files each file imports (`_local_imports`), found once per file: many
    programs import the same modules, and the search for importers asks again at each level.
    Which candidate paths are files, and their real paths, are asked of the disk once too."""

    def __init__(self, project: Project):
        self.project = project
        self._of: dict[str, list[str] | None] = {}

    def add(self, path: str, tree: ast.Module, data: bytes) -> None:
        if path not in self._of:
            self._of[path] = list(_local_imports(path, tree, self.project.bases, self.project.module_files,
                                                 _calls_named(data, path)))

    def of(self, path: str, data: bytes | None = None) -> list[str] | None:
        """The files `path` imports, None where it does not parse."""
        if path not in self._of:
            data = self.project.read(path) if data is None else data
            tree = self.project.tree(path, data)
            self._of[path] = None if tree is None else \
                list(_local_imports(path, tree, self.project.bases, self.project.module_files, _calls_named(data, path)))
        return self._of[path]


def _importers(programs: dict[str, ast.Module], project: Project) -> dict[str, str]:
    """The files that import an SPMD module (`from utils import setup_spmd`), directly or through
    others, each with the SPMD module it reaches: a module that turns SPMD on in a function turns
    it on for the program that calls it, so that program's process queries, and its other
    modules', counted hosts too. A file is parsed only where its bytes can name such a module
    (`_Named`; with the project's import roots and what its walk did not list, where it walked)."""
    found: dict[str, str] = {}
    imports = import_graph(project)
    tree = None if project.unseen is None else (project.bases, project.unseen)
    origins = {path: path for path in programs}  # a module of the chain -> the SPMD module it reaches
    for _ in range(MAX_LEVELS):
        named = _Named(origins, tree)
        new = {}
        for path in project.sources:
            if path in programs or path in found:
                continue
            data = project.read(path)
            if data is None or not named.may_import(path, data):
                continue
            reached = [m for m in imports.of(path, data) or () if m in origins]
            if reached:
                new[path] = origins[reached[0]]
        if not new:
            break
        found.update(new)
        origins = new
    return found


# Between the tokens of `sys.path` (ASCII source): whitespace, line continuations, comments.
_GAP = rb"(?:[ \t\f\r\n\\]|#[^\r\n]*)*"
# (`sys` first, the look-behind after it: a pattern that starts with its literal is searched
# for as bytes, one that starts with a look-behind tries every position: 20 times the time.)
_SYS_PATH = re.compile(rb"sys(?<![A-Za-z0-9_]sys)" + _GAP + rb"\." + _GAP + rb"path(?![A-Za-z0-9_])")


# A coding declaration on one of the first two lines, and the encodings in which ASCII bytes
# read as themselves (in UTF-7, say, ASCII bytes spell other characters).
_CODING = re.compile(rb"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)")
_ASCII_CODINGS = ("utf-8", "utf8", "utf_8", "ascii", "us-ascii", "latin-1", "latin1", "latin_1", "iso-8859", "iso8859",
                  "iso_8859", "cp125")


def _plain_identifiers(path: str, data: bytes) -> bool:
    """Whether each identifier of the file is spelled in its bytes as itself: ASCII source in an
    encoding that reads ASCII as ASCII (not a notebook, whose JSON may escape any character)."""
    if path.endswith(".ipynb") or not data.isascii():
        return False
    for line in data.split(b"\n", 2)[:2]:
        match = _CODING.match(line)
        if match:
            return match[1].decode().lower().startswith(_ASCII_CODINGS)
    return True


class _Named:
    """Which files may import one of `origins` (real paths), from their bytes.

    A file imports a module named `m` (`_module_name`) only where its bytes hold `m`: the test
    the pass always made, which alone lets through every file that says `device` or `utils`.
    More can be asked without a parse where the project's tree was walked (`tree`: its import
    roots, and the names of the links and skipped directories the walk did not list) and the
    file is plain ASCII source (`_plain_identifiers`) that names none of those and calls no
    import function: its imports then name modules by their real paths, in identifiers. An
    import's dotted name is the module's path below the directory it is searched from: the
    file's own (`import m`; a relative import with no package part), one above it (`from ..
    import m`), a project root, or a directory the file adds to sys.path (`sys . path` in its
    bytes). From any other directory the path, so the name, holds the module's folder
    (`pkg.m`, `from .pkg import m`). So such a file whose bytes do not name that folder imports
    `m` only from its own directory or one below the folder, or from a project root.
    """

    # With more names than this (a library whose every module imports the SPMD one), nearly
    # every file names one: the folder test would cost a search per name and file, for nothing.
    MAX_NAMES = 64

    def __init__(self, origins: Iterable[str], tree: tuple[list[str], set[str]] | None):
        self.bases, unseen = tree if tree is not None else (None, set())
        # An import passes through an unseen name as a whole identifier (`env`, not `environ`);
        # a name that is none (`site-packages`) no import statement can name.
        self.unseen = sorted(name.encode() for name in unseen if name.isidentifier())
        self.places: dict[bytes, list[tuple[bytes, str]]] = {}  # name -> (its folder's name, its folder)
        for path in origins:
            folder = os.path.dirname(path)
            if os.path.basename(path) == "__init__.py":
                folder = os.path.dirname(folder)
            self.places.setdefault(_module_name(path).encode(), []).append(
                (os.path.basename(folder).encode(), folder))
        if len(self.places) > self.MAX_NAMES:
            self.bases = None

    def may_import(self, path: str, data: bytes) -> bool:
        if self.bases is None:
            return any(name in data for name in self.places)
        named = [name for name in self.places if name in data]
        if not named:
            return False
        if not _plain_identifiers(path, data) or b"import_module" in data or b"__import__" in data \
                or _SYS_PATH.search(data) or any(_has_word(data, name) for name in self.unseen):
            return True
        # Plain source names a module, and its folder, in identifiers: as whole words.
        here = os.path.dirname(path)
        return any(_has_word(data, name) and any(
            folder in self.bases or here == folder or here.startswith(folder + os.sep)
            or _has_word(data, folder_name) for folder_name, folder in self.places[name]) for name in named)


_IDENTIFIER_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")


def _has_word(data: bytes, word: bytes) -> bool:
    """Whether `word` stands in the ASCII source as a whole identifier (`env`, not `environment`).
    A search of the bytes, each place checked (a regex with a look-behind first scanned every
    byte: 7 times the time)."""
    start = data.find(word)
    while start >= 0:
        end = start + len(word)
        if (start == 0 or data[start - 1] not in _IDENTIFIER_BYTES) and \
                (end == len(data) or data[end] not in _IDENTIFIER_BYTES):
            return True
        start = data.find(word, start + 1)
    return False


def _module_name(path: str) -> str:
    """The last part of the dotted name a file is imported by: a package's for its __init__.py."""
    stem = os.path.splitext(os.path.basename(path))[0]
    return os.path.basename(os.path.dirname(path)) if stem == "__init__" else stem


# The string "XLA_USE_SPMD" in source that does not spell it whole: the first of adjacent strings
# ends in a part of it ("XLA_USE_" "SPMD"), or an escape may spell a letter ("\x58LA_...").
_SPMD_ENV_SPELLED = re.compile(rb"XLA_USE_SPMD|X(?:L(?:A(?:_(?:U(?:S(?:E(?:_(?:S(?:P(?:M)?)?)?)?)?)?)?)?)?)?['\"]"
                               rb"|\\[0-7xuUN\r\n]")


def _may_run_spmd(path: str, data: bytes) -> bool:
    """Whether `_spmd_tree` can find SPMD in the file, from its bytes: in plain ASCII source
    (`_plain_identifiers`) each name the walk looks for is spelled whole, so a file without them
    is not parsed (this repository's own code says `spmd` and `torch_xla` in strings)."""
    if not _plain_identifiers(path, data):
        return True
    if b"spmd" in data and b"torch_xla" in data and b"distributed" in data:
        return True  # an import of torch_xla.distributed.spmd (and what starts so)
    if b"fsdp_v2" in data and b"optimum" in data:
        return True  # optimum.tpu.fsdp_v2
    if (b"use_spmd" in data or b"use_fsdp_v2" in data) and (b"xla" in data or b"optimum" in data):
        return True  # a call that turns SPMD on, and an import of torch_xla (or torch.ops.xla, optimum.tpu)
    return _SPMD_ENV_SPELLED.search(data) is not None  # the variable, as a keyword or a string


def _spmd_tree(path: str, data: bytes | None, project: Project) -> ast.Module | None:
    """The parsed file (its bytes `data`), if it runs SPMD: it imports torch_xla's or Optimum's
    SPMD modules, names use_spmd / use_fsdp_v2 and imports torch_xla or optimum.tpu, or names
    "XLA_USE_SPMD" (a launcher that sets it need not import torch_xla itself)."""
    if data is None or not any(marker in data for marker in _MARKERS) or not _may_run_spmd(path, data):
        return None
    tree = project.tree(path, data)
    if tree is None:
        return None
    # The imports first, from the statements alone (most of a tree is expressions): most files
    # parsed here import an SPMD module, and in plain source the bytes show whether the other
    # two tests can hold (`_may_run_spmd`'s reasoning). The whole walk only where they may.
    imported = _imported_names(import_statements(tree))
    if any(name.startswith(_SPMD_MODULES) for name in imported):
        return tree
    if _plain_identifiers(path, data) and _SPMD_ENV_SPELLED.search(data) is None and not (
            (b"use_spmd" in data or b"use_fsdp_v2" in data) and any(is_xla_name(name) for name in imported)):
        return None
    # `imported` is whole (import statements hold no expressions to search): the walk looks for
    # the calls and the variable only.
    called, environment = False, False
    Attribute, Name, Constant, keyword = ast.Attribute, ast.Name, ast.Constant, ast.keyword
    for node in walk(tree):  # the parser makes these classes exactly (no subclass): `type(node) is`
        kind = type(node)
        if kind is Attribute:
            called = called or node.attr in _SPMD_CALLS
        elif kind is Name:
            called = called or node.id in _SPMD_CALLS
        elif kind is Constant:
            environment = environment or node.value == SPMD_ENV
        elif kind is keyword:  # os.environ.update(XLA_USE_SPMD="1")
            environment = environment or node.arg == SPMD_ENV
    if environment:
        return tree
    return tree if called and any(is_xla_name(name) for name in imported) else None


def _imported_names(statements: list[ast.Import | ast.ImportFrom]) -> set[str]:
    """The modules the import statements name, and the names a `from` import takes from one
    (`torch_xla.distributed.spmd` of `from torch_xla.distributed import spmd`)."""
    imported = set()
    for node in statements:
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif node.module and node.level == 0:
            imported.update([node.module, *(f"{node.module}.{alias.name}" for alias in node.names)])
    return imported


def _local_imports(path: str, tree: ast.Module, bases: list[str],
                   find: Callable[[str, list[str]], Iterable[str]] = module_files,
                   calls: bool = True) -> Iterator[str]:
    """The project's files that `tree` (the file at `path`) imports: modules found beside it,
    under the project root or its src/, in directories the file adds to sys.path, and the
    packages' __init__.py files on the way. `find`: the files a dotted name may be under roots
    (project.module_files; Project.module_files asks the disk once). `calls`: False where the
    file's bytes show that it calls neither an import function nor sys.path.append / insert
    (`_calls_named`)."""
    here = os.path.dirname(path)
    imports, path_calls = _import_nodes(tree) if calls else (import_statements(tree), [])
    bases = [*bases, *_added_paths(path, tree, path_calls)]
    for node in imports:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield from find(alias.name, [here, *bases])
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here
                for _ in range(node.level - 1):
                    base = os.path.dirname(base)
                prefix, roots = node.module or "", [base]
            else:
                prefix, roots = node.module or "", [here, *bases]
            if prefix:
                yield from find(prefix, roots)
            for alias in node.names:  # `from pkg import module`
                yield from find(f"{prefix}.{alias.name}".lstrip("."), roots)
        else:  # importlib.import_module("name"): a name given whole
            yield from find(node.args[0].value, [here, *bases])


def _import_nodes(tree: ast.Module) -> tuple[list[ast.AST], list[ast.Call]]:
    """(the imports and the import calls given a name, the `sys.path.append / insert` calls) of
    the tree, each in ast.walk's order, in one walk (the walk is most of the pass's cost)."""
    imports, path_calls = [], []
    Import, ImportFrom, Call, Attribute, Constant, AST = \
        ast.Import, ast.ImportFrom, ast.Call, ast.Attribute, ast.Constant, ast.AST
    todo = deque([tree])
    pop, push, extend = todo.popleft, todo.append, todo.extend
    while todo:
        node = pop()
        kind = type(node)
        if kind is Import or kind is ImportFrom:
            imports.append(node)
        elif kind is Call and node.args:
            first, func = node.args[0], node.func
            # (the unparse only where the last name matches: most calls are no import)
            if isinstance(first, Constant) and isinstance(first.value, str) and not first.value.startswith(".") \
                    and getattr(func, "attr", getattr(func, "id", None)) in _IMPORT_CALL_NAMES \
                    and ast.unparse(func) in _IMPORT_CALLS:
                imports.append(node)
            elif isinstance(func, Attribute) and func.attr in ("append", "insert") \
                    and getattr(func.value, "attr", None) == "path" and ast.unparse(func.value) == "sys.path":
                path_calls.append(node)
        for field in node._fields:  # ast.iter_child_nodes, inlined
            value = getattr(node, field, None)
            if isinstance(value, AST):
                push(value)
            elif type(value) is list:
                extend([item for item in value if isinstance(item, AST)])
    return imports, path_calls


def _calls_named(data: bytes | None, path: str = "") -> bool:
    """Whether the source may call an import function (`_IMPORT_CALLS`) or `sys.path.append` /
    `insert`: it holds their names (a file whose identifiers its bytes may not spell as
    themselves, `_plain_identifiers`, counts where it holds `sys` and `path` anywhere)."""
    if data is None or b"import_module" in data or b"__import__" in data:
        return True
    if not (b"sys" in data and b"path" in data):
        return not data.isascii()
    return not _plain_identifiers(path, data) or _SYS_PATH.search(data) is not None


# The fields that hold statements, of the nodes that do (a statement cannot sit in an expression).
_BODIES = frozenset({"body", "orelse", "finalbody", "handlers", "cases"})


def import_statements(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """The tree's import statements in ast.walk's order (breadth first; the statements' depths and
    order among themselves are the same whether or not the walk enters the expressions, which
    it need not: most of a tree's nodes are expressions)."""
    found = []
    todo = deque([tree])
    pop, extend = todo.popleft, todo.extend
    while todo:
        node = pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
            continue
        for field in node._fields:  # in their order, as ast.walk (a try's handlers before its else)
            if field in _BODIES:
                extend(getattr(node, field, ()))
    return found


def _added_paths(path: str, tree: ast.Module, path_calls: list[ast.Call]) -> list[str]:
    """The directories `sys.path.append(...)` / `sys.path.insert(i, ...)` (`path_calls`) add,
    where the argument is a path computed from the file's own (pytorch/xla's examples:
    `os.path.dirname(os.path.dirname(os.path.abspath(sys.argv[0])))`, or
    `Path(__file__).parent.parent`), or a name assigned one."""
    if not path_calls:
        return []
    assigned = {target.id: node.value for node in tree.body if isinstance(node, ast.Assign)
                for target in node.targets if isinstance(target, ast.Name)}
    added = []
    for node in path_calls:
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
_IMPORT_CALL_NAMES = frozenset(name.rpartition(".")[2] for name in _IMPORT_CALLS)
