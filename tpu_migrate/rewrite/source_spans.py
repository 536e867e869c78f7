"""Where each statement of libcst's parse lies in the text it parsed, to print it back by copying.

Printing a rewritten module with libcst costs about as much as parsing it, though most of its
statements come out of the walk unchanged. libcst's nodes keep no positions (its position
metadata costs more than printing), but each statement prints as whole lines: its leading lines
(the comments and blank lines above it, one `EmptyLine` each), its own lines, and for a compound
statement its blocks, each ending in its footer lines. So ast's line numbers, paired with
libcst's statements as the walk pairs them (transformer.py), give each statement's text:

- its own first line is ast's (the first decorator's), or its placeholder's line in a skeleton
  (skeleton.py: the lines of the left-out text are mapped out); its text starts
  `len(leading_lines)` lines above;
- a simple statement ends on ast's end line; a compound one at the end of its last block: the
  end line of the statement that ends it, plus the footer lines of each last block on the way.

Every number is checked against another: each statement must start on the line after its
previous sibling's computed end, the module's first statement after its header lines and its
last one before its footer lines, a decorated statement on a line that starts with `@`, and no
statement may end on a line continued by a backslash. Where any check fails (a decorator in
parentheses over lines, libcst losing lines of the file's end: engine._true_footer) the file
has no spans and prints through libcst as before. Files with form feeds, lone CRs or mixed line
ends (which libcst does not always print back, and where ast counts lines otherwise) have none.

The printer (printing.py) copies a statement's text only where it sits at the indentation it
has here, as the same node or as one the walk or the import removal rebuilt from it: found
through a child that `with_changes` keeps (`_ANCHOR`), and compared field by field (`same`).
"""

from __future__ import annotations

import ast
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field, fields

import libcst as cst

from tpu_migrate.rewrite.skeleton import PLACEHOLDER_LINE, Skeleton
from tpu_migrate.rewrite.todos import newline_starts


# The child of each statement that the rebuilding of its blocks keeps (never a shared
# object: not leading_lines, often the one empty tuple).
_ANCHOR = {
    cst.SimpleStatementLine: "trailing_whitespace",  # the import removal rebuilds import lines
    cst.FunctionDef: "name",
    cst.ClassDef: "name",
    cst.If: "test",
    cst.While: "test",
    cst.For: "target",
    cst.With: "items",
    cst.Try: "whitespace_before_colon",
    cst.TryStar: "whitespace_before_colon",
    cst.Match: "subject",
}


@dataclass
class SourceSpans:
    text: str  # what libcst parsed
    # id(statement) -> its start, its own start (after its leading lines, at its indentation), its end
    spans: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    anchors: dict[int, cst.BaseStatement] = field(default_factory=dict)  # id(anchor child) -> its statement

    def original(self, stmt: cst.BaseStatement) -> cst.BaseStatement | None:
        """The statement of the parse `stmt` is, or was rebuilt from (its anchor child is one of
        the parse's); None for a statement a rule made."""
        if id(stmt) in self.spans:
            return stmt
        name = _ANCHOR.get(type(stmt))
        return self.anchors.get(id(getattr(stmt, name))) if name is not None else None

    def indented(self, own_start: int, indent: str) -> bool:
        """Whether the statement whose own text starts at `own_start` is indented by `indent`."""
        text = self.text
        after = own_start + len(indent)
        return text.startswith(indent, own_start) and after < len(text) and text[after] not in " \t"


def changed_fields(stmt: cst.CSTNode, original: cst.CSTNode) -> list[str]:
    """The fields in which `stmt` differs from `original` (of the same type)."""
    if stmt is original:
        return []
    kind = type(stmt)
    names = _FIELDS.get(kind)
    if names is None:
        names = _FIELDS[kind] = tuple(f.name for f in fields(kind))
    return [name for name in names if not same(getattr(stmt, name), getattr(original, name))]


_FIELDS: dict[type, tuple[str, ...]] = {}


def same(a, b) -> bool:
    """Whether two libcst values print the same: the same object, or equal field by field
    (cheap where the walk kept the children: it stops at each shared object)."""
    if a is b:
        return True
    kind = type(a)
    if kind is not type(b):
        return isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and _same_items(a, b)
    if isinstance(a, cst.CSTNode):
        names = _FIELDS.get(kind)
        if names is None:
            names = _FIELDS[kind] = tuple(f.name for f in fields(kind))
        return all(same(getattr(a, name), getattr(b, name)) for name in names)
    if kind is list or kind is tuple:
        return _same_items(a, b)
    return a == b


def _same_items(a, b) -> bool:
    return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))


class _NoSpans(Exception):
    """A number did not check out: print the file through libcst."""


def source_spans(module: cst.Module, tree: ast.Module, parsed: str,
                 skeleton: Skeleton | None) -> SourceSpans | None:
    """The spans of `module`'s statements (libcst's parse of `parsed`, `tree` ast's parse of
    the file: `parsed` itself, or the text of `skeleton`), or None where they cannot be had."""
    if not module.has_trailing_newline or not module.body or "\x0c" in parsed \
            or ("\r" in parsed and parsed.count("\r") != parsed.count("\r\n")):
        return None
    try:
        return _Finder(module, parsed, skeleton).find(tree)
    except (_NoSpans, IndexError, AttributeError, TypeError, ValueError):  # unpaired: as the walk's WalkError
        return None


class _Finder:
    def __init__(self, module: cst.Module, parsed: str, skeleton: Skeleton | None):
        self.module = module
        self.parsed = parsed
        self.line_starts = newline_starts(parsed)
        self.result = SourceSpans(parsed)
        self.placeholders: dict[str, tuple[int, int]] = {}  # name -> its line here, ast statements
        self.kept_ends: list[int] = []  # the last line of each left-out text, in the file's numbering
        self.shifts: list[int] = []  # lines fewer here after it
        if skeleton is not None:
            self._map_skeleton(skeleton)

    def _map_skeleton(self, skeleton: Skeleton) -> None:
        shift = 0
        for match in PLACEHOLDER_LINE.finditer(self.parsed):
            number = int(match["number"])
            line = bisect_right(self.line_starts, match.start())
            kept = skeleton.kept[number]
            self.placeholders[match["name"]] = (line, kept.statements)
            lines = kept.text.count("\n")
            self.kept_ends.append(line + shift + lines - 1)
            shift += lines - 1
            self.shifts.append(shift)

    def line(self, file_line: int) -> int:
        """The line of the parsed text that is line `file_line` of the file (outside any
        left-out text)."""
        before = bisect_left(self.kept_ends, file_line)
        return file_line - self.shifts[before - 1] if before else file_line

    def find(self, tree: ast.Module) -> SourceSpans:
        first, last = self.block(self.module.body, tree.body)
        if first != len(self.module.header) + 1 or last != len(self.line_starts) - 1 - len(self.module.footer):
            raise _NoSpans  # libcst lost or moved lines at the file's end
        return self.result

    def block(self, stmts, ast_stmts: list[ast.stmt]) -> tuple[int, int]:
        """Records the spans of a statement list; (its first line, its last statement's end)."""
        cursor, first, previous_end = 0, None, None
        for stmt in stmts:
            if type(stmt) is cst.SimpleStatementLine:
                placeholder = self.placeholder(stmt)
                count = placeholder[1] if placeholder else len(stmt.body)
                nodes = ast_stmts[cursor:cursor + count]
                if len(nodes) != count:
                    raise _NoSpans
                cursor += count
                if placeholder:
                    own_first = own_end = placeholder[0]
                else:
                    own_first, own_end = self.line(nodes[0].lineno), self.line(nodes[-1].end_lineno)
            else:
                node = ast_stmts[cursor]
                cursor += 1
                decorators = getattr(node, "decorator_list", None)
                own_first = self.line(decorators[0].lineno if decorators else node.lineno)
                if decorators and not self.line_text(own_first).lstrip(" \t").startswith("@"):
                    raise _NoSpans  # `@(` with the decorator on a later line
                own_end = self.compound(stmt, node)
            start = own_first - len(stmt.leading_lines)
            if previous_end is not None and start != previous_end + 1:
                raise _NoSpans
            self.record(stmt, start, own_end, own_first)
            first = start if first is None else first
            previous_end = own_end
        if cursor != len(ast_stmts) or previous_end is None:
            raise _NoSpans
        if self.line_text(previous_end).endswith("\\"):
            raise _NoSpans  # a backslash continues the last line: ast's end is not the text's
        return first, previous_end

    def compound(self, stmt: cst.BaseCompoundStatement, node: ast.stmt) -> int:
        """Records the spans in the blocks of `stmt`; the line that ends it."""
        end = None
        for suite, ast_block in _suites(stmt, node):
            if isinstance(suite, cst.IndentedBlock):
                end = self.block(suite.body, ast_block)[1] + len(suite.footer)
            else:  # `if x: y`: ends where ast's statement ends (its last suite, if this is one)
                self.block_simple(suite, ast_block)
                end = self.line(node.end_lineno)
        if end is None:
            raise _NoSpans
        return end

    def block_simple(self, suite: cst.SimpleStatementSuite, ast_block: list[ast.stmt]) -> None:
        if len(suite.body) != len(ast_block):
            raise _NoSpans

    def placeholder(self, line: cst.SimpleStatementLine) -> tuple[int, int] | None:
        if not self.placeholders or len(line.body) != 1:
            return None
        small = line.body[0]
        if type(small) is cst.Expr and type(small.value) is cst.Name:
            return self.placeholders.get(small.value.value)
        return None

    def line_text(self, line: int) -> str:
        return self.parsed[self.line_starts[line - 1]:self.line_starts[line]].rstrip("\r\n")

    def record(self, stmt: cst.BaseStatement, start: int, end: int, own_first: int) -> None:
        line_starts = self.line_starts
        self.result.spans[id(stmt)] = (line_starts[start - 1], line_starts[own_first - 1], line_starts[end])
        name = _ANCHOR.get(type(stmt))
        if name is not None:
            self.result.anchors[id(getattr(stmt, name))] = stmt


def _suites(stmt: cst.BaseCompoundStatement, node: ast.stmt):
    """(libcst suite, ast statement list) for each block of `stmt`, in source order; an `elif`'s
    blocks in their place."""
    if isinstance(stmt, cst.Try) or isinstance(stmt, cst.TryStar):
        yield stmt.body, node.body
        for handler, ast_handler in zip(stmt.handlers, node.handlers, strict=True):
            yield handler.body, ast_handler.body
    elif isinstance(stmt, cst.Match):
        for case, ast_case in zip(stmt.cases, node.cases, strict=True):
            yield case.body, ast_case.body
        return
    else:
        yield stmt.body, node.body
    orelse = getattr(stmt, "orelse", None)
    if isinstance(orelse, cst.If):
        yield from _suites(orelse, node.orelse[0])
    elif orelse is not None:
        yield orelse.body, node.orelse
    finalbody = getattr(stmt, "finalbody", None)
    if finalbody is not None:
        yield finalbody.body, node.finalbody
