"""Expressions that only read values: an `if` with such a test and nothing left in its body can
go (transformer.py: an emptied `if`; imports.py: an `if` of version-dependent imports)."""

from __future__ import annotations

import libcst as cst

# Comparisons and arithmetic on names, attributes and constants.
_INERT = (
    cst.Name, cst.Attribute, cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString,
    cst.ConcatenatedString, cst.Comparison, cst.ComparisonTarget, cst.BinaryOperation,
    cst.UnaryOperation, cst.BooleanOperation,
)

_SYNTAX = (
    cst.BaseParenthesizableWhitespace, cst.LeftParen, cst.RightParen, cst.BaseBinaryOp,
    cst.BaseBooleanOp, cst.BaseCompOp, cst.BaseUnaryOp,
)


def is_inert(node: cst.CSTNode) -> bool:
    """`node` computes without calling anything the program defines."""
    if isinstance(node, cst.Call):
        return _lookup_call(node)
    if isinstance(node, cst.Subscript):  # `cfg["metrics"]`
        return is_inert(node.value) and all(
            isinstance(e.slice, cst.Index) and is_inert(e.slice.value) for e in node.slice)
    if not isinstance(node, _INERT):
        return False
    if isinstance(node, cst.Attribute):
        return is_inert(node.value)
    if isinstance(node, cst.Name):
        return True
    children = [c for c in node.children if not isinstance(c, _SYNTAX)]
    return all(is_inert(child) for child in children)


# Calls that by convention only look a value up: a flag read as `cfg.get("metrics")`,
# `getattr(args, "debug", False)` or `os.environ.get(...)` is as inert as `cfg.metrics`.
_LOOKUP_FUNCTIONS = frozenset({"getattr", "hasattr", "isinstance", "len", "bool", "getenv"})
_LOOKUP_METHODS = frozenset({"get", "getenv"})


def _lookup_call(call: cst.Call) -> bool:
    func = call.func
    known = (
        (isinstance(func, cst.Name) and func.value in _LOOKUP_FUNCTIONS)
        or (isinstance(func, cst.Attribute) and func.attr.value in _LOOKUP_METHODS and is_inert(func.value))
    )
    return known and all(arg.star == "" and arg.keyword is None and is_inert(arg.value) for arg in call.args)
