"""Collectives (rules/collectives.toml): `xm.all_reduce`, `all_gather`, `rendezvous`, `mesh_reduce`, ... (TPU100-TPU110)."""

from __future__ import annotations

import ast

import libcst as cst

from tpu_migrate.rewrite import kept_launches
from tpu_migrate.rewrite.context import StatementContext, cst_dotted, parse_expr
from tpu_migrate.rewrite.helper_code import CPU_COPIES
from tpu_migrate.rewrite.plans import TPU_BACKENDS, library_groups, own_nodes
from tpu_migrate.rewrite.registry import CALL, REFERENCE, STATEMENT, transform
from tpu_migrate.rewrite.transforms.common import (
    ALL_GATHER,
    helper,
    code,
    bind,
    atom,
    parse_block,
    target_name,
    fresh_name,
    given,
    find_all,
)


REDUCE_OPS = {
    "REDUCE_SUM": "SUM", "REDUCE_MUL": "PRODUCT", "REDUCE_MIN": "MIN", "REDUCE_MAX": "MAX",
    "REDUCE_AND": "BAND", "REDUCE_OR": "BOR",
    "sum": "SUM", "mul": "PRODUCT", "min": "MIN", "max": "MAX", "and": "BAND", "or": "BOR",
}


# torch_xla's collectives reached every process of the launch (xmp.spawn, torch_xla.launch,
# torchrun, a pod) from its runtime, with or without a process group. Where no launcher
# conversion of this file makes the default group, the converted collectives make it the first
# time they run, from the launch environment; a process no launcher started (no WORLD_SIZE) is
# a world of one, as `python train.py` was under torch_xla. (The helper explains itself in
# comments, beside a one-line docstring: a multi-line string would not take the file's line endings.)
PROCESS_GROUP = '''def {name}():
    """Whether this process shares a process group with others (added by tpu-migrate)."""
    # torch_xla's runtime knew without a group. If the program made none, the default group is
    # made from the launch environment (torchrun, TorchTPU's launcher); a process no launcher
    # started is a world of one.
    if not {dist}.is_initialized() and int({os}.environ.get("WORLD_SIZE", 1)) > 1:
        {dist}.init_process_group({backend})
    return {dist}.is_initialized() and {dist}.get_world_size() > 1
'''


def world_guard(sc: StatementContext, code_: str, where: tuple[int, int] | None, short: bool = False,
                tensors: bool = True) -> str:
    """The condition (code) under which a converted collective runs across processes, and the
    TODO on its line where the group it needs may be missing or unable to carry its tensors.
    `short`: a collective that is harmless in a group of one (a barrier, a broadcast) may test
    `dist.is_initialized()` alone. `tensors`: False for one that carries no device tensors (a
    barrier, all_gather_object of CPU copies), which any backend's group runs."""
    plans = sc.file.plans
    dist = sc.file.import_plan.use("dist")
    _mark_group(sc, code_, where, tensors)
    if plans is not None and plans.launcher_group:
        # The converted launch put every worker in the default group; elsewhere in this file
        # (the parent, a helper called before the launch) torch_xla's world was one process.
        if short:
            return f"{dist}.is_initialized()"
        # In a worker that only the launch runs, the group is there (named_expressions.py).
        return f"{dist}.get_world_size() > 1" if sc.in_joined_worker else \
            f"{dist}.is_initialized() and {dist}.get_world_size() > 1"
    backend = '"tpu_dist"' if sc.file.target == "tpu" else ""
    return f"{helper(sc, '_process_group', PROCESS_GROUP.replace('{backend}', backend))}()"


def _mark_group(sc: StatementContext, code_: str, where: tuple[int, int] | None, tensors: bool) -> None:
    plans = sc.file.plans
    if plans is None:
        return
    kept_launches.mark(sc, code_, where, kept_launches.COLLECTIVE)
    problem = group_problem(sc.file) if tensors else None
    if problem is not None:
        sc.needs_manual(code_, problem, where=where)


def group_problem(file) -> str | None:
    """On target tpu, why the default group that the file's converted collectives run on may not
    carry tpu tensors (torch_xla's needed no group): the file makes it with a literal backend
    other than TorchTPU's, or its library makes groups of its own. None elsewhere. (A backend
    held in an expression is marked once, on its init_process_group line: TPU070.)"""
    plans = file.plans
    if plans is None or file.target != "tpu":
        return None
    literal = literal_group_backends(file)
    if literal:
        return (f"this file makes its process group with backend {', '.join(literal)}, "
                "which cannot carry tpu tensors (gloo: CPU only); torch_xla's collectives needed "
                "no group, and this one runs on the default group: make it with \"tpu_dist\", or "
                "pass a group that can carry tpu tensors")
    if plans.library_groups is None:  # looked for once per file, where a collective asks
        plans.library_groups = library_groups(file.analysis.nodes)
    if plans.library_groups:
        return LIBRARY_GROUPS.format(evidence="; ".join(plans.library_groups))
    return None


def literal_group_backends(file) -> list[str]:
    """The literal backends (as written: `'gloo'`) other than TorchTPU's that the file makes a
    default group with, on target tpu."""
    plans = file.plans
    if plans is None or file.target != "tpu":
        return []
    return sorted({b for b in plans.group_backends
                   if b is not None and b.strip("\"'") not in TPU_BACKENDS and b[:1] in "\"'"})


# A library that makes its own process groups (vLLM: a gloo `cpu_group` beside each device group,
# and on TPU a gloo default group) chose their backends where this file cannot see.
LIBRARY_GROUPS = ("this file's library makes process groups of its own ({evidence}), with backends it chooses; "
                  "this collective runs on the default group, and where the library made that one, this file "
                  "does not show its backend. torch_xla's collectives needed no group; a gloo group (CPU only) "
                  "cannot carry tpu tensors: pass group= a group made with backend \"tpu_dist\", or make the "
                  "default group with it")


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
            sc.removed(cst_dotted(node))
        elif cst_dotted(node) and "ReduceOp." in cst_dotted(node):
            return code(node)  # already converted by TPU110
    op = REDUCE_OPS.get(key) if isinstance(key, str) else None
    return sc.file.import_plan.fill("{dist}.ReduceOp.") + op if op else None


@transform("all_reduce", form=STATEMENT, assign=True)
def all_reduce_statement(call, qualname, sc: StatementContext, rule, plans, assign=None):
    bound = bind(call, ["reduce_type", "inputs", "scale", "groups", "pin_layout"])
    if bound is None or "reduce_type" not in bound or "inputs" not in bound or given(bound, "groups"):
        sc.needs_manual(rule.code, "cannot convert these arguments of xm.all_reduce (groups=?)", qualname)
        return None
    op = _reduce_op(bound["reduce_type"].value, sc)
    if op is None:
        sc.needs_manual(rule.code, "the reduce type is not an xm.REDUCE_* constant or a string", qualname)
        return None
    plan = sc.file.import_plan
    dist = plan.use("dist")
    inputs = bound["inputs"].value
    scale = _operand(bound["scale"].value) if "scale" in bound else None
    if scale in ("1", "1.0"):
        scale = None
    target = target_name(assign)
    if target is None and assign is not None:
        sc.needs_manual(rule.code, "assign the result to a name to convert xm.all_reduce", qualname)
        return None
    where = sc.fixed(rule.code, qualname)
    if target is not None and _builds_a_list(inputs):
        # A list built in the call (`[p.grad for p in params]`): torch_xla reduced each of its
        # tensors in place and returned the list itself.
        lines = [f"{target} = {code(inputs)}", f"if {world_guard(sc, rule.code, where)}:",
                 *_reduce_each(target, op, scale, sc)]
    elif target is not None and _holds_a_list(inputs, sc):
        # torch_xla reduced a list in place and returned it.
        lines = [f"if {world_guard(sc, rule.code, where)}:", *_reduce_each(code(inputs), op, scale, sc),
                 f"{target} = {code(inputs)}"]
    elif target is not None:
        lines = _reduce_into(target, atom(inputs), op, scale, sc, rule.code, where)  # a tensor: a new one
    elif assign is None:
        # A statement: a list is reduced in place; a tensor's reduction was returned, and
        # dropped here, so the tensor itself stays as it was.
        elements = inputs.elements if isinstance(inputs, (cst.List, cst.Tuple)) else None
        # An empty list reduces nothing: the loop below over it (an `if` needs a body).
        if elements and all(isinstance(e, cst.Element) for e in elements):
            lines = [f"if {world_guard(sc, rule.code, where)}:"]
            for element in elements:
                lines.append(f"    {dist}.all_reduce({code(element.value)}, op={op})")
                lines += _scaled_in_place(atom(element.value), scale, sc, "    ")
        else:
            lines, tensors = _read_once(inputs, "tensors", sc)
            is_list = "" if _builds_a_list(inputs) else f"not isinstance({tensors}, {plan.use('torch')}.Tensor) and "
            lines += [f"if {is_list}{world_guard(sc, rule.code, where)}:", *_reduce_each(tensors, op, scale, sc)]
    return parse_block(lines)


def _read_once(value: cst.BaseExpression, name: str, sc: StatementContext) -> tuple[list[str], str]:
    """(lines, code) that evaluate `value` once, before the world-size test, as torch_xla did at
    every world size, and then read it: a name or attribute as it is, anything else (a call, a
    list built in place) assigned to a fresh `name` first."""
    if isinstance(value, (cst.Name, cst.Attribute)):
        return [], code(value)
    fresh = fresh_name(sc, name)
    return [f"{fresh} = {code(value)}"], fresh


def _reduce_each(tensors: str, op: str, scale: str | None, sc: StatementContext) -> list[str]:
    """A loop (in an `if` body) that reduces each tensor of the list `tensors` in place, as
    torch_xla reduced a list."""
    var = fresh_name(sc, "tensor")
    return [f"    for {var} in {tensors}:", f"        {sc.file.import_plan.use('dist')}.all_reduce({var}, op={op})",
            *_scaled_in_place(var, scale, sc, "        ")]


def _builds_a_list(inputs: cst.BaseExpression) -> bool:
    """Whether `inputs` makes a new list or tuple where it stands (a display, a comprehension,
    `list(...)`, `tuple(...)`): torch_xla reduced its tensors in place, where a tensor got a new
    one."""
    return isinstance(inputs, (cst.List, cst.Tuple, cst.ListComp)) or (
        isinstance(inputs, cst.Call) and isinstance(inputs.func, cst.Name)
        and inputs.func.value in ("list", "tuple"))


def _holds_a_list(inputs: cst.BaseExpression, sc: StatementContext) -> bool:
    """Whether `inputs` is a name its function (or module) assigns a list or tuple to
    (`stats = [correct, total]`, `list(...)`, a comprehension): torch_xla reduced those in place
    and returned them, where a tensor got a new tensor."""
    if not isinstance(inputs, cst.Name):
        return False
    scope = next((node for node in reversed(sc.ancestors or [])
                  if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))), sc.file.analysis.tree)
    return any(
        isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == inputs.value for t in node.targets)
        and (isinstance(node.value, (ast.List, ast.Tuple, ast.ListComp)) or isinstance(node.value, ast.Call)
             and isinstance(node.value.func, ast.Name) and node.value.func.id in ("list", "tuple"))
        for node in own_nodes(scope.body))


def _scaled_in_place(tensor: str, scale: str | None, sc: StatementContext, indent: str) -> list[str]:
    """torch_xla scaled the reduced tensors in place outside autograd: a parameter (a leaf that
    requires grad) may be one, and `mul_` refuses it under autograd."""
    if not scale:
        return []
    return [f"{indent}with {sc.file.import_plan.use('torch')}.no_grad():", f"{indent}    {tensor}.mul_({scale})"]


@transform("all_reduce", form=CALL)
def all_reduce_value(call, qualname, sc: StatementContext, rule):
    """`xm.all_reduce(op, tensor)` inside a larger expression (`... / world`, `.item()`): the
    reduction goes in statements just before, into a fresh name that takes the call's place."""
    bound = bind(call, ["reduce_type", "inputs", "scale", "groups", "pin_layout"])
    inputs = bound.get("inputs") if bound else None
    if not sc.can_hoist:
        _cannot_hoist(sc, rule, qualname, "xm.all_reduce", "reduce it")
        return call
    if (
        inputs is None or "reduce_type" not in bound or given(bound, "groups")
        or _builds_a_list(inputs.value) or _holds_a_list(inputs.value, sc)
    ):
        sc.needs_manual(rule.code, f"{rule.summary} (used as a value here: convert by hand)", qualname)
        return call
    op = _reduce_op(bound["reduce_type"].value, sc)
    if op is None:
        sc.needs_manual(rule.code, "the reduce type is not an xm.REDUCE_* constant or a string", qualname)
        return call
    name = fresh_name(sc, "reduced")
    scale = _operand(bound["scale"].value) if "scale" in bound else None
    where = sc.fixed(rule.code, qualname)
    sc.before.extend(parse_block(_reduce_into(name, atom(inputs.value), op, scale, sc, rule.code, where)))
    return cst.Name(name)


def _cannot_hoist(sc: StatementContext, rule, qualname: str, what: str, verb: str) -> None:
    where = ("in a lambda, comprehension or conditional expression, where it may run several "
             "times or not at all" if sc.hoist_blocked else "in the header of a compound statement")
    sc.needs_manual(rule.code, f"{what} used as a value {where}: {verb} into a name in a statement "
                    "of its own, then run the tool again", qualname)


def _operand(node: cst.BaseExpression) -> str:
    """`node` as the right operand of `*` (or an argument): numbers need no parentheses."""
    return code(node) if isinstance(node, (cst.Integer, cst.Float)) else atom(node)


def _reduce_into(target: str, tensor: str, op: str, scale: str | None, sc: StatementContext,
                 code_: str, where: tuple[int, int]) -> list[str]:
    """`target` = the reduction of `tensor` as torch_xla returned it: a new tensor, unscaled and
    unreduced in a world of one."""
    dist = sc.file.import_plan.use("dist")
    lines = [f"{target} = {tensor}.clone()", f"if {world_guard(sc, code_, where)}:",
             f"    {dist}.all_reduce({target}, op={op})"]
    if scale and scale not in ("1", "1.0"):
        lines.append(f"    {target} = {target} * {scale}")
    return lines


@transform("all_gather", form=STATEMENT, assign=True)
def all_gather_statement(call, qualname, sc: StatementContext, rule, plans, assign=None):
    """`y = xm.all_gather(x, dim=d)` -> `y = _all_gather(x, d)`."""
    gather = _gather_call(call, qualname, sc, rule)
    if gather is None:
        return None
    line = f"{code(assign.targets[0].target)} = {gather}" if target_name(assign) else gather
    return parse_block([line])


@transform("all_gather", form=CALL)
def all_gather_value(call, qualname, sc: StatementContext, rule):
    """`xm.all_gather(x)` inside a larger expression: like the other collectives, it goes into a
    fresh name just before the statement (so it runs on every rank even where the statement
    prints on one, `xm.master_print(...)`). Where that could change how often it runs (a
    comprehension, `a if c else b`), the helper call takes the call's place instead."""
    gather = _gather_call(call, qualname, sc, rule)
    if gather is None:
        return call
    if not sc.can_hoist:
        return parse_expr(gather)
    name = fresh_name(sc, "gathered")
    sc.before.extend(parse_block([f"{name} = {gather}"]))
    return cst.Name(name)


def _gather_call(call, qualname, sc: StatementContext, rule) -> str | None:
    """`_all_gather(value, dim)`, a helper added to the file: the value may be a tensor or a
    list of tensors, which only the run can tell; None after a manual finding."""
    bound = bind(call, ["value", "dim", "groups", "output", "pin_layout"])
    if bound is None or "value" not in bound or given(bound, "groups") or given(bound, "output"):
        sc.needs_manual(rule.code, "xm.all_gather with groups=, output= or unpacked arguments: "
                        "gather by hand (dist.all_gather into a list, then torch.cat)", qualname)
        return None
    dim = f", {code(bound['dim'].value)}" if "dim" in bound else ""
    where = sc.fixed(rule.code, qualname)
    guard = world_guard(sc, rule.code, where, short=True)
    # Without the launcher's group: `if not _process_group(): return value.clone()`.
    template = ALL_GATHER if "is_initialized" in guard else ALL_GATHER.replace("{dist}.is_initialized()", guard)
    return f"{helper(sc, '_all_gather', template)}({code(bound['value'].value)}{dim})"


@transform("collective_broadcast", form=STATEMENT)
def collective_broadcast_statement(call, qualname, sc: StatementContext, rule, plans):
    bound = bind(call, ["tensors", "root_ordinal", "groups", "pin_layout"])
    if bound is None or "tensors" not in bound or given(bound, "groups"):
        sc.needs_manual(rule.code, "cannot convert these arguments of xm.collective_broadcast", qualname)
        return None
    dist = sc.file.import_plan.use("dist")
    root = code(bound["root_ordinal"].value) if "root_ordinal" in bound else "0"
    tensors = bound["tensors"].value
    where = sc.fixed(rule.code, qualname)
    # torch_xla evaluated the list at every world size: code in it (`get_params()`) runs before
    # the world-size test, as before; a list of names is read inside it.
    if isinstance(tensors, (cst.List, cst.Tuple)) and tensors.elements \
            and all(isinstance(e, cst.Element) and isinstance(e.value, (cst.Name, cst.Attribute))
                    for e in tensors.elements):  # an empty one: the loop
        lines = [f"if {world_guard(sc, rule.code, where, short=True)}:",
                 *(f"    {dist}.broadcast({code(e.value)}, src={root})" for e in tensors.elements)]
    else:
        lines, listed = _read_once(tensors, "tensors", sc)
        var = fresh_name(sc, "tensor")
        lines += [f"if {world_guard(sc, rule.code, where, short=True)}:",
                  f"    for {var} in {listed}:", f"        {dist}.broadcast({var}, src={root})"]
    return parse_block(lines)


@transform("broadcast_master_param", form=STATEMENT)
def broadcast_master_param_statement(call, qualname, sc: StatementContext, rule, plans):
    bound = bind(call, ["model"])
    if bound is None or "model" not in bound:
        sc.needs_manual(rule.code, "cannot read the model argument", qualname)
        return None
    dist = sc.file.import_plan.use("dist")
    var = fresh_name(sc, "param")
    where = sc.fixed(rule.code, qualname)
    # torch_xla broadcast the parameters and the buffers (BatchNorm's running statistics).
    # `xm.broadcast_master_param(get_model())`: the model is evaluated once, as before, and at
    # every world size, as torch_xla did.
    lines, model = _read_once(bound["model"].value, "model", sc)
    lines += [
        f"if {world_guard(sc, rule.code, where, short=True)}:",
        f"    for {var} in [*{model}.parameters(), *{model}.buffers()]:",
        f"        {dist}.broadcast({var}.data, src=0)",
    ]
    return parse_block(lines)


@transform("rendezvous", form=STATEMENT)
def rendezvous_statement(call, qualname, sc: StatementContext, rule, plans):
    bound = bind(call, ["tag", "payload", "replicas"])
    if bound is None or given(bound, "payload") or given(bound, "replicas"):
        sc.needs_manual(
            rule.code, "this rendezvous exchanges a payload: use dist.all_gather_object", qualname
        )
        return None
    dist = sc.file.import_plan.use("dist")
    where = sc.fixed(rule.code, qualname)
    return parse_block([f"if {world_guard(sc, rule.code, where, short=True, tensors=False)}:", f"    {dist}.barrier()"])


@transform("rendezvous", form=CALL)
def rendezvous_value(call, qualname, sc: StatementContext, rule):
    """`data = xm.rendezvous(tag, payload)`: its value is every process's payload, which a
    barrier does not give."""
    sc.needs_manual(rule.code, "this rendezvous returns every process's payload (a barrier would drop it): "
                    "use dist.all_gather_object, on a group of `replicas` where given", qualname)
    return call


@transform("mesh_reduce", form=STATEMENT, assign=True)
def mesh_reduce_statement(call, qualname, sc: StatementContext, rule, plans, assign=None):
    bound = bind(call, ["tag", "data", "reduce_fn"])
    target = target_name(assign)
    if target is None or bound is None or "data" not in bound or "reduce_fn" not in bound:
        sc.needs_manual(rule.code, "assign xm.mesh_reduce(...) to a name to convert it", qualname)
        return None
    where = sc.fixed(rule.code, qualname)
    return parse_block(_mesh_reduce_into(target, bound, sc, rule.code, where))


@transform("mesh_reduce", form=CALL)
def mesh_reduce_value(call, qualname, sc: StatementContext, rule):
    """`xm.mesh_reduce(tag, data, fn)` inside a larger expression (`return ...`, `print(...)`):
    the reduction goes in statements just before, into a fresh name that takes the call's place."""
    if not sc.can_hoist:
        _cannot_hoist(sc, rule, qualname, "xm.mesh_reduce", "reduce it")
        return call
    bound = bind(call, ["tag", "data", "reduce_fn"])
    if bound is None or "data" not in bound or "reduce_fn" not in bound:
        sc.needs_manual(rule.code, "cannot read the arguments of xm.mesh_reduce", qualname)
        return call
    name = fresh_name(sc, "reduced")
    where = sc.fixed(rule.code, qualname)
    sc.before.extend(parse_block(_mesh_reduce_into(name, bound, sc, rule.code, where)))
    return cst.Name(name)


def _mesh_reduce_into(target: str, bound: dict, sc: StatementContext, code_: str,
                      where: tuple[int, int] | None) -> list[str]:
    """`target` = reduce_fn applied to `data` from every process (a world of one: `[data]`).
    The data may be any picklable object (a number, a numpy value): all_gather_object."""
    dist = sc.file.import_plan.use("dist")
    # torch_xla sent (and reduce_fn received) CPU copies of the data's device tensors.
    data = f"{helper(sc, '_cpu_copies', CPU_COPIES)}({code(bound['data'].value)})"
    # `acc = xm.mesh_reduce("t", acc, fn)`: gathering into `acc` would overwrite the value sent.
    sends_target = any(name.value == target for name in find_all(bound["data"].value, cst.Name))
    gathered = fresh_name(sc, "gathered") if sends_target else target
    return [
        f"if {world_guard(sc, code_, where, short=True, tensors=False)}:",
        f"    {gathered} = [None] * {dist}.get_world_size()",
        f"    {dist}.all_gather_object({gathered}, {data})",
        "else:",
        f"    {gathered} = [{data}]",
        f"{target} = {atom(bound['reduce_fn'].value)}({gathered})",
    ]


@transform("reduce_gradients", form=STATEMENT)
def reduce_gradients_statement(call, qualname, sc: StatementContext, rule, plans):
    bound = bind(call, ["optimizer", "groups", "pin_layout"])
    if bound is None or "optimizer" not in bound or given(bound, "groups"):
        sc.needs_manual(rule.code, "cannot convert these arguments of xm.reduce_gradients", qualname)
        return None
    where = sc.fixed(rule.code, qualname)
    return parse_block(average_gradients(atom(bound["optimizer"].value), sc, rule.code, where))


def average_gradients(optimizer: str, sc: StatementContext, code_: str,
                      where: tuple[int, int] | None = None) -> list[str]:
    """What `xm.reduce_gradients(optimizer)` did: all-reduce every gradient of the optimizer's
    parameters and divide by the world size (nothing to do in one process)."""
    dist = sc.file.import_plan.use("dist")
    var = fresh_name(sc, "param")
    return [
        f"if {world_guard(sc, code_, where)}:",
        f"    for {var} in (p for group in {optimizer}.param_groups for p in group[\"params\"]):",
        f"        if {var}.grad is not None:",
        f"            {dist}.all_reduce({var}.grad)",
        f"            {var}.grad /= {dist}.get_world_size()",
    ]


# torch_xla's reduce types are plain strings: used on their own (a table's key, a comparison,
# a default, a value handed to the program's own helper) they keep their value.
REDUCE_TYPE_VALUES = {"REDUCE_SUM": "sum", "REDUCE_MUL": "mul", "REDUCE_MIN": "min", "REDUCE_MAX": "max",
                      "REDUCE_AND": "and", "REDUCE_OR": "or"}


@transform("reduce_op_constant", form=REFERENCE)
def reduce_op_constant(node, qualname, sc: StatementContext, rule):
    """`xm.REDUCE_SUM` used on its own (not as a converted collective's reduce type, where it
    becomes `dist.ReduceOp.SUM`): the string it always was."""
    sc.fixed(rule.code, qualname)
    return cst.SimpleString(f'"{REDUCE_TYPE_VALUES[qualname.rsplit(".", 1)[1]]}"')
