"""Whether an expression has one value in every process that evaluates it (TPU060's launch args).

`xmp.spawn(fn, args=(...))` evaluated `args` once, in the launching process of each host, and
handed the values to every worker. Under torchrun every worker runs the launch line and
evaluates them itself, so a temporary directory, the time, a random draw, a uuid, a pid, input
read, or a call into the program's own code (whose purity is unknown) may differ between them.

Known to be the same: literals; names bound (in the launch's function, else at module level)
only to such values, by imports, `def`, `class` or parameters (the caller's values: a
configuration, as a rule); attribute reads, subscripts and operators over them (`args.lr`,
`FLAGS["x"]`); the builtins and standard functions that only convert or combine values; the
command line that argparse parses (torchrun gives every worker the same one); environment reads
other than the variables torchrun sets per process. Anything else may differ.
"""

from __future__ import annotations

import ast

from tpu_migrate.rewrite.names import Analysis, StmtInfo, dotted_name
from tpu_migrate.rewrite.plans import enclosing_function, own_nodes

# Calls that give the same value for the same arguments, without side effects.
_SAME_BUILTINS = frozenset({
    "abs", "all", "any", "bool", "bytes", "dict", "divmod", "enumerate", "float", "format",
    "frozenset", "getattr", "hasattr", "int", "isinstance", "len", "list", "max", "min", "pow",
    "range", "repr", "reversed", "round", "set", "sorted", "str", "sum", "tuple", "type", "vars",
    "zip",
})
_SAME_CALLS = frozenset({
    "os.path.join", "os.path.abspath", "os.path.basename", "os.path.dirname", "os.path.expanduser",
    "os.path.expandvars", "os.path.normpath", "os.path.realpath", "os.path.splitext", "os.getcwd",
    "os.cpu_count", "pathlib.Path", "pathlib.PurePath", "copy.copy", "copy.deepcopy",
    "functools.partial", "dataclasses.asdict", "dataclasses.replace", "json.loads", "json.dumps",
    "math.ceil", "math.floor", "math.sqrt", "socket.gethostname", "torch.device", "argparse.Namespace",
})
_COMMAND_LINE = frozenset({"parse_args", "parse_known_args"})  # argparse's
# Methods that read a value (a dict's, a string's).
_SAME_METHODS = frozenset({
    "get", "copy", "keys", "values", "items", "split", "strip",
    "lower", "upper", "replace", "format", "join", "startswith", "endswith",
})
_ENVIRON_READS = frozenset({"os.environ.get", "os.getenv"})
# What torchrun sets differently in each process it starts.
_PER_PROCESS_ENV = frozenset({"RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RUN_ID"})


def varying_parts(expr: ast.expr, info: StmtInfo, analysis: Analysis) -> list[str]:
    """The parts of `expr`, evaluated at statement `info`, whose value may differ from one
    process to another (source text, e.g. "tempfile.mkdtemp()" or "tmp = tempfile.mkdtemp()");
    [] when it is the same in every process."""
    return list(dict.fromkeys(_Values(info, analysis).parts(expr)))


class _Values:
    def __init__(self, info: StmtInfo, analysis: Analysis):
        self.info = info
        self.analysis = analysis
        function = enclosing_function(analysis, info.node)
        self.bodies = [analysis.tree.body] if function is None else [function.body, analysis.tree.body]
        params = function.args if function is not None else None
        self.params = set() if params is None else {
            p.arg for p in [*params.posonlyargs, *params.args, *params.kwonlyargs, params.vararg, params.kwarg]
            if p is not None
        }
        self.resolving: set[str] = set()  # names being resolved (`x = x + 1`)
        self.local: set[str] = set()  # comprehension variables

    def parts(self, node: ast.AST) -> list[str]:
        if isinstance(node, ast.Constant):
            return []
        if isinstance(node, ast.Name):
            return self._name(node.id)
        if isinstance(node, ast.Call):
            return self._call(node)
        if isinstance(node, ast.Subscript) and self._environ(node.value):
            return self._environ_key(node, node.slice)
        if isinstance(node, ast.Lambda):
            return []  # a function: called later, in each worker, as xmp.spawn's workers did
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            names = {n.id for g in node.generators for n in ast.walk(g.target) if isinstance(n, ast.Name)}
            outer, self.local = self.local, self.local | names
            try:
                return [part for child in ast.iter_child_nodes(node) for part in self.parts(child)]
            finally:
                self.local = outer
        if isinstance(node, (ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom)):
            return [ast.unparse(node)]
        # Tuples, operators, attribute reads, subscripts, f-strings, comprehension clauses ...
        return [part for child in ast.iter_child_nodes(node) for part in self.parts(child)]

    def _call(self, call: ast.Call) -> list[str]:
        arguments = [part for arg in [*call.args, *call.keywords] for part in self.parts(arg)]
        func = call.func
        qualname = self._qualname(func)
        if qualname in _ENVIRON_READS:
            return self._environ_key(call, call.args[0] if call.args else None) + arguments
        if isinstance(func, ast.Name) and func.id in _SAME_BUILTINS and qualname is None \
                and func.id not in self.analysis.bound_names:
            return arguments
        if qualname in _SAME_CALLS:
            return arguments
        if isinstance(func, ast.Attribute) and func.attr in _COMMAND_LINE and qualname is None:
            return arguments  # the same command line, whatever parser reads it
        if isinstance(func, ast.Attribute) and func.attr in _SAME_METHODS and qualname is None:
            return self.parts(func.value) + arguments
        return [ast.unparse(call)]

    def _qualname(self, func: ast.expr) -> str | None:
        dotted = dotted_name(func)
        return None if dotted is None else self.info.scope.resolve(dotted, self.info.position)

    def _environ(self, node: ast.expr) -> bool:
        return self._qualname(node) == "os.environ"

    def _environ_key(self, read: ast.expr, key: ast.expr | None) -> list[str]:
        """An environment read: the same unless it reads what torchrun sets per process."""
        if isinstance(key, ast.Constant) and isinstance(key.value, str) and key.value not in _PER_PROCESS_ENV:
            return []
        return [ast.unparse(read)]

    def _name(self, name: str) -> list[str]:
        if name in self.local or name in self.resolving:
            return []
        for index, body in enumerate(self.bodies):
            if index == 0 and name in self.params:
                return []
            values = _bound_values(body, name)
            if values is None:
                continue
            self.resolving.add(name)
            try:
                inner = [part for value in values for part in ([name] if value is None else self.parts(value))]
            finally:
                self.resolving.discard(name)
            return [] if not inner else [name if inner[0] == name else f"{name} ({inner[0]})"]
        return []  # a builtin, or bound where this file does not say


def _bound_values(body: list[ast.stmt], name: str) -> list[ast.expr | None] | None:
    """The values `name` is bound to in a scope's own body (None for a binding whose value is not
    known to be the same: a `with ... as`, an `except ... as`, `:=`); None when it is not bound
    there. Imports, `def` and `class` bind the same thing in every process: no value."""
    values: list[ast.expr | None] = []
    bound = False
    for node in own_nodes(body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            bound = True
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                (a.asname or a.name).partition(".")[0] == name for a in node.names):
            bound = True
        elif isinstance(node, ast.Assign) and any(_binds(t, name) for t in node.targets):
            bound = True
            values.append(node.value)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and _binds(node.target, name):
            bound = True
            if node.value is not None:
                values.append(node.value)
        elif isinstance(node, (ast.For, ast.AsyncFor)) and _binds(node.target, name):
            bound = True
            values.append(node.iter)
        elif isinstance(node, ast.withitem) and node.optional_vars is not None and _binds(node.optional_vars, name):
            bound = True
            values.append(node.context_expr)
        elif isinstance(node, ast.ExceptHandler) and node.name == name:
            bound = True
            values.append(None)
        elif isinstance(node, ast.NamedExpr) and node.target.id == name:
            bound = True
            values.append(None)
    return values if bound else None


def _binds(target: ast.expr, name: str) -> bool:
    """Whether an assignment target binds `name` (`cfg.device = ...` changes what cfg holds, but
    is not followed: a configuration's attributes are taken as the same)."""
    return any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store) for n in ast.walk(target))


__all__ = ["varying_parts"]
