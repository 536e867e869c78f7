"""Import management, done once per file after every rule has run.

- torch_xla / optimum.tpu imports whose names are no longer used anywhere are removed (at any
  depth: imports inside functions and `try:` blocks included); the ones still used are kept.
- Other imports go only where the rewrite dropped their every use (numpy, used only for the
  device ids of an SPMD mesh the conversion no longer takes; `import copy`, used only in the
  branch a constant test folded away): the tool leaves no import it made unused, and touches
  no other.
- Modules the new code needs (`os`, `torch`, `torch.distributed`) are added once, after the
  file's leading import block, under the names ImportPlan chose (the file's own aliases first).

Whether a name is still used is counted without another traversal or print: the analysis
counted every load in the input, and every fix says which reference it removed.
The count errs on the side of keeping an import, never on removing a used one.
"""

from __future__ import annotations

import ast
import sys

import libcst as cst

from tpu_migrate.findings import Fix
from tpu_migrate.rewrite.context import FileContext, parse_stmt
from tpu_migrate.rewrite.inert import is_inert
from tpu_migrate.rewrite.layout import merge_leading_lines
from tpu_migrate.rewrite.names import XLA_OPS, finding_position, is_xla_name
from tpu_migrate.rewrite.rebuilt import with_body, with_changes
from tpu_migrate.rewrite.registry import emits

SIDE_EFFECT_BACKEND = "torch_xla.distributed.xla_backend"


@emits("TPU070")
def removable(qualname: str, file: FileContext) -> bool:
    """Imports the tool may delete once unused: torch_xla / optimum.tpu, and the availability
    checks (`is_torch_xla_available`) that TPU190 replaced. Not the import that registers the
    "xla" process-group backend while TPU070 waits (`--fix-level safe`): the group needs it."""
    if qualname == SIDE_EFFECT_BACKEND:
        return not file.waits("TPU070")
    if is_xla_name(qualname):
        return True
    rule = file.catalog.by_qualname.get(qualname)
    return rule is not None and rule.transform == "availability_guard"


def unused_xla_names(file: FileContext) -> set[tuple[tuple[str, ...], str, str]]:
    """Import bindings (ImportBinding.key: path of the scope, name, target) of torch_xla /
    optimum.tpu that no code uses any more: a function's own import goes when that function's
    uses do, and an import whose name the program rebinds before every use goes too.

    Uses = the references the analysis resolved through each name, minus those fixes removed. Rules never add torch_xla names, and code they keep (arguments, manual TODOs)
    keeps its references, so this is exact except that it errs towards keeping an import.
    """
    analysis = file.analysis
    keys = {b.key for b in analysis.imports if removable(b.qualname, file)}
    if any(qualname.startswith(XLA_OPS + ".") for qualname in analysis.qualnames):
        # torch.ops.xla's operators exist once torch_xla is imported, and no rule converts them:
        # the module's own torch_xla imports stay with their TODOs.
        top_level = {id(stmt) for stmt in analysis.tree.body}
        keys -= {b.key for b in analysis.imports if is_xla_name(b.qualname) and id(b.stmt) in top_level}
    return {k for k in keys if analysis.import_uses[k] - file.removed_roots[k] <= 0}


def orphaned_imports(file: FileContext) -> set[tuple[tuple[str, ...], str, str]]:
    """Module-level imports of other modules whose every use was in code a fix dropped
    (StatementContext.dropped_code): numpy imported for an SPMD mesh's device ids. Never an import
    the input did not use (a side effect, a re-export), one inside a function or a block (it may
    stand for another, as `try: import a except ImportError: import b as a`), one of torch's
    (the new code is written against them), one whose name the new code uses (ImportPlan's
    aliases), nor any in a file that lists its exports in `__all__` (string uses the analysis
    does not count)."""
    analysis = file.analysis
    if "__all__" in analysis.bound_names:
        return set()
    top_level = {id(stmt) for stmt in analysis.tree.body}
    in_use = {file.import_plan.names[placeholder].split(".")[0] for placeholder in file.import_plan.used()}
    removed = file.removed_roots
    return {b.key for b in analysis.imports
            if removed[b.key] > 0 and analysis.import_uses[b.key] - removed[b.key] <= 0
            and id(b.stmt) in top_level and b.name not in in_use
            and b.qualname.partition(".")[0] != "torch" and not removable(b.qualname, file)}


@emits("TPU070")  # `import torch_xla.distributed.xla_backend` goes with the process group
def remove_unused(module: cst.Module, file: FileContext, unused: set[str],
                  orphaned: set[tuple[tuple[str, ...], str, str]] = frozenset()) -> cst.Module:
    if not unused and not orphaned:
        return module
    backend_lines = [
        finding_position(b.stmt)
        for b in file.analysis.imports
        if isinstance(b.stmt, ast.Import) and any(a.name == SIDE_EFFECT_BACKEND for a in b.stmt.names)
    ]
    remover = _ImportRemover(unused, lambda: _availability_check(file), lambda q: removable(q, file), orphaned)
    new_body, carry = remover.block(module.body, top=True)
    for where in backend_lines[: remover.backend_removed]:
        file.fixes.append(Fix("TPU070", *where))
    file.removed_imports = remover.first_removed
    footer = [*carry, *module.footer] if carry else module.footer
    return module.with_changes(body=new_body, footer=footer)


def add_needed(
    module: cst.Module, lines: list[str], hint: RemovedImports | None = None, helpers=()
) -> cst.Module:
    """Add the imports the new code needs where a reviewer would: `import os` with the file's
    standard-library imports, `import torch` & co. with its torch imports, else where the
    torch_xla import they replace was (`hint`); else after the leading import block. Then the
    helper functions (`helpers`: their code), after the imports."""
    module = _add_imports(module, lines, hint) if lines else module
    # After the imports: `hint` indexes the body as it was before anything was inserted.
    return _add_helpers(module, list(helpers)) if helpers else module


def _add_imports(module: cst.Module, lines: list[str], hint: RemovedImports | None) -> cst.Module:
    body = list(module.body)
    start, end = _leading_imports_start(body), _leading_imports_end(body)
    hint_index = hint.index if hint is not None and start <= hint.index <= end else None
    for line in lines:
        new = parse_stmt(line + "\n")
        family = _family(new)
        anchors = [i for i in range(start, end) if _is_import_line(body[i]) and _family(body[i]) == family]
        if not anchors and family == "transformers":
            anchors = [i for i in range(start, end) if _is_import_line(body[i]) and _family(body[i]) == "torch"]
        if anchors:
            index = _sorted_position(body, anchors[-1], new, start)
            if index < anchors[-1] + 1 and index == _group_start(body, anchors[-1], start):
                # First of its group: it takes the group's leading lines.
                new = new.with_changes(leading_lines=body[index].leading_lines)
                body[index] = body[index].with_changes(leading_lines=[])
        elif family != "stdlib" and hint_index is not None:
            index = hint_index
            new = new.with_changes(leading_lines=hint.take())
            if index < len(body) and hint.next_leading_lines is not None:
                body[index] = body[index].with_changes(leading_lines=hint.next_leading_lines)
            if index > start and _family(body[index - 1]) == "stdlib" and not _has_blank(new):
                new = new.with_changes(leading_lines=[cst.EmptyLine(), *new.leading_lines])
        elif family == "stdlib" and start < end and _is_import_line(body[start]):
            # No standard-library group yet: one of its own at the top of the block.
            index = start
            if hint_index == start and hint.next_leading_lines is not None:
                # What is there got the leading lines of the removed import above it: those go
                # above the new group, and it keeps its own (a comment about it), after a blank.
                new = new.with_changes(leading_lines=hint.take())
                own = hint.next_leading_lines
                blank = own[:1] and own[0].comment is None
                body[start] = body[start].with_changes(leading_lines=own if blank else [cst.EmptyLine(), *own])
            else:
                new = new.with_changes(leading_lines=body[start].leading_lines)
                body[start] = body[start].with_changes(leading_lines=[cst.EmptyLine()])
        else:
            index = end
        body.insert(index, new)
        end += 1
        if hint_index is not None and index <= hint_index:
            hint_index += 1
    return module.with_changes(body=body)


def _add_helpers(module: cst.Module, helpers: list[str]) -> cst.Module:
    """Helper functions, and classes with no bases (`class _RateTracker:`), after the leading
    imports: they read nothing until called, and a notebook's later cells, or a script's
    functions called before its last import, may use them. Helper classes whose bases are read
    when the class is defined (`class _X(torch.nn.Module)`) after the file's last module-level
    import (a script may import torch after parsing its flags), unless module-level code uses
    them before it."""
    parsed = [parse_stmt(code) for code in helpers]
    functions = [stmt for stmt in parsed if not _reads_names_when_defined(stmt)]
    classes = [stmt for stmt in parsed if _reads_names_when_defined(stmt)]
    body = list(module.body)
    first = _leading_imports_end(body)
    late = _late_position(body, first, {stmt.name.value for stmt in classes}) if classes else first
    if late == first:
        return _insert_helpers(module, first, parsed)
    module = _insert_helpers(module, late, classes)
    return _insert_helpers(module, first, functions) if functions else module


def _reads_names_when_defined(stmt: cst.BaseStatement) -> bool:
    return isinstance(stmt, cst.ClassDef) and bool(stmt.bases or stmt.keywords or stmt.decorators)


def _late_position(body: list[cst.BaseStatement], first: int, names: set[str]) -> int:
    """After the last module-level import line, or before the first module-level statement
    (other than a function definition, whose body runs later) that names one of `names`."""
    late = first
    for index in range(first, len(body)):
        stmt = body[index]
        if _is_import_line(stmt):
            late = index + 1
        elif not isinstance(stmt, cst.FunctionDef) and any(
                name.value in names for name in _names_in(stmt)):
            break
    return late


class _Names(cst.CSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[cst.Name] = []

    def visit_Name(self, node: cst.Name) -> None:
        self.found.append(node)


def _names_in(node: cst.CSTNode) -> list[cst.Name]:
    names = _Names()
    node.visit(names)
    return names.found


def _insert_helpers(module: cst.Module, index: int, helpers: list[cst.BaseStatement]) -> cst.Module:
    body = list(module.body)
    blank = [cst.EmptyLine(), cst.EmptyLine()]
    new = [stmt.with_changes(leading_lines=blank) for stmt in helpers]
    if index < len(body):
        following = body[index]
        lines = list(following.leading_lines)
        blanks = 0
        while blanks < len(lines) and lines[blanks].comment is None:
            blanks += 1
        if blanks < 2:  # two blank lines after a function
            body[index] = following.with_changes(leading_lines=[*[cst.EmptyLine()] * (2 - blanks), *lines])
    if index == 0:
        new[0] = new[0].with_changes(leading_lines=[])
    return module.with_changes(body=[*body[:index], *new, *body[index:]])


class RemovedImports:
    """Where the first module-level import line that import removal deleted was: `index` in
    the new body, its leading lines, and the original leading lines of the statement after it
    (which received them)."""

    def __init__(self, index: int, leading_lines):
        self.index = index
        self.leading_lines = list(leading_lines)
        self.next_leading_lines = None

    def take(self) -> list:
        """The removed lines' leading lines, for the first import put in their place."""
        lines, self.leading_lines = self.leading_lines, []
        return lines


_STDLIB = frozenset(getattr(sys, "stdlib_module_names", ())) | {"__future__"}


def _family(stmt: cst.BaseStatement) -> str | None:
    """"stdlib", "torch", "transformers" or "other" for an import line (its first name)."""
    if not _is_import_line(stmt):
        return None
    top = _module_of(stmt).partition(".")[0]
    if top in ("torch", "transformers"):
        return top
    if top == "torch_xla":  # a torch_xla import that stays: torch's group
        return "torch"
    return "stdlib" if top in _STDLIB else "other"


def _module_of(stmt: cst.SimpleStatementLine) -> str:
    small = stmt.body[0]
    if isinstance(small, cst.Import):
        return cst.helpers.get_full_name_for_node(small.names[0].name) or ""
    if small.relative or small.module is None:
        return "."
    return cst.helpers.get_full_name_for_node(small.module) or ""


def _sort_key(stmt: cst.SimpleStatementLine) -> tuple[int, str]:
    """isort's default order within a group: `import x` lines, then `from x import y`."""
    return (0 if isinstance(stmt.body[0], cst.Import) else 1, _module_of(stmt).lower())


def _has_blank(stmt: cst.BaseStatement) -> bool:
    return any(line.comment is None for line in stmt.leading_lines)


def _group_start(body, index: int, start: int) -> int:
    """The first line of the import group (lines not separated by blank or comment lines)."""
    while index > start and not body[index].leading_lines and _is_import_line(body[index - 1]):
        index -= 1
    return index


def _sorted_position(body, anchor: int, new, start: int) -> int:
    """Where `new` goes in the anchor's group: its sorted place when the group is sorted
    (isort's order), else right after the anchor."""
    first, last = _group_start(body, anchor, start), anchor
    while last + 1 < len(body) and _is_import_line(body[last + 1]) and not body[last + 1].leading_lines:
        last += 1
    keys = [_sort_key(body[i]) for i in range(first, last + 1)]
    if keys != sorted(keys):
        return anchor + 1
    key = _sort_key(new)
    for i in range(first, last + 1):
        if keys[i - first] > key:
            return i
    return last + 1


def _leading_imports_start(body: list[cst.BaseStatement]) -> int:
    index = 1 if body and _is_docstring(body[0]) else 0
    while index < len(body) and _is_future(body[index]):
        index += 1
    while index < len(body) and _is_notebook_magic(body[index]):
        index += 1
    return index


def _is_import_line(stmt: cst.BaseStatement) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and all(
        isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body
    )


def _is_docstring(stmt: cst.BaseStatement) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Expr)
        and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


def _is_future(stmt: cst.BaseStatement) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and any(
        isinstance(s, cst.ImportFrom) and cst.helpers.get_full_name_for_node(s.module) == "__future__"
        for s in stmt.body
        if isinstance(s, cst.ImportFrom) and s.module is not None
    )


def _leading_imports_end(body: list[cst.BaseStatement]) -> int:
    index = 0
    if body and _is_docstring(body[0]):
        index = 1
    while index < len(body) and _is_future(body[index]):
        index += 1
    while index < len(body) and _is_notebook_magic(body[index]):
        index += 1  # a notebook's `!pip install` cell before its imports: what is added goes below
    if index == len(body) or not _is_import_line(body[index]):
        return index
    while index < len(body) and (_is_import_line(body[index]) or _is_notebook_magic(body[index])):
        index += 1
    return index


def _is_notebook_magic(stmt: cst.BaseStatement) -> bool:
    """The placeholder notebooks.py puts where a line magic or shell line was."""
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Pass)
        and stmt.trailing_whitespace.comment is not None
        and stmt.trailing_whitespace.comment.value.startswith("# tpu-migrate-magic")
    )


def _availability_check(file: FileContext) -> cst.BaseStatement:
    """What replaces a guarded torch_xla import whose `try:` sets flags (TPU190)."""
    plan = file.import_plan
    if file.options.target == "tpu":
        test = plan.fill(
            '{torch}.accelerator.is_available() and {torch}.accelerator.current_accelerator().type == "tpu"'
        )
    else:
        test = plan.fill("{torch}.accelerator.is_available()")
    return parse_stmt(f'if not ({test}):\n    raise ImportError("no TPU device (TorchTPU)")\n')


_IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


def _catches_import_error(stmt) -> bool:
    for handler in stmt.handlers:
        if handler.type is None:
            return True
        types = handler.type.elements if isinstance(handler.type, cst.Tuple) else [cst.Element(handler.type)]
        for element in types:
            if cst.helpers.get_full_name_for_node(element.value) in _IMPORT_ERRORS:
                return True
    return False


class _ImportRemover:
    """Drops the import aliases bound to unused names, at every depth."""

    def __init__(self, unused: set[tuple[tuple[str, ...], str, str]], availability_check, removable,
                 orphaned: set[tuple[tuple[str, ...], str, str]] = frozenset()):
        self.unused = unused
        self.orphaned = orphaned  # not torch_xla's: no availability check takes their place
        self.path: tuple[str, ...] = ()  # the enclosing classes and functions (Scope.path)
        self.removable = removable
        self.backend_removed = 0
        self.availability_check = availability_check
        self.removed_any = False
        self.removed_names: set[str] = set()  # what the removed imports bound, in the current `try:`
        self.first_removed: RemovedImports | None = None  # module level, for add_needed

    def block(self, stmts, top: bool = False):
        out, carry = [], []
        hint = None
        for stmt in stmts:
            new = self.statement(stmt)
            if new is None:
                # Comment lines above a removed import stay; its same-line comment (`# noqa`,
                # `# registers the backend`) was about the import and goes with it.
                if top and self.first_removed is None:
                    hint = self.first_removed = RemovedImports(len(out), stmt.leading_lines)
                elif hint is not None:
                    hint.leading_lines.extend(stmt.leading_lines)
                carry.extend(stmt.leading_lines)
                continue
            if hint is not None:
                hint.next_leading_lines = list(new.leading_lines)
                hint = None
            if carry:
                new = new.with_changes(leading_lines=merge_leading_lines(carry, new.leading_lines))
                carry = []
            out.append(new)
        return out, carry

    def suite(self, suite):
        if isinstance(suite, cst.SimpleStatementSuite):
            body = [s for s in (self.small(s) for s in suite.body) if s is not None]
            return with_changes(suite, body=body or [cst.Pass()])
        body, carry = self.block(suite.body)
        if not body:
            body = [cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=carry)]
            carry = []
        return with_changes(suite, body=body, footer=[*carry, *suite.footer])

    def statement(self, stmt):
        if isinstance(stmt, cst.SimpleStatementLine):
            if not any(isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body):
                return stmt
            body = [s for s in (self.small(s) for s in stmt.body) if s is not None]
            if not body:
                return None
            last = body[-1]
            if last.semicolon is not cst.MaybeSentinel.DEFAULT:
                last = last.with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
            return with_changes(stmt, body=[*body[:-1], last])
        if isinstance(stmt, cst.If) and _is_type_checking(stmt.test):
            # Never imported at run time; its names serve string annotations, which the
            # analysis does not count as uses.
            return stmt
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            outer, self.path = self.path, (*self.path, stmt.name.value)
            try:
                return with_body(stmt, self.suite(stmt.body))
            finally:
                self.path = outer
        if isinstance(stmt, cst.If):
            return self.version_branches(stmt)
        changes = {}
        is_try = isinstance(stmt, (cst.Try, cst.TryStar))
        for field in ("body", "orelse", "finalbody"):
            if is_try and field == "body":
                continue  # guarded_body below
            child = getattr(stmt, field, None)
            if isinstance(child, cst.BaseSuite):
                changes[field] = self.suite(child)
            elif isinstance(child, (cst.Else, cst.Finally)):
                changes[field] = with_body(child, self.suite(child.body))
            elif isinstance(child, cst.If):
                changes[field] = self.statement(child)
        if isinstance(stmt, (cst.Try, cst.TryStar)):
            changes["handlers"] = [with_body(h, self.suite(h.body)) for h in stmt.handlers]
            changes["body"], nothing_left = self.guarded_body(stmt)
            if nothing_left and stmt.finalbody is None:
                return None  # a guarded import of torch_xla and nothing else: it goes whole
        if isinstance(stmt, cst.Match):
            changes["cases"] = [with_body(c, self.suite(c.body)) for c in stmt.cases]
        return with_changes(stmt, **changes)

    def version_branches(self, stmt: cst.If):
        """`if _XLA_GREATER_EQUAL_2_1: from torch_xla... import f / else: from torch_xla... import
        f`: once every branch's imports went, an `if` whose test only reads values goes whole
        (not `if ...: pass / else: pass`)."""
        before, self.removed_any = self.removed_any, False
        changes = {"body": self.suite(stmt.body)}
        if isinstance(stmt.orelse, cst.Else):
            changes["orelse"] = with_body(stmt.orelse, self.suite(stmt.orelse.body))
        elif isinstance(stmt.orelse, cst.If):
            changes["orelse"] = self.statement(stmt.orelse)  # None: the `elif` went whole
        removed, self.removed_any = self.removed_any, before or self.removed_any
        orelse = changes.get("orelse")
        if removed and is_inert(stmt.test) and _does_nothing(changes["body"]) and (
                orelse is None or (isinstance(orelse, cst.Else) and _does_nothing(orelse.body))):
            return None
        if stmt.orelse is not None and orelse is None:  # a dead `elif` chain: the `if` keeps its body
            changes["orelse"] = None
        return with_changes(stmt, **changes)

    def guarded_body(self, stmt):
        """A `try:` whose torch_xla import goes: if the try also sets flags (or has an else),
        the import becomes a TPU check that raises ImportError, so the flags keep meaning
        "the accelerator is here" (TPU190). (The new body, whether the `try` has nothing left
        to do: its imports went and its handlers only pass or rebind their names.)"""
        before, names_before = self.removed_any, self.removed_names
        self.removed_any, self.removed_names = False, set()
        body = self.suite(stmt.body)
        removed, self.removed_any = self.removed_any, before or self.removed_any
        names, self.removed_names = self.removed_names, names_before | self.removed_names
        if not removed or not _catches_import_error(stmt) or isinstance(body, cst.SimpleStatementSuite):
            return body, False
        rest = [s for s in body.body if not _is_pass(s)]
        if not rest and stmt.orelse is None and all(_does_nothing(h.body, names) for h in stmt.handlers):
            return body, True  # `try: import torch_xla / except ImportError: xm = None`
        # Otherwise a handler answers "no torch_xla" (`return 1`, a message, a flag): it keeps
        # meaning "no TPU" where the import stood.
        check = self.availability_check()
        return body.with_changes(body=[check, *rest]), False

    def small(self, small):
        if isinstance(small, cst.Import):
            keep = []
            for alias in small.names:
                dotted = cst.helpers.get_full_name_for_node(alias.name) or ""
                bound = alias.asname.name.value if alias.asname else dotted.partition(".")[0]
                target = dotted if alias.asname else bound
                if self.removable(dotted) and (self.path, bound, target) in self.unused:
                    if dotted == SIDE_EFFECT_BACKEND:
                        self.backend_removed += 1
                    self.removed_any = True
                    self.removed_names.add(bound)
                    continue
                if (self.path, bound, target) in self.orphaned:
                    continue
                keep.append(alias)
            return _with_aliases(small, keep)
        if isinstance(small, cst.ImportFrom) and small.module is not None and not small.relative:
            module = cst.helpers.get_full_name_for_node(small.module) or ""
            if isinstance(small.names, cst.ImportStar):
                return small
            keep = []
            for alias in small.names:
                name = cst.helpers.get_full_name_for_node(alias.name) or ""
                bound = alias.asname.name.value if alias.asname else name
                target = f"{module}.{name}"
                if self.removable(target) and (self.path, bound, target) in self.unused:
                    self.removed_any = True
                    self.removed_names.add(bound)
                    continue
                if (self.path, bound, target) in self.orphaned:
                    continue
                keep.append(alias)
            return _with_aliases(small, keep)
        return small


def _with_aliases(small, keep):
    if not keep:
        return None
    if len(keep) == len(small.names):
        return small
    last = keep[-1]
    if isinstance(small, cst.Import) or small.lpar is None:
        last = last.with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return small.with_changes(names=[*keep[:-1], last])


def _is_type_checking(test: cst.BaseExpression) -> bool:
    return cst.helpers.get_full_name_for_node(test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")


def _does_nothing(suite, fallbacks: set[str] = frozenset()) -> bool:
    """A block of `pass` (or `...`, or a `raise` / `assert` about the failed import) only, or of
    fallbacks for a removed import: `xm = None`, `import my_runtime as xm` where the removed
    import bound `xm`, which nothing uses now."""
    if isinstance(suite, cst.SimpleStatementSuite):
        smalls = list(suite.body)
    else:
        if not all(isinstance(s, cst.SimpleStatementLine) for s in suite.body):
            return False
        smalls = [small for line in suite.body for small in line.body]
    return all(_inert_small(small, fallbacks) for small in smalls)


def _inert_small(small, fallbacks: set[str]) -> bool:
    if isinstance(small, cst.Pass) or (isinstance(small, cst.Expr) and isinstance(small.value, cst.Ellipsis)):
        return True
    if isinstance(small, (cst.Raise, cst.Assert)):
        # Failing loudly where the import failed (`raise ModuleNotFoundError("install torch_xla")`,
        # `assert False, "missing syncfree"`) guards the import itself: nothing left to guard.
        return True
    if isinstance(small, cst.Assign):
        return all(isinstance(t.target, cst.Name) and t.target.value in fallbacks for t in small.targets) and \
            isinstance(small.value, (cst.Name, cst.SimpleString, cst.Integer))  # `xm = None`
    if isinstance(small, (cst.Import, cst.ImportFrom)) and not isinstance(small.names, cst.ImportStar):
        return all(_bound_name(alias) in fallbacks for alias in small.names)
    return False


def _bound_name(alias: cst.ImportAlias) -> str:
    if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
        return alias.asname.name.value
    return (cst.helpers.get_full_name_for_node(alias.name) or "").partition(".")[0]


def _is_pass(stmt) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and all(isinstance(s, cst.Pass) for s in stmt.body)
