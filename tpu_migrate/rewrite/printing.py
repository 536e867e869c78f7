"""libcst's printer without the context managers that do nothing.

libcst prints each expression inside `with self._parenthesize(state):` and many nodes inside
`with state.record_syntactic_position(node):`, both generator-based context managers. For the
plain CodegenState that `Module.code` and `code_for_node` use, the second does nothing, and the
first does nothing either where the node has no parentheses: most nodes. Making a generator per
node for that is about half of libcst's printing time (the 103-file corpus of issue 52: 0.44 s
of CPU, 0.22 s without, the same text).

`quick_printing()` swaps in one shared context manager that does nothing, in exactly those
cases, while a file is rewritten, and puts libcst's own methods back after: code that imports
the tool, and the libcst floor the benchmarks measure beside it, keep libcst as it is. Any other
state (libcst's metadata, which records positions) and any node with parentheses still goes
through libcst's own code. Where libcst has no such methods, nothing is swapped.

`module_code` prints a rewritten module copying the text of each statement that came out of
the walk unchanged, at the indentation it had (source_spans.py), and has libcst generate only
the others: the walk changes a few statements of a file, and the statements around them are
most of what libcst printed (the blocks of a changed statement print through an IndentedBlock
swapped in the same way, which copies its unchanged statements too).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import libcst as cst

from tpu_migrate.rewrite.source_spans import SourceSpans, changed_fields, same

try:
    from libcst._nodes.expression import _BaseParenthesizedNode
    from libcst._nodes.internal import CodegenState
except ImportError:  # another libcst's layout: print as it does
    _BaseParenthesizedNode = CodegenState = None

_PARENTHESIZE = getattr(_BaseParenthesizedNode, "_parenthesize", None)
_RECORD = getattr(CodegenState, "record_syntactic_position", None)
_INDENTED_BLOCK = getattr(cst.IndentedBlock, "_codegen_impl", None)


class _Nothing:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> None:
        return None


_NOTHING = _Nothing()


def _record_nothing(self, node, *, start_node=None, end_node=None) -> _Nothing:
    """CodegenState.record_syntactic_position: the base class records no position."""
    return _NOTHING


def _parenthesize(self, state):
    if not self.lpar and not self.rpar and type(state).record_syntactic_position is _record_nothing:
        return _NOTHING
    return _PARENTHESIZE(self, state)


class _CopyingState(CodegenState if CodegenState is not None else object):
    """libcst's state, with the statements whose text can be copied (module_code)."""

    spans: SourceSpans
    generated: int  # statements printed by libcst (the tests count them)
    # The tokens that are a statement copied whole: what the parse check leaves out
    # (module_code's `checked`), index -> what stands there instead ("" or a `pass` line).
    left_out: dict[int, str]


def _indented_block(self, state) -> None:
    """IndentedBlock._codegen_impl (libcst 1.x), copying its unchanged statements' text."""
    if type(state) is not _CopyingState or not self.body:
        return _INDENTED_BLOCK(self, state)
    self.header._codegen(state)
    indent = self.indent
    state.increase_indent(state.default_indent if indent is None else indent)
    _statements(self.body, state)
    for line in self.footer:
        line._codegen(state)
    state.decrease_indent()


def _statements(stmts, state: _CopyingState) -> None:
    indent = "".join(state.indent_tokens)
    whole = []  # the tokens of this block's statements copied whole
    for stmt in stmts:
        copied = _copied(stmt, state, indent)
        if copied is _WHOLE:
            whole.append(len(state.tokens) - 1)
        elif not copied:
            state.generated += 1
            stmt._codegen(state)
    if not whole:
        return
    for index in whole:
        state.left_out[index] = ""
    if len(whole) == len(stmts) and state.indent_tokens:  # a block needs a statement
        state.left_out[whole[0]] = f"{indent}pass{state.default_newline}"


_WHOLE = "whole"  # _copied: the statement's text was copied as one token


# Compound statements whose header is printed before their body, and only `orelse` after it.
_HEADED = (cst.FunctionDef, cst.ClassDef, cst.With, cst.If, cst.For, cst.While)


def _copied(stmt, state: _CopyingState, indent: str) -> bool | str:
    """Print `stmt` from the parsed text where the walk left it (or its own lines, its header)
    as it was, at the indentation it had; whether it did (_WHOLE: all of it, as one token)."""
    spans = state.spans
    original = spans.original(stmt)
    if original is None:
        return False
    start, own_start, end = spans.spans[id(original)]
    if not spans.indented(own_start, indent):
        return False
    changed = changed_fields(stmt, original)
    if not changed:
        state.tokens.append(spans.text[start:end])
        return _WHOLE
    leading = "leading_lines" in changed
    rest = [name for name in changed if name != "leading_lines"]
    if rest and not (isinstance(stmt, _HEADED) and set(rest) <= {"body", "orelse"} and _same_frame(stmt, original)):
        return False
    if leading:  # comments added above it, say: its own text as it was
        for line in stmt.leading_lines:
            line._codegen(state)
    else:
        state.tokens.append(spans.text[start:own_start])
    if not rest:
        state.tokens.append(spans.text[own_start:end])
        return True
    # Its header as it was (decorators and all, through the line that ends with the colon).
    state.tokens.append(spans.text[own_start:spans.spans[id(original.body.body[0])][0]])
    block = stmt.body
    state.increase_indent(state.default_indent if block.indent is None else block.indent)
    _statements(block.body, state)
    for line in block.footer:
        line._codegen(state)
    state.decrease_indent()
    orelse = getattr(stmt, "orelse", None)
    if orelse is not None:
        if isinstance(orelse, cst.If):
            orelse._codegen(state, is_elif=True)
        else:
            orelse._codegen(state)
    return True


def _same_frame(stmt, original) -> bool:
    """Both bodies are indented blocks with the same indentation and colon line, and the new one
    holds statements (an empty one prints `pass`)."""
    new, old = stmt.body, original.body
    return type(new) is cst.IndentedBlock and type(old) is cst.IndentedBlock and bool(new.body) \
        and bool(old.body) and new.indent == old.indent and same(new.header, old.header)


def module_code(module: cst.Module, spans: SourceSpans | None, counts: list[int] | None = None,
                checked: list[str] | None = None) -> str:
    """`module.code`, copying the text of the statements in `spans` (source_spans.py) that it
    holds unchanged where they were. `counts`: gets how many statements libcst printed (tests).
    Outside quick_printing, only the module's own statements are copied.

    `checked`: gets the text that parses exactly when the code does (engine._check_parses):
    the code without the statements copied whole, each of which parsed where it was, as whole
    lines at this same indentation (a block they filled keeps a `pass` at it)."""
    if spans is None or CodegenState is None or _INDENTED_BLOCK is None or not module.has_trailing_newline:
        code = module.code
        if checked is not None:
            checked.append(code)
        return code
    state = _CopyingState(default_indent=module.default_indent, default_newline=module.default_newline)
    state.spans, state.generated, state.left_out = spans, 0, {}
    for line in module.header:
        line._codegen(state)
    _statements(module.body, state)
    for line in module.footer:
        line._codegen(state)
    if counts is not None:
        counts.append(state.generated)
    if checked is not None:
        checked.append(_without(state.tokens, state.left_out))
    return "".join(state.tokens) or state.default_newline  # as Module._codegen_impl


def _without(tokens: list[str], left_out: dict[int, str]) -> str:
    """The text of `tokens` with those at the indices of `left_out` replaced by its values."""
    pieces, start = [], 0
    for index in sorted(left_out):
        pieces.append("".join(tokens[start:index]))
        pieces.append(left_out[index])
        start = index + 1
    pieces.append("".join(tokens[start:]))
    return "".join(pieces)


@contextmanager
def quick_printing() -> Iterator[None]:
    if _PARENTHESIZE is None or _RECORD is None or _INDENTED_BLOCK is None \
            or CodegenState.record_syntactic_position is _record_nothing:
        yield  # nothing to swap, or swapped already (a notebook's cells rewritten inside its file)
        return
    CodegenState.record_syntactic_position = _record_nothing
    _BaseParenthesizedNode._parenthesize = _parenthesize
    cst.IndentedBlock._codegen_impl = _indented_block
    try:
        yield
    finally:
        CodegenState.record_syntactic_position = _RECORD
        _BaseParenthesizedNode._parenthesize = _PARENTHESIZE
        cst.IndentedBlock._codegen_impl = _INDENTED_BLOCK
