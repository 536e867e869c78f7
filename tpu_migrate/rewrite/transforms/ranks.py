"""Ranks and the world size (rules/ranks.toml): `xm.is_master_ordinal()`, `xm.master_print()` and
`xr.process_index()` / `process_count()`; the plain queries are templates of the table."""

from __future__ import annotations

import libcst as cst

from tpu_migrate.rewrite.context import StatementContext, parse_expr
from tpu_migrate.rewrite.registry import CALL, STATEMENT, rule_code, transform
from tpu_migrate.rewrite.todos import TEXT_MARKER
from tpu_migrate.rewrite.transforms.common import (
    GLOBAL_MASTER,
    LOCAL_MASTER,
    bind,
    clean_args,
    find_all,
    fresh_name,
    if_block,
    literal_bool,
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
    sc.fixed(rule.code, qualname)
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
    sc.fixed(rule.code, qualname)
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


# Where these names appear the program runs SPMD: one process per host, so the process index
# was the host's index, not a rank.
_SPMD_NAMES = ("torch_xla.runtime.use_spmd", "torch_xla.runtime.is_spmd", "optimum.tpu.use_fsdp_v2")
_SPMD_MODULES = ("torch_xla.distributed.spmd.", "optimum.tpu.fsdp_v2.")
_SPMD_TODO = f"{TEXT_MARKER}: {rule_code('TPU170')} "
# Under SPMD: what the value was, and its candidates under TorchTPU.
_SPMD_MEANING = {
    "process-index": ("the host's index", "the rank or NODE_RANK"),
    "process-count": ("the number of hosts", "the world size or NNODES"),
}
# The rank rule whose answer each query shares in a process-per-device program.
_SAME_AS = {"process-index": rule_code("TPU021"), "process-count": rule_code("TPU020")}


@transform("process_query", form=CALL)
def process_query(call, qualname, sc: StatementContext, rule):
    """Multi-process torch_xla ran one process per device, as TorchTPU does: the process
    index is the rank and the process count the world size (TPU021 / TPU020's answers)."""
    if _uses_spmd(sc):
        was, now = _SPMD_MEANING[rule.name]
        sc.needs_manual(rule.code, f"this file runs SPMD (one process per host), where this was {was}; "
                        "TorchTPU runs one process per TPU: port the SPMD code first, then use "
                        f"{now} as your data sharding needs", qualname)
        return call
    sc.fixed(rule.code, qualname)
    template = sc.file.catalog.by_code(_SAME_AS[rule.name]).replace[sc.file.target]
    return parse_expr(sc.fill(template))


def _uses_spmd(sc: StatementContext) -> bool:
    """SPMD names in the file, or the TODO that `xr.use_spmd()` left where it went (TPU170): the
    process queries keep their SPMD meaning on a second run too."""
    uses = sc.file.memo.get("uses_spmd")
    if uses is None:  # once per file: a scan per query would grow with the square of its size
        uses = sc.file.memo["uses_spmd"] = any(
            name in _SPMD_NAMES or name.startswith(_SPMD_MODULES) for name in sc.file.analysis.qualnames
        ) or any(_SPMD_TODO in line for line in sc.file.source_lines)
    return uses
