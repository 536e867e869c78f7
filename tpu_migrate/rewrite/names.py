"""Resolve names to qualified names from imports, with Python's scoping rules, using `ast`.

libcst's QualifiedNameProvider costs about 4x a parse+print here, and any full libcst traversal
costs as much as the parse itself. Python's `ast` parser and a single walk over its tree are
several times cheaper, so the analysis runs on `ast`, and libcst is only visited where this
analysis found something to rewrite (see transformer.py).

The analysis is flow-insensitive within a scope, which is what real code needs:

    try:
        import torch_xla.core.xla_model as xm
    except ImportError:
        xm = None          # the optional-import fallback does not hide the import

but a function that binds `xm` itself (parameter, assignment, loop variable, ...) and does not
import it shadows the module's alias, and its `xm.mark_step()` is not touched.
"""

from __future__ import annotations

import ast
from collections import Counter
from dataclasses import dataclass, field

from tpu_migrate.rewrite.dependencies import DISTRIBUTION, REQUIREMENT, REQUIREMENT_KEYWORDS

XLA_ROOTS = ("torch_xla", "torch_xla_py", "optimum.tpu")

DDP_NAMES = frozenset(
    {
        "torch.nn.parallel.DistributedDataParallel",
        "torch.nn.parallel.distributed.DistributedDataParallel",
    }
)


def is_xla_name(qualname: str) -> bool:
    return any(qualname == root or qualname.startswith(root + ".") for root in XLA_ROOTS)


class Scope:
    """One Python scope: module, class, function, lambda or comprehension."""

    __slots__ = ("kind", "parent", "imports", "assigned", "global_names", "path")

    def __init__(self, kind: str, parent: Scope | None, name: str = ""):
        self.kind = kind
        self.parent = parent
        # The names of the enclosing classes and functions: ("Trainer", "fit"). Import removal
        # counts uses per (path, name), so a function's own import goes when its uses do.
        self.path: tuple[str, ...] = (*parent.path, name) if parent is not None else ()
        self.imports: dict[str, str] = {}  # bound name -> imported qualified name
        self.assigned: set[str] = set()  # names bound here by anything but an import
        self.global_names: set[str] = set()

    def module(self) -> Scope:
        scope = self
        while scope.parent is not None:
            scope = scope.parent
        return scope

    def lookup(self, name: str) -> str | None:
        """The qualified name `name` refers to here, or None when it is not an import."""
        scope = self.binding(name)
        return scope.imports[name] if scope is not None else None

    def binding(self, name: str) -> Scope | None:
        """The scope whose import `name` refers to here, or None when it is not an import."""
        scope: Scope | None = self
        innermost = True
        while scope is not None:
            # A class body's names are invisible to functions nested in it.
            if scope.kind == "class" and not innermost:
                scope = scope.parent
                continue
            if name in scope.global_names:
                scope = scope.module()
                return scope if name in scope.imports else None
            if name in scope.imports:
                return scope
            if name in scope.assigned:
                return None
            scope = scope.parent
            innermost = False
        return None

    def import_key(self, dotted: str) -> tuple[tuple[str, ...], str]:
        """(path of the binding scope, root name): what import removal counts uses by."""
        root = dotted.partition(".")[0]
        scope = self.binding(root)
        return (scope.path if scope is not None else ()), root

    def resolve(self, dotted: str) -> str | None:
        root, _, rest = dotted.partition(".")
        target = self.lookup(root)
        if target is None:
            return None
        return f"{target}.{rest}" if rest else target


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
    def key(self) -> tuple[tuple[str, ...], str]:
        return self.path, self.name


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

    @property
    def interesting(self) -> bool:
        return (self.forced or self.flagged or self.trigger_string or bool(self.xla_strings)
                or bool(self.dynamic_imports) or bool(self.requirements))


@dataclass
class Analysis:
    module_scope: Scope
    infos: dict[int, StmtInfo]  # id(ast statement) -> info
    imports: list[ImportBinding]
    bound_names: set[str]  # every name bound anywhere in the file
    qualnames: set[str]  # every resolved qualified name referenced
    functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef]  # module-level defs
    # How many references go through each import binding (`xm` in `xm.mark_step`), by
    # (path of the binding scope, name): see Scope.import_key.
    import_uses: Counter
    # Every dotted load: (scope, dotted name, statement, line, col), resolved or not.
    loads: list[tuple[Scope, str, StmtInfo, int, int]]
    tree: ast.Module

    def info(self, node: ast.stmt) -> StmtInfo:
        return self.infos[id(node)]

    def module_alias(self, qualname: str) -> str | None:
        """The module-level name bound to exactly `qualname` (`import torch as th` -> th)."""
        for name, target in self.module_scope.imports.items():
            if target == qualname and name not in self.module_scope.assigned:
                return name
        return None

    @property
    def has_ddp(self) -> bool:
        return bool(self.qualnames & DDP_NAMES)


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


class _Walker:
    """One walk over the tree: builds scopes, statement infos and unresolved references."""

    def __init__(self, strings: frozenset[str]) -> None:
        self.strings = strings
        self.infos: dict[int, StmtInfo] = {}
        self.imports: list[ImportBinding] = []
        self.pending: list[tuple[Scope, str, StmtInfo, int, int]] = []
        self.functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
        self.all_scopes: list[Scope] = []

    def new_scope(self, kind: str, parent: Scope | None, name: str = "") -> Scope:
        scope = Scope(kind, parent, name)
        self.all_scopes.append(scope)
        return scope

    # -- statements -------------------------------------------------------------------------

    def block(self, stmts: list[ast.stmt], scope: Scope) -> None:
        for stmt in stmts:
            self.stmt(stmt, scope)

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
            scope.assigned.add(node.name)
            if scope.kind == "module":
                self.functions[node.name] = node
            for d in node.decorator_list:
                self.expr(d, scope, info)
            inner = self.new_scope("function", scope, node.name)
            self.arguments(node.args, scope, inner, info)
            if node.returns is not None:
                self.expr(node.returns, scope, info)
            self.block(node.body, inner)
        elif isinstance(node, ast.ClassDef):
            scope.assigned.add(node.name)
            for e in (*node.decorator_list, *node.bases, *(k.value for k in node.keywords)):
                self.expr(e, scope, info)
            self.block(node.body, self.new_scope("class", scope, node.name))
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
                        scope.assigned.add(alias.asname or alias.name)
                    continue
                name = alias.asname or alias.name
                self.bind_import(scope, name, f"{node.module}.{alias.name}", node)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            if isinstance(node, ast.Global):
                scope.global_names.update(node.names)
        else:
            for child_field, value in ast.iter_fields(node):
                if isinstance(value, list):
                    if value and isinstance(value[0], ast.stmt):
                        self.block(value, scope)
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
            if node.name:
                scope.assigned.add(node.name)
            self.block(node.body, scope)
        elif isinstance(node, ast.match_case):
            self.pattern(node.pattern, scope, info)
            if node.guard is not None:
                self.expr(node.guard, scope, info)
            self.block(node.body, scope)
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
                scope.assigned.add(name)
            elif isinstance(sub, ast.MatchMapping) and sub.rest:
                scope.assigned.add(sub.rest)
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
            inner.assigned.add(arg.arg)
            if arg.annotation is not None:
                self.expr(arg.annotation, outer, info)

    def bind_import(self, scope: Scope, name: str, qualname: str, stmt: ast.stmt) -> None:
        scope.imports[name] = qualname
        self.imports.append(ImportBinding(name, qualname, stmt, scope.path))

    # -- expressions ------------------------------------------------------------------------

    def expr(self, node: ast.expr, scope: Scope, info: StmtInfo) -> None:
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load):
                self.pending.append((scope, node.id, info, node.lineno, node.col_offset))
            else:
                scope.assigned.add(node.id)
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
                    info.xla_strings.append((node.lineno, node.col_offset + 1))
                elif node.value in self.strings:
                    info.trigger_string = True
            return
        if isinstance(node, ast.JoinedStr):
            head = node.values[0] if node.values else None
            if isinstance(head, ast.Constant) and str(head.value).startswith("xla"):
                info.xla_strings.append((node.lineno, node.col_offset + 1))
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
            inner = self.new_scope("comprehension", scope)
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
            while target_scope.kind == "comprehension" and target_scope.parent is not None:
                target_scope = target_scope.parent
            target_scope.assigned.add(node.target.id)
            self.expr(node.value, scope, info)
            return
        if isinstance(node, ast.Call):
            module = dynamic_xla_import(node)
            if module is not None:
                info.dynamic_imports.append((node.lineno, node.col_offset + 1, module))
            for keyword in node.keywords:
                if keyword.arg in REQUIREMENT_KEYWORDS:
                    # `install_requires=["torch_xla"]`: here a bare name is a requirement too.
                    for sub in ast.walk(keyword.value):
                        if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and REQUIREMENT.match(sub.value):
                            _add_requirement(info, sub)
        for sub in ast.iter_child_nodes(node):
            if isinstance(sub, ast.expr):
                self.expr(sub, scope, info)
            elif isinstance(sub, ast.AST):
                self.child(sub, scope, info)


def _add_requirement(info: StmtInfo, node: ast.Constant) -> None:
    entry = (node.lineno, node.col_offset + 1, node.value)
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
    walker.block(tree.body, module)
    qualnames: set[str] = set()
    import_uses: Counter = Counter()
    for scope, dotted, info, line, col in walker.pending:
        qualname = scope.resolve(dotted)
        if qualname is None:
            continue
        import_uses[scope.import_key(dotted)] += 1
        qualname = canonical(qualname)
        qualnames.add(qualname)
        info.refs.append(Ref(qualname, dotted, line, col + 1))
        if not info.flagged and (
            is_xla_name(qualname) or qualname in rule_names
        ):
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
