"""Device rules: `xm.xla_device()`, "xla" device strings, device-type tests, autocast strings (TPU001-TPU003)."""

from __future__ import annotations

import libcst as cst

from tpu_migrate.rewrite.context import StatementContext, parse_expr
from tpu_migrate.rewrite.transforms.common import (
    XLA_DEVICE,
    PORTABLE_DEVICE,
    bind,
    quote_of,
)


def is_xla_device_string(node: cst.BaseExpression) -> bool:
    if isinstance(node, cst.SimpleString):
        try:
            value = node.evaluated_value
        except Exception:  # noqa: BLE001 - odd escapes: not a device string
            return False
        return isinstance(value, str) and bool(XLA_DEVICE.match(value))
    if isinstance(node, cst.FormattedString):
        parts = node.parts
        return (
            len(parts) >= 2
            and isinstance(parts[0], cst.FormattedStringText)
            and parts[0].value == "xla:"
            and all(isinstance(p, cst.FormattedStringExpression) for p in parts[1:])
        )
    return False




def device_value(node: cst.BaseExpression, sc: StatementContext) -> cst.BaseExpression:
    """What an "xla" device string becomes."""
    if sc.file.target == "tpu":
        q = quote_of(node)
        return cst.SimpleString(f"{q}tpu{q}")
    return parse_expr(sc.file.plan.fill(PORTABLE_DEVICE))


def device_call(call, qualname, sc: StatementContext, rule):
    sc.fixed(rule.code, qualname)
    if sc.file.target == "tpu":
        return parse_expr(sc.file.plan.fill('{torch}.device("tpu")'))
    return parse_expr(sc.file.plan.fill(PORTABLE_DEVICE))


def torch_device_ctor(call: cst.Call, sc: StatementContext):
    """torch.device("xla"), torch.device("xla:1"), torch.device("xla", i)."""
    bound = bind(call, ["type", "index"])
    if bound is None or "type" not in bound or not is_xla_device_string(bound["type"].value):
        return call
    if not sc.enabled("TPU002"):
        return call
    sc.fixed("TPU002", where=sc.consume_string())
    if sc.file.target == "tpu":
        value = device_value(bound["type"].value, sc)
        return call.with_changes(args=[cst.Arg(value)])
    return parse_expr(sc.file.plan.fill(PORTABLE_DEVICE))


def device_string_args(call: cst.Call, sc: StatementContext):
    """`.to("xla")` and `device="xla"` keyword arguments of any call."""
    if not sc.enabled("TPU002"):
        return call
    new_args = list(call.args)
    changed = False
    for i, arg in enumerate(call.args):
        is_device_kw = arg.keyword is not None and arg.keyword.value in ("device", "map_location")
        is_to_arg = (
            i == 0
            and arg.keyword is None
            and isinstance(call.func, cst.Attribute)
            and call.func.attr.value == "to"
        )
        if (is_device_kw or is_to_arg) and is_xla_device_string(arg.value):
            new_args[i] = arg.with_changes(value=device_value(arg.value, sc))
            sc.fixed("TPU002", where=sc.consume_string())
            changed = True
    return call.with_changes(args=new_args) if changed else call


def device_param_default(param: cst.Param, sc: StatementContext) -> cst.Param:
    if (
        param.default is not None
        and "device" in param.name.value
        and is_xla_device_string(param.default)
        and sc.enabled("TPU002")
    ):
        sc.fixed("TPU002", where=sc.consume_string())
        return param.with_changes(default=device_value(param.default, sc))
    return param


def device_type_compare(cmp: cst.Comparison, sc: StatementContext):
    if len(cmp.comparisons) != 1 or not sc.enabled("TPU003"):
        return cmp
    target = cmp.comparisons[0]
    if not isinstance(target.operator, (cst.Equal, cst.NotEqual)):
        return cmp
    left, right = cmp.left, target.comparator
    if _is_type_attr(left) and _is_plain_xla(right):
        string_side = "right"
    elif _is_type_attr(right) and _is_plain_xla(left):
        string_side = "left"
    else:
        return cmp
    sc.fixed("TPU003", where=sc.consume_string())
    string = right if string_side == "right" else left
    q = quote_of(string)
    if sc.file.target == "tpu":
        new_string = cst.SimpleString(f"{q}tpu{q}")
        operator = target.operator
    else:
        new_string = cst.SimpleString(f"{q}cpu{q}")
        equal = isinstance(target.operator, cst.Equal)
        spacing = dict(
            whitespace_before=target.operator.whitespace_before,
            whitespace_after=target.operator.whitespace_after,
        )
        operator = cst.NotEqual(**spacing) if equal else cst.Equal(**spacing)
    if string_side == "right":
        return cmp.with_changes(
            comparisons=[target.with_changes(operator=operator, comparator=new_string)]
        )
    return cmp.with_changes(left=new_string, comparisons=[target.with_changes(operator=operator)])


def _is_type_attr(node) -> bool:
    return isinstance(node, cst.Attribute) and node.attr.value == "type"


def _is_plain_xla(node) -> bool:
    return isinstance(node, cst.SimpleString) and is_xla_device_string(node)


def autocast(call: cst.Call, sc: StatementContext):
    bound = bind(call, ["device_type"])
    if bound is None or "device_type" not in bound or not sc.enabled("TPU002"):
        return call
    arg = bound["device_type"]
    if not is_xla_device_string(arg.value):
        return call
    sc.fixed("TPU002", where=sc.consume_string())
    if sc.file.target == "tpu":
        value = device_value(arg.value, sc)
    else:
        value = parse_expr("(" + sc.file.plan.fill(PORTABLE_DEVICE) + ").type")
    args = [a.with_changes(value=value) if a is arg else a for a in call.args]
    return call.with_changes(args=args)
