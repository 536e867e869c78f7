"""libcst's parsers, without libcst checking each node its own parser builds.

Every libcst node validates itself when made (`CSTNode.__post_init__` calls `_validate`: the
whitespace is whitespace, a name is an identifier, parentheses pair). For the nodes of a parse
that proves nothing the grammar has not: libcst's own comment there says validating while
parsing is wasted work. It was 15% of libcst's parse time on the 103 real files of
docs/development.md, which is about a fifth of a rewrite.

Nodes the rules make (`with_changes`, templates built by hand) are still validated: only the
parse itself skips it, and the printed output is compiled before anything is written
(engine._check_parses).
"""

from __future__ import annotations

from contextlib import contextmanager

import libcst as cst


def parse_module(text: str) -> cst.Module:
    with _unvalidated():
        return cst.parse_module(text)


def parse_expression(text: str) -> cst.BaseExpression:
    with _unvalidated():
        return cst.parse_expression(text)


def parse_statement(text: str) -> cst.BaseStatement:
    with _unvalidated():
        return cst.parse_statement(text)


def _no_validation(self) -> None:
    pass


@contextmanager
def _unvalidated():
    """Nodes made in the block skip `_validate`. Nests; restores what was there (libcst's
    hook), also when the parser raises."""
    before = cst.CSTNode.__dict__.get("__post_init__")
    if before is None:  # a libcst that validates elsewhere: parse as it does
        yield
        return
    cst.CSTNode.__post_init__ = _no_validation
    try:
        yield
    finally:
        cst.CSTNode.__post_init__ = before
