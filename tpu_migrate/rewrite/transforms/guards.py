"""Availability guards (rules/guards.toml): "is torch_xla here?" becomes "is a TPU here?"."""

from __future__ import annotations

import libcst as cst

from tpu_migrate.rewrite.context import StatementContext, parse_expr
from tpu_migrate.rewrite.registry import CALL, emits, transform
from tpu_migrate.rewrite.transforms.common import is_xla


def tpu_available(sc: StatementContext, tpu_only: bool = False) -> str:
    """The test for the target; `tpu_only`: a TPU's even for target portable (where "any
    accelerator" would send a GPU into a branch written for a TPU)."""
    if sc.file.target == "tpu" or tpu_only:
        return sc.file.import_plan.fill(
            '{torch}.accelerator.is_available() and {torch}.accelerator.current_accelerator().type == "tpu"'
        )
    return sc.file.import_plan.fill("{torch}.accelerator.is_available()")


@emits("TPU190")
def guards_allowed(sc: StatementContext, qualname: str | None) -> bool:
    """TPU190 applies in this pass; when not, the guard is kept as it is, with a TODO."""
    if not sc.enabled("TPU190"):
        sc.consume(qualname)
        return False
    if sc.file.convert_guards:
        sc.file.guards_converted = True
        return True
    sc.needs_manual(
        "TPU190", "guard kept: this file still needs torch_xla (see the other TODOs); run "
        "tpu-migrate again once they are ported to turn it into a TPU check", qualname,
    )
    return False


@transform("availability_guard", form=CALL)
def availability_guard(call, qualname, sc: StatementContext, rule):
    if _may_ask_for_a_gpu(call, qualname):
        # True only for torch_xla on a GPU: "a TPU is here" would turn it around.
        sc.needs_manual(
            rule.code, "kept: this asks whether torch_xla runs on a GPU (check_is_gpu), which TorchTPU "
            "does not replace; port what it guards by hand", qualname,
        )
        return call
    if not guards_allowed(sc, qualname):
        return call
    sc.fixed(rule.code, qualname)
    return parse_expr(tpu_available(sc, tpu_only=_argument(call, qualname, "check_is_tpu", 0) is not None))


def _may_ask_for_a_gpu(call: cst.Call, qualname: str) -> bool:
    """`check_is_gpu` given and not plainly False, or maybe given through `*args` / `**kwargs`."""
    return _argument(call, qualname, "check_is_gpu", 1) is not None or (
        qualname.endswith(".is_torch_xla_available") and any(arg.star for arg in call.args))


def _argument(call: cst.Call, qualname: str, keyword: str, index: int) -> cst.BaseExpression | None:
    """The flag `keyword` (at `index`) of `is_torch_xla_available(check_is_tpu=False,
    check_is_gpu=False)` (transformers, accelerate) when it is given and not plainly False."""
    if not qualname.endswith(".is_torch_xla_available"):
        return None
    for position, arg in enumerate(call.args):
        if arg.star:
            break
        if (arg.keyword.value == keyword) if arg.keyword else position == index:
            plainly_false = isinstance(arg.value, cst.Name) and arg.value.value in ("False", "None")
            return None if plainly_false else arg.value
    return None


@transform("availability_guard", calls=("importlib.util.find_spec",))
def find_spec_guard(call: cst.Call, sc: StatementContext):
    """`importlib.util.find_spec("torch_xla")` (compared with None by the caller's code)."""
    if (
        len(call.args) == 1
        and isinstance(call.args[0].value, cst.SimpleString)
        and call.args[0].value.evaluated_value.split(".")[0] == "torch_xla"
        and guards_allowed(sc, None)
    ):
        sc.consume_string()
        sc.fixed("TPU190", "importlib.util.find_spec")
        # find_spec returned a spec or None; keep that shape for `is None` tests.
        return parse_expr(f"(True if {tpu_available(sc)} else None)")
    return call


@transform("availability_guard", on="comparison")
def find_spec_test(original: cst.Comparison, updated: cst.Comparison, sc: StatementContext):
    """`find_spec("torch_xla") is not None`: the whole test becomes the TPU test. The call
    itself was already rewritten (and reported) by find_spec_guard, so this reads `original`."""
    if len(original.comparisons) != 1:
        return updated
    target = original.comparisons[0]
    left = original.left
    if not (
        isinstance(target.operator, (cst.Is, cst.IsNot))
        and isinstance(target.comparator, cst.Name) and target.comparator.value == "None"
        and isinstance(left, cst.Call) and sc.resolve(left.func) == "importlib.util.find_spec"
        and left.args and isinstance(left.args[0].value, cst.SimpleString)
        and left.args[0].value.evaluated_value.split(".")[0] == "torch_xla"
        and sc.file.convert_guards and sc.enabled("TPU190")
    ):
        return updated
    available = tpu_available(sc)
    return parse_expr(f"not ({available})" if isinstance(target.operator, cst.Is) else available)


@transform("availability_guard", on="comparison")
def optional_import_test(original: cst.Comparison, cmp: cst.Comparison, sc: StatementContext):
    """`xm is None` / `xm is not None` for an optional torch_xla import."""
    if len(cmp.comparisons) != 1 or not isinstance(cmp.comparisons[0].operator, (cst.Is, cst.IsNot)):
        return cmp
    other = cmp.comparisons[0].comparator
    if not (isinstance(other, cst.Name) and other.value == "None"):
        return cmp
    qualname = sc.resolve(cmp.left) if isinstance(cmp.left, cst.Name) else None
    if not qualname or not is_xla(qualname) or not guards_allowed(sc, qualname):
        return cmp
    sc.fixed("TPU190", qualname)
    available = tpu_available(sc)
    negate = isinstance(cmp.comparisons[0].operator, cst.Is)
    return parse_expr(f"not ({available})" if negate else available)


@transform("availability_guard", on="if_test")
def optional_import_truth(test, sc: StatementContext):
    """`if xm:` / `if not xm:` on an optional torch_xla import."""
    negated = isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not)
    name = test.expression if negated else test
    if not isinstance(name, cst.Name):
        return test
    qualname = sc.resolve(name)
    if not qualname or not is_xla(qualname) or not guards_allowed(sc, qualname):
        return test
    sc.fixed("TPU190", qualname)
    available = tpu_available(sc)
    return parse_expr(f"not ({available})" if negated else available)
