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
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

try:
    from libcst._nodes.expression import _BaseParenthesizedNode
    from libcst._nodes.internal import CodegenState
except ImportError:  # another libcst's layout: print as it does
    _BaseParenthesizedNode = CodegenState = None

_PARENTHESIZE = getattr(_BaseParenthesizedNode, "_parenthesize", None)
_RECORD = getattr(CodegenState, "record_syntactic_position", None)


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


@contextmanager
def quick_printing() -> Iterator[None]:
    if _PARENTHESIZE is None or _RECORD is None or CodegenState.record_syntactic_position is _record_nothing:
        yield  # nothing to swap, or swapped already (a notebook's cells rewritten inside its file)
        return
    CodegenState.record_syntactic_position = _record_nothing
    _BaseParenthesizedNode._parenthesize = _parenthesize
    try:
        yield
    finally:
        CodegenState.record_syntactic_position = _RECORD
        _BaseParenthesizedNode._parenthesize = _PARENTHESIZE
