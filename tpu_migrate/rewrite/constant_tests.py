"""Whether a condition is a constant: the truth of a test made only of literals, or None.

A conversion can answer a runtime question with a constant (target `tpu`: the device kind is
`"TPU"`, the devices of a process are one), which leaves tests such as `"TPU" in ("TPU",
"NEURON")` or `len([torch.device("tpu")]) > 1`. Only literals, tuples, lists, sets,
comparisons, `and` / `or` / `not` and the length of a literal list of literals or devices count:
nothing that names a variable or calls the program's code, so evaluating it cannot run any.
"""

from __future__ import annotations

import ast
import operator

import libcst as cst

from tpu_migrate.rewrite.transforms.common import code

_COMPARE = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b, ast.Is: operator.is_, ast.IsNot: operator.is_not,
    ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
}


class _NotConstant(Exception):
    pass


def folded(original: cst.BaseExpression, updated: cst.BaseExpression) -> cst.BaseExpression:
    """`updated` (a comparison, `and` / `or`, `not`), or `True` / `False` where a conversion
    inside it made it constant: `"TPU" == "TPU" or "TPU" == "TPU"` is written `True`."""
    if updated is original:
        return updated
    truth = constant_truth(code(updated))
    if truth is None or constant_truth(code(original)) is not None:
        return updated
    return cst.Name("True" if truth else "False", lpar=updated.lpar, rpar=updated.rpar)


def constant_truth(test: ast.expr | str) -> bool | None:
    """The truth of `test` (an expression or its source) if it is made only of literals."""
    if isinstance(test, str):
        try:
            test = ast.parse(test.strip(), mode="eval").body
        except SyntaxError:
            return None
    try:
        return bool(_value(test))
    except (_NotConstant, TypeError):
        return None


def _value(node: ast.expr):
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes, int, float, bool, type(None))):
        return node.value
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(_value(element) for element in node.elts)
    if isinstance(node, ast.Set):
        return frozenset(_value(element) for element in node.elts)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return not _value(node.operand)
    if isinstance(node, ast.BoolOp):
        values = [bool(_value(value)) for value in node.values]
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len"
            and len(node.args) == 1 and not node.keywords and isinstance(node.args[0], (ast.List, ast.Tuple))
            and all(_pure(element) for element in node.args[0].elts)):
        # `len([torch.device("tpu")])`, from xm.get_xla_supported_devices(): one device per
        # process. (A program that rebinds `len` itself is not considered.)
        return len(node.args[0].elts)
    if isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
        left = _value(node.left)
        for op, right_node in zip(node.ops, node.comparators):
            right = _value(right_node)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    raise _NotConstant


def _pure(node: ast.expr) -> bool:
    """An element whose value a fold may drop: a literal, or a device made from literals."""
    if isinstance(node, ast.Constant):
        return True
    return (isinstance(node, ast.Call) and ast.unparse(node.func) == "torch.device" and not node.keywords
            and all(isinstance(arg, ast.Constant) for arg in node.args))
