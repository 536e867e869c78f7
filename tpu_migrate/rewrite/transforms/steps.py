"""Step markers, ranks, printing, the optimizer step and saving (TPU010-TPU050)."""

from __future__ import annotations

import ast

import libcst as cst

from tpu_migrate.rewrite.context import StatementContext, parse_expr, parse_stmt
from tpu_migrate.rewrite.names import DDP_NAMES
from tpu_migrate.rewrite.transforms.common import (
    atom,
    GLOBAL_RANK,
    GLOBAL_MASTER,
    LOCAL_MASTER,
    TO_CPU,
    code,
    bind,
    literal_bool,
    clean_args,
    if_block,
)


def remove_step_marker(call, qualname, sc: StatementContext, rule):
    """A step marker used as a value (not a statement): it returned None."""
    sc.fixed(rule.code, qualname)
    return cst.Name("None")


def remove_step_marker_statement(call, qualname, sc: StatementContext, rule, plans):
    sc.fixed(rule.code, qualname)
    return []


def is_master_ordinal(call, qualname, sc: StatementContext, rule):
    bound = bind(call, ["local"])
    local = literal_bool(bound.get("local") if bound is not None else None, True)
    if bound is None or local is None:
        sc.needs_manual(
            rule.code, "`local=` is not a literal: choose LOCAL_RANK or the global rank", qualname
        )
        return call
    sc.fixed(rule.code, qualname)
    template = LOCAL_MASTER if local else GLOBAL_RANK + " == 0"
    return parse_expr(sc.file.plan.fill(template))


def _master_print_parts(call, qualname, sc: StatementContext, rule):
    """(condition, print call) or None after a manual finding."""
    args, local = [], False
    for arg in call.args:
        name = arg.keyword.value if arg.keyword is not None else None
        if name == "local":
            local = literal_bool(arg, False)
            if local is None:
                sc.needs_manual(rule.code, "`local=` is not a literal", qualname)
                return None
            continue
        if name == "fd":
            arg = arg.with_changes(keyword=cst.Name("file"))
        args.append(arg)
    sc.fixed(rule.code, qualname)
    condition = sc.file.plan.fill(LOCAL_MASTER if local else GLOBAL_MASTER)
    return condition, cst.Call(func=cst.Name("print"), args=clean_args(args))


def master_print(call, qualname, sc: StatementContext, rule):
    parts = _master_print_parts(call, qualname, sc, rule)
    if parts is None:
        return call
    condition, printed = parts
    return cst.IfExp(test=parse_expr(condition), body=printed, orelse=cst.Name("None"))


def master_print_statement(call, qualname, sc: StatementContext, rule, plans):
    parts = _master_print_parts(call, qualname, sc, rule)
    if parts is None:
        return None
    condition, printed = parts
    return [if_block(condition, [cst.SimpleStatementLine(body=[cst.Expr(printed)])])]






def optimizer_step(call, qualname, sc: StatementContext, rule):
    bound = bind(call, ["optimizer", "barrier", "optimizer_args", "groups", "pin_layout"])
    if bound is None or "optimizer" not in bound:
        sc.needs_manual(rule.code, "cannot read the optimizer argument", qualname)
        return call
    where = sc.fixed(rule.code, qualname)
    step_args = []
    if "optimizer_args" in bound:
        step_args = [cst.Arg(bound["optimizer_args"].value, star="**")]
    optimizer = bound["optimizer"].value
    if not isinstance(optimizer, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
        optimizer = optimizer.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    # Also when the file uses DDP elsewhere: xm.optimizer_step next to DDP is usually the path
    # without it (`if ddp: optimizer.step() else: xm.optimizer_step(optimizer)`), which would
    # now step each replica with its own gradients, silently.
    if sc.enabled("TPU031") and not _ddp_on_every_path(sc):
        sc.needs_manual(
            "TPU031",
            "xm.optimizer_step all-reduced gradients across replicas; "
            + ("make sure the model is wrapped in DistributedDataParallel on the path that reaches "
               "this step too, or that it runs as one process" if sc.file.analysis.has_ddp else
               "wrap the model in torch.nn.parallel.DistributedDataParallel or confirm this runs "
               "as one process"),
            where=where,
        )
    return cst.Call(func=cst.Attribute(value=optimizer, attr=cst.Name("step")), args=step_args)




def _ddp_on_every_path(sc: StatementContext) -> bool:
    """A DistributedDataParallel call in the step's own function (or module), in its top-level
    body rather than in a branch: every path to the step wrapped the model."""
    analysis = sc.file.analysis
    bodies = [analysis.tree.body] + [node.body for node in ast.walk(analysis.tree)
                                     if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for info in analysis.infos.values():
        if info.scope is sc.info.scope and any(ref.qualname in DDP_NAMES for ref in info.refs):
            if any(any(stmt is info.node for stmt in body) for body in bodies):
                return True
    return False


def xla_save_statement(call, qualname, sc: StatementContext, rule, plans):
    bound = bind(call, ["data", "file_or_path", "master_only", "global_master"])
    master_only = literal_bool(bound.get("master_only") if bound else None, True)
    global_master = literal_bool(bound.get("global_master") if bound else None, False)
    if bound is None or "data" not in bound or "file_or_path" not in bound or None in (
        master_only,
        global_master,
    ):
        sc.needs_manual(rule.code, "cannot read the arguments of xm.save", qualname)
        return None
    sc.fixed(rule.code, qualname)
    plan = sc.file.plan
    tree = plan.fill(TO_CPU, obj=code(bound["data"].value))
    save = plan.fill("{torch}.save") + f"({tree}, {code(bound['file_or_path'].value)})"
    if not master_only:
        return [parse_stmt(save + "\n")]
    condition = plan.fill(GLOBAL_RANK + " == 0" if global_master else LOCAL_MASTER)
    return [parse_stmt(f"if {condition}:\n    {save}\n")]




def unwrap_step_context(stmt: cst.With, sc: StatementContext):
    """Returns the body statements (unwrapped), or the `with` statement (maybe with fewer items)."""
    step_items = []
    for item in stmt.items:
        if isinstance(item.item, cst.Call) and sc.resolve(item.item.func) == "torch_xla.step":
            step_items.append(item)
    if not step_items:
        return stmt
    if not sc.enabled("TPU011"):
        for _ in step_items:
            sc.consume("torch_xla.step")
        return stmt
    sc.handled.update(id(item.item) for item in step_items)
    if any(item.asname is not None for item in step_items):
        sc.needs_manual("TPU011", "`with torch_xla.step() as ...` binds a value: unwrap it by hand", "torch_xla.step")
        return stmt
    for _ in step_items:
        sc.fixed("TPU011", "torch_xla.step")
    rest = [item for item in stmt.items if item not in step_items]
    if rest:
        rest[-1] = rest[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return stmt.with_changes(items=rest)
    body = stmt.body
    if isinstance(body, cst.SimpleStatementSuite):
        statements = [cst.SimpleStatementLine(body=body.body, trailing_whitespace=body.trailing_whitespace)]
        header_comment = []
    else:
        statements = list(body.body)
        header_comment = (
            [cst.EmptyLine(indent=True, comment=body.header.comment)] if body.header.comment else []
        )
    lead = [*stmt.leading_lines, *header_comment]
    if lead and statements:
        statements[0] = statements[0].with_changes(leading_lines=[*lead, *statements[0].leading_lines])
    return statements


def step_closure(call, qualname, sc: StatementContext, rule):
    """`xm.add_step_closure(fn, args=(a, b))` -> `fn(a, b)`: TorchTPU has no step to defer to."""
    bound = bind(call, ["closure", "args", "run_async"])
    if bound is None or "closure" not in bound:
        sc.needs_manual(rule.code, "cannot read the arguments of xm.add_step_closure", qualname)
        return call
    arguments = bound.get("args")
    if arguments is None:
        passed = ""
    elif isinstance(arguments.value, cst.Tuple) and all(
        isinstance(e, cst.Element) for e in arguments.value.elements
    ):
        passed = ", ".join(code(e.value) for e in arguments.value.elements)
    else:
        passed = "*" + atom(arguments.value)
    sc.fixed(rule.code, qualname)
    return parse_expr(f"{atom(bound['closure'].value)}({passed})")
