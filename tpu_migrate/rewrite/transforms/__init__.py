"""The rules that need code: one module per rule family, and here the dispatch tables.

Each function is named by a rule's `transform` in rules/*.toml.

Expression rules take the (already rewritten) call and return its replacement, or the call
unchanged after recording a manual finding. Statement rules take the call of an expression
statement and return the statements that replace it, or None to leave it alone.
"""

from __future__ import annotations

import libcst as cst

from tpu_migrate.rewrite.context import StatementContext, parse_expr
from tpu_migrate.rewrite.transforms.amp_compile import (
    eager_mode_statement,
    manual_seed,
    torch_compile,
    xla_autocast,
    xla_compile,
    xla_compile_reference,
)
from tpu_migrate.rewrite.transforms.collectives import (
    all_gather_statement,
    all_gather_value,
    all_reduce_value,
    all_reduce_statement,
    broadcast_master_param_statement,
    collective_broadcast_statement,
    mesh_reduce_statement,
    mesh_reduce_value,
    reduce_gradients_statement,
    reduce_op_constant,
    rendezvous_statement,
)
from tpu_migrate.rewrite.transforms.common import (
    LOOSE,
    atom,
    bind,
    code,
    is_xla,
)
from tpu_migrate.rewrite.transforms.device import (
    autocast,
    data_assignment,
    data_dict_element,
    data_element,
    data_return,
    device_call,
    device_param_default,
    device_string_args,
    device_type_compare,
    torch_device_ctor,
)
from tpu_migrate.rewrite.transforms.environment import (
    environment_reads,
    environment_statement,
    matmul_precision,
    memory_info,
)
from tpu_migrate.rewrite.transforms.guards import (
    availability_guard,
    find_spec_guard,
    find_spec_test,
    fsdp_config_dict,
    guards_allowed,
    optimum_auto_model,
    optional_import_test,
    tpu_available,
)
from tpu_migrate.rewrite.transforms.launch import (
    init_process_group,
    insert_at_body_start,
    setup_worker,
    spawn_statement,
)
from tpu_migrate.rewrite.transforms.loaders import (
    device_loader,
    device_loader_loop,
    drop_loader_alias,
    sample_generator,
)
from tpu_migrate.rewrite.transforms.reporting import (
    helper_call,
    helper_reference,
    metrics_print_statement,
    xla_logger,
    xla_logger_statement,
)
from tpu_migrate.rewrite.transforms.steps import (
    step_closure,
    is_master_ordinal,
    master_print,
    master_print_statement,
    optimizer_step,
    optimizer_step_statement,
    remove_step_marker,
    remove_step_marker_statement,
    unwrap_step_context,
    xla_save_statement,
)
from tpu_migrate.rewrite.transforms.utilities import (
    cpu_copies,
    initialize_cache_statement,
    process_query,
    sync_batch_norm,
    sync_batch_norm_reference,
    xla_checkpoint,
    xla_checkpoint_reference,
)


CALL = {
    "step_closure": step_closure,
    "all_reduce": all_reduce_value,
    "all_gather": all_gather_value,
    "mesh_reduce": mesh_reduce_value,
    "manual_seed": manual_seed,
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
    "helper": helper_call,
    "xla_logger": xla_logger,
    "sample_generator": sample_generator,
    "xla_checkpoint": xla_checkpoint,
    "sync_batch_norm": sync_batch_norm,
    "cpu_copies": cpu_copies,
    "process_query": process_query,
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
    "optimizer_step": optimizer_step_statement,
    "xla_logger": xla_logger_statement,
    "initialize_cache": initialize_cache_statement,
}

# Statement rules that also convert `name = call(...)` (they take the Assign).
ASSIGN = frozenset({"all_reduce", "all_gather", "mesh_reduce", "optimizer_step"})

# Rules applied to a bare reference (not a call): `xm.REDUCE_SUM`, `@torch_xla.compile`.
REFERENCE = {
    "reduce_op_constant": reduce_op_constant,
    "xla_compile": xla_compile_reference,
    "helper": helper_reference,
    "xla_checkpoint": xla_checkpoint_reference,
    "sync_batch_norm": sync_batch_norm_reference,
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
        for key, arg in bound.items():
            values[key] = code(arg.value)
            values[f"{key}_atom"] = atom(arg.value)  # for callees and attribute bases
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


# The transformer reaches every transform through this package.
__all__ = [
    "step_closure",
    "LOOSE",
    "atom",
    "all_gather_statement",
    "all_gather_value",
    "all_reduce_statement",
    "all_reduce_value",
    "autocast",
    "availability_guard",
    "bind",
    "broadcast_master_param_statement",
    "code",
    "collective_broadcast_statement",
    "data_assignment",
    "data_dict_element",
    "data_element",
    "data_return",
    "device_call",
    "device_loader",
    "device_loader_loop",
    "drop_loader_alias",
    "device_param_default",
    "device_string_args",
    "device_type_compare",
    "eager_mode_statement",
    "environment_reads",
    "environment_statement",
    "find_spec_guard",
    "find_spec_test",
    "fsdp_config_dict",
    "guards_allowed",
    "init_process_group",
    "insert_at_body_start",
    "is_master_ordinal",
    "is_xla",
    "master_print",
    "master_print_statement",
    "manual_seed",
    "matmul_precision",
    "memory_info",
    "mesh_reduce_statement",
    "mesh_reduce_value",
    "metrics_print_statement",
    "optimizer_step",
    "optimizer_step_statement",
    "optimum_auto_model",
    "optional_import_test",
    "reduce_gradients_statement",
    "reduce_op_constant",
    "remove_step_marker",
    "remove_step_marker_statement",
    "rendezvous_statement",
    "sample_generator",
    "setup_worker",
    "spawn_statement",
    "torch_compile",
    "torch_device_ctor",
    "tpu_available",
    "unwrap_step_context",
    "xla_autocast",
    "xla_compile",
    "xla_compile_reference",
    "xla_save_statement",
]
