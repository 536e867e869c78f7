"""Optimum TPU (rules/optimum.toml): its model classes and FSDP config dicts with xla keys."""

from __future__ import annotations

import ast

import libcst as cst

from tpu_migrate.rewrite.context import StatementContext, parse_expr, parse_stmt
from tpu_migrate.rewrite.names import finding_position
from tpu_migrate.rewrite.registry import emits, transform
from tpu_migrate.rewrite.transforms.common import PORTABLE_DEVICE, clean_args, code


# Names whose presence means the file runs several processes, each holding a shard.
MULTI_PROCESS = frozenset({
    "torch_xla.distributed.xla_multiprocessing.spawn",
    "torch_xla.launch",
    "optimum.tpu.distributed_model.DistributedModel",
    "optimum.tpu.DistributedModel",
})


@transform("optimum_auto_model", on="call", order=-1)  # before any other use of the call
def optimum_from_pretrained(call, qualname, sc: StatementContext):
    """The rule matches Optimum's class; what it converts is a call of its `from_pretrained`."""
    if qualname is None or not qualname.endswith(".from_pretrained"):
        return None
    owner = sc.file.catalog.lookup(qualname.rsplit(".", 1)[0])
    if owner is None or owner.transform != "optimum_auto_model":
        return None
    if not sc.may_fix(owner, qualname):
        return call
    return optimum_auto_model(call, qualname, sc, owner)


# Optimum's from_pretrained(name, task=None, batch_size=None, sequence_length=None, *model_args,
# **kwargs) stored these three in `model.config` (optimum/tpu/modeling.py).
OPTIMUM_SETTINGS = ("task", "batch_size", "sequence_length")


@emits("TPU183")
def optimum_auto_model(call, qualname, sc: StatementContext, rule):
    """`AutoModelForCausalLM.from_pretrained(...)` from optimum.tpu."""
    if any(arg.star for arg in call.args):
        sc.needs_manual(rule.code, "cannot tell which of *args / **kwargs are Optimum's task, batch_size "
                        "and sequence_length: " + rule.summary, qualname)
        return call
    plan = sc.file.import_plan
    settings, args = {}, []
    for position, arg in enumerate(call.args):
        name = arg.keyword.value if arg.keyword else (
            OPTIMUM_SETTINGS[position - 1] if 1 <= position <= len(OPTIMUM_SETTINGS) else None)
        if name not in OPTIMUM_SETTINGS:
            args.append(arg)
        elif not (isinstance(arg.value, cst.Name) and arg.value.value == "None"):
            settings[name] = arg.value
    device = '"tpu"' if sc.file.target == "tpu" else plan.fill(PORTABLE_DEVICE)
    where = sc.fixed(rule.code, qualname)
    if sc.file.analysis.qualnames & MULTI_PROCESS and sc.enabled("TPU183"):
        sc.needs_manual(
            "TPU183", "Optimum's Gemma/Llama/Mistral classes sharded the weights across the "
            "launched processes; this loads a full replica on every rank: use "
            'from_pretrained(..., tp_plan="auto") under torchrun if it does not fit', where=where,
        )
    if settings:
        _store_settings(settings, where, sc, rule)
    loaded = cst.Call(
        func=parse_expr(plan.fill("{transformers}.AutoModelForCausalLM.from_pretrained")),
        args=clean_args(args),
    )
    return parse_expr(f"{code(loaded)}.to({device}).eval()")


def _store_settings(settings: dict[str, cst.BaseExpression], where: tuple[int, int], sc: StatementContext,
                    rule) -> None:
    """What Optimum stored in the config, stored by statements after `model = <the call>`;
    elsewhere (the call returned, passed on), a TODO says what to store."""
    model = _assigned_to(where, sc)
    values = {name: code(value) for name, value in settings.items()}
    if model is not None and not any(_reads(value, model) for value in values.values()):
        sc.after.extend(parse_stmt(f"{model}.config.{name} = {value}\n") for name, value in values.items())
        return
    stores = "; ".join(f"{model or 'model'}.config.{name} = {value}" for name, value in values.items())
    sc.needs_manual(rule.code, "Optimum stored these in the loaded model's config; store them, with the values "
                    f"they had before this line: {stores}", where=where)


def _assigned_to(where: tuple[int, int], sc: StatementContext) -> str | None:
    """The name or attribute the statement assigns the call at `where` to, when the statement is
    just `target = <that call>` on a line of its own."""
    node = sc.info.node
    if not (sc.can_prefix and isinstance(node, ast.Assign) and len(node.targets) == 1
            and isinstance(node.value, ast.Call) and finding_position(node.value.func) == where):
        return None
    target = node.targets[0]
    while isinstance(target, ast.Attribute):
        target = target.value
    return ast.unparse(node.targets[0]) if isinstance(target, ast.Name) else None


def _reads(expression: str, target: str) -> bool:
    """Whether `expression` reads `target` (`model`, `self.model`) or something of it, which the
    assignment rebinds before the stores run (`self.batch_size` is not `self.model`'s)."""
    for node in ast.walk(ast.parse(expression, mode="eval")):
        if isinstance(node, (ast.Name, ast.Attribute)):
            dotted = ast.unparse(node)
            if dotted == target or dotted.startswith(target + "."):
                return True
    return False


FSDP_XLA_KEYS = frozenset({"xla_fsdp_v2", "xla_fsdp_grad_ckpt", "xla_fsdp_settings"})


@transform("fsdp_config_dict", on="dict")
def fsdp_config_dict(node: cst.Dict, sc: StatementContext):
    keys = {
        e.key.evaluated_value for e in node.elements
        if isinstance(e, cst.DictElement) and isinstance(e.key, cst.SimpleString)
    }
    looks_like_fsdp = bool(keys & FSDP_XLA_KEYS) or (
        "xla" in keys and any("fsdp" in str(k) or "layer_cls" in str(k) for k in keys)
    )
    if looks_like_fsdp and sc.enabled("TPU182") and not any(t.code == "TPU182" for t in sc.todos):
        sc.needs_manual("TPU182", "remove the xla / xla_fsdp_v2 / xla_fsdp_grad_ckpt keys; "
                        "FSDP through transformers on TorchTPU is unverified",
                        where=sc.consume_string())
    return node
