"""Rewrite one file's bytes, or many files through a process pool.

Per file: pre-filter the bytes; decode as Python does; parse with `ast` (fast, and the error
message users know); analyse names; stop here when nothing refers to torch_xla; parse with libcst;
rewrite the flagged statements; manage imports; print; re-parse the output. A file whose output
does not parse is kept byte-for-byte and reported as an error.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor

import libcst as cst

from tpu_migrate.findings import FileResult
from tpu_migrate.rewrite import imports
from tpu_migrate.rewrite.context import FileContext, ImportPlan, Options, StatementContext
from tpu_migrate.rewrite.files import DecodeError, decode, encode, prefilter
from tpu_migrate.rewrite.names import analyze, is_xla_name
from tpu_migrate.rewrite.plans import make_plans
from tpu_migrate.rewrite.suppress import parse_suppressions
from tpu_migrate.rewrite.transformer import ModuleRewriter, WalkError
from tpu_migrate.rules import Catalog, load_catalog


def rewrite_bytes(data: bytes, path: str, options: Options, catalog: Catalog | None = None) -> FileResult:
    """The result for one file; `output` holds the new bytes when `changed`."""
    result = FileResult(path)
    if not prefilter(data):
        return result
    try:
        source = decode(data)
    except DecodeError as exc:
        result.error = str(exc)
        return result
    # Classic-Mac files (CR only): libcst drops a final lone "\r", so rewrite with "\n" and
    # put the CRs back.
    cr_only = "\r" in source.text and "\n" not in source.text
    text = source.text.replace("\r", "\n") if cr_only else source.text
    try:
        new_text = rewrite_text(text, path, options, catalog or load_catalog(), result)
        if cr_only and new_text is not None:
            new_text = new_text.replace("\n", "\r")
    except SyntaxError as exc:
        if exc.lineno:
            result.error = f"syntax error at line {exc.lineno}: {exc.msg}"
        else:  # e.g. NUL bytes: the parser names no line
            result.error = f"cannot parse: {exc.msg}"
        return result
    except cst.ParserSyntaxError as exc:
        result.error = f"syntax error at line {exc.raw_line}: {exc.message}"
        return result
    except (ValueError, RecursionError, MemoryError) as exc:
        result.error = f"cannot parse: {type(exc).__name__}: {exc}".rstrip(": ")
        return result
    except WalkError as exc:
        result.error = f"internal error: {exc}"
        result.fixes.clear()
        result.manual.clear()
        return result
    if new_text is None or new_text == source.text:
        return result
    try:
        ast.parse(new_text)
    except SyntaxError as exc:
        result.error = f"internal error: the rewritten file does not parse (line {exc.lineno}: {exc.msg}); left unchanged"
        result.fixes.clear()
        result.manual.clear()
        return result
    result.changed = True
    result.original = data
    result.output = encode(new_text, source.encoding)
    return result


def rewrite_text(text: str, path: str, options: Options, catalog: Catalog, result: FileResult) -> str | None:
    tree = ast.parse(text, filename=path)
    analysis = analyze(tree, catalog.canonical, catalog.rule_names)
    has_xla_imports = any(is_xla_name(b.qualname) for b in analysis.imports)
    if not has_xla_imports and not any(i.interesting for i in analysis.infos.values()):
        return None
    module = cst.parse_module(text)
    new_module, file = _rewrite_module(module, tree, text, options, catalog, result, True, analysis)
    if file.guards_converted and file.kept_xla_imports:
        # Availability guards mean "a TPU is here" only once nothing in the file needs torch_xla
        # any more; while some use remains (a manual TODO), they keep testing for torch_xla.
        result.fixes.clear()
        result.manual.clear()
        fresh = analyze(tree, catalog.canonical, catalog.rule_names)  # plans marked the first
        new_module, file = _rewrite_module(module, tree, text, options, catalog, result, False, fresh)
    result.fixes.sort(key=lambda f: (f.line, f.col, f.code))
    result.manual.sort(key=lambda m: (m.line, m.col, m.code))
    return new_module.code


def _rewrite_module(module, tree, text, options, catalog, result, convert_guards, analysis):
    file = FileContext(
        catalog=catalog,
        options=options,
        analysis=None,
        plan=None,
        suppressions=parse_suppressions(text),
        source_lines=text.splitlines(),
        fixes=result.fixes,
        manual=result.manual,
        convert_guards=convert_guards,
    )
    file.analysis = analysis
    file.plan = ImportPlan(analysis)
    file.plans = make_plans(
        analysis, catalog.canonical, lambda code, info: StatementContext(file, info).fix_allowed(code)
    )
    new_module = ModuleRewriter(file, file.plans).rewrite_module(module, tree)
    unused = imports.unused_xla_names(file)
    new_module = imports.remove_unused(new_module, file, unused)
    new_module = imports.add_needed(new_module, file.plan.imports_to_add())
    file.kept_xla_imports = {b.name for b in analysis.imports if is_xla_name(b.qualname)} - unused
    return new_module, file


def rewrite_path(path: str, options: Options) -> FileResult:
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except IsADirectoryError:
        return FileResult(path, error="is a directory")
    except OSError as exc:
        return FileResult(path, error=f"cannot read: {exc.strerror or exc}")
    try:
        if path.endswith(".ipynb"):
            from tpu_migrate.rewrite.notebooks import rewrite_notebook

            return rewrite_notebook(data, path, options)
        return rewrite_bytes(data, path, options)
    except Exception as exc:  # noqa: BLE001 - one file's bug must not stop the run
        return FileResult(path, error=f"internal error: {type(exc).__name__}: {exc}")


def _worker(args: tuple[str, Options]) -> FileResult:
    return rewrite_path(*args)


def rewrite_paths(
    paths: Iterable[str], options: Options, jobs: int | None = None,
    on_result: Callable[[FileResult], None] | None = None,
) -> Iterator[FileResult]:
    """Results in input order. `jobs=1` runs in this process (no pool start-up cost)."""
    paths = list(paths)
    jobs = jobs or os.cpu_count() or 1
    if jobs == 1 or len(paths) < 2:
        for path in paths:
            yield rewrite_path(path, options)
        return
    chunk = max(1, min(64, len(paths) // (jobs * 4) or 1))
    with ProcessPoolExecutor(max_workers=min(jobs, len(paths))) as pool:
        yield from pool.map(_worker, [(p, options) for p in paths], chunksize=chunk)
