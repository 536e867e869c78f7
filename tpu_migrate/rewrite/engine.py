"""Rewrite one Python file's bytes (files by path, notebooks included: paths.py).

Per file: pre-filter the bytes; decode as Python does; parse with `ast` (fast, and the error
message users know); analyse names; stop here when nothing refers to torch_xla; parse with libcst,
leaving out the statements no rule can change (skeleton.py); rewrite the flagged statements;
manage imports; print (copying the statements that did not change: printing.py); check that
the print parses; put the left-out text back. A file
whose output does not parse is kept byte-for-byte and reported as an error.
"""

from __future__ import annotations

import ast
import os
import warnings
from functools import lru_cache

import libcst as cst

from tpu_migrate.findings import FileResult, Fix, KeptImport, Manual, Note
from tpu_migrate.rewrite import cst_parse, imports, parsed_trees, printing, registry, todos, transforms
from tpu_migrate.rewrite import skeleton as skeletons
from tpu_migrate.rewrite.context import FileContext, ImportPlan, Options, StatementContext
from tpu_migrate.rewrite.except_colons import restore_except_colons, spaced_except_colons
from tpu_migrate.rewrite.flows import held_assignments, passed_to_functions
from tpu_migrate.rewrite.files import DecodeError, decode, encode, format_size, prefilter
from tpu_migrate.rewrite.names import Analysis, analyze, is_xla_name, mark_subtrees
from tpu_migrate.rewrite.plans import make_plans
from tpu_migrate.rewrite.printing import quick_printing
from tpu_migrate.rewrite.suppress import parse_suppressions, unknown_codes
from tpu_migrate.rewrite.skeleton import SkeletonMiss
from tpu_migrate.rewrite.source_spans import source_spans
from tpu_migrate.rewrite.transformer import ModuleRewriter, WalkError
from tpu_migrate.rewrite.transforms.amp_compile import found_inf_steps
from tpu_migrate.rewrite.transforms.spmd import mesh_attribute_reads
from tpu_migrate.rewrite.transforms.collectives_ported import ported_collectives
from tpu_migrate.rewrite.transforms.fsdp_checkpoints import XLA_FSDP_NAMES, shard_metadata_reads
from tpu_migrate.rewrite.transforms.fsdp_models import wrapped_model_reads
from tpu_migrate.rewrite.transforms.spmd_parameters import parameter_marking_loops
from tpu_migrate.rules import Catalog, RuleError, load_catalog


def rewrite_bytes(data: bytes, path: str, options: Options, catalog: Catalog | None = None) -> FileResult:
    """The result for one file; `output` holds the new bytes when `changed`."""
    result = FileResult(path)
    if not prefilter(data):
        return result
    if options.max_file_size and len(data) > options.max_file_size:
        # libcst needs ~15 s and ~600 MB per MiB of source: refuse rather than stall the run.
        result.error = (f"too large to rewrite: {format_size(len(data))}, over the "
                        f"{format_size(options.max_file_size)} limit (--max-file-size)")
        return result
    try:
        source = decode(data)
    except DecodeError as exc:
        # A NUL byte: not text at all, whatever the decoder's complaint (an encoding declaration).
        result.error = "a binary file (it holds NUL bytes), not Python source; left unchanged" \
            if b"\x00" in data else str(exc)
        return result
    # Classic-Mac files (CR only): libcst drops a final lone "\r", so rewrite with "\n" and
    # put the CRs back.
    cr_only = "\r" in source.text and "\n" not in source.text
    text = source.text.replace("\r", "\n") if cr_only else source.text
    # The project passes' tree of these bytes, where they parsed them (parsed_trees.py): the
    # same tree as a parse of the text, which UTF-8 bytes (no BOM) decode to as they read.
    tree = parsed_trees.take(data) if source.encoding == "utf-8" and not cr_only else None
    try:
        with quick_printing():
            new_text = rewrite_text(text, path, options, catalog or load_catalog(), result, tree=tree)
        if cr_only and new_text is not None:
            new_text = new_text.replace("\n", "\r")
    except Unparsable as exc:
        return _failed(result, exc.message, exc.line)
    except (TooDeep, RecursionError, MemoryError) as exc:
        # Python's parser, libcst's printer and our walkers all recurse on nested expressions.
        return _failed(result, f"too deeply nested to rewrite ({str(exc) or type(exc).__name__})")
    except Unreproducible as exc:
        return _failed(result, f"cannot rewrite: {exc}; left unchanged")
    except (WalkError, UndeclaredCode) as exc:
        return _failed(result, f"internal error: {exc}")
    except BrokenOutput as exc:
        return _failed(result, f"internal error: the rewritten file does not parse ({exc}); left unchanged")
    except (SyntaxError, ValueError, cst.ParserSyntaxError) as exc:
        # Not from parsing the input (Unparsable): a rule built a node libcst refuses (a comment
        # with a line break, say). The file is fine; the tool is not.
        return _failed(result, f"internal error: {type(exc).__name__}: {exc}; left unchanged")
    _report_open_work(text, result, catalog or load_catalog())
    if new_text is None or new_text == source.text:
        return result
    result.changed = True
    result.original = data
    result.output = encode(new_text, source.encoding)
    return result


def _failed(result: FileResult, error: str, line: int | None = None) -> FileResult:
    """A file left unchanged by an error carries no fixes or findings from the partial run."""
    result.error = error
    result.error_line = line or None
    result.fixes.clear()
    result.manual.clear()
    result.notes.clear()
    result.kept_imports.clear()
    return result


def _report_open_work(text: str, result: FileResult, catalog: Catalog) -> None:
    """Add the TODO(tpu-migrate) comments already in the input that no fresh finding stands for
    (open manual work from an earlier run), and warn about ignore comments naming no rule.
    Lines are the input's, like every finding's."""
    fresh = list(result.manual)
    # Not the TODOs the rewrite dropped: this run converted what they marked (layout.py).
    left = [todo for todo in todos.open_todos(text) if todo.line not in result.done_todos]
    result.manual.extend(todos.unaccounted(fresh, left, text))
    result.manual.sort(key=lambda m: (m.line, m.col, m.code))
    known = {rule.code for rule in catalog.rules}
    for line, code in unknown_codes(text, known):
        result.notes.append(Note(line, f"unknown rule code {code} in a `# tpu-migrate: ignore[...]` comment "
                                       "(see `tpu-migrate rules`)"))


TRIGGER_STRINGS = registry.trigger_strings()
# AWS Neuron runs on torch_xla too (PJRT_DEVICE=NEURON): its `xla` device is a NeuronCore, its
# collectives Neuron's. A file that imports these is Neuron code, not TPU code: left as it is.
NEURON_PACKAGES = ("torch_neuronx", "torch_neuron", "neuronx_distributed", "libneuronxla", "transformers_neuronx",
                   "optimum.neuron")


def _neuron_package(qualname: str) -> str | None:
    return next((p for p in NEURON_PACKAGES if qualname == p or qualname.startswith(p + ".")), None)


@lru_cache(maxsize=None)
def flagged_names(catalog: Catalog) -> frozenset[str]:
    """The qualified names outside torch_xla whose statements the walk visits: the rules'
    `matches` and the registered transforms' `calls=`. Refuses rules and code that disagree
    (registry.check); the rewrite command asks before any file."""
    problems = registry.check(catalog)
    if problems:
        raise RuleError("; ".join(problems))
    return catalog.rule_names | registry.trigger_names()


def analysis_arguments(catalog: Catalog) -> tuple:
    """What the rewrite gives names.analyze after the tree (kept_launches.py analyses the files
    it reads so, to lend the analysis to the rewrite: parsed_trees.py)."""
    return catalog.canonical, flagged_names(catalog), TRIGGER_STRINGS


def rewrite_text(text: str, path: str, options: Options, catalog: Catalog, result: FileResult,
                 whole: bool = False, tree: ast.Module | None = None) -> str | None:
    """The rewritten text, or None when nothing in it concerns torch_xla. libcst parses the
    statements the rules cannot change only when `whole` (skeleton.py). `tree`: the text's
    ast, where it was parsed already (by the project passes; read, never changed)."""
    try:
        return _rewrite_text(text, path, options, catalog, result, whole, tree)
    except SkeletonMiss:  # a later pass must visit a statement the skeleton left out
        result.fixes.clear()
        result.manual.clear()
        return _rewrite_text(text, path, options, catalog, result, whole=True)


def _rewrite_text(text: str, path: str, options: Options, catalog: Catalog, result: FileResult,
                  whole: bool, tree: ast.Module | None = None) -> str | None:
    tree = _parse_input(ast.parse, text, filename=path) if tree is None else tree
    arguments = analysis_arguments(catalog)
    analysis = parsed_trees.take_analysis(tree, arguments)  # a project pass's, where it lent one
    if analysis is None:
        analysis = analyze(tree, *arguments)
    has_xla_imports = any(is_xla_name(b.qualname) for b in analysis.imports)
    dynamic_imports = [d for info in analysis.infos.values() for d in info.dynamic_imports]
    result.imports_xla = has_xla_imports or bool(dynamic_imports)
    if not has_xla_imports and not any(i.interesting for i in analysis.infos.values()):
        return None
    neuron = next((b for b in analysis.imports if _neuron_package(b.qualname)), None)
    if neuron is not None:
        result.notes.append(Note(neuron.stmt.lineno, f"not rewritten: it imports {_neuron_package(neuron.qualname)} "
                                 "(AWS Neuron), whose torch_xla drives Trainium / Inferentia, not a TPU"))
        return None
    _check_nesting(tree, text)
    file = _file_context(text, options, catalog, result, True, analysis)
    plain_end = bool(tree.body) and _plain_tail(text, tree.body[-1].end_lineno)
    flagged = flagged_names(catalog)
    skeleton = None if whole else skeletons.build(
        text, tree, analysis, keep_last=not plain_end,
        kept_import=lambda qualname: is_xla_name(qualname) or catalog.canonical(qualname) in flagged)
    parsed = text if skeleton is None else skeleton.text
    module = _parse_input(cst_parse.parse_module, parsed)
    # The skeleton's except clauses are some of the file's, with their text: none of the file's
    # with a space before its colon, none of the skeleton's (and no parse of the skeleton).
    if skeleton is None or spaced_except_colons(text, analysis.nodes):
        module = restore_except_colons(module, parsed, tree if skeleton is None else None)
    if "\x0c" in module.default_indent:
        module = _without_form_feed_indent(module)
    footer = None if plain_end else _true_footer(text, parsed, tree, module)
    if "\x0c" in text or ("\r" in text and text.count("\r\n") != text.count("\n")):
        # libcst 1.9 drops a form feed that starts a statement's line (which can move the
        # statement out of its block: `    \x0cy = 2` prints as `y = 2`) and some line ends of
        # files that mix \r\n and \n (found by tests/test_properties.py). Rare: check the
        # round trip of these files only, and refuse those it does not reproduce.
        if _with_footer(module.code, module, footer) != text:
            raise Unreproducible("libcst does not print this file back exactly (a form feed before a "
                                 "statement, or mixed line endings)")
    new_module = _rewrite_module(module, tree, file, skeleton)
    waiting_for = _held_unsafe_fix(result, options, catalog)
    if waiting_for is not None:
        wanted = list(result.fixes)  # what the waiting pass reports as going with the unsafe fix
        # An unsafe fix `--fix-level safe` held back keeps torch_xla's runtime in this file (its
        # launch, its loader): a rank query or a device converted beside it would run on neither
        # stack. Anew, with every conversion that assumes TorchTPU's runtime waiting too.
        result.fixes.clear()
        result.manual.clear()
        fresh = _unmarked(analysis)
        file = _file_context(text, options, catalog, result, True, fresh, waiting_for)
        new_module = _rewrite_module(module, tree, file, skeleton)
    if (file.plans.shard_metadata_reads or file.plans.wrapped_model_reads) and _xla_fsdp_kept(file):
        # A wrap by torch_xla's FSDP is left for a human: its model is torch_xla's, whose
        # get_shard_metadata() the FSDP2 helper must not answer (it has no torch_xla shards),
        # and whose `.module` is still its wrapper's.
        result.fixes.clear()
        result.manual.clear()
        fresh = _unmarked(analysis)
        file = _file_context(text, options, catalog, result, file.convert_guards, fresh, file.waiting_for,
                             xla_fsdp_kept=True)
        new_module = _rewrite_module(module, tree, file, skeleton)
    if file.guards_converted and file.kept_xla_imports:
        # Availability guards mean "a TPU is here" only once nothing in the file needs torch_xla
        # any more; while some use remains (a manual TODO), they keep testing for torch_xla.
        result.fixes.clear()
        result.manual.clear()
        # Anew: plans marked the first analysis.
        fresh = _unmarked(analysis)
        file = _file_context(text, options, catalog, result, False, fresh, file.waiting_for,
                             xla_fsdp_kept=file.xla_fsdp_kept)
        new_module = _rewrite_module(module, tree, file, skeleton)
    imported = dict(options.xla_parameters).get(os.path.realpath(path), ()) if options.xla_parameters else ()
    for _ in range(3):
        # Assignments whose converted value would go to a call left to torch_xla: kept (flows.py);
        # through the user's functions too, and marked at the call where it cannot be kept.
        held = held_assignments(file.analysis, result.fixes, result.manual, _holds(catalog))
        through, marks = passed_to_functions(file.analysis, result.fixes, result.manual, _holds(catalog),
                                             _changes(catalog), imported, _left_elsewhere(catalog))
        held = {**through, **held}
        if held.keys() <= file.held.keys() and marks.keys() <= file.flow_marks.keys():
            break
        result.fixes.clear()
        result.manual.clear()
        fresh = _unmarked(analysis)
        again = _file_context(text, options, catalog, result, file.convert_guards, fresh, file.waiting_for,
                              xla_fsdp_kept=file.xla_fsdp_kept)
        again.held = {**file.held, **held}  # keyed by the statements of `tree`, which both walk
        again.flow_marks = {**file.flow_marks, **marks}
        for statement in again.flow_marks:
            fresh.infos[statement].forced = True
        mark_subtrees(tree.body, fresh.infos)
        file = again
        new_module = _rewrite_module(module, tree, file, skeleton)
    if skeleton is not None and file.flow_marks.keys() - file.flow_marks_placed:
        # A call to mark stands in a definition the skeleton left out: anew, whole.
        result.fixes.clear()
        result.manual.clear()
        return rewrite_text(text, path, options, catalog, result, whole=True)
    if waiting_for is not None:
        _report_waiting(result, wanted, waiting_for)
    _check_declared(result, catalog)
    result.fixes.sort(key=lambda f: (f.line, f.col, f.code))
    result.manual.sort(key=lambda m: (m.line, m.col, m.code))
    # Here, in the worker, so that the cache holds it (the migration report's blocked files).
    result.kept_imports = sorted({KeptImport(b.stmt.lineno, b.qualname) for b in file.kept_xla_imports}
                                 | {KeptImport(line, module) for line, _, module in dynamic_imports},
                                 key=lambda k: (k.line, k.module))
    if footer is not None and _footer_code(new_module) != _footer_code(module):
        raise Unreproducible("libcst does not print the end of this file back exactly")
    # The statements the walk left as they were are copied from `parsed`, not printed anew.
    checked: list[str] = []
    printed = printing.module_code(new_module, source_spans(module, tree, parsed, skeleton), checked=checked)
    code = _with_footer(printed, module, footer)
    if code == parsed:
        return text
    output = code if skeleton is None else skeleton.restore(code, file.gone)
    if output is None:  # a rule moved a left-out definition (re-indented its block): anew, whole
        result.fixes.clear()
        result.manual.clear()
        return rewrite_text(text, path, options, catalog, result, whole=True)
    _check_parses(code, output, compile_first=not _late_future_import(tree),
                  checked=checked[0] if code is printed else None)
    result.done_todos = frozenset(file.done_todo_lines)
    return output


class Unparsable(Exception):
    """The input does not parse: ast's or libcst's parser refused it (a syntax error, NUL
    bytes, what libcst cannot read). Its one-line message, and its line where known."""

    def __init__(self, message: str, line: int | None = None):
        super().__init__(message)
        self.message, self.line = message, line


def _parse_input(parse, text: str, **options):
    """`parse(text)`, its refusals as Unparsable: the same exceptions from a rule's code are
    the tool's errors, not the file's (rewrite_bytes)."""
    try:
        return parse(text, **options)
    except SyntaxError as exc:  # NUL bytes, say: the parser names no line
        raise Unparsable(f"syntax error at line {exc.lineno}: {exc.msg}" if exc.lineno
                         else f"cannot parse: {exc.msg}", exc.lineno) from None
    except cst.ParserSyntaxError as exc:
        raise Unparsable(f"syntax error at line {exc.raw_line}: {exc.message}", exc.raw_line) from None
    except ValueError as exc:
        raise Unparsable(f"cannot parse: {type(exc).__name__}: {exc}".rstrip(": ")) from None


class UndeclaredCode(Exception):
    """A finding under a code no rule table declares (a bug, reported per file)."""


class BrokenOutput(Exception):
    """The rewritten file does not parse (a bug in a rule): nothing is written."""

    def __init__(self, error: SyntaxError | str):
        super().__init__(error if isinstance(error, str) else f"line {error.lineno}: {error.msg}")


def _check_parses(printed: str, output: str, compile_first: bool = True, checked: str | None = None) -> None:
    """The output parses. `printed` is what libcst printed: the output itself, or its skeleton,
    which parses exactly when the output does: the left-out definitions came back verbatim,
    whole lines at their own indentation, and they parsed there in the input (skeleton.py).
    `checked` (printing.module_code), where given, parses exactly when `printed` does, for the
    same reason: `printed` without the statements it copied whole from the parsed text, lines
    that parsed there at this indentation (Python's parser carries nothing from one statement
    to the next, but for `from __future__ import barry_as_FLUFL`: then `printed` is checked).
    It is checked in its place; where it does not parse, `printed` decides, as before.

    compile() to bytecode first: the same parser, without building ast's Python objects (about
    half the time of ast.parse). It also refuses what parses (`return` outside a function, top-level
    `await` in a notebook's code) and warns about some code (`x is 1`): then ast.parse decides,
    as it always did, with its own warnings. `compile_first`: False where compile would refuse
    the input anyway (`_late_future_import`)."""
    if checked is not None and checked != printed and "barry_as_FLUFL" not in printed:
        if compile_first and _compiles_quietly(checked):
            return
        try:
            ast.parse(checked)
            return
        except SyntaxError:
            pass  # the error as `printed` has it
    elif compile_first and _compiles_quietly(printed):
        return
    try:
        ast.parse(printed)
    except SyntaxError as printed_error:
        try:
            ast.parse(output)  # the output's own line number
        except SyntaxError as exc:
            raise BrokenOutput(exc) from None
        raise BrokenOutput(printed_error) from None


def _compiles_quietly(text: str) -> bool:
    try:
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            compile(text, "<unknown>", "exec", dont_inherit=True)
    except Exception:  # noqa: BLE001 - whatever it is, ast.parse judges
        return False
    return not warned


def _late_future_import(tree: ast.Module) -> bool:
    """A `from __future__` import after the docstring and the future imports, which ast.parse
    takes and compile refuses (files of mixed code, as benchmarks/real_code.py makes)."""
    body = tree.body[1:] if tree.body and isinstance(tree.body[0], ast.Expr) and \
        isinstance(tree.body[0].value, ast.Constant) and isinstance(tree.body[0].value.value, str) else tree.body
    futures = [isinstance(node, ast.ImportFrom) and node.module == "__future__" for node in body]
    return any(futures[futures.index(False):]) if False in futures else False


class Unreproducible(Exception):
    """libcst would not print the file's unchanged parts back exactly: leave it alone."""


def _with_footer(code: str, module: cst.Module, footer: str | None) -> str:
    """`code` (printed from `module` or a rewrite of it) with the file's own end put back."""
    if footer is None:
        return code
    kept = _footer_code(module)
    if not code.endswith(kept):
        raise Unreproducible("libcst does not print the end of this file back exactly")
    return code[:len(code) - len(kept)] + footer


class _PinIndent(cst.CSTTransformer):
    def __init__(self, indent: str):
        super().__init__()
        self.indent = indent

    def leave_IndentedBlock(self, original, updated):
        return updated.with_changes(indent=self.indent) if updated.indent is None else updated


def _without_form_feed_indent(module: cst.Module) -> cst.Module:
    r"""libcst takes the first block's indentation as the file's unit for new blocks; when that
    holds a form feed (`class A:\n\x0c pass`), which Python counts as column 0, blocks the
    rules add would not line up with their neighbours (found by tests/test_properties.py). Pin
    the existing blocks' indentation (blocks with the default one print it from the module),
    then indent new blocks without the form feed."""
    unit = module.default_indent
    return module.visit(_PinIndent(unit)).with_changes(default_indent=unit.replace("\x0c", "") or "    ")


def _footer_code(module: cst.Module) -> str:
    code = "".join(module.code_for_node(line) for line in module.footer)
    if code and not module.has_trailing_newline:  # as Module.code prints it
        code = code[:-len(module.default_newline)] if code.endswith(module.default_newline) else code
    return code


def _true_footer(text: str, parsed: str, tree: ast.Module, module: cst.Module) -> str | None:
    r"""The lines after the last statement as they are in `text`, when libcst lost some of them.

    libcst 1.9 drops lines from the end of a file whose last lines are indented comments or
    whitespace-only lines after a blank line: `x = 1\n\n  # a\n\n  # b\n` prints as
    `x = 1\n  # b\n` (found by tests/test_properties.py). None when its footer is right.
    `parsed`: the text libcst parsed (a skeleton keeps the last statement and what follows).
    """
    if not tree.body or not module.body:
        return None
    last = module.body[-1]  # `a; b` is one libcst statement, two ast ones
    node = tree.body[-len(last.body) if isinstance(last, cst.SimpleStatementLine) else -1]
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    start = 0
    for count, match in enumerate(todos.LINE_BREAK.finditer(text), start=2):
        if count > first:
            break
        start = match.end()
    tail = text[start:]  # from the last statement's first line (no leading comments) on
    last = module.code_for_node(last.with_changes(leading_lines=()))
    if not tail.startswith(last):  # unforeseen: check the whole file, refuse it if it is lossy
        if module.code == parsed:
            return None
        raise Unreproducible("libcst does not print the end of this file back exactly")
    footer = tail[len(last):]
    return None if footer == _footer_code(module) else footer


def _plain_tail(text: str, last_line: int | None) -> bool:
    """True when every line after the last statement's is empty or a comment in column 0:
    libcst prints such an end back exactly (it loses only indented or whitespace-only lines), so
    the last statement need not be printed to compare (it can be most of the file)."""
    if last_line is None or ("\r" in text and text.count("\r") != text.count("\r\n")):
        return False  # lone CRs: ast's line numbers are not the \n-separated ones
    tail = text.split("\n", last_line)[-1] if text.count("\n") >= last_line else ""
    return all(not line or line == "\r" or line.startswith("#") for line in tail.split("\n"))


MAX_NESTING = 1000


class TooDeep(Exception):
    pass


def _check_nesting(tree: ast.AST, text: str) -> None:
    """Refuse what libcst cannot take before its native parser sees it.

    `a and b and ...` is one flat node in `ast` but a chain of nested nodes in libcst, whose
    native parser overflows the C stack (a segfault that kills the run) at a few thousand
    operands. So count nesting the way libcst will: a BoolOp adds one level per operand. Any
    file deeper than MAX_NESTING would fail later anyway (Python's recursion limit, ~500 levels
    in libcst's printer).

    Nesting needs source: each level under a node is at least a character shorter every
    DEPTH_PER_CHAR levels (a BoolOp's extra level, an operand and " or "). So a node whose
    text is short cannot hide the limit under it, and the walk skips it: it visits only the
    outer statements of a file, and counts the same.
    """
    line_starts = todos.line_starts(text)
    stack = [(tree, 0)]
    children, bool_op = ast.iter_child_nodes, ast.BoolOp
    while stack:
        node, depth = stack.pop()
        depth += len(node.values) - 1 if isinstance(node, bool_op) else 1
        if depth > MAX_NESTING:
            raise TooDeep(f"over {MAX_NESTING} levels of nested expressions at line {getattr(node, 'lineno', '?')}")
        if depth + DEPTH_PER_CHAR * (_span_at_most(node, line_starts) + 1) <= MAX_NESTING:
            continue
        stack.extend((child, depth) for child in children(node))


DEPTH_PER_CHAR = 3
_UNPLACED = 1 << 30  # no position (the module, ctx, operators) or unreliable ones: walk it


def _span_at_most(node: ast.AST, line_starts: list[int]) -> int:
    """An upper bound on the characters of `node`'s source, decorators included: from the
    start of its first line (columns are UTF-8 bytes, never fewer than characters)."""
    end_line = getattr(node, "end_lineno", None)
    if end_line is None or isinstance(node, ast.JoinedStr):  # f-string parts: odd positions before 3.12
        return _UNPLACED
    first = node.lineno
    decorators = getattr(node, "decorator_list", None)
    if decorators:
        first = min(first, *[d.lineno for d in decorators])
    return line_starts[end_line - 1] - line_starts[first - 1] + node.end_col_offset


def _unmarked(analysis: Analysis) -> Analysis:
    """`analysis` as `analyze` made it, for a pass anew: without the marks of the last pass's
    plans (StmtInfo.forced, set by plans.py and the transforms' plans, and by the engine for
    flow marks; nothing else in an analysis changes after `analyze`). Not analysed again: on a
    large file whose converted values reach calls left to torch_xla, the second analysis was
    a fifth of the time."""
    for info in analysis.infos.values():
        info.forced = False
    mark_subtrees(analysis.tree.body, analysis.infos)
    return analysis


def _file_context(text, options, catalog, result, convert_guards, analysis, waiting_for=None,
                  xla_fsdp_kept=False) -> FileContext:
    """What the walk knows about the file, the cross-statement plans included. `xla_fsdp_kept`:
    a wrap by torch_xla's FSDP stays, so `model.get_shard_metadata()` reads stay torch_xla's."""
    file = FileContext(
        catalog=catalog,
        options=options,
        analysis=analysis,
        import_plan=ImportPlan(analysis, notebook=result.path.endswith(".ipynb")),
        suppressions=parse_suppressions(text),
        # Python's lines, as ast numbers them: str.splitlines() also breaks at \f, \v, \x1c-\x1e,
        # \x85, \u2028 and \u2029, which may sit in comments and strings (a ^L page break), and
        # would shift every later line (a TODO above a statement was then not seen: added again).
        source_lines=todos.LINE_BREAK.split(text),
        fixes=result.fixes,
        manual=result.manual,
        convert_guards=convert_guards,
        waiting_for=waiting_for,
        notebook=result.path.endswith(".ipynb"),
        spmd_why=_spmd_why(options, result.path),
        kept_launch_why=_kept_launch_why(options, result.path),
        xla_fsdp_kept=xla_fsdp_kept,
    )
    def fix_allowed(code, info):
        return StatementContext(file, info).fix_allowed(code)

    file.plans = make_plans(analysis, catalog.canonical, fix_allowed)
    file.plans.shard_metadata_reads = {} if xla_fsdp_kept else shard_metadata_reads(analysis)
    file.plans.wrapped_model_reads = {} if xla_fsdp_kept else wrapped_model_reads(analysis)
    file.plans.found_inf_steps = found_inf_steps(analysis)
    file.plans.mesh_attribute_reads = mesh_attribute_reads(analysis)
    file.plans.ported_collectives = ported_collectives(file)
    file.plans.sharded_parameter_loops, file.plans.parameter_mark_refusals = parameter_marking_loops(
        analysis, catalog.canonical, fix_allowed)
    return file


def _spmd_why(options: Options, path: str) -> str | None:
    if not options.spmd_modules:
        return None
    return dict(options.spmd_modules).get(os.path.realpath(path))


def _kept_launch_why(options: Options, path: str) -> str | None:
    if not options.kept_launches:
        return None
    return dict(options.kept_launches).get(os.path.realpath(path))


def _xla_fsdp_kept(file: FileContext) -> bool:
    """Whether an import of torch_xla's FSDP class stays: a wrap (or other use) was left to it."""
    return any(binding.qualname in XLA_FSDP_NAMES for binding in file.kept_xla_imports)


def _held_unsafe_fix(result: FileResult, options: Options, catalog: Catalog) -> tuple[str, int] | None:
    """(code, line) of the first unsafe fix `--fix-level safe` held back in the file, if any."""
    if options.fix_level != "safe":
        return None
    held = sorted((m.line, m.code) for m in result.manual
                  if not m.todo and catalog.by_code(m.code).safety == "unsafe")
    if not held:
        return None
    line, code = held[0]
    return code, line


def _check_declared(result: FileResult, catalog: Catalog) -> None:
    """Every finding's code is a rule of the tables: one that is not (a transform's typo, a rule
    deleted from its TOML) would reach users with no name and no explanation. The file is then
    an internal error, left unchanged (the registry's check refuses most at load already)."""
    unknown = sorted({f.code for f in [*result.fixes, *result.manual]} - catalog.codes)
    if unknown:
        raise UndeclaredCode(f"a rule wrote a finding under {', '.join(unknown)}, which no rule table declares")


def _report_waiting(result: FileResult, wanted: list[Fix], waiting_for: tuple[str, int]) -> None:
    """A finding (no TODO comment) for each fix the first pass made that waits with the held
    unsafe fix: what the run that converts them together will do."""
    code, line = waiting_for
    done = {(f.code, f.line, f.col) for f in result.fixes}
    reported = {(m.code, m.line, m.col) for m in result.manual}
    for fix in dict.fromkeys(wanted):
        key = (fix.code, fix.line, fix.col)
        if key in done or key in reported:
            continue
        result.manual.append(Manual(
            fix.code, fix.line, fix.col, f"not applied at --fix-level safe: it goes with {code} (line {line}), "
            "an unsafe fix held back, and this file runs on torch_xla until both convert", todo=False))


def _holds(catalog: Catalog):
    """flows.held_assignments' `holds`: a value torch_xla's calls cannot take, unless the rule
    says it is plain or runs on torch_xla too, or a statement rule converted the call (the
    collectives: a tensor)."""
    def holds(qualname: str, called: bool) -> bool:
        rule = catalog.lookup(qualname)
        if rule is None or rule.plain_value or rule.also_on_torch_xla:
            return False
        return not (called and rule.transform in transforms.STATEMENT)
    return holds


def _changes(catalog: Catalog):
    """flows.passed_to_functions' `changes`: the code of the rule converting a reference to a
    value of another type (a DeviceMesh, a device), None for a plain value or one torch_xla's
    calls take too."""
    def changes(qualname: str) -> str | None:
        rule = catalog.lookup(qualname)
        if rule is None or rule.plain_value or rule.also_on_torch_xla:
            return None
        return rule.code
    return changes


def _left_elsewhere(catalog: Catalog):
    """Whether no rule converts a call of `qualname` in the module that makes it (another file
    of the project, whose rewrite this one does not see): no rule, or a manual one."""
    def left(qualname: str) -> bool:
        rule = catalog.lookup(catalog.canonical(qualname))
        return rule is None or rule.safety == "manual"
    return left


def _rewrite_module(module: cst.Module, tree: ast.Module, file: FileContext,
                    skeleton: skeletons.Skeleton | None) -> cst.Module:
    try:
        new_module = ModuleRewriter(file, file.plans, skeleton).rewrite_module(module, tree)
    except cst.ParserSyntaxError as exc:
        # The input parsed: what does not is code a rule generated. Not the user's syntax error.
        raise BrokenOutput(f"a rule generated code that does not parse: {exc.message}") from exc
    unused = imports.unused_xla_names(file)
    new_module = imports.remove_unused(new_module, file, unused, imports.orphaned_imports(file))
    new_module = imports.add_needed(
        new_module, file.import_plan.imports_to_add(), file.removed_imports, file.helper_code.values()
    )
    file.kept_xla_imports = [b for b in file.analysis.imports if is_xla_name(b.qualname) and b.key not in unused]
    return new_module
