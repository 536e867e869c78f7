"""Which parameters of a module's functions reach torch_xla calls: where a converted value that a
caller passes in would meet code still written for torch_xla.

`mesh = xs.Mesh(...)` becomes a DeviceMesh (TPU171); a project's own `partition_module(model,
mesh)` (HeegyuKim's torch-xla-SPMD, spmd_util.py) then calls `xs.mark_sharding(w, mesh, spec)`,
which takes torch_xla's Mesh only (AttributeError: get_op_sharding). flows.py keeps or marks a
converted value passed to a torch_xla call that stays; this module gives it the user's functions
as well: for each module-level function, the parameters it passes, as they are, to a torch_xla
call, directly or through another function of the same module.

`reaching_parameters` reads one parsed module (the file being rewritten, for its own functions);
`project_parameters` reads the project's modules once before the rewrite, for the functions a
file imports from another module of the project (the result is part of the rewrite's settings,
as spmd_programs.py's, so a file's cached result is redone when a module it calls changes).
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterable
from pathlib import Path

from tpu_migrate.rewrite.names import dotted_name, finding_position, is_xla_name, walk
from tpu_migrate.rewrite.project import Project
from tpu_migrate.rewrite.spmd_programs import import_statements

# A parameter -> the torch_xla calls it reaches: (qualified name, as written, line, col of the callee).
Sink = tuple[str, str, int, int]
Parameters = dict[str, dict[str, list[Sink]]]  # function -> parameter -> sinks


def reaching_parameters(tree: ast.Module, wanted: Iterable[str] | None = None,
                        every_import: bool = False) -> tuple[Parameters, dict[str, list[str]]]:
    """(function -> parameter -> the torch_xla calls it is passed to, function -> its parameter
    names in order) for the module-level functions of `tree` (`wanted`: those and the functions
    of the module they call only). A parameter the function assigns is not followed (it may hold
    something else by then). The names a call resolves through are the imports of the module's
    statements and of the functions read (`every_import`: of every function, read or not, so
    that the wanted functions come out as a read of every function gives them)."""
    every = {node.name: node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    functions = every
    walked: dict[str, list[ast.AST]] = {}  # each function read walked once: its assigned names, its calls
    if wanted is not None:
        queue = [name for name in wanted if name in functions]
        while queue:
            name = queue.pop()
            if name not in walked:
                walked[name] = list(walk(functions[name]))
                queue.extend(n.func.id for n in walked[name] if isinstance(n, ast.Call)
                             and isinstance(n.func, ast.Name) and n.func.id in functions)
        functions = {name: node for name, node in functions.items() if name in walked}
    nodes = {name: walked[name] if name in walked else list(walk(node)) for name, node in functions.items()}
    # The imports come from the statements alone (an import is one; most of a tree is
    # expressions), in the order a walk of every node meets them: the module's other
    # statements, then each function.
    imports = _imports([*(n for node in tree.body if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                        ast.ClassDef)) for n in import_statements(node)),
                        *(n for function in (every if every_import else functions).values()
                          for n in import_statements(function))])
    orders = {name: _parameter_names(node) for name, node in functions.items()}
    direct: Parameters = {}
    through: dict[str, list[tuple[str, str, str]]] = {}  # f -> (param, callee function, its param)
    for name, node in functions.items():
        params = set(orders[name]) - _assigned(nodes[name])
        for call in (n for n in nodes[name] if isinstance(n, ast.Call)):
            callee = dotted_name(call.func)
            if callee is None:
                continue
            qualname = _qualname(callee, imports)
            for position, keyword, value in arguments(call):
                if not (isinstance(value, ast.Name) and value.id in params):
                    continue
                if qualname is not None and is_xla_name(qualname):
                    line, col = finding_position(call.func)
                    direct.setdefault(name, {}).setdefault(value.id, []).append((qualname, callee, line, col))
                elif callee in functions:
                    target = parameter_for(orders[callee], position, keyword)
                    if target is not None:
                        through.setdefault(name, []).append((value.id, callee, target))
    for _ in range(len(functions)):  # to a fixed point: each pass follows one more call
        grew = False
        for name, edges in through.items():
            for param, callee, target in edges:
                for sink in direct.get(callee, {}).get(target, []):
                    sinks = direct.setdefault(name, {}).setdefault(param, [])
                    if sink not in sinks:
                        sinks.append(sink)
                        grew = True
        if not grew:
            break
    return direct, orders


def parameter_for(order: list[str], position: int | None, keyword: str | None) -> str | None:
    if keyword is not None:
        return keyword if keyword in order else None
    return order[position] if position is not None and position < len(order) else None


def arguments(call: ast.Call):
    """(position, keyword, value) of each argument passed one by one (no *args / **kwargs, and no
    position after a starred one)."""
    for position, arg in enumerate(call.args):
        if isinstance(arg, ast.Starred):
            break
        yield position, None, arg
    for keyword in call.keywords:
        if keyword.arg is not None:
            yield None, keyword.arg, keyword.value


def _parameter_names(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    args = node.args
    return [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]


def _assigned(nodes: list[ast.AST]) -> set[str]:
    return {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _imports(nodes: Iterable[ast.AST]) -> dict[str, str]:
    """Name bound by an import among the nodes -> what it imports (a function's own
    `import torch_xla.distributed.spmd as xs` counts: the summary is a bound, not a resolution)."""
    bound = {}
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound[alias.asname or alias.name.partition(".")[0]] = alias.name if alias.asname else \
                    alias.name.partition(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return bound


def _qualname(dotted: str, imports: dict[str, str]) -> str | None:
    head, _, rest = dotted.partition(".")
    if head not in imports:
        return None
    return f"{imports[head]}.{rest}" if rest else imports[head]


# -- the project ------------------------------------------------------------------------------


def project_parameters(run_files: Iterable[str], root: Path | None, project: Project | None = None) -> tuple:
    """For each file of the project that imports a function of another module of the project
    whose parameters reach torch_xla calls: (its real path, ((name bound in the file, module's
    path relative to the project, function, ((parameter, position, ((qualname, callee, line),
    ...)), ...)), ...)), sorted. Only the files that name torch_xla are read, their `from ...
    import` lines found by a byte search; only the modules they import that name torch_xla are
    parsed. `project`: the project already read (project.py), shared with the other passes."""
    project = project if project is not None else Project(run_files, root)
    texts = {path: project.read(path) for path in project.xla_files()}
    if len(texts) < 2:
        return ()
    # Which module each file imports functions from (defined there: `def name(` in its bytes).
    resolved: dict[str, list[tuple[str, list[tuple[str, str]]]]] = {}
    wanted: dict[str, set[str]] = {}
    for path in sorted(texts):
        for level, module_name, names in project.from_imports(path):
            stem = module_name.replace(".", os.sep)
            module = next((m for m in project.imported_files(path, level, module_name)
                           if m.endswith((stem + ".py", os.path.join(stem, "__init__.py")))), None)
            names = [(name, bound) for name, bound in names if module in texts and module != path
                     and b"def " + name.encode() + b"(" in texts[module]]
            if names:
                resolved.setdefault(path, []).append((module, names))
                wanted.setdefault(module, set()).update(name for name, _ in names)
    summaries = {}
    for module, names in wanted.items():
        tree = project.tree(module, texts[module])
        if tree is not None:
            summaries[module] = reaching_parameters(tree, names)
    found = []
    for path, modules in sorted(resolved.items()):
        imported = []
        for module, names in modules:
            if module not in summaries:
                continue
            reached, orders = summaries[module]
            shown = project.shown(module)
            for name, bound in names:
                params = reached.get(name)
                if params:
                    imported.append((bound, shown, name, tuple(
                        (param, orders[name].index(param), tuple((q, c, line) for q, c, line, _ in sinks))
                        for param, sinks in sorted(params.items()))))
        if imported:
            found.append((path, tuple(sorted(imported))))
    return tuple(found)


__all__ = ["reaching_parameters", "project_parameters", "parameter_for", "arguments", "Sink", "Parameters"]
