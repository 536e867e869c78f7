"""The rules that need code. Each function is named by a rule's `transform` in rules/*.toml.

Expression rules take the (already rewritten) call and return its replacement, or the call
unchanged after recording a manual finding. Statement rules take the call of an expression
statement and return the statements that replace it, or None to leave it alone.
"""

from __future__ import annotations

import ast
import re

import libcst as cst

from tpu_migrate.rewrite.context import StatementContext, cst_dotted, parse_expr, parse_stmt
from tpu_migrate.rewrite.plans import MP_DEVICE_LOADER, PARALLEL_LOADER

# Expressions that need parentheses when they land inside a larger expression.
LOOSE = (
    cst.IfExp,
    cst.BooleanOperation,
    cst.Comparison,
    cst.BinaryOperation,
    cst.UnaryOperation,
    cst.Lambda,
)

PORTABLE_DEVICE = '{torch}.accelerator.current_accelerator(check_available=True) or {torch}.device("cpu")'
GLOBAL_RANK = "({dist}.get_rank() if {dist}.is_initialized() else 0)"
GLOBAL_MASTER = "not {dist}.is_initialized() or {dist}.get_rank() == 0"
LOCAL_MASTER = 'int({os}.environ.get("LOCAL_RANK", 0)) == 0'
TO_CPU = "{torch}.utils._pytree.tree_map_only({torch}.Tensor, lambda t: t.cpu(), {obj})"
TO_DEVICE = "{torch}.utils._pytree.tree_map_only({torch}.Tensor, lambda t: t.to({device}), {obj})"

_XLA_DEVICE = re.compile(r"xla(:\d+)?\Z")
_CODEGEN = cst.Module(body=[])


def code(node: cst.CSTNode) -> str:
    return _CODEGEN.code_for_node(node)


# -- argument helpers -------------------------------------------------------------------------


def bind(call: cst.Call, params: list[str]) -> dict[str, cst.Arg] | None:
    """Map a call's arguments to parameter names; None if it uses *args/**kwargs."""
    bound: dict[str, cst.Arg] = {}
    for i, arg in enumerate(call.args):
        if arg.star:
            return None
        if arg.keyword is not None:
            bound[arg.keyword.value] = arg
        elif i < len(params):
            bound[params[i]] = arg
        else:
            return None
    return bound


def literal_bool(arg: cst.Arg | None, default: bool) -> bool | None:
    if arg is None:
        return default
    if isinstance(arg.value, cst.Name) and arg.value.value in ("True", "False"):
        return arg.value.value == "True"
    return None


def _clean_args(args: list[cst.Arg]) -> list[cst.Arg]:
    if not args:
        return args
    return [*args[:-1], args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)]


def _atom(node: cst.BaseExpression) -> str:
    text = code(node)
    if isinstance(node, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) or node.lpar:
        return text
    return f"({text})"


# -- device -----------------------------------------------------------------------------------


def is_xla_device_string(node: cst.BaseExpression) -> bool:
    if isinstance(node, cst.SimpleString):
        try:
            value = node.evaluated_value
        except Exception:  # noqa: BLE001 - odd escapes: not a device string
            return False
        return isinstance(value, str) and bool(_XLA_DEVICE.match(value))
    if isinstance(node, cst.FormattedString):
        parts = node.parts
        return (
            len(parts) >= 2
            and isinstance(parts[0], cst.FormattedStringText)
            and parts[0].value == "xla:"
            and all(isinstance(p, cst.FormattedStringExpression) for p in parts[1:])
        )
    return False


def _quote(node: cst.BaseExpression) -> str:
    text = code(node)
    return "'" if text.rstrip()[-1:] == "'" else '"'


def device_value(node: cst.BaseExpression, sc: StatementContext) -> cst.BaseExpression:
    """What an "xla" device string becomes."""
    if sc.file.target == "tpu":
        q = _quote(node)
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
    q = _quote(string)
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


# -- distributed ------------------------------------------------------------------------------


def init_process_group(call: cst.Call, sc: StatementContext):
    bound = bind(call, ["backend", "init_method"])
    if bound is None or "backend" not in bound:
        return call
    backend = bound["backend"]
    if not (isinstance(backend.value, cst.SimpleString) and backend.value.evaluated_value == "xla"):
        return call
    if not sc.enabled("TPU070"):
        return call
    sc.consume_string()
    sc.fixed("TPU070", "torch.distributed.init_process_group")
    method = bound.get("init_method")
    drop_method = (
        method is not None
        and isinstance(method.value, cst.SimpleString)
        and method.value.evaluated_value in ("xla://", "pjrt://")
    )
    kept = [a for a in call.args if not (a is method and drop_method)]
    args = []
    for i, arg in enumerate(kept):
        if arg is backend:
            if sc.file.target == "portable":
                later_positional = any(a.keyword is None for a in kept[i + 1 :])
                if not later_positional:
                    continue  # the default backend
                arg = arg.with_changes(value=cst.Name("None"))
            else:
                q = _quote(arg.value)
                arg = arg.with_changes(value=cst.SimpleString(f"{q}tpu_dist{q}"))
        args.append(arg)
    return call.with_changes(args=_clean_args(args))


# -- steps, ranks, printing -------------------------------------------------------------------


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
    return condition, cst.Call(func=cst.Name("print"), args=_clean_args(args))


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
    return [_if_block(condition, [cst.SimpleStatementLine(body=[cst.Expr(printed)])])]


def _if_block(condition: str, body: list[cst.BaseStatement]) -> cst.If:
    template = parse_stmt(f"if {condition}:\n    pass\n")
    return template.with_changes(body=template.body.with_changes(body=body))


# -- optimizer --------------------------------------------------------------------------------


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
    if not sc.file.analysis.has_ddp and sc.enabled("TPU031"):
        sc.needs_manual(
            "TPU031",
            "xm.optimizer_step all-reduced gradients across replicas; wrap the model in "
            "torch.nn.parallel.DistributedDataParallel or confirm this runs as one process",
            where=where,
        )
    return cst.Call(func=cst.Attribute(value=optimizer, attr=cst.Name("step")), args=step_args)


# -- saving -----------------------------------------------------------------------------------


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


# -- spawn ------------------------------------------------------------------------------------


def spawn_statement(call, qualname, sc: StatementContext, rule, plans):
    if id(sc.info.node) not in plans.spawn_workers:
        sc.needs_manual(
            rule.code,
            "launch with torch.multiprocessing.spawn (start method spawn) and call "
            "dist.init_process_group in the worker: the worker is not a function of this file "
            "or the call is too dynamic to convert",
            qualname,
        )
        return None
    launch = qualname == "torch_xla.launch"
    params = (
        ["fn", "args", "start_method", "debug_single_process"]
        if launch
        else ["fn", "args", "nprocs", "join", "daemon", "start_method"]
    )
    bound = bind(call, params) or {}
    plan = sc.file.plan
    nprocs = bound.get("nprocs")
    if launch and literal_bool(bound.get("debug_single_process"), False):
        count = "1"
    elif nprocs is None or (isinstance(nprocs.value, cst.Name) and nprocs.value.value == "None"):
        count = plan.fill(
            "{torch}.accelerator.device_count()"
            if sc.file.target == "tpu"
            else "max({torch}.accelerator.device_count(), 1)"
        )
    else:
        count = code(nprocs.value)
    sc.fixed(rule.code, qualname)
    fn = code(bound["fn"].value)
    args = f", args={code(bound['args'].value)}" if "args" in bound else ""
    os_name = plan.use("os")
    lines = [
        f'{os_name}.environ.setdefault("MASTER_ADDR", "127.0.0.1")',
        f'{os_name}.environ.setdefault("MASTER_PORT", "29500")',
        f'{os_name}.environ["WORLD_SIZE"] = str({count})',
    ]
    if sc.file.target == "tpu":
        lines.append(plan.fill("{torch}.tpu.distributed.set_tpu_launch_env") + f"(nproc_per_node={count})")
    lines.append(plan.fill("{torch}.multiprocessing.spawn") + f"({fn}{args}, nprocs={count})")
    return [parse_stmt(line + "\n") for line in lines]


def setup_worker(func: cst.FunctionDef, node: ast.FunctionDef, file) -> cst.FunctionDef:
    """Start a spawned worker with its rank and the process group."""
    params = [*func.params.posonly_params, *func.params.params]
    index = params[0].name.value
    plan = file.plan
    os_name = plan.use("os")
    lines = [f'{os_name}.environ["RANK"] = {os_name}.environ["LOCAL_RANK"] = str({index})']
    if not _calls_init_process_group(node):
        backend = '"tpu_dist"' if file.target == "tpu" else ""
        lines.append(plan.fill("{dist}.init_process_group") + f"({backend})")
    return insert_at_body_start(func, [parse_stmt(line + "\n") for line in lines])


def _calls_init_process_group(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            func = sub.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name == "init_process_group":
                return True
    return False


def insert_at_body_start(stmt, new: list[cst.BaseStatement]):
    body = stmt.body
    if isinstance(body, cst.SimpleStatementSuite):
        body = cst.IndentedBlock(
            body=[cst.SimpleStatementLine(body=body.body, trailing_whitespace=body.trailing_whitespace)]
        )
    statements = list(body.body)
    index = 0
    if isinstance(stmt, cst.FunctionDef) and statements:
        first = statements[0]
        if (
            isinstance(first, cst.SimpleStatementLine)
            and isinstance(first.body[0], cst.Expr)
            and isinstance(first.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
        ):
            index = 1
    return stmt.with_changes(body=body.with_changes(body=[*statements[:index], *new, *statements[index:]]))


# -- step context -----------------------------------------------------------------------------


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


# -- device loaders ---------------------------------------------------------------------------


def _loader_parts(expr: cst.BaseExpression, sc: StatementContext):
    """(cpu loader, device, qualnames consumed) for a device-loader expression, else None."""
    if not isinstance(expr, cst.Call):
        return None
    qualname = sc.resolve(expr.func)
    if qualname == MP_DEVICE_LOADER:
        bound = bind(expr, ["loader", "device"])
        if bound is None or "loader" not in bound or "device" not in bound:
            return None
        if set(bound) - {"loader", "device", "loader_prefetch_size", "device_prefetch_size",
                         "host_to_device_transfer_threads"}:
            return None
        return bound["loader"].value, bound["device"].value, [qualname]
    if (
        isinstance(expr.func, cst.Attribute)
        and expr.func.attr.value == "per_device_loader"
        and isinstance(expr.func.value, cst.Call)
        and sc.resolve(expr.func.value.func) == PARALLEL_LOADER
        and len(expr.args) == 1
    ):
        inner = bind(expr.func.value, ["loader", "devices"])
        if inner is None or "loader" not in inner:
            return None
        return inner["loader"].value, expr.args[0].value, [PARALLEL_LOADER]
    return None


def _movable_device(device: cst.BaseExpression, sc: StatementContext) -> bool:
    """A device expression that may be repeated in each move: a name or a device constructor."""
    if isinstance(device, (cst.Name, cst.Attribute, cst.SimpleString)):
        return True
    if isinstance(device, cst.BooleanOperation):  # the portable device expression
        return "current_accelerator" in code(device)
    if isinstance(device, cst.Call):
        qualname = sc.resolve(device.func)
        rule = sc.file.catalog.lookup(qualname)
        if rule is not None and rule.code == "TPU001":
            return True
        torch = sc.file.plan.names["torch"]
        return qualname == "torch.device" or cst_dotted(device.func) == f"{torch}.device"
    return False


def _move_target_ok(target: cst.BaseExpression) -> bool:
    if isinstance(target, cst.Name):
        return True
    return isinstance(target, (cst.Tuple, cst.List)) and bool(target.elements) and all(
        isinstance(e, cst.Element) and isinstance(e.value, cst.Name) for e in target.elements
    )


def _move_statement(target: cst.BaseExpression, device: cst.BaseExpression, sc) -> cst.BaseStatement:
    plan = sc.file.plan
    dev = code(device)
    if isinstance(target, cst.Name):
        moved = plan.fill(TO_DEVICE, device=dev, obj=target.value)
        return parse_stmt(f"{target.value} = {moved}\n")
    names = [e.value.value for e in target.elements]
    lhs = ", ".join(names)
    rhs = ", ".join(f"{n}.to({dev})" for n in names)
    return parse_stmt(f"{lhs} = {rhs}\n")


def device_loader_loop(stmt: cst.For, sc: StatementContext, plans, expr_rewriter):
    """`for b in MpDeviceLoader(loader, d):` -> `for b in loader:` + a move. Returns (for, prefix)."""
    if not sc.fix_allowed("TPU040"):
        return stmt, []  # the header's device loader is then reported by the expression rules
    iterable, target = stmt.iter, stmt.target
    wrapped = None
    if (
        isinstance(iterable, cst.Call)
        and isinstance(iterable.func, cst.Name)
        and iterable.func.value == "enumerate"
        and iterable.args
        and iterable.args[0].keyword is None
    ):
        wrapped = iterable
        iterable = iterable.args[0].value
        if not (isinstance(target, cst.Tuple) and len(target.elements) == 2):
            return stmt, []
        target = target.elements[1].value
    parts = _loader_parts(iterable, sc)
    consumed = []
    if parts is not None:
        loader, device, consumed = parts
    elif isinstance(iterable, cst.Name) and (id(sc.scope), iterable.value) in plans.loader_vars:
        device = sc.file.loader_vars.get((id(sc.scope), iterable.value))
        if device is None:
            sc.needs_manual(
                "TPU040",
                f"move the batches of `{iterable.value}` to the device: the loader is "
                "assigned after this loop",
                where=(sc.info.node.lineno, sc.info.node.col_offset + 1),
            )
            return stmt, []
        loader = iterable
    else:
        return stmt, []
    if not _move_target_ok(target):
        return stmt, []  # left for the expression rules: reported as manual
    if consumed:
        # The device argument leaves the header: rewrite `xm.xla_device()` in it here.
        device = expr_rewriter.rewrite(device)
        if not _movable_device(device, sc):
            return stmt, []
    move = _move_statement(target, device, sc)
    for qualname in consumed:
        sc.fixed("TPU040", qualname)
    if not consumed:
        sc.fixed("TPU040", where=(sc.info.node.lineno, sc.info.node.col_offset + 1))
    new_iter = loader
    if wrapped is not None:
        new_iter = wrapped.with_changes(args=[wrapped.args[0].with_changes(value=loader), *wrapped.args[1:]])
    return stmt.with_changes(iter=new_iter), [move]


def device_loader(call, qualname, sc: StatementContext, rule):
    """A device loader outside a `for` header: fine only when assigned to a loop-only variable."""
    node = sc.info.node
    plans = sc.file.plans
    if (
        qualname == MP_DEVICE_LOADER
        and isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and (id(sc.scope), node.targets[0].id) in plans.loader_vars
    ):
        parts = _loader_parts(call, sc)
        if parts is not None:
            loader, device, _ = parts
            if _movable_device(device, sc):
                sc.file.loader_vars[(id(sc.scope), node.targets[0].id)] = device
                sc.fixed(rule.code, qualname)
                return loader
    sc.needs_manual(
        rule.code,
        "replace the device loader with the plain DataLoader and move each batch with "
        ".to(device) in the loop; without the move the batches stay on the CPU",
        qualname,
    )
    return call


# -- collectives ------------------------------------------------------------------------------

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


def _guarded(body: list[str]) -> str:
    return "\n".join("    " + line for line in body)


def _parse_block(lines: list[str]) -> list[cst.BaseStatement]:
    module = cst.parse_module("\n".join(lines) + "\n")
    return list(module.body)


def _target_name(assign: cst.Assign | None) -> str | None:
    if assign is None or len(assign.targets) != 1:
        return None
    target = assign.targets[0].target
    return target.value if isinstance(target, cst.Name) else None


def _fresh_name(sc: StatementContext, base: str) -> str:
    bound = sc.file.analysis.bound_names
    name, n = base, 1
    while name in bound:
        n += 1
        name = f"{base}{n}"
    return name


def all_reduce_statement(call, qualname, sc: StatementContext, rule, plans, assign=None):
    bound = bind(call, ["reduce_type", "inputs", "scale", "groups", "pin_layout"])
    if bound is None or "reduce_type" not in bound or "inputs" not in bound or _given(bound, "groups"):
        sc.needs_manual(rule.code, "cannot convert these arguments of xm.all_reduce (groups=?)", qualname)
        return None
    op = _reduce_op(bound["reduce_type"].value, sc)
    if op is None:
        sc.needs_manual(rule.code, "the reduce type is not an xm.REDUCE_* constant or a string", qualname)
        return None
    plan = sc.file.plan
    dist = plan.use("dist")
    inputs = bound["inputs"].value
    scale = _atom(bound["scale"].value) if "scale" in bound else None
    if scale in ("1", "1.0"):
        scale = None
    target = _target_name(assign)
    if target is not None:
        # A tensor: torch_xla returned a new tensor.
        lines = [f"{target} = {_atom(inputs)}.clone()", f"if {dist}.is_initialized():",
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
            var = _fresh_name(sc, "tensor")
            lines += [f"    for {var} in {code(inputs)}:", f"        {dist}.all_reduce({var}, op={op})"]
            if scale:
                lines.append(f"        {var}.mul_({scale})")
    else:
        sc.needs_manual(rule.code, "assign the result to a name to convert xm.all_reduce", qualname)
        return None
    sc.fixed(rule.code, qualname)
    return _parse_block(lines)


def _given(bound: dict, name: str) -> bool:
    arg = bound.get(name)
    return arg is not None and not (isinstance(arg.value, cst.Name) and arg.value.value == "None")


def all_gather_statement(call, qualname, sc: StatementContext, rule, plans, assign=None):
    bound = bind(call, ["value", "dim", "groups", "output", "pin_layout"])
    target = _target_name(assign)
    if (
        target is None or bound is None or "value" not in bound
        or _given(bound, "groups") or _given(bound, "output")
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
    return _parse_block([
        f"if {dist}.is_initialized():",
        f"    {target} = [{torch}.empty_like({value}) for _ in range({dist}.get_world_size())]",
        f"    {dist}.all_gather({target}, {value})",
        f"    {target} = {torch}.cat({target}, dim={dim})",
        "else:",
        f"    {target} = {value}",
    ])


def collective_broadcast_statement(call, qualname, sc: StatementContext, rule, plans):
    bound = bind(call, ["tensors", "root_ordinal", "groups", "pin_layout"])
    if bound is None or "tensors" not in bound or _given(bound, "groups"):
        sc.needs_manual(rule.code, "cannot convert these arguments of xm.collective_broadcast", qualname)
        return None
    dist = sc.file.plan.use("dist")
    root = code(bound["root_ordinal"].value) if "root_ordinal" in bound else "0"
    tensors = bound["tensors"].value
    lines = [f"if {dist}.is_initialized():"]
    if isinstance(tensors, (cst.List, cst.Tuple)) and all(isinstance(e, cst.Element) for e in tensors.elements):
        lines += [f"    {dist}.broadcast({code(e.value)}, src={root})" for e in tensors.elements]
    else:
        var = _fresh_name(sc, "tensor")
        lines += [f"    for {var} in {code(tensors)}:", f"        {dist}.broadcast({var}, src={root})"]
    sc.fixed(rule.code, qualname)
    return _parse_block(lines)


def broadcast_master_param_statement(call, qualname, sc: StatementContext, rule, plans):
    bound = bind(call, ["model"])
    if bound is None or "model" not in bound:
        sc.needs_manual(rule.code, "cannot read the model argument", qualname)
        return None
    dist = sc.file.plan.use("dist")
    var = _fresh_name(sc, "param")
    sc.fixed(rule.code, qualname)
    return _parse_block([
        f"if {dist}.is_initialized():",
        f"    for {var} in {_atom(bound['model'].value)}.parameters():",
        f"        {dist}.broadcast({var}.data, src=0)",
    ])


def rendezvous_statement(call, qualname, sc: StatementContext, rule, plans):
    bound = bind(call, ["tag", "payload", "replicas"])
    if bound is None or _given(bound, "payload") or _given(bound, "replicas"):
        sc.needs_manual(
            rule.code, "this rendezvous exchanges a payload: use dist.all_gather_object", qualname
        )
        return None
    dist = sc.file.plan.use("dist")
    sc.fixed(rule.code, qualname)
    return _parse_block([f"if {dist}.is_initialized():", f"    {dist}.barrier()"])


def mesh_reduce_statement(call, qualname, sc: StatementContext, rule, plans, assign=None):
    bound = bind(call, ["tag", "data", "reduce_fn"])
    target = _target_name(assign)
    if target is None or bound is None or "data" not in bound or "reduce_fn" not in bound:
        sc.needs_manual(rule.code, "assign xm.mesh_reduce(...) to a name to convert it", qualname)
        return None
    dist = sc.file.plan.use("dist")
    data = code(bound["data"].value)
    sc.fixed(rule.code, qualname)
    return _parse_block([
        f"if {dist}.is_initialized():",
        f"    {target} = [None] * {dist}.get_world_size()",
        f"    {dist}.all_gather_object({target}, {data})",
        "else:",
        f"    {target} = [{data}]",
        f"{target} = {_atom(bound['reduce_fn'].value)}({target})",
    ])


def reduce_gradients_statement(call, qualname, sc: StatementContext, rule, plans):
    bound = bind(call, ["optimizer", "groups", "pin_layout"])
    if bound is None or "optimizer" not in bound or _given(bound, "groups"):
        sc.needs_manual(rule.code, "cannot convert these arguments of xm.reduce_gradients", qualname)
        return None
    dist = sc.file.plan.use("dist")
    var = _fresh_name(sc, "param")
    optimizer = _atom(bound["optimizer"].value)
    sc.fixed(rule.code, qualname)
    return _parse_block([
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


# -- AMP, compile -------------------------------------------------------------------------------


def xla_autocast(call, qualname, sc: StatementContext, rule):
    bound = bind(call, ["device", "enabled", "dtype", "cache_enabled"])
    if bound is None:
        sc.needs_manual(rule.code, "cannot read the arguments of torch_xla.amp.autocast", qualname)
        return call
    plan = sc.file.plan
    torch = plan.use("torch")
    device_type = '"tpu"' if sc.file.target == "tpu" else "(" + plan.fill(PORTABLE_DEVICE) + ").type"
    kwargs = [f"dtype={code(bound['dtype'].value) if 'dtype' in bound else torch + '.bfloat16'}"]
    for name in ("enabled", "cache_enabled"):
        if name in bound:
            kwargs.append(f"{name}={code(bound[name].value)}")
    sc.fixed(rule.code, qualname)
    return parse_expr(f"{torch}.autocast({device_type}, {', '.join(kwargs)})")


def torch_compile(call: cst.Call, sc: StatementContext):
    """torch.compile in a torch_xla file: the backend, and what TorchTPU rejects."""
    if not any(is_xla(b.qualname) for b in sc.file.analysis.imports):
        return call
    if not sc.enabled("TPU130"):
        return call
    tpu = sc.file.target == "tpu"
    args, changed = [], False
    for arg in call.args:
        name = arg.keyword.value if arg.keyword is not None else None
        value = arg.value
        if name == "backend" and isinstance(value, cst.SimpleString):
            backend = value.evaluated_value
            if backend in ("openxla", "openxla_eval"):
                changed = True
                if not tpu:
                    continue
                arg = arg.with_changes(value=cst.SimpleString(f'{_quote(value)}tpu{_quote(value)}'))
            elif backend == "inductor" and tpu:
                sc.needs_manual("TPU130", 'TorchTPU rejects backend="inductor" for TPU tensors: use backend="tpu"',
                                where=sc.consume("torch.compile"))
        elif tpu and name == "mode":
            changed = True
            continue
        elif tpu and name == "dynamic" and isinstance(value, cst.Name) and value.value == "True":
            changed = True
            continue
        args.append(arg)
    if not changed:
        return call
    sc.fixed("TPU130", "torch.compile")
    return call.with_changes(args=_clean_args(args))


def is_xla(qualname: str) -> bool:
    from tpu_migrate.rewrite.names import is_xla_name

    return is_xla_name(qualname)


def xla_compile(call, qualname, sc: StatementContext, rule):
    bound = bind(call, ["f", "full_graph", "name", "max_different_graphs"])
    if bound is None or "f" not in bound:
        sc.needs_manual(rule.code, "torch_xla.compile() without a function (a context manager): "
                        "wrap the step function in torch.compile instead", qualname)
        return call
    torch = sc.file.plan.use("torch")
    parts = [code(bound["f"].value)]
    if sc.file.target == "tpu":
        parts.append('backend="tpu"')
    if "full_graph" in bound:
        parts.append(f"fullgraph={code(bound['full_graph'].value)}")
    sc.fixed(rule.code, qualname)
    return parse_expr(f"{torch}.compile({', '.join(parts)})")


def xla_compile_reference(node, qualname, sc: StatementContext, rule):
    """`@torch_xla.compile` used bare (a decorator)."""
    sc.fixed(rule.code, qualname)
    return parse_expr(sc.file.plan.fill("{torch}.compile"))


def eager_mode_statement(call, qualname, sc: StatementContext, rule, plans):
    bound = bind(call, ["enable"])
    if bound is None or literal_bool(bound.get("enable"), False) is not True:
        sc.needs_manual(rule.code, "lazy mode has no TorchTPU switch: see torch.tpu.EagerMode or torch.compile", qualname)
        return None
    sc.fixed(rule.code, qualname)
    return []


# -- environment, precision, memory ----------------------------------------------------------------

PRECISIONS = {"default": "medium", "high": "high", "highest": "highest"}


def matmul_precision(call, qualname, sc: StatementContext, rule):
    bound = bind(call, ["precision"])
    value = bound.get("precision") if bound else None
    if value is None or not isinstance(value.value, cst.SimpleString) or value.value.evaluated_value not in PRECISIONS:
        sc.needs_manual(rule.code, "map the precision by hand: default->medium, high->high, highest->highest", qualname)
        return call
    sc.fixed(rule.code, qualname)
    precision = PRECISIONS[value.value.evaluated_value]
    return parse_expr(sc.file.plan.fill("{torch}.set_float32_matmul_precision") + f'("{precision}")')


def memory_info(call, qualname, sc: StatementContext, rule):
    if sc.file.target != "tpu":
        sc.needs_manual(rule.code, "device memory statistics have no CPU equivalent", qualname)
        return call
    acc = sc.file.plan.use("torch") + ".accelerator"
    sc.fixed(rule.code, qualname)
    return parse_expr(
        "{"
        f'"bytes_used": {acc}.memory_allocated(), '
        f'"bytes_limit": {acc}.get_memory_info()[1], '
        f'"peak_bytes_used": {acc}.max_memory_allocated(), '
        f'"kb_free": {acc}.get_memory_info()[0] // 1024, '
        f'"kb_total": {acc}.get_memory_info()[1] // 1024'
        "}"
    )


def _environ_key(node: cst.BaseExpression, sc: StatementContext) -> str | None:
    """The variable name in `os.environ[NAME]`, `os.environ.get(NAME)`, `os.getenv(NAME)`."""
    from tpu_migrate.rewrite.names import ENV_NAMES

    def key_of(expr):
        if isinstance(expr, cst.SimpleString):
            value = expr.evaluated_value
            return value if value in ENV_NAMES else None
        return None

    if isinstance(node, cst.Subscript) and sc.resolve(node.value) == "os.environ" and len(node.slice) == 1:
        return key_of(node.slice[0].slice.value) if isinstance(node.slice[0].slice, cst.Index) else None
    if isinstance(node, cst.Call) and node.args:
        qualname = sc.resolve(node.func)
        if qualname in ("os.environ.get", "os.environ.setdefault", "os.getenv", "os.putenv", "os.environ.pop"):
            return key_of(node.args[0].value)
    return None


def environment_statement(small: cst.BaseSmallStatement, sc: StatementContext):
    """Setting torch_xla's runtime variables: removed. Returns [] to remove, else None."""
    from tpu_migrate.rewrite.names import RUNTIME_ENV

    key = None
    if isinstance(small, cst.Assign) and len(small.targets) == 1:
        key = _environ_key(small.targets[0].target, sc)
    elif isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
        func = sc.resolve(small.value.func)
        if func in ("os.environ.setdefault", "os.putenv", "os.environ.pop"):
            key = _environ_key(small.value, sc)
    elif isinstance(small, cst.Del) and isinstance(small.target, cst.Subscript):
        key = _environ_key(small.target, sc)
    if key not in RUNTIME_ENV or not sc.enabled("TPU140"):
        return None
    sc.fixed("TPU140", where=(sc.info.node.lineno, sc.info.node.col_offset + 1))
    return []


def environment_reads(node: cst.BaseExpression, sc: StatementContext) -> None:
    """Reading torch_xla's variables: a manual finding (called on subscripts and calls)."""
    from tpu_migrate.rewrite.names import BF16_ENV

    key = _environ_key(node, sc)
    if key is None:
        return
    code_ = "TPU141" if key in BF16_ENV else "TPU140"
    if not sc.enabled(code_) or any(t.code == code_ for t in sc.todos):
        return
    where = (sc.info.node.lineno, sc.info.node.col_offset + 1)
    if code_ == "TPU141":
        sc.needs_manual(code_, f"{key} has no TorchTPU equivalent: convert the model with "
                        ".to(torch.bfloat16) or use torch.autocast", where=where)
    else:
        sc.needs_manual(code_, f"{key} is not set under TorchTPU: test "
                        "torch.accelerator.current_accelerator() instead", where=where)


# -- Optimum, dict configs, guards -----------------------------------------------------------------


def optimum_auto_model(call, qualname, sc: StatementContext, rule):
    """`AutoModelForCausalLM.from_pretrained(...)` from optimum.tpu (called from leave_Call)."""
    plan = sc.file.plan
    args = [a for a in call.args if not (a.keyword and a.keyword.value in ("task", "batch_size", "sequence_length"))]
    device = '"tpu"' if sc.file.target == "tpu" else plan.fill(PORTABLE_DEVICE)
    sc.fixed(rule.code, qualname)
    loaded = cst.Call(
        func=parse_expr(plan.fill("{transformers}.AutoModelForCausalLM.from_pretrained")),
        args=_clean_args(args),
    )
    return parse_expr(f"{code(loaded)}.to({device}).eval()")


FSDP_XLA_KEYS = frozenset({"xla_fsdp_v2", "xla_fsdp_grad_ckpt", "xla_fsdp_settings"})


def fsdp_config_dict(node: cst.Dict, sc: StatementContext):
    keys = {
        e.key.evaluated_value for e in node.elements
        if isinstance(e, cst.DictElement) and isinstance(e.key, cst.SimpleString)
    }
    looks_like_fsdp = bool(keys & FSDP_XLA_KEYS) or (
        "xla" in keys and any("fsdp" in str(k) or "layer_cls" in str(k) for k in keys)
    )
    if looks_like_fsdp and sc.enabled("TPU182") and not any(t.code == "TPU182" for t in sc.todos):
        sc.needs_manual("TPU182", "remove the xla / xla_fsdp_v2 / xla_fsdp_grad_ckpt keys; "
                        "FSDP through transformers on TorchTPU is unverified",
                        where=sc.consume_string())
    return node


def tpu_available(sc: StatementContext) -> str:
    if sc.file.target == "tpu":
        return sc.file.plan.fill(
            '{torch}.accelerator.is_available() and {torch}.accelerator.current_accelerator().type == "tpu"'
        )
    return sc.file.plan.fill("{torch}.accelerator.is_available()")


def guards_allowed(sc: StatementContext, qualname: str | None) -> bool:
    """TPU190 applies in this pass; when not, the guard is kept as it is, with a TODO."""
    if not sc.enabled("TPU190"):
        sc.consume(qualname)
        return False
    if sc.file.convert_guards:
        sc.file.guards_converted = True
        return True
    sc.needs_manual(
        "TPU190", "guard kept: this file still needs torch_xla (see the other TODOs); run "
        "tpu-migrate again once they are ported to turn it into a TPU check", qualname,
    )
    return False


def availability_guard(call, qualname, sc: StatementContext, rule):
    if not guards_allowed(sc, qualname):
        return call
    sc.fixed(rule.code, qualname)
    return parse_expr(tpu_available(sc))


def find_spec_guard(call: cst.Call, sc: StatementContext):
    """`importlib.util.find_spec("torch_xla")` (compared with None by the caller's code)."""
    if (
        len(call.args) == 1
        and isinstance(call.args[0].value, cst.SimpleString)
        and call.args[0].value.evaluated_value.split(".")[0] == "torch_xla"
        and guards_allowed(sc, None)
    ):
        sc.consume_string()
        sc.fixed("TPU190", "importlib.util.find_spec")
        # find_spec returned a spec or None; keep that shape for `is None` tests.
        return parse_expr(f"(True if {tpu_available(sc)} else None)")
    return call


def find_spec_test(original: cst.Comparison, sc: StatementContext):
    """`find_spec("torch_xla") is not None`: the whole test becomes the TPU test. The call
    itself was already rewritten (and reported) by find_spec_guard."""
    if len(original.comparisons) != 1:
        return None
    target = original.comparisons[0]
    left = original.left
    if not (
        isinstance(target.operator, (cst.Is, cst.IsNot))
        and isinstance(target.comparator, cst.Name) and target.comparator.value == "None"
        and isinstance(left, cst.Call) and sc.resolve(left.func) == "importlib.util.find_spec"
        and left.args and isinstance(left.args[0].value, cst.SimpleString)
        and left.args[0].value.evaluated_value.split(".")[0] == "torch_xla"
        and sc.file.convert_guards and sc.enabled("TPU190")
    ):
        return None
    available = tpu_available(sc)
    return parse_expr(f"not ({available})" if isinstance(target.operator, cst.Is) else available)


def optional_import_test(cmp: cst.Comparison, sc: StatementContext):
    """`xm is None` / `xm is not None` for an optional torch_xla import."""
    if len(cmp.comparisons) != 1 or not isinstance(cmp.comparisons[0].operator, (cst.Is, cst.IsNot)):
        return cmp
    other = cmp.comparisons[0].comparator
    if not (isinstance(other, cst.Name) and other.value == "None"):
        return cmp
    qualname = sc.resolve(cmp.left) if isinstance(cmp.left, cst.Name) else None
    if not qualname or not is_xla(qualname) or not guards_allowed(sc, qualname):
        return cmp
    sc.fixed("TPU190", qualname)
    available = tpu_available(sc)
    negate = isinstance(cmp.comparisons[0].operator, cst.Is)
    return parse_expr(f"not ({available})" if negate else available)


# -- dispatch ---------------------------------------------------------------------------------

CALL = {
    "xla_autocast": xla_autocast,
    "xla_compile": xla_compile,
    "matmul_precision": matmul_precision,
    "memory_info": memory_info,
    "availability_guard": availability_guard,
    "device_call": device_call,
    "remove_step_marker": remove_step_marker,
    "is_master_ordinal": is_master_ordinal,
    "master_print": master_print,
    "optimizer_step": optimizer_step,
    "device_loader": device_loader,
}

STATEMENT = {
    "all_reduce": all_reduce_statement,
    "all_gather": all_gather_statement,
    "collective_broadcast": collective_broadcast_statement,
    "broadcast_master_param": broadcast_master_param_statement,
    "rendezvous": rendezvous_statement,
    "mesh_reduce": mesh_reduce_statement,
    "reduce_gradients": reduce_gradients_statement,
    "eager_mode": eager_mode_statement,
    "remove_step_marker": remove_step_marker_statement,
    "master_print": master_print_statement,
    "xla_save": xla_save_statement,
    "spawn": spawn_statement,
}

# Statement rules that also convert `name = call(...)` (they take the Assign).
ASSIGN = frozenset({"all_reduce", "all_gather", "mesh_reduce"})

# Rules applied to a bare reference (not a call): `xm.REDUCE_SUM`, `@torch_xla.compile`.
REFERENCE = {
    "reduce_op_constant": reduce_op_constant,
    "xla_compile": xla_compile_reference,
}

QUALNAME_CALLS = {
    "torch.compile": torch_compile,
    "importlib.util.find_spec": find_spec_guard,
    "torch.device": torch_device_ctor,
    "torch.distributed.init_process_group": init_process_group,
    "torch.autocast": autocast,
}


def template_values(rule, call: cst.Call | None, sc: StatementContext, qualname: str) -> dict | None:
    values = {"name": qualname.rsplit(".", 1)[1]}
    if call is not None and rule.params:
        bound = bind(call, list(rule.params))
        if bound is None:
            return None
        values.update(rule.defaults)
        for key, arg in bound.items():
            values[key] = code(arg.value)
            values[f"{key}_atom"] = _atom(arg.value)  # for callees and attribute bases
        for key, default in rule.defaults.items():
            values.setdefault(f"{key}_atom", default)
    return values


def apply_call_rule(rule, qualname: str, call: cst.Call, sc: StatementContext):
    if rule.replace:
        values = template_values(rule, call, sc, qualname)
        try:
            if values is None:
                raise KeyError
            expression = sc.file.plan.fill(rule.replace[sc.file.target], **values)
        except KeyError:
            sc.needs_manual(rule.code, f"cannot read the arguments: {rule.summary}", qualname)
            return call
        sc.fixed(rule.code, qualname)
        return parse_expr(expression)
    transform = CALL.get(rule.transform or "")
    if transform is not None:
        return transform(call, qualname, sc, rule)
    if rule.safety == "manual":
        sc.needs_manual(rule.code, rule.summary, qualname)
        return call
    # A statement-only rule used as a value.
    sc.needs_manual(rule.code, f"{rule.summary} (used as a value here: convert by hand)", qualname)
    return call


def apply_reference_rule(rule, qualname: str, node: cst.BaseExpression, sc: StatementContext):
    """A rule met as a bare reference (not called): rename it, or report it if manual."""
    if rule.rename:
        sc.fixed(rule.code, qualname)
        return parse_expr(sc.file.plan.fill(rule.rename[sc.file.target], name=qualname.rsplit(".", 1)[1]))
    transform = REFERENCE.get(rule.transform or "")
    if transform is not None:
        return transform(node, qualname, sc, rule)
    if rule.safety == "manual":
        sc.needs_manual(rule.code, rule.summary, qualname)
    return node


def statement_rule(call: cst.Call, sc: StatementContext, assign: bool = False):
    qualname = sc.resolve(call.func)
    rule = sc.file.catalog.lookup(qualname)
    if rule is None or rule.transform not in STATEMENT:
        return None
    if assign and rule.transform not in ASSIGN:
        return None
    if not sc.may_fix(rule, qualname):
        return None
    return rule, qualname


def apply_statement_rule(rule, qualname, call, sc: StatementContext, plans, assign=None):
    if assign is not None:
        return STATEMENT[rule.transform](call, qualname, sc, rule, plans, assign=assign)
    return STATEMENT[rule.transform](call, qualname, sc, rule, plans)


__all__ = ["cst_dotted"]
