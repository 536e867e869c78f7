"""The trees the project passes parsed, lent to the rewrite of the same bytes: one parse a file.

The project passes (project.py) parse the files that may run SPMD or call a torch_xla launcher
before the rewrite, which parses every file it rewrites (engine.py). A run's own Python file
that a pass parsed is kept here, keyed by its bytes: the other passes read the same tree, and
the rewrite takes it (once: it is removed then) instead of parsing those bytes again. Neither
side changes an ast node (tests/test_parsed_trees.py), so a tree read by a pass is the tree a
parse would give.

Kept from `start` (the rewrite command's project passes) to `clear` (after its rewrite); a
worker forked for `--jobs` inherits them, one started otherwise parses. Keyed by the bytes
themselves, a tree can only be taken for the bytes it was parsed from, whatever the path.
Trees of at most KEPT_BYTES of source are kept (the others are parsed again): a kept tree is
about 30 times its source's size.

The analysis a pass made of a kept tree (kept_launches.py: names.analyze, with the arguments the
rewrite gives it, where the rewrite's code is loaded for the run anyway) is lent the same way:
the rewrite takes it with the tree, as `analyze` left it (the pass only reads it), where its
arguments are the rewrite's own.
"""

from __future__ import annotations

import ast

KEPT_BYTES = 16 << 20

_trees: dict[bytes, ast.Module] = {}
_analyses: dict[int, tuple[ast.Module, tuple, object]] = {}  # id(tree) -> (tree, analyze's arguments, analysis)
_wanted: frozenset[str] = frozenset()  # the real paths whose trees are kept: the run's files
_size = 0


def start(wanted: frozenset[str]) -> None:
    """Keep the trees of these files (real paths) from now on, forgetting any kept before."""
    global _wanted, _size
    _trees.clear()
    _analyses.clear()
    _wanted, _size = wanted, 0


def clear() -> None:
    global _wanted, _size
    _trees.clear()
    _analyses.clear()
    _wanted, _size = frozenset(), 0


def kept(data: bytes) -> ast.Module | None:
    """The tree kept for these bytes, still kept."""
    return _trees.get(data) if _trees else None


def keep(path: str, data: bytes, tree: ast.Module) -> None:
    """Keep the tree of the file at `path` (real) parsed from `data`, if the rewrite will parse it."""
    global _size
    if path in _wanted and path.endswith(".py") and _size + len(data) <= KEPT_BYTES and data not in _trees:
        _trees[data] = tree
        _size += len(data)


def take(data: bytes) -> ast.Module | None:
    """The tree kept for these bytes, no longer kept (None: parse them)."""
    return _trees.pop(data, None) if _trees else None


def lend_analysis(data: bytes, tree: ast.Module, arguments: tuple, analysis) -> None:
    """Lend `analyze(tree, *arguments)` with the tree kept for these bytes (if it is)."""
    if _trees.get(data) is tree:
        _analyses[id(tree)] = (tree, arguments, analysis)


def take_analysis(tree: ast.Module, arguments: tuple):
    """The analysis lent with this tree, if made with these arguments, no longer lent (None:
    analyze it)."""
    lent = _analyses.pop(id(tree), None) if _analyses else None
    return lent[2] if lent is not None and lent[0] is tree and lent[1] == arguments else None
