"""Parse with libcst only the code the rewrite can change.

libcst's parse and print are most of a rewrite's time, and they grow with the text. The walk
(transformer.py) visits only the statements in which the analysis found something, so libcst
need not see the others: before parsing, each stretch of them is replaced by a one-line
placeholder statement at the same indentation,

    def helper(x):            ->    __tpu_migrate_kept_0__
        return x + 1

    def train(loader):                  def train(loader):
        model = build()           ->        __tpu_migrate_kept_1__
        log("start")                        xm.mark_step()
        xm.mark_step()

libcst parses and prints the shorter text, and the left-out text replaces the placeholders in
the printed output. What is left out: a function or class in which the analysis found nothing
(anywhere), and inside the definitions the walk enters, each run of consecutive statements of
one block in which it found nothing (a run's placeholder stands for several ast statements:
the walk pairs it with all of them). On the real files of fixtures/corpus libcst now parses
about half of their text (it parsed 95% when such definitions were parsed whole).

The rules look at neighbouring statements through ast (the analysis, plans, flows), never
through libcst, except where listed here; those statements stay in the parse:
- module-level statements other than definitions (the import placement reads the docstring,
  the imports, the classes a helper must follow);
- a definition's docstring (a line inserted at the start of a body goes after it);
- import statements, and text holding an import of torch_xla or of a name a rule matches (the
  import removal looks for them);
- the statements of a `try` or an `if` that holds an import (the import removal reads them:
  `except ImportError: pass` goes with its import);
- a `match`, and the `elif` of an `if` (a placeholder cannot stand for a clause).
A statement a later pass must visit after all (a flow's TODO, a plan made with other settings)
raises SkeletonMiss in the walk, and the file is parsed anew, whole.

The left-out text is put back only where that gives what printing the full parse gives:
- it spans whole lines, decorators included, through the comment lines libcst would give the
  body's footer of its last statement (those indented at least as deep as that body, up to the
  last such line), so the comments and blank lines around a placeholder are the same
  statement's leading lines and the same block's footer as around the statements;
- the placeholder comes back once, as a whole line, at its statements' own indentation. A rule
  that moves a block to another indentation (an `if` folded to the branch that runs, a `with`
  unwrapped) has libcst parse the placeholders in it there (Skeleton.statements), as in a
  whole parse; one that drops a block drops its placeholders (transformer.py records both);
  anything else makes `restore` answer None, and the caller parses the whole file instead;
- libcst reads the file's indentation unit from its first indented line (a placeholder keeps
  the indentation of the first statement it stands for), and the end of a file from its last
  statement: the last top-level statement keeps its own text when the end of the file is
  unusual (engine._plain_tail);
- files with form feeds, lone CRs or mixed line ends (engine.py checks their round trip), or
  with the placeholder's name in their text, are parsed whole; text holding a backslash line
  continuation stays in the parse.

The printed skeleton is parsed before anything is written (engine._check_parses): it parses
exactly when the output does, as the left-out text came back verbatim, in whole lines, at the
indentation at which it parsed in the input.
"""

from __future__ import annotations

import ast
import re
from bisect import bisect_left, bisect_right
from dataclasses import dataclass

import libcst as cst

from tpu_migrate.rewrite import cst_parse
from tpu_migrate.rewrite.except_colons import restore_except_colons
from tpu_migrate.rewrite.names import Analysis, is_xla_name
from tpu_migrate.rewrite.todos import newline_starts

PREFIX = "__tpu_migrate_kept_"
_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_FOOTER_LINE = re.compile(r"[ \t]*(?:#[^\r\n]*)?")  # what libcst can put in a block's footer
_CONTINUATION = re.compile(r"\\\r?\n")  # a backslash line continuation
# Worth a placeholder: about the length of its own line (tests set 0 to leave out all). 200
# left 8% more text to libcst on the 103 real files of docs/development.md, and cost 5-7% of a run.
MIN_CHARS = 40


@dataclass
class Kept:
    indent: str
    text: str  # the statements' lines, line breaks included
    statements: int = 1  # how many statements of the block (ast's) the placeholder stands for


@dataclass
class Skeleton:
    text: str  # what libcst parses
    kept: list[Kept]  # by placeholder number

    @property
    def placeholders(self) -> dict[str, tuple[int, int]]:
        """Each placeholder's name -> (its number, how many ast statements it stands for): the
        walk pairs libcst's statements with ast's (transformer.py)."""
        return {f"{PREFIX}{number}__": (number, kept.statements) for number, kept in enumerate(self.kept)}

    def statements(self, number: int, module: cst.Module) -> list[cst.BaseStatement]:
        """libcst's statements for placeholder `number`, as a parse of the whole file (`module`:
        the skeleton's) gives them: for a rule that moves them to another indentation (an `if`
        folded to its branch, a `with` unwrapped), where their text cannot go back verbatim.
        Parsed in a block at their own indentation, after one at the file's indentation unit,
        so that their nested blocks read theirs as the file does."""
        kept = self.kept[number]
        newline = module.default_newline
        text = f"if 1:{newline}{module.default_indent}pass{newline}if 1:{newline}{kept.text}"
        wrapped = restore_except_colons(cst_parse.parse_module(text), text, None)
        block = wrapped.body[1].body
        if block.footer or wrapped.footer:
            raise SkeletonMiss("a left-out statement's comments would move")
        return list(block.body)

    def restore(self, code: str, gone: frozenset[int] | set[int] = frozenset()) -> str | None:
        """`code` printed from the skeleton's parse, with each left-out text back in its
        placeholder's place; None when some placeholder did not come back as it went in.
        `gone`: the placeholders a rule dropped with their statements or replaced by them
        (`statements`)."""
        if code.count(PREFIX) != len(self.kept) - len(gone):
            return None
        pieces, end, seen = [], 0, set()
        for match in PLACEHOLDER_LINE.finditer(code):
            number = int(match["number"])
            kept = self.kept[number]
            if number in seen or number in gone or match["indent"] != kept.indent \
                    or not kept.text.endswith(match["end"]):
                return None
            seen.add(number)
            pieces.append(code[end:match.start()])
            pieces.append(kept.text)
            end = match.end()
        if len(seen) != len(self.kept) - len(gone):
            return None
        pieces.append(code[end:])
        return "".join(pieces)


class SkeletonMiss(Exception):
    """A statement the skeleton left out is one the walk must visit (marked by a later pass:
    a flow's TODO, a plan made with other settings), or cannot be put back: the engine parses
    the file anew, whole."""


# A placeholder's line, as build writes it.
PLACEHOLDER_LINE = re.compile(rf"^(?P<indent>[ \t]*)(?P<name>{PREFIX}(?P<number>\d+)__)(?P<end>\r?\n)", re.MULTILINE)


def build(text: str, tree: ast.Module, analysis: Analysis, keep_last: bool,
          kept_import=is_xla_name) -> Skeleton | None:
    """The skeleton of `text`, or None when nothing can be left out (or the file is one of the
    kinds parsed whole). `keep_last`: the last top-level statement must keep its text (an
    unusual end of file). `kept_import(qualname)`: an import of it must stay in the parse (the
    import removal looks for it: torch_xla's, an availability check's)."""
    if "\r" in text and not text.count("\r") == text.count("\r\n") == text.count("\n"):
        return None  # lone CRs (ast and libcst count lines differently) or mixed line ends
    if "\x0c" in text or PREFIX in text or not tree.body:
        return None
    chooser = _Chooser(text, analysis, kept_import)
    body = tree.body[:-1] if keep_last else tree.body
    first_indented = next((s for s in body if chooser.has_indented_block(s)), None)
    for stmt in body:
        if stmt is first_indented:
            chooser.inside(stmt)  # its own text sets libcst's indentation unit (a run's
            # placeholder keeps its first statement's indentation)
        else:
            chooser.statement(stmt)
    if not chooser.spans:
        return None
    pieces, kept, start = [], [], 0
    for first, end, indent, count in sorted(chooser.spans):  # never nested
        pieces.append(text[start:first])
        kept.append(Kept(indent, text[first:end], count))
        pieces.append(f"{indent}{PREFIX}{len(kept) - 1}__{_line_break_at(text, end)}")
        start = end
    pieces.append(text[start:])
    return Skeleton("".join(pieces), kept)


def _line_break_at(text: str, end: int) -> str:
    return "\r\n" if text.startswith("\r\n", end - 2) else "\n"


def _blocks(stmt: ast.stmt) -> list[list[ast.stmt]]:
    """The statement lists of a compound statement, in source order."""
    found = [stmt.body] if isinstance(getattr(stmt, "body", None), list) and stmt.body \
        and isinstance(stmt.body[0], ast.stmt) else []
    found.extend(holder.body for holder in (*getattr(stmt, "handlers", ()), *getattr(stmt, "cases", ())))
    found.extend(block for block in (getattr(stmt, "orelse", None), getattr(stmt, "finalbody", None)) if block)
    return found


class _Chooser:
    """Picks what to leave out: (start offset, end offset, indentation, ast statements), one
    span per placeholder: an uninteresting definition anywhere, and inside a definition
    the walk enters, each run of consecutive statements in which the analysis found nothing."""

    def __init__(self, text: str, analysis: Analysis, kept_import):
        self.text = text
        self.analysis = analysis
        self.line_starts = newline_starts(text)  # "\r\n" ends with "\n" too (no lone CRs here)
        self.import_lines = sorted({b.stmt.lineno for b in analysis.imports if kept_import(b.qualname)})
        self.continued = [bisect_right(self.line_starts, m.start()) for m in _CONTINUATION.finditer(text)]
        self.spans: list[tuple[int, int, str, int]] = []

    def line(self, number: int) -> str:
        """Line `number` (1-based) without its line break."""
        start = self.line_starts[number - 1]
        end = self.line_starts[number] if number < len(self.line_starts) else len(self.text)
        return self.text[start:end].rstrip("\r\n")

    def statement(self, stmt: ast.stmt, in_definition: bool = False) -> None:
        info = self.analysis.info(stmt)
        if info.subtree_interesting:
            self.inside(stmt, in_definition)
        elif isinstance(stmt, _DEFINITIONS) and not self.leave_out([stmt]):
            self.inside(stmt, in_definition)  # a torch_xla import in it, say: what is around it

    def inside(self, stmt: ast.stmt, in_definition: bool = False) -> None:
        """Leave out what the walk will not change in the blocks of `stmt`, which it enters.

        Runs of statements only inside a definition: at module level the import placement
        reads the statements themselves (the docstring, the classes a helper must follow). Not
        in the blocks of a `try` or an `if` that holds an import: the import removal reads
        their other statements (`except ImportError: pass` goes with its import)."""
        in_definition = in_definition or isinstance(stmt, _DEFINITIONS)
        runs = in_definition and not (isinstance(stmt, (ast.Try, ast.If, getattr(ast, "TryStar", ast.Try)))
                                      and _holds_import(stmt))
        for block in _blocks(stmt):
            run: list[ast.stmt] = []
            elif_ = isinstance(stmt, ast.If) and block is stmt.orelse and block[0].col_offset <= stmt.col_offset
            for index, child in enumerate(block):
                following = block[index + 1] if index + 1 < len(block) else None
                if runs and not elif_ and self.opaque(child, following, stmt if index == 0 else None):
                    run.append(child)
                    continue
                self.leave_out(run)
                run = []
                self.statement(child, in_definition)
            self.leave_out(run)

    def opaque(self, stmt: ast.stmt, following: ast.stmt | None, parent: ast.stmt | None) -> bool:
        """Whether `stmt` may go into a run: nothing in it concerns the walk, it has whole
        lines of its own, and it is not a definition's docstring (a line inserted at the start
        of the body goes after it: transforms/launch.py insert_at_body_start)."""
        if self.analysis.info(stmt).subtree_interesting or not self.starts_line(stmt):
            return False
        if following is not None and following.lineno <= stmt.end_lineno:
            return False  # `a = 1; b = 2`: the line's statements go together or not at all
        if parent is not None and isinstance(parent, _DEFINITIONS) and isinstance(stmt, ast.Expr) \
                and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
            return False
        # A `match` prints the comments after its last case as its own footer.
        return not isinstance(stmt, (ast.Import, ast.ImportFrom, ast.Match))

    def leave_out(self, run: list[ast.stmt]) -> bool:
        """A placeholder for these consecutive statements of one block, where that is safe and
        worth it; whether it was left out."""
        if not run:
            return False
        first = self.analysis.info(run[0]).first_line
        node = run[-1]
        last = node.end_lineno
        if not self.starts_line(run[0]) or self._holds(self.import_lines, first, last) \
                or self._holds(self.continued, first, last):
            return False
        body_indent = self.footer_indent(node)
        if body_indent is not None:  # an indented body: its footer comes along
            following = last
            while following < len(self.line_starts) - 1:
                line = self.line(following + 1)
                if not _FOOTER_LINE.fullmatch(line):
                    break
                following += 1
                if line.startswith(body_indent):
                    last = following
        if last >= len(self.line_starts):  # no line break after it: the end of the file
            return False
        start, end = self.line_starts[first - 1], self.line_starts[last]
        if end - start < MIN_CHARS:
            return False
        self.spans.append((start, end, _indentation(self.line(first)), len(run)))
        return True

    def footer_indent(self, node: ast.stmt) -> str | None:
        """The indentation of the block that ends `node` (libcst gives it the comment lines
        after it that are indented at least as deep, up to the last such line), or None when
        `node` ends in no indented block."""
        blocks = _blocks(node)
        if not blocks or not self.starts_line(blocks[-1][0]):
            return None
        indent = _indentation(self.line(self.analysis.info(blocks[-1][0]).first_line))
        if len(indent) <= node.col_offset:  # an `elif`: its own blocks end the `if`
            return self.footer_indent(blocks[-1][0])
        return indent

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

    @staticmethod
    def _holds(lines: list[int], first: int, last: int) -> bool:
        """One of `lines` (sorted) lies in first..last."""
        index = bisect_left(lines, first)
        return index < len(lines) and lines[index] <= last


def _holds_import(stmt: ast.stmt) -> bool:
    """An import statement is `stmt` or in its blocks (at any depth). Through the statement
    lists only: an import is never inside an expression, where ast.walk spent its time."""
    stack = [stmt]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            return True
        for block in _blocks(node):
            stack.extend(block)
    return False


def _indentation(line: str) -> str:
    return line[:len(line) - len(line.lstrip(" \t"))]
