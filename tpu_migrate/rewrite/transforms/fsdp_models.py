"""What a file reads of torch_xla's FSDP wrapper on the model TPU173 made an FSDP2 model.

`model = FSDP(model, ...)` becomes `model = _fully_shard(model, ...)`: the same module object,
sharded in place, not a wrapper. torch_xla's wrapper had more surface than an FSDP2 module:
`model.module` (its XlaFlattenParamsWrapper) and `model.module.module` (the module it wrapped),
`_fsdp_wrapped_module`, `no_sync()`, ... A library (transformers' Trainer) keeps the wrapped model
in an attribute (`self.model = model = FSDP(...)`) and reads that surface in other methods
(`model = self.model` ... `model = model.module.module`), where FSDP2's module raises
AttributeError. So the value is followed: the names and `self.<attribute>`s assigned the wrap
(and names assigned one of those), and each read of the wrapper's surface on them converts
(`.module` / `.module.module` is the module itself now) or is marked where it stands.
`get_shard_metadata()` and `clip_grad_norm_` are fsdp_checkpoints.py's, file-wide.

Only where every wrap of the file converts (engine.py reruns with `xla_fsdp_kept` otherwise):
a model whose wrap is left is still torch_xla's, with all of its surface.
"""

from __future__ import annotations

import ast

import libcst as cst

from tpu_migrate.rewrite.context import StatementContext
from tpu_migrate.rewrite.names import Analysis, Scope, dotted_name, finding_position, is_xla_name, mark_subtrees
from tpu_migrate.rewrite.registry import rule_code, transform
from tpu_migrate.rewrite.transforms.common import code
from tpu_migrate.rewrite.transforms.fsdp_checkpoints import XLA_FSDP_NAMES

XLA_FSDP = rule_code("TPU173")
# The unwrapping attribute: torch_xla's `model.module` is the XlaFlattenParamsWrapper (which passes
# attribute reads to the module), `model.module.module` the module itself.
UNWRAP = "module"
# The rest of the wrapper's own surface that an FSDP2 module lacks, with what to write instead.
WRAPPER_ONLY = {
    "_fsdp_wrapped_module": "the model itself (an FSDP2 module is the module, sharded in place)",
    "no_sync": "FSDP2's model.set_requires_gradient_sync(False) before the accumulation steps, True before the last",
    "params_with_grad": "[p for p in model.parameters() if p.grad is not None]",
    "get_original_names_and_sharded_parameters": "model.named_parameters() (DTensors under the module's own names)",
    "set_gradient_divide_factors": "FSDP2's model.set_gradient_divide_factor(factor)",
    "sharding_groups": "the DeviceMesh the model was sharded over",
    "xla_device": "the model's parameters' device",
}


def wrapped_model_reads(analysis: Analysis) -> dict[int, list[tuple[int, int, str, str, int]]]:
    """id(statement) -> (line, col, wrapped, attribute, unwraps) of each read of the wrapper's
    surface on a value assigned torch_xla's FSDP wrap: `unwraps` is how many `.module` steps
    the read drops (1 or 2; 0 for an attribute of WRAPPER_ONLY). Those statements are marked for
    the walk."""
    if not analysis.qualnames & XLA_FSDP_NAMES:
        return {}
    tracked = _wrapped_values(analysis)
    if not tracked:
        return {}
    reads: dict[int, list[tuple[int, int, str, str, int]]] = {}
    for scope, dotted, info, line, col in analysis.loads:
        parts = dotted.split(".")
        for end in range(len(parts) - 1, 0, -1):
            base = ".".join(parts[:end])
            key = _key(scope, base)
            if key is None or key not in tracked or line <= tracked[key]:
                continue
            rest = parts[end:]
            if rest[0] == UNWRAP:
                unwraps = 2 if rest[1:2] == [UNWRAP] else 1
                reads.setdefault(id(info.node), []).append((line, col + 1, base, UNWRAP, unwraps))
            elif rest[0] in WRAPPER_ONLY:
                reads.setdefault(id(info.node), []).append((line, col + 1, base, rest[0], 0))
            break
    for statement in reads:
        analysis.infos[statement].forced = True
    if reads:
        mark_subtrees(analysis.tree.body, analysis.infos)
    return reads


def _wrapped_values(analysis: Analysis) -> dict[tuple, int]:
    """The keys (_key) of the names and `self.` attributes assigned the wrap, or a name or
    attribute that holds it, each with the first line after which it holds it."""
    tracked: dict[tuple, int] = {}
    aliases = []
    for info in analysis.infos.values():
        node = info.node
        if not isinstance(node, ast.Assign):
            continue
        value = node.value
        wraps = isinstance(value, ast.Call) and any(
            ref.qualname in XLA_FSDP_NAMES and (ref.line, ref.col) == finding_position(value.func) for ref in info.refs)
        for target in node.targets:
            key = _key(info.scope, dotted_name(target)) if isinstance(target, (ast.Name, ast.Attribute)) else None
            if key is None:
                continue
            if wraps:
                tracked.setdefault(key, node.end_lineno)
            elif isinstance(value, (ast.Name, ast.Attribute)) and dotted_name(value):
                aliases.append((key, _key(info.scope, dotted_name(value)), node.end_lineno))
    for _ in range(2):  # `model = self.model`, then `unwrapped = model`
        for key, source, line in aliases:
            if source in tracked and key not in tracked and line > tracked[source]:
                tracked[key] = line
    return tracked


def _key(scope: Scope | None, dotted: str | None) -> tuple | None:
    """What a name or `self.x` means wherever it is read: a plain name by the scope that binds it
    (the lines of a function), `self.x` by the class whose method reads it (every method)."""
    if not dotted or scope is None:
        return None
    root, _, rest = dotted.partition(".")
    if not rest:
        owner = _binding_scope(scope, root)
        return ("name", id(owner), root) if owner is not None else None
    if root == "self" and "." not in rest and scope.kind == "function" and scope.parent is not None \
            and scope.parent.kind == "class":
        return ("attribute", scope.parent.path, rest)
    return None


def _binding_scope(scope: Scope, name: str) -> Scope | None:
    innermost = True
    while scope is not None:
        if name in scope.assigned and (innermost or scope.kind != "class"):
            return scope
        scope, innermost = scope.parent, False
    return None


@transform("xla_fsdp", on="statement")
def wrapped_model_statement(small, sc: StatementContext):
    """`model.module.module` / `model.module` -> `model`; a TODO on the rest of the wrapper's
    surface. A statement `model = model.module.module` goes whole."""
    reads = sc.file.plans.wrapped_model_reads.get(id(sc.info.node), ())
    if not reads or sc.file.xla_fsdp_kept or not sc.enabled(XLA_FSDP) or sc.file.options.fix_level == "safe":
        return None  # the model is torch_xla's wrapper still
    unwraps = [read for read in reads if read[4]]
    if not unwraps or any(is_xla_name(ref.qualname) for ref in sc.info.refs):
        # Nothing converts here, or other rules rewrite this statement (this hook would take it
        # from them): each read is marked.
        _mark_all(sc)
        return None
    texts = {f"{base}{'.module' * count}": base for _, _, base, _, count in unwraps}
    for line, col, *_ in unwraps:
        sc.fixed(XLA_FSDP, where=(line, col))
    new = small.visit(_Unwrap(texts))
    if isinstance(new, cst.Assign) and len(new.targets) == 1 and code(new.targets[0].target) == code(new.value):
        return []  # `model = model`
    return new


@transform("xla_fsdp", on="with")
def wrapped_model_with(stmt, sc: StatementContext):
    """A TODO on each read of the wrapper's surface in a `with` header (`with model.no_sync():`)."""
    _mark_all(sc)
    return stmt


@transform("xla_fsdp", on="if_test")
def wrapped_model_test(test, sc: StatementContext):
    """A TODO on each read of the wrapper's surface in an `if` test."""
    _mark_all(sc)
    return test


def _mark_all(sc: StatementContext) -> None:
    reads = sc.file.plans.wrapped_model_reads.get(id(sc.info.node), ())
    if not reads or sc.file.xla_fsdp_kept or not sc.enabled(XLA_FSDP) or sc.file.options.fix_level == "safe":
        return
    for line, col, base, attribute, count in reads:
        message = _unwrap_todo(base, count) if count else (
            f"`{base}.{attribute}` is torch_xla's FSDP wrapper's; {base} is now the FSDP2 module itself: "
            f"{WRAPPER_ONLY[attribute]}")
        sc.needs_manual(XLA_FSDP, message, where=(line, col))


def _unwrap_todo(base: str, count: int) -> str:
    return (f"`{base}{'.module' * count}` unwraps torch_xla's FSDP wrapper; {base} is now the FSDP2 module itself: "
            f"write {base}")


class _Unwrap(cst.CSTTransformer):
    def __init__(self, texts: dict[str, str]):
        self.texts = texts

    def leave_Attribute(self, original, updated):
        base = self.texts.get(code(original))
        return cst.parse_expression(base) if base is not None else updated


__all__ = ["wrapped_model_reads", "wrapped_model_statement", "wrapped_model_with", "wrapped_model_test",
           "WRAPPER_ONLY"]
