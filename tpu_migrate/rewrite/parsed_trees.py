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
"""

from __future__ import annotations

import ast

KEPT_BYTES = 16 << 20

_trees: dict[bytes, ast.Module] = {}
_wanted: frozenset[str] = frozenset()  # the real paths whose trees are kept: the run's files
_size = 0


def start(wanted: frozenset[str]) -> None:
    """Keep the trees of these files (real paths) from now on, forgetting any kept before."""
    global _wanted, _size
    _trees.clear()
    _wanted, _size = wanted, 0


def clear() -> None:
    global _wanted, _size
    _trees.clear()
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
