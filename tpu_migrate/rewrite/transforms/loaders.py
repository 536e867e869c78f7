"""Device loaders (rules/loaders.toml): `MpDeviceLoader` / `ParallelLoader` become the plain loader plus a move (TPU040);
`xu.SampleGenerator(data, n)` becomes `[data] * n` (TPU041).

Iterated in a `for` of the same function, the loop iterates the plain loader and moves each batch.
Held anywhere else (an attribute, an argument, a return value), `MpDeviceLoader(loader, device)`
becomes a small class added to the file (DEVICE_LOADER) that keeps what callers use of it: a new
pass over `loader` at every `iter()` (each epoch), batches moved to `device`, `len()`.
"""

from __future__ import annotations

import ast

import libcst as cst

from tpu_migrate.rewrite.context import StatementContext, cst_dotted, parse_stmt
from tpu_migrate.rewrite.plans import MP_DEVICE_LOADER, PARALLEL_LOADER
from tpu_migrate.rewrite.registry import CALL, REFERENCE, rule_code, transform
from tpu_migrate.rewrite.transforms import spmd
from tpu_migrate.rewrite.transforms.common import (
    TO_DEVICE,
    code,
    bind,
    given,
    helper,
)

# What an MpDeviceLoader is to the code that holds it. It keeps `_loader` and `_device`, which
# code around MpDeviceLoader reads (Lightning: `dataloader._loader.dataset`).
DEVICE_LOADER = '''class {name}:
    """pl.MpDeviceLoader's stand-in: each pass moves `loader`'s batches to `device` anew."""

    def __init__(self, loader, device):
        self._loader = loader
        self._device = device

    def __iter__(self):
        for batch in self._loader:
            yield {map_tensors}(batch, lambda t: t.to(self._device))

    def __len__(self):
        return len(self._loader)
'''
# MpDeviceLoader with an FSDP-style input_sharding (spmd.py): each process keeps its slice.
SHARDED_DEVICE_LOADER = '''class {name}:
    """pl.MpDeviceLoader(loader, device, input_sharding=xs.ShardingSpec(mesh, (axis, None, ...)))'s
    stand-in (added by tpu-migrate). SPMD read each global batch in one process and sharded its
    first dimension over the mesh's `axis`; with one process per device, each process reads the
    global batch and keeps its own slice of it ({batch_slice}), so together the processes compute
    on the same global batch."""

    def __init__(self, loader, device, mesh, axis):
        self._loader = loader
        self._device = device
        self._mesh, self._axis = mesh, axis

    def __iter__(self):
        for batch in self._loader:
            batch = {batch_slice}(batch, self._mesh, self._axis)
            yield {map_tensors}(batch, lambda t: t.to(self._device))

    def __len__(self):
        return len(self._loader)
'''
# What a ParallelLoader held in a variable (`para_loader.per_device_loader(device)` passed on) is
# to its code: torch_xla started one pass over the loader when it was made, and the iterators
# per_device_loader gave shared that pass (one device per process, so one queue).
PARALLEL_LOADER_CLASS = '''class {name}:
    """pl.ParallelLoader(loader, [device])'s stand-in (added by tpu-migrate): one pass over
    `loader`, begun when it is made; per_device_loader(device) iterates that pass, each batch
    moved to `device`, len() is len(loader), and close() has nothing to stop."""

    def __init__(self, loader):
        self._loader = loader
        self._pass = iter(loader)
        self._device = None

    def per_device_loader(self, device):
        self._device = device
        return self

    def __iter__(self):
        return self

    def __next__(self):
        return {map_tensors}(next(self._pass), lambda t: t.to(self._device))

    def __len__(self):
        return len(self._loader)

    def close(self):
        pass  # no threads move the batches here: nothing to stop
'''
# The ShardingSpec's own finding, taken back when the loader converts with it.
SPMD_SHARDING_CODE = rule_code("TPU172")
# MpDeviceLoader's keywords that only tune its background threads and its implicit
# `torch_xla.sync()` every `batches_per_execution` batches (eager TorchTPU has no step to cut);
# `batchdim` is stored by ParallelLoader and never read. Dropping them keeps the batches.
_TUNING_KEYWORDS = frozenset({"loader_prefetch_size", "device_prefetch_size",
                              "host_to_device_transfer_threads", "batches_per_execution", "batchdim"})
# MpDeviceLoader's own state, which the added class does not have.
_LOADER_INTERNALS = frozenset({"_parallel_loader", "_parallel_loader_kwargs"})
# Marks a loop-only loader variable that stays a loader (the added class, or the call left for a
# human): its loops stay as they are.
LOOPS_KEPT = cst.Name("_loops_kept")


def _loader_parts(expr: cst.BaseExpression, sc: StatementContext):
    """(cpu loader, device, qualnames consumed) for a device-loader expression, else None."""
    if not isinstance(expr, cst.Call):
        return None
    qualname = sc.resolve(expr.func)
    if qualname == MP_DEVICE_LOADER:
        bound = bind(expr, ["loader", "device"])
        if bound is None or "loader" not in bound or "device" not in bound:
            return None
        if set(bound) - {"loader", "device"} - _TUNING_KEYWORDS:
            return None
        return bound["loader"].value, bound["device"].value, [qualname]
    if (
        isinstance(expr.func, cst.Attribute)
        and expr.func.attr.value == "per_device_loader"
        and isinstance(expr.func.value, cst.Call)
        and sc.resolve(expr.func.value.func) == PARALLEL_LOADER
        and len(expr.args) == 1
    ):
        inner = bind(expr.func.value, ["loader", "devices"])
        if inner is None or "loader" not in inner:
            return None
        return inner["loader"].value, expr.args[0].value, [PARALLEL_LOADER]
    return None


def _movable_device(device: cst.BaseExpression, sc: StatementContext) -> bool:
    """A device expression that may be repeated in each move: a name or a device constructor."""
    if isinstance(device, (cst.Name, cst.Attribute, cst.SimpleString)):
        return True
    if isinstance(device, cst.BooleanOperation):  # the portable device expression
        return "current_accelerator" in code(device)
    if isinstance(device, cst.Call):
        qualname = sc.resolve(device.func)
        rule = sc.file.catalog.lookup(qualname)
        if rule is not None and rule.transform == "device_call":  # xm.xla_device() (TPU001)
            return True
        torch = sc.file.import_plan.names["torch"]
        return qualname == "torch.device" or cst_dotted(device.func) == f"{torch}.device"
    return False


def _move_target_ok(target: cst.BaseExpression) -> bool:
    if isinstance(target, cst.Name):
        return True
    return isinstance(target, (cst.Tuple, cst.List)) and bool(target.elements) and all(
        isinstance(e, cst.Element) and isinstance(e.value, cst.Name) for e in target.elements
    )


def _move_statement(target: cst.BaseExpression, device: cst.BaseExpression, sc) -> cst.BaseStatement:
    """The loop's first statement: what the device loader moved, moved. torch_xla moved the
    tensors of each batch and passed anything else through (file names, a list of dicts), so
    an unpacked batch's parts go through the same walk, not `.to()` each."""
    dev = code(device)
    if isinstance(target, cst.Name):
        moved = sc.fill(TO_DEVICE, device=dev, obj=target.value)
        return parse_stmt(f"{target.value} = {moved}\n")
    names = ", ".join(e.value.value for e in target.elements) + ("," if len(target.elements) == 1 else "")
    moved = sc.fill(TO_DEVICE, device=dev, obj=f"({names})")
    return parse_stmt(f"{names} = {moved}\n")


@transform("device_loader", on="loop")
def device_loader_loop(stmt: cst.For, sc: StatementContext, plans, expr_rewriter):
    """`for b in MpDeviceLoader(loader, d):` -> `for b in loader:` + a move. Returns (for, prefix)."""
    if not sc.fix_allowed("TPU040"):
        return stmt, []  # the header's device loader is then reported by the expression rules
    iterable, target = stmt.iter, stmt.target
    wrapped = None
    if (
        isinstance(iterable, cst.Call)
        and isinstance(iterable.func, cst.Name)
        and iterable.func.value == "enumerate"
        and iterable.args
        and iterable.args[0].keyword is None
    ):
        wrapped = iterable
        iterable = iterable.args[0].value
        if not (isinstance(target, cst.Tuple) and len(target.elements) == 2):
            return stmt, []
        target = target.elements[1].value
    parts = _loader_parts(iterable, sc)
    consumed = []
    if parts is not None:
        loader, device, consumed = parts
    elif isinstance(iterable, cst.Name) and (id(sc.scope), iterable.value) in plans.loader_vars:
        device = sc.file.loader_vars.get((id(sc.scope), iterable.value))
        if device is LOOPS_KEPT:
            return stmt, []
        if device is None:
            sc.needs_manual(
                "TPU040",
                f"move the batches of `{iterable.value}` to the device: the loader is "
                "assigned after this loop",
                where=sc.where,
            )
            return stmt, []
        inline = plans.inline_loaders.get((id(sc.scope), iterable.value))
        loader = cst.Name(inline) if inline is not None else iterable
    else:
        return stmt, []
    if not _move_target_ok(target):
        return stmt, []  # left for the expression rules: reported as manual
    if consumed:
        # The device argument leaves the header: rewrite `xm.xla_device()` in it here.
        device = expr_rewriter.rewrite(device)
        if not _movable_device(device, sc):
            return stmt, []
    move = _move_statement(target, device, sc)
    for qualname in consumed:
        sc.fixed("TPU040", qualname)
    if not consumed:
        sc.fixed("TPU040", where=sc.where)
    new_iter = loader
    if wrapped is not None:
        new_iter = wrapped.with_changes(args=[wrapped.args[0].with_changes(value=loader), *wrapped.args[1:]])
    return stmt.with_changes(iter=new_iter), [move]


@transform("device_loader", form=CALL)
def device_loader(call, qualname, sc: StatementContext, rule):
    """A device loader outside a `for` header: the plain loader where it is assigned to a
    loop-only variable, else the added class (DEVICE_LOADER) in its place."""
    if qualname == PER_DEVICE_LOADER:
        sc.needs_manual(rule.code, "a PerDeviceLoader made directly: replace it with the plain DataLoader and "
                        "move each batch with .to(device) in the loop", qualname)
        return call
    node = sc.info.node
    plans = sc.file.plans
    loop_only = (
        qualname == MP_DEVICE_LOADER
        and isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and (id(sc.scope), node.targets[0].id) in plans.loader_vars
    )
    if loop_only:
        parts = _loader_parts(call, sc)
        if parts is not None and _movable_device(parts[1], sc):
            sc.file.loader_vars[(id(sc.scope), node.targets[0].id)] = parts[1]
            sc.fixed(rule.code, qualname)
            return parts[0]
    if qualname != MP_DEVICE_LOADER:
        return _parallel_loader(call, qualname, sc, rule)
    if loop_only:
        sc.file.loader_vars[(id(sc.scope), node.targets[0].id)] = LOOPS_KEPT
    return _wrapped_loader(call, qualname, sc, rule)


def _wrapped_loader(call, qualname, sc: StatementContext, rule):
    """`MpDeviceLoader(loader, device, ...)` -> `_DeviceLoader(loader, device)`, or the call
    kept with a manual finding saying what the class would not keep."""
    bound = bind(call, ["loader", "device"])
    if bound is None or "loader" not in bound or "device" not in bound:
        problem = "cannot read the loader and device arguments"
    elif given(bound, "input_sharding"):
        return _sharded_loader(call, bound, qualname, sc, rule)
    elif unknown := _unknown_arguments(bound):
        problem = f"unknown argument `{unknown[0]}=`"
    elif _reads_loader_internals(sc):
        problem = "the file reads MpDeviceLoader's `_parallel_loader` state, which a plain loader lacks"
    else:
        name = helper(sc, "_DeviceLoader", DEVICE_LOADER)
        sc.fixed(rule.code, qualname)
        return cst.Call(
            func=cst.Name(name),
            args=[cst.Arg(bound["loader"].value), cst.Arg(bound["device"].value)],
        )
    sc.needs_manual(
        rule.code,
        f"{problem}; replace the device loader by hand: the plain DataLoader, each batch moved "
        "with .to(device)",
        qualname,
    )
    return call


def _parallel_loader(call, qualname, sc: StatementContext, rule):
    """`pl.ParallelLoader(loader, [device], ...)` outside a `for` header -> `_ParallelLoader(loader)`
    (PARALLEL_LOADER_CLASS), or the call kept with a manual finding saying why."""
    bound = bind(call, ["loader", "devices"])
    devices = bound.get("devices") if bound is not None else None
    if bound is None or "loader" not in bound or devices is None:
        problem = "cannot read the loader and devices arguments"
    elif not (isinstance(devices.value, (cst.List, cst.Tuple)) and len(devices.value.elements) == 1
              and isinstance(devices.value.elements[0], cst.Element)):
        problem = ("it is not given one device (`[device]`): with several, it dealt the batches out among "
                   "them, and TorchTPU runs one process per TPU")
    elif unknown := sorted(set(bound) - {"loader", "devices"} - _TUNING_KEYWORDS):
        problem = f"unknown argument `{unknown[0]}=`"
    elif _other_parallel_loader_uses(sc):
        problem = "the file uses a ParallelLoader's other methods or state, which the stand-in lacks"
    else:
        sc.fixed(rule.code, qualname)
        return cst.Call(func=cst.Name(helper(sc, "_ParallelLoader", PARALLEL_LOADER_CLASS)),
                        args=[cst.Arg(bound["loader"].value)])
    sc.needs_manual(rule.code, f"{problem}; replace the device loader with the plain DataLoader and move each "
                    "batch with .to(device) in the loop; without the move the batches stay on the CPU", qualname)
    return call


def _other_parallel_loader_uses(sc: StatementContext) -> bool:
    """Whether a name or attribute the file binds to a ParallelLoader (`para`, `self.para`) is
    used other than through the stand-in's methods (`._cpu_loader`, `.batches_queue`). Once per file."""
    found = sc.file.memo.get("other_parallel_loader_uses")
    if found is None:
        nodes = sc.file.analysis.nodes
        held = {ast.unparse(target) for node in nodes if isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Call) and _called_name(node.value.func) == "ParallelLoader"
                for target in node.targets if isinstance(target, (ast.Name, ast.Attribute))}
        found = sc.file.memo["other_parallel_loader_uses"] = bool(held) and any(
            isinstance(node, ast.Attribute) and node.attr not in _PARALLEL_LOADER_METHODS
            and isinstance(node.value, (ast.Name, ast.Attribute)) and ast.unparse(node.value) in held
            for node in nodes)
    return found


# What the stand-in has of a ParallelLoader (PARALLEL_LOADER_CLASS).
_PARALLEL_LOADER_METHODS = frozenset({"per_device_loader", "close"})


def _called_name(func: ast.expr) -> str | None:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def _sharded_loader(call, bound, qualname, sc: StatementContext, rule):
    """`MpDeviceLoader(loader, device, input_sharding=xs.ShardingSpec(mesh, (axis, None, ...)))`
    -> `_ShardedDeviceLoader(loader, device, mesh, axis)`, where the file's model is wrapped in
    SpmdFullyShardedDataParallel (converted to FSDP2, which averages the processes' gradients);
    else the call is kept with what to write."""
    sharding = bound["input_sharding"].value
    axis = spmd.sharded_loader_axis(sharding, sc)
    unknown = _unknown_arguments(bound)
    if axis is None:
        problem = ("`input_sharding=` shards each batch over the SPMD mesh other than on its first "
                   "dimension over one mesh axis (FSDP style): place the batch with DTensor by hand")
    elif unknown:
        problem = f"unknown argument `{unknown[0]}=` beside an FSDP-style `input_sharding=`"
    elif _reads_loader_internals(sc):
        problem = "the file reads MpDeviceLoader's `_parallel_loader` state, which a plain loader lacks"
    elif not spmd.gradients_averaged(sc):
        problem = ("`input_sharding=` shards each batch over the SPMD mesh, and the file has no "
                   "SpmdFullyShardedDataParallel to convert: with one process per device, each process "
                   "must read its slice of the batch and the gradients be averaged over the processes "
                   "(wrap the model in DistributedDataParallel or fully_shard)")
    else:
        sc.retract(SPMD_SHARDING_CODE, spmd.SHARDING_SPEC)
        sc.fixed(rule.code, qualname)
        name = helper(sc, "_ShardedDeviceLoader", SHARDED_DEVICE_LOADER)
        return cst.Call(func=cst.Name(name), args=[
            cst.Arg(bound["loader"].value), cst.Arg(bound["device"].value),
            cst.Arg(spmd.sharding_mesh(sharding)), cst.Arg(axis)])
    sc.needs_manual(rule.code, f"{problem}; replace the device loader by hand", qualname)
    return call


def _unknown_arguments(bound: dict) -> list[str]:
    """MpDeviceLoader's arguments that neither the loader classes keep nor only tune threads."""
    return sorted(set(bound) - {"loader", "device", "input_sharding"} - _TUNING_KEYWORDS)


def _reads_loader_internals(sc: StatementContext) -> bool:
    return not sc.file.analysis.attribute_names.isdisjoint(_LOADER_INTERNALS)


PER_DEVICE_LOADER = "torch_xla.distributed.parallel_loader.PerDeviceLoader"


@transform("device_loader", form=REFERENCE)
def device_loader_class(node, qualname, sc: StatementContext, rule):
    """The class itself, not called (`isinstance(dl, pl.PerDeviceLoader)`, an annotation): the
    class that takes its place where this file makes one, so a loader the file made still
    passes the test and is not wrapped again. MpDeviceLoader -> DEVICE_LOADER's class;
    ParallelLoader and PerDeviceLoader -> PARALLEL_LOADER_CLASS's (its per_device_loader is
    itself). Left with a TODO where this file makes none (a loader made elsewhere is another
    module's class), and for ParallelLoader where the file holds a per-device loader (the
    stand-in is both, where torch_xla's per-device loader was no ParallelLoader)."""
    made = _loaders_made(sc)
    if qualname == MP_DEVICE_LOADER and MP_DEVICE_LOADER in made:
        name = helper(sc, "_DeviceLoader", DEVICE_LOADER)
    elif qualname == PER_DEVICE_LOADER and PARALLEL_LOADER in made or (
            qualname == PARALLEL_LOADER and PARALLEL_LOADER in made and not _holds_per_device_loader(sc)):
        name = helper(sc, "_ParallelLoader", PARALLEL_LOADER_CLASS)
    else:
        short = qualname.rsplit(".", 1)[1]
        why = ("this file makes no such loader: one made elsewhere is of another class now"
               if qualname != PARALLEL_LOADER or PARALLEL_LOADER not in made else
               "this file's ParallelLoader stand-in is also its per-device loader, which torch_xla's was not")
        sc.needs_manual(rule.code, f"`{short}` used as a class ({why}): test for the loader that replaced it "
                        "by hand", qualname)
        return node
    sc.fixed(rule.code, qualname)
    return cst.Name(name)


def _loaders_made(sc: StatementContext) -> frozenset[str]:
    """The device loader classes this file calls (by their last name). Once per file."""
    made = sc.file.memo.get("loaders_made")
    if made is None:
        names = {_called_name(node.func) for node in sc.file.analysis.nodes if isinstance(node, ast.Call)}
        # A second run sees the classes that replaced them (the TODO's reason must not change).
        made = sc.file.memo["loaders_made"] = frozenset(
            q for q, added in ((MP_DEVICE_LOADER, "_DeviceLoader"), (PARALLEL_LOADER, "_ParallelLoader"))
            if q.rsplit(".", 1)[1] in names or added in names)
    return made


def _holds_per_device_loader(sc: StatementContext) -> bool:
    """Whether a per_device_loader(...) result is kept (not only iterated by a `for` header)."""
    found = sc.file.memo.get("holds_per_device_loader")
    if found is None:
        nodes = sc.file.analysis.nodes
        iterated = {id(node.iter) for node in nodes if isinstance(node, (ast.For, ast.AsyncFor))}
        found = sc.file.memo["holds_per_device_loader"] = any(
            isinstance(node, ast.Call) and _called_name(node.func) == "per_device_loader"
            and id(node) not in iterated for node in nodes)
    return found


@transform("device_loader", on="rewritten")
def drop_loader_alias(result, sc: StatementContext):
    """`alias = loader`, left by a device loader whose loops now iterate `loader` itself
    (Plans.inline_loaders): the statement goes. Else `result` unchanged."""
    if not (isinstance(result, cst.Assign) and len(result.targets) == 1
            and isinstance(result.targets[0].target, cst.Name) and isinstance(result.value, cst.Name)):
        return result
    key = (id(sc.scope), result.targets[0].target.value)
    if sc.file.plans.inline_loaders.get(key) == result.value.value and key in sc.file.loader_vars:
        return []
    return result


@transform("sample_generator", form=CALL)
def sample_generator(call, qualname, sc: StatementContext, rule):
    """`xu.SampleGenerator(data, sample_count)` -> `[data] * sample_count`: the same object `n`
    times, on every pass, with `len()` `n`, as the generator gave."""
    bound = bind(call, ["data", "sample_count"])
    if bound is None or "data" not in bound or "sample_count" not in bound:
        sc.needs_manual(rule.code, f"cannot read the arguments: {rule.summary}", qualname)
        return call
    sc.fixed(rule.code, qualname)
    count = bound["sample_count"].value
    if not isinstance(count, (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Integer)):
        count = count.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return cst.BinaryOperation(
        left=cst.List([cst.Element(bound["data"].value)]), operator=cst.Multiply(), right=count
    )
