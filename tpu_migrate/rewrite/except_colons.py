r"""Put back the space before an except clause's colon, which libcst 1.9 parses away.

`except A :` (no `as` name) comes out of libcst's parser with an empty
`whitespace_before_colon`, so the unchanged clause would print as `except A:` (found by
tests/test_properties.py). The space is read from the text with ast's positions instead.
"""

from __future__ import annotations

import ast
import re

import libcst as cst

from tpu_migrate.rewrite import todos

# A colon with whitespace before it somewhere after an `except`: the only files to look at (the
# clause's first colon may sit in a comment inside its parentheses).
_SPACED_COLON = re.compile(r"\s:")


def restore_except_colons(module: cst.Module, text: str, tree: ast.Module | None) -> cst.Module:
    """`module` (libcst's parse of `text`) with each `except X :` clause's space back.

    `tree`: ast's parse of `text` when the caller has it, else None (parsed here when needed).
    """
    first = text.find("except")
    if first < 0 or not _SPACED_COLON.search(text, first):
        return module
    tree = tree if tree is not None else ast.parse(text)
    spaces = _spaces_before_colons(text, tree)
    if not any(spaces):
        return module
    return module.visit(_Restore(iter(spaces)))


def spaced_except_colons(text: str, nodes: list[ast.AST]) -> bool:
    """Whether an except clause among `nodes` (every node of ast's parse of `text`) has a space
    before its colon."""
    first = text.find("except")
    return first >= 0 and _SPACED_COLON.search(text, first) is not None and any(_spaces_before_colons(text, nodes))


def _spaces_before_colons(text: str, tree: ast.Module | list[ast.AST]) -> list[str]:
    """Per except clause, in the order of the file: the whitespace between its type (and the
    parentheses that close after it) and its colon; "" for clauses libcst reads right (bare
    `except:` and `except X as e`). `tree`: ast's parse of `text`, or its every node."""
    line_starts = todos.line_starts(text)
    handlers = sorted((node for node in (tree if isinstance(tree, list) else ast.walk(tree))
                       if isinstance(node, ast.ExceptHandler)), key=lambda node: (node.lineno, node.col_offset))
    spaces = []
    for handler in handlers:
        if handler.type is None or handler.name is not None:
            spaces.append("")
            continue
        start = line_starts[handler.type.end_lineno - 1]
        line = text[start:line_starts[handler.type.end_lineno]] if handler.type.end_lineno < len(
            line_starts) else text[start:]
        position = start + len(line.encode("utf-8")[:handler.type.end_col_offset].decode("utf-8"))
        spaces.append(_space_before_colon(text, position))
    return spaces


def _space_before_colon(text: str, position: int) -> str:
    """From the end of an except clause's type: what lies between the last `)` and the colon.
    Before that `)`, whitespace, comments and line breaks sit inside parentheses, which libcst
    keeps."""
    after_parens = position
    while text[position] != ":":
        if text[position] == "#":
            position = todos.LINE_BREAK.search(text, position).start()
        elif text[position] == ")":
            after_parens = position + 1
        position += 1
    return text[after_parens:position]


class _Restore(cst.CSTTransformer):
    """Handlers are numbered as they are entered (the file's order, as ast's sorted ones):
    leaving is inside-out for a try nested in a handler."""

    def __init__(self, spaces):
        super().__init__()
        self.spaces = spaces
        self.found: dict[cst.CSTNode, str] = {}

    def _visit_handler(self, node) -> None:
        self.found[node] = next(self.spaces)

    def _leave_handler(self, original, updated):
        space = self.found[original]
        return updated.with_changes(whitespace_before_colon=cst.SimpleWhitespace(space)) if space else updated

    visit_ExceptHandler = visit_ExceptStarHandler = _visit_handler
    leave_ExceptHandler = leave_ExceptStarHandler = _leave_handler
