"""Parse with libcst only the code the rewrite can change.

libcst's parse and print are most of a rewrite's time, and they grow with the text. The walk
(transformer.py) never enters a function or class in which the analysis found nothing, so
libcst need not see one either: before parsing, each such definition is replaced by a
one-line placeholder statement at the same indentation,

    def helper(x):            ->    __tpu_migrate_kept_0__
        return x + 1

libcst parses and prints the shorter text, and the definitions' own text replaces the
placeholders in the printed output. On real torch_xla code about 40% of a file is such
definitions (benchmarks/dense_corpus.py).

A definition's text is put back only where that gives what printing the full parse gives:
- it spans whole lines, decorators included, through the comment lines libcst would give its
  body's footer (those indented at least as deep as its body, up to the last such line), so
  the comments and blank lines around a placeholder are the same statement's leading lines
  and the same block's footer as around the definition;
- the placeholder comes back once, as a whole line, at the definition's own indentation (a
  rule that re-indents the enclosing block, or drops it, makes `restore` answer None, and the
  caller parses the whole file instead);
- libcst reads the file's indentation unit from its first indented line, and the end of a
  file from its last statement: the top-level statement holding the first indented line keeps
  its own text, and so does the last one when the end of the file is unusual
  (engine._plain_tail);
- files with form feeds, lone CRs or mixed line ends (engine.py checks their round trip), or
  with the placeholder's name in their text, are parsed whole; a definition holding a
  backslash line continuation keeps its text.

The printed skeleton is parsed before anything is written (engine._check_parses): it parses
exactly when the output does, as the definitions came back verbatim, in whole lines, at the
indentation at which they parsed in the input.
"""

from __future__ import annotations

import ast
import re
from bisect import bisect_left
from dataclasses import dataclass

from tpu_migrate.rewrite.names import Analysis, is_xla_name

PREFIX = "__tpu_migrate_kept_"
_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_FOOTER_LINE = re.compile(r"[ \t]*(?:#[^\r\n]*)?")  # what libcst can put in a block's footer
_LINE_BREAK = re.compile(r"\r\n|\n")
# Worth a placeholder: a shorter definition saves little parsing (tests set 0 to leave out all).
MIN_CHARS = 200


@dataclass
class Kept:
    indent: str
    text: str  # the definition's lines, line breaks included


@dataclass
class Skeleton:
    text: str  # what libcst parses
    kept: list[Kept]  # by placeholder number

    def restore(self, code: str) -> str | None:
        """`code` printed from the skeleton's parse, with each definition's text back in its
        placeholder's place; None when some placeholder did not come back as it went in."""
        if code.count(PREFIX) != len(self.kept):
            return None
        pieces, end, seen = [], 0, set()
        for match in _PLACEHOLDER.finditer(code):
            number = int(match["number"])
            kept = self.kept[number]
            if number in seen or match["indent"] != kept.indent or not kept.text.endswith(match["end"]):
                return None
            seen.add(number)
            pieces.append(code[end:match.start()])
            pieces.append(kept.text)
            end = match.end()
        if len(seen) != len(self.kept):
            return None
        pieces.append(code[end:])
        return "".join(pieces)


_PLACEHOLDER = re.compile(rf"^(?P<indent>[ \t]*){PREFIX}(?P<number>\d+)__(?P<end>\r?\n)", re.MULTILINE)


def build(text: str, tree: ast.Module, analysis: Analysis, keep_last: bool) -> Skeleton | None:
    """The skeleton of `text`, or None when no definition can be left out (or the file is one
    of the kinds parsed whole). `keep_last`: the last top-level statement must keep its text (an unusual end of file)."""
    if "\r" in text and not text.count("\r") == text.count("\r\n") == text.count("\n"):
        return None  # lone CRs (ast and libcst count lines differently) or mixed line ends
    if "\x0c" in text or PREFIX in text or not tree.body:
        return None
    chooser = _Chooser(text, analysis)
    body = tree.body[:-1] if keep_last else tree.body
    first_indented = next((s for s in body if chooser.has_indented_block(s)), None)
    for stmt in body:
        if stmt is first_indented:
            chooser.inside(stmt)  # its own text sets libcst's indentation unit
        else:
            chooser.statement(stmt)
    if not chooser.spans:
        return None
    pieces, kept, start = [], [], 0
    for first, end, indent in chooser.spans:  # in source order, never nested
        pieces.append(text[start:first])
        kept.append(Kept(indent, text[first:end]))
        pieces.append(f"{indent}{PREFIX}{len(kept) - 1}__{_line_break_at(text, end)}")
        start = end
    pieces.append(text[start:])
    return Skeleton("".join(pieces), kept)


def _line_break_at(text: str, end: int) -> str:
    return "\r\n" if text.startswith("\r\n", end - 2) else "\n"


class _Chooser:
    """Picks the definitions to leave out: (start offset, end offset, indentation)."""

    def __init__(self, text: str, analysis: Analysis):
        self.text = text
        self.analysis = analysis
        self.line_starts = [0] + [m.end() for m in _LINE_BREAK.finditer(text)]
        self.import_lines = sorted({b.stmt.lineno for b in analysis.imports if is_xla_name(b.qualname)})
        self.spans: list[tuple[int, int, str]] = []

    def line(self, number: int) -> str:
        """Line `number` (1-based) without its line break."""
        start = self.line_starts[number - 1]
        end = self.line_starts[number] if number < len(self.line_starts) else len(self.text)
        return self.text[start:end].rstrip("\r\n")

    def statement(self, stmt: ast.stmt) -> None:
        info = self.analysis.info(stmt)
        if info.subtree_interesting:
            self.inside(stmt)
        elif isinstance(stmt, _DEFINITIONS):
            self.leave_out(stmt)

    def inside(self, stmt: ast.stmt) -> None:
        for name in ("body", "orelse", "finalbody"):
            block = getattr(stmt, name, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                for child in block:
                    self.statement(child)
        for holder in (*getattr(stmt, "handlers", ()), *getattr(stmt, "cases", ())):
            for child in holder.body:
                self.statement(child)

    def leave_out(self, node: ast.stmt) -> None:
        first = self.analysis.info(node).first_line
        last = node.end_lineno
        if not self.starts_line(node) or self._imports_xla(first, last):
            return
        if self.starts_line(node.body[0]):  # an indented body: its footer comes along
            body_indent = _indentation(self.line(self.analysis.info(node.body[0]).first_line))
            following = last
            while following < len(self.line_starts) - 1:
                line = self.line(following + 1)
                if not _FOOTER_LINE.fullmatch(line):
                    break
                following += 1
                if line.startswith(body_indent):
                    last = following
        if last >= len(self.line_starts):  # no line break after it: the end of the file
            return
        start, end = self.line_starts[first - 1], self.line_starts[last]
        if end - start < MIN_CHARS or "\\\n" in self.text[start:end] or "\\\r\n" in self.text[start:end]:
            return
        self.spans.append((start, end, _indentation(self.line(first))))

    def starts_line(self, node: ast.stmt) -> bool:
        """The statement is the first thing on its line (not `if x: stmt`)."""
        if getattr(node, "decorator_list", None):
            return True  # a decorator always starts a line
        line = self.line(node.lineno)
        return len(_indentation(line)) == node.col_offset  # columns: UTF-8 bytes; indentation is ASCII

    def has_indented_block(self, stmt: ast.stmt) -> bool:
        """Some block of `stmt` starts on a line of its own (libcst reads the file's indentation
        unit from the first such line)."""
        if not hasattr(stmt, "body"):
            return False
        for node in ast.walk(stmt):
            if node is not stmt and isinstance(node, ast.stmt) and self.starts_line(node):
                return True
        return False

    def _imports_xla(self, first: int, last: int) -> bool:
        """A torch_xla import in these lines: the import removal must see it."""
        index = bisect_left(self.import_lines, first)
        return index < len(self.import_lines) and self.import_lines[index] <= last


def _indentation(line: str) -> str:
    return line[:len(line) - len(line.lstrip(" \t"))]
