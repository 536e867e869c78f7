"""rewrite/cst_parse.py: libcst's parse without its per-node validation gives the same tree,
and validation is back for every node made after it, whatever the parse did."""

from __future__ import annotations

import libcst as cst
import pytest

from conftest import ROOT
from tpu_migrate.rewrite import cst_parse


def test_the_tree_is_libcst_s_own():
    text = (ROOT / "tpu_migrate" / "rewrite" / "engine.py").read_text(encoding="utf-8")
    fast = cst_parse.parse_module(text)
    assert fast.deep_equals(cst.parse_module(text)) and fast.code == text
    assert cst_parse.parse_expression("xm.mark_step(wait=True)").deep_equals(cst.parse_expression("xm.mark_step(wait=True)"))
    assert cst_parse.parse_statement("x: int = 1\n").deep_equals(cst.parse_statement("x: int = 1\n"))


@pytest.mark.parametrize("bad_source", ["def f(:\n", "x = (\n"])
def test_nodes_made_after_a_parse_are_validated_again(bad_source):
    cst_parse.parse_module("x = 1\n")
    with pytest.raises(cst.ParserSyntaxError):
        cst_parse.parse_module(bad_source)
    with pytest.raises(cst.CSTValidationError):
        cst.SimpleWhitespace("x")  # not whitespace
    with pytest.raises(cst.CSTValidationError):
        cst_parse.parse_expression("a").with_changes(value="not a name")


def test_validation_is_skipped_only_inside_the_parse():
    with cst_parse._unvalidated():
        with cst_parse._unvalidated():
            cst.SimpleWhitespace("x")  # made unchecked, as the parser's nodes are
        cst.SimpleWhitespace("x")
    with pytest.raises(cst.CSTValidationError):
        cst.SimpleWhitespace("x")
