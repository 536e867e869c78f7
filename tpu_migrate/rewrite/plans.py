"""Decisions that span statements, made on `ast` before any rewriting.

Some rewrites touch two places: `xmp.spawn(fn, ...)` changes the call and the start of `fn`, and
`loader = pl.MpDeviceLoader(...)` changes the assignment and every loop over `loader`. The walker
meets those places in source order, so whether such a rewrite is possible must be known up front:
both halves are applied, or neither.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from tpu_migrate.rewrite.names import Analysis, Scope, StmtInfo, mark_subtrees

SPAWN_NAMES = frozenset(
    {"torch_xla.distributed.xla_multiprocessing.spawn", "torch_xla.launch"}
)
MP_DEVICE_LOADER = "torch_xla.distributed.parallel_loader.MpDeviceLoader"
PARALLEL_LOADER = "torch_xla.distributed.parallel_loader.ParallelLoader"


@dataclass
class Plans:
    # id(ast statement of the spawn call) -> name of the worker function to set up
    spawn_workers: dict[int, str] = field(default_factory=dict)
    # (id(scope), name) of variables bound to a device loader that are only iterated
    loader_vars: set[tuple[int, str]] = field(default_factory=set)
    # The file creates a process group other than with the "xla" backend (set when it
    # launches workers): the launcher then leaves the group to the program.
    other_inits: bool = False
    # ids of the statements under an `if __name__ == "__main__":` (set when it launches workers)
    main_guarded: set[int] = field(default_factory=set)
    # Workers whose own body starts the "xla" process group on every path (TPU070 converts it).
    self_initializing: set[str] = field(default_factory=set)

    @property
    def workers(self) -> set[str]:
        return set(self.spawn_workers.values())

    def under_main_guard(self, node: ast.stmt) -> bool:
        return id(node) in self.main_guarded


def make_plans(analysis: Analysis, canonical, enabled) -> Plans:
    """`enabled(code, info)` tells whether a rule may run on a statement."""
    plans = Plans()
    for info in analysis.infos.values():
        node = info.node
        if not info.refs:
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            worker = _spawn_worker(node.value, info.scope, analysis, canonical)
            if worker and enabled("TPU060", info):
                plans.spawn_workers[id(node)] = worker
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                qualname = _call_qualname(node.value, info.scope, canonical)
                if qualname == MP_DEVICE_LOADER and enabled("TPU040", info):
                    name = node.targets[0].id
                    loops = _loops_over(analysis, info.scope, name)
                    if loops:
                        plans.loader_vars.add((id(info.scope), name))
                        for loop in loops:
                            loop.forced = True
    if plans.loader_vars:
        mark_subtrees(analysis.tree.body, analysis.infos)
    if plans.spawn_workers:
        plans.other_inits = any(
            not is_xla_backend_init(call) for call in init_process_group_calls(analysis.tree)
        )
        plans.main_guarded = _main_guarded(analysis.tree)
        for name in plans.workers:
            if any(_starts_xla_group(stmt) for stmt in analysis.functions[name].body):
                plans.self_initializing.add(name)
    return plans


def init_process_group_calls(tree: ast.AST) -> list[ast.Call]:
    """Every call of something named `init_process_group`, however it was imported."""
    calls = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name == "init_process_group":
                calls.append(node)
    return calls


def _starts_xla_group(stmt: ast.stmt) -> bool:
    """`dist.init_process_group("xla", ...)` as a statement of its own."""
    return (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
            and init_process_group_calls(stmt) == [stmt.value] and is_xla_backend_init(stmt.value))


def is_xla_backend_init(call: ast.Call) -> bool:
    """`init_process_group("xla", ...)`: TPU070 converts it (and guards it in files whose
    workers the launcher already put in a group)."""
    backend = call.args[0] if call.args else next(
        (k.value for k in call.keywords if k.arg == "backend"), None
    )
    return isinstance(backend, ast.Constant) and backend.value == "xla"


def _main_guarded(tree: ast.Module) -> set[int]:
    guarded: set[int] = set()
    for stmt in tree.body:
        if isinstance(stmt, ast.If) and _is_main_test(stmt.test):
            guarded.update(id(node) for node in ast.walk(stmt) if isinstance(node, ast.stmt))
    return guarded


def _is_main_test(test: ast.expr) -> bool:
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    return any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides) and any(
        isinstance(s, ast.Constant) and s.value == "__main__" for s in sides
    )


def _call_qualname(call: ast.Call, scope: Scope, canonical) -> str | None:
    from tpu_migrate.rewrite.names import dotted_name

    dotted = dotted_name(call.func)
    if dotted is None:
        return None
    qualname = scope.resolve(dotted)
    return canonical(qualname) if qualname else None


def _spawn_worker(call: ast.Call, scope: Scope, analysis: Analysis, canonical) -> str | None:
    if _call_qualname(call, scope, canonical) not in SPAWN_NAMES:
        return None
    if any(isinstance(a, ast.Starred) for a in call.args) or any(
        k.arg is None for k in call.keywords
    ):
        return None
    fn = call.args[0] if call.args else next(
        (k.value for k in call.keywords if k.arg == "fn"), None
    )
    if not isinstance(fn, ast.Name) or fn.id not in analysis.functions:
        return None
    if scope.lookup(fn.id) is not None:  # an imported name, not the module's def
        return None
    worker = analysis.functions[fn.id]
    if not (worker.args.posonlyargs or worker.args.args):
        return None  # the worker must accept the process index
    nprocs = next((k.value for k in call.keywords if k.arg == "nprocs"), None)
    if nprocs is None and len(call.args) >= 3:
        nprocs = call.args[2]
    if nprocs is not None and not is_simple(nprocs):
        return None
    return fn.id


def is_simple(node: ast.expr) -> bool:
    """An expression that may be repeated: a constant, a name, `a.b`, `a[k]`."""
    if isinstance(node, (ast.Constant, ast.Name)):
        return True
    if isinstance(node, ast.Attribute):
        return is_simple(node.value)
    if isinstance(node, ast.Subscript):
        return is_simple(node.value) and is_simple(node.slice)
    return False


def _loops_over(analysis: Analysis, scope: Scope, name: str) -> list[StmtInfo]:
    """The `for` statements iterating `name`, when they are its only uses in `scope`."""
    loops: list[StmtInfo] = []
    for load_scope, dotted, info, line, col in analysis.loads:
        if dotted.partition(".")[0] != name:
            continue
        if load_scope is not scope:
            if _sees(load_scope, scope, name):
                return []  # used from a nested function, lambda or comprehension
            continue
        node = info.node
        if not isinstance(node, (ast.For, ast.AsyncFor)):
            return []
        iterable = node.iter
        if (
            isinstance(iterable, ast.Call)
            and isinstance(iterable.func, ast.Name)
            and iterable.func.id == "enumerate"
            and iterable.args
        ):
            iterable = iterable.args[0]
        if not (isinstance(iterable, ast.Name) and iterable.id == name and dotted == name):
            return []
        if (iterable.lineno, iterable.col_offset + 1) != (line, col + 1):
            return []
        loops.append(info)
    return loops


def _sees(inner: Scope, outer: Scope, name: str) -> bool:
    """Whether `name` in scope `inner` refers to `outer`'s binding."""
    scope: Scope | None = inner
    while scope is not None and scope is not outer:
        if name in scope.assigned or name in scope.imports:
            return False
        scope = scope.parent
    return scope is outer
