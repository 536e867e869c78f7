"""torch_xla FSDP's sharded checkpoints (rules/fsdp.toml, TPU176): `model.get_shard_metadata()` and the
consolidation helpers, for a model TPU173 made an FSDP2 model.

torch_xla's recipe (its FSDP test and docs): every rank saves `{"model": model.state_dict(),
"shard_metadata": model.get_shard_metadata(), ...}` to a file of its own, then rank 0 merges the
files with `consolidate_sharded_model_checkpoints` into one plain state dict that loads into the
unwrapped model. After TPU173 the model's state dict holds DTensors (each rank's shard, with its
placement) under the module's own names, so the same recipe works with two helpers written into
the file: `_shard_metadata(model)` (the rank and world size torch_xla's metadata carried) and
`_consolidate_sharded_model_checkpoints(...)`, torch_xla's function with one more case: a DTensor
entry is its ranks' local shards joined on the dimension it is sharded on. Files torch_xla wrote
(flattened `_fsdp_shard` parameters) still consolidate as torch_xla did.
"""

from __future__ import annotations

import libcst as cst

from tpu_migrate.rewrite.context import StatementContext
from tpu_migrate.rewrite.names import Analysis, mark_subtrees
from tpu_migrate.rewrite.registry import CALL, REFERENCE, rule_code, transform
from tpu_migrate.rewrite.transforms.common import bind, clean_args, code, helper

RULE = rule_code("TPU176")
XLA_FSDP = rule_code("TPU173")
# torch_xla's FSDP class, by its two qualified names.
XLA_FSDP_NAMES = frozenset({
    "torch_xla.distributed.fsdp.XlaFullyShardedDataParallel",
    "torch_xla.distributed.fsdp.xla_fully_sharded_data_parallel.XlaFullyShardedDataParallel",
})
# The model's method; converted only in a file that wraps a model with torch_xla's FSDP
# (plans.Plans.shard_metadata_reads), where that model is the FSDP2 model TPU173 made.
METHOD = "get_shard_metadata"
# torch_xla/distributed/fsdp/state_dict_utils.py (2.9), by qualified name: (helper, parameters).
STATE_DICTS = "consolidate_sharded_state_dicts"
CHECKPOINTS = "consolidate_sharded_model_checkpoints"
PARAMS = {
    STATE_DICTS: ["state_dict_list", "shard_metadata"],
    CHECKPOINTS: ["ckpt_prefix", "ckpt_suffix", "save_path", "save_model"],
}

SHARD_METADATA = '''def {name}(model):
    """torch_xla FSDP's model.get_shard_metadata() for an FSDP2 model (added by tpu-migrate): the
    rank and world size its checkpoint files are consolidated by. FSDP2's state dict needs no
    more: each DTensor in it carries its own shape and placement."""
    return {{"rank": {rank}, "world_size": {world_size}, "shard_info": {{}}, "flatten_info": {{}}, "buffer_info": {{}}}}
'''

CONSOLIDATE_STATE_DICTS = '''def {name}(state_dict_list, shard_metadata):
    """torch_xla's consolidate_sharded_state_dicts (added by tpu-migrate): the full state dict from
    every rank's `model.state_dict()`, sorted by rank. A DTensor (FSDP2) is its ranks' local
    shards joined on the dimension it is sharded on; a torch_xla FSDP file's flattened
    `_fsdp_shard` parameters are joined and unflattened as torch_xla did."""
    from collections import OrderedDict

    from torch.distributed.tensor import DTensor

    assert len(state_dict_list) == shard_metadata["world_size"]
    full_state_dict = OrderedDict()
    buffer_info = shard_metadata.get("buffer_info", {{}})
    for name, p in state_dict_list[0].items():
        if isinstance(p, DTensor):
            dims = [placement.dim for placement in p.placements if placement.is_shard()]
            shards = [state_dict[name].to_local() for state_dict in state_dict_list]
            full_state_dict[name] = {torch}.cat(shards, dim=dims[0]) if dims else shards[0]
            continue
        if name in buffer_info:  # cast buffer back to its original dtype
            p = p.to(buffer_info[name]["_orig_dtype"])
        parts = name.split(".")
        shard = next((i for i, part in enumerate(parts) if part.startswith("_fsdp_shard")), None)
        if shard is None:
            full_state_dict[name] = p  # unsharded buffers: rank 0's
            continue
        prefix, suffix = ".".join(parts[:shard]), ".".join(parts[shard:])
        info = shard_metadata["shard_info"][prefix][suffix]
        full_param = {torch}.cat([state_dict[name] for state_dict in state_dict_list], dim=0)
        orig_size = info["_orig_size"]
        if full_param.dim() == 1:
            full_param = full_param[:orig_size.numel()].view(*orig_size)
        else:
            full_param = full_param[:orig_size[0]]
        full_state_dict[prefix + "." + info["_orig_name"] if prefix else info["_orig_name"]] = full_param
    for name in list(full_state_dict):
        if "_fsdp_wrapped_module.flat_param_" in name:
            p = full_state_dict.pop(name)
            param_names, param_shapes, param_numels = shard_metadata["flatten_info"][name]
            prefix = ".".join(name.split(".")[:-1])
            for tensor, shape, param_name in zip(p.split(param_numels), param_shapes, param_names):
                full_state_dict[prefix + "." + param_name if prefix else param_name] = tensor.view(shape)
    return OrderedDict(
        (k.replace("_fsdp_wrapped_module.", "").replace("_fpw_module.", ""), v) for k, v in full_state_dict.items())
'''

# `position`, not torch_xla's `rank`: `{rank}` is a named expression in templates.
CONSOLIDATE_CHECKPOINTS = '''def {name}(ckpt_prefix, ckpt_suffix="*.pth", save_path="", save_model=True):
    """torch_xla's consolidate_sharded_model_checkpoints (added by tpu-migrate): merges the files
    matching ckpt_prefix + ckpt_suffix, each {{"model": model.state_dict(), "shard_metadata": ...}}
    of one rank, into {{"model": full state dict}} saved to save_path (default: ckpt_prefix +
    "_consolidated.pth"); returns (full state dict, that path or None). FSDP2's files hold
    DTensors: load them in a process of the program's process group, as here."""
    from glob import glob

    ckpt_path_pattern = ckpt_prefix + ckpt_suffix
    ckpt_paths = glob(ckpt_path_pattern)
    assert len(ckpt_paths) > 0, f"Cannot find any files matching {{ckpt_path_pattern}}."
    print(f"found {{len(ckpt_paths)}} checkpoint files in {{ckpt_path_pattern}}")
    checkpoints_and_paths = [({torch}.load(path, map_location="cpu"), path) for path in ckpt_paths]
    checkpoints_and_paths.sort(key=lambda c: c[0]["shard_metadata"]["rank"])
    checkpoints = [c[0] for c in checkpoints_and_paths]
    for position, (ckpt, path) in enumerate(checkpoints_and_paths):
        assert ckpt["shard_metadata"]["world_size"] == len(checkpoints), (
            f'Expecting {{ckpt["shard_metadata"]["world_size"]}} files (based on metadata in {{path}}) but got '
            f"{{len(checkpoints)}} files. Please check if you have missing or unexpected files in {{ckpt_path_pattern}}.")
        assert ckpt["shard_metadata"]["rank"] == position, (
            f'Expecting rank {{ckpt["shard_metadata"]["rank"]}} for {{path}} but it is ranked {{position}} (out of '
            f"{{len(checkpoints)}} files). Please check if you have missing or unexpected files in {{ckpt_path_pattern}}.")
    full_state_dict = {state_dicts}([ckpt["model"] for ckpt in checkpoints], checkpoints[0]["shard_metadata"])
    actual_save_path = None
    if save_model:
        actual_save_path = save_path if save_path else ckpt_prefix + "_consolidated.pth"
        {torch}.save({{"model": full_state_dict}}, actual_save_path)
        print(f"saved consolidated model to {{actual_save_path}}")
    return full_state_dict, actual_save_path
'''


def _state_dicts_helper(sc: StatementContext) -> str:
    return helper(sc, "_consolidate_sharded_state_dicts", CONSOLIDATE_STATE_DICTS)


def _helper_for(sc: StatementContext, function: str) -> str:
    if function == STATE_DICTS:
        return _state_dicts_helper(sc)
    return helper(sc, "_consolidate_sharded_model_checkpoints", CONSOLIDATE_CHECKPOINTS,
                  state_dicts=_state_dicts_helper(sc))


def _function(qualname: str) -> str | None:
    """The consolidation function `qualname` names (from `torch_xla.distributed.fsdp` or its
    `state_dict_utils`), or None for the rest of the rule's names (the command-line module)."""
    module, _, name = qualname.rpartition(".")
    if name in PARAMS and module in ("torch_xla.distributed.fsdp", "torch_xla.distributed.fsdp.state_dict_utils"):
        return name
    return None


def _left(sc: StatementContext, qualname: str, rule) -> None:
    sc.needs_manual(rule.code, "torch_xla FSDP's consolidation script reads torch_xla's checkpoint files: "
                    "call the consolidation from the migrated program (it converts), or save with "
                    "torch.distributed.checkpoint and get_model_state_dict", qualname)


@transform("xla_fsdp_checkpoint", form=CALL)
def consolidation_call(call, qualname, sc: StatementContext, rule):
    """`consolidate_sharded_model_checkpoints(...)` -> `_consolidate_sharded_model_checkpoints(...)`."""
    function = _function(qualname)
    bound = bind(call, PARAMS[function]) if function else None
    if bound is None:
        if function is None:
            _left(sc, qualname, rule)
        else:
            sc.needs_manual(rule.code, f"cannot read the arguments of {function}(...)", qualname)
        return call
    sc.fixed(rule.code, qualname)
    return call.with_changes(func=cst.Name(_helper_for(sc, function)), args=clean_args(list(call.args)))


@transform("xla_fsdp_checkpoint", form=REFERENCE)
def consolidation_reference(node, qualname, sc: StatementContext, rule):
    """A consolidation function used as a value: the helper, which takes the same arguments."""
    function = _function(qualname)
    if function is None:
        _left(sc, qualname, rule)
        return node
    sc.fixed(rule.code, qualname)
    return cst.Name(_helper_for(sc, function))


# torch_xla FSDP's own gradient clipping, which FSDP2 modules lack (TPU173's wrapper method).
CLIP = "clip_grad_norm_"
CLIP_TODO = ("FSDP2 modules have no clip_grad_norm_ (torch_xla's FSDP wrapper had): "
             "torch.nn.utils.clip_grad_norm_({model}.parameters(), max_norm) clips by the same global norm of "
             "the sharded (DTensor) gradients, and returns it as a DTensor (.full_tensor() for its value)")


@transform("xla_fsdp_checkpoint", on="call", emits=("TPU173",))
def shard_metadata_call(call, qualname, sc: StatementContext):
    """`model.get_shard_metadata()` -> `_shard_metadata(model)`, and a TODO on
    `model.clip_grad_norm_(...)`, where the plans found the read."""
    reads = sc.file.plans.shard_metadata_reads.get(id(sc.info.node))
    method = call.func.attr.value if isinstance(call.func, cst.Attribute) else None
    entry = next((read for read in reads or () if read[2] == method), None)
    if entry is None:
        return None
    reads.remove(entry)
    where = entry[:2]
    if method == CLIP:
        if sc.enabled(XLA_FSDP) and sc.file.options.enabled(XLA_FSDP):
            sc.needs_manual(XLA_FSDP, CLIP_TODO.format(model=code(call.func.value)), where=where)
        return None
    if call.args:
        return None
    if not (sc.enabled(RULE) and sc.file.options.enabled(XLA_FSDP)):
        return None  # left with the torch_xla model it reads
    if sc.file.options.fix_level == "safe":  # TPU176 is unsafe, as TPU173 that made the model
        sc.needs_manual(RULE, "unsafe fix not applied at --fix-level safe: model.get_shard_metadata() of an "
                        "FSDP2 model", where=where, todo=False)
        return None
    sc.fixed(RULE, where=where)
    return cst.Call(func=cst.Name(helper(sc, "_shard_metadata", SHARD_METADATA)), args=[cst.Arg(call.func.value)])


def shard_metadata_reads(analysis: Analysis) -> dict[int, list[tuple[int, int, str]]]:
    """id(statement) -> (line, col, method) of each `X.get_shard_metadata()` and
    `X.clip_grad_norm_(...)` read in it, in a file that wraps a model with torch_xla's FSDP;
    those statements are marked for the walk."""
    if not analysis.qualnames & XLA_FSDP_NAMES:
        return {}
    reads: dict[int, list[tuple[int, int, str]]] = {}
    for _, dotted, info, line, col in analysis.loads:
        method = dotted.rsplit(".", 1)[-1]
        if "." in dotted and method in (METHOD, CLIP) and not dotted.startswith("torch."):
            info.forced = True
            reads.setdefault(id(info.node), []).append((line, col + 1, method))
    for positions in reads.values():
        positions.sort()
    if reads:
        mark_subtrees(analysis.tree.body, analysis.infos)
    return reads


__all__ = ["consolidation_call", "consolidation_reference", "shard_metadata_call", "shard_metadata_reads",
           "SHARD_METADATA", "CONSOLIDATE_CHECKPOINTS", "CONSOLIDATE_STATE_DICTS"]
