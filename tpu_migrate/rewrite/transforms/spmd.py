"""torch_xla SPMD (rules/spmd.toml) in FSDP style as one process per device (TPU170, TPU171, TPU179; the sharded
device loader is in loaders.py).

SPMD drove every device from one process, and the program computed as on one device: a global
batch, global gradients. The common way to train with it is FSDP style: a mesh with one axis
over every device, the parameters sharded on it (`SpmdFullyShardedDataParallel`), the input
batch sharded on its first dimension (`MpDeviceLoader(..., input_sharding=ShardingSpec(mesh,
(axis, None, ...)))`). TorchTPU runs one process per device; the same computation there is
FSDP2's `fully_shard` over a 1-D mesh of every process, each process reading its slice of each
global batch, the gradients averaged over the processes. What cannot be known from the code is
checked when the program runs: a mesh with two axes longer than 1 raises rather than shard
differently, and so does a batch that does not split evenly. What SPMD computed over the
global batch inside the model, BatchNorm's statistics, is computed over every process's slice
(`_global_batch_norm`).

What changes with the process model is named in a TODO where `xr.use_spmd()` was: the program
now runs once per device, so everything it does (printing, saving) happens in every process, and
a value computed from a batch (the loss) is the process's slice's.
"""

from __future__ import annotations

import ast

import libcst as cst

from tpu_migrate.rewrite.batch_norms import may_hold_batch_norm
from tpu_migrate.rewrite.context import StatementContext
from tpu_migrate.rewrite.names import finding_position, mark_subtrees
from tpu_migrate.rewrite.helper_code import BATCH_SLICE
from tpu_migrate.rewrite.registry import CALL, STATEMENT, rule_code, transform
from tpu_migrate.rewrite.transforms.common import bind, code, given, helper, parse_block
from tpu_migrate.rewrite.transforms.fsdp import SPMD_FSDP, for_target, fully_shard_call, join_world
from tpu_migrate.rewrite.transforms.spmd_batch import marks_in, per_sample_values

USE_SPMD = "torch_xla.runtime.use_spmd"
IS_SPMD = "torch_xla.runtime.is_spmd"
SPMD_FSDP_CODE = rule_code("TPU179")
MESH = "torch_xla.distributed.spmd.Mesh"
ONE_AXIS_MESH = "torch_xla.distributed.spmd.get_1d_mesh"
SET_GLOBAL_MESH = "torch_xla.distributed.spmd.set_global_mesh"
GET_GLOBAL_MESH = "torch_xla.distributed.spmd.get_global_mesh"
SHARDING_SPEC = "torch_xla.distributed.spmd.ShardingSpec"
BATCH_SLICE_CODE = rule_code("TPU184")
MESH_RULE = rule_code("TPU171")

PROCESS_MODEL = (
    "SPMD ran this program once, driving every device; it now runs once per device: launch it with "
    "torchrun --nproc_per_node=<devices per host> (--nnodes=<hosts>), or TorchTPU's launcher. Each "
    "process now prints, logs and saves (do that on rank 0 only), and reads its own slice of each "
    "batch, so a value computed from a batch (the loss) is that slice's: average it over the "
    "processes (torch.distributed.all_reduce with ReduceOp.AVG) before reading it as the batch's"
)

DEVICE_MESH = '''def {name}(mesh_shape, axis_names=None):
    """torch_xla SPMD's xs.Mesh(device_ids, mesh_shape, axis_names) as a DeviceMesh (added by
    tpu-migrate). SPMD drove every device from one process; now each device has a process, and
    the mesh's one axis longer than 1 spans every process (however many devices the shape was
    computed from: FSDP-style sharding computes the same numbers over any number of shards). A
    mesh with two axes longer than 1 (tensor parallelism) raises rather than shard differently."""
    from torch.distributed.device_mesh import init_device_mesh

    shape = tuple(int(size) for size in mesh_shape)
    long_axes = [axis for axis, size in enumerate(shape) if size != 1]
    if len(long_axes) > 1:
        raise NotImplementedError(
            f"tpu-migrate: the SPMD mesh {{shape}} has {{len(long_axes)}} axes longer than 1; only a mesh "
            "with one axis over every device (FSDP style) was converted: build a multi-axis DeviceMesh "
            "and place the tensors on it by hand")
    {join_world}()
    world_shape = [1] * len(shape)
    world_shape[long_axes[0] if long_axes else 0] = {dist}.get_world_size()
    return init_device_mesh({device_type}, tuple(world_shape),
                            mesh_dim_names=tuple(axis_names) if axis_names is not None else None)
'''


def device_mesh(sc: StatementContext) -> str:
    return helper(sc, "_device_mesh", for_target(sc, DEVICE_MESH), join_world=join_world(sc))


@transform("use_spmd", form=STATEMENT, emits=("TPU170",))
def use_spmd(call, qualname, sc: StatementContext, rule, plans):
    """`xr.use_spmd()` goes, with a TODO saying what one process per device changes;
    `xr.is_spmd()` stays for a human."""
    if qualname != USE_SPMD or call.args:
        sc.needs_manual(rule.code, rule.summary, qualname)
        return None
    where = sc.fixed(rule.code, qualname)
    sc.needs_manual(rule.code, PROCESS_MODEL, where=where)
    return []


@transform("use_spmd", form=CALL)
def use_spmd_value(call, qualname, sc: StatementContext, rule):
    """`xr.is_spmd()` (or `use_spmd()` used as a value): for a human."""
    sc.needs_manual(rule.code, IS_SPMD_LEFT if qualname == IS_SPMD else rule.summary, qualname)
    return call


IS_SPMD_LEFT = ("`xr.is_spmd()` is True where xr.use_spmd() ran: one process drove every device; TorchTPU "
                "runs one process per device, so the SPMD branch's meaning is yours to port (sharding "
                "through DeviceMesh / FSDP2 / DTensor), then drop the test")


def _mesh_arguments(call: cst.Call, qualname: str) -> tuple[list[cst.Arg], cst.CSTNode | None] | None:
    """The helper's (mesh_shape, axis_names) for `xs.Mesh(ids, shape, names)` or
    `xs.get_1d_mesh(name)`, and the argument the helper does not take (the device ids), else
    None."""
    if qualname == MESH:
        bound = bind(call, ["device_ids", "mesh_shape", "axis_names"])
        if bound is None or set(bound) - {"device_ids", "mesh_shape", "axis_names"} or "mesh_shape" not in bound \
                or "device_ids" not in bound:
            return None
        args = [cst.Arg(bound["mesh_shape"].value)]
        if given(bound, "axis_names"):
            args.append(cst.Arg(bound["axis_names"].value))
        return args, bound["device_ids"].value
    if qualname == ONE_AXIS_MESH:
        bound = bind(call, ["axis_name"])
        if bound is None or set(bound) - {"axis_name"}:
            return None
        args = [cst.Arg(cst.Tuple([cst.Element(cst.Integer("1"))]))]  # one axis; its length is the world's
        if given(bound, "axis_name"):
            args.append(cst.Arg(cst.Tuple([cst.Element(bound["axis_name"].value)])))
        return args, None
    return None


@transform("spmd_mesh", form=CALL)
def spmd_mesh(call, qualname, sc: StatementContext, rule):
    """`xs.Mesh(ids, shape, names)` / `xs.get_1d_mesh(name)` -> `_device_mesh(shape, names)`."""
    converted = _mesh_arguments(call, qualname)
    if converted is None:
        sc.needs_manual(rule.code, _manual_mesh(qualname), qualname)
        return call
    args, device_ids = converted
    sc.fixed(rule.code, qualname)
    if device_ids is not None:  # `np.arange(n)`: numpy may have been imported for it alone
        sc.dropped_code([ast.parse(f"({code(device_ids)})", mode="eval")])
    return cst.Call(func=cst.Name(device_mesh(sc)), args=args)


@transform("spmd_mesh", form=STATEMENT)
def spmd_mesh_statement(call, qualname, sc: StatementContext, rule, plans):
    """`xs.set_global_mesh(mesh)` goes where nothing in the file reads the global mesh back
    (the converted SpmdFullyShardedDataParallel shards over every process without it), with a
    TODO where it was: other modules, and torch_xla's own kernels, may read it."""
    if qualname == SET_GLOBAL_MESH and GET_GLOBAL_MESH not in sc.file.analysis.qualnames and len(call.args) == 1:
        where = sc.fixed(rule.code, qualname)
        sc.needs_manual(rule.code, GLOBAL_MESH_GONE.format(mesh=code(call.args[0].value)), where=where)
        return []
    sc.needs_manual(rule.code, _manual_mesh(qualname), qualname)
    return None


# Where xs.set_global_mesh(mesh) went: nothing in its file read the mesh back, but code elsewhere
# may (a model's xs.get_global_mesh(), flash_attention's partition spec without a mesh).
GLOBAL_MESH_GONE = ("`xs.set_global_mesh({mesh})` was here: TorchTPU has no global mesh; code in other modules "
                    "that read it (xs.get_global_mesh(), torch_xla's flash_attention without mesh=) must be "
                    "handed this DeviceMesh")


def _manual_mesh(qualname: str) -> str:
    if qualname in (SET_GLOBAL_MESH, GET_GLOBAL_MESH):
        return ("the global mesh has no TorchTPU counterpart: pass the DeviceMesh where it is used "
                "(init_device_mesh(device_type, shape, mesh_dim_names=names))")
    return ("build the DeviceMesh by hand: init_device_mesh(\"tpu\", mesh_shape, mesh_dim_names=axis_names), "
            "or DeviceMesh(\"tpu\", torch.tpu.distributed.topology_aware_mesh(mesh_shape, dcn_mesh_shape=...), "
            "mesh_dim_names=axis_names) for a hybrid (ICI x DCN) mesh")


# torch_xla Mesh attributes that a DeviceMesh names otherwise or lacks, read on a name bound to a
# mesh TPU171 converts: what to write instead.
MESH_ATTRIBUTES = {
    "mesh_shape": "tuple({mesh}.shape)",
    "axis_names": "{mesh}.mesh_dim_names",
    "shape": "{mesh}.shape (a tuple of sizes; torch_xla's shape() was a dict of axis name to size)",
    "device_ids": "{mesh}.mesh.flatten().tolist() (ranks, not device ids)",
    "get_logical_mesh": "{mesh}.mesh (a tensor of ranks)",
    "get_axis_name_idx": "{mesh}.mesh_dim_names.index(name)",
    "get_op_sharding": "a DTensor placement (TPU172)",
}


def mesh_attribute_reads(analysis) -> dict[int, list[tuple[int, int, str, str]]]:
    """id(statement) -> (line, col, mesh, attribute) of each read of a torch_xla Mesh attribute on a
    name assigned `xs.Mesh(...)` / `xs.get_1d_mesh(...)` in the file; those statements are marked
    for the walk."""
    meshes = set()
    for info in analysis.infos.values():
        node = info.node
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.value, ast.Call) and any(
                ref.qualname in (MESH, ONE_AXIS_MESH) and (ref.line, ref.col) == finding_position(node.value.func)
                for ref in info.refs):
            target = ast.unparse(node.targets[0])
            if isinstance(node.targets[0], (ast.Name, ast.Attribute)):
                meshes.add(target)
    reads: dict[int, list[tuple[int, int, str, str]]] = {}
    for _, dotted, info, line, col in analysis.loads if meshes else ():
        mesh, _, attribute = dotted.rpartition(".")
        if mesh in meshes and attribute in MESH_ATTRIBUTES:
            info.forced = True
            reads.setdefault(id(info.node), []).append((line, col + 1, mesh, attribute))
    if reads:
        mark_subtrees(analysis.tree.body, analysis.infos)
    return reads


@transform("spmd_mesh", on="statement")
def mesh_attribute_statement(small, sc: StatementContext):
    """A TODO on each read of a torch_xla Mesh attribute that the converted mesh lacks."""
    reads = sc.file.plans.mesh_attribute_reads.pop(id(sc.info.node), ())
    if reads and sc.enabled(MESH_RULE) and sc.file.options.fix_level != "safe":
        for line, col, mesh, attribute in reads:
            advice = MESH_ATTRIBUTES[attribute].format(mesh=mesh)
            sc.needs_manual(MESH_RULE, f"`{mesh}.{attribute}` is torch_xla's Mesh's; {mesh} is now a DeviceMesh: "
                            f"{advice}", where=(line, col))
    return None


# SpmdFullyShardedDataParallel.__init__'s parameters (torch_xla 2.9): module, then keywords.
SPMD_FSDP_PARAMS = ["module", "mesh", "shard_output", "auto_wrap_policy", "auto_wrapper_callable",
                    "extra_data_axis"]
# What FSDP2 cannot do the same way: the call is left, with what to write.
SPMD_FSDP_LEFT = {
    "shard_output": "FSDP2 leaves a module's output on each process unsharded; port the output "
                    "placement by hand",
    "extra_data_axis": "a second data axis is hybrid sharding: fully_shard(m, mesh=<2-D DeviceMesh>)",
}


# SPMD computed a BatchNorm's statistics over the global batch: one program, XLA reducing over
# the devices that held its slices. With one process per slice, nn.BatchNorm would take its
# slice's (other numbers at more than one process). The same mean and variance from the slices
# (equal ones: _batch_slice and the sharded loader raise on others), two-pass as PyTorch's, each
# all-reduce's gradient summed over the processes as torch.nn.SyncBatchNorm's; the running
# statistics as nn.BatchNorm updates them, with the global batch's count. Not
# torch.nn.SyncBatchNorm itself: it refuses CPU tensors in a process group (the portable target),
# and its kernels (batch_norm_gather_stats_with_counts, ...) are not among TorchTPU 0.2.0's.
GLOBAL_BATCH_NORM = '''def {name}(module):
    """SPMD's BatchNorm over the global batch (added by tpu-migrate): SPMD normalized by the whole
    global batch's mean and variance; each process now holds a slice of it, so the BatchNorms of
    `module` that use batch statistics (in training, or without running statistics) take them
    over every process's slice, as one batch, and update the running statistics with them.
    Returns `module`."""
    from torch.distributed.nn.functional import all_reduce

    def forward(self, batch):
        if not (self.training or self.running_mean is None) or {dist}.get_world_size() == 1:
            return type(self).forward(self, batch)
        self._check_input_dim(batch)
        world = {dist}.get_world_size()
        dims = [dim for dim in range(batch.dim()) if dim != 1]
        shape = [1, -1] + [1] * (batch.dim() - 2)
        mean = all_reduce(batch.mean(dims)) / world
        centred = batch - mean.view(shape)
        var = all_reduce((centred * centred).mean(dims)) / world
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            momentum = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
            count = batch.numel() // batch.shape[1] * world
            with {torch}.no_grad():
                self.running_mean.mul_(1 - momentum).add_(momentum * mean)
                self.running_var.mul_(1 - momentum).add_(momentum * var * count / max(count - 1, 1))
        normalized = centred * {torch}.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            return normalized * self.weight.view(shape) + self.bias.view(shape)
        return normalized

    for child in module.modules():
        if isinstance(child, {torch}.nn.modules.batchnorm._BatchNorm) and not isinstance(child, {torch}.nn.SyncBatchNorm):
            child.forward = forward.__get__(child)
    return module
'''


@transform("spmd_fsdp", form=CALL, emits=("TPU179",))
def spmd_fsdp(call, qualname, sc: StatementContext, rule):
    """`SpmdFullyShardedDataParallel(module, mesh=..., auto_wrap_policy=...)` ->
    `_fully_shard(_global_batch_norm(module), auto_wrap_policy=...)`: sharded over every process,
    which is the mesh's `fsdp` axis once each device has a process (the converted mesh raises
    where it is not), its BatchNorms' statistics still the global batch's (`_fully_shard(module,
    ...)` where the file shows a model without BatchNorm)."""
    new = fully_shard_call(call, qualname, sc, rule, SPMD_FSDP_PARAMS, SPMD_FSDP_LEFT, manual_code=rule.code,
                           name="SpmdFullyShardedDataParallel")
    if new is call:  # left for a human
        return call
    module, *rest = new.args
    batch_norm = global_batch_norm(sc, code(module.value))
    if batch_norm is None:
        return new
    return new.with_changes(args=[module.with_changes(value=cst.Call(func=cst.Name(batch_norm),
                                                                     args=[cst.Arg(module.value)])), *rest])


def global_batch_norm(sc: StatementContext, model: str) -> str | None:
    """The name of the `_global_batch_norm` helper for the model `model` (source text) that the
    statement shards; None where the file shows the model holds no BatchNorm (batch_norms.py)."""
    if not may_hold_batch_norm(model, sc.info.node, sc.file.analysis, sc.file.memo):
        return None
    return helper(sc, "_global_batch_norm", GLOBAL_BATCH_NORM)


def sharded_loader_axis(sharding: cst.BaseExpression, sc: StatementContext) -> cst.BaseExpression | None:
    """The mesh axis of `xs.ShardingSpec(mesh, (axis, None, ...))`: a batch sharded on its first
    dimension over one axis, the FSDP-style input; None for any other sharding."""
    if not (isinstance(sharding, cst.Call) and sc.resolve(sharding.func) == SHARDING_SPEC):
        return None
    bound = bind(sharding, ["mesh", "partition_spec", "minibatch"])
    if bound is None or set(bound) != {"mesh", "partition_spec"}:
        return None
    return batch_axis(bound["partition_spec"].value)


def batch_axis(spec: cst.BaseExpression) -> cst.BaseExpression | None:
    """The mesh axis of a partition spec `(axis, None, ...)`: the first dimension sharded over
    one axis, given by name or index, the rest replicated; None for any other spec."""
    if not isinstance(spec, (cst.Tuple, cst.List)) or not spec.elements:
        return None
    first, *rest = [element.value for element in spec.elements]
    if not isinstance(first, (cst.SimpleString, cst.Integer)):
        return None
    if not all(isinstance(value, cst.Name) and value.value == "None" for value in rest):
        return None
    return first


def gradients_averaged(sc: StatementContext) -> bool:
    """Whether the file wraps its model in SpmdFullyShardedDataParallel and may convert it, or
    converts a loop that marks its parameters (TPU185): then FSDP2 averages the processes'
    gradients, and each process may read a slice of the batch."""
    return (SPMD_FSDP in sc.file.analysis.qualnames and sc.fix_allowed(SPMD_FSDP_CODE)
            or bool(sc.file.plans.sharded_parameter_loops))


def sharding_mesh(sharding: cst.Call) -> cst.BaseExpression:
    return bind(sharding, ["mesh", "partition_spec"])["mesh"].value


# -- TPU172: the SPMD annotations that stay, each TODO saying what to write ----------------------

MARK_SHARDING = "torch_xla.distributed.spmd.mark_sharding"
_ANNOTATIONS = {
    "torch_xla.distributed.spmd.enable_manual_sharding":
        "manual sharding: under torch.distributed each process holds its own shard; take it with "
        "DTensor.to_local() (and back with DTensor.from_local(t, mesh, placements))",
    "torch_xla.distributed.spmd.disable_manual_sharding":
        "back from manual sharding: DTensor.from_local(t, mesh, placements) makes the global tensor of "
        "the processes' shards",
    "torch_xla.distributed.spmd.clear_sharding":
        "a replicated copy: t.full_tensor() (or t.redistribute(mesh, [Replicate()] * mesh.ndim))",
    "torch_xla.distributed.spmd.shard_as":
        "the same layout for both: distribute_tensor (or redistribute) each with the other's placements",
}


def _placements(spec: cst.BaseExpression) -> str | None:
    """What `xs.mark_sharding`'s written-out partition spec means as DTensor placements, one
    clause per sharded tensor dimension (`mesh axis 'model' -> Shard(1)`), or None."""
    if not isinstance(spec, (cst.Tuple, cst.List)):
        return None
    clauses = []
    for dim, element in enumerate(spec.elements):
        value = element.value
        axes = value.elements if isinstance(value, cst.Tuple) else [cst.Element(value)]
        for axis in axes:
            axis = axis.value
            if isinstance(axis, cst.Name) and axis.value == "None":
                continue
            if not isinstance(axis, (cst.SimpleString, cst.Integer)):
                return None
            name = f"mesh axis {axis.value}" if isinstance(axis, cst.SimpleString) else f"mesh dimension {axis.value}"
            clauses.append(f"{name} -> Shard({dim})")
    return ", ".join(clauses) or "nothing sharded"


@transform("spmd_sharding", form=STATEMENT, emits=("TPU184",))
def spmd_batch_sharding(call, qualname, sc: StatementContext, rule, plans):
    """`xs.mark_sharding(batch, mesh, (axis, None, ...))` as a statement, on a batch the training
    loop reads, in a file whose model SpmdFullyShardedDataParallel wraps (converted to FSDP2,
    which averages the processes' gradients) -> `batch = _batch_slice(batch, mesh, axis)`: each
    process keeps its slice, as the sharded loader does, and with it its slice of every other
    value the step reads per sample (`x, y = _batch_slice((x, y), mesh, axis)`: spmd_batch.py);
    where those cannot be told, a TODO says what to slice. Anything else (a parameter, an
    activation in the model's code, another spec) stays, with what to write (TPU172)."""
    bound = bind(call, ["t", "mesh", "partition_spec"])
    axis = batch_axis(bound["partition_spec"].value) if bound and set(bound) == {"t", "mesh", "partition_spec"} else None
    batch = bound["t"].value if axis is not None else None
    chain = _training_loop(batch, sc) if isinstance(batch, (cst.Name, cst.Attribute, cst.Subscript)) else None
    if chain is None or not gradients_averaged(sc) or not sc.fix_allowed(BATCH_SLICE_CODE):
        spmd_sharding(call, qualname, sc, rule)
        return None
    where = sc.fixed(BATCH_SLICE_CODE, qualname)
    name = helper(sc, "_batch_slice", BATCH_SLICE)
    mark = sc.info.node
    marked = mark.value.args[0] if mark.value.args else next(k.value for k in mark.value.keywords if k.arg == "t")
    values = per_sample_values(marked, mark, chain, marks_in(chain[0], mark, lambda other: _slices_itself(other, sc)))
    mesh = code(bound["mesh"].value)
    if values.unknown:
        sc.needs_manual(BATCH_SLICE_CODE, _unknown_values(values, name, mesh, code(axis)), where=where)
    if len(values.together) == 1:
        return parse_block([f"{values.together[0]} = {name}({values.together[0]}, {mesh}, {code(axis)})"])
    together = ", ".join(values.together)
    return parse_block([f"{together} = {name}(({together}), {mesh}, {code(axis)})"])


def _unknown_values(values, name: str, mesh: str, axis: str) -> str:
    """The TODO where the marked batch comes from nothing that shows its per-sample partners."""
    marked, first = values.together[0], values.unknown[0]
    read = ", ".join(f"`{text}`" for text in values.unknown)
    held = first if first.isidentifier() else "part"
    example = f"`{marked}, {held} = {name}(({marked}, {first}), {mesh}, {axis})`" + (
        "" if held == first else f", then read `{held}` in its place")
    return (f"only `{marked}` is now this process's slice of the global batch: tpu-migrate cannot tell whether "
            f"the other values this step reads from the loop ({read}) hold one row per sample of it; slice each "
            f"that does with it, in one call ({example}), or the step pairs this slice with the whole batch's")


def _slices_itself(statement: ast.Expr, sc: StatementContext) -> ast.expr | None:
    """The tensor that another marking statement of the loop slices itself (TPU184 converts it
    too: the file's conditions are the same), else None."""
    call = statement.value
    info = sc.file.analysis.infos.get(id(statement))
    if info is None or not any(ref.qualname == MARK_SHARDING and (ref.line, ref.col) == finding_position(call.func)
                               for ref in info.refs):
        return None
    arguments = dict(zip(("t", "mesh", "partition_spec"), call.args)) | {k.arg: k.value for k in call.keywords}
    spec, tensor = arguments.get("partition_spec"), arguments.get("t")
    if not isinstance(spec, (ast.Tuple, ast.List)) or not spec.elts or len(arguments) != 3:
        return None
    first, *rest = spec.elts
    if not (isinstance(first, ast.Constant) and type(first.value) in (str, int)) or any(
            not (isinstance(value, ast.Constant) and value.value is None) for value in rest):
        return None
    return tensor if isinstance(tensor, (ast.Name, ast.Attribute, ast.Subscript)) else None


def _training_loop(batch: cst.BaseExpression, sc: StatementContext) -> list[ast.AST] | None:
    """The statements from the `for` loop around the statement down to its parent, where
    `batch` (its root name) is what the loop reads each iteration, bound by the loop's target
    or assigned in its body, outside any class: the training loop's batch, not an activation
    of the model's code (which runs inside the process's slice already, and would be sliced
    twice). Else None."""
    root = batch
    while isinstance(root, (cst.Attribute, cst.Subscript)):
        root = root.value
    if not isinstance(root, cst.Name):
        return None
    chain = sc.ancestors
    if chain is None or any(isinstance(node, ast.ClassDef) for node in chain):
        return None
    for at in range(len(chain) - 1, -1, -1):
        node = chain[at]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return None  # no loop of this function holds it
        if isinstance(node, (ast.For, ast.AsyncFor)):
            if any(isinstance(n, ast.Attribute) and n.attr in _MODULE_WALKS for n in ast.walk(node.iter)):
                return None  # `for param in model.parameters()`: a parameter, not a batch
            bound = {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
            assigned = {n.id for stmt in node.body for n in ast.walk(stmt)
                        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            return chain[at:] if root.value in bound | assigned else None
    return None


# nn.Module's walks over its own tensors and submodules: a loop over one marks the model.
_MODULE_WALKS = frozenset({"parameters", "named_parameters", "buffers", "named_buffers", "modules",
                           "named_modules", "children", "named_children", "state_dict"})


@transform("spmd_sharding", form=CALL)
def spmd_sharding(call, qualname, sc: StatementContext, rule):
    """An SPMD annotation left for a human, with the DTensor call that replaces it."""
    if qualname == MARK_SHARDING:
        refused = sc.file.plans.parameter_mark_refusals.get(id(sc.info.node))
        if refused is not None:
            sc.needs_manual(rule.code, "`xs.mark_sharding` of each parameter is FSDP style, but " + refused, qualname)
            return call
        bound = bind(call, ["t", "mesh", "partition_spec"])
        placements = _placements(bound["partition_spec"].value) if bound and "partition_spec" in bound else None
        if placements is not None:
            sc.needs_manual(rule.code, (
                "`xs.mark_sharding` becomes a DTensor placement: torch.distributed.tensor.distribute_tensor(t, "
                f"mesh, placements), one placement per mesh axis: {placements}, Replicate() for every other axis; a parameter: "
                "shard its module instead (fully_shard, or parallelize_module with ColwiseParallel / "
                "RowwiseParallel on a tensor-parallel axis); an activation: DTensor.redistribute"), qualname)
            return call
    what = _ANNOTATIONS.get(qualname)
    sc.needs_manual(rule.code, f"`xs.{qualname.rsplit('.', 1)[1]}`: {what}" if what else rule.summary, qualname)
    return call


__all__ = ["use_spmd", "use_spmd_value", "spmd_mesh", "spmd_mesh_statement", "spmd_fsdp", "spmd_sharding",
           "spmd_batch_sharding", "SHARDING_SPEC", "sharded_loader_axis", "batch_axis", "gradients_averaged",
           "sharding_mesh"]
