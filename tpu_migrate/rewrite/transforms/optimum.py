"""Optimum TPU (rules/optimum.toml): its model classes and FSDP config dicts with xla keys."""

from __future__ import annotations

import libcst as cst

from tpu_migrate.rewrite.context import StatementContext, parse_expr
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


@emits("TPU183")
def optimum_auto_model(call, qualname, sc: StatementContext, rule):
    """`AutoModelForCausalLM.from_pretrained(...)` from optimum.tpu."""
    plan = sc.file.import_plan
    args = [a for a in call.args if not (a.keyword and a.keyword.value in ("task", "batch_size", "sequence_length"))]
    device = '"tpu"' if sc.file.target == "tpu" else plan.fill(PORTABLE_DEVICE)
    where = sc.fixed(rule.code, qualname)
    if sc.file.analysis.qualnames & MULTI_PROCESS and sc.enabled("TPU183"):
        sc.needs_manual(
            "TPU183", "Optimum's Gemma/Llama/Mistral classes sharded the weights across the "
            "launched processes; this loads a full replica on every rank: use "
            'from_pretrained(..., tp_plan="auto") under torchrun if it does not fit', where=where,
        )
    loaded = cst.Call(
        func=parse_expr(plan.fill("{transformers}.AutoModelForCausalLM.from_pretrained")),
        args=clean_args(args),
    )
    return parse_expr(f"{code(loaded)}.to({device}).eval()")


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
