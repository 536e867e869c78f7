"""A cheap static backward slice of one Python file: the statements that can feed a quantity
verify saw diverge (source_diff.py ranks the code that differs by it).

From seed statements (the optimizer's step and the backward calls for a step's figures; the
print for a printed line), through the names each reads, to the statements that write them,
until nothing is added. It is flow-insensitive and knows no scopes (a name is one name in the
whole file), so it over-includes rather than misses, with these rules for what Python hides:

- a statement *writes* the names it binds (`=`, `+=`, `for`, `with ... as`, `def`, `class`, `del`),
  the object it changes through an attribute or an item (`x.a = ...` writes `x`), and, for a call
  made as a statement (`dist.all_reduce(param.grad)`, `loss.backward()`), its receiver and its
  arguments (a call may change them in place), unless it only prints or logs;
- a name bound from others is an alias of them (`for p in model.parameters()`, `loss =
  criterion(model(x), y)`): writing it writes them (the gradient written through `p`, or by
  `loss.backward()`, is the model's);
- a statement in the slice brings the headers of the blocks it stands in (`if rank == 0:`,
  `for batch in loader:`), and what their tests read; a function or class it reads brings what
  the function returns (a class: what its methods return);
- a module (a name an `import` binds) is no value the program computes: it leads nowhere;
- a random seed (`torch.manual_seed(5)`) feeds every number the program draws: it is in every
  slice that is not empty.
"""

from __future__ import annotations

import ast
import re
from collections import deque
from dataclasses import dataclass, field

from tpu_migrate.verify.reductions import bound_names

# Calls made as statements that change nothing of their arguments: they print or log.
PRINTS = frozenset({"print", "master_print", "info", "debug", "warning", "warn", "error", "log", "write",
                    "set_description", "set_postfix"})
STEPS = frozenset({"step", "optimizer_step", "backward"})  # the calls a step's figures come from


@dataclass(eq=False)
class Statement:
    node: ast.stmt
    first: int                 # the lines it covers (a block's header only)
    last: int
    reads: set[str] = field(default_factory=set)
    writes: set[str] = field(default_factory=set)
    parent: Statement | None = None


class Program:
    """One file's statements, with what each reads and writes. `None` from parse() where the
    source does not parse."""

    def __init__(self, tree: ast.Module):
        self.statements: list[Statement] = []
        self.modules: set[str] = set()    # names an import binds
        self.functions: set[str] = set()  # names a def or a class binds
        aliases: dict[str, set[str]] = {}
        self._collect(tree.body, None, aliases)
        opaque = self.modules | self.functions
        aliases = {name: bound - opaque for name, bound in aliases.items() if name not in opaque}
        for statement in self.statements:  # writing an alias writes what it was bound from
            changed = statement.writes - opaque if isinstance(statement.node, ast.Expr) else statement.writes
            statement.writes = _closure(changed, aliases) - self.modules
        self.writers: dict[str, list[Statement]] = {}
        for statement in self.statements:
            for name in statement.writes:
                self.writers.setdefault(name, []).append(statement)

    @classmethod
    def parse(cls, source: str) -> Program | None:
        try:
            return cls(ast.parse(source))
        except (SyntaxError, ValueError, RecursionError):
            return None

    def _collect(self, body: list[ast.stmt], parent: Statement | None, aliases: dict[str, set[str]]) -> None:
        for node in body:
            header = _header(node)
            statement = Statement(node, node.lineno, _last_line(node, header), _names(header), set(), parent)
            statement.writes = _writes(node, header)
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                self.modules |= statement.writes
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.functions.add(node.name)
            elif isinstance(node, (ast.For, ast.AsyncFor)) or \
                    (isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None):
                source = node.iter if isinstance(node, (ast.For, ast.AsyncFor)) else node.value
                for name in _bound(node):
                    aliases.setdefault(name, set()).update(_values(source) - {name})
            self.statements.append(statement)
            for child in _blocks(node):
                self._collect(child, statement, aliases)

    def lines(self, statements: dict[Statement, int]) -> dict[int, int]:
        """Each line of the statements, with its distance from the seeds (backward_slice)."""
        out: dict[int, int] = {}
        for statement, depth in statements.items():
            for line in range(statement.first, statement.last + 1):
                out[line] = min(depth, out.get(line, depth))
        return out

    def step_seeds(self) -> list[Statement]:
        """The statements that step an optimizer or call backward() (a step's figures)."""
        return [s for s in self.statements if _calls(s, lambda name: name in STEPS)]

    def print_seeds(self, text: str) -> list[Statement]:
        """The statements that print or log a line like `text`: their literal words all in it."""
        out = []
        for statement in self.statements:
            if not _calls(statement, lambda name: name in PRINTS):
                continue
            words = [w for call in _print_calls(statement) for arg in call.args for w in _literals(arg)]
            if sum(len(w.strip()) for w in words) >= 3 and all(w.strip() in text for w in words):
                out.append(statement)
        return out

    def backward_slice(self, seeds: list[Statement]) -> dict[Statement, int]:
        """The statements that can feed the seeds (the module's text), each with its distance from
        them: a name read away, a function's result away; a block's header is as near as what it holds."""
        depth: dict[Statement, int] = {}
        followed: set[str] = set()
        returned: set[Statement] = set()
        queue = deque((s, 0, False) for s in seeds)
        while queue:  # breadth first: each statement at its least distance
            statement, distance, by_name = queue.popleft()
            definition = isinstance(statement.node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            if by_name and definition and statement not in returned:
                returned.add(statement)
                queue += [(s, distance + 1, False) for s in self._returns(statement)]
            if statement in depth:
                continue
            depth[statement] = distance
            if statement.parent is not None:
                queue.appendleft((statement.parent, distance, False))
            for name in statement.reads - followed - self.modules:
                followed.add(name)
                queue += [(s, distance + 1, True) for s in self.writers.get(name, ())]
        if depth:
            deepest = max(depth.values())
            for statement in self.statements:
                if statement not in depth and _calls(statement, lambda name: "seed" in name.lower()):
                    depth[statement] = deepest + 1
        return depth

    def _returns(self, definition: Statement) -> list[Statement]:
        def inside(statement: Statement) -> bool:
            while statement.parent is not None:
                if statement.parent is definition:
                    return True
                statement = statement.parent
            return False

        return [s for s in self.statements if isinstance(s.node, (ast.Return, ast.Expr)) and inside(s)
                and (isinstance(s.node, ast.Return) or isinstance(s.node.value, (ast.Yield, ast.YieldFrom)))]


def _header(node: ast.stmt) -> list[ast.AST]:
    """The expressions a statement evaluates itself (a block's header: not its body)."""
    if isinstance(node, (ast.If, ast.While)):
        return [node.test]
    if isinstance(node, (ast.For, ast.AsyncFor)):
        return [node.target, node.iter]
    if isinstance(node, (ast.With, ast.AsyncWith)):
        return list(node.items)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return [*node.decorator_list, node.args]
    if isinstance(node, ast.ClassDef):
        return [*node.decorator_list, *node.bases, *node.keywords]
    if isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
        return [h.type for h in node.handlers if h.type is not None]
    if isinstance(node, getattr(ast, "Match", ())):
        return [node.subject]
    return [node]


def _blocks(node: ast.stmt) -> list[list[ast.stmt]]:
    blocks = [getattr(node, name) for name in ("body", "orelse", "finalbody")
              if isinstance(getattr(node, name, None), list)]
    blocks += [handler.body for handler in getattr(node, "handlers", [])]
    blocks += [case.body for case in getattr(node, "cases", [])]
    return blocks


def _last_line(node: ast.stmt, header: list[ast.AST]) -> int:
    if not _blocks(node):
        return node.end_lineno or node.lineno
    return max([node.lineno, *(getattr(n, "end_lineno", None) or node.lineno for n in header)])


def _names(nodes) -> set[str]:
    return {n.id for node in nodes for n in ast.walk(node) if isinstance(n, ast.Name)}


def _values(node: ast.AST) -> set[str]:
    """The names an expression's value can hold parts of: what it reads, less the functions it calls."""
    called = {id(n.func) for n in ast.walk(node) if isinstance(n, ast.Call)}
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and id(n) not in called}


def _bound(node: ast.stmt) -> set[str]:
    """The plain names an assignment or a loop binds (not `x.a = ...`: that changes x, it binds nothing)."""
    return bound_names([node.target] if isinstance(node, (ast.AnnAssign, ast.For, ast.AsyncFor)) else node.targets)


def _root(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _targets(node: ast.AST) -> set[str]:
    if isinstance(node, (ast.Tuple, ast.List)):
        return set().union(*map(_targets, node.elts)) if node.elts else set()
    root = _root(node)
    return {root} if root else set()


def _writes(node: ast.stmt, header: list[ast.AST]) -> set[str]:
    if isinstance(node, ast.Assign):
        return set().union(*map(_targets, node.targets))
    if isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor)):
        return _targets(node.target)
    if isinstance(node, (ast.With, ast.AsyncWith)):
        return set().union(set(), *(_targets(item.optional_vars) for item in node.items if item.optional_vars))
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        args = node.args
        return {node.name, *(a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs,
                                             *filter(None, (args.vararg, args.kwarg))])}
    if isinstance(node, ast.ClassDef):
        return {node.name}
    if isinstance(node, ast.Delete):
        return set().union(*map(_targets, node.targets))
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        call = node.value
        if _called(call) in PRINTS:
            return set()
        changed = [call.func.value] if isinstance(call.func, ast.Attribute) else []
        changed += [*call.args, *(k.value for k in call.keywords)]
        return {name for arg in changed for name in (_names([arg]) if isinstance(arg, (ast.List, ast.Tuple,
                                                                                      ast.ListComp))
                                                      else {_root(arg)}) if name}
    return set()


def _called(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _calls(statement: Statement, test) -> bool:
    return any(isinstance(n, ast.Call) and test(_called(n)) for node in _header(statement.node) for n in ast.walk(node))


def _print_calls(statement: Statement) -> list[ast.Call]:
    return [n for node in _header(statement.node) for n in ast.walk(node)
            if isinstance(n, ast.Call) and _called(n) in PRINTS]


# A format's fields (`{}`, `{:.2f}`, `%d`): not printed as written.
FIELD = re.compile(r"\{[^{}]*\}|%[-#0 +]*\d*(?:\.\d+)?[a-zA-Z%]")


def _literals(node: ast.AST) -> list[str]:
    """The words a printed argument writes as they stand (an f-string's format specs aside)."""
    specs = {id(n) for f in ast.walk(node) if isinstance(f, ast.FormattedValue) and f.format_spec
             for n in ast.walk(f.format_spec)}
    return [piece for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in specs for piece in FIELD.split(n.value) if piece.strip()]


def _closure(names: set[str], aliases: dict[str, set[str]]) -> set[str]:
    out, todo = set(names), list(names)
    while todo:
        for other in aliases.get(todo.pop(), ()):
            if other not in out:
                out.add(other)
                todo.append(other)
    return out
