"""Ranks and the world size (rules/ranks.toml): `xm.is_master_ordinal()`, `xm.master_print()` and
`xr.process_index()` / `process_count()`; the plain queries are templates of the table."""

from __future__ import annotations

import libcst as cst

from tpu_migrate.rewrite import kept_launches
from tpu_migrate.rewrite.context import StatementContext, parse_expr
from tpu_migrate.rewrite.registry import CALL, STATEMENT, rule_code, transform
from tpu_migrate.rewrite.transforms.common import (
    GLOBAL_MASTER,
    LOCAL_MASTER,
    bind,
    clean_args,
    find_all,
    fresh_name,
    if_block,
    literal_bool,
    spmd_reason,
    standalone,
)


@transform("is_master_ordinal", form=CALL)
def is_master_ordinal(call, qualname, sc: StatementContext, rule):
    bound = bind(call, ["local"])
    local = literal_bool(bound.get("local") if bound is not None else None, True)
    if bound is None or local is None:
        sc.needs_manual(
            rule.code, "`local=` is not a literal: choose LOCAL_RANK or the global rank", qualname
        )
        return call
    reason = spmd_reason(sc) if not local else None
    if reason is not None:
        sc.needs_manual(rule.code, f"{reason}, where this was true on every "
                        "host; TorchTPU runs one process per TPU: port the SPMD code first, then test the rank "
                        "(one process of the job) or LOCAL_RANK (one process per host)", qualname)
        return call
    kept_launches.mark(sc, rule.code, sc.fixed(rule.code, qualname), kept_launches.LOCAL if local else kept_launches.RANK)
    return parse_expr(sc.fill(LOCAL_MASTER if local else GLOBAL_MASTER))


# Callees that neither communicate nor change the program's state: skipping them on the ranks
# the print's guard leaves out changes nothing. xm.master_print evaluated its arguments on every
# rank, so an argument calling anything else (the program's `evaluate()`, which may run a
# collective every rank must join) is computed before the guard.
_QUIET_CALLEES = frozenset({
    "abs", "bool", "dict", "float", "format", "int", "len", "list", "max", "min", "repr", "round",
    "sorted", "str", "sum", "tuple", "type",  # builtins
    "item", "tolist", "numpy", "cpu", "detach", "mean", "numel", "size", "dim", "to",  # tensors
    "join", "upper", "lower", "strip", "keys", "values", "items", "get", "getenv",  # str, dict, os
    "time", "perf_counter", "monotonic", "strftime", "now",  # clocks
    "get_rank", "get_world_size", "is_initialized", "is_available",  # what rank rules write
})


def _calls_anything(expression: cst.BaseExpression) -> bool:
    """Whether `expression` calls something outside `_QUIET_CALLEES` (anything it cannot name)."""
    for call in find_all(expression, cst.Call):
        func = call.func
        name = func.value if isinstance(func, cst.Name) else func.attr.value if isinstance(func, cst.Attribute) else None
        if name not in _QUIET_CALLEES:
            return True
    return False


def _master_print_parts(call, qualname, sc: StatementContext, rule, hoist: list | None):
    """(condition, print call) or None after a manual finding. Arguments that must be computed
    on every rank are bound to fresh names by statements appended to `hoist` (None: the print
    is a value where nothing can go before it)."""
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
        if _calls_anything(arg.value):
            if hoist is None:
                sc.needs_manual(rule.code, "an argument calls a function that xm.master_print ran on every "
                                "rank; compute it before this expression, then print on rank 0", qualname)
                return None
            value = fresh_name(sc, "message")
            hoist.append(cst.SimpleStatementLine(body=[cst.Assign(
                targets=[cst.AssignTarget(target=cst.Name(value))], value=standalone(arg.value))]))
            arg = arg.with_changes(value=cst.Name(value))
        args.append(arg)
    kept_launches.mark(sc, rule.code, sc.fixed(rule.code, qualname), kept_launches.LOCAL if local else kept_launches.RANK)
    condition = sc.fill(LOCAL_MASTER if local else GLOBAL_MASTER)
    return condition, cst.Call(func=cst.Name("print"), args=clean_args(args))


@transform("master_print", form=CALL)
def master_print(call, qualname, sc: StatementContext, rule):
    parts = _master_print_parts(call, qualname, sc, rule, sc.before if sc.can_hoist else None)
    if parts is None:
        return call
    condition, printed = parts
    return cst.IfExp(test=parse_expr(condition), body=printed, orelse=cst.Name("None"))


@transform("master_print", form=STATEMENT)
def master_print_statement(call, qualname, sc: StatementContext, rule, plans):
    computed: list[cst.BaseStatement] = []
    parts = _master_print_parts(call, qualname, sc, rule, computed)
    if parts is None:
        return None
    condition, printed = parts
    guard = if_block(condition, [cst.SimpleStatementLine(body=[cst.Expr(printed)])])
    # Marked: consecutive prints share one guard, and one inside an `if` with the same test
    # needs none (transformer.py).
    sc.file.mark(guard.body, "guard", condition)
    return [*computed, guard]


# The rank rule whose answer each query shares in a process-per-device program.
_SAME_AS = {"process-index": rule_code("TPU021"), "process-count": rule_code("TPU020")}


@transform("process_query", form=CALL)
def process_query(call, qualname, sc: StatementContext, rule):
    """Multi-process torch_xla ran one process per device, as TorchTPU does: the process
    index is the rank and the process count the world size (TPU021 / TPU020's answers). In an
    SPMD file the rule's `under_spmd` has already left the call (transforms/__init__.py)."""
    kept_launches.mark(sc, rule.code, sc.fixed(rule.code, qualname), kept_launches.RANK)
    template = sc.file.catalog.by_code(_SAME_AS[rule.name]).replace[sc.file.target]
    return parse_expr(sc.fill(template))
