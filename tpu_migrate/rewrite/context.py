"""State shared while one file is rewritten: options, findings, import plan, per-statement data."""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import lru_cache

import libcst as cst

from tpu_migrate.findings import Fix, Manual
from tpu_migrate.rewrite import cst_parse, named_expressions
from tpu_migrate.rewrite.files import DEFAULT_MAX_FILE_SIZE
from tpu_migrate.rewrite.layout import TODO_PREFIX
from tpu_migrate.rewrite.names import Analysis, ImportBinding, Ref, Scope, StmtInfo, finding_position, statement_ancestors
from tpu_migrate.rewrite.plans import Plans
from tpu_migrate.rules import Catalog, Rule

ALL_CODES = "*"
# Placeholders of rule templates for standard-library modules (in the order they are imported).
_STDLIB_MODULES = named_expressions.STDLIB_MODULES
TORCH_SUBMODULES = named_expressions.TORCH_SUBMODULES


@dataclass(frozen=True)
class Options:
    target: str = "tpu"
    select: frozenset[str] | None = None  # None: every rule
    ignore: frozenset[str] = frozenset()
    fix_level: str = "unsafe"  # "safe": apply only safe fixes
    # Files that pass the byte pre-filter and are larger than this are reported, not parsed
    # (None or 0: no limit). `--max-file-size`.
    max_file_size: int | None = DEFAULT_MAX_FILE_SIZE
    # (a module's real path, why it runs SPMD though it does not name it): spmd_programs.py.
    spmd_modules: tuple[tuple[str, str], ...] = ()
    # (a file's real path, the functions it imports from the project whose parameters reach
    # torch_xla): parameter_flows.project_parameters.
    xla_parameters: tuple = ()
    # (a module's real path, why the launch that runs it from another module stays torch_xla's;
    # "": a converted launch runs it): kept_launches.kept_launch_modules.
    kept_launches: tuple[tuple[str, str], ...] = ()

    def enabled(self, code: str) -> bool:
        if code in self.ignore:
            return False
        return self.select is None or code in self.select


class ImportPlan:
    """Which names the new code uses for `torch`, `torch.distributed` and `os`.

    Decided before any rewriting from the file's own module-level imports, so templates can be
    filled in as they are applied; what was used but not imported is added once at the end.
    `notebook`: the joined code cells (notebooks.py), where the new code may run in a cell
    before the one that imports what it uses (`import os` in the last cell). There an import
    counts only if it comes before the first module-level statement that runs code; any other
    is added again at the top.
    """

    def __init__(self, analysis: Analysis, notebook: bool = False):
        self._used: set[str] = set()
        bound = analysis.bound_names
        deadline = _first_code_line(analysis.tree) if notebook else None
        bindings = analysis.module_scope.bindings

        def in_time(name: str | None) -> bool:
            return name is not None and (deadline is None or any(
                b.is_import and b.at[0] < deadline for b in bindings.get(name, ())))

        torch = analysis.module_alias("torch")
        self._torch_imported = in_time(torch)
        self.names = {"torch": torch or "torch"}
        dist = analysis.module_alias("torch.distributed")
        if dist is None:
            dist = "dist" if "dist" not in bound else None
        self._dist_imported = in_time(analysis.module_alias("torch.distributed"))
        self.names["dist"] = dist or f"{self.names['torch']}.distributed"
        self._dist_as_attribute = dist is None
        # Modules the new code may use (standard library, then loguru for TPU158): the file's
        # own name for them, else the module's name, else (that name is taken: `from time import
        # time`) an alias of its own.
        self._modules: dict[str, str | None] = {}  # placeholder -> the import to add, if any
        for module in (*_STDLIB_MODULES, "loguru"):
            alias = analysis.module_alias(module)
            if alias is not None:
                late = None if in_time(alias) else f"import {module}" + (f" as {alias}" if alias != module else "")
                self.names[module], self._modules[module] = alias, late
            elif module not in bound:
                self.names[module], self._modules[module] = module, f"import {module}"
            else:
                self.names[module] = f"_{module}_module"
                self._modules[module] = f"import {module} as _{module}_module"
        # torch's submodules that `import torch` does not import (FSDP's wrap policies, TPU175;
        # its ZeRO optimizer, TPU169): named in full, imported unless the file imports them.
        imported = {alias.name for node in analysis.tree.body if isinstance(node, ast.Import)
                    and (deadline is None or node.lineno < deadline)
                    for alias in node.names if alias.asname is None}
        self._submodules_imported = set()
        for placeholder, module in TORCH_SUBMODULES.items():
            self.names[placeholder] = self.names["torch"] + module.removeprefix("torch")
            if module in imported:
                self._submodules_imported.add(placeholder)
        transformers = analysis.module_alias("transformers")
        self._transformers_imported = in_time(transformers)
        self.names["transformers"] = transformers or "transformers"

    def use(self, placeholder: str) -> str:
        self._used.add(placeholder)
        if placeholder == "dist" and self._dist_as_attribute or placeholder in TORCH_SUBMODULES:
            self._used.add("torch")
        return self.names[placeholder]

    def used(self) -> frozenset[str]:
        return frozenset(self._used)

    def restore(self, used: frozenset[str]) -> None:
        """Forget the modules used since `used()` (their code was thrown away)."""
        self._used = set(used)

    def fill(self, template: str, **extra: str) -> str:
        """`template` with its placeholders filled: named expressions written out
        (named_expressions.py), then the file's names for the modules the code uses, then
        `extra`."""
        template = named_expressions.expand(template)
        values = dict(extra)
        for placeholder in named_expressions.MODULES:
            if "{" + placeholder + "}" in template:
                values[placeholder] = self.use(placeholder)
        return template.format(**values)

    def imports_to_add(self) -> list[str]:
        lines = [self._modules[module] for module in _STDLIB_MODULES
                 if module in self._used and self._modules[module]]
        if "torch" in self._used and not self._torch_imported:
            lines.append("import torch")
        if "dist" in self._used and not self._dist_imported:
            if self._dist_as_attribute:
                lines.append("import torch.distributed")
            else:
                lines.append(f"import torch.distributed as {self.names['dist']}")
        for placeholder, module in TORCH_SUBMODULES.items():
            if placeholder in self._used and placeholder not in self._submodules_imported:
                lines.append(f"import {module}")
        if "transformers" in self._used and not self._transformers_imported:
            lines.append("import transformers")
        if "loguru" in self._used and self._modules["loguru"]:
            lines.append(self._modules["loguru"])
        return lines


def _first_code_line(tree: ast.Module) -> int:
    """The line of the first module-level statement that runs code: not an import, a
    definition, a docstring or a notebook magic's `pass` (past the end: none)."""
    for index, node in enumerate(tree.body):
        docstring = index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        if not (docstring or isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef,
                                                ast.ClassDef, ast.Pass))):
            return node.lineno
    return len(tree.body) and tree.body[-1].end_lineno + 1


def unused_name(base: str, *taken: set[str]) -> str:
    """`base`, or `base2`, `base3`, ...: the first in none of `taken`."""
    name, n = base, 1
    while any(name in names for names in taken):
        n += 1
        name = f"{base}{n}"
    return name


@dataclass
class FileContext:
    catalog: Catalog
    options: Options
    analysis: Analysis
    import_plan: ImportPlan  # the names the new code uses for torch, dist, os, ...
    suppressions: dict[int, frozenset[str]]  # line -> codes, or {ALL_CODES}
    plans: Plans | None = None  # the decisions that span statements, made before the walk
    notebook: bool = False  # the code cells of a notebook, joined (notebooks.py)
    spmd_why: str | None = None  # why it runs SPMD, though it names none: spmd_programs.py
    # Why another module's launch that runs this file stays torch_xla's ("": a converted launch
    # runs it; None: no launch in another module is known): kept_launches.py.
    kept_launch_why: str | None = None
    # A wrap by torch_xla's FSDP stays in the file: its models' get_shard_metadata() stays too.
    xla_fsdp_kept: bool = False
    # TPU190: convert availability guards (engine.py turns this off when torch_xla stays needed).
    convert_guards: bool = True
    # id(ast statement) -> (message, whether it is a TODO): assignments of a torch_xla value that
    # goes into a call left to torch_xla, kept as they are (flows.py; the engine fills this and
    # rewrites again).
    held: dict[int, tuple[str, bool]] = field(default_factory=dict)
    # id(statement) -> (line, col, code, message) of each converted value it passes to a function
    # of the user's whose parameter reaches torch_xla (flows.passed_to_functions): a TODO each.
    flow_marks: dict[int, list[tuple[int, int, str, str]]] = field(default_factory=dict)
    flow_marks_placed: set[int] = field(default_factory=set)  # the statements the walk reached
    # (code, line) of an unsafe fix `--fix-level safe` holds back in this file: the file keeps
    # torch_xla's runtime until it converts, so every conversion that assumes TorchTPU's runtime
    # waits with it (the engine fills this and rewrites again; Rule.also_on_torch_xla).
    waiting_for: tuple[str, int] | None = None
    guards_converted: bool = False
    # The torch_xla / optimum.tpu imports the rewritten file keeps.
    kept_xla_imports: list[ImportBinding] = field(default_factory=list)
    source_lines: list[str] = field(default_factory=list)
    # The import bindings (Scope.import_key) of the references fixes removed from the code, for
    # import removal.
    removed_roots: Counter = field(default_factory=Counter)
    fixes: list[Fix] = field(default_factory=list)
    manual: list[Manual] = field(default_factory=list)
    # The input lines of the TODO(tpu-migrate) comments the walk dropped: an earlier run's notes
    # on code this run converted (layout.drop_done_todos); no longer open work.
    done_todo_lines: set[int] = field(default_factory=set)
    # (scope id, name) of variables bound to a device loader and rewritten to the plain loader.
    loader_vars: dict[tuple[int, str], cst.BaseExpression] = field(default_factory=dict)
    # Blocks that rules generated, by id (the node is kept, so the id stays its own): the body
    # of a rank guard ("guard", its condition), or the `pass` left where a removed statement
    # was ("pass", None). The walker tidies these up.
    generated: dict[int, tuple[cst.CSTNode, str, str | None]] = field(default_factory=dict)
    # Where import removal deleted the first module-level import line (imports.RemovedImports):
    # the imports the new code needs go there when the file has no group of their kind.
    removed_imports: object = None
    # Module-level helper functions the new code calls, by name (transforms/steps.py CPU_COPIES).
    helpers: dict[str, str] = field(default_factory=dict)
    helper_code: dict[str, str] = field(default_factory=dict)  # name -> its `def`
    # Whole-file scans a rule needs at many statements, made once per file (by the rule's key):
    # a scan per statement would make the rewrite quadratic in the file's size.
    memo: dict[str, object] = field(default_factory=dict)
    # The numbers of the skeleton's placeholders a rule dropped, or replaced by their statements
    # to move them (skeleton.py, transformer.ModuleRewriter.expanded).
    gone: set[int] = field(default_factory=set)

    def mark(self, node: cst.CSTNode, role: str, condition: str | None = None) -> None:
        self.generated[id(node)] = (node, role, condition)

    def generated_role(self, node: cst.CSTNode | None) -> tuple[str | None, str | None]:
        """("guard", its condition), ("pass", None) for a block a rule
        generated, else (None, None)."""
        entry = self.generated.get(id(node)) if node is not None else None
        return (entry[1], entry[2]) if entry is not None and entry[0] is node else (None, None)

    @property
    def target(self) -> str:
        return self.options.target

    def helper(self, base: str, template: str, **names: str) -> str:
        """The name of a module-level helper function (or class) the file gets once (`base`, or
        `base2`, ... where that name is bound); `names` fill the template's other placeholders
        (the helpers it calls)."""
        name = self.helpers.get(base)
        if name is None:
            template = named_expressions.with_helpers(template, self.helper)  # `_rank()` in it too
            name = self._same_helper(base, template, names)
            if name is not None:  # an earlier run added it: calls of it need no second copy
                self.helpers[base] = name
                return name
            name = unused_name(base, self.analysis.bound_names)
            self.helpers[base] = name
            self.helper_code[name] = self.import_plan.fill(template, name=name, **names)
        return name

    def _same_helper(self, base: str, template: str, names: dict[str, str]) -> str | None:
        """The module-level function `base` (or `base2`, ...) the file already has with exactly
        the helper's code, if any."""
        for name, node in self.analysis.functions.items():
            if name.rstrip("0123456789") != base:
                continue
            plan = ImportPlan(self.analysis, self.notebook)  # a throwaway: filling must not mark modules used
            try:
                wanted = ast.parse(plan.fill(template, name=name, **names)).body[0]
            except (SyntaxError, KeyError, IndexError):
                return None
            if ast.dump(wanted) == ast.dump(node):
                return name
        return None

    def waits(self, code: str) -> bool:
        """Whether `code` is a fix that waits for the unsafe fix `waiting_for`: off in this pass
        (the engine reports what it would have fixed)."""
        if self.waiting_for is None:
            return False
        rule = self.catalog.by_code(code)
        return rule.safety == "safe" and not rule.also_on_torch_xla


class StatementContext:
    """One statement being rewritten: its scope, its references, what rules did to it."""

    def __init__(self, file: FileContext, info: StmtInfo):
        self.file = file
        self.info = info
        self.scope: Scope = info.scope
        self._unconsumed: list[Ref] = list(info.refs)
        self._strings = list(info.xla_strings)
        self.todos: list[Manual] = []
        # An unsafe fix in this statement waits for a later run (`--fix-level safe`).
        self.deferred = False
        # ids of call nodes a statement-level rule already dealt with (fixed or reported).
        self.handled: set[int] = set()
        # Statements a rule needs run just before this one (simple statements only: see
        # `can_prefix`), e.g. selecting the rank's accelerator before a process group starts.
        self.before: list[cst.BaseStatement] = []
        # ... and just after it, e.g. the settings Optimum's loader stored in the model's config.
        self.after: list[cst.BaseStatement] = []
        self.can_prefix = False
        # > 0 while the rewriter is inside a lambda, comprehension, `a if c else b` or `and` /
        # `or`: code there may run several times or not at all, so nothing is hoisted out.
        self.hoist_blocked = 0
        self.new_names: set[str] = set()  # names fresh_name gave out in this statement
        # The TODO comments directly above the statement that this run's findings reword
        # (`supersede`): they go, and the findings' own are written in their place.
        self.superseded: set[str] = set()
        # resolve's answers: id(node) -> (node, qualified name); the walk asks about most calls'
        # names twice (expressions.py: whether torch_xla's, then which rule), the rules again.
        self._resolved: dict[int, tuple[cst.BaseExpression, str | None]] = {}

    @property
    def in_joined_worker(self) -> bool:
        """Directly in the body of a worker that the converted launch always starts in a process
        group (plans.Plans.joined_workers): `dist.is_initialized()` holds there."""
        scope = self.scope
        return (scope.kind == "function" and len(scope.path) == 1
                and scope.path[0] in self.file.plans.joined_workers)

    def fill(self, template: str, **extra: str) -> str:
        """The file's ImportPlan.fill, with named expressions in their form for this statement:
        short in a joined worker, else a call of their helper (named_expressions.py); named
        helper functions (`{map_tensors}`) by their name everywhere."""
        if self.in_joined_worker:
            template = named_expressions.expand(template, in_group=True)
        template = named_expressions.with_helpers(template, self.file.helper)
        return self.file.import_plan.fill(template, **extra)

    @property
    def where(self) -> tuple[int, int]:
        """The statement's (line, 1-based column) in the input, as findings give positions."""
        return finding_position(self.info.node)

    @property
    def ancestors(self) -> list[ast.AST] | None:
        """The statements that hold this one, outermost first (names.statement_ancestors)."""
        return statement_ancestors(self.file.analysis.tree, self.info.node)

    @property
    def can_hoist(self) -> bool:
        """Whether a rule may compute part of an expression in statements before this one."""
        return self.can_prefix and not self.hoist_blocked

    # -- rules ------------------------------------------------------------------------------

    def enabled(self, code: str) -> bool:
        if not self.file.options.enabled(code) or self.file.waits(code):
            return False
        for line in range(self.info.first_line, self.info.header_end_line + 1):
            codes = self.file.suppressions.get(line)
            if codes and (ALL_CODES in codes or code in codes):
                return False
        return True

    def fix_allowed(self, code: str) -> bool:
        """Enabled here, and allowed by the fix level; no side effects."""
        if not self.enabled(code):
            return False
        safety = self.file.catalog.by_code(code).safety
        return safety != "unsafe" or self.file.options.fix_level != "safe"

    def may_fix(self, rule: Rule, qualname: str | None = None) -> bool:
        """Whether `rule` may rewrite here. A disabled or suppressed rule consumes the reference
        silently; an unsafe fix held back by `--fix-level safe` is reported (without a TODO
        comment, which would go stale once the fix is applied)."""
        if not self.enabled(rule.code):
            self.consume(qualname)
            return False
        if rule.safety == "unsafe" and self.file.options.fix_level == "safe":
            self.needs_manual(
                rule.code, f"unsafe fix not applied at --fix-level safe: {rule.summary}",
                qualname, todo=False,
            )
            self.deferred = True
            return False
        return True

    def todos_to_write(self) -> list[Manual]:
        """The TODO comments this statement gets: none while an unsafe fix in it waits, since
        the run that applies it may remove or rebuild the statement (TPU157 deletes a print of
        the metrics report) and a comment written now would go stale. Still reported."""
        if not self.deferred:
            return self.todos
        for finding in self.todos:
            index = next(i for i, m in enumerate(self.file.manual) if m is finding)
            self.file.manual[index] = replace(finding, todo=False)
        self.todos = []
        return []

    def resolve(self, node: cst.BaseExpression) -> str | None:
        known = self._resolved.get(id(node))
        if known is not None and known[0] is node:  # (the node is held: its id is not reused)
            return known[1]
        dotted = cst_dotted(node)
        if dotted is None:
            qualname = None
        else:
            qualname = self.scope.resolve(dotted, self.info.position)
            qualname = self.file.catalog.canonical(qualname) if qualname else None
        self._resolved[id(node)] = (node, qualname)
        return qualname

    def consume(self, qualname: str | None) -> tuple[int, int]:
        """Mark the next reference to `qualname` as handled; its (line, col) in the input."""
        ref = self._take(qualname)
        if ref is None:
            return self.where
        return ref.line, ref.col

    def _take(self, qualname: str | None) -> Ref | None:
        for i, ref in enumerate(self._unconsumed):
            if ref.qualname == qualname:
                return self._unconsumed.pop(i)
        return None

    def consume_string(self, spelled: str | None = None) -> tuple[int, int]:
        """(line, col) in the input of the statement's first unconsumed "xla" string literal
        spelled `spelled` (its source text, quotes included), else of the next one."""
        lines = self.file.source_lines
        for i, (line, col) in enumerate(self._strings if spelled else ()):
            if 0 < line <= len(lines) and lines[line - 1][col - 1:].startswith(spelled):
                return self._strings.pop(i)
        if self._strings:
            return self._strings.pop(0)
        return self.where

    def fixed(
        self, code: str, qualname: str | None = None, where: tuple[int, int] | None = None,
        also: Iterable[str] = (),
    ) -> tuple[int, int]:
        """Record a fix; a fix by qualified name removes that reference from the code. `also`:
        the other references the same fix removes with it (a removed statement's): gone from
        the code too, and not counted as fixes of their own (one fix, one finding)."""
        if where is None:
            ref = self._take(qualname)
            if ref is not None:
                where = (ref.line, ref.col)
                self.removed(ref.dotted)
            else:
                where = self.where
        for other in also:
            ref = self._take(other)
            if ref is not None:
                self.removed(ref.dotted)
        self.file.fixes.append(Fix(code, *where))
        return where

    def removed(self, dotted: str) -> None:
        """A reference through an import (`xm.REDUCE_SUM`) is gone from the code."""
        for key in self.scope.import_keys(dotted, self.info.position):
            self.file.removed_roots[key] += 1

    def dropped_code(self, nodes: list[ast.AST]) -> None:
        """Code of the input that a fix left out (a branch a fold removed, an argument), read
        from its ast: the names it loads count as removed uses. Nothing is recorded where it
        defines or imports anything (a function, a class, a lambda, a comprehension, an import,
        a walrus, global): a name there need not be the import's, and its imports stay."""
        inner = [node for top in nodes for node in ast.walk(top)]
        if any(isinstance(node, _BINDING_NODES) for node in inner):
            return
        for node in inner:
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                self.removed(node.id)

    def needs_manual(
        self, code: str, message: str, qualname: str | None = None,
        where: tuple[int, int] | None = None, todo: bool = True, anchor: str | None = None,
    ) -> None:
        if where is None:
            ref = self._take(qualname)
            if ref is not None:
                where, anchor = (ref.line, ref.col), ref.dotted
            else:
                where = self.where
        # A TODO is one comment line: code it quotes may span lines (an argument with comments).
        message = " ".join(line.strip() for line in message.splitlines()) if todo else message
        finding = Manual(code, *where, message, anchor=anchor, todo=todo)
        self.file.manual.append(finding)
        if todo:
            self.todos.append(finding)

    def todo_above(self, code: str, message: str) -> bool:
        """Whether the TODO comment `code message`, in the tool's form, stands directly above
        the statement in the input (among the comments there; a blank line ends them)."""
        text, lines = f"{TODO_PREFIX}{code} {message}", self.file.source_lines
        index = self.info.first_line - 2
        while index >= 0 and lines[index].strip().startswith("#"):
            if " ".join(lines[index].split()) == " ".join(text.split()):
                return True
            index -= 1
        return False

    def supersede(self, code: str, message: str) -> None:
        """The TODO `code message` above the statement (an earlier run's, worded for another
        target) says what a finding of this run says otherwise: it goes, and the finding's own
        TODO takes its place (the text a fresh run of this target writes)."""
        self.superseded.add(f"{TODO_PREFIX}{code} {message}")

    def retract(self, code: str, qualname: str) -> None:
        """Take back the finding `code` made in this statement for the reference to `qualname`:
        an inner call that the enclosing call's rule converted with it (the ShardingSpec of a
        converted loader's input_sharding). The reference is then gone from the code."""
        for ref in self.info.refs:
            if ref.qualname != qualname:
                continue
            for finding in self.todos:
                if finding.code == code and (finding.line, finding.col) == (ref.line, ref.col):
                    self.todos.remove(finding)
                    self.file.manual.remove(finding)
                    self.removed(ref.dotted)
                    return

    def snapshot(self) -> tuple[int, dict, frozenset[str], tuple[int, int], frozenset[str]]:
        """What `rollback` needs to forget the fixes made since (the removed roots as a plain
        dict: a Counter's copy costs several times a dict's, and most snapshots are not rolled
        back)."""
        return (len(self.file.fixes), dict(self.file.removed_roots), self.file.import_plan.used(),
                (len(self.before), len(self.after)), frozenset(self.file.helpers))

    def rollback(self, snapshot: tuple[int, dict, frozenset[str], tuple[int, int], frozenset[str]]) -> None:
        """Forget the fixes made since `snapshot`: their code was thrown away (the arguments of
        a call left for a human are kept byte for byte), and with it the calls of the helpers
        added since. The references they consumed stay consumed: the call's own finding covers
        them."""
        count, removed, used, (before, after), helpers = snapshot
        del self.file.fixes[count:]
        self.file.removed_roots = Counter(removed)
        self.file.import_plan.restore(used)
        del self.before[before:]
        del self.after[after:]
        for base in set(self.file.helpers) - helpers:
            # A helper the file already had (an earlier run's) has no code to add: nothing to drop.
            self.file.helper_code.pop(self.file.helpers.pop(base), None)

    def leftover_refs(self) -> list[Ref]:
        from tpu_migrate.rewrite.names import is_xla_name

        return [r for r in self._unconsumed if is_xla_name(r.qualname)]


def cst_dotted(node: cst.BaseExpression) -> str | None:
    parts = []
    while isinstance(node, cst.Attribute):
        parts.append(node.attr.value)
        node = node.value
    if not isinstance(node, cst.Name):
        return None
    parts.append(node.value)
    return ".".join(reversed(parts))


# Code that binds names of its own: a dropped piece holding one records no removed use.
_BINDING_NODES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.ListComp, ast.SetComp,
                  ast.DictComp, ast.GeneratorExp, ast.Import, ast.ImportFrom, ast.Global, ast.Nonlocal, ast.NamedExpr)


@lru_cache(maxsize=512)
def parse_expr(code: str) -> cst.BaseExpression:
    return cst_parse.parse_expression(code)


@lru_cache(maxsize=512)
def parse_stmt(code: str) -> cst.BaseStatement:
    return cst_parse.parse_statement(code)
