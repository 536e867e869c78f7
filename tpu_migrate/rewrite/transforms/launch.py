"""Process launch and the process group: `xmp.spawn`, `torch_xla.launch`, `init_process_group("xla")` (TPU060, TPU070)."""

from __future__ import annotations

import ast

import libcst as cst

from tpu_migrate.rewrite.context import StatementContext, parse_stmt
from tpu_migrate.rewrite.transforms.common import (
    code,
    bind,
    literal_bool,
    clean_args,
    quote_of,
)


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
                q = quote_of(arg.value)
                arg = arg.with_changes(value=cst.SimpleString(f"{q}tpu_dist{q}"))
        args.append(arg)
    return call.with_changes(args=clean_args(args))




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
    every_device = plan.fill(
        "{torch}.accelerator.device_count()"
        if sc.file.target == "tpu"
        else "max({torch}.accelerator.device_count(), 1)"
    )
    if launch and literal_bool(bound.get("debug_single_process"), False):
        count = "1"
    elif nprocs is None or (isinstance(nprocs.value, cst.Name) and nprocs.value.value == "None"):
        count = every_device
    elif isinstance(nprocs.value, cst.Integer):
        count = nprocs.value.value
    else:
        count = f"({code(nprocs.value)} or {every_device})"  # xmp.spawn took None: every device
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
    if not launch:
        return [parse_stmt(line + "\n") for line in lines]
    # torch_xla.launch under torchrun called fn(LOCAL_RANK, *args) in the current process.
    call_args = f", *{code(bound['args'].value)}" if "args" in bound else ""
    direct = f'{fn}(int({os_name}.environ["LOCAL_RANK"]){call_args})'
    spawn = "\n".join("    " + line for line in lines)
    return [parse_stmt(
        plan.fill("if {dist}.is_torchelastic_launched():") + f"\n    {direct}\nelse:\n{spawn}\n"
    )]


def setup_worker(func: cst.FunctionDef, node: ast.FunctionDef, file) -> cst.FunctionDef:
    """Start a spawned worker with its rank and the process group."""
    params = [*func.params.posonly_params, *func.params.params]
    index = params[0].name.value
    plan = file.plan
    os_name = plan.use("os")
    lines = [f'{os_name}.environ["RANK"] = {os_name}.environ["LOCAL_RANK"] = str({index})']
    # The program's own init anywhere in the file (often in a function the worker calls, maybe
    # only on one path) would raise "initialize the default process group twice" after ours.
    if not _calls_init_process_group(file.analysis.tree):
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
