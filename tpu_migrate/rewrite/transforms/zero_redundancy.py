"""torch_xla's ZeRO-1 optimizer (rules/zero_redundancy.toml: `ZeroRedundancyOptimizer`, TPU169) on torch's.

torch_xla's optimizer sharded the optimizer state over the processes and, in `step()`,
reduce-scattered the gradients averaged over them and clipped their global norm to `max_norm`
(with `grad_clipping=True`, its default) before stepping its shard. torch's
`torch.distributed.optim.ZeroRedundancyOptimizer` shards the state the same way but does
neither: a rename would train with gradients neither averaged nor clipped, and still run. So the
call becomes a helper class written into the file once: torch's optimizer whose `step()` first
averages the gradients over the processes and clips them as torch_xla's did. Elementwise
optimizers (SGD, Adam, ...) then compute what torch_xla's computed, whichever rank owns a
parameter's state.
"""

from __future__ import annotations

import libcst as cst

from tpu_migrate.rewrite.context import StatementContext, cst_dotted
from tpu_migrate.rewrite.registry import CALL, transform
from tpu_migrate.rewrite.transforms.common import KEYWORD_EQUAL, bind, clean_args, code, given, helper
from tpu_migrate.rewrite.transforms.fsdp import join_world

# ZeroRedundancyOptimizer.__init__'s parameters before **defaults (torch_xla 2.9).
PARAMS = [
    "params", "optimizer_class", "optimizer_dtype", "grad_clipping", "max_norm", "pin_layout",
    "sharding_groups", "grad_norm_groups", "lazy_init", "bucket_cap_mb_all_gather",
    "bucket_cap_mb_reduce_scatter", "use_grad_acc_hook", "save_master_weights", "higher_cc_precision",
]
KEPT = ("grad_clipping", "max_norm")
# Collective and memory knobs with no torch counterpart that change no number (float32 grads).
DROPPED = ("pin_layout", "bucket_cap_mb_all_gather", "bucket_cap_mb_reduce_scatter", "save_master_weights")
# Arguments that leave the call for a human, with what to write.
LEFT = {
    "sharding_groups": "pass process_group= for the sharding group, and average the gradients and take their "
                       "norm over the matching groups yourself",
    "grad_norm_groups": "take the gradient norm over these groups yourself before clipping",
    "lazy_init": "construct the optimizer where init_zero() was called",
    "use_grad_acc_hook": "accumulate the gradients in optimizer_dtype yourself",
    "higher_cc_precision": "average the gradients in float32 yourself",
    "optimizer_dtype": "keep the parameters in float32 (autocast for lower-precision compute) or keep float32 "
                       "master weights yourself",
}
_FLOAT32 = ("None", "torch.float32", "float32")

ZERO_REDUNDANCY_OPTIMIZER = '''class {name}({dist_optim}.ZeroRedundancyOptimizer):
    """torch_xla's ZeroRedundancyOptimizer (ZeRO-1) on torch's (added by tpu-migrate): the
    optimizer state sharded over the processes, and each step() first averages the gradients over
    them and, with grad_clipping (torch_xla's default), clips their norm to max_norm (default 1.0),
    as torch_xla's did; torch's does neither. Its state_dict() needs consolidate_state_dict(to=0)
    on every rank first (torch_xla's was each rank's shard)."""

    def __init__(self, params, optimizer_class, grad_clipping=True, max_norm=None, **defaults):
        {join_world}()
        super().__init__(params, optimizer_class=optimizer_class, **defaults)
        self.grad_clipping = grad_clipping
        self.max_norm = 1.0 if max_norm is None else max_norm
        self.grad_norm = None

    def step(self, closure=None):
        grads = [p.grad for group in self.param_groups for p in group["params"] if p.grad is not None]
        world = {dist}.get_world_size()
        if world > 1:
            for grad in grads:
                {dist}.all_reduce(grad)
                grad.div_(world)
        if self.grad_clipping:
            params = [p for group in self.param_groups for p in group["params"] if p.grad is not None]
            self.grad_norm = {torch}.nn.utils.clip_grad_norm_(params, self.max_norm)
        return super().step(closure)
'''


def _helper(sc: StatementContext) -> str:
    return helper(sc, "_ZeroRedundancyOptimizer", ZERO_REDUNDANCY_OPTIMIZER, join_world=join_world(sc))


def _default(name: str, value: cst.BaseExpression) -> bool:
    """An argument of LEFT given its default value (float32 master copies, a flag off)."""
    return cst_dotted(value) in (_FLOAT32 if name == "optimizer_dtype" else ("False",))


def _keyword(name: str, arg: cst.Arg) -> cst.Arg:
    return arg.with_changes(keyword=cst.Name(name), equal=KEYWORD_EQUAL)


def _positional(arg: cst.Arg) -> cst.Arg:
    return arg.with_changes(keyword=None, equal=cst.MaybeSentinel.DEFAULT)


@transform("zero_redundancy_optimizer", form=CALL)
def zero_redundancy_optimizer(call, qualname, sc: StatementContext, rule):
    """`ZeroRedundancyOptimizer(params, cls, ..., **defaults)` -> `_ZeroRedundancyOptimizer(...)`."""
    bound = bind(call, PARAMS)
    if bound is None or "params" not in bound or "optimizer_class" not in bound:
        sc.needs_manual(rule.code, "ZeroRedundancyOptimizer with *args / **kwargs or without params and "
                        "optimizer_class is not converted: " + rule.summary, qualname)
        return call
    left = [name for name in LEFT if given(bound, name) and not _default(name, bound[name].value)]
    if left:
        todo = "; ".join(f"{name}: {LEFT[name]}" for name in left)
        sc.needs_manual(rule.code, f"ZeroRedundancyOptimizer with {', '.join(left)} is not converted; {todo}",
                        qualname)
        return call
    where = sc.fixed(rule.code, qualname)
    dropped = [name for name in DROPPED if name in bound]
    if dropped and sc.enabled(rule.code):
        values = ", ".join(f"{name}={code(bound[name].value)}" for name in dropped)
        sc.needs_manual(rule.code, f"ZeroRedundancyOptimizer -> torch's: dropped {values} (collective and "
                        "checkpoint knobs with no counterpart there; no number changes)", where=where)
    # In their order: params and optimizer_class by position, the clipping options by keyword
    # (torch's takes its own options after optimizer_class), the optimizer's own options as given.
    names = {id(arg): name for name, arg in bound.items()}
    args = []
    for arg in call.args:
        name = names[id(arg)]
        if name in ("params", "optimizer_class"):
            args.append(_positional(arg))
        elif name in KEPT:
            args.append(_keyword(name, arg))
        elif name not in PARAMS:
            args.append(arg)
    return call.with_changes(func=cst.Name(_helper(sc)), args=clean_args(args))


__all__ = ["zero_redundancy_optimizer", "ZERO_REDUNDANCY_OPTIMIZER"]
