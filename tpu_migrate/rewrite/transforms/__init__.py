"""The rules that need code: one module per rule family, named as its table (rules/steps.toml's
code is steps.py, or steps_*.py where it is split), each function registered (see
tpu_migrate/rewrite/registry.py) under the `transform` a rule of that table names.

Importing this package imports every family module, which fills the registry; here are the
generic steps that apply a rule met by its `matches`: templates, renames, and the registered
call, reference and statement functions.
"""

from __future__ import annotations

import libcst as cst

from tpu_migrate.rewrite import kept_launches
from tpu_migrate.rewrite.context import StatementContext, parse_expr
from tpu_migrate.rewrite.registry import REGISTRY
from tpu_migrate.rewrite.transforms import (
    amp_compile,
    collectives,
    collectives_ported,
    device,
    environment,
    fsdp,
    fsdp_checkpoints,
    fsdp_models,
    guards,
    launch,
    loaders,
    optimum,
    ranks,
    reporting,
    spmd,
    spmd_batch,
    spmd_parameters,
    steps,
    utilities,
    zero_redundancy,
)
from tpu_migrate.rewrite.transforms.common import atom, bind, code, spmd_reason

# Imported for their registrations.
FAMILIES = (amp_compile, collectives, collectives_ported, device, environment, fsdp, fsdp_checkpoints, fsdp_models, guards, launch,
            loaders, optimum, ranks, reporting, spmd, spmd_batch, spmd_parameters, steps, utilities,
            zero_redundancy)

# The registry's tables (tests patch a transform through CALL).
CALL = REGISTRY.call
STATEMENT = REGISTRY.statement
ASSIGN = REGISTRY.assign
REFERENCE = REGISTRY.reference


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


def spmd_change(rule, qualname: str, sc: StatementContext) -> str | None:
    """Why converting this call would change what it answered, where the program runs SPMD and
    the rule says it meant something else there (the rule's `under_spmd`); None elsewhere. Such
    a call is left, with that as its TODO, by apply_call_rule (and no statement rule takes it)."""
    meaning = rule.spmd_meaning(qualname)
    reason = spmd_reason(sc) if meaning else None
    return None if reason is None else f"{reason}, where this was {meaning}"


def apply_call_rule(rule, qualname: str, call: cst.Call, sc: StatementContext):
    change = spmd_change(rule, qualname, sc)
    if change is not None:
        sc.needs_manual(rule.code, change, qualname)
        return call
    if rule.replace:
        values = template_values(rule, call, sc, qualname)
        try:
            if values is None:
                raise KeyError
            expression = sc.fill(rule.replace[sc.file.target], **values)
        except KeyError:
            sc.needs_manual(rule.code, f"cannot read the arguments: {rule.summary}", qualname)
            return call
        where = sc.fixed(rule.code, qualname)
        if rule.code in kept_launches.PROCESS_QUERIES:
            kept_launches.mark(sc, rule.code, where, kept_launches.LOCAL if rule.code in kept_launches.HOST_QUERIES
                               else kept_launches.RANK)
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
        return parse_expr(sc.file.import_plan.fill(rule.rename[sc.file.target], name=qualname.rsplit(".", 1)[1]))
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
    if spmd_change(rule, qualname, sc) is not None:
        return None  # left with its TODO as a call (apply_call_rule)
    if not sc.may_fix(rule, qualname):
        return None
    return rule, qualname


def apply_statement_rule(rule, qualname, call, sc: StatementContext, plans, assign=None):
    if assign is not None:
        return STATEMENT[rule.transform](call, qualname, sc, rule, plans, assign=assign)
    return STATEMENT[rule.transform](call, qualname, sc, rule, plans)


__all__ = [
    "CALL", "STATEMENT", "ASSIGN", "REFERENCE",
    "apply_call_rule", "spmd_change", "apply_reference_rule", "statement_rule", "apply_statement_rule",
]
