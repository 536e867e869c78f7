"""Decisions that span statements, made on `ast` before any rewriting.

Some rewrites touch two places: `xmp.spawn(fn, ...)` changes the call and the start of `fn`, and
`loader = pl.MpDeviceLoader(...)` changes the assignment and every loop over `loader`. The walker
meets those places in source order, so whether such a rewrite is possible must be known up front:
both halves are applied, or neither.
"""

from __future__ import annotations

import ast
from collections import Counter
from dataclasses import dataclass, field

from tpu_migrate.rewrite.names import Analysis, Scope, StmtInfo, finding_position, mark_subtrees
from tpu_migrate.rewrite.registry import emits

SPAWN_NAMES = frozenset(
    {"torch_xla.distributed.xla_multiprocessing.spawn", "torch_xla.launch"}
)
MP_DEVICE_LOADER = "torch_xla.distributed.parallel_loader.MpDeviceLoader"
PARALLEL_LOADER = "torch_xla.distributed.parallel_loader.ParallelLoader"


@dataclass(frozen=True)
class Worker:
    """What a launch starts: a function of this file, or a reason to leave the launch alone."""
    name: str | None = None
    refusal: str | None = None


@dataclass
class Plans:
    # id(ast statement of the spawn call) -> name of the worker function to set up
    spawn_workers: dict[int, str] = field(default_factory=dict)
    # id(ast statement of a spawn call left for a human) -> why
    spawn_refusals: dict[int, str] = field(default_factory=dict)
    # id(ast statement) -> what the launch in it starts (`spawn_worker`), for each statement that
    # is a launch call: kept_launches.py asks again of the same statements.
    launch_workers: dict[int, Worker] = field(default_factory=dict)
    # Every call of something named `init_process_group` in the file (`init_process_group_calls`).
    group_calls: list[ast.Call] = field(default_factory=list)
    # (id(scope), name) of variables bound to a device loader that are only iterated
    loader_vars: set[tuple[int, str]] = field(default_factory=set)
    # The file creates a process group other than with the "xla" backend (set when it
    # launches workers): the launcher then leaves the group to the program.
    other_inits: bool = False
    # ids of the statements under an `if __name__ == "__main__":` (set when it launches workers)
    main_guarded: set[int] = field(default_factory=set)
    # Workers whose own body starts the "xla" process group on every path (TPU070 converts it).
    self_initializing: set[str] = field(default_factory=set)
    # (id(scope), name) of loader variables whose loops can iterate the plain loader itself
    # (a name nothing rebinds afterwards): the variable and its assignment go.
    inline_loaders: dict[tuple[int, str], str] = field(default_factory=dict)
    # The backends (source text; None: the default) of the file's `init_process_group` calls
    # other than "xla" ones, which TPU070 converts: the groups the program makes itself.
    group_backends: list[str | None] = field(default_factory=list)
    # What shows that the file's library makes process groups of its own, maybe with a backend
    # other than TorchTPU's, for the default group its collectives run on: `new_group` calls
    # with another backend, process groups handed in (`cpu_group`, `group: ProcessGroup`).
    # None until a converted collective asks (`library_groups`).
    library_groups: list[str] | None = None
    # Workers that only the converted launch runs, always in its process group: private
    # module-level functions the file names nowhere but at the launch (named_expressions.py).
    joined_workers: set[str] = field(default_factory=set)
    # id(statement) -> (line, col, method) of each `model.get_shard_metadata()` and
    # `model.clip_grad_norm_(...)` in it, in a file that
    # wraps a model with torch_xla's FSDP (transforms/fsdp_checkpoints.py).
    shard_metadata_reads: dict[int, list[tuple[int, int, str]]] = field(default_factory=dict)
    # id(statement) -> (line, col, wrapped, attribute, unwraps) of each read of torch_xla's FSDP
    # wrapper's surface (`.module.module`, `no_sync`) on the model TPU173 converts
    # (transforms/fsdp_models.py).
    wrapped_model_reads: dict[int, list[tuple[int, int, str, str, int]]] = field(default_factory=dict)
    # id(statement) -> (line, col) of each `optimizer.step(found_inf=...)` in it, in a file that
    # uses torch_xla's sync-free optimizers (transforms/amp_compile.py).
    found_inf_steps: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    # id(statement) -> (line, col, mesh, attribute) of each torch_xla Mesh attribute read on a
    # mesh TPU171 converts (transforms/spmd.py).
    mesh_attribute_reads: dict[int, list[tuple[int, int, str, str]]] = field(default_factory=dict)
    # id(`for` statement) -> the model's name, for the loops that mark each of an SPMD model's
    # parameters and become fully_shard (transforms/spmd_parameters.py).
    sharded_parameter_loops: dict[int, str] = field(default_factory=dict)
    # id(statement) -> (code, line, col) of each collective an earlier run ported from torch_xla's
    # in it, where a fresh tpu run marks its group (transforms/collectives_ported.py).
    ported_collectives: dict[int, list[tuple[str, int, int]]] = field(default_factory=dict)
    ported_placed: set[int] = field(default_factory=set)  # those whose TODO the walk wrote
    # id(`xs.mark_sharding(param, ...)` statement) -> why its loop over a model's parameters stays.
    parameter_mark_refusals: dict[int, str] = field(default_factory=dict)

    @property
    def workers(self) -> set[str]:
        return set(self.spawn_workers.values())

    @property
    def launcher_group(self) -> bool:
        """Every worker the file's launch starts joins the default group the converted launcher
        makes: its collectives reach every process, as torch_xla's did."""
        return bool(self.spawn_workers) and not self.other_inits

    def under_main_guard(self, node: ast.stmt) -> bool:
        return id(node) in self.main_guarded


@emits("TPU060", "TPU040")  # the spawn and device loader rules plan here
def make_plans(analysis: Analysis, canonical, enabled) -> Plans:
    """`enabled(code, info)` tells whether a rule may run on a statement."""
    plans = Plans()
    for info in analysis.infos.values():
        node = info.node
        if not info.refs:
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            worker = spawn_worker(node.value, info, analysis, canonical)
            if worker is not None:
                plans.launch_workers[id(node)] = worker
            if worker is not None and worker.refusal is not None:
                plans.spawn_refusals[id(node)] = worker.refusal
            elif worker is not None and enabled("TPU060", info):
                plans.spawn_workers[id(node)] = worker.name
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                qualname = _call_qualname(node.value, info, canonical)
                if qualname == MP_DEVICE_LOADER and enabled("TPU040", info):
                    name = node.targets[0].id
                    loops = _loops_over(analysis, info.scope, name)
                    if loops:
                        plans.loader_vars.add((id(info.scope), name))
                        for loop in loops:
                            loop.forced = True
                        loader = _inline_loader(analysis, node, [loop.node for loop in loops], info.scope)
                        if loader is not None:
                            plans.inline_loaders[(id(info.scope), name)] = loader
    plans.group_calls = init_process_group_calls(analysis.nodes)
    plans.group_backends = [
        None if backend is None else ast.unparse(backend)
        for backend in map(_backend_arg, plans.group_calls)
        if not (isinstance(backend, ast.Constant) and backend.value == "xla")
    ]
    if plans.loader_vars:
        mark_subtrees(analysis.tree.body, analysis.infos)
    if plans.spawn_workers:
        plans.other_inits = any(not is_xla_backend_init(call) for call in plans.group_calls)
        plans.main_guarded = _main_guarded(analysis.tree)
        for name in plans.workers:
            if any(_starts_xla_group(stmt) for stmt in analysis.functions[name].body):
                plans.self_initializing.add(name)
        if plans.launcher_group:
            launches = [info.node for info in analysis.infos.values() if id(info.node) in plans.spawn_workers]
            plans.joined_workers = _only_launched(analysis.tree, launches, plans.workers)
    return plans


def _only_launched(tree: ast.Module, launches: list[ast.stmt], workers: set[str]) -> set[str]:
    """The workers that are private (`_mp_fn`), defined once, and named once in the file: in
    their launch's statement. No other code, here or in a module importing it, calls them
    outside the process group."""
    private = {name for name in workers if name.startswith("_")}

    def uses(nodes) -> Counter:
        return Counter(node.id for root in nodes for node in ast.walk(root)
                       if isinstance(node, ast.Name) and node.id in private)

    everywhere, at_launch = uses([tree]), uses(launches)
    defined = Counter(node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))
    return {name for name in private if everywhere[name] == at_launch[name] == 1 and defined[name] == 1}


def _inline_loader(analysis: Analysis, assign: ast.Assign, loops: list[ast.stmt], scope: Scope) -> str | None:
    """The loader's name when `alias = MpDeviceLoader(loader, device)` can go and its loops
    iterate `loader` directly with the same result: `loader` is a name that nothing binds from
    the assignment on, `alias` is bound only there, no `global` / `nonlocal` names either, and
    every loop runs after the assignment (in a later statement of the same block)."""
    call = assign.value
    loader = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "loader"), None)
    alias = assign.targets[0].id
    if not isinstance(loader, ast.Name) or loader.id == alias or scope.kind not in ("function", "module"):
        return None
    tree = analysis.tree
    if {loader.id, alias} & analysis.declared_names:
        return None
    owner = analysis.blocks.get(id(assign))
    if owner is None:
        return None
    block, index = owner
    later = block[index + 1 :]
    if not all(any(loop is n for stmt in later for n in ast.walk(stmt)) for loop in loops):
        return None
    function = enclosing_function(analysis, assign)
    stores = _stores(function.body if function is not None else tree.body)
    if any(name == loader.id and line >= assign.lineno for name, line in stores):
        return None
    if sum(name == alias for name, _ in stores) != 1:
        return None
    return loader.id


def enclosing_function(analysis: Analysis, target: ast.stmt):
    """The innermost function holding `target` (a statement of the analysed tree), or None at module level."""
    return analysis.functions_of.get(id(target))


_OWN_SCOPE = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda,
              ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _stores(body: list[ast.stmt]) -> list[tuple[str, int]]:
    """(name, line) of the bindings made in a scope's own body (nested scopes left out)."""
    found: list[tuple[str, int]] = []
    for node in own_nodes(body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.append((node.name, node.lineno))
        elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            found.append((node.id, node.lineno))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            found.extend(((a.asname or a.name).partition(".")[0], node.lineno) for a in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            found.append((node.name, node.lineno))
        elif isinstance(node, ast.NamedExpr):
            found.append((node.target.id, node.lineno))
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            found.append((node.name, node.lineno))
        elif isinstance(node, ast.MatchMapping) and node.rest:
            found.append((node.rest, node.lineno))
    return found


def own_nodes(body: list[ast.stmt]):
    """The nodes of a scope's own body: a nested function or class is met (with its
    decorators), its body is not; lambdas and comprehensions are left out."""
    stack: list[ast.AST] = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node
            stack.extend(node.decorator_list)
        elif not isinstance(node, _OWN_SCOPE):
            yield node
            stack.extend(ast.iter_child_nodes(node))


def init_process_group_calls(nodes) -> list[ast.Call]:
    """Every call of something named `init_process_group` among `nodes` (an ast.walk), however
    it was imported."""
    calls = []
    for node in nodes:
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name == "init_process_group":
                calls.append(node)
    return calls


# Backends that carry tpu tensors (TorchTPU's), and parameter names that libraries give the
# process groups they make and hand to their communicators (vLLM, SGLang: `cpu_group` is gloo).
TPU_BACKENDS = frozenset({"tpu_dist", "tpu"})
_GROUP_PARAMETERS = frozenset({"cpu_group", "device_group", "process_group"})


def library_groups(nodes) -> list[str]:
    """What among `nodes` (an ast.walk) shows process groups that the file's library makes with
    a backend of its choosing: `new_group(..., backend="gloo")` (any literal backend but
    TorchTPU's), and function parameters that hand in a group (named `cpu_group`,
    `device_group`, `process_group`, or annotated `ProcessGroup`), each with its line."""
    found = []
    for node in nodes:
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            backend = node.args[2] if name == "new_group" and len(node.args) > 2 else next(
                (k.value for k in node.keywords if k.arg == "backend"), None) if name == "new_group" else None
            if isinstance(backend, ast.Constant) and isinstance(backend.value, str) \
                    and backend.value not in TPU_BACKENDS:
                found.append(f'`{ast.unparse(node.func)}(..., backend="{backend.value}")` (line {node.lineno})')
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            arguments = node.args
            for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
                annotated = arg.annotation is not None and "ProcessGroup" in ast.unparse(arg.annotation)
                if arg.arg in _GROUP_PARAMETERS or annotated:
                    found.append(f"the process group `{arg.arg}` handed in (line {arg.lineno})")
    return found


def _starts_xla_group(stmt: ast.stmt) -> bool:
    """`dist.init_process_group("xla", ...)` as a statement of its own."""
    return (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
            and init_process_group_calls(ast.walk(stmt)) == [stmt.value] and is_xla_backend_init(stmt.value))


def is_xla_backend_init(call: ast.Call) -> bool:
    """`init_process_group("xla", ...)`: TPU070 converts it (and guards it in files whose
    workers the launcher already put in a group)."""
    backend = _backend_arg(call)
    return isinstance(backend, ast.Constant) and backend.value == "xla"


def _backend_arg(call: ast.Call) -> ast.expr | None:
    """The backend argument of an `init_process_group` call (None: not given)."""
    return call.args[0] if call.args else next(
        (k.value for k in call.keywords if k.arg == "backend"), None
    )


def _main_guarded(tree: ast.Module) -> set[int]:
    guarded: set[int] = set()
    for stmt in tree.body:
        if isinstance(stmt, ast.If) and _is_main_test(stmt.test):
            guarded.update(id(node) for node in ast.walk(stmt) if isinstance(node, ast.stmt))
    return guarded


def main_guard_only(analysis: Analysis, worker: str) -> list[tuple[str, str | None]]:
    """What a worker finds in a forked child and a spawned one lacks: the names only the file's
    `if __name__ == "__main__":` binds. A spawned child imports the file under another name, so
    that block does not run there. (name, the function that reads it): the worker itself (None),
    or a global that its code reads, directly or through the file's module-level functions it
    calls. Methods of classes are not followed."""
    tree = analysis.tree
    guards = [s for s in tree.body if isinstance(s, ast.If) and _is_main_test(s.test)]
    if not guards:
        return []
    guard_ids = {id(g) for g in guards}
    # Statements the import runs in a spawned child: everything but the guards' bodies (their
    # `else:` runs there).
    outside = [s for s in tree.body if id(s) not in guard_ids] + [s for g in guards for s in g.orelse]
    only = {name for g in guards for name, _ in _stores(g.body)} - {name for name, _ in _stores(outside)}
    # A name some function declares `global` may be bound by the worker's own path
    # (`global FLAGS; FLAGS = flags` in the worker): not judged.
    only -= {name for node in analysis.nodes if isinstance(node, ast.Global) for name in node.names}
    missing: list[tuple[str, str | None]] = [(worker, None)] if worker in only else []
    seen, queue = {worker}, [worker]
    while queue:
        reader = queue.pop(0)
        function = analysis.functions.get(reader)
        for name in sorted(_global_reads(function)) if function is not None else ():
            if name in only and all(name != known for known, _ in missing):
                missing.append((name, reader))
            elif name in analysis.functions and name not in seen:
                seen.add(name)
                queue.append(name)
    return missing


def _global_reads(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """The names a function's code reads that none of its own scopes binds (nested functions,
    lambdas and comprehensions counted as its own): its globals and builtins."""
    nodes = list(ast.walk(function))
    declared = {name for node in nodes if isinstance(node, ast.Global) for name in node.names}
    bound = {arg.arg for node in nodes if isinstance(node, ast.arguments)
             for arg in (*node.posonlyargs, *node.args, *node.kwonlyargs, node.vararg, node.kwarg)
             if arg is not None}
    for node in nodes:
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node is not function:
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).partition(".")[0] for a in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    reads = {node.id for node in nodes if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
    return reads - (bound - declared)


def _is_main_test(test: ast.expr) -> bool:
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    return any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides) and any(
        isinstance(s, ast.Constant) and s.value == "__main__" for s in sides
    )


def _call_qualname(call: ast.Call, info: StmtInfo, canonical) -> str | None:
    from tpu_migrate.rewrite.names import dotted_name

    dotted = dotted_name(call.func)
    if dotted is None:
        return None
    qualname = info.scope.resolve(dotted, info.position)
    return canonical(qualname) if qualname else None


def spawn_worker(call: ast.Call, info: StmtInfo, analysis: Analysis, canonical) -> Worker | None:
    """The worker function an `xmp.spawn` / `torch_xla.launch` call starts, or why it cannot
    be converted; None for another call."""
    statement = info.node
    if _call_qualname(call, info, canonical) not in SPAWN_NAMES:
        return None
    if any(isinstance(a, ast.Starred) for a in call.args) or any(
        k.arg is None for k in call.keywords
    ):
        return Worker(refusal="the call passes *args or **kwargs")
    fn = call.args[0] if call.args else next(
        (k.value for k in call.keywords if k.arg == "fn"), None
    )
    if fn is None:
        return Worker(refusal="the call names no worker function")
    if not isinstance(fn, ast.Name):
        return Worker(refusal=f"the worker `{ast.unparse(fn)}` is not a plain name of this file (an "
                      "attribute of another module, a lambda, a call ...)")
    if info.scope.lookup(fn.id, info.position) is not None:
        return Worker(refusal=f"the worker `{fn.id}` is imported from another module")
    name = fn.id if fn.id in analysis.functions else _aliased_function(fn, statement, analysis)
    if name is None:
        return Worker(refusal=f"`{fn.id}` is neither a module-level function of this file nor a "
                      "name assigned one exactly once (`fn = worker`)")
    worker = analysis.functions[name]
    if not (worker.args.posonlyargs or worker.args.args or worker.args.vararg):
        return Worker(refusal=f"the worker `{name}` takes no parameter for the process index")
    nprocs = next((k.value for k in call.keywords if k.arg == "nprocs"), None)
    if nprocs is None and len(call.args) >= 3:
        nprocs = call.args[2]
    if nprocs is not None and not is_simple(nprocs):
        return Worker(refusal="nprocs is an expression that may not be repeated: assign it to a name first")
    return Worker(name=name)


def _aliased_function(fn: ast.Name, statement: ast.stmt, analysis: Analysis) -> str | None:
    """The module-level function that `fn` names through one plain assignment before the
    launch (`fn = _mp_fn`), in the launch's own function or else at module level; None when
    `fn` is bound any other way (a parameter, twice, `global`, a loop target ...)."""
    tree = analysis.tree
    if fn.id in analysis.declared_names:
        return None
    function = enclosing_function(analysis, statement)
    bodies = [tree.body]
    if function is not None:
        params = function.args
        every = [*params.posonlyargs, *params.args, *params.kwonlyargs, params.vararg, params.kwarg]
        if any(p is not None and p.arg == fn.id for p in every):
            return None
        # A function nested in another (or in a class) could see an enclosing binding instead.
        bodies = [function.body] + ([tree.body] if any(s is function for s in tree.body) else [])
    for body in bodies:
        bindings = [name for name, _ in _stores(body) if name == fn.id]
        if not bindings:
            continue
        assigns = [n for n in own_nodes(body) if isinstance(n, ast.Assign)
                   and any(isinstance(t, ast.Name) and t.id == fn.id for t in n.targets)]
        if len(bindings) != 1 or len(assigns) != 1:
            return None
        assign = assigns[0]
        if (
            len(assign.targets) != 1
            or not isinstance(assign.value, ast.Name) or assign.value.id not in analysis.functions
            or (body is not tree.body and assign.lineno > statement.lineno)
        ):
            return None
        return assign.value.id
    return None


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
    for load_scope, dotted, info, line, col in analysis.loads_by_head.get(name, ()):
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
        if finding_position(iterable) != (line, col + 1):
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
