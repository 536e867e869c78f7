"""Property tests: generated programs never crash the rewriter, and it changes only what it says.

Programs come from hypothesmith (`from_grammar`: Python's grammar, `from_node`: libcst nodes), on
their own and with torch_xla idioms from the rule fixtures spliced in at random statement
positions. For every program: no exception and no internal error, the output parses, rewriting
the output changes nothing (a fixed point), a program without torch_xla comes back byte for byte
even when every statement goes through the rewriter's walker, and every changed line region of a
torch_xla program lies on a statement a fix or a manual finding reports (or is an import that was
added, removed or turned into a guard).

Section (d) puts the calls the rules convert in unusual argument shapes and places.

Profiles (TPU_MIGRATE_HYPOTHESIS_PROFILE): `ci` (default: derandomized, a few hundred examples in
all) and `long` (thousands, random): `TPU_MIGRATE_HYPOTHESIS_PROFILE=long .venv/bin/python -m
pytest tests/test_properties.py`.
"""

from __future__ import annotations

import ast
import difflib
import os
import re
import warnings
from contextlib import contextmanager
from functools import lru_cache
from unittest import mock

import libcst
import pytest
from hypothesis import HealthCheck, Phase, assume, event, example, given, settings
from hypothesis import strategies as st

from conftest import rewrite_cases
from tpu_migrate.rewrite import engine, names, skeleton
from tpu_migrate.rewrite.context import Options
from tpu_migrate.rewrite.engine import rewrite_bytes
from tpu_migrate.rules import load_catalog

PROFILE = os.environ.get("TPU_MIGRATE_HYPOTHESIS_PROFILE", "ci")
if PROFILE not in ("ci", "long"):
    raise ValueError(f"TPU_MIGRATE_HYPOTHESIS_PROFILE={PROFILE!r}: use ci or long")
SCALE = {"ci": 1, "long": 20}[PROFILE]


def profile(examples: int):
    """`examples` in CI (derandomized: the same programs every run), 20x that in the long run."""
    return settings(
        max_examples=examples * SCALE,
        derandomize=PROFILE == "ci",
        database=None,
        deadline=None,
        print_blob=True,
        phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],  # no slow "explain"
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    )


CATALOG = load_catalog()
TARGETS = st.sampled_from(["tpu", "portable"])
# One to three generated modules one after the other: more statements, and more places to splice.
# (auto_target=False: hypothesmith's targeting calls hypothesis.target() with fixed labels, which
# may be called only once per test case.)
# Deferred: importing hypothesmith builds its grammar (seconds), which collecting the suite (every
# xdist worker does) should not pay for; the tests that draw programs import it.
_MODULES = st.deferred(lambda: _hypothesmith_modules())


def _hypothesmith_modules():
    import hypothesmith

    return st.one_of(hypothesmith.from_grammar(auto_target=False), hypothesmith.from_node(auto_target=False))


PROGRAMS = st.lists(_MODULES, min_size=1, max_size=3).map(
    lambda parts: "".join(p if p.endswith(("\n", "\r")) else p + "\n" for p in parts))

pytestmark = pytest.mark.filterwarnings("ignore::SyntaxWarning", "ignore::DeprecationWarning")


def rewrite(source: bytes, target: str = "tpu"):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return rewrite_bytes(source, "generated.py", Options(target=target), CATALOG)


def parses(text: str) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ast.parse(text)
        libcst.parse_module(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError, libcst.ParserSyntaxError):
        return False
    return True


@contextmanager
def every_statement_visited():
    """As if every statement mentioned torch_xla: the pre-filter passes everything, and the walker
    and expression rewriter go through each statement."""
    with mock.patch.object(engine, "prefilter", lambda data: True), \
            mock.patch.object(names.StmtInfo, "interesting", property(lambda self: True)):
        yield


def check_rewrite(source: bytes, target: str):
    """The invariants every input must keep; returns the result."""
    result = rewrite(source, target)
    assert result.error is None or not result.error.startswith("internal error"), result.error
    if result.error is not None:
        event(f"error: {result.error.split(':')[0]}")
        return result
    if not result.changed:
        return result
    output = result.output.decode("utf-8")
    assert parses(output), output
    again = rewrite(result.output, target)
    assert again.error is None, again.error
    assert not again.changed, "not a fixed point:\n" + "".join(
        difflib.unified_diff(output.splitlines(True), again.output.decode().splitlines(True)))
    return result


# (a) Programs without torch_xla -----------------------------------------------------------------


@pytest.mark.slow
@profile(100)  # half of what the spliced programs get: these only check that nothing changes
@given(source=PROGRAMS, target=TARGETS)
# What this found (regression tests in test_engine.py): a form feed that libcst drops.
@example(source="\n\x0cpass\n", target="tpu")
@example(source="x = 1\n\n  # a\n\n  # b\n", target="tpu")
def test_programs_without_torch_xla_come_back_unchanged(source, target):
    assume("xla" not in source.lower() and "tpu" not in source.lower())
    data = source.encode("utf-8")
    assert not check_rewrite(data, target).changed
    # Even when every statement goes through the walker: nothing to rewrite, nothing changes.
    with every_statement_visited():
        result = check_rewrite(data, target)
    assert not result.changed, result.output
    assert result.fixes == [] and result.manual == []
    event("parsed by both" if result.error is None else "not parsed by libcst")


# (b) Generated programs with torch_xla idioms spliced in ---------------------------------------


@lru_cache(maxsize=None)
def fixture_statements() -> tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]:
    """Per fixture input: (its import statements, its other top-level statements), as source."""
    out = []
    for case in rewrite_cases():
        text = case.read_text()
        lines = text.splitlines(keepends=True)  # fixtures: plain "\n" lines
        tree = ast.parse(text)
        headers, body = [], []
        for node in tree.body:
            start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            segment = "".join(lines[start - 1:node.end_lineno])
            is_import = isinstance(node, (ast.Import, ast.ImportFrom)) or (
                isinstance(node, ast.Try) and any(isinstance(n, (ast.Import, ast.ImportFrom)) for n in node.body))
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and node is tree.body[0]:
                continue  # the fixture's docstring
            (headers if is_import else body).append(segment)
        if body:
            out.append((tuple(headers), tuple(body)))
    return tuple(out)


def statement_starts(text: str) -> list[int]:
    """0-based line indexes where a new top-level statement may be inserted."""
    tree = ast.parse(text)
    starts = {0, len(python_lines(text)) - 1}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            starts.discard(0)
            starts = {s for s in starts if s >= node.end_lineno}
            continue
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        if node.col_offset == 0:
            starts.add(start - 1)
    return sorted(s for s in starts if s >= 0)


@st.composite
def spliced_programs(draw):
    """A generated program with a fixture's imports and some of its statements inserted, in their
    order, at random top-level statement boundaries."""
    base = draw(PROGRAMS)
    if not base.endswith("\n"):
        base += "\n"
    assume(parses(base))
    headers, body = draw(st.sampled_from(fixture_statements()))
    chosen = draw(st.lists(st.sampled_from(range(len(body))), min_size=1, max_size=len(body), unique=True))
    snippet = list(headers) + [body[i] for i in sorted(chosen)]
    lines = re.split(r"(?<=\r\n)|(?<=\r)(?!\n)|(?<=\n)", base)
    positions = sorted(draw(st.lists(st.sampled_from(statement_starts(base)),
                                     min_size=len(snippet), max_size=len(snippet))))
    out, taken = [], 0
    for position, statement in zip(positions, snippet):
        out.extend(lines[taken:position])
        taken = position
        out.append(statement if statement.endswith("\n") else statement + "\n")
    out.extend(lines[taken:])
    program = "".join(out)
    assume(parses(program))
    return program


def python_lines(text: str) -> list[str]:
    """Lines as Python numbers them (not str.splitlines(), which also breaks at \f, \x1c, ...)."""
    return re.split(r"\r\n|\r|\n", text)


def module_definitions(text: str) -> set[str]:
    """Names of the functions and classes defined at the top of a module."""
    return {node.name for node in ast.parse(text).body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def import_lines(text: str, helpers: set[str] = frozenset()) -> set[int]:
    """Lines of import statements, of the `if not <TPU>: raise ImportError(...)` guards that
    replace a guarded import, and of the module-level helpers named in `helpers` (import
    management and the functions and classes fixes add once, like TPU050's `_cpu_copies`: not a
    rule's change of a statement), and of a `try:` of imports whose handlers only pass or bind
    a fallback (`except ImportError: xm = None`): a guarded import, which goes whole."""
    lines: set[int] = set()
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and not node.orelse and not node.finalbody and all(
                isinstance(s, (ast.Import, ast.ImportFrom)) for s in node.body) and all(
                isinstance(s, (ast.Pass, ast.Assign, ast.Import, ast.ImportFrom, ast.Raise, ast.Assert)) for h in node.handlers
            for s in h.body):
            lines.update(range(node.lineno, node.end_lineno + 1))
        guard = (isinstance(node, ast.If) and len(node.body) == 1 and isinstance(node.body[0], ast.Raise)
                 and "ImportError" in ast.unparse(node.body[0]))
        helper = node in tree.body and getattr(node, "name", None) in helpers
        if isinstance(node, (ast.Import, ast.ImportFrom)) or guard or helper:
            lines.update(range(node.lineno, node.end_lineno + 1))
    return lines


def emptied_if_headers(text: str, touched: list[tuple[int, int]]) -> set[int]:
    """Header lines of the `if`s without `else` (and `for _ in range(...)` loops) whose whole
    body is reported: a removed statement can take its emptied `if` or loop with it (TPU010)."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        counted = isinstance(node, ast.For) and isinstance(node.iter, ast.Call) and \
            getattr(node.iter.func, "id", None) == "range"
        if (isinstance(node, ast.If) or counted) and not node.orelse and all(
            any(start <= stmt.lineno and stmt.end_lineno <= end for start, end in touched) for stmt in node.body
        ):
            lines.update(range(node.lineno, node.body[0].lineno))
    return lines


def reported_spans(text: str, result) -> list[tuple[int, int]]:
    """For each place a fix or manual finding names: the innermost statement around it (1-based,
    inclusive lines), with its decorators. By line and column: on `if test: body()` a finding on
    the test is the `if`'s, not its one-line body's (and by line alone where no statement holds
    the column: ast counts it in bytes)."""
    spans = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.stmt):
            start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            first = (start, 0) if start < node.lineno else (node.lineno, node.col_offset)  # its decorators'
            spans.append((start, node.end_lineno, first, (node.end_lineno, node.end_col_offset)))
    out = []
    for line, col in {(f.line, f.col) for f in result.fixes} | {(m.line, m.col) for m in result.manual}:
        around = [(end - start, start, end) for start, end, first, last in spans if first <= (line, col - 1) < last] or \
            [(end - start, start, end) for start, end, _, _ in spans if start <= line <= end]
        out.append(min(around)[1:] if around else (line, line))
    return out


def unexplained_changes(old: str, new: str, result) -> list[tuple[list[str], list[str]]]:
    touched = reported_spans(old, result)
    old_lines, new_lines = python_lines(old), python_lines(new)
    # A definition only the output has is a helper a fix added (reported through its callers).
    added = module_definitions(new) - module_definitions(old)
    old_imports, new_imports = import_lines(old) | emptied_if_headers(old, touched), import_lines(new, added)
    bad = []
    # Blank lines may come and go anywhere, and import management's lines (added imports, the
    # helper an xm.save fix adds) are explained: compare the other lines, which keeps a large
    # insertion from pairing unrelated lines.
    old_kept = [n for n, line in enumerate(old_lines) if line.strip() and n + 1 not in old_imports]
    new_kept = [n for n, line in enumerate(new_lines) if line.strip() and n + 1 not in new_imports]
    matcher = difflib.SequenceMatcher(
        None, [old_lines[n] for n in old_kept], [new_lines[n] for n in new_kept], autojunk=False
    )
    for tag, k1, k2, l1, l2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        # Old lines go, new lines come in their place. A removed line must lie on a reported
        # statement; added lines must be `pass` for an emptied block, or sit on
        # or right beside a reported statement (a TODO above it, a line added in it).
        olds, news = old_kept[k1:k2], new_kept[l1:l2]
        i1 = olds[0] if olds else (old_kept[k1 - 1] + 1 if k1 else 0)
        i2 = olds[-1] + 1 if olds else (old_kept[k1] if k1 < len(old_kept) else len(old_lines))
        beside = any(start - 1 <= i2 and i1 <= end for start, end in touched)
        removed = all(any(start <= n + 1 <= end for start, end in touched) for n in olds)
        added = beside or all(new_lines[n].strip() == "pass" for n in news)
        if not (removed and added):
            bad.append(([old_lines[n] for n in olds], [new_lines[n] for n in news]))
    return bad


def test_the_locality_check_accepts_every_fixture():
    """The oracle itself: every fixture's expected rewrite is explained by its findings."""
    for case in rewrite_cases():
        for target in ("tpu", "portable"):
            result = rewrite(case.read_bytes(), target)
            if result.changed:
                assert unexplained_changes(case.read_text(), result.output.decode(), result) == [], case


@pytest.mark.slow
@profile(200)
@given(program=spliced_programs(), target=TARGETS)
# What this found (regression tests in test_engine.py): comments dropped at the end of the file,
# a TODO added again after a form feed in a comment, new blocks indented with a form feed, a line
# end dropped in a file mixing \r\n and \n, a comment lost above the import after a removed one,
# the space before an except clause's colon.
@example(program="import torch_xla.core.xla_model as xm\ndevice = xm.xla_device()\n\n    \t#\n\n  # b\n",
         target="tpu")
@example(program="# header\x0c\n\nxm.unlazy([])\nimport torch_xla.core.xla_model as xm\n", target="tpu")
@example(program="import torch_xla.core.xla_model as xm\nclass A:\n\x0c pass\n"
                 "def sync(buffers):\n    xm.collective_broadcast(buffers, root_ordinal=1)\n", target="tpu")
@example(program="import torch_xla.core.xla_model as xm\nd = xm.xla_device()\npass\n#\\\r\n", target="portable")
@example(program="import torch_xla.core.xla_model as xm\n#\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
                 "def train(optimizer, use_ddp):\n    if not use_ddp:\n        xm.optimizer_step(optimizer)\n",
         target="tpu")
@example(program="import torch_xla.core.xla_model as xm\ndevice = xm.xla_device()\ntry: pass\nexcept ....A :\n pass\n",
         target="tpu")
def test_spliced_torch_xla_idioms_change_only_what_is_reported(program, target):
    built = []  # whether the engine left definitions out of libcst's parse, per rewrite

    def build(*args, **kwargs):
        found = real_build(*args, **kwargs)
        built.append(found is not None)
        return found

    real_build = skeleton.build
    with mock.patch.object(skeleton, "MIN_CHARS", 0), mock.patch.object(skeleton, "build", build):
        result = check_rewrite(program.encode("utf-8"), target)  # every definition it can leave out
    if built[:1] == [True]:
        with mock.patch.object(skeleton, "build", lambda *args, **kwargs: None):
            whole = rewrite(program.encode("utf-8"), target)
        assert (result.output, result.fixes, result.manual, result.error) == (
            whole.output, whole.fixes, whole.manual, whole.error), "the skeleton parse differs from the whole one"
        event("definitions left out of the parse")
    # The one refusal allowed: what libcst cannot print back exactly (form feeds, see test_engine).
    assert result.error is None or result.error.startswith("cannot rewrite: libcst"), result.error
    event("changed" if result.changed else "unchanged")
    if result.changed:
        assert unexplained_changes(program, result.output.decode("utf-8"), result) == []


# (c) The arguments of every statement-form rule ------------------------------------------------
#
# A statement rule builds new statements from its call's arguments: their text leaves the
# call's parentheses (an assignment, a `for` header, `torch.save(...)` under a guard). Arguments
# whose text is valid only inside those parentheses (implicit string concatenation across lines,
# a line broken after an operator, a generator expression that is the sole argument) made the
# output unparsable, and the engine then left the whole file unconverted. Every such argument
# must convert: the output parses, is a fixed point, and the rule's finding is a fix.

_NAMES = st.sampled_from(["a", "b", "losses", "cfg.path", "d['k']", "items[0]", "opt", "model"])
_STRINGS = st.sampled_from([
    '"plain"', "'single'", 'f"step {a}: "', "f'{d[\"k\"]}'", 'f"{d[\'k\']!r:>{w}}"',
    'f"{{literal}} {a:.3f}"', 'f"mean {sum(v for v in losses) / len(losses):.3f}"',
    'f"{fmt(v for v in losses)}"', "rb'\\x00'", '"""two\nlines"""', "'tab\\t'",
])
_BREAKS = st.sampled_from([" ", "\n", "\n        ", "  # a comment\n    ", " \\\n  "])


def _joined(parts: list[str], breaks: list[str]) -> str:
    return "".join(p + (b if i < len(breaks) else "") for i, (p, b) in enumerate(zip(parts, breaks + [""])))


@st.composite
def _concatenated(draw):
    """Implicit concatenation of string literals, on one line or several."""
    parts = draw(st.lists(_STRINGS, min_size=2, max_size=3))
    parts = [p for p in parts if not p.startswith("rb")] if any(not p.startswith("rb") for p in parts) else parts[:1]
    breaks = draw(st.lists(_BREAKS, min_size=len(parts) - 1, max_size=len(parts) - 1))
    return _joined(parts, breaks)


def _extend(inner):
    """Expressions built on `inner`, which may break lines wherever the brackets they sit in allow."""
    br = _BREAKS
    return st.one_of(
        st.tuples(inner, st.sampled_from(["+", "*", "%", "and", "if a else"]), br, inner).map(
            lambda t: f"{t[0]} {t[1]}{t[2]}{t[3]}"),
        st.tuples(inner, br).map(lambda t: f"fmt({t[0]}{t[1]})"),
        st.tuples(inner, br).map(lambda t: f"len({t[0]}{t[1]})"),
        st.tuples(inner, br, inner).map(lambda t: f"fmt(v{t[1]}for v in {t[0]})"),
        st.tuples(inner, br, inner).map(lambda t: f"sum(v{t[1]}for v in {t[0]})"),
        st.tuples(inner, br).map(lambda t: f"[v for v in {t[0]}{t[1]}if v]"),
        st.tuples(inner, br).map(lambda t: f"{{k: v for k, v in {t[0]}.items(){t[1]}}}"),
        st.tuples(inner, br).map(lambda t: f"({t[1]}{t[0]}{t[1]})"),
        st.tuples(inner, br).map(lambda t: f"(n := {t[0]}{t[1]})"),
        st.tuples(inner, br).map(lambda t: f"lambda v: {t[0]}"),
        st.tuples(inner, br).map(lambda t: f"{t[0]}{t[1]}.attr"),
        st.tuples(inner, br).map(lambda t: f"{t[0]}[{t[1]}0]"),
    )


ARGUMENTS = st.recursive(st.one_of(_NAMES, _STRINGS, _concatenated(), st.sampled_from(["1", "2.5", "None"])),
                         _extend, max_leaves=4)
_LINE_BREAKS = st.sampled_from(["\n", "\n        ", "  # a comment\n    "])
# Half the arguments break a line outside any bracket of their own (valid only inside the call's
# parentheses), and call a function (so that xm.master_print computes them before its guard).
ARGUMENTS = st.one_of(
    ARGUMENTS,
    st.tuples(ARGUMENTS, st.sampled_from(["+", "%", "or", "if a else"]), _LINE_BREAKS, ARGUMENTS).map(
        lambda t: f"fmt({t[0]}) {t[1]}{t[2]}{t[3]}"),
    st.tuples(_STRINGS, _LINE_BREAKS, _STRINGS).map(lambda t: f'f"{{fmt(a)}}"{t[1]}{t[0]}{t[1]}{t[2]}'),
)
# An argument that is a call's only one may also be a bare generator expression, or `x := y`.
SOLE_ARGUMENTS = st.one_of(
    ARGUMENTS,
    st.tuples(ARGUMENTS, _BREAKS).map(lambda t: f"fmt(v){t[1]}for v in {t[0]}"),
    ARGUMENTS.map(lambda a: f"n := {a}"),
)

# Rule code -> calls with slots: {A} any argument, {S} a call's only argument.
STATEMENT_RULE_CALLS = {
    "TPU010": ["xm.mark_step(wait={A})"],
    "TPU024": ["xm.master_print({S})", "xm.master_print({A}, {A})", "xm.master_print({A}, fd={A})"],
    "TPU030": ["xm.optimizer_step({S})", "xm.optimizer_step(opt, optimizer_args={A})",
               "result = xm.optimizer_step({A}, barrier=True)"],
    "TPU050": ["xm.save({A}, {A})", "xm.save({A}, {A}, master_only=False)",
               "xm.save({A}, {A}, global_master=True)"],
    "TPU100": ["xm.all_reduce(xm.REDUCE_SUM, {A})", "xm.all_reduce('sum', [{A}, {A}], scale={A})",
               "total = xm.all_reduce(xm.REDUCE_MAX, {A}, scale={A})"],
    "TPU101": ["gathered = xm.all_gather({A}, dim={A})", "xm.all_gather({S})"],
    "TPU104": ["xm.collective_broadcast({A}, root_ordinal={A})", "xm.collective_broadcast([{A}, {A}])"],
    "TPU105": ["xm.broadcast_master_param({S})"],
    "TPU106": ["xm.rendezvous({S})"],
    "TPU107": ["reduced = xm.mesh_reduce({A}, {A}, {A})"],
    "TPU108": ["xm.reduce_gradients({S})"],
    "TPU127": ["xr.initialize_cache({S})", "xr.initialize_cache({A}, readonly=False)"],
    "TPU132": ["torch_xla.experimental.eager_mode(\n    True  # {A}\n)"],
    "TPU158": ["xla_logger.info({S})", "xla_logger.warning(\n    {S}\n)"],
}
_HEADER = ("import torch_xla\nimport torch_xla.core.xla_model as xm\nimport torch_xla.runtime as xr\n"
           "from optimum.tpu import xla_logger\n\n\n")


def _drawn_call(draw, calls: dict[str, list[str]], argument) -> tuple[str, str]:
    """A rule's code and one of its calls in `calls`, each `{A}` / `{S}` of it (an argument, a
    sole argument) replaced by `argument(part)`."""
    code = draw(st.sampled_from(sorted(calls)))
    parts = re.split(r"(\{[AS]\})", draw(st.sampled_from(calls[code])))
    return code, "".join(argument(part) if part in ("{A}", "{S}") else part for part in parts)


@st.composite
def statement_rule_programs(draw):
    code, call = _drawn_call(draw, STATEMENT_RULE_CALLS,
                             lambda part: draw(SOLE_ARGUMENTS if part == "{S}" else ARGUMENTS))
    where = draw(st.sampled_from(["function", "loop", "module"]))
    if where == "module":
        body = call + "\n"
    else:
        lines = call.split("\n")
        indent = "    " if where == "function" else "        "
        body = "def step(a, b, d, w, losses, items, opt, model, cfg):\n"
        if where == "loop":
            body += "    for _ in range(2):\n"
        body += indent + lines[0] + "\n" + "".join(line + "\n" for line in lines[1:])
    program = _HEADER + body
    assume(parses(program))
    return code, program


@profile(60)
@given(case=statement_rule_programs(), target=TARGETS)
@example(case=("TPU024", _HEADER + 'def report(losses, step):\n    xm.master_print(f"step {step}: "\n'
               '                    f"mean {mean_of(l for l in losses):.3f}")\n'), target="tpu")
def test_every_statement_rule_converts_any_argument_text(case, target):
    code, program = case
    result = check_rewrite(program.encode("utf-8"), target)
    assert result.error is None, result.error
    assert result.changed, program
    assert [f.code for f in result.fixes].count(code) == 1, (program, result.fixes, result.manual)
    assert [m for m in result.manual if m.code == code] == [], (program, result.manual)


# (d) Unusual argument shapes, and unusual places, of the calls the rules convert ----------------
#
# Legal code that reaches a rule's transform in a shape or place it may not expect: an empty
# literal list (`xm.all_reduce(op, [])` made an `if` with no body), starred and keyword-unpacked
# arguments, an argument over lines with a comment (quoted in a TODO, it broke the comment line),
# the call as an `if` test or in a one-line suite (the fold of a constant `if` read an indented
# block's header), a spawn with no worker (the launch plan crashed). Whatever the rule does with
# it (a fix, or a TODO for a human), the tool must not crash and its output must parse and be a
# fixed point, and the call must be reported (fixed, or a TODO).

SHAPES = ["[]", "()", "{{}}", "[{A}]", "({A},)", "[*{A}]", "[{A}, *{A}]", "*{A}", "**{A}", "lambda: {A}",
          "(n := {A})", "(\n    {A}  # c\n)", "[\n    {A},  # c\n    {A},\n]", "{A} if a else {A}", "None"]
# {C}: the call as a statement; {E}: the call as an expression (a statement's value, without `x = `).
PLACES = [
    "{C}", "if a: {C}", "if a:\n    pass\nelse: {C}", "if a:\n    pass\nelif b: {C}", "a = 1; {C}", "{C}; a = 1",
    "while a: {C}", "for _ in b: {C}", "try: {C}\nexcept E: pass", "with m: {C}",
    "async def f():\n    {C}", "class K:\n    {C}", "def g():\n    return {E}", "lam = lambda: {E}",
    "values = [{E} for _ in b]", "@{E}\ndef g(): pass", "with {E} as w: pass", "if {E}: pass",
    "if {E}: a = 1\nelse: a = 2", "for w in {E}: pass", "print({E})", "assert {E}", "z = ({E}, 1)",
    "def g(p={E}): pass",
]
# Calls beyond the statement rules' whose shapes or places went wrong.
SHAPE_RULE_CALLS = {**STATEMENT_RULE_CALLS,
                    "TPU001": ["xm.xla_device({A})", "xm.xla_device(devkind={A})"],
                    "TPU010": ["xm.mark_step()"],
                    "TPU060": ["xmp.spawn({A})", "xmp.spawn(fn, args={A}, nprocs={A})"],
                    "TPU161": ["xm.xla_device_hw({A})"]}
_SHAPE_HEADER = _HEADER.replace("import torch_xla.runtime as xr\n", "import torch_xla.runtime as xr\n"
                                "import torch_xla.distributed.xla_multiprocessing as xmp\n")


@st.composite
def shaped_call_programs(draw):
    code, call = _drawn_call(draw, SHAPE_RULE_CALLS, lambda part: (
        draw(st.sampled_from(SHAPES)).replace("{A}", draw(ARGUMENTS).replace("{", "{{").replace("}", "}}"))
        .format() if draw(st.booleans()) else draw(SOLE_ARGUMENTS if part == "{S}" else ARGUMENTS)))
    expression = re.sub(r"^\w+ = ", "", call)
    place = draw(st.sampled_from(PLACES))
    body = place.replace("{C}", call).replace("{E}", expression)
    program = _SHAPE_HEADER + body + "\n"
    assume(parses(program))
    return code, program


@profile(60)
@given(case=shaped_call_programs(), target=TARGETS)
@example(case=("TPU100", _SHAPE_HEADER + "xm.all_reduce(xm.REDUCE_SUM, [])\n"), target="tpu")
@example(case=("TPU010", _SHAPE_HEADER + "if xm.mark_step(): a = 1\nelse: a = 2\n"), target="tpu")
@example(case=("TPU001", _SHAPE_HEADER + "d = xm.xla_device([\n    a,  # c\n    b,\n][0])\n"), target="tpu")
@example(case=("TPU060", _SHAPE_HEADER + "xmp.spawn(nprocs=1)\n"), target="tpu")
def test_every_rule_takes_unusual_argument_shapes_and_places(case, target):
    code, program = case
    result = check_rewrite(program.encode("utf-8"), target)
    assert result.error is None, result.error
    assert result.fixes or result.manual, program  # the rule's, or a sibling's (TPU031 for TPU030)
