"""A libcst node with new children, rebuilt only where one of them is new.

`with_changes` builds a new node (and validates it) even when every value it is given is the
one the node holds. The walks (transformer.py, imports.py) hand their results back this way:
where nothing under a statement changed, the statement stays the same object, which costs no
copy and lets the printer copy its text after an identity test (printing.py)."""

from __future__ import annotations

import libcst as cst


def with_body(node: cst.CSTNode, body) -> cst.CSTNode:
    """`node` with `body` (a suite): `node` itself where it is its body already."""
    return node if body is node.body else node.with_changes(body=body)


def with_changes(node: cst.CSTNode, **changes) -> cst.CSTNode:
    """`node.with_changes(**changes)`, or `node` where each value is what it holds (the same
    object, or a list of the same objects)."""
    for name, value in changes.items():
        old = getattr(node, name)
        if value is old:
            continue
        if type(value) is list and isinstance(old, (list, tuple)) and len(value) == len(old) \
                and all(a is b for a, b in zip(value, old)):
            continue
        return node.with_changes(**changes)
    return node
