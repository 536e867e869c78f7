"""The training step (rules/steps.toml): step markers, the optimizer step, saving and step closures."""

from __future__ import annotations

import ast
import keyword

import libcst as cst

from tpu_migrate.rewrite.context import StatementContext, parse_expr, parse_stmt
from tpu_migrate.rewrite.helper_code import CPU_COPIES
from tpu_migrate.rewrite.names import DDP_NAMES
from tpu_migrate.rewrite.transforms.fsdp import FSDP_NAMES
from tpu_migrate.rewrite.registry import CALL, STATEMENT, transform
from tpu_migrate.rewrite.transforms.common import (
    KEYWORD_EQUAL,
    atom,
    GLOBAL_MASTER,
    LOCAL_MASTER,
    helper,
    code,
    bind,
    literal_bool,
    clean_args,
    given,
    is_xla,
    parse_block,
)
from tpu_migrate.rewrite.transforms.amp_compile import FOUND_INF_TODO, passes_found_inf, uses_syncfree
from tpu_migrate.rewrite.transforms.collectives import average_gradients


@transform("remove_step_marker", form=CALL)
def remove_step_marker(call, qualname, sc: StatementContext, rule):
    """A step marker used as a value (not a statement): it returned None."""
    sc.fixed(rule.code, qualname)
    return cst.Name("None")


@transform("remove_step_marker", form=STATEMENT)
def remove_step_marker_statement(call, qualname, sc: StatementContext, rule, plans):
    sc.fixed(rule.code, qualname)
    return []


def _optimizer_step_parts(call, qualname, sc: StatementContext, rule):
    """(optimizer expression, `optimizer.step(...)` call), or None after a manual finding."""
    bound = bind(call, ["optimizer", "barrier", "optimizer_args", "groups", "pin_layout"])
    if bound is None or "optimizer" not in bound or given(bound, "groups"):
        sc.needs_manual(rule.code, "cannot read the optimizer argument (or groups= is given)", qualname)
        return None
    step_args = []
    if "optimizer_args" in bound:
        step_args = _keyword_args(bound["optimizer_args"].value)
    step = cst.Call(func=cst.Name("step"), args=step_args)
    if passes_found_inf(step) and uses_syncfree(sc):
        sc.needs_manual(rule.code, FOUND_INF_TODO, qualname)
        return None
    optimizer = bound["optimizer"].value
    if not isinstance(optimizer, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
        optimizer = optimizer.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return optimizer, cst.Call(func=cst.Attribute(value=optimizer, attr=cst.Name("step")), args=step_args)




def _keyword_args(value: cst.BaseExpression) -> list[cst.Arg]:
    """`optimizer_args={"closure": fn}` becomes `closure=fn`: a dict literal whose keys are
    distinct strings that are identifiers (not keywords); anything else is passed as `**value`."""
    if isinstance(value, cst.Dict) and not value.lpar:
        keys = []
        for element in value.elements:
            if not isinstance(element, cst.DictElement) or not isinstance(element.key, cst.SimpleString):
                break
            key = element.key.evaluated_value
            if not isinstance(key, str) or not key.isidentifier() or keyword.iskeyword(key) or key in keys:
                break
            keys.append(key)
        else:
            return clean_args([
                cst.Arg(element.value, keyword=cst.Name(key), equal=KEYWORD_EQUAL)
                for key, element in zip(keys, value.elements)
            ])
    return [cst.Arg(value, star="**")]


@transform("optimizer_step", form=CALL, emits=("TPU031",))
def optimizer_step(call, qualname, sc: StatementContext, rule):
    """`xm.optimizer_step(opt)` inside a larger expression: the all-reduce cannot go before
    it, so it is only converted where DDP already averages the gradients."""
    if not _ddp_on_every_path(sc):
        sc.needs_manual(
            "TPU031", "xm.optimizer_step all-reduced gradients across replicas; call it as a "
            "statement (or `x = xm.optimizer_step(...)`) so the all-reduce can be kept, or wrap "
            "the model in torch.nn.parallel.DistributedDataParallel", qualname,
        )
        return call
    parts = _optimizer_step_parts(call, qualname, sc, rule)
    if parts is None:
        return call
    sc.fixed(rule.code, qualname)
    return parts[1]


@transform("optimizer_step", form=STATEMENT, assign=True, emits=("TPU174",))
def optimizer_step_statement(call, qualname, sc: StatementContext, rule, plans, assign=None):
    """`xm.optimizer_step(opt)` averaged the gradients over the replicas, then stepped: keep
    both (DDP, where it wraps the model on every path, already averaged them)."""
    parts = _optimizer_step_parts(call, qualname, sc, rule)
    if parts is None:
        return None
    optimizer, step = parts
    where = sc.fixed(rule.code, qualname)
    stepped = cst.Expr(step) if assign is None else assign.with_changes(value=step)
    lines = [] if _ddp_on_every_path(sc) else average_gradients(atom(optimizer), sc, rule.code, where)
    if lines and sc.file.analysis.qualnames & FSDP_NAMES and sc.enabled("TPU174"):
        sc.needs_manual("TPU174", "this file wraps a model in FSDP, but not in this function: if this "
                        "optimizer steps an FSDP model, delete the gradient all-reduce (FSDP averages the "
                        "gradients itself, and c10d all_reduce refuses FSDP2's DTensor gradients)", where=where)
    return [*parse_block(lines), cst.SimpleStatementLine(body=[stepped])] if lines else [
        cst.SimpleStatementLine(body=[stepped])
    ]


def _ddp_on_every_path(sc: StatementContext) -> bool:
    """A DistributedDataParallel call, or torch_xla's FSDP (FSDP2 after TPU173), in the step's
    own function (or module), in its top-level body rather than in a branch: every path to the
    step wrapped the model, and the wrapper averages the gradients itself (under FSDP, an
    all-reduce of the sharded gradients would also add up different shards)."""
    scopes = sc.file.memo.get("wrapping_scopes")
    if scopes is None:
        scopes = sc.file.memo["wrapping_scopes"] = _wrapping_scopes(
            sc.file.analysis, sc.file.plans.sharded_parameter_loops)
    return id(sc.info.scope) in scopes


def _wrapping_scopes(analysis, sharding_loops) -> frozenset[int]:
    """The scopes (ids) with a DDP / FSDP wrapper statement in their top-level body (or a loop
    over the parameters that becomes FSDP2, TPU185)."""
    bodies = [analysis.tree.body] + [node.body for node in analysis.nodes
                                     if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    top_level = {id(stmt) for body in bodies for stmt in body}
    return frozenset(id(info.scope) for info in analysis.infos.values()
                     if id(info.node) in top_level and (
                         id(info.node) in sharding_loops
                         or any(ref.qualname in DDP_NAMES or ref.qualname in FSDP_NAMES for ref in info.refs)))


@transform("xla_save", form=STATEMENT)
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
    plan = sc.file.import_plan
    tree = f"{helper(sc, '_cpu_copies', CPU_COPIES)}({code(bound['data'].value)})"
    save = plan.fill("{torch}.save") + f"({tree}, {code(bound['file_or_path'].value)})"
    # torch_xla 2.x's xm.save has no closing rendezvous (1.x's had one): the ranks that do not
    # write go on at once, as before. A barrier here would hang where only some ranks save.
    if not master_only:
        return [parse_stmt(save + "\n")]
    condition = sc.fill(GLOBAL_MASTER if global_master else LOCAL_MASTER)
    guard = parse_stmt(f"if {condition}:\n    {save}\n")
    sc.file.mark(guard.body, "guard", condition)
    return [guard]


@transform("unwrap_step_context", on="with")
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


@transform("step_closure", form=CALL)
def step_closure(call, qualname, sc: StatementContext, rule):
    """`xm.add_step_closure(fn, args=(a, b))` -> `fn(a, b)`: TorchTPU has no step to defer to."""
    bound = bind(call, ["closure", "args", "run_async"])
    if bound is None or "closure" not in bound:
        sc.needs_manual(rule.code, "cannot read the arguments of xm.add_step_closure", qualname)
        return call
    closure = sc.resolve(bound["closure"].value)
    if closure is not None and is_xla(closure):
        # Calling it directly would write a new torch_xla call: both stay for a human.
        sc.needs_manual(rule.code, f"the closure `{code(bound['closure'].value)}` is torch_xla's own: "
                        "replace it, then call it directly", qualname)
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
