"""Collectives: `xm.all_reduce`, `all_gather`, `rendezvous`, `mesh_reduce`, ... (TPU100-TPU110)."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from tpu_migrate.rewrite.context import StatementContext, cst_dotted, parse_expr
from tpu_migrate.rewrite.transforms.common import (
    code,
    bind,
    atom,
    parse_block,
    target_name,
    fresh_name,
    given,
)


REDUCE_OPS = {
    "REDUCE_SUM": "SUM", "REDUCE_MUL": "PRODUCT", "REDUCE_MIN": "MIN", "REDUCE_MAX": "MAX",
    "REDUCE_AND": "BAND", "REDUCE_OR": "BOR",
    "sum": "SUM", "mul": "PRODUCT", "min": "MIN", "max": "MAX", "and": "BAND", "or": "BOR",
}


def _reduce_op(node: cst.BaseExpression, sc: StatementContext) -> str | None:
    """`dist.ReduceOp.X` for an `xm.REDUCE_*` constant or a reduce-type string."""
    key = None
    if isinstance(node, cst.SimpleString):
        key = node.evaluated_value
    else:
        qualname = sc.resolve(node) or ""
        if qualname.startswith("torch_xla.core.xla_model.REDUCE_"):
            key = qualname.rsplit(".", 1)[1]
            sc.consume(qualname)
            sc.file.removed_roots[cst_dotted(node).partition(".")[0]] += 1
        elif cst_dotted(node) and "ReduceOp." in cst_dotted(node):
            return code(node)  # already converted by TPU110
    op = REDUCE_OPS.get(key) if isinstance(key, str) else None
    return sc.file.plan.fill("{dist}.ReduceOp.") + op if op else None










def all_reduce_statement(call, qualname, sc: StatementContext, rule, plans, assign=None):
    bound = bind(call, ["reduce_type", "inputs", "scale", "groups", "pin_layout"])
    if bound is None or "reduce_type" not in bound or "inputs" not in bound or given(bound, "groups"):
        sc.needs_manual(rule.code, "cannot convert these arguments of xm.all_reduce (groups=?)", qualname)
        return None
    op = _reduce_op(bound["reduce_type"].value, sc)
    if op is None:
        sc.needs_manual(rule.code, "the reduce type is not an xm.REDUCE_* constant or a string", qualname)
        return None
    plan = sc.file.plan
    dist = plan.use("dist")
    inputs = bound["inputs"].value
    scale = atom(bound["scale"].value) if "scale" in bound else None
    if scale in ("1", "1.0"):
        scale = None
    target = target_name(assign)
    if target is not None:
        # A tensor: torch_xla returned a new tensor.
        lines = [f"{target} = {atom(inputs)}.clone()", f"if {dist}.is_initialized():",
                 f"    {dist}.all_reduce({target}, op={op})"]
        if scale:
            lines.append(f"    {target} = {target} * {scale}")
    elif assign is None:
        # A statement: only a list is meaningful (reduced in place).
        elements = inputs.elements if isinstance(inputs, (cst.List, cst.Tuple)) else None
        lines = [f"if {dist}.is_initialized():"]
        if elements is not None and all(isinstance(e, cst.Element) for e in elements):
            for element in elements:
                lines.append(f"    {dist}.all_reduce({code(element.value)}, op={op})")
                if scale:
                    lines.append(f"    {code(element.value)}.mul_({scale})")
        else:
            var = fresh_name(sc, "tensor")
            lines += [f"    for {var} in {code(inputs)}:", f"        {dist}.all_reduce({var}, op={op})"]
            if scale:
                lines.append(f"        {var}.mul_({scale})")
    else:
        sc.needs_manual(rule.code, "assign the result to a name to convert xm.all_reduce", qualname)
        return None
    sc.fixed(rule.code, qualname)
    return parse_block(lines)




def all_gather_statement(call, qualname, sc: StatementContext, rule, plans, assign=None):
    bound = bind(call, ["value", "dim", "groups", "output", "pin_layout"])
    target = target_name(assign)
    if (
        target is None or bound is None or "value" not in bound
        or given(bound, "groups") or given(bound, "output")
        or not isinstance(bound["value"].value, (cst.Name, cst.Attribute))
    ):
        sc.needs_manual(
            rule.code, "assign xm.all_gather(name, dim=...) to a name to convert it "
            "(dist.all_gather into a list, then torch.cat)", qualname,
        )
        return None
    plan = sc.file.plan
    dist, torch = plan.use("dist"), plan.use("torch")
    value = code(bound["value"].value)
    dim = code(bound["dim"].value) if "dim" in bound else "0"
    sc.fixed(rule.code, qualname)
    return parse_block([
        f"if {dist}.is_initialized():",
        f"    {target} = [{torch}.empty_like({value}) for _ in range({dist}.get_world_size())]",
        f"    {dist}.all_gather({target}, {value})",
        f"    {target} = {torch}.cat({target}, dim={dim})",
        "else:",
        f"    {target} = {value}",
    ])


def collective_broadcast_statement(call, qualname, sc: StatementContext, rule, plans):
    bound = bind(call, ["tensors", "root_ordinal", "groups", "pin_layout"])
    if bound is None or "tensors" not in bound or given(bound, "groups"):
        sc.needs_manual(rule.code, "cannot convert these arguments of xm.collective_broadcast", qualname)
        return None
    dist = sc.file.plan.use("dist")
    root = code(bound["root_ordinal"].value) if "root_ordinal" in bound else "0"
    tensors = bound["tensors"].value
    lines = [f"if {dist}.is_initialized():"]
    if isinstance(tensors, (cst.List, cst.Tuple)) and all(isinstance(e, cst.Element) for e in tensors.elements):
        lines += [f"    {dist}.broadcast({code(e.value)}, src={root})" for e in tensors.elements]
    else:
        var = fresh_name(sc, "tensor")
        lines += [f"    for {var} in {code(tensors)}:", f"        {dist}.broadcast({var}, src={root})"]
    sc.fixed(rule.code, qualname)
    return parse_block(lines)


def broadcast_master_param_statement(call, qualname, sc: StatementContext, rule, plans):
    bound = bind(call, ["model"])
    if bound is None or "model" not in bound:
        sc.needs_manual(rule.code, "cannot read the model argument", qualname)
        return None
    dist = sc.file.plan.use("dist")
    var = fresh_name(sc, "param")
    sc.fixed(rule.code, qualname)
    return parse_block([
        f"if {dist}.is_initialized():",
        f"    for {var} in {atom(bound['model'].value)}.parameters():",
        f"        {dist}.broadcast({var}.data, src=0)",
    ])


def rendezvous_statement(call, qualname, sc: StatementContext, rule, plans):
    bound = bind(call, ["tag", "payload", "replicas"])
    if bound is None or given(bound, "payload") or given(bound, "replicas"):
        sc.needs_manual(
            rule.code, "this rendezvous exchanges a payload: use dist.all_gather_object", qualname
        )
        return None
    dist = sc.file.plan.use("dist")
    sc.fixed(rule.code, qualname)
    return parse_block([f"if {dist}.is_initialized():", f"    {dist}.barrier()"])


def mesh_reduce_statement(call, qualname, sc: StatementContext, rule, plans, assign=None):
    bound = bind(call, ["tag", "data", "reduce_fn"])
    target = target_name(assign)
    if target is None or bound is None or "data" not in bound or "reduce_fn" not in bound:
        sc.needs_manual(rule.code, "assign xm.mesh_reduce(...) to a name to convert it", qualname)
        return None
    dist = sc.file.plan.use("dist")
    data = code(bound["data"].value)
    # `acc = xm.mesh_reduce("t", acc, fn)`: gathering into `acc` would overwrite the value sent.
    gathered = fresh_name(sc, "gathered") if m.findall(bound["data"].value, m.Name(target)) else target
    sc.fixed(rule.code, qualname)
    return parse_block([
        f"if {dist}.is_initialized():",
        f"    {gathered} = [None] * {dist}.get_world_size()",
        f"    {dist}.all_gather_object({gathered}, {data})",
        "else:",
        f"    {gathered} = [{data}]",
        f"{target} = {atom(bound['reduce_fn'].value)}({gathered})",
    ])


def reduce_gradients_statement(call, qualname, sc: StatementContext, rule, plans):
    bound = bind(call, ["optimizer", "groups", "pin_layout"])
    if bound is None or "optimizer" not in bound or given(bound, "groups"):
        sc.needs_manual(rule.code, "cannot convert these arguments of xm.reduce_gradients", qualname)
        return None
    dist = sc.file.plan.use("dist")
    var = fresh_name(sc, "param")
    optimizer = atom(bound["optimizer"].value)
    sc.fixed(rule.code, qualname)
    return parse_block([
        f"if {dist}.is_initialized() and {dist}.get_world_size() > 1:",
        f"    for {var} in (p for group in {optimizer}.param_groups for p in group[\"params\"]):",
        f"        if {var}.grad is not None:",
        f"            {dist}.all_reduce({var}.grad)",
        f"            {var}.grad /= {dist}.get_world_size()",
    ])


def reduce_op_constant(node, qualname, sc: StatementContext, rule):
    """`xm.REDUCE_SUM` used on its own (a name rule)."""
    op = REDUCE_OPS[qualname.rsplit(".", 1)[1]]
    sc.fixed(rule.code, qualname)
    return parse_expr(sc.file.plan.fill("{dist}.ReduceOp.") + op)
