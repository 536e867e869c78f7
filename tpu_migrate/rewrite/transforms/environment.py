"""rules/environment.toml: torch_xla's environment variables, matmul precision and memory statistics (TPU140-TPU150)."""

from __future__ import annotations

import libcst as cst

from tpu_migrate.rewrite.context import StatementContext, parse_expr
from tpu_migrate.rewrite.registry import CALL, emits, transform
from tpu_migrate.rewrite.transforms.common import (
    bind,
)
from tpu_migrate.rewrite.spmd_programs import SPMD_ENV  # turned SPMD on, as xr.use_spmd() does (TPU170)
from tpu_migrate.rewrite.transforms.spmd import PROCESS_MODEL


# Environment variables torch_xla's runtime read (TPU140) and its bf16 switches (TPU141): their
# statements are visited (`strings=`), so a rule sees them with no torch_xla reference near.
RUNTIME_ENV = frozenset({"PJRT_DEVICE", "XRT_TPU_CONFIG", "TPU_NUM_DEVICES", "XRT_DEVICE_MAP", "XRT_WORKERS"})
BF16_ENV = frozenset({"XLA_USE_BF16", "XLA_DOWNCAST_BF16"})
ENV_NAMES = RUNTIME_ENV | BF16_ENV | {SPMD_ENV}

PRECISIONS = {"default": "medium", "high": "high", "highest": "highest"}


@transform("matmul_precision", form=CALL)
def matmul_precision(call, qualname, sc: StatementContext, rule):
    bound = bind(call, ["precision"])
    value = bound.get("precision") if bound else None
    if value is None or not isinstance(value.value, cst.SimpleString) or value.value.evaluated_value not in PRECISIONS:
        sc.needs_manual(rule.code, "map the precision by hand: default->medium, high->high, highest->highest", qualname)
        return call
    sc.fixed(rule.code, qualname)
    precision = PRECISIONS[value.value.evaluated_value]
    return parse_expr(sc.file.import_plan.fill("{torch}.set_float32_matmul_precision") + f'("{precision}")')


@transform("memory_info", form=CALL)
def memory_info(call, qualname, sc: StatementContext, rule):
    if sc.file.target != "tpu":
        sc.needs_manual(rule.code, "device memory statistics have no CPU equivalent", qualname)
        return call
    acc = sc.file.import_plan.use("torch") + ".accelerator"
    sc.fixed(rule.code, qualname)
    return parse_expr(
        "{"
        f'"bytes_used": {acc}.memory_allocated(), '
        f'"bytes_limit": {acc}.get_memory_info()[1], '
        f'"peak_bytes_used": {acc}.max_memory_allocated(), '
        f'"kb_free": {acc}.get_memory_info()[0] // 1024, '
        f'"kb_total": {acc}.get_memory_info()[1] // 1024'
        "}"
    )


def _environ_key(node: cst.BaseExpression, sc: StatementContext) -> str | None:
    """The variable name in `os.environ[NAME]`, `os.environ.get(NAME)`, `os.getenv(NAME)`,
    `NAME in os.environ`."""
    def key_of(expr):
        if isinstance(expr, cst.SimpleString):
            value = expr.evaluated_value
            return value if value in ENV_NAMES else None
        return None

    if isinstance(node, cst.Comparison):
        # `"XLA_USE_BF16" in os.environ`, `... not in os.environ.keys()`
        if len(node.comparisons) != 1 or not isinstance(node.comparisons[0].operator, (cst.In, cst.NotIn)):
            return None
        container = node.comparisons[0].comparator
        if isinstance(container, cst.Call) and not container.args and isinstance(container.func, cst.Attribute) \
                and container.func.attr.value == "keys":
            container = container.func.value
        return key_of(node.left) if sc.resolve(container) == "os.environ" else None
    if isinstance(node, cst.Subscript) and sc.resolve(node.value) == "os.environ" and len(node.slice) == 1:
        return key_of(node.slice[0].slice.value) if isinstance(node.slice[0].slice, cst.Index) else None
    if isinstance(node, cst.Call) and node.args:
        qualname = sc.resolve(node.func)
        if qualname in ("os.environ.get", "os.environ.setdefault", "os.getenv", "os.putenv", "os.environ.pop"):
            return key_of(node.args[0].value)
    return None


@transform("runtime_env", on="statement", strings=ENV_NAMES, emits=("TPU170",))
def environment_statement(small: cst.BaseSmallStatement, sc: StatementContext):
    """Setting torch_xla's runtime variables: removed. Returns [] to remove, else None."""
    if sc.info.trigger_string:  # a walk of the statement only where an ENV_NAMES string stands
        _bf16_elsewhere(small, sc)
    key, value = None, None
    if isinstance(small, cst.Assign) and len(small.targets) == 1:
        key, value = _environ_key(small.targets[0].target, sc), small.value
    elif isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
        func = sc.resolve(small.value.func)
        if func in ("os.environ.setdefault", "os.putenv", "os.environ.pop"):
            key = _environ_key(small.value, sc)
            if func != "os.environ.pop" and len(small.value.args) > 1:
                value = small.value.args[1].value
    elif isinstance(small, cst.Del) and isinstance(small.target, cst.Subscript):
        key = _environ_key(small.target, sc)
    if key == SPMD_ENV and value is not None and sc.enabled("TPU170"):
        # Kept (TorchTPU ignores it): what it turned on is what the program must be ported from.
        sc.needs_manual("TPU170", f"{SPMD_ENV} turned SPMD on here, as xr.use_spmd() does: {PROCESS_MODEL}",
                        where=sc.where)
        return None
    if key not in RUNTIME_ENV or not sc.enabled("TPU140"):
        return None
    if key == "PJRT_DEVICE" and value is not None and not (
            isinstance(value, cst.SimpleString) and value.evaluated_value == "TPU"):
        # torch_xla ran on the device this names ("CPU" for exact fp32, "CUDA"); TorchTPU's
        # device is the TPU. Kept (TorchTPU ignores it), with what to do.
        sc.needs_manual("TPU140", "PJRT_DEVICE chose torch_xla's device, here maybe not the TPU: TorchTPU "
                        'ignores it; where the program meant "CPU", use torch.device("cpu") for that run',
                        where=sc.where)
        return None
    sc.fixed("TPU140", where=sc.where)
    return []


@emits("TPU141")
def _bf16_elsewhere(small: cst.BaseSmallStatement, sc: StatementContext) -> None:
    """XLA_USE_BF16 / XLA_DOWNCAST_BF16 named where no plain `os.environ` read or write holds it
    (a dict of variables set in a loop, `os.environ.update(XLA_USE_BF16="1")`, a subprocess's
    `env=`): it made torch_xla compute float tensors in bf16, which TorchTPU never does."""
    plain = set()
    named = None
    for node in _walk(small):
        if isinstance(node, (cst.Subscript, cst.Call, cst.Comparison)) and _environ_key(node, sc) in BF16_ENV:
            plain.update(id(sub) for sub in _walk(node) if isinstance(sub, cst.SimpleString))
        elif isinstance(node, cst.SimpleString) and id(node) not in plain and node.evaluated_value in BF16_ENV:
            named = node.evaluated_value
        elif isinstance(node, cst.Arg) and node.keyword is not None and node.keyword.value in BF16_ENV:
            named = node.keyword.value
    if named is not None and sc.enabled("TPU141"):
        sc.needs_manual("TPU141", f"{named} is set or read here: it made torch_xla compute float tensors in "
                        "bf16, and TorchTPU ignores it: convert the model with .to(torch.bfloat16) or use "
                        "torch.autocast", where=sc.where)


def _walk(node: cst.CSTNode):
    """`node` and every node below it, parents first."""
    yield node
    for child in node.children:
        yield from _walk(child)


@transform("runtime_env", on="subscript", emits=("TPU141",))
def environment_reads(node: cst.BaseExpression, sc: StatementContext) -> cst.BaseExpression:
    """Reading torch_xla's variables: a manual finding (on subscripts, calls and comparisons).
    Returns `node`, unchanged."""
    key = _environ_key(node, sc)
    if key is None or key == SPMD_ENV:  # asking whether SPMD is on: the file counts as SPMD (common.py)
        return node
    code_ = "TPU141" if key in BF16_ENV else "TPU140"
    if not sc.enabled(code_) or any(t.code == code_ for t in sc.todos):
        return node
    where = sc.where
    if code_ == "TPU141":
        sc.needs_manual(code_, f"{key} has no TorchTPU equivalent: convert the model with "
                        ".to(torch.bfloat16) or use torch.autocast", where=where)
    else:
        sc.needs_manual(code_, f"{key} is not set under TorchTPU: test "
                        "torch.accelerator.current_accelerator() instead", where=where)
    return node


@transform("runtime_env", on="comparison", order=1)  # after the guard tests
def environment_comparison(original, updated: cst.Comparison, sc: StatementContext):
    """`"XLA_USE_BF16" in os.environ`, `os.environ.get("PJRT_DEVICE") == "TPU"`: reads."""
    if sc.info.trigger_string:
        environment_reads(updated, sc)
    return updated


@transform("runtime_env", on="call")
def environment_call_reads(call, qualname, sc: StatementContext):
    """`os.environ.get("PJRT_DEVICE")`, `os.getenv(...)`: reads (calls of a resolved name)."""
    if qualname is not None:
        environment_reads(call, sc)
    return None
