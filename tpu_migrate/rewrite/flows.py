"""Values that flow into calls left to torch_xla: the assignments to keep as they are.

`op = xm.REDUCE_SUM` becomes `op = dist.ReduceOp.SUM` (TPU110), and `dev = xm.xla_device()`
becomes `dev = torch.device("tpu")`; that is right where the name goes to torch code. A call
left manual (`xm.all_reduce(op, tensors, groups=[[0, 1]])`, `xm.reduce_scatter(op, ...)`) is
left byte for byte and still runs torch_xla, which cannot take the converted value (TypeError,
or a device it does not know). So the conversion of such an assignment is half of a change:
the assignment keeps torch_xla's value, with a TODO that names the call holding it back.

Which calls a rule leaves is known only once the rules ran, so the engine rewrites the file,
asks `held_assignments` which assignments feed a call that kept torch_xla, and (if any) rewrites
it again with those assignments held (FileContext.held).
"""

from __future__ import annotations

import ast

from tpu_migrate.findings import Fix, Manual
from tpu_migrate.rewrite.names import Analysis, Scope, StmtInfo, dotted_name, finding_position, is_xla_name
from tpu_migrate.rewrite.parameter_flows import arguments, parameter_for, reaching_parameters


def held_assignments(analysis: Analysis, fixes: list[Fix], manual: list[Manual],
                     holds) -> dict[int, tuple[str, bool]]:
    """id(ast statement) -> (message, whether it is a TODO), for each `name = <torch_xla value>`
    that a rule converted and whose name goes into the arguments of a torch_xla call no rule
    converted. The call may be left for a human (its finding has a TODO: so has the
    assignment) or only not converted in this run (its rule not selected, ignored here, or
    unsafe at --fix-level safe): then both wait for the run that converts them together, and
    the assignment's finding has no TODO comment, which would go stale.
    `holds(qualname, called)`: whether the conversion of that reference (called or not) gives a
    value torch_xla's own calls cannot take (a `dist.ReduceOp`, a `tpu` device), not a plain
    value with torch_xla's meaning (a rank, a count, the tensor a collective returns)."""
    fixed = {(f.line, f.col) for f in fixes}
    # `name = xm.X` / `name = xm.f(...)` whose value a rule converted, by (binding scope, name).
    converted = {key: [info for info, _ in pairs] for key, pairs in
                 _converted(analysis, fixed, lambda ref, called: holds(ref.qualname, called)).items()}
    if not converted:
        return {}
    # Calls of torch_xla names that no fix converted, by the position of their callee (the calls
    # of dotted names found once per analysis).
    if "dotted_calls" not in analysis.memo:
        Call = ast.Call  # the parser makes this class exactly: `type(node) is`
        analysis.memo["dotted_calls"] = {finding_position(node.func): node for node in analysis.nodes
                                         if type(node) is Call and dotted_name(node.func)}
    calls = analysis.memo["dotted_calls"]
    findings = {(m.line, m.col): m for m in manual}
    held: dict[int, str] = {}
    for info in analysis.infos.values():
        for ref in info.refs:
            where = (ref.line, ref.col)
            call = calls.get(where)
            if call is None or not is_xla_name(ref.qualname) or where in fixed:
                continue
            blocker = findings.get(where)
            left = blocker is not None and blocker.todo
            if left:
                message = (f"`{{name}}` is passed to `{ref.dotted}`, which stays torch_xla ({blocker.code}): "
                           "kept as torch_xla's value; convert both together")
            else:
                why = f" ({blocker.code})" if blocker is not None else ""
                message = (f"`{{name}}` is passed to `{ref.dotted}`, which this run does not convert{why}: "
                           "kept as torch_xla's value until a run converts both")
            for name, scope in _names_passed(call, analysis, info):
                for assignment in converted.get((id(scope), name), []):
                    held.setdefault(id(assignment.node), (message.format(name=name), left))
    return held


def _simple_assignment(node: ast.stmt) -> tuple[str | None, ast.expr | None]:
    """(name, value) of `name = value` / `name: T = value` whose value is a dotted name or a
    call of one; else (None, None)."""
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target, value = node.targets[0], node.value
    elif isinstance(node, ast.AnnAssign) and node.value is not None:
        target, value = node.target, node.value
    else:
        return None, None
    if not isinstance(target, ast.Name):
        return None, None
    head = value.func if isinstance(value, ast.Call) else value
    if dotted_name(head) is None:
        return None, None
    return target.id, value


def _names_passed(call: ast.Call, analysis: Analysis, info: StmtInfo):
    """(name, the scope that binds it) for each plain name read in the call's arguments."""
    start = finding_position(call)
    end = (call.end_lineno, call.end_col_offset)
    positions = {finding_position(n) for a in (*call.args, *call.keywords)
                 for n in ast.walk(a) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    for scope, dotted, load_info, line, col in analysis.loads_by_statement.get(id(info), ()):
        if load_info is not info or "." in dotted or (line, col + 1) not in positions:
            continue
        if not (start <= (line, col + 1) <= end):
            continue
        owner = _binding_scope(scope, dotted)
        if owner is not None:
            yield dotted, owner


def _binding_scope(scope: Scope | None, name: str) -> Scope | None:
    """The scope whose own binding of `name` a use in `scope` sees (Python's rules, roughly:
    the innermost function or module scope that assigns it; class bodies are skipped from
    nested scopes)."""
    innermost = True
    while scope is not None:
        if name in scope.global_names:
            return scope.module()
        if name in scope.assigned and (innermost or scope.kind != "class"):
            return scope
        scope, innermost = scope.parent, False
    return None


def passed_to_functions(analysis: Analysis, fixes: list[Fix], manual: list[Manual], holds, changes,
                        imported: tuple, left_elsewhere) -> tuple[dict[int, tuple[str, bool]], dict[int, list]]:
    """The same for a converted value passed to one of the user's own functions, whose parameter
    reaches a torch_xla call (parameter_flows.py): (held, marks). In the file's own functions a
    call no fix converted holds the assignment as `held_assignments` does (`holds`); a value it
    cannot hold (`changes(qualname)`: the code of a rule whose conversion gives another type, a
    DeviceMesh for torch_xla's Mesh) is marked at the call that passes it: id(statement) ->
    [(line, col, code, message)]. `imported`: this file's functions from other modules of the
    project (project_parameters); their calls count where `left_elsewhere(qualname)`: no rule
    converts them there."""
    # Only a call by a bare name (`f(mesh)`) of a module-level function or an imported one, that
    # passes a name the rules converted (held or changed below), looks a function up: the
    # file's own functions so called are read (and the functions they call), the others not.
    if "named_calls" not in analysis.memo:  # the same in every pass of the file
        functions = {node.name for node in analysis.tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
        functions.update(local for local, *_ in imported)  # (`imported` is the file's: the same in each pass)
        Call, Name = ast.Call, ast.Name  # the parser makes these classes exactly: `type(node) is`
        analysis.memo["named_calls"] = [
            node for node in (analysis.nodes if functions else ()) if type(node) is Call and type(node.func) is Name
            and node.func.id in functions and any(type(value) is Name for _, _, value in arguments(node))]
    calls = analysis.memo["named_calls"]
    if not calls:
        return {}, {}
    fixed = {(f.line, f.col) for f in fixes}
    held_values, changed_values = _converted_by(analysis, fixed, (
        lambda ref, called: holds(ref.qualname, called), lambda ref, called: changes(ref.qualname) is not None))
    passed = {name for _, name in held_values} | {name for _, name in changed_values}
    calls = [call for call in calls
             if any(isinstance(value, ast.Name) and value.id in passed for _, _, value in arguments(call))]
    if not calls:
        return {}, {}
    wanted = frozenset(call.func.id for call in calls)
    if ("reaching_parameters", wanted) not in analysis.memo:
        analysis.memo["reaching_parameters", wanted] = reaching_parameters(analysis.tree, wanted, every_import=True)
    own, orders = analysis.memo["reaching_parameters", wanted]
    callees = {name: (orders[name], {param: [(q, c, line, col, None) for q, c, line, col in sinks]
                                     for param, sinks in params.items()})
               for name, params in own.items() if name not in analysis.module_scope.imports}
    for local, module, function, params in imported:
        order = [None] * (max(position for _, position, _ in params) + 1)
        for param, position, _ in params:
            order[position] = param
        callees.setdefault(local, (order, {param: [(q, c, line, None, module) for q, c, line in sinks]
                                           for param, _, sinks in params}))
    if not callees:
        return {}, {}
    findings = {(m.line, m.col): m for m in manual}
    loads = {(line, col + 1): (scope, dotted, info) for scope, dotted, info, line, col in analysis.loads
             if "." not in dotted}
    held: dict[int, tuple[str, bool]] = {}
    marks: dict[int, list] = {}
    for call in calls:
        entry = callees.get(call.func.id)
        if entry is None:
            continue
        order, params = entry
        for position, keyword, value in arguments(call):
            param = parameter_for(order, position, keyword)
            if param is None or not isinstance(value, ast.Name) or param not in params:
                continue
            load = loads.get(finding_position(value))
            if load is None:
                continue
            scope, name, info = load
            owner = _binding_scope(scope, name)
            if owner is None:
                continue
            for qualname, callee, line, col, module in params[param]:
                if module is None and (line, col) in fixed or module is not None and not left_elsewhere(qualname):
                    continue
                # No line numbers: a TODO above a line moves them, and the text must stay the same.
                function = f"`{call.func.id}`" if module is None else f"`{call.func.id}` ({module})"
                assignments = held_values.get((id(owner), name), []) if module is None else []
                if assignments:
                    blocker = findings.get((line, col))
                    left = blocker is not None and blocker.todo
                    message = (f"`{name}` goes to {function}, which passes it to `{callee}`, which "
                               + ("stays torch_xla: kept as torch_xla's value; convert both together" if left else
                                  "this run does not convert: kept as torch_xla's value until a run converts both"))
                    for assignment, _ in assignments:
                        held.setdefault(id(assignment.node), (message, left))
                    break
                for _, ref in changed_values.get((id(owner), name), [])[:1]:
                    code = changes(ref.qualname)
                    message = (f"`{name}` holds the conversion of `{ref.dotted}`, no longer torch_xla's value; "
                               f"{function} passes it to `{callee}`, which takes torch_xla's: port "
                               "that call with this one")
                    mark = (*finding_position(value), code, message)
                    if mark not in marks.get(id(info.node), []):
                        marks.setdefault(id(info.node), []).append(mark)
                break
    return held, marks


def _converted(analysis: Analysis, fixed: set, keep) -> dict[tuple[int, str], list]:
    """(binding scope id, name) -> [(statement, ref)] of `name = <torch_xla value>` that a rule
    converted and `keep(ref, called)` accepts."""
    return _converted_by(analysis, fixed, (keep,))[0]


def _converted_by(analysis: Analysis, fixed: set, keeps: tuple) -> tuple[dict[tuple[int, str], list], ...]:
    """`_converted` for each of `keeps`, in one pass over the file's torch_xla assignments."""
    found: tuple[dict[tuple[int, str], list], ...] = tuple({} for _ in keeps)
    for info, target, ref, called in _xla_assignments(analysis):
        if (ref.line, ref.col) in fixed:
            for keep, kept in zip(keeps, found):
                if keep(ref, called):
                    kept.setdefault((id(info.scope), target), []).append((info, ref))
    return found


def _xla_assignments(analysis: Analysis) -> list[tuple[StmtInfo, str, object, bool]]:
    """(statement, name, ref, whether called) of each `name = xm.X` / `name = xm.f(...)` of the
    file, in its statements' order: found once per analysis (what a pass fixed is asked after;
    the engine's passes over the file and both flows ask of one analysis)."""
    if "xla_assignments" in analysis.memo:
        return analysis.memo["xla_assignments"]
    found = []
    for info in analysis.infos.values():
        if not info.refs:  # most statements: no resolved reference at all
            continue
        target, value = _simple_assignment(info.node)
        if target is None:
            continue
        # The callee, or the function a `partial(f, ...)`-like call binds (its first argument:
        # `policy = partial(size_based_auto_wrap_policy, ...)` goes to torch_xla's FSDP).
        heads = [(value.func, True), *((arg, False) for arg in value.args[:1]
                                       if isinstance(arg, (ast.Name, ast.Attribute)))] \
            if isinstance(value, ast.Call) else [(value, False)]
        for head, called in heads:
            ref = next((r for r in info.refs if (r.line, r.col) == finding_position(head)
                        and is_xla_name(r.qualname)), None)
            if ref is not None:
                found.append((info, target, ref, called))
                break
    analysis.memo["xla_assignments"] = found
    return found
