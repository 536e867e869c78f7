"""SPMD (rules/spmd.toml) in FSDP style without the wrapper (TPU185): the model's parameters marked one by one.

    for name, param in model.named_parameters():
        xs.mark_sharding(param, mesh, ("fsdp",) + (None,) * (param.dim() - 1))

Under SPMD a parameter's sharding is a layout, not a number: the program computes as on one
device whatever the specs say. After TPU170 the program runs once per device, each process
reading its slice of the batch (TPU184), so the same computation needs the parameters' gradients
averaged over the processes, which FSDP2 does; the loop becomes `_fully_shard(_global_batch_norm(
model))` (TPU179's helpers). FSDP2 replaces the parameters, so an optimizer made from them
before the loop would step stale tensors: the loop converts only where nothing before it in its
function (or module) reads the model's parameters, and where the model is a local name, not a
parameter of the function (whose callers cannot be seen).
"""

from __future__ import annotations

import ast

import libcst as cst

from tpu_migrate.rewrite.context import StatementContext, parse_stmt
from tpu_migrate.rewrite.names import Analysis, mark_subtrees
from tpu_migrate.rewrite.plans import enclosing_function
from tpu_migrate.rewrite.registry import rule_code, transform
from tpu_migrate.rewrite.transforms.fsdp import SPMD_FSDP, fully_shard_helper
from tpu_migrate.rewrite.transforms.spmd import global_batch_norm

RULE = rule_code("TPU185")
USE_SPMD = "torch_xla.runtime.use_spmd"
MARK_SHARDING = "torch_xla.distributed.spmd.mark_sharding"
_WALKS = frozenset({"parameters", "named_parameters"})
# Calls a test in the loop may make: reads of the parameter's shape, the name's text.
_READS = frozenset({"len", "isinstance", "hasattr", "dim", "size", "numel", "startswith", "endswith"})


def parameter_marking_loops(analysis: Analysis, canonical, enabled) -> tuple[dict[int, str], dict[int, str]]:
    """(id(`for` statement) -> the model's name, for each loop that only marks the model's
    parameters' sharding and may become `fully_shard` (see the module's docstring), in an SPMD
    program (`xr.use_spmd()`); id(mark statement) -> why its loop stays, for the marks of the
    other loops over a model's parameters). The loops that convert are marked for the walk.
    `enabled(code, info)`: the rule may fix there."""
    if MARK_SHARDING not in analysis.qualnames or SPMD_FSDP in analysis.qualnames:
        return {}, {}  # with the wrapper (TPU179), marks of its parameters are another matter
    spmd = USE_SPMD in analysis.qualnames  # a rewritten file has lost it: its marks still say why
    loops, refusals = {}, {}
    for node in analysis.nodes:
        if not isinstance(node, ast.For) or not enabled(RULE, analysis.info(node)):
            continue
        model, param = _walked_parameters(node)
        if model is None:
            continue
        marks = _marks(node.body, param, analysis, canonical)
        why = None
        if not marks:
            why = (f"the loop does more than mark `{model}`'s parameters: keep the rest, and call FSDP2's "
                   f"fully_shard({model}) after it in place of the marks, before any optimizer takes the parameters")
        elif not _made_here(model, node, enclosing_function(analysis, node)):
            why = (f"`{model}` comes from a caller the rewrite cannot see: call FSDP2's fully_shard({model}) "
                   "where it is made, before any optimizer takes its parameters")
        elif _read_before(model, node, enclosing_function(analysis, node) or analysis.tree):
            why = (f"code before the loop reads `{model}`'s parameters (an optimizer made first?), and FSDP2 "
                   f"replaces them: make the optimizer after the loop, and the loop becomes fully_shard({model})")
        if why is None and spmd:
            loops[id(node)] = model
            analysis.info(node).forced = True
        elif why is not None:
            refusals.update((id(mark), why) for mark in _mark_statements(node.body, param, analysis, canonical))
    if loops:
        mark_subtrees(analysis.tree.body, analysis.infos)
    return loops, refusals


def _walked_parameters(loop: ast.For) -> tuple[str | None, str | None]:
    """(`model`, `param`) of `for [name,] param in model.[named_]parameters():`, else Nones."""
    call = loop.iter
    if not (isinstance(call, ast.Call) and not call.args and not call.keywords
            and isinstance(call.func, ast.Attribute) and call.func.attr in _WALKS
            and isinstance(call.func.value, ast.Name)) or loop.orelse:
        return None, None
    target = loop.target
    if call.func.attr == "named_parameters":
        if not (isinstance(target, ast.Tuple) and len(target.elts) == 2):
            return None, None
        target = target.elts[1]
    if not isinstance(target, ast.Name):
        return None, None
    return call.func.value.id, target.id


def _mark_statements(body: list[ast.stmt], param: str, analysis: Analysis, canonical) -> list[ast.stmt]:
    return [stmt for node in body for stmt in ast.walk(node)
            if isinstance(stmt, ast.Expr) and _is_mark(stmt, param, analysis, canonical)]


def _is_mark(stmt: ast.Expr, param: str, analysis: Analysis, canonical) -> bool:
    """`xs.mark_sharding(param, ...)` as a statement."""
    call = stmt.value
    if not isinstance(call, ast.Call):
        return False
    refs = {ref.dotted: ref.qualname for ref in analysis.info(stmt).refs}
    return (canonical(refs.get(ast.unparse(call.func), "")) == MARK_SHARDING and bool(call.args)
            and isinstance(call.args[0], ast.Name) and call.args[0].id == param)


def _marks(body: list[ast.stmt], param: str, analysis: Analysis, canonical) -> int | None:
    """How many `xs.mark_sharding(param, ...)` statements `body` holds, if it holds nothing else
    (`if` / `else` on tests that only read, `pass`, `continue`); else None."""
    count = 0
    for stmt in body:
        if isinstance(stmt, (ast.Pass, ast.Continue)):
            continue
        if isinstance(stmt, ast.If) and _only_reads(stmt.test):
            inner = [_marks(stmt.body, param, analysis, canonical), _marks(stmt.orelse, param, analysis, canonical)]
            if None in inner:
                return None
            count += sum(inner)
            continue
        if not (isinstance(stmt, ast.Expr) and _is_mark(stmt, param, analysis, canonical)):
            return None
        count += 1
    return count


def _only_reads(test: ast.expr) -> bool:
    for node in ast.walk(test):
        if isinstance(node, (ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom, ast.Lambda)):
            return False
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
            if name not in _READS:
                return False
    return True


def _made_here(model: str, loop: ast.For, function) -> bool:
    """The model is a name the loop's function (or module: `function` None) binds itself before
    the loop, not only a parameter of the function (made by callers the rewrite does not see)."""
    if function is None:
        return True
    arguments = function.args
    names = {a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)}
    names |= {a.arg for a in (arguments.vararg, arguments.kwarg) if a is not None}
    if model not in names:
        return True
    return any(isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id == model
               and node.lineno < loop.lineno for stmt in function.body for node in ast.walk(stmt))


def _read_before(model: str, loop: ast.For, scope) -> bool:
    """Whether code of the loop's function (or module) `scope` that runs before it reads the
    model's parameters (`torch.optim.AdamW(model.parameters())`): FSDP2 would replace them under it."""
    for stmt in scope.body:
        if stmt.lineno >= loop.lineno:
            break
        for node in ast.walk(stmt):
            if (isinstance(node, ast.Attribute) and node.lineno < loop.lineno and node.attr in _WALKS | {"state_dict"}
                    and isinstance(node.value, ast.Name) and node.value.id == model):
                return True
    return False


@transform("spmd_parameter_sharding", on="replace_loop")
def sharded_parameters(loop: cst.For, sc: StatementContext):
    """The planned loop -> `_fully_shard(_global_batch_norm(model))` (`_fully_shard(model)` where
    the file shows a model without BatchNorm), one fix at the loop; the marks it held are gone
    (their imports may go)."""
    model = sc.file.plans.sharded_parameter_loops.get(id(sc.info.node))
    if model is None:
        return None
    for node in ast.walk(sc.info.node):
        if node is not sc.info.node and isinstance(node, ast.Expr):
            inner = StatementContext(sc.file, sc.file.analysis.info(node))
            for ref in [ref for ref in inner.info.refs if ref.qualname == MARK_SHARDING]:
                inner.consume(ref.qualname)
                inner.removed(ref.dotted)
    sc.fixed(RULE, where=sc.where)
    batch_norm = global_batch_norm(sc, model)
    sharded = f"{batch_norm}({model})" if batch_norm is not None else model
    statement = parse_stmt(f"{fully_shard_helper(sc)}({sharded})\n")
    return [statement.with_changes(leading_lines=loop.leading_lines)]


__all__ = ["parameter_marking_loops", "sharded_parameters"]
