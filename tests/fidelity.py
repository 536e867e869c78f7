"""Static fidelity check of a rewrite: compare an input file with its rewritten output.

Independent of the tool's internals (plain `ast` and text, like `unmarked_references`), so a
bug in the rewriter's name resolution cannot hide from it. `fidelity_problems(input, output)`
runs four checks, each giving human-readable problems (`line N: ...`, N an output line):

a. no converted scope still imports torch_xla: a torch_xla / optimum.tpu import in the output,
   at any depth (module, class, function, try/if block), whose bound name is used nowhere in
   the scope where it is visible, while the same import (same scope, module and bound name)
   was used in the input. An import unused in the input too (a side-effect import such as
   `import torch_xla.distributed.xla_backend`) is fine. An unused one the input did not have
   at all is reported too (the tool added an import it does not need).
b. no argument of a manual call changed: every call in the output whose callee is a dotted
   name rooted at a torch_xla / optimum.tpu import (a call left for a human) appears in the
   input with byte-identical source text (compared as multisets).
c. no unmarked XLA device or backend string: a string constant "xla" or `xla:N`, or an
   f-string starting with "xla:", left in the output is on a statement with a
   `# TODO(tpu-migrate)` comment directly above it or a `tpu-migrate: ignore` comment.
   Exempt, because they are not devices or backends: docstrings and other bare string
   statements, and a subscript index (`rng_states["xla"]`, a dict key lookup).
d. `unmarked_references` (tests/test_realistic.py): every remaining torch_xla / optimum.tpu
   reference is marked.

Command line, for reviews: `python tests/fidelity.py [--target tpu|portable|both] [FILES...]`
rewrites each file in-process (default: every fixture set the tests use) and prints a
per-file table of problems (plus "soundness": the output parses, is a fixed point and has
no new pyflakes undefined name, as tests/test_fidelity.py asserts); `python tests/fidelity.py --compare INPUT OUTPUT` checks a pair
of files already written. Exit status 1 when any problem is found.
"""

from __future__ import annotations

import ast
import re
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _path in (str(HERE), str(ROOT)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from test_realistic import unmarked_references  # noqa: E402

MIGRATED = ("torch_xla", "torch_xla_py", "optimum.tpu")
XLA_DEVICE = re.compile(r"xla(:\d+)?")
SCOPES = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _migrated(module: str | None) -> bool:
    return any(module == m or (module or "").startswith(m + ".") for m in MIGRATED)


def _by_line(problems) -> list[str]:
    return sorted(problems, key=lambda p: int(p.split(":")[0].split()[1]))


# --------------------------------------------------------------------------------------------
# Scopes: which scope binds a name, and which scope a load of that name resolves to.


class _Scopes:
    """Python's scoping, enough for this check: module, class and function scopes (a
    comprehension counts as part of the scope around it), `global` / `nonlocal`, and a class
    body's names invisible to the functions inside it."""

    def __init__(self, tree: ast.Module):
        self.tree = tree
        self.parent: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.parent[child] = node
        self.bound: dict[ast.AST, set[str]] = {}
        self.declared_global: dict[ast.AST, set[str]] = {}
        self.declared_nonlocal: dict[ast.AST, set[str]] = {}
        for node in ast.walk(tree):
            if isinstance(node, SCOPES):
                self.bound.setdefault(node, set())
        for node in ast.walk(tree):
            if isinstance(node, ast.Global):
                self.declared_global.setdefault(self.scope_of(node), set()).update(node.names)
            elif isinstance(node, ast.Nonlocal):
                self.declared_nonlocal.setdefault(self.scope_of(node), set()).update(node.names)
        for node in ast.walk(tree):
            for scope, name in self._bindings(node):
                self.bound[self._binding_scope(scope, name)].add(name)

    def scope_of(self, node: ast.AST) -> ast.AST:
        """The scope a node is evaluated in. Decorators, defaults and annotations of a def, and
        a class's bases, belong to the scope around it."""
        child, parent = node, self.parent.get(node)
        while parent is not None:
            if isinstance(parent, SCOPES):
                if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    if child in parent.body:
                        return parent
                elif isinstance(parent, ast.Lambda):
                    if child is parent.body:
                        return parent
                else:
                    return parent
            child, parent = parent, self.parent.get(parent)
        return self.tree

    def _binding_scope(self, scope: ast.AST, name: str) -> ast.AST:
        if name in self.declared_global.get(scope, ()):
            return self.tree
        if name in self.declared_nonlocal.get(scope, ()):
            outer = self.scope_of(scope)
            while not isinstance(outer, ast.Module):
                if isinstance(outer, FUNCTIONS) and name in self.bound.get(outer, ()):
                    return outer
                outer = self.scope_of(outer)
        return scope

    def _bindings(self, node: ast.AST):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name != "*":
                    yield self.scope_of(node), bound_name(alias, node)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            yield self.scope_of(node), node.id
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield self.scope_of(node), node.name
        elif isinstance(node, ast.ExceptHandler) and node.name:
            yield self.scope_of(node), node.name
        elif isinstance(node, ast.arg):
            function = self.parent.get(self.parent.get(node))  # arg -> arguments -> def
            if isinstance(function, FUNCTIONS):
                yield function, node.arg
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            yield self.scope_of(node), node.name
        elif isinstance(node, ast.MatchMapping) and node.rest:
            yield self.scope_of(node), node.rest

    def resolve(self, name: str, scope: ast.AST) -> ast.AST | None:
        """The scope whose binding of `name` a load in `scope` sees (None: a builtin or an
        undefined name)."""
        first = True
        while True:
            if (first or not isinstance(scope, ast.ClassDef)) and name in self.bound.get(scope, ()):
                return scope
            if isinstance(scope, ast.Module):
                return None
            first = False
            scope = self.scope_of(scope)

    def qualname(self, scope: ast.AST) -> str:
        names = []
        while not isinstance(scope, ast.Module):
            names.append(getattr(scope, "name", "<lambda>"))
            scope = self.scope_of(scope)
        return ".".join(reversed(names)) or "<module>"


def bound_name(alias: ast.alias, node: ast.Import | ast.ImportFrom) -> str:
    if alias.asname:
        return alias.asname
    return alias.name.split(".")[0] if isinstance(node, ast.Import) else alias.name


def _loads(tree: ast.Module):
    """Every name read, with the node to resolve it from: plain loads, plus names inside string
    annotations (`-> "MpDeviceLoader"`), which use an import as much as a bare annotation."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            yield node.id, node
    annotations = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            annotations.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            annotations.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            annotations.append(node.annotation)
    for annotation in annotations:
        for inner in ast.walk(annotation):
            if isinstance(inner, ast.Constant) and isinstance(inner.value, str):
                try:
                    parsed = ast.parse(inner.value, mode="eval")
                except SyntaxError:
                    continue
                for name in ast.walk(parsed):
                    if isinstance(name, ast.Name):
                        yield name.id, annotation


def _import_uses(source: str):
    """For every torch_xla / optimum.tpu import: (key, lineno, text, used). The key (scope's
    qualified name, imported module or name, bound name) matches an import of the input with
    the same import of the output."""
    tree = ast.parse(source)
    scopes = _Scopes(tree)
    used: set[tuple[int, str]] = set()
    for name, node in _loads(tree):
        target = scopes.resolve(name, scopes.scope_of(node))
        if target is not None:
            used.add((id(target), name))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            pairs = [(a, a.name) for a in node.names if _migrated(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _migrated(node.module):
            pairs = [(a, f"{node.module}.{a.name}") for a in node.names if a.name != "*"]
        else:
            continue
        for alias, imported in pairs:
            name = bound_name(alias, node)
            scope = scopes._binding_scope(scopes.scope_of(node), name)
            key = (scopes.qualname(scope), imported, name)
            text = ast.get_source_segment(source, node) or imported
            yield key, node.lineno, text, (id(scope), name) in used


def stale_imports(input_text: str, output_text: str) -> list[str]:
    """(a) torch_xla / optimum.tpu imports left in the output although the scope that used
    them in the input no longer does."""
    used_before: dict[tuple, bool] = {}
    for key, _, _, used in _import_uses(input_text):
        used_before[key] = used_before.get(key, False) or used
    problems = []
    for key, lineno, text, used in _import_uses(output_text):
        if used:
            continue
        scope, _, name = key
        if key not in used_before:
            problems.append(f"line {lineno}: {text}  ({name!r} is unused in {scope}, and the input had no such import)")
        elif used_before[key]:
            problems.append(f"line {lineno}: {text}  ({name!r} is no longer used in {scope}; it was in the input)")
    return _by_line(problems)


# --------------------------------------------------------------------------------------------
# (b) manual calls


def _root(node: ast.expr) -> ast.Name | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node if isinstance(node, ast.Name) else None


def manual_calls(source: str) -> list[tuple[int, str]]:
    """Calls whose callee is a dotted name rooted at a name bound by a torch_xla / optimum.tpu
    import (as resolved from the call's scope): (line, source text)."""
    tree = ast.parse(source)
    scopes = _Scopes(tree)
    migrated: set[tuple[int, str]] = set()  # (scope, name) bound by such an import
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [bound_name(a, node) for a in node.names if _migrated(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _migrated(node.module):
            names = [bound_name(a, node) for a in node.names if a.name != "*"]
        else:
            continue
        for name in names:
            migrated.add((id(scopes._binding_scope(scopes.scope_of(node), name)), name))
    calls = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            root = _root(node.func)
            if root is None:
                continue
            target = scopes.resolve(root.id, scopes.scope_of(root))
            if target is not None and (id(target), root.id) in migrated:
                calls.append((node.lineno, ast.get_source_segment(source, node)))
    return sorted(calls)


def changed_manual_calls(input_text: str, output_text: str) -> list[str]:
    """(b) calls left for a human whose source text is not, byte for byte, a call of the
    input (so the tool changed an argument, or a call it did not finish converting). The
    indentation of its continuation lines does not count: a block whose `if` a conversion
    answered moves out one level."""
    before = Counter(_unindented(text) for _, text in manual_calls(input_text))
    problems = []
    for lineno, text in manual_calls(output_text):
        if before[_unindented(text)] > 0:
            before[_unindented(text)] -= 1
        else:
            problems.append(f"line {lineno}: {text}  (not in the input as written)")
    return problems


def _unindented(text: str) -> str:
    """A call's text without its continuation lines' indentation (a block whose `if` a
    conversion answered moves out one level; the call says the same)."""
    return "\n".join(line.strip() for line in text.splitlines())


# --------------------------------------------------------------------------------------------
# (c) device and backend strings


def _is_xla_string(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return XLA_DEVICE.fullmatch(node.value) is not None
    if isinstance(node, ast.JoinedStr) and node.values:
        first = node.values[0]
        return isinstance(first, ast.Constant) and isinstance(first.value, str) and first.value.startswith("xla:")
    return False


def _marked(lines: list[str], statements: list[ast.stmt], lineno: int) -> bool:
    """The convention of `unmarked_references`: the innermost statement on that line has a
    TODO(tpu-migrate) comment in the comment block directly above it (above its decorators),
    or a `tpu-migrate: ignore` comment on one of its lines. A decorated definition starts at
    its first decorator (a string in a decorator belongs to the definition)."""

    def first_line(s: ast.stmt) -> int:
        return min([s.lineno, *(d.lineno for d in getattr(s, "decorator_list", []))])

    owner = max(
        (s for s in statements if first_line(s) <= lineno <= (s.end_lineno or s.lineno)),
        key=first_line,
    )
    first = first_line(owner)
    above, index = [], first - 2
    while index >= 0 and lines[index].strip().startswith("#"):
        above.append(lines[index])
        index -= 1
    last = owner.end_lineno or owner.lineno
    body = getattr(owner, "body", None)
    if isinstance(body, list) and body and isinstance(body[0], ast.stmt):  # a compound statement: its header
        last = max(owner.lineno, first_line(body[0]) - 1)
    span = lines[first - 1 : last]
    return any("TODO(tpu-migrate)" in l for l in above) or any("tpu-migrate: ignore" in l for l in span)


def unmarked_device_strings(output_text: str) -> list[str]:
    """(c) "xla" / "xla:N" / f"xla:{...}" strings in the output without a TODO above their
    statement. Exempt: bare string statements (docstrings) and subscript indexes."""
    tree = ast.parse(output_text)
    lines = re.split(r"\r\n|\r|\n", output_text)  # the lines `ast` counts (not str.splitlines's)
    statements = [n for n in ast.walk(tree) if isinstance(n, ast.stmt)]
    exempt: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, (ast.Constant, ast.JoinedStr)):
            exempt.update(id(n) for n in ast.walk(node.value))
        elif isinstance(node, ast.Subscript):
            exempt.add(id(node.slice))
        elif isinstance(node, ast.JoinedStr):  # the pieces of an f-string are judged as a whole
            exempt.update(id(n) for n in node.values)
    problems = []
    for node in ast.walk(tree):
        if id(node) in exempt or not _is_xla_string(node):
            continue
        if not _marked(lines, statements, node.lineno):
            problems.append(f"line {node.lineno}: {lines[node.lineno - 1].strip()}")
    return _by_line(set(problems))


# Strings check (c) cannot tell from a device, read by a person and judged to name something
# else: (file name, the line's text). Each needs a reason.
REVIEWED_NOT_DEVICES = {
    # Lightning registers its XLA *strategy* under the name "xla" (`Trainer(strategy="xla")`).
    ("Lightning-AI__pytorch-lightning__src__lightning__fabric__strategies__xla.py",
     'strategy_registry.register("xla", cls, description=cls.__name__)'),
    ("Lightning-AI__pytorch-lightning__src__lightning__pytorch__strategies__xla.py",
     'strategy_name = "xla"'),
}


def without_reviewed(name: str, problems: list[str]) -> list[str]:
    """`problems` less the device-string findings on lines listed in REVIEWED_NOT_DEVICES."""
    reviewed = {text for file, text in REVIEWED_NOT_DEVICES if file == name}
    return [p for p in problems
            if not (p.startswith("unmarked device string: ") and p.split(": ", 2)[-1] in reviewed)]


# --------------------------------------------------------------------------------------------


CHECKS = {
    "stale import": lambda i, o: stale_imports(i, o),
    "changed manual call": lambda i, o: changed_manual_calls(i, o),
    "unmarked device string": lambda i, o: unmarked_device_strings(o),
    "unmarked reference": lambda i, o: unmarked_references(o),
}


def fidelity_by_check(input_text: str, output_text: str) -> dict[str, list[str]]:
    return {kind: check(input_text, output_text) for kind, check in CHECKS.items()}


def fidelity_problems(input_text: str, output_text: str) -> list[str]:
    """Every problem of the four checks, each prefixed with its kind."""
    return [f"{kind}: {p}" for kind, found in fidelity_by_check(input_text, output_text).items() for p in found]


# --------------------------------------------------------------------------------------------
# Command line


def default_inputs() -> list[Path]:
    fixtures = ROOT / "fixtures"
    paths = []
    for pattern in ("realistic/*.py", "programs/*.py", "programs/multiprocess/*.py", "corpus/*.py"):
        paths += sorted(fixtures.glob(pattern))
    return paths


def rewrite_text(data: bytes, name: str, target: str) -> bytes:
    from tpu_migrate.rewrite.context import Options
    from tpu_migrate.rewrite.engine import rewrite_bytes

    result = rewrite_bytes(data, name, Options(target=target))
    if result.error is not None:
        raise RuntimeError(f"{name}: {result.error}")
    return result.output if result.changed else data


def soundness_problems(original: bytes, output: bytes, name: str, target: str) -> list[str]:
    """What tests/test_fidelity.py also asserts: the output parses, a second run changes
    nothing, and pyflakes finds no undefined name the input did not have."""
    from pyflakes import messages
    from pyflakes.checker import Checker

    try:
        ast.parse(output)
    except SyntaxError as error:
        return [f"line {error.lineno}: the output does not parse: {error.msg}"]
    problems = []
    if rewrite_text(output, name, target) != output:
        problems.append("line 1: a second run changes the output")

    def undefined(source: bytes) -> dict[str, int]:
        found = Checker(ast.parse(source), filename=name).messages
        return {m.message_args[0]: m.lineno for m in found if isinstance(m, messages.UndefinedName)}

    before = undefined(original)
    for undefined_name, lineno in sorted(undefined(output).items(), key=lambda item: item[1]):
        if undefined_name not in before:
            problems.append(f"line {lineno}: new undefined name {undefined_name!r}")
    return problems


def _report(label: str, by_check: dict[str, list[str]]) -> int:
    count = sum(len(v) for v in by_check.values())
    print(f"{label}: {'ok' if not count else f'{count} problem(s)'}")
    for kind, found in by_check.items():
        for problem in found:
            print(f"    {kind:<24} {problem}")
    return count


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python tests/fidelity.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", choices=["tpu", "portable", "both"], default="both")
    parser.add_argument("--compare", nargs=2, metavar=("INPUT", "OUTPUT"), help="check a pair of files already written")
    parser.add_argument("files", nargs="*", type=Path)
    args = parser.parse_args(argv)
    if args.compare:
        before, after = (Path(p).read_text(encoding="utf-8") for p in args.compare)
        return 1 if _report(f"{args.compare[0]} -> {args.compare[1]}", fidelity_by_check(before, after)) else 0
    targets = ["tpu", "portable"] if args.target == "both" else [args.target]
    total, files = 0, args.files or default_inputs()
    rows = []
    for path in files:
        data = path.read_bytes()
        for target in targets:
            output = rewrite_text(data, path.name, target)
            found = fidelity_by_check(data.decode("utf-8"), output.decode("utf-8"))
            found["soundness"] = soundness_problems(data, output, path.name, target)
            total += _report(f"{path} [{target}]", found)
            rows.append((path.name, target, {k: len(v) for k, v in found.items()}))
    print()
    kinds = [*CHECKS, "soundness"]
    width = max([len(r[0]) for r in rows] + [4])
    print(f"{'file':<{width}}  {'target':<8}  " + "  ".join(f"{k:>{len(k)}}" for k in kinds))
    for name, target, counts in rows:
        print(f"{name:<{width}}  {target:<8}  " + "  ".join(f"{counts[k]:>{len(k)}}" for k in kinds))
    print(f"\n{len(files)} file(s), {len(targets)} target(s), {total} problem(s)")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
