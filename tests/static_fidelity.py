"""A static fidelity pass over whole files: three checks of one rewrite (input, output and the
tool's findings), independent of the rewriter's internals (plain `ast` and text).

1. `edited_workers`: the body of a function launched by `xmp.spawn`, `torch_xla.launch` or
   `torch.multiprocessing.spawn` is not edited for the launcher's sake. Its statements (leaf
   statements and compound headers, in source order, each compared as its own text with its
   continuation lines' indentation taken relative to its first line) split into torch_xla
   statements (a name bound by a torch_xla / optimum.tpu import, an "xla" string, an XLA_ /
   PJRT_ environment name) and the others. The others must appear in the output's body in the
   same order, byte for byte, and the output may hold statements they do not account for only
   where the input had a torch_xla statement between the same neighbours (its conversion).
2. `altered_manual_calls`: every call a manual finding points at (a finding not also fixed at
   that place) is in the output with its text unchanged, arguments included.
3. `unmarked_xla_uses`: every use of a name that a torch_xla / optimum.tpu import left in the
   output binds (resolved with Python's scoping) is on a statement marked `# TODO(tpu-migrate)`
   (or `tpu-migrate: ignore`), and no import the input used went unused (tests/fidelity.py's
   stale-import check): a binding left in the output is either marked where used or was unused
   in the input too (a side-effect import).

`static_problems(input, output, result)` returns {check: [problem, ...]}; tests/test_static_fidelity.py
runs it over every realistic, corpus, program and example file, and tools/fidelity_report.py
prints it per file.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _path in (str(HERE), str(ROOT)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from fidelity import _loads, _marked, _migrated, _Scopes, _unindented, bound_name  # noqa: E402

LAUNCHERS = frozenset({
    "torch_xla.distributed.xla_multiprocessing.spawn",
    "torch_xla.launch",
    "torch.multiprocessing.spawn",
})
_XLA_TEXT = re.compile(r"xla|pjrt", re.IGNORECASE)


def inputs() -> list[Path]:
    """Every whole file the pass reads: realistic, corpus, programs (all depths), examples."""
    fixtures = ROOT / "fixtures"
    paths: list[Path] = []
    for pattern in ("realistic/*.py", "corpus/*.py", "programs/**/*.py", "examples/*.py"):
        paths += sorted(fixtures.glob(pattern))
    return paths


# --------------------------------------------------------------------------------------------
# Shared: each text is parsed, walked and scoped once for all three checks.


@functools.lru_cache(maxsize=8)
def _parse(text: str) -> ast.Module:
    return ast.parse(text)


_NODES: dict[int, tuple[ast.Module, list[ast.AST]]] = {}


def _walk(tree: ast.Module) -> list[ast.AST]:
    """`list(ast.walk(tree))`, kept for the last few trees."""
    held = _NODES.get(id(tree))
    if held is None or held[0] is not tree:
        if len(_NODES) > 16:
            _NODES.clear()
        held = _NODES[id(tree)] = (tree, list(ast.walk(tree)))
    return held[1]


@functools.lru_cache(maxsize=8)
def _scopes(text: str) -> _Scopes:
    return _Scopes(_parse(text))


def _imports(tree: ast.Module) -> dict[str, str]:
    """Bound name -> qualified name, for every import of the file (any depth; good enough for
    finding launchers, which are imported once)."""
    bound: dict[str, str] = {}
    for node in _walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound[bound_name(alias, node)] = alias.name if alias.asname else alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                if alias.name != "*":
                    bound[bound_name(alias, node)] = f"{node.module}.{alias.name}"
    return bound


def _dotted(node: ast.AST) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def _qualname(node: ast.AST, bound: dict[str, str]) -> str | None:
    chain = _dotted(node)
    if chain is None or chain[0] not in bound:
        return None
    return ".".join([bound[chain[0]], *chain[1:]])


def segment(lines: list[str], node: ast.AST, end: tuple[int, int] | None = None) -> str:
    """The node's text, its continuation lines dedented by its first line's indentation (a
    statement moved into or out of a block compares equal to itself)."""
    first, col = node.lineno, node.col_offset
    last, end_col = end or (node.end_lineno, node.end_col_offset)
    if first == last:
        return lines[first - 1][col:end_col]
    indent = len(lines[first - 1]) - len(lines[first - 1].lstrip())
    parts = [lines[first - 1][col:]]
    for line in lines[first: last - 1]:
        parts.append(line[indent:] if line[:indent].isspace() else line.lstrip())
    tail = lines[last - 1][:end_col]
    parts.append(tail[indent:] if tail[:indent].isspace() else tail.lstrip())
    return "\n".join(parts)


def _lines(source: str) -> list[str]:
    return re.split(r"\r\n|\r|\n", source)  # the lines `ast` counts


# --------------------------------------------------------------------------------------------
# 1. launched functions


def launched_functions(source: str, tree: ast.Module | None = None) -> set[str]:
    """Names of the module's functions passed as the first argument (or `fn=`) of a launcher.
    A name assigned once from another name (`fn = _mp_fn`) is followed."""
    if "spawn" not in source and "launch" not in source:
        return set()
    tree = _parse(source) if tree is None else tree
    bound = _imports(tree)
    aliases: dict[str, list[str]] = {}
    for node in _walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and isinstance(node.value, ast.Name):
            aliases.setdefault(node.targets[0].id, []).append(node.value.id)
    names = set()
    for node in _walk(tree):
        if not isinstance(node, ast.Call) or _qualname(node.func, bound) not in LAUNCHERS:
            continue
        fn = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "fn"), None)
        if isinstance(fn, ast.Name):
            name = fn.id
            if len(aliases.get(name, [])) == 1:
                name = aliases[name][0]
            names.add(name)
    defined = [n.name for n in _walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return {n for n in names if defined.count(n) == 1}


def _function(tree: ast.Module, name: str):
    found = [n for n in _walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name]
    return found[0] if len(found) == 1 else None


def _header_text(text: str) -> str:
    """A compound statement's header: its text up to the first statement of its block, less the
    comment lines and blank lines before that statement (a TODO added above a converted first
    statement is not an edit of the header)."""
    kept = text.rstrip().split("\n")
    while len(kept) > 1 and (not kept[-1].strip() or kept[-1].lstrip().startswith("#")):
        kept.pop()
    return "\n".join(kept).rstrip()


def _items(function, lines: list[str]) -> list[tuple[str, ast.AST]]:
    """The body's leaf statements and compound headers, in source order: (text, node)."""
    items = []

    def visit(statements):
        for stmt in statements:
            blocks = [getattr(stmt, f) for f in ("body", "orelse", "finalbody") if isinstance(getattr(stmt, f, None), list)]
            handlers = getattr(stmt, "handlers", [])
            cases = getattr(stmt, "cases", [])
            if not blocks and not handlers and not cases:
                items.append((segment(lines, stmt), stmt))
                continue
            first_child = stmt.body[0] if isinstance(getattr(stmt, "body", None), list) and stmt.body else None
            if isinstance(stmt, ast.Match):
                first_child = cases[0].pattern if cases else None
            header_end = (first_child.lineno, first_child.col_offset) if first_child is not None else None
            header = _header_text(segment(lines, stmt, header_end)) if header_end else ""
            items.append((f"<{type(stmt).__name__}> {header}", stmt))
            if isinstance(stmt, ast.Match):
                for case in cases:
                    visit(case.body)
                continue
            visit(stmt.body)
            for handler in handlers:
                items.append((f"<except> {segment(lines, handler, (handler.body[0].lineno, handler.body[0].col_offset)).strip()}", handler))
                visit(handler.body)
            for name in ("orelse", "finalbody"):
                block = getattr(stmt, name, None)
                if isinstance(block, list) and block:
                    items.append((f"<{name}>", stmt))
                    visit(block)

    visit(function.body)
    return items


def _header_nodes(node: ast.AST) -> list[ast.AST]:
    """What a compound statement evaluates itself (not its blocks)."""
    if isinstance(node, (ast.If, ast.While)):
        return [node.test]
    if isinstance(node, (ast.For, ast.AsyncFor)):
        return [node.target, node.iter]
    if isinstance(node, (ast.With, ast.AsyncWith)):
        return list(node.items)
    if isinstance(node, ast.ExceptHandler):
        return [node.type] if node.type is not None else []
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [*getattr(node, "decorator_list", []), node.args] if not isinstance(node, ast.ClassDef) \
            else [*node.decorator_list, *node.bases, *node.keywords]
    if isinstance(node, ast.Match):
        return [node.subject]
    if isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
        return []
    return [node]


def _mentions_xla(node: ast.AST, item: str, xla_names: set[str]) -> bool:
    """A statement (or a compound statement's header) that torch_xla's rules may convert: it
    imports torch_xla, uses a torch_xla name or a value made by torch_xla (`_xla_values`), or
    holds a string naming XLA ("xla", "XLA_USE_BF16", "pjrt://")."""
    if item in ("<orelse>", "<finalbody>"):
        return False
    if isinstance(node, ast.Import) and any(_migrated(a.name) for a in node.names):
        return True
    if isinstance(node, ast.ImportFrom) and node.level == 0 and _migrated(node.module):
        return True
    for part in _header_nodes(node):
        for inner in ast.walk(part):
            if isinstance(inner, ast.Name) and inner.id in xla_names:
                return True
            if isinstance(inner, ast.Constant) and isinstance(inner.value, str) and _XLA_TEXT.search(inner.value):
                return True
    return False


_DEVICE_GETTERS = ("xla_device", "device")


def _xla_values(function, xla_names: set[str]) -> set[str]:
    """Names the function assigns from a torch_xla call other than a device getter
    (`train_loader = pl.MpDeviceLoader(loader, device)`): a loop over such a value is converted
    with it. (A device converts to `torch.device("tpu")` and changes no statement that uses it.)"""
    names = set()
    for node in ast.walk(function):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            calls = [c for c in ast.walk(node.value) if isinstance(c, ast.Call)]
            if not any((_dotted(c.func) or [""])[0] in xla_names and (_dotted(c.func) or [""])[-1] not in _DEVICE_GETTERS
                       for c in calls):
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def _align(before: list[str], after: list[str]) -> list[int] | None:
    """For each item of `before`, its index in `after` (increasing), or None if `before` is not
    a subsequence of `after`. Greedy from the left, which finds an embedding when one exists."""
    positions, j = [], 0
    for text in before:
        while j < len(after) and after[j] != text:
            j += 1
        if j == len(after):
            return None
        positions.append(j)
        j += 1
    return positions


def edited_workers(input_text: str, output_text: str) -> list[str]:
    """(1) Launched functions whose body the rewrite changed beyond converting its torch_xla
    statements."""
    workers = launched_functions(input_text)
    if not workers:
        return []
    before_tree, after_tree = _parse(input_text), _parse(output_text)
    before_lines, after_lines = _lines(input_text), _lines(output_text)
    xla_names = {name for name, qualname in _imports(before_tree).items() if _migrated(qualname)}
    problems = []
    for name in sorted(workers):
        old, new = _function(before_tree, name), _function(after_tree, name)
        if old is None:
            continue
        if new is None:
            problems.append(f"line {old.lineno}: the launched function {name} is gone from the output")
            continue
        old_items = _items(old, before_lines)
        xla_here = xla_names | _xla_values(old, xla_names)
        new_texts = [text for text, _ in _items(new, after_lines)]
        folded = _folded_branches(old_items, new_texts, xla_here)
        kept = [(i, text) for i, (text, node) in enumerate(old_items)
                if not _mentions_xla(node, text, xla_here) and id(node) not in folded]
        converted = {i for i in range(len(old_items))} - {i for i, _ in kept}
        positions = _align([text for _, text in kept], new_texts)
        if positions is None:
            missing = next(text for text in (t for _, t in kept) if text not in new_texts) if any(
                t not in new_texts for _, t in kept) else None
            what = f"`{missing.splitlines()[0]}` is changed or gone" if missing else "statements are reordered"
            problems.append(f"line {new.lineno}: {name}: {what} (it mentions no torch_xla)")
            continue
        # Output statements between two kept ones must stand where the input had a torch_xla one.
        bounds = [(-1, -1), *[(i, p) for (i, _), p in zip(kept, positions)], (len(old_items), len(new_texts))]
        for (i0, p0), (i1, p1) in zip(bounds, bounds[1:]):
            added = new_texts[p0 + 1 : p1]
            if added and not any(i0 < i < i1 for i in converted):
                problems.append(f"line {new.lineno}: {name}: added `{added[0].splitlines()[0]}`"
                                + (f" (and {len(added) - 1} more)" if len(added) > 1 else "")
                                + " where the input had no torch_xla statement")
    return problems


def _folded_branches(items, new_texts: list[str], xla_names: set[str]) -> set[int]:
    """The statements of an `if` whose test is torch_xla's and which the output no longer has:
    a conversion answered the test (the device kind) and kept only the branch that runs, so
    these may go or move out of the block."""
    folded = set()
    for text, node in items:
        if isinstance(node, ast.If) and _mentions_xla(node, text, xla_names) and text not in new_texts:
            folded.add(id(node))  # its `<orelse>` marker
            folded.update(id(inner) for branch in (node.body, node.orelse) for stmt in branch
                          for inner in ast.walk(stmt))
    return folded


# --------------------------------------------------------------------------------------------
# 2. manual calls


def _call_at(tree: ast.Module, line: int, col: int) -> ast.Call | None:
    """The call a finding at (line, col) (1-based col) points at: one starting there whose callee
    is a dotted name (of `xm.a(x).b(y)`, `xm.a(x)`)."""
    found = [n for n in _walk(tree) if isinstance(n, ast.Call) and n.lineno == line and n.col_offset + 1 == col
             and _dotted(n.func) is not None]
    return min(found, key=lambda n: (n.end_lineno, n.end_col_offset)) if found else None


def altered_manual_calls(input_text: str, output_text: str, result) -> list[str]:
    """(2) Calls left manual whose text is not in the output as it was."""
    if not result.manual:
        return []
    before_tree, after_tree = _parse(input_text), _parse(output_text)
    before_lines, after_lines = _lines(input_text), _lines(output_text)
    fixed = {(f.line, f.col) for f in result.fixes}
    wanted = Counter()
    where = {}
    for finding in result.manual:
        if (finding.line, finding.col) in fixed:
            continue  # converted (by this rule or another), with a TODO for what differs
        call = _call_at(before_tree, finding.line, finding.col)
        if call is None:
            continue
        text = _unindented(segment(before_lines, call))
        key = (finding.line, finding.col)
        if key in where:
            continue  # several findings at one call
        where[key] = text
        wanted[text] += 1
    have = Counter(_unindented(segment(after_lines, n)) for n in _walk(after_tree) if isinstance(n, ast.Call))
    problems = []
    for (line, _), text in sorted(where.items()):
        if have[text] > 0:
            have[text] -= 1
        else:
            problems.append(f"input line {line}: `{text.splitlines()[0]}` is not in the output as written")
    return problems


# --------------------------------------------------------------------------------------------
# 3. torch_xla bindings left in the output


def unmarked_xla_uses(input_text: str, output_text: str) -> list[str]:
    """(3) Uses of names bound by torch_xla imports left in the output, on unmarked statements
    (Python's scoping: a parameter or local that shadows the import is not a use), and imports
    that became unused (stale)."""
    if not _IMPORTS_XLA.search(output_text):
        return []  # no torch_xla import left: nothing bound, nothing stale
    tree = _parse(output_text)
    lines = _lines(output_text)
    scopes = _scopes(output_text)
    used = _used(tree, scopes)
    statements = [n for n in _walk(tree) if isinstance(n, ast.stmt)]
    migrated: set[tuple[int, str]] = set()
    for node in _walk(tree):
        if isinstance(node, ast.Import):
            names = [bound_name(a, node) for a in node.names if _migrated(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _migrated(node.module):
            names = [bound_name(a, node) for a in node.names if a.name != "*"]
        else:
            continue
        for name in names:
            migrated.add((id(scopes._binding_scope(scopes.scope_of(node), name)), name))
    problems = set()
    for node in _walk(tree):
        if not (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)):
            continue
        target = scopes.resolve(node.id, scopes.scope_of(node))
        if target is None or (id(target), node.id) not in migrated:
            continue
        if not _marked(lines, statements, node.lineno):
            problems.add(f"line {node.lineno}: {lines[node.lineno - 1].strip()}")
    found = sorted(problems, key=lambda p: int(p.split(":")[0].split()[1]))
    # Stale: an import the input used (same scope, module and name) that nothing uses now; or
    # one the input did not have, unused (tests/fidelity.py's check (a), on the trees at hand).
    before_tree = _parse(input_text)
    before_scopes = _scopes(input_text)
    used_before: dict[tuple, bool] = {}
    for key, _, is_used in _import_keys(before_tree, before_scopes, _used(before_tree, before_scopes)):
        used_before[key] = used_before.get(key, False) or is_used
    for key, lineno, is_used in _import_keys(tree, scopes, used):
        if is_used or (key in used_before and not used_before[key]):
            continue
        why = "no longer used; it was in the input" if key in used_before else "unused, and the input had no such import"
        found.append(f"stale import line {lineno}: {lines[lineno - 1].strip()}  ({key[2]!r} is {why} in {key[0]})")
    return found


_IMPORTS_XLA = re.compile(r"^[ \t]*(import|from)[ \t]+(torch_xla|optimum\.tpu)", re.MULTILINE)


def _used(tree: ast.Module, scopes: _Scopes) -> set[tuple[int, str]]:
    """(scope, name) of every binding some load resolves to."""
    used = set()
    for name, node in _loads(tree):
        target = scopes.resolve(name, scopes.scope_of(node))
        if target is not None:
            used.add((id(target), name))
    return used


def _import_keys(tree: ast.Module, scopes: _Scopes, used: set[tuple[int, str]]):
    """For every torch_xla / optimum.tpu import: ((scope's qualified name, imported, bound name),
    line, used)."""
    for node in _walk(tree):
        if isinstance(node, ast.Import):
            pairs = [(a, a.name) for a in node.names if _migrated(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _migrated(node.module):
            pairs = [(a, f"{node.module}.{a.name}") for a in node.names if a.name != "*"]
        else:
            continue
        for alias, imported in pairs:
            name = bound_name(alias, node)
            scope = scopes._binding_scope(scopes.scope_of(node), name)
            yield (scopes.qualname(scope), imported, name), node.lineno, (id(scope), name) in used


CHECKS = ("edited worker", "altered manual call", "unmarked torch_xla use")


def static_problems(input_text: str, output_text: str, result) -> dict[str, list[str]]:
    return {
        "edited worker": edited_workers(input_text, output_text),
        "altered manual call": altered_manual_calls(input_text, output_text, result),
        "unmarked torch_xla use": unmarked_xla_uses(input_text, output_text),
    }


@functools.lru_cache(maxsize=512)
def rewrite(data: bytes, name: str, target: str):
    """(output bytes, FileResult) of an in-process rewrite; kept for the session, so that the
    test modules that rewrite the same fixture files (tests/test_fidelity.py) share the work.
    The FileResult is shared: do not change it."""
    from tpu_migrate.rewrite.context import Options
    from tpu_migrate.rewrite.engine import rewrite_bytes

    result = rewrite_bytes(data, name, Options(target=target))
    if result.error is not None:
        raise RuntimeError(f"{name}: {result.error}")
    return (result.output if result.changed else data), result
