"""Resolve names to qualified names from imports, with Python's scoping rules, using `ast`.

libcst's QualifiedNameProvider costs about 4x a parse+print here, and any full libcst traversal
costs as much as the parse itself. Python's `ast` parser and a single walk over its tree are
several times cheaper, so the analysis runs on `ast`, and libcst is only visited where this
analysis found something to rewrite (see transformer.py).

Within a scope, a use sees the bindings made before it (Python runs a scope's statements in
order), and a use inside a function or lambda sees the scope's last bindings (it runs later). An
import wins over the bindings that only stand in for it, which is what real code needs:

    try:
        import torch_xla.core.xla_model as xm
    except ImportError:
        xm = None          # the optional-import fallback does not hide the import

(a binding in an `except` handler of a `try` whose body imports the name, or in the other branch
of an `if` that imports it). Any other binding replaces the import from where it runs on: after
`xm = Shim()` or `def mark_step(): ...`, `xm.mark_step()` / `mark_step()` are the program's own. A
rebinding that may or may not have run (inside an `if`, a loop, an `except`) leaves the use
ambiguous: it is not converted, and the rewrite marks it for a human (Resolution.ambiguous).
A function that binds `xm` itself (parameter, assignment, loop variable, ...) and does not
import it shadows the module's alias, and its `xm.mark_step()` is not touched.
"""

from __future__ import annotations

import ast
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property

from tpu_migrate.rewrite.bindings import Binding, Position, Span, reaching, state
from tpu_migrate.rewrite.dependencies import DISTRIBUTION, REQUIREMENT, REQUIREMENT_KEYWORDS

# torch.ops.xla: the operators torch_xla registers when imported (torch.ops.xla.dynamo_set_buffer_donor_).
XLA_OPS = "torch.ops.xla"
XLA_ROOTS = ("torch_xla", "torch_xla_py", "optimum.tpu", XLA_OPS)

DDP_NAMES = frozenset(
    {
        "torch.nn.parallel.DistributedDataParallel",
        "torch.nn.parallel.distributed.DistributedDataParallel",
    }
)


def is_xla_name(qualname: str) -> bool:
    return any(qualname == root or qualname.startswith(root + ".") for root in XLA_ROOTS)


@dataclass(frozen=True)
class Resolution:
    """A name that refers to an import at some point: the import, and the program's own
    binding that may hide it there (`ambiguous`: the use is left for a human)."""

    scope: Scope
    binding: Binding
    rebound: Binding | None = None
    early: bool = False  # the use runs before the name is bound at all (NameError, or a name
    # that `exec` or `globals()` put there): the import it meets later is a guess

    @property
    def ambiguous(self) -> bool:
        return self.rebound is not None or self.early

    def doubt(self) -> str:
        """Why the use may not be the import's, for its TODO."""
        # No line numbers: the TODO stays the same when lines above it move (a second run).
        name = self.binding.name
        if self.early:
            return f"it runs before `{name}` is imported"
        return f"this file binds `{name}` again in code that may run before it"

    @property
    def keys(self) -> list[tuple[tuple[str, ...], str, str]]:
        """The import bindings a use keeps alive (ImportBinding.key): the import, and the
        imports that stand in for it (`except ImportError: import torch_xla_py... as xm`)."""
        name = self.binding.name
        found = {self.binding.qualname}
        found.update(b.qualname for b in self.scope.bindings[name] if b.fallback and b.is_import)
        return [(self.scope.path, name, q) for q in sorted(found)]


class Scope:
    """One Python scope: module, class, function, lambda, comprehension or generator."""

    __slots__ = ("kind", "parent", "imports", "assigned", "global_names", "path", "bindings")

    def __init__(self, kind: str, parent: Scope | None, name: str = ""):
        self.kind = kind
        self.parent = parent
        # The names of the enclosing classes and functions: ("Trainer", "fit"). Import removal
        # counts uses per (path, name, import), so a function's own import goes when its uses do.
        self.path: tuple[str, ...] = (*parent.path, name) if parent is not None else ()
        self.imports: dict[str, str] = {}  # name bound by an import -> the last import's target
        self.assigned: set[str] = set()  # names bound here by anything but an import
        self.global_names: set[str] = set()
        self.bindings: dict[str, list[Binding]] = {}  # every binding of each name, in order

    def module(self) -> Scope:
        scope = self
        while scope.parent is not None:
            scope = scope.parent
        return scope

    def lookup(self, name: str, at: Position | None = None) -> str | None:
        """The qualified name `name` refers to here (in the statement starting at `at`; None:
        at the end of its scope), or None when it is not an import or may not be one."""
        found = self.binding(name, at)
        return found.binding.qualname if found is not None and not found.ambiguous else None

    def binding(self, name: str, at: Position | None = None) -> Resolution | None:
        """The import `name` refers to here, or None when it is not an import."""
        scope: Scope | None = self
        innermost = True
        while scope is not None:
            # A class body's names are invisible to functions nested in it.
            if scope.kind == "class" and not innermost:
                scope = scope.parent
                continue
            if name in scope.global_names:
                return scope.module().resolution(name, None)
            if name in scope.imports:
                values = state(scope.bindings[name], at)
                if values:
                    return scope._resolution(values)
                # A class body's name not bound yet is looked up in the enclosing scopes.
                if scope.kind != "class":
                    return scope._early(name)
            elif name in scope.assigned:
                # No import here (a fallback comes with one): not an import, except in a class
                # body before its own binding, where the enclosing scopes' name is meant.
                if scope.kind != "class" or state(scope.bindings[name], at):
                    return None
            if scope.kind in DEFERRED:
                at = None  # runs after its enclosing scope's statements: sees their last bindings
            scope = scope.parent
            innermost = False
        return None

    def resolution(self, name: str, at: Position | None) -> Resolution | None:
        return self._resolution(state(self.bindings.get(name, []), at))

    def _resolution(self, values: list[Binding]) -> Resolution | None:
        imported = [b for b in values if b.is_import]
        if not imported:
            return None
        own = [b for b in values if not b.is_import]
        return Resolution(self, imported[-1], own[-1] if own else None)

    def other_xla_imports(self, found: Resolution, at: Position | None) -> list[Binding]:
        """The torch_xla / optimum.tpu imports of `found`'s name that a use resolved to another
        import (`found`) may see all the same: one in the other branch of an `if`, in an `except`
        handler, in a loop. Such a use may run torch_xla's code: it is not converted, and the
        torch_xla binding is marked (every torch_xla binding is converted or marked)."""
        if is_xla_name(found.binding.qualname):
            return []
        scope = found.scope
        if scope is not self and scope.kind != "class":
            at = None  # a use in a nested function sees the scope's last bindings
        return [b for b in reaching(scope.bindings.get(found.binding.name, []), at)
                if b.is_import and is_xla_name(b.qualname)]

    def _early(self, name: str) -> Resolution | None:
        imported = [b for b in self.bindings[name] if b.is_import and not b.fallback]
        return Resolution(self, imported[0], early=True) if imported else None

    def import_keys(self, dotted: str, at: Position | None = None) -> list[tuple[tuple[str, ...], str, str]]:
        """The import bindings (ImportBinding.key) a reference keeps alive: what import
        removal counts uses by."""
        found = self.binding(dotted.partition(".")[0], at)
        return found.keys if found is not None else []

    def resolve(self, dotted: str, at: Position | None = None) -> str | None:
        root, _, rest = dotted.partition(".")
        target = self.lookup(root, at)
        if target is None:
            return None
        return f"{target}.{rest}" if rest else target


# Scopes whose code runs after the statements around them (a generator expression: when
# consumed), so a name there sees the enclosing scope's last bindings.
DEFERRED = frozenset({"function", "lambda", "generator"})


@dataclass
class Ref:
    """A resolved reference (a dotted name whose root is an import) in the input."""

    qualname: str
    dotted: str
    line: int
    col: int


@dataclass
class ImportBinding:
    """One name bound by an import statement."""

    name: str
    qualname: str
    stmt: ast.stmt
    path: tuple[str, ...] = ()  # the binding scope's path (Scope.path)

    @property
    def key(self) -> tuple[tuple[str, ...], str, str]:
        return self.path, self.name, self.qualname


def statement_ancestors(tree: ast.AST, target: ast.stmt) -> list[ast.AST] | None:
    """The statements from `tree` down to `target`'s parent, outermost first; None if not found.
    Only statement blocks are searched (a statement sits in one), without recursion: a file's
    nesting is the user's."""
    stack: list[tuple[ast.AST, tuple]] = [(tree, ())]
    while stack:
        node, path = stack.pop()
        for block in ("body", "orelse", "finalbody", "handlers", "cases"):
            for child in getattr(node, block, None) or ():
                if child is target:
                    return [*path[1:], node] if node is not tree else list(path[1:])
                if isinstance(child, (ast.stmt, ast.excepthandler, ast.match_case)):
                    stack.append((child, (*path, node)))
    return None


def finding_position(node: ast.AST) -> tuple[int, int]:
    """(line, column) of `node` as findings and references give them, with a 1-based column:
    ast's col_offset is 0-based, as are the Positions that scopes look bindings up at."""
    return node.lineno, node.col_offset + 1


@dataclass
class StmtInfo:
    """What the analysis knows about one statement (compound statements: their header)."""

    node: ast.stmt
    scope: Scope
    first_line: int
    header_end_line: int
    refs: list[Ref] = field(default_factory=list)
    xla_strings: list[tuple[int, int]] = field(default_factory=list)  # (line, col) of "xla..."
    # This statement or one nested in it (compound statements) is interesting.
    subtree_interesting: bool = False
    # Set by plans.py: a statement a cross-statement rewrite must visit.
    forced: bool = False
    # A reference to torch_xla, optimum.tpu, or a name some rule handles.
    flagged: bool = False
    # A string constant a transform triggers on (registry: `strings=`, torch_xla's variables).
    trigger_string: bool = False
    # `importlib.import_module("torch_xla...")` / `__import__("torch_xla...")`: (line, col, module)
    dynamic_imports: list[tuple[int, int, str]] = field(default_factory=list)
    # Requirement strings naming torch_xla / optimum-tpu (`"torch_xla[tpu]~=2.5"`): (line, col, text)
    requirements: list[tuple[int, int, str]] = field(default_factory=list)
    # References that may go to torch_xla or to the program's own binding of their name (a
    # rebinding that may have run, a use before the import): (reference, why). Left for a human.
    ambiguous: list[tuple[Ref, str]] = field(default_factory=list)

    @property
    def position(self) -> Position:
        """Where the statement starts: its uses see the bindings made before (Scope.lookup)."""
        return self.node.lineno, self.node.col_offset

    @property
    def interesting(self) -> bool:
        return (self.forced or self.flagged or self.trigger_string or bool(self.xla_strings)
                or bool(self.dynamic_imports) or bool(self.requirements))


# The fields that hold statements (and the except handlers and match cases that hold more).
_STATEMENT_FIELDS = ("body", "orelse", "finalbody", "handlers", "cases")


@dataclass
class Analysis:
    module_scope: Scope
    infos: dict[int, StmtInfo]  # id(ast statement) -> info
    imports: list[ImportBinding]
    bound_names: set[str]  # every name bound anywhere in the file
    qualnames: set[str]  # every resolved qualified name referenced
    functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef]  # module-level defs
    # How many references go through each import binding (`xm` in `xm.mark_step`), by
    # ImportBinding.key: see Scope.import_keys.
    import_uses: Counter
    # Every dotted load: (scope, dotted name, statement, line, col), resolved or not.
    loads: list[tuple[Scope, str, StmtInfo, int, int]]
    tree: ast.Module
    # Scans of the whole tree that other modules make, by key, once per analysis (an analysis
    # serves every pass of a file's rewrite: engine._unmarked).
    memo: dict[str, object] = field(default_factory=dict)

    @cached_property
    def nodes(self) -> list[ast.AST]:
        """Every node of the tree in ast.walk's order but the markers (`Load`, `Add`, `Eq`, ...:
        shared objects that no rule looks for in this list; a third of the nodes), walked once
        for the rules that look file-wide."""
        return _nodes_without_markers(self.tree)

    @cached_property
    def functions_of(self) -> dict[int, ast.FunctionDef | ast.AsyncFunctionDef]:
        """id(statement) -> the innermost function holding it (a function holds itself), for
        every statement inside one: found once, for the rules that ask of many statements (a
        statement sits only in the bodies of others, so the walk skips the expressions)."""
        found = {}
        todo: list[tuple[ast.AST, ast.AST | None]] = [(self.tree, None)]
        while todo:
            node, function = todo.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                function = node
            if function is not None:
                found[id(node)] = function
            for statements in _STATEMENT_FIELDS:
                children = getattr(node, statements, None)
                if type(children) is list:
                    todo.extend((child, function) for child in children)
        return found

    @cached_property
    def blocks(self) -> dict[int, tuple[list[ast.stmt], int]]:
        """id(statement) -> (the block holding it, its index there), for every statement."""
        found = {}
        for node in self.nodes:
            for name in ("body", "orelse", "finalbody"):
                block = getattr(node, name, None)
                if isinstance(block, list):
                    for i, stmt in enumerate(block):
                        found[id(stmt)] = (block, i)
        return found

    @cached_property
    def declared_names(self) -> frozenset[str]:
        """The names a `global` or `nonlocal` statement of the file declares."""
        return frozenset(name for node in self.nodes if isinstance(node, (ast.Global, ast.Nonlocal))
                         for name in node.names)

    @cached_property
    def loads_by_statement(self) -> dict[int, list[tuple[Scope, str, StmtInfo, int, int]]]:
        """`loads` by id(StmtInfo) of their statement, each in the order of `loads`: for the rules
        that ask of one statement (a scan of every load per statement was quadratic)."""
        found: dict[int, list] = {}
        for load in self.loads:
            found.setdefault(id(load[2]), []).append(load)
        return found

    @cached_property
    def loads_by_head(self) -> dict[str, list[tuple[Scope, str, StmtInfo, int, int]]]:
        """`loads` by their dotted name's first part (`xm` of `xm.mark_step`), in their order."""
        found: dict[str, list] = {}
        for load in self.loads:
            found.setdefault(load[1].partition(".")[0], []).append(load)
        return found

    @cached_property
    def loaded_names(self) -> frozenset[str]:
        """The plain names the file reads anywhere (`print(step)` reads `step`)."""
        return frozenset(node.id for node in self.nodes if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load))

    @cached_property
    def attribute_names(self) -> frozenset[str]:
        """The attribute names the file reads or writes anywhere (`x.name`)."""
        return frozenset(node.attr for node in self.nodes if isinstance(node, ast.Attribute))

    def info(self, node: ast.stmt) -> StmtInfo:
        return self.infos[id(node)]

    def module_alias(self, qualname: str) -> str | None:
        """The module-level name bound to exactly `qualname` (`import torch as th` -> th)."""
        scope = self.module_scope
        for name, target in scope.imports.items():
            if target == qualname and name not in scope.assigned and all(
                b.qualname == qualname for b in scope.bindings[name]
            ):
                return name
        return None

    @property
    def has_ddp(self) -> bool:
        return bool(self.qualnames & DDP_NAMES)


def walk(node: ast.AST) -> Iterator[ast.AST]:
    """ast.walk, the same nodes in the same order, in about half its time (the walks of the
    rewrite's file-wide analyses are much of its own cost)."""
    todo = deque([node])
    pop, push, extend, AST = todo.popleft, todo.append, todo.extend, ast.AST
    while todo:
        node = pop()
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(value, AST):
                push(value)
            elif type(value) is list:
                extend([item for item in value if isinstance(item, AST)])
        yield node


# The nodes that only mark what their parent does (`Name.ctx`, `BinOp.op`, `Compare.ops`).
_MARKERS = (ast.expr_context, ast.operator, ast.boolop, ast.unaryop, ast.cmpop)


def _nodes_without_markers(tree: ast.AST) -> list[ast.AST]:
    """`walk(tree)` as a list, less the markers: breadth first, the list being its own queue."""
    found, AST, markers = [tree], ast.AST, _MARKERS
    append, extend = found.append, found.extend
    for node in found:  # grows while it is read
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(value, AST):
                if not isinstance(value, markers):
                    append(value)
            elif type(value) is list:
                extend([item for item in value if isinstance(item, AST) and not isinstance(item, markers)])
    return found


def dotted_name(node: ast.expr) -> str | None:
    """`a.b.c` for a pure Name/Attribute chain, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_TRIES = (ast.Try, getattr(ast, "TryStar", ast.Try))


def _span(stmts: list[ast.AST]) -> Span:
    return (stmts[0].lineno, stmts[0].col_offset), (stmts[-1].end_lineno, stmts[-1].end_col_offset)


def _may_not_run(owner: ast.AST, field_name: str) -> bool:
    """Whether the `field_name` block of `owner` may not run where its statement does: the
    branches of an `if` or `match`, a loop's body and `else`, a `try`'s handlers and `else`."""
    if isinstance(owner, _TRIES):
        return field_name in ("handler", "orelse")
    return isinstance(owner, (ast.If, ast.Match, *_LOOPS))


class _Walker:
    """One walk over the tree: builds scopes, statement infos and unresolved references."""

    def __init__(self, strings: frozenset[str]) -> None:
        self.strings = strings
        self.infos: dict[int, StmtInfo] = {}
        self.imports: list[ImportBinding] = []
        self.pending: list[tuple[Scope, str, StmtInfo, int, int]] = []
        self.functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
        self.all_scopes: list[Scope] = []
        # The blocks around the statement being walked, in the scope whose body is walked:
        # (statement, field, span of the block); see `bind`.
        self.frames: list[tuple[ast.AST, str, Span]] = []
        self.frame_scope: Scope | None = None
        self._imported_names: dict[int, set[str]] = {}

    def new_scope(self, kind: str, parent: Scope | None, name: str = "") -> Scope:
        scope = Scope(kind, parent, name)
        self.all_scopes.append(scope)
        return scope

    # -- statements -------------------------------------------------------------------------

    def block(self, stmts: list[ast.stmt], scope: Scope, owner: ast.AST | None = None, field_name: str = "") -> None:
        """Walk `stmts`, the `field_name` block of the statement `owner` (None: a scope's body)."""
        if owner is not None:
            self.frames.append((owner, field_name, _span(stmts)))
        for stmt in stmts:
            self.stmt(stmt, scope)
        if owner is not None:
            self.frames.pop()

    def scope_body(self, stmts: list[ast.stmt], scope: Scope) -> None:
        """A function's or class's body: its blocks are its own."""
        outer = self.frames, self.frame_scope
        self.frames, self.frame_scope = [], scope
        self.block(stmts, scope)
        self.frames, self.frame_scope = outer

    # -- bindings ---------------------------------------------------------------------------

    def bind(self, scope: Scope, name: str, node: ast.AST | None, qualname: str | None = None,
             at: Position | None = None) -> None:
        """Record a binding of `name` in `scope` by `node`, effective after `node` (or `at`)."""
        if qualname is None:
            scope.assigned.add(name)
        if scope is not self.frame_scope or node is None:
            # A parameter or a comprehension's variable: bound before its scope's code runs.
            binding = Binding(name, (0, 0), qualname)
        elif not self.frames:
            binding = Binding(name, at or (node.end_lineno, node.end_col_offset), qualname)
        else:
            conditional = [span for owner, f, span in self.frames if _may_not_run(owner, f)]
            loops = [_span([owner]) for owner, f, _ in self.frames if isinstance(owner, _LOOPS)]
            binding = Binding(
                name, at or (node.end_lineno, node.end_col_offset), qualname,
                block=conditional[-1] if conditional else None, loop=loops[0] if loops else None,
                fallback=any(self._stands_in(owner, f, name, qualname) for owner, f, _ in self.frames),
            )
        if qualname is not None and not binding.fallback:
            scope.imports[name] = qualname
        scope.bindings.setdefault(name, []).append(binding)

    def _stands_in(self, owner: ast.AST, field_name: str, name: str, qualname: str | None) -> bool:
        """Whether a binding of `name` in the `field_name` block of `owner` is the fallback of
        an import of `name` there: in an `except` handler of a `try` whose body imports it, in
        the `else` of an `if` whose body imports it, or (not itself an import) in the body of an
        `if` whose `else` imports it."""
        if field_name == "handler" and isinstance(owner, _TRIES):
            return name in self._imported(owner.body)
        if isinstance(owner, ast.If) and field_name == "orelse":
            return name in self._imported(owner.body)
        if isinstance(owner, ast.If) and field_name == "body" and qualname is None:
            return name in self._imported(owner.orelse)
        return False

    def _imported(self, stmts: list[ast.stmt]) -> set[str]:
        """The names the imports of `stmts` bind, at any depth of the same scope."""
        found = self._imported_names.get(id(stmts))
        if found is None:
            found = set()
            todo = list(stmts)
            while todo:
                stmt = todo.pop()
                if isinstance(stmt, ast.Import):
                    found.update(a.asname or a.name.partition(".")[0] for a in stmt.names)
                elif isinstance(stmt, ast.ImportFrom):
                    found.update(a.asname or a.name for a in stmt.names)
                elif not isinstance(stmt, (*_FUNCTIONS, ast.ClassDef)):
                    for child in ast.iter_child_nodes(stmt):
                        if isinstance(child, ast.stmt):
                            todo.append(child)
                        elif isinstance(child, (ast.ExceptHandler, ast.match_case)):
                            todo.extend(child.body)
            self._imported_names[id(stmts)] = found
        return found

    def stmt(self, node: ast.stmt, scope: Scope) -> None:
        first = node.lineno
        decorators = getattr(node, "decorator_list", None)
        if decorators:
            first = min(first, *(d.lineno for d in decorators))
        body = getattr(node, "body", None)
        if isinstance(body, list) and body:
            header_end = max(node.lineno, body[0].lineno - 1)
        else:
            header_end = node.end_lineno or node.lineno
        info = StmtInfo(node, scope, first, header_end)
        self.infos[id(node)] = info

        if isinstance(node, _FUNCTIONS):
            self.bind(scope, node.name, node)
            if scope.kind == "module":
                self.functions[node.name] = node
            for d in node.decorator_list:
                self.expr(d, scope, info)
            inner = self.new_scope("function", scope, node.name)
            self.arguments(node.args, scope, inner, info)
            if node.returns is not None:
                self.expr(node.returns, scope, info)
            self.scope_body(node.body, inner)
        elif isinstance(node, ast.ClassDef):
            self.bind(scope, node.name, node)
            for e in (*node.decorator_list, *node.bases, *(k.value for k in node.keywords)):
                self.expr(e, scope, info)
            self.scope_body(node.body, self.new_scope("class", scope, node.name))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    self.bind_import(scope, alias.asname, alias.name, node)
                else:
                    root = alias.name.partition(".")[0]
                    self.bind_import(scope, root, root, node)
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if node.level or alias.name == "*" or not node.module:
                    if alias.name != "*":
                        self.bind(scope, alias.asname or alias.name, node)
                    continue
                name = alias.asname or alias.name
                self.bind_import(scope, name, f"{node.module}.{alias.name}", node)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            if isinstance(node, ast.Global):
                scope.global_names.update(node.names)
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            self.expr(node.iter, scope, info)
            # The loop variable is bound only if the loop runs: it is part of the body.
            self.frames.append((node, "body", _span(node.body)))
            self.expr(node.target, scope, info)
            self.block(node.body, scope)
            self.frames.pop()
            if node.orelse:
                self.block(node.orelse, scope, node, "orelse")
        else:
            for child_field, value in ast.iter_fields(node):
                if isinstance(value, list):
                    if value and isinstance(value[0], ast.stmt):
                        self.block(value, scope, node, child_field)
                        continue
                    for item in value:
                        self.child(item, scope, info)
                elif isinstance(value, ast.AST):
                    self.child(value, scope, info)

    def child(self, node: ast.AST, scope: Scope, info: StmtInfo) -> None:
        if isinstance(node, ast.expr):
            self.expr(node, scope, info)
        elif isinstance(node, ast.ExceptHandler):
            if node.type is not None:
                self.expr(node.type, scope, info)
            self.frames.append((info.node, "handler", _span(node.body)))
            if node.name:
                self.bind(scope, node.name, node, at=finding_position(node))
            self.block(node.body, scope)
            self.frames.pop()
        elif isinstance(node, ast.match_case):
            self.frames.append((info.node, "case", _span(node.body)))
            self.pattern(node.pattern, scope, info)
            if node.guard is not None:
                self.expr(node.guard, scope, info)
            self.block(node.body, scope)
            self.frames.pop()
        elif isinstance(node, ast.withitem):
            self.expr(node.context_expr, scope, info)
            if node.optional_vars is not None:
                self.expr(node.optional_vars, scope, info)
        elif isinstance(node, ast.AST):
            for sub in ast.iter_child_nodes(node):
                self.child(sub, scope, info)

    def pattern(self, node: ast.AST, scope: Scope, info: StmtInfo) -> None:
        for sub in ast.walk(node):
            name = getattr(sub, "name", None)
            if isinstance(sub, (ast.MatchAs, ast.MatchStar)) and name:
                self.bind(scope, name, sub)
            elif isinstance(sub, ast.MatchMapping) and sub.rest:
                self.bind(scope, sub.rest, sub)
            elif isinstance(sub, ast.expr) and not isinstance(sub, ast.Name):
                if isinstance(sub, (ast.Attribute, ast.Constant)):
                    self.expr(sub, scope, info)

    def arguments(self, args: ast.arguments, outer: Scope, inner: Scope, info: StmtInfo) -> None:
        for default in (*args.defaults, *(d for d in args.kw_defaults if d is not None)):
            self.expr(default, outer, info)
        every = (*args.posonlyargs, *args.args, *args.kwonlyargs)
        for arg in (*every, args.vararg, args.kwarg):
            if arg is None:
                continue
            self.bind(inner, arg.arg, arg)
            if arg.annotation is not None:
                self.expr(arg.annotation, outer, info)

    def bind_import(self, scope: Scope, name: str, qualname: str, stmt: ast.stmt) -> None:
        self.bind(scope, name, stmt, qualname)
        self.imports.append(ImportBinding(name, qualname, stmt, scope.path))

    # -- expressions ------------------------------------------------------------------------

    def expr(self, node: ast.expr, scope: Scope, info: StmtInfo) -> None:
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load):
                self.pending.append((scope, node.id, info, node.lineno, node.col_offset))
            else:
                self.bind(scope, node.id, node)
            return
        if isinstance(node, ast.Attribute):
            dotted = dotted_name(node)
            if dotted is not None:
                self.pending.append((scope, dotted, info, node.lineno, node.col_offset))
                return
            self.expr(node.value, scope, info)
            return
        if isinstance(node, ast.Constant):
            if isinstance(node.value, str):
                if ("xla" in node.value or "tpu" in node.value) and DISTRIBUTION.match(node.value):
                    _add_requirement(info, node)
                if node.value.startswith("xla"):
                    info.xla_strings.append(finding_position(node))
                elif node.value in self.strings:
                    info.trigger_string = True
            return
        if isinstance(node, ast.JoinedStr):
            head = node.values[0] if node.values else None
            if isinstance(head, ast.Constant) and str(head.value).startswith("xla"):
                info.xla_strings.append(finding_position(node))
            for part in node.values:
                if isinstance(part, ast.FormattedValue):
                    self.expr(part, scope, info)
            return
        if isinstance(node, ast.Lambda):
            inner = self.new_scope("lambda", scope)
            self.arguments(node.args, scope, inner, info)
            self.expr(node.body, inner, info)
            return
        if isinstance(node, _COMPREHENSIONS):
            kind = "generator" if isinstance(node, ast.GeneratorExp) else "comprehension"
            inner = self.new_scope(kind, scope)
            for i, gen in enumerate(node.generators):
                self.expr(gen.iter, scope if i == 0 else inner, info)
                self.expr(gen.target, inner, info)
                for cond in gen.ifs:
                    self.expr(cond, inner, info)
            if isinstance(node, ast.DictComp):
                self.expr(node.key, inner, info)
                self.expr(node.value, inner, info)
            else:
                self.expr(node.elt, inner, info)
            return
        if isinstance(node, ast.NamedExpr):
            target_scope = scope
            while target_scope.kind in ("comprehension", "generator") and target_scope.parent is not None:
                target_scope = target_scope.parent
            self.bind(target_scope, node.target.id, node.target)
            self.expr(node.value, scope, info)
            return
        if isinstance(node, ast.Call):
            module = dynamic_xla_import(node)
            if module is not None:
                info.dynamic_imports.append((*finding_position(node), module))
            for keyword in node.keywords:
                if keyword.arg in self.strings:  # `os.environ.update(XLA_USE_BF16="1")`
                    info.trigger_string = True
                if keyword.arg in REQUIREMENT_KEYWORDS:
                    # `install_requires=["torch_xla"]`: here a bare name is a requirement too.
                    for sub in ast.walk(keyword.value):
                        if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and REQUIREMENT.match(sub.value):
                            _add_requirement(info, sub)
        # ast.iter_child_nodes, inline and without the markers (`Load`, `Add`), which hold nothing
        expr, AST = ast.expr, ast.AST
        for name in node._fields:
            value = getattr(node, name, None)
            for sub in (value if type(value) is list else (value,)):
                if isinstance(sub, expr):
                    self.expr(sub, scope, info)
                elif isinstance(sub, AST) and not isinstance(sub, _MARKERS):
                    self.child(sub, scope, info)


def _add_requirement(info: StmtInfo, node: ast.Constant) -> None:
    entry = (*finding_position(node), node.value)
    if entry not in info.requirements:
        info.requirements.append(entry)


def dynamic_xla_import(call: ast.Call) -> str | None:
    """The module of `importlib.import_module("torch_xla...")`, `import_module(...)` or
    `__import__("torch_xla...")` (a literal name under torch_xla / optimum.tpu), else None."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name not in ("import_module", "__import__") or not call.args:
        return None
    first = call.args[0]
    if isinstance(first, ast.Constant) and isinstance(first.value, str) and is_xla_name(first.value):
        return first.value
    return None


def analyze(
    tree: ast.Module, canonical=lambda qualname: qualname, rule_names: frozenset[str] = frozenset(),
    strings: frozenset[str] = frozenset(),
) -> Analysis:
    """Scopes, imports and resolved references of a module. `canonical` maps historical
    spellings to the names rules are written against (Catalog.canonical); a statement that
    refers to torch_xla, optimum.tpu or `rule_names` (the rules' `matches` and the names the
    registered transforms trigger on: engine.flagged_names), or holds one of `strings`
    (registry.trigger_strings), is flagged for rewriting."""
    walker = _Walker(strings)
    module = walker.new_scope("module", None)
    walker.scope_body(tree.body, module)
    qualnames: set[str] = set()
    import_uses: Counter = Counter()
    for scope, dotted, info, line, col in walker.pending:
        root, _, rest = dotted.partition(".")
        found = scope.binding(root, info.position)
        if found is None:
            continue
        for key in found.keys:
            import_uses[key] += 1  # an ambiguous use keeps its import too
        target = found.binding.qualname
        qualname = canonical(f"{target}.{rest}" if rest else target)
        wanted = is_xla_name(qualname) or qualname in rule_names
        others = [] if found.ambiguous else scope.other_xla_imports(found, info.position)
        if others:
            other = others[-1]
            for binding in others:
                import_uses[(found.scope.path, root, binding.qualname)] += 1  # kept: its TODO needs it
            info.ambiguous.append((
                Ref(canonical(f"{other.qualname}.{rest}" if rest else other.qualname), dotted, line, col + 1),
                f"another import binds `{root}` to {target} in code that may run instead"))
            info.flagged = True
            continue
        if found.ambiguous:
            if wanted:
                info.ambiguous.append((Ref(qualname, dotted, line, col + 1), found.doubt()))
                info.flagged = True
            continue
        qualnames.add(qualname)
        info.refs.append(Ref(qualname, dotted, line, col + 1))
        if wanted:
            info.flagged = True
    for info in walker.infos.values():
        if len(info.refs) > 1:
            info.refs.sort(key=lambda r: (r.line, r.col))
    mark_subtrees(tree.body, walker.infos)
    bound: set[str] = set()
    for scope in walker.all_scopes:
        bound.update(scope.imports)
        bound.update(scope.assigned)
    return Analysis(
        module, walker.infos, walker.imports, bound, qualnames, walker.functions, import_uses,
        walker.pending, tree,
    )


def mark_subtrees(stmts: list[ast.stmt], infos: dict[int, StmtInfo]) -> bool:
    """Set `subtree_interesting` bottom-up; whether any statement of `stmts` has it."""
    any_interesting = False
    for stmt in stmts:
        info = infos[id(stmt)]
        flag = info.interesting
        for name in ("body", "orelse", "finalbody"):
            block = getattr(stmt, name, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                flag = mark_subtrees(block, infos) or flag
        for holder in (*getattr(stmt, "handlers", ()), *getattr(stmt, "cases", ())):
            flag = mark_subtrees(holder.body, infos) or flag
        info.subtree_interesting = flag
        any_interesting = any_interesting or flag
    return any_interesting
