"""torch_xla utilities with a native form (rules/utilities.toml): activation checkpointing,
SyncBatchNorm, the persistent compilation cache, CPU copies (TPU125-TPU128)."""

from __future__ import annotations

import libcst as cst

from tpu_migrate.rewrite.context import StatementContext, parse_expr, parse_stmt
from tpu_migrate.rewrite.helper_code import CPU_COPIES
from tpu_migrate.rewrite.registry import CALL, REFERENCE, STATEMENT, transform
from tpu_migrate.rewrite.transforms.collectives import world_guard
from tpu_migrate.rewrite.transforms.common import (
    KEYWORD_EQUAL,
    bind,
    code,
    helper,
    literal_bool,
)

# -- TPU125: torch_xla.utils.checkpoint.checkpoint ------------------------------------------

CHECKPOINT = "{torch}.utils.checkpoint.checkpoint"


@transform("xla_checkpoint", form=CALL)
def xla_checkpoint(call, qualname, sc: StatementContext, rule):
    """torch_xla's checkpoint defaulted to use_reentrant=True; torch's warns when it is not
    passed (and its default may change): pass torch_xla's default explicitly."""
    keywords = {arg.keyword.value for arg in call.args if arg.keyword is not None}
    func = parse_expr(sc.file.import_plan.fill(CHECKPOINT))
    if "use_reentrant" in keywords:
        sc.fixed(rule.code, qualname)
        return call.with_changes(func=func)
    if any(arg.star == "**" for arg in call.args):
        # `**kwargs` may hold use_reentrant: a keyword of our own would then be passed twice.
        sc.fixed(rule.code, qualname)
        return call.with_changes(func=_reentrant_partial(sc))
    args = list(call.args)
    if args:
        args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    args.append(cst.Arg(cst.Name("True"), keyword=cst.Name("use_reentrant"), equal=KEYWORD_EQUAL))
    sc.fixed(rule.code, qualname)
    return call.with_changes(func=func, args=args)


@transform("xla_checkpoint", form=REFERENCE)
def xla_checkpoint_reference(node, qualname, sc: StatementContext, rule):
    """Passed around or patched in (`torch.utils.checkpoint.checkpoint = xla_checkpoint`): a
    partial bound now to torch's own function keeps torch_xla's default."""
    sc.fixed(rule.code, qualname)
    return _reentrant_partial(sc)


def _reentrant_partial(sc: StatementContext) -> cst.BaseExpression:
    return parse_expr(sc.file.import_plan.fill(f"{{functools}}.partial({CHECKPOINT}, use_reentrant=True)"))


# -- TPU126: torch_xla.core.functions.SyncBatchNorm ------------------------------------------

# torch_xla's module, on torch.distributed. torch.nn.SyncBatchNorm is no replacement: it keeps
# the unbiased variance in running_var (torch_xla the biased one), refuses CPU tensors in a
# process group, and its synchronized path needs kernels TorchTPU 0.2.0 lacks
# (batch_norm_stats, batch_norm_gather_stats_with_counts, batch_norm_elemt, ...).
SYNC_BATCH_NORM = '''class {name}({torch}.nn.Module):
    """torch_xla's SyncBatchNorm: in training, the batch statistics are averaged over the
    processes (equal batches assumed) and running_var keeps the biased variance (added by
    tpu-migrate)."""

    class _AllReduceSum({torch}.autograd.Function):
        """A sum over the processes whose gradient is summed over them too."""

        @staticmethod
        def forward(ctx, tensor):
            tensor = tensor.clone()
            {dist}.all_reduce(tensor)
            return tensor

        @staticmethod
        def backward(ctx, grad):
            grad = grad.clone()
            {dist}.all_reduce(grad)
            return grad

    def __init__(self, num_features, eps=1e-5, momentum=0.1):
        super().__init__()
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self.weight = {torch}.nn.Parameter({torch}.ones(num_features))
        self.bias = {torch}.nn.Parameter({torch}.zeros(num_features))
        self.register_buffer("running_mean", {torch}.zeros(num_features))
        self.register_buffer("running_var", {torch}.ones(num_features))

    def forward(self, batch):
        assert 2 <= batch.ndim <= 5 and batch.shape[1] == self.num_features
        dims = [dim for dim in range(batch.ndim) if dim != 1]
        if self.training:
            mean = {torch}.mean(batch, dim=dims)
            sqr_mean = {torch}.mean(batch * batch, dim=dims)
            if {dist}.is_initialized() and {dist}.get_world_size() > 1:
                scale = 1.0 / {dist}.get_world_size()
                mean = self._AllReduceSum.apply(mean) * scale
                sqr_mean = self._AllReduceSum.apply(sqr_mean) * scale
            var = sqr_mean - mean.pow(2)
            # The same values as torch_xla's, without its autograd history.
            self.running_mean = (1 - self.momentum) * self.running_mean + self.momentum * mean.detach()
            self.running_var = (1 - self.momentum) * self.running_var + self.momentum * var.detach()
        else:
            mean, var = self.running_mean, self.running_var
        shape = [1, self.num_features] + [1] * (batch.ndim - 2)
        return ((batch - mean.view(shape)) / {torch}.sqrt(var.view(shape) + self.eps)
                * self.weight.view(shape) + self.bias.view(shape))

    def extra_repr(self):
        return "%d, eps=%s" % (self.num_features, self.eps)
'''


@transform("sync_batch_norm", form=CALL)
def sync_batch_norm(call, qualname, sc: StatementContext, rule):
    """`xf.SyncBatchNorm(...)`: the file's own copy takes the same arguments."""
    return call.with_changes(func=sync_batch_norm_reference(call.func, qualname, sc, rule))


@transform("sync_batch_norm", form=REFERENCE)
def sync_batch_norm_reference(node, qualname, sc: StatementContext, rule):
    """`isinstance(m, xf.SyncBatchNorm)`, a base class: the file's own copy."""
    where = sc.fixed(rule.code, qualname)
    guard = world_guard(sc, rule.code, where)
    # Without the launcher's group the statistics still reach every process (see world_guard).
    template = SYNC_BATCH_NORM if "is_initialized" in guard else SYNC_BATCH_NORM.replace(
        "{dist}.is_initialized() and {dist}.get_world_size() > 1", guard)
    return cst.Name(helper(sc, "SyncBatchNorm", template))


# -- TPU127: xr.initialize_cache -------------------------------------------------------------

CACHE_ROOT = "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"


@transform("initialize_cache", form=STATEMENT)
def initialize_cache_statement(call, qualname, sc: StatementContext, rule, plans):
    """`xr.initialize_cache(path)` set torch_xla's cache variable; TorchTPU reads its own."""
    bound = bind(call, ["path", "readonly"])
    if bound is None or "path" not in bound:
        sc.needs_manual(rule.code, "cannot read the arguments of xr.initialize_cache", qualname)
        return None
    if literal_bool(bound.get("readonly"), False) is not False:
        sc.needs_manual(rule.code, f"TorchTPU has no read-only compilation cache: set {CACHE_ROOT} "
                        "for the processes that may write it, and give the others a copy", qualname)
        return None
    sc.fixed(rule.code, qualname)
    setting = sc.file.import_plan.fill("{os}.environ") + f'["{CACHE_ROOT}"] = {code(bound["path"].value)}\n'
    return [parse_stmt(setting)]


# -- TPU128: xm._maybe_convert_to_cpu --------------------------------------------------------


@transform("cpu_copies", form=CALL)
def cpu_copies(call, qualname, sc: StatementContext, rule):
    """`xm._maybe_convert_to_cpu(data)`: the tensors of `data` copied to the CPU, through
    dicts, lists and tuples (the helper xm.save's conversion adds too)."""
    bound = bind(call, ["data", "convert"])
    convert = literal_bool(bound.get("convert") if bound else None, True)
    if bound is None or "data" not in bound or convert is None:
        sc.needs_manual(rule.code, "cannot read the arguments of xm._maybe_convert_to_cpu "
                        "(`convert=` must be True or False)", qualname)
        return call
    sc.fixed(rule.code, qualname)
    data = bound["data"].value
    if not convert:
        # It only waited for the device to compute the tensors: eager tensors are computed.
        return data
    return cst.Call(func=cst.Name(helper(sc, "_cpu_copies", CPU_COPIES)), args=[cst.Arg(data)])


# -- TPU167, TPU168: xr.process_index(), xr.process_count() ----------------------------------
