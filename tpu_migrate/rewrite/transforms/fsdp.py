"""torch_xla's FSDP (rules/fsdp.toml: `XlaFullyShardedDataParallel`) as FSDP2 `fully_shard` (TPU173, TPU174), and
its gradient-checkpointing wrapper `checkpoint_module` (TPU177).

torch_xla's FSDP wrapped a module: it asked the wrap policy about every submodule
(`recursive_wrap`), wrapped those it picked, innermost first, then the module itself, sharded
each wrapped module's parameters over every process, and averaged the gradients over them in
backward (so `optimizer.step()`, never `xm.optimizer_step`, follows). FSDP2's `fully_shard`
does the same to a module in place, over a DeviceMesh. A helper written into the file once
makes the mesh (and a process group where the program has none: torch_xla's FSDP needed none,
even alone), walks the module as `recursive_wrap` did, and calls `fully_shard`.
"""

from __future__ import annotations

import ast

import libcst as cst

from tpu_migrate.rewrite.context import StatementContext, cst_dotted
from tpu_migrate.rewrite.names import is_xla_name
from tpu_migrate.rewrite.registry import CALL, REFERENCE, transform
from tpu_migrate.rewrite.transforms.common import KEYWORD_EQUAL, PORTABLE_DEVICE, bind, clean_args, code, given, helper

# XlaFullyShardedDataParallel.__init__'s parameters, in order (torch_xla 2.9).
PARAMS = [
    "module", "reshard_after_forward", "flatten_parameters", "execute_sharding_on_init",
    "optimization_barrier_in_forward", "optimization_barrier_in_backward", "sync_on_finalization",
    "disable_reshard_on_root", "compute_dtype", "buffer_dtype", "fp32_reduce_scatter",
    "sharding_groups", "sharding_rank", "sharding_world_size", "shard_param_on_dim_0",
    "pin_layout_in_collective_ops", "reduce_scatter_bucket_size_mb", "coalesce_all_gather_ops",
    "auto_wrap_policy", "auto_wrapper_callable", "param_init_fn", "_shard_size_multiple",
    "_use_xla_patched_linear", "_debug_dummy_forward_pass", "_debug_msg", "_debug_print",
    "_debug_dummy_all_gather_op", "_debug_dummy_all_reduce_op", "_debug_dummy_reduce_scatter_op",
    "_debug_dummy_optimization_barrier_op",
]
# Kept, with the same meaning, as arguments of the helper.
KEPT = ("auto_wrap_policy", "auto_wrapper_callable", "reshard_after_forward")
# XLA graph, layout and memory knobs: FSDP2 has no such option, and they change no number.
NO_MEANING = frozenset(PARAMS) - set(KEPT) - {
    "module", "compute_dtype", "buffer_dtype", "fp32_reduce_scatter", "sharding_groups", "sharding_rank",
    "sharding_world_size", "auto_wrapper_callable", "param_init_fn",
}
MIXED_PRECISION = ("compute_dtype", "buffer_dtype", "fp32_reduce_scatter")
# Arguments that leave the call as it is: what to write instead.
LEFT = {
    "sharding_groups": "hybrid sharding: fully_shard(m, mesh=init_device_mesh(device_type, (replicas, shards), "
                       "mesh_dim_names=(\"replicate\", \"shard\")))",
    "sharding_rank": None, "sharding_world_size": None,  # with sharding_groups
    "param_init_fn": "build the model on the meta device, fully_shard it, then model.to_empty(device=...) and "
                     "initialise the parameters",
}
_FLOAT32 = ("None", "torch.float32", "float32")

# Helpers (portable and tpu differ in the backend and the mesh's device type).
JOIN_WORLD = '''def {name}():
    """Joins the default process group where the program has none (added by tpu-migrate): from
    the launch environment (torchrun, TorchTPU's launcher) when WORLD_SIZE > 1, else a group of
    one (an in-memory store). torch_xla's FSDP and SPMD needed no group; FSDP2 and a DeviceMesh
    need one, even alone."""
    if not {dist}.is_initialized():
        if int({os}.environ.get("WORLD_SIZE", 1)) > 1:
            {dist}.init_process_group({backend})
        else:
            {dist}.init_process_group({backend_comma}store={dist}.HashStore(), rank=0, world_size=1)
'''
FULLY_SHARD = '''def {name}(module, auto_wrap_policy=None, auto_wrapper_callable=None, **options):
    """torch_xla's XlaFullyShardedDataParallel(module, auto_wrap_policy=...) (or SPMD's
    SpmdFullyShardedDataParallel) as FSDP2 (added by tpu-migrate): fully_shard on each submodule
    the policy picks, innermost first, as torch_xla's recursive_wrap picked them (or
    auto_wrapper_callable(submodule, **options) in its place, as torch_xla called it), then on
    `module`, over a 1-D mesh of every process. Returns `module`, sharded in place."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    {join_world}()
    mesh = init_device_mesh({device_type}, ({dist}.get_world_size(),))

    def wrap(child, only_children):
        # The policy's (module, recurse, unwrapped_params), as recursive_wrap asked it.
        params = sum(p.numel() for p in child.parameters())
        if not auto_wrap_policy(child, True, params):
            return child, 0
        wrapped = 0
        for name, grandchild in child.named_children():
            new, count = wrap(grandchild, False)
            setattr(child, name, new)
            wrapped += count
        if only_children or not auto_wrap_policy(child, False, params - wrapped):
            return child, wrapped
        if auto_wrapper_callable is not None:
            return auto_wrapper_callable(child, **options), params
        return fully_shard(child, mesh=mesh, **options), params

    if auto_wrap_policy is not None:
        wrap(module, True)  # the root is never asked: it is sharded below
    return fully_shard(module, mesh=mesh, **options)
'''
# The same where no wrap of the file passes a policy (nor `*args` / `**kwargs` that may hold
# one): torch_xla sharded the module as one unit, and the walk above would never run.
FULLY_SHARD_WHOLE = '''def {name}(module, **options):
    """torch_xla's XlaFullyShardedDataParallel(module) (or SPMD's SpmdFullyShardedDataParallel)
    as FSDP2 (added by tpu-migrate): fully_shard on `module` as one unit, as torch_xla sharded it
    without a wrap policy, over a 1-D mesh of every process. Returns `module`, sharded in place."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    {join_world}()
    return fully_shard(module, mesh=init_device_mesh({device_type}, ({dist}.get_world_size(),)), **options)
'''
# The arguments that may carry a wrap policy to the helper.
_POLICY_ARGUMENTS = frozenset({"auto_wrap_policy", "auto_wrapper_callable"})
PORTABLE_DEVICE_TYPE = f"({PORTABLE_DEVICE}).type"


def for_target(sc: StatementContext, template: str) -> str:
    """`template` with the target's backend and mesh device type in place."""
    tpu = sc.file.target == "tpu"
    template = template.replace("{backend}", '"tpu_dist"' if tpu else "")
    template = template.replace("{backend_comma}", '"tpu_dist", ' if tpu else "")
    return template.replace("{device_type}", '"tpu"' if tpu else PORTABLE_DEVICE_TYPE)


def join_world(sc: StatementContext) -> str:
    """The name of the helper that joins the default process group where there is none."""
    return helper(sc, "_join_world", for_target(sc, JOIN_WORLD))


def fully_shard_helper(sc: StatementContext) -> str:
    """The name of the `_fully_shard` helper (torch_xla's FSDP wrap as FSDP2): the one that walks
    a wrap policy only where a wrap of the file may pass one (asked once per file)."""
    memo = sc.file.memo
    if "passes_wrap_policy" not in memo:
        memo["passes_wrap_policy"] = passes_wrap_policy(sc.file.analysis)
    template = FULLY_SHARD if memo["passes_wrap_policy"] else FULLY_SHARD_WHOLE
    return helper(sc, "_fully_shard", for_target(sc, template), join_world=join_world(sc))


def passes_wrap_policy(analysis) -> bool:
    """Whether a call of torch_xla's FSDP wrappers in the file may pass a wrap policy: by keyword,
    by position (any argument after the module), or in `*args` / `**kwargs`."""
    wrappers = {name for name in FSDP_NAMES if is_xla_name(name)}
    starts = {(ref.line, ref.col) for info in analysis.infos.values() for ref in info.refs
              if ref.qualname in wrappers}
    if not starts:
        return False
    for node in analysis.nodes:
        if isinstance(node, ast.Call) and (node.func.lineno, node.func.col_offset + 1) in starts:
            if len(node.args) > 1 or any(isinstance(arg, ast.Starred) for arg in node.args):
                return True
            if any(keyword.arg is None or keyword.arg in _POLICY_ARGUMENTS for keyword in node.keywords):
                return True
    return False


def _is_float32(arg: cst.Arg) -> bool:
    return cst_dotted(arg.value) in _FLOAT32


def _forwarded(call: cst.Call) -> tuple[cst.Call, list[cst.Arg]]:
    """The call without its trailing `*args` / `**kwargs` of plain names, and those arguments."""
    args = list(call.args)
    stars = []
    while args and args[-1].star and isinstance(args[-1].value, cst.Name):
        stars.insert(0, args.pop())
    return call.with_changes(args=args), stars


def _wrapper_lambda(sc: StatementContext, call: cst.Call, stars: list[cst.Arg]) -> bool:
    """Whether the call is the body of a lambda that forwards its own `*args` and `**kwargs` to
    it (`lambda m, *args, **kwargs: FSDP(checkpoint_module(m), *args, **kwargs)`, the
    auto_wrapper_callable torch_xla's example passes): torch_xla called it with FSDP's options,
    and the helper calls it with FSDP2's."""
    names = {arg.star: arg.value.value for arg in stars}
    callee = cst_dotted(call.func)
    for node in ast.walk(sc.info.node):
        if not (isinstance(node, ast.Lambda) and isinstance(node.body, ast.Call)):
            continue
        body = node.body
        own = {"*": node.args.vararg.arg if node.args.vararg else None,
               "**": node.args.kwarg.arg if node.args.kwarg else None}
        forwarded = {"*": [a.id for a in body.args if isinstance(a, ast.Starred) and isinstance(a.value, ast.Name)
                           for a in [a.value]],
                     "**": [k.value.id for k in body.keywords if k.arg is None and isinstance(k.value, ast.Name)]}
        if ast.unparse(body.func) == callee and all(
                own[star] == name and forwarded[star] == [name] for star, name in names.items()):
            return True
    return False


@transform("xla_fsdp", form=CALL, emits=("TPU174",))
def xla_fsdp(call, qualname, sc: StatementContext, rule):
    """`XlaFullyShardedDataParallel(module, ...)` -> `_fully_shard(module, ...)`."""
    return fully_shard_call(call, qualname, sc, rule, PARAMS, LEFT, manual_code="TPU174",
                            name="XlaFullyShardedDataParallel")


def fully_shard_call(call, qualname, sc: StatementContext, rule, params: list[str], left: dict,
                     *, manual_code: str, name: str):
    """A torch_xla FSDP wrapper call (its parameters `params`) -> `_fully_shard(module, ...)`
    with the arguments FSDP2 keeps. `left`: arguments that leave the call for a human, with what
    to write (None: said by another). A call left for a human is returned as it came (the walker
    then puts back its arguments byte for byte)."""
    given_call, stars = _forwarded(call)
    bound = bind(given_call, params)
    if bound is None or "module" not in bound or set(bound) - set(params):
        unknown = sorted(set(bound or ()) - set(params))
        what = f"unknown arguments {', '.join(unknown)}" if unknown else "*args / **kwargs or no module"
        sc.needs_manual(manual_code, f"{name} with {what}: write "
                        "torch.distributed.fsdp.fully_shard(m, mesh=mesh) on each wrapped module, then on "
                        "the model, on a 1-D init_device_mesh of the world", qualname)
        return call
    kept_back = [arg for arg in left if given(bound, arg)]
    if kept_back:
        todo = "; ".join(f"{arg}: {left[arg]}" for arg in kept_back if left[arg]) or \
            f"{kept_back[0]}: hybrid sharding over a 2-D DeviceMesh"
        sc.needs_manual(manual_code, f"{name} with {', '.join(kept_back)} is not converted; {todo}", qualname)
        return call
    dropped = [arg for arg in bound if arg in NO_MEANING]
    mixed = [arg for arg in MIXED_PRECISION if arg in bound]
    default_dtype = mixed == ["compute_dtype"] and _is_float32(bound["compute_dtype"])
    if default_dtype:
        mixed = []  # FSDP2 computes in the parameters' dtype, float32
    where = sc.fixed(rule.code, qualname)
    notes = []
    if stars and not _wrapper_lambda(sc, given_call, stars):
        notes.append(f"{', '.join(code(a.value) for a in stars)} reach fully_shard as they are: they may hold "
                     "FSDP2 options only (reshard_after_forward, mp_policy), not torch_xla's")
    if dropped:
        notes.append(f"dropped {', '.join(dropped)} (no FSDP2 counterpart: XLA graph, layout and flat-parameter "
                     "knobs that change no result)")
    if default_dtype:
        notes.append(f"dropped compute_dtype={code(bound['compute_dtype'].value)} (FSDP2 computes in the "
                     "parameters' dtype)")
    if mixed:
        values = ", ".join(f"{arg}={code(bound[arg].value)}" for arg in mixed)
        notes.append(f"mixed precision not converted ({values}), this computes in the parameters' dtype: pass "
                     "mp_policy=torch.distributed.fsdp.MixedPrecisionPolicy(param_dtype=..., reduce_dtype=...) "
                     "and cast the buffers to buffer_dtype yourself")
    if notes and sc.enabled(manual_code):
        sc.needs_manual(manual_code, f"{name} -> fully_shard: " + "; ".join(notes), where=where)
    args = [cst.Arg(bound["module"].value)]
    for arg in KEPT:
        if arg in bound:
            args.append(cst.Arg(bound[arg].value, keyword=cst.Name(arg), equal=KEYWORD_EQUAL))
    return cst.Call(func=cst.Name(fully_shard_helper(sc)), args=clean_args([*args, *stars]))


@transform("xla_fsdp", form=REFERENCE, emits=("TPU174",))
def xla_fsdp_reference(node, qualname, sc: StatementContext, rule):
    """The class used as a value (`isinstance(m, FSDP)`, a wrapper class argument): left."""
    sc.needs_manual("TPU174", "XlaFullyShardedDataParallel used as a value: FSDP2 shards a module in place "
                    "(isinstance checks: torch.distributed.fsdp.FSDPModule; a wrapper: "
                    "torch.distributed.fsdp.fully_shard(m, mesh=mesh))", qualname)
    return node


# torch_xla/distributed/fsdp/utils.py's checkpoint_module (2.9), on torch's reentrant checkpoint.
CHECKPOINT_MODULE = '''def {name}(module):
    """torch_xla's checkpoint_module (added by tpu-migrate): `module`'s forward recomputed in
    backward (gradient checkpointing) through torch.utils.checkpoint.checkpoint(use_reentrant=True),
    as torch_xla's checkpoint did; keyword arguments go through the checkpoint with the positional
    ones, and a call none of whose inputs requires grad is not checkpointed, as in torch_xla."""
    forward = module.forward

    def checkpointed(*args, **kwargs):
        names = tuple(kwargs)
        values = args + tuple(kwargs.values())
        if not any(isinstance(value, {torch}.Tensor) and value.requires_grad for value in values):
            return forward(*args, **kwargs)

        def run(*values):
            return forward(*values[:len(args)], **dict(zip(names, values[len(args):])))

        return {torch}.utils.checkpoint.checkpoint(run, *values, use_reentrant=True)

    module.forward = checkpointed
    return module
'''


@transform("checkpoint_module", form=CALL)
def checkpoint_module(call, qualname, sc: StatementContext, rule):
    """`checkpoint_module(m)` -> `_checkpoint_module(m)`."""
    bound = bind(call, ["module"])
    if bound is None or set(bound) != {"module"}:
        sc.needs_manual(rule.code, "cannot read the arguments of checkpoint_module(module)", qualname)
        return call
    sc.fixed(rule.code, qualname)
    return cst.Call(func=cst.Name(helper(sc, "_checkpoint_module", CHECKPOINT_MODULE)),
                    args=[cst.Arg(bound["module"].value)])


@transform("checkpoint_module", form=REFERENCE)
def checkpoint_module_reference(node, qualname, sc: StatementContext, rule):
    """`wrap = fsdp.checkpoint_module`: the helper, a function of the module as torch_xla's was."""
    sc.fixed(rule.code, qualname)
    return cst.Name(helper(sc, "_checkpoint_module", CHECKPOINT_MODULE))


# SPMD's FSDP wrapper (FSDPv2), converted with the same helper (spmd.py).
SPMD_FSDP = "torch_xla.experimental.spmd_fully_sharded_data_parallel.SpmdFullyShardedDataParallel"
# The names whose presence in a function means its optimizer steps an FSDP model (steps.py).
FSDP_NAMES = frozenset({
    "torch_xla.distributed.fsdp.XlaFullyShardedDataParallel",
    "torch_xla.distributed.fsdp.xla_fully_sharded_data_parallel.XlaFullyShardedDataParallel",
    "torch.distributed.fsdp.fully_shard",
    "torch.distributed.fsdp.FullyShardedDataParallel",
    SPMD_FSDP,
})

__all__ = ["xla_fsdp", "xla_fsdp_reference", "checkpoint_module", "checkpoint_module_reference", "FSDP_NAMES",
           "SPMD_FSDP", "fully_shard_call", "fully_shard_helper", "join_world", "for_target"]
