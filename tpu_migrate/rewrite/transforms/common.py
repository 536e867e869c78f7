"""Helpers every transform uses: argument binding, code generation, shared templates."""

from __future__ import annotations

import ast
import re
import warnings

import libcst as cst

from tpu_migrate.rewrite import cst_parse
from tpu_migrate.rewrite.context import StatementContext, parse_stmt, unused_name
from tpu_migrate.rewrite.registry import rule_code
from tpu_migrate.rewrite.spmd_programs import SPMD_ENV
from tpu_migrate.rewrite.todos import TEXT_MARKER


# Expressions that need parentheses when they land inside a larger expression.
LOOSE = (
    cst.IfExp,
    cst.BooleanOperation,
    cst.Comparison,
    cst.BinaryOperation,
    cst.UnaryOperation,
    cst.Lambda,
)

PORTABLE_DEVICE = '{torch}.accelerator.current_accelerator(check_available=True) or {torch}.device("cpu")'
# The global rank, as torch_xla answered it (named_expressions.py).
GLOBAL_MASTER = "{rank_atom} == 0"
LOCAL_MASTER = 'int({os}.environ.get("LOCAL_RANK", 0)) == 0'

TO_DEVICE = "{map_tensors}({obj}, lambda t: t.to({device}))"
# What xm.all_gather returned: for a tensor, the tensors of every process concatenated along
# `dim` (a new tensor in a world of one); for a list of tensors, that for each of them.
ALL_GATHER = '''def {name}(value, dim=0):
    """`value` from every process along `dim`, or each tensor of a list, as xm.all_gather (added by tpu-migrate)."""
    if isinstance(value, (list, tuple)):
        return [{name}(tensor, dim) for tensor in value]
    if not {dist}.is_initialized():
        return value.clone()
    parts = [{torch}.empty_like(value) for _ in range({dist}.get_world_size())]
    {dist}.all_gather(parts, value.contiguous())
    return {torch}.cat(parts, dim=dim)
'''

XLA_DEVICE = re.compile(r"xla(:\d+)?\Z")
_CODEGEN = cst.Module(body=[])


def code(node: cst.CSTNode) -> str:
    """The source text of `node`; for an expression, text that is valid wherever an expression
    may stand (see `standalone`), so that generated code may put it anywhere."""
    text = _CODEGEN.code_for_node(node)
    if isinstance(node, cst.BaseExpression) and _bracketed_only(node, text):
        return f"({text})"
    return text


# Expressions valid only directly inside the parentheses of a call (`f(x for x in y)`) or only
# inside some bracket (`f(y := 1)`), whatever their text.
_BRACKETED_ONLY = (cst.GeneratorExp, cst.NamedExpr, cst.Yield)


def standalone(node: cst.BaseExpression) -> cst.BaseExpression:
    """`node`, parenthesised if its text is valid only inside the brackets it came from: a
    generator expression that is a call's sole argument, `x := 1`, or an expression whose text
    breaks a line outside any bracket of its own (`f"a "` newline `f"b"`, `a +` newline `b`, in
    a call's parentheses). Taken out of those brackets (assigned to a name, put in a `for`
    header or a new statement) its text would not parse; parenthesised it means the same."""
    if _bracketed_only(node, _CODEGEN.code_for_node(node)):
        return node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return node


def _bracketed_only(node: cst.BaseExpression, text: str) -> bool:
    """Whether `node`, whose text is `text`, needs parentheses of its own to stand alone."""
    if node.lpar:
        return False
    if isinstance(node, _BRACKETED_ONLY):
        return True
    if "\n" not in text and "\r" not in text:
        return False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escape sequences, say
            ast.parse(text, mode="eval")
    except SyntaxError:
        return True
    return False


# -- argument helpers -------------------------------------------------------------------------


def bind(call: cst.Call, params: list[str]) -> dict[str, cst.Arg] | None:
    """Map a call's arguments to parameter names; None if it uses *args/**kwargs."""
    bound: dict[str, cst.Arg] = {}
    for i, arg in enumerate(call.args):
        if arg.star:
            return None
        if arg.keyword is not None:
            bound[arg.keyword.value] = arg
        elif i < len(params):
            bound[params[i]] = arg
        else:
            return None
    return bound


def literal_bool(arg: cst.Arg | None, default: bool) -> bool | None:
    if arg is None:
        return default
    if isinstance(arg.value, cst.Name) and arg.value.value in ("True", "False"):
        return arg.value.value == "True"
    return None


# `name=value` as generated keyword arguments are written (no spaces around `=`).
KEYWORD_EQUAL = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))


def clean_args(args: list[cst.Arg]) -> list[cst.Arg]:
    if not args:
        return args
    return [*args[:-1], args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)]


def atom(node: cst.BaseExpression) -> str:
    text = _CODEGEN.code_for_node(node)
    if isinstance(node, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) or node.lpar:
        return text
    return f"({text})"  # (which also makes text that needs brackets stand alone)


def parse_block(lines: list[str]) -> list[cst.BaseStatement]:
    module = cst_parse.parse_module("\n".join(lines) + "\n")
    return list(module.body)

def target_name(assign: cst.Assign | None) -> str | None:
    if assign is None or len(assign.targets) != 1:
        return None
    target = assign.targets[0].target
    return target.value if isinstance(target, cst.Name) else None

def fresh_name(sc: StatementContext, base: str) -> str:
    """A name bound nowhere in the file (nor given out before in this statement)."""
    name = unused_name(base, sc.file.analysis.bound_names, sc.new_names)
    sc.new_names.add(name)
    return name

def given(bound: dict, name: str) -> bool:
    arg = bound.get(name)
    return arg is not None and not (isinstance(arg.value, cst.Name) and arg.value.value == "None")

def if_block(condition: str, body: list[cst.BaseStatement]) -> cst.If:
    template = parse_stmt(f"if {condition}:\n    pass\n")
    return template.with_changes(body=template.body.with_changes(body=body))

def is_xla(qualname: str) -> bool:
    from tpu_migrate.rewrite.names import is_xla_name

    return is_xla_name(qualname)

def quote_of(node: cst.BaseExpression) -> str:
    text = _CODEGEN.code_for_node(node)
    return "'" if text.rstrip()[-1:] == "'" else '"'


def helper(sc: StatementContext, base: str, template: str, **names: str) -> str:
    """FileContext.helper: the name of a helper the file gets once."""
    return sc.file.helper(base, template, **names)


class _Collector(cst.CSTVisitor):
    def __init__(self, kind: type[cst.CSTNode]):
        super().__init__()
        self.kind, self.found = kind, []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, self.kind):
            self.found.append(node)
        return True


def find_all(node: cst.CSTNode, kind: type[cst.CSTNode]) -> list:
    """The nodes of type `kind` in `node` (itself included), in source order: what
    `libcst.matchers.findall(node, m.Kind())` finds, without importing libcst.matchers, which
    costs every run ~0.25 s of CPU at start-up (each pool worker and each CLI run of the tests)."""
    collector = _Collector(kind)
    node.visit(collector)
    return collector.found


# Where these names appear the program runs SPMD: one process drove every device of a host, so
# the process queries counted hosts (or answered 1 and 0), not TorchTPU's processes per TPU.
_SPMD_NAMES = ("torch_xla.runtime.use_spmd", "torch_xla.runtime.is_spmd", "optimum.tpu.use_fsdp_v2")
_SPMD_MODULES = ("torch_xla.distributed.spmd.", "optimum.tpu.fsdp_v2.")
_SPMD_TODO = f"{TEXT_MARKER}: {rule_code('TPU170')} "


def runs_spmd(sc: StatementContext) -> bool:
    """SPMD names in the file, or the TODO that `xr.use_spmd()` left where it went (TPU170): the
    process queries keep their SPMD meaning on a second run too. Or an SPMD program of the
    project imports this module (spmd_programs.py)."""
    return spmd_reason(sc) is not None


def spmd_reason(sc: StatementContext) -> str | None:
    """Why the file's process queries meant hosts, for their TODO; None where they did not."""
    uses = sc.file.memo.get("uses_spmd")
    if uses is None:  # once per file: a scan per query would grow with the square of its size
        uses = sc.file.memo["uses_spmd"] = any(
            name in _SPMD_NAMES or name.startswith(_SPMD_MODULES) for name in sc.file.analysis.qualnames
        ) or any(_SPMD_TODO in line or SPMD_ENV in line for line in sc.file.source_lines)
    if uses:
        return "this file runs SPMD (one process per host)"
    return sc.file.spmd_why
