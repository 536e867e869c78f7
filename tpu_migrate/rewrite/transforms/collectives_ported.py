"""Collectives an earlier run ported from torch_xla's, checked again with the tpu target.

A tree migrated with `--target portable` holds plain torch.distributed code, but its collectives
still carry what torch_xla's carried: device tensors, which on TorchTPU are tpu tensors. Where the
default group they run on may not carry them (collectives.group_problem: the file makes it with
gloo, or its library makes groups of its own), each keeps the TODO that a fresh tpu run of the
original writes, on the statement where that run writes it, under the converting rule's code.

They are told by the code the tool wrote: a block under the guard a conversion writes (the
helper `if _process_group():` an earlier run added, helper_code.is_added_helper; or, where a
converted launch made the group, `if dist.is_initialized() and dist.get_world_size() > 1:` and
`if dist.get_world_size() > 1:`, which a person may write too: beside a group the file makes
with gloo, where no conversion writes them, they are the program's own) that runs a tensor collective on
the default group; a call of the tool's `_all_gather` (its docstring's marker; an older output's
by its name and the guard it calls); each use of the tool's `SyncBatchNorm` class (TPU126, whose
statistics it all-reduces). A collective that carries no device tensors (a barrier,
`all_gather_object`) and one given a `group=` are none of these.

The program's own tensor collectives on a default group the file makes with gloo are marked too,
in a tree the tool migrated (it holds a helper the tool added, no torch_xla): the re-check cannot
tell whether they carry the accelerator's tensors (a tensor the program made on the CPU, or
copied there, goes unmarked), and gloo cannot carry tpu tensors. The cost in other files: a look
at the module-level definitions' docstrings.
"""

from __future__ import annotations

import ast

import libcst as cst

from tpu_migrate.rewrite.context import StatementContext
from tpu_migrate.rewrite.layout import TODO_PREFIX
from tpu_migrate.rewrite.helper_code import is_added_helper
from tpu_migrate.rewrite.names import Analysis, dotted_name, finding_position, mark_subtrees
from tpu_migrate.rewrite.registry import rule_code, transform
from tpu_migrate.rewrite.transforms.collectives import group_problem, literal_group_backends
from tpu_migrate.rewrite.transforms.common import is_xla

# The helper that guards every converted collective where no launch of the file made the group
# (collectives.PROCESS_GROUP).
GUARD = "_process_group"
_DIST = "torch.distributed."
# The rules whose conversions write a guarded block: xm.all_reduce, xm.optimizer_step's and
# xm.reduce_gradients' gradient all-reduce, xm.collective_broadcast, xm.broadcast_master_param.
ALL_REDUCE, OPTIMIZER_STEP, REDUCE_GRADIENTS = rule_code("TPU100"), rule_code("TPU030"), rule_code("TPU108")
BROADCAST, BROADCAST_MASTER_PARAM = rule_code("TPU104"), rule_code("TPU105")
ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL = rule_code("TPU101"), rule_code("TPU102"), rule_code("TPU103")
# torch.distributed's collectives that carry tensors, the position of their `group` argument, and
# the rule whose torch_xla collective converts to them (the code a program's own is marked with).
_TENSOR_COLLECTIVES = {
    "all_reduce": (2, ALL_REDUCE), "reduce": (3, ALL_REDUCE),
    "all_gather": (2, ALL_GATHER), "all_gather_into_tensor": (2, ALL_GATHER), "gather": (3, ALL_GATHER),
    "reduce_scatter": (3, REDUCE_SCATTER), "reduce_scatter_tensor": (3, REDUCE_SCATTER), "scatter": (3, REDUCE_SCATTER),
    "all_to_all": (2, ALL_TO_ALL), "all_to_all_single": (4, ALL_TO_ALL),
    "broadcast": (2, BROADCAST),
}
# The collectives the tool's conversions write under their guard.
_PORTED = ("all_reduce", "all_gather", "broadcast")
# The helpers the tool adds that run such a collective, by the rule that adds them.
_COLLECTIVE_HELPERS = {"_all_gather": ALL_GATHER}
SYNC_BATCH_NORM, _SYNC_BATCH_NORM_DOC = "SyncBatchNorm", "torch_xla's SyncBatchNorm:"
SYNC_BATCH_NORM_CODE = rule_code("TPU126")
# Factories that make a tensor on the CPU unless given `device=`, and methods that copy to it.
_CPU_FACTORIES = {"torch." + name for name in (
    "tensor", "as_tensor", "zeros", "ones", "empty", "full", "arange", "linspace", "rand", "randn", "randint",
    "from_numpy")}
_CPU_COPIES = {"cpu"}
OWN_COLLECTIVE = ("the program's own collective, on the default group, which this file makes with backend {backends} "
                  "(gloo: CPU only): it cannot carry a tensor on the tpu. Where this one carries the "
                  "accelerator's tensors, make the group with \"tpu_dist\", or pass group= one that can carry "
                  "tpu tensors; CPU tensors are fine")


def ported_collectives(file) -> dict[int, list[tuple[str, int, int, str | None]]]:
    """id(statement) -> (code, line, col, message) of the ported collectives it holds, where a
    fresh tpu run would mark them (message None: the group's problem), and of the program's own
    on a gloo group: in a file (target tpu) that holds a helper the tool added. The statements are
    marked for the walk where their group may not carry tpu tensors."""
    analysis: Analysis = file.analysis
    if file.target != "tpu":
        return {}
    added = {node.name: node for node in analysis.tree.body
             if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and _added(node)}
    if not added:
        return {}  # (nothing the tool wrote: a look at the module-level docstrings)
    guards = {name for name in added if _base(name) == GUARD}
    resolve = analysis.module_scope.resolve
    helpers = {}  # a helper that runs a collective -> the rule that wrote it
    for name, node in added.items():
        code = _COLLECTIVE_HELPERS.get(_base(name))
        if code is not None and _collectives(node.body, resolve):
            helpers[name] = code
    norms = {name for name, node in added.items() if _base(name) == SYNC_BATCH_NORM and isinstance(node, ast.ClassDef)}
    inside_added = {id(node) for top in added.values() for node in ast.walk(top)}
    found: dict[int, list[tuple[str, int, int, str | None]]] = {}
    covered: set[int] = set()  # the collective calls a ported mark stands for
    # The conversions write the plain guard only where a converted launch made the group, never
    # beside a group the file makes with gloo: there it is the program's own.
    inline = not literal_group_backends(file)
    for node in analysis.nodes:
        if not isinstance(node, ast.stmt) or id(node) in inside_added:
            continue
        if isinstance(node, ast.If) and _is_guard(node.test, guards, resolve, inline):
            collectives = [c for c in _collectives(node.body, resolve) if _name_of(c, resolve) in _PORTED]
            if collectives:
                covered.update(map(id, collectives))
                marked = _conversion_start(node, collectives[0], analysis)
                found.setdefault(id(marked), []).append(
                    (_code(node, collectives[0], analysis), *finding_position(collectives[0]), None))
                continue
        for call in _own_calls(node):
            if isinstance(call.func, ast.Name) and call.func.id in helpers:
                found.setdefault(id(node), []).append((helpers[call.func.id], *finding_position(call), None))
        for name in _own_names(node):
            if name.id in norms:
                found.setdefault(id(node), []).append((SYNC_BATCH_NORM_CODE, *finding_position(name), None))
    own = _own_collectives(file, analysis, inside_added | covered, resolve)
    for key, marks in own.items():
        found.setdefault(key, []).extend(marks)
    if found and (own or group_problem(file) is not None):
        for key in found:
            analysis.infos[key].forced = True
        mark_subtrees(analysis.tree.body, analysis.infos)
    return found


def _base(name: str) -> str:
    return name.rstrip("0123456789")


def _added(node) -> bool:
    """A definition an earlier run added: its docstring's marker, or an older output's helper
    without one (`_all_gather`, `SyncBatchNorm`), told by its name and code."""
    if is_added_helper(node):
        return True
    base = _base(node.name)
    if base == "_all_gather":  # older outputs: `if not _process_group(): return value.clone()`
        return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and _base(n.func.id) == GUARD
                   for n in ast.walk(node))
    if base == SYNC_BATCH_NORM and isinstance(node, ast.ClassDef):
        return (ast.get_docstring(node) or "").startswith(_SYNC_BATCH_NORM_DOC)
    return False


def _own_collectives(file, analysis: Analysis, skipped: set[int], resolve) -> dict[int, list]:
    """The program's own tensor collectives on the default group, where the file makes it with a
    literal backend that cannot carry tpu tensors and holds no torch_xla (a tree the tool
    migrated), but those whose tensors are plainly the CPU's."""
    backends = literal_group_backends(file)
    if not backends or any(is_xla(b.qualname) for b in analysis.imports):
        return {}
    message = OWN_COLLECTIVE.format(backends=", ".join(backends))
    found: dict[int, list] = {}
    functions_of = analysis.functions_of
    for node in analysis.nodes:
        if not isinstance(node, ast.stmt) or id(node) in skipped:
            continue
        for call in _own_calls(node):
            if id(call) in skipped or not _on_default_group(call, resolve):
                continue
            if _cpu_tensors(call, functions_of.get(id(node)) or analysis.tree, resolve):
                continue
            code = _TENSOR_COLLECTIVES[_name_of(call, resolve)][1]
            found.setdefault(id(node), []).append((code, *finding_position(call), message))
    return found


def _cpu_tensors(call: ast.Call, scope: ast.AST, resolve) -> bool:
    """The collective's tensor argument is a name that `scope` only ever binds to a tensor made
    on the CPU (a factory without `device=`) or copied there (`.cpu()`)."""
    tensor = call.args[0] if call.args else None
    if not isinstance(tensor, ast.Name):
        return False
    values = [n.value for n in ast.walk(scope) if isinstance(n, ast.Assign) and len(n.targets) == 1
              and isinstance(n.targets[0], ast.Name) and n.targets[0].id == tensor.id]
    return bool(values) and all(_on_cpu(value, resolve) for value in values)


def _on_cpu(value: ast.expr, resolve) -> bool:
    if not isinstance(value, ast.Call):
        return False
    if isinstance(value.func, ast.Attribute) and value.func.attr in _CPU_COPIES and not value.args:
        return True
    dotted = dotted_name(value.func)
    return bool(dotted) and resolve(dotted) in _CPU_FACTORIES and not any(k.arg == "device" for k in value.keywords)


def _marked_already(sc: StatementContext, marks) -> bool:
    """A TODO of each of the statement's rules stands directly above it (an earlier tpu run's,
    whose words may name other lines): it is reported as it stands, as open work."""
    lines, index = sc.file.source_lines, sc.info.first_line - 2
    above = []
    while index >= 0 and lines[index].strip().startswith("#"):
        above.append(lines[index].strip())
        index -= 1
    return all(any(line.startswith(f"{TODO_PREFIX}{code} ") for line in above) for code, *_ in marks)


def _is_guard(test: ast.expr, guards: set[str], resolve, inline: bool) -> bool:
    """`_process_group()`; `inline`: also `dist.is_initialized() and dist.get_world_size() > 1`
    or `dist.get_world_size() > 1` (collectives.world_guard's)."""
    if isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and test.func.id in guards:
        return not test.args and not test.keywords
    if not inline:
        return False
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) and len(test.values) == 2:
        return _calls_dist(test.values[0], "is_initialized", resolve) and _more_than_one(test.values[1], resolve)
    return _more_than_one(test, resolve)


def _more_than_one(test: ast.expr, resolve) -> bool:
    return isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Gt) \
        and _calls_dist(test.left, "get_world_size", resolve) \
        and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value == 1


def _calls_dist(node: ast.expr, name: str, resolve) -> bool:
    dotted = dotted_name(node.func) if isinstance(node, ast.Call) and not node.args and not node.keywords else None
    return bool(dotted) and resolve(dotted) == _DIST + name


def _name_of(call: ast.Call, resolve) -> str | None:
    """The torch.distributed function `call` calls ("all_reduce"), or None."""
    dotted = dotted_name(call.func)
    qualname = resolve(dotted) if dotted else None
    return qualname[len(_DIST):] if qualname and qualname.startswith(_DIST) else None


def _on_default_group(call: ast.Call, resolve) -> bool:
    """A tensor collective of torch.distributed given no group."""
    entry = _TENSOR_COLLECTIVES.get(_name_of(call, resolve))
    return entry is not None and len(call.args) <= entry[0] and not any(k.arg in ("group", None) for k in call.keywords)


def _collectives(body: list[ast.stmt], resolve) -> list[ast.Call]:
    """The tensor collectives on the default group in `body`, in order."""
    found = [node for stmt in body for node in ast.walk(stmt)
             if isinstance(node, ast.Call) and _on_default_group(node, resolve)]
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


def _own_roots(stmt: ast.stmt) -> ast.AST | None:
    """A simple statement, or an `if`'s test (the statements whose TODO the walk writes here:
    ported_collective_statement, ported_collective_block)."""
    return stmt.test if isinstance(stmt, ast.If) else None if hasattr(stmt, "body") or hasattr(stmt, "cases") \
        else stmt


def _own_calls(stmt: ast.stmt) -> list[ast.Call]:
    root = _own_roots(stmt)
    return [] if root is None else [node for node in ast.walk(root) if isinstance(node, ast.Call)]


def _own_names(stmt: ast.stmt) -> list[ast.Name]:
    """The names a simple statement or an `if`'s test reads; a class's bases."""
    root = _own_roots(stmt)
    if isinstance(stmt, ast.ClassDef):
        root = ast.Module(body=[], type_ignores=[])
        root.body = [ast.Expr(base) for base in stmt.bases]
    return [] if root is None else [node for node in ast.walk(root) if isinstance(node, ast.Name)
                                    and isinstance(node.ctx, ast.Load)]


def _mark(sc: StatementContext) -> None:
    plans = sc.file.plans
    marks = plans.ported_collectives.get(id(sc.info.node), ())
    if not marks or id(sc.info.node) in plans.ported_placed or _marked_already(sc, marks):
        return
    plans.ported_placed.add(id(sc.info.node))
    problem = group_problem(sc.file)
    for code, line, col, message in marks:
        if (message or problem) and sc.enabled(code):
            sc.needs_manual(code, message or problem, where=(line, col))


@transform("all_reduce", on="statement", order=-10)
def ported_collective_statement(small, sc: StatementContext):
    """The TODO of a ported collective's group on a simple statement (its conversion's first)."""
    _mark(sc)
    return None


@transform("all_reduce", on="class_header")
def ported_collective_class(stmt: cst.ClassDef, sc: StatementContext):
    """The TODO of a class whose base is the tool's SyncBatchNorm copy."""
    _mark(sc)
    return stmt


@transform("all_reduce", on="if_test")
def ported_collective_block(test: cst.BaseExpression, sc: StatementContext):
    """The TODO of a ported collective's group on the `if _process_group():` block it runs in."""
    _mark(sc)
    return test
