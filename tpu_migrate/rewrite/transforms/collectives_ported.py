"""Collectives an earlier run ported from torch_xla's, checked again with the tpu target.

A tree migrated with `--target portable` holds plain torch.distributed code, but its collectives
still carry what torch_xla's carried: device tensors, which on TorchTPU are tpu tensors. Where the
default group they run on may not carry them (collectives.group_problem: the file makes it with
gloo, or its library makes groups of its own), each keeps the TODO that a fresh tpu run of the
original writes, on the statement where that run writes it, under the converting rule's code.

They are told by the code the tool wrote, not by a guess about the program's own: a block under
`if _process_group():` (the helper an earlier run added; helper_code.is_added_helper) that runs a
tensor collective on the default group, and a call of the tool's helper that does (`_all_gather`,
which calls that guard). A collective that carries no device tensors (a barrier,
`all_gather_object`), one given a `group=`, and the program's own collectives are none of these.
The cost in other files: a look at the names of the module-level functions.
"""

from __future__ import annotations

import ast

import libcst as cst

from tpu_migrate.rewrite.context import StatementContext
from tpu_migrate.rewrite.layout import TODO_PREFIX
from tpu_migrate.rewrite.helper_code import is_added_helper
from tpu_migrate.rewrite.names import Analysis, dotted_name, finding_position, mark_subtrees
from tpu_migrate.rewrite.registry import rule_code, transform
from tpu_migrate.rewrite.transforms.collectives import group_problem

# The helper that guards every converted collective where no launch of the file made the group
# (collectives.PROCESS_GROUP).
GUARD = "_process_group"
# torch.distributed's collectives that carry tensors, and the position of their `group` argument.
_TENSOR_COLLECTIVES = {"all_reduce": 2, "all_gather": 2, "broadcast": 2}
_DIST = "torch.distributed."
# The helpers the tool adds that run such a collective under the guard, by the rule that adds them
# (their docstrings do not say "added by tpu-migrate": the guard's does).
_COLLECTIVE_HELPERS = {"_all_gather": rule_code("TPU101")}
# The rules whose conversions write a guarded block: xm.all_reduce, xm.optimizer_step's and
# xm.reduce_gradients' gradient all-reduce, xm.collective_broadcast, xm.broadcast_master_param.
ALL_REDUCE, OPTIMIZER_STEP, REDUCE_GRADIENTS = rule_code("TPU100"), rule_code("TPU030"), rule_code("TPU108")
BROADCAST, BROADCAST_MASTER_PARAM = rule_code("TPU104"), rule_code("TPU105")


def ported_collectives(file) -> dict[int, list[tuple[str, int, int]]]:
    """id(statement) -> (code, line, col) of the ported collectives it holds, where a fresh tpu
    run would mark them: in a file (target tpu) that holds the tool's guard helper. The
    statements are marked for the walk where their group may not carry tpu tensors."""
    analysis: Analysis = file.analysis
    if file.target != "tpu" or not any(name.rstrip("0123456789") == GUARD for name in analysis.functions):
        return {}  # (no helper of that name: nothing to look at, at the cost of a dict walk)
    guards = {name for name, node in analysis.functions.items()
              if name.rstrip("0123456789") == GUARD and is_added_helper(node)}
    if not guards:
        return {}
    resolve = analysis.module_scope.resolve
    helpers = {}  # a helper that runs a collective under the guard -> the rule that wrote it
    for name, node in analysis.functions.items():
        code = _COLLECTIVE_HELPERS.get(name.rstrip("0123456789"))
        if code is not None and _calls(node.body, guards) and _collectives(node.body, resolve):
            helpers[name] = code
    found: dict[int, list[tuple[str, int, int]]] = {}
    inside_helpers = {id(node) for name, node in analysis.functions.items() if name in guards or name in helpers}
    functions_of = analysis.functions_of
    for node in analysis.nodes:
        if not isinstance(node, ast.stmt) or id(functions_of.get(id(node))) in inside_helpers:
            continue
        if isinstance(node, ast.If) and _is_guard(node.test, guards):
            collectives = _collectives(node.body, resolve)
            if collectives:
                marked = _conversion_start(node, collectives[0], analysis)
                found.setdefault(id(marked), []).append(
                    (_code(node, collectives[0], analysis), *finding_position(collectives[0])))
        else:
            for call in _own_calls(node):
                if isinstance(call.func, ast.Name) and call.func.id in helpers:
                    found.setdefault(id(node), []).append((helpers[call.func.id], *finding_position(call)))
    if found and group_problem(file) is not None:
        for key in found:
            analysis.infos[key].forced = True
        mark_subtrees(analysis.tree.body, analysis.infos)
    return found


def _marked_already(sc: StatementContext, marks) -> bool:
    """A TODO of each of the statement's rules stands directly above it (an earlier tpu run's,
    whose words may name other lines): it is reported as it stands, as open work."""
    lines, index = sc.file.source_lines, sc.info.first_line - 2
    above = []
    while index >= 0 and lines[index].strip().startswith("#"):
        above.append(lines[index].strip())
        index -= 1
    return all(any(line.startswith(f"{TODO_PREFIX}{code} ") for line in above) for code, _, _ in marks)


def _is_guard(test: ast.expr, guards: set[str]) -> bool:
    return isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and test.func.id in guards \
        and not test.args and not test.keywords


def _calls(body: list[ast.stmt], names: set[str]) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in names
               for stmt in body for n in ast.walk(stmt))


def _collectives(body: list[ast.stmt], resolve) -> list[ast.Call]:
    """The tensor collectives on the default group in `body`, in order."""
    found = []
    for stmt in body:
        for node in ast.walk(stmt):
            if not isinstance(node, ast.Call):
                continue
            dotted = dotted_name(node.func)
            qualname = resolve(dotted) if dotted else None
            name = qualname[len(_DIST):] if qualname and qualname.startswith(_DIST) else None
            if name in _TENSOR_COLLECTIVES and len(node.args) <= _TENSOR_COLLECTIVES[name] \
                    and not any(k.arg in ("group", None) for k in node.keywords):
                found.append(node)
    found.sort(key=finding_position)
    return found


def _name(call: ast.Call) -> str:
    return call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")


def _code(guarded: ast.If, collective: ast.Call, analysis: Analysis) -> str:
    """The rule whose conversion wrote the guarded block (collectives.py's templates)."""
    tensor = collective.args[0] if collective.args else None
    grad = isinstance(tensor, ast.Attribute) and tensor.attr == "grad"
    if _name(collective) == "all_reduce" and grad:
        # average_gradients: xm.optimizer_step's (TPU030), with the step after it, or
        # xm.reduce_gradients' (TPU108).
        block, index = analysis.blocks[id(guarded)]
        after = block[index + 1] if index + 1 < len(block) else None
        steps = isinstance(after, ast.Expr) and isinstance(after.value, ast.Call) and _name(after.value) == "step"
        return OPTIMIZER_STEP if steps else REDUCE_GRADIENTS
    if _name(collective) == "broadcast":
        # broadcast_master_param broadcasts `param.data` over the parameters and buffers.
        data = isinstance(tensor, ast.Attribute) and tensor.attr == "data"
        return BROADCAST_MASTER_PARAM if data else BROADCAST
    return ALL_REDUCE


def _conversion_start(guarded: ast.If, collective: ast.Call, analysis: Analysis) -> ast.stmt:
    """The statement a fresh run marks: the guarded block, or the copy just before it that the
    all-reduce of a tensor starts with (`y = x.clone()`, collectives._reduce_into)."""
    block, index = analysis.blocks[id(guarded)]
    before = block[index - 1] if index else None
    tensor = collective.args[0] if collective.args else None
    if _name(collective) == "all_reduce" and isinstance(tensor, ast.Name) and isinstance(before, ast.Assign) \
            and len(before.targets) == 1 and isinstance(before.targets[0], ast.Name) \
            and before.targets[0].id == tensor.id and isinstance(before.value, ast.Call) \
            and _name(before.value) == "clone" and isinstance(before.value.func, ast.Attribute):
        return before
    return guarded


def _own_calls(stmt: ast.stmt) -> list[ast.Call]:
    """The calls of a simple statement, or of an `if`'s test (the statements whose TODO the walk
    writes here: ported_collective_statement, ported_collective_block)."""
    root = stmt.test if isinstance(stmt, ast.If) else None if hasattr(stmt, "body") or hasattr(stmt, "cases") \
        else stmt
    return [] if root is None else [node for node in ast.walk(root) if isinstance(node, ast.Call)]


def _mark(sc: StatementContext) -> None:
    plans = sc.file.plans
    marks = plans.ported_collectives.get(id(sc.info.node), ())
    if not marks or id(sc.info.node) in plans.ported_placed or _marked_already(sc, marks):
        return
    plans.ported_placed.add(id(sc.info.node))
    problem = group_problem(sc.file)
    if problem is None:
        return
    for code, line, col in marks:
        if sc.enabled(code):
            sc.needs_manual(code, problem, where=(line, col))


@transform("all_reduce", on="statement", order=-10)
def ported_collective_statement(small, sc: StatementContext):
    """The TODO of a ported collective's group on a simple statement (its conversion's first)."""
    _mark(sc)
    return None


@transform("all_reduce", on="if_test")
def ported_collective_block(test: cst.BaseExpression, sc: StatementContext):
    """The TODO of a ported collective's group on the `if _process_group():` block it runs in."""
    _mark(sc)
    return test
