"""AMP, RNG and compilation (rules/amp_compile.toml): autocast, `torch.compile` backends, `torch_xla.compile`, eager mode (TPU122-TPU132)."""

from __future__ import annotations

import ast

import libcst as cst

from tpu_migrate.rewrite.context import StatementContext, parse_expr
from tpu_migrate.rewrite.names import Analysis, finding_position, mark_subtrees
from tpu_migrate.rewrite.registry import CALL, REFERENCE, STATEMENT, rule_code, transform
from tpu_migrate.rewrite.transforms.common import (
    PORTABLE_DEVICE,
    code,
    bind,
    literal_bool,
    clean_args,
    is_xla,
    quote_of,
)


@transform("xla_autocast", form=CALL)
def xla_autocast(call, qualname, sc: StatementContext, rule):
    bound = bind(call, ["device", "enabled", "dtype", "cache_enabled"])
    if bound is None:
        sc.needs_manual(rule.code, "cannot read the arguments of torch_xla.amp.autocast", qualname)
        return call
    plan = sc.file.import_plan
    torch = plan.use("torch")
    device_type = '"tpu"' if sc.file.target == "tpu" else "(" + plan.fill(PORTABLE_DEVICE) + ").type"
    kwargs = [f"dtype={code(bound['dtype'].value) if 'dtype' in bound else torch + '.bfloat16'}"]
    for name in ("enabled", "cache_enabled"):
        if name in bound:
            kwargs.append(f"{name}={code(bound[name].value)}")
    sc.fixed(rule.code, qualname)
    return parse_expr(f"{torch}.autocast({device_type}, {', '.join(kwargs)})")


# torch_xla seeded the XLA device's generator only. On a CPU-only host the device is the CPU,
# whose generator torch_xla never touched: seeding it would overwrite a CPU state the program
# restored (accelerate's checkpoint loading, fairseq's set_torch_seed), so nothing is seeded there.
SEED_DEVICE = {
    "tpu": "{torch}.tpu.manual_seed({seed})",
    "portable": "{torch}.get_device_module({torch}.accelerator.current_accelerator()).manual_seed({seed}) "
                "if {torch}.accelerator.is_available() else None",
}
GET_RNG_STATE = "torch_xla.core.xla_model.get_rng_state"


@transform("manual_seed", form=CALL, emits=("TPU121",))
def manual_seed(call, qualname, sc: StatementContext, rule):
    """`xm.set_rng_state(seed)` seeded the XLA device's generator only (TPU120)."""
    bound = bind(call, ["seed", "device"])
    if bound is None or "seed" not in bound:
        sc.needs_manual(rule.code, "cannot read the seed argument", qualname)
        return call
    where = sc.fixed(rule.code, qualname)
    if GET_RNG_STATE in sc.file.analysis.qualnames and sc.enabled("TPU121") and not _a_seed(bound["seed"].value):
        # Checkpoint code saves xm.get_rng_state() and restores it here; once that side is
        # ported by hand (TPU121), this line must follow it.
        sc.needs_manual(
            "TPU121", "this restores a state saved with xm.get_rng_state (also in this file): "
            "reseeding does not resume a generator's stream; port both sides together",
            where=where,
        )
    return parse_expr(sc.file.import_plan.fill(SEED_DEVICE[sc.file.target], seed=code(bound["seed"].value)))


def _a_seed(value: cst.BaseExpression) -> bool:
    """A seed the program chose (`set_seed(seed)`: an int, or a name or attribute that says
    seed), not a state read back from a checkpoint: reseeding is then the faithful port."""
    if isinstance(value, cst.Integer):
        return True
    last = value.attr.value if isinstance(value, cst.Attribute) else value.value if isinstance(value, cst.Name) else ""
    return "seed" in last.lower()


# The backends whose compiles run on TorchTPU's "tpu" backend once converted (None: no backend
# given, which TorchTPU's torch.compile turns into "tpu" for TPU inputs).
_TPU_BACKENDS = frozenset({None, "tpu", "openxla", "openxla_eval"})
_UNKNOWN = object()  # a backend chosen at run time (`backend=args.backend`)


def _run_time_backend(tpu: bool) -> str:
    """TPU130's advice on a backend chosen at run time, per target."""
    instead = 'use "tpu"' if tpu else "leave the backend out (PyTorch's default)"
    return f'the backend is chosen at run time: where it is torch_xla\'s "openxla" or "openxla_eval", {instead}'


@transform("torch_compile", calls=("torch.compile",))
def torch_compile(call: cst.Call, sc: StatementContext):
    """torch.compile in a torch_xla file (target tpu: also in one on torch.accelerator's device,
    _on_the_accelerator): the backend, and what TorchTPU's "tpu" backend rejects
    (`mode=`, `dynamic=True`). Another backend (`"cudagraphs"`, `"eager"`) receives `mode=` as
    before: such a compile is the program's own choice and stays as it is."""
    xla = any(is_xla(b.qualname) for b in sc.file.analysis.imports)
    if not (xla or _on_the_accelerator(sc)) or not sc.enabled("TPU130"):
        return call
    tpu = sc.file.target == "tpu"
    backend = _backend_of(call)
    rejected = {id(a) for a in call.args if _rejected_by_tpu(a)}
    if backend is _UNKNOWN or backend == "inductor":
        # A tree the portable target migrated, checked again: its TODO on a backend chosen at
        # run time says "leave the backend out"; a fresh tpu run of the original says otherwise.
        portable_todo = tpu and not xla and backend is _UNKNOWN and sc.todo_above("TPU130", _run_time_backend(False))
        if portable_todo:
            sc.supersede("TPU130", _run_time_backend(False))
        if tpu and backend == "inductor":
            sc.needs_manual("TPU130", 'TorchTPU rejects backend="inductor" for TPU tensors: use backend="tpu"'
                            + (" without mode= and dynamic=True" if rejected else ""),
                            where=sc.consume("torch.compile"))
        elif tpu and rejected:
            sc.needs_manual("TPU130", "the backend is chosen at run time: where it is TorchTPU's \"tpu\" "
                            "(or was \"openxla\"), drop mode= and dynamic=True, which it rejects",
                            where=sc.consume("torch.compile"))
        elif backend is _UNKNOWN and (xla or portable_todo):
            # "openxla" from a variable or a flag reaches torch.compile, which without torch_xla
            # has no such backend.
            sc.needs_manual("TPU130", _run_time_backend(tpu), where=sc.consume("torch.compile"))
        return call
    if backend not in _TPU_BACKENDS:
        return call
    args, changed = [], False
    for arg in call.args:
        name = arg.keyword.value if arg.keyword is not None else None
        if name == "backend" and backend in ("openxla", "openxla_eval"):
            changed = True
            if not tpu:
                continue
            arg = arg.with_changes(value=cst.SimpleString(f'{quote_of(arg.value)}tpu{quote_of(arg.value)}'))
        elif tpu and id(arg) in rejected:
            changed = True
            continue
        args.append(arg)
    if not changed:
        return call
    sc.fixed("TPU130", "torch.compile")
    return call.with_changes(args=clean_args(args))


# The device a file picks with torch.accelerator (the portable target's device, a program
# written for any accelerator): on TorchTPU it is the tpu.
CURRENT_ACCELERATOR = "torch.accelerator.current_accelerator"


def _on_the_accelerator(sc: StatementContext) -> bool:
    """Target tpu, a file without torch_xla whose tensors go to `torch.accelerator`'s device (a
    tree migrated with `--target portable`, checked again): there TorchTPU compiles them, so what
    its "tpu" backend rejects is converted or marked as in a torch_xla file. Not the run-time
    backend that may be torch_xla's "openxla": such a file names none."""
    return sc.file.target == "tpu" and CURRENT_ACCELERATOR in sc.file.analysis.qualnames


def _backend_of(call: cst.Call):
    """The `backend=` string of a torch.compile call; None without one; _UNKNOWN otherwise."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "backend":
            value = arg.value
            if isinstance(value, cst.SimpleString):
                return value.evaluated_value
            return _UNKNOWN
        if arg.star == "**":
            return _UNKNOWN
    return None


def _rejected_by_tpu(arg: cst.Arg) -> bool:
    """`mode=...` and `dynamic=True`: TorchTPU's "tpu" backend raises on them."""
    name = arg.keyword.value if arg.keyword is not None else None
    value = arg.value
    return name == "mode" or (name == "dynamic" and isinstance(value, cst.Name) and value.value == "True")


@transform("xla_compile", form=CALL)
def xla_compile(call, qualname, sc: StatementContext, rule):
    bound = bind(call, ["f", "full_graph", "name", "max_different_graphs"])
    if bound is None or "f" not in bound:
        sc.needs_manual(rule.code, "torch_xla.compile() without a function (a context manager): "
                        "wrap the step function in torch.compile instead", qualname)
        return call
    torch = sc.file.import_plan.use("torch")
    parts = [code(bound["f"].value)]
    if sc.file.target == "tpu":
        parts.append('backend="tpu"')
    # Not `fullgraph=`: torch_xla's full_graph asked for one lazy XLA graph per call, backward
    # and optimizer step included; Dynamo's fullgraph forbids graph breaks, which `.backward()`
    # and `optimizer.zero_grad()` are, so a training step would stop with an error.
    sc.fixed(rule.code, qualname)
    return parse_expr(f"{torch}.compile({', '.join(parts)})")


@transform("xla_compile", form=REFERENCE)
def xla_compile_reference(node, qualname, sc: StatementContext, rule):
    """`@torch_xla.compile` used bare (a decorator)."""
    sc.fixed(rule.code, qualname)
    return parse_expr(sc.file.import_plan.fill("{torch}.compile"))


@transform("eager_mode", form=STATEMENT)
def eager_mode_statement(call, qualname, sc: StatementContext, rule, plans):
    bound = bind(call, ["enable"])
    if bound is None or literal_bool(bound.get("enable"), False) is not True:
        sc.needs_manual(rule.code, "lazy mode has no TorchTPU switch: see torch.tpu.EagerMode or torch.compile", qualname)
        return None
    sc.fixed(rule.code, qualname)
    return []


# torch_xla's sync-free optimizers took `step(found_inf=...)` (a GradScaler's overflow flag) and
# skipped the update where it was set; TPU123 makes them torch.optim's, whose step() takes no
# such argument (TypeError on the first step).
SYNCFREE_RULE = rule_code("TPU123")
SYNCFREE = "torch_xla.amp.syncfree."
FOUND_INF = "found_inf"
FOUND_INF_TODO = ("`found_inf=` is torch_xla's sync-free optimizers' (they skipped the step where it was set); "
                  "TPU123 makes them torch.optim's, whose step() takes none: drop it (TorchTPU trains in bfloat16 "
                  "without a GradScaler), or skip the step yourself where found_inf is set")


def found_inf_steps(analysis: Analysis) -> dict[int, list[tuple[int, int]]]:
    """id(statement) -> (line, col) of each `X.step(..., found_inf=...)` in it, in a file that uses
    torch_xla's sync-free optimizers; those statements are marked for the walk."""
    if not any(name.startswith(SYNCFREE) for name in analysis.qualnames):
        return {}
    steps: dict[int, list[tuple[int, int]]] = {}
    for info in analysis.infos.values():
        if not isinstance(info.node, (ast.Expr, ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Return)):
            continue
        for node in ast.walk(info.node):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "step" \
                    and any(keyword.arg == FOUND_INF for keyword in node.keywords):
                info.forced = True
                steps.setdefault(id(info.node), []).append(finding_position(node))
    for positions in steps.values():
        positions.sort()
    if steps:
        mark_subtrees(analysis.tree.body, analysis.infos)
    return steps


def uses_syncfree(sc: StatementContext) -> bool:
    """The file's sync-free optimizers, or the TODO a first run left where they were (their
    import is gone then): the found_inf steps keep their TODO on a second run too."""
    return any(name.startswith(SYNCFREE) for name in sc.file.analysis.qualnames) or any(
        FOUND_INF_TODO in line for line in sc.file.source_lines)


def passes_found_inf(call: cst.Call) -> bool:
    return any(arg.keyword is not None and arg.keyword.value == FOUND_INF for arg in call.args)


@transform("syncfree_step", on="call", emits=("TPU123",))
def found_inf_step(call, qualname, sc: StatementContext):
    """A TODO on `optimizer.step(found_inf=...)`, where the plans found it."""
    positions = sc.file.plans.found_inf_steps.get(id(sc.info.node))
    if not positions or not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "step") \
            or not passes_found_inf(call):
        return None
    where = positions.pop(0)
    if sc.enabled(SYNCFREE_RULE):
        sc.needs_manual(SYNCFREE_RULE, FOUND_INF_TODO, where=where)
    return None

