"""Whether a model that an SPMD conversion shards may hold a BatchNorm: spmd.py's
`_global_batch_norm` (BatchNorm statistics over the global batch, as SPMD computed them) is
added only then.

A missing helper changes numbers without a word (each process would normalize by its own
slice), an extra one is only noise; so the helper is left out only where the file shows the
whole model and no BatchNorm in it:

1. Nothing in the file names a batch norm (a name, attribute, import, keyword or string with
   `batchnorm` / `batch_norm` in it, any case): a BatchNorm class, `convert_sync_batchnorm`,
   `norm_layer=nn.BatchNorm2d`, `getattr(nn, "BatchNorm2d")`.
2. The model is built here: `Net(...)` or a torch.nn layer (`nn.Sequential(Net(), nn.Linear(4,
   2))`, its arguments followed as below), with `.to(device)`, `.train()`, ... after it, or a name
   of the same function assigned only that (and itself again: `model = model.to(device)`),
   used before the wrap only as `model(x)` and `model.parameters()`-like reads.
3. `Net` is a class of this file, and everything its code reaches is seen too: the classes,
   functions and module-level values of this file it names, and names imported from torch
   (but not torch's loaders: `torch.hub.load`, `torch.load`, ...), torch_xla, numpy or the
   standard library (but not pickle or importlib); no `eval`, `exec` or `getattr` with a
   computed name. The same holds for the names in `Net(...)`'s arguments, a local of the
   function followed to what it was assigned.

Anything else (a model from transformers or torchvision, `self.model`, a function's parameter,
a class from another module of the project) may hold a BatchNorm: the helper stays.
"""

from __future__ import annotations

import ast
import builtins
import re
import sys

from tpu_migrate.rewrite.names import Analysis, walk

_MENTION = re.compile(r"batch_?norm", re.IGNORECASE)
# nn.Module methods that return the module itself.
_RETURNS_SELF = frozenset({"to", "cuda", "cpu", "float", "half", "bfloat16", "double", "train", "eval",
                           "requires_grad_", "to_empty", "type"})
# nn.Module methods that read the model without changing which modules it holds.
_READS = frozenset({"parameters", "named_parameters", "buffers", "named_buffers", "modules", "named_modules",
                    "children", "named_children", "state_dict", "load_state_dict", "zero_grad", "forward",
                    "__call__"})
_ALLOWED_ROOTS = frozenset({"torch", "torch_xla", "numpy"}) | frozenset(sys.stdlib_module_names)
# What loads or builds objects the file does not show.
_DENIED = ("torch.hub", "torch.load", "torch.jit.load", "torch.package", "torch.export", "torch.fx", "torch.ao",
           "torch.quantization", "torch.utils.model_zoo", "importlib", "pickle", "shelve", "marshal", "copyreg",
           "builtins", "runpy",
           # Fused and quantized layers whose names hide a BatchNorm (ConvBn2d, ConvBnReLU2d).
           "torch.nn.intrinsic", "torch.nn.qat", "torch.nn.quantized")
_DYNAMIC = frozenset({"eval", "exec", "__import__", "globals", "vars", "locals", "compile"})
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
_DEPTH = 4


def may_hold_batch_norm(expression: str, statement: ast.stmt, analysis: Analysis, memo: dict | None = None) -> bool:
    """Whether the module `expression` (source text), wrapped by `statement`, may hold a
    BatchNorm (see the module's docstring); True wherever that is not shown. `memo`: the file's
    (FileContext.memo), where the file's mention of a batch norm is looked for once."""
    memo = {} if memo is None else memo
    if "mentions_batch_norm" not in memo:
        memo["mentions_batch_norm"] = _mentions_batch_norm(analysis)
    if memo["mentions_batch_norm"]:
        return True
    try:
        node = ast.parse(f"(\n{expression}\n)", mode="eval").body
    except SyntaxError:
        return True
    return not _Proof(analysis, statement).built_here(node, 0)


def _mentions_batch_norm(analysis: Analysis) -> bool:
    for node in analysis.nodes:
        if isinstance(node, ast.Name):
            text = node.id
        elif isinstance(node, ast.Attribute):
            text = node.attr
        elif isinstance(node, ast.alias):
            text = f"{node.name} {node.asname or ''}"
        elif isinstance(node, ast.keyword):
            text = node.arg or ""
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            text = node.name
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        else:
            continue
        if _MENTION.search(text):
            return True
    return False


def _strip_chain(node: ast.expr) -> ast.expr:
    """`Net().to(device).train()` -> `Net()`: the methods that return the module."""
    while (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
           and node.func.attr in _RETURNS_SELF):
        node = node.func.value
    return node


def _own_nodes(scope: ast.AST):
    """The nodes of a function (or module) body, not those of the functions and classes in it."""
    todo = list(scope.body) if not isinstance(scope, ast.Lambda) else [scope.body]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, _SCOPES):
            todo.extend(node.decorator_list if not isinstance(node, ast.Lambda) else ())
            continue
        todo.extend(ast.iter_child_nodes(node))


class _Proof:
    """The walk of one model's code: False (unsure) as soon as something is not shown."""

    def __init__(self, analysis: Analysis, statement: ast.stmt):
        self.analysis = analysis
        self.statement = statement
        self.function = analysis.functions_of.get(id(statement))
        self.module_defs: dict[str, list[ast.stmt]] = {}
        for stmt in analysis.tree.body:
            for name in _bound_by(stmt):
                self.module_defs.setdefault(name, []).append(stmt)
        self.seen: set[int] = set()
        # The wrap's function, walked once however many names are asked of it.
        self._own: list[ast.AST] | None = None
        self._locals: set[str] | None = None
        self._globals: set[str] | None = None

    def own_nodes(self) -> list[ast.AST]:
        """`_own_nodes` of the wrap's function, in their order."""
        if self._own is None:
            self._own = list(_own_nodes(self.function))
        return self._own

    def declared(self) -> set[str]:
        if self._globals is None:
            self._globals = _declared(self.function, self.own_nodes())
        return self._globals

    def local_names(self) -> set[str]:
        if self._locals is None:
            self._locals = _local_names(self.function, self.own_nodes(), self.declared())
        return self._locals

    def built_here(self, node: ast.expr, depth: int) -> bool:
        node = _strip_chain(node)
        if isinstance(node, ast.Call):
            arguments = node.args + [k.value for k in node.keywords]
            if isinstance(node.func, ast.Name) and self._local_class(node.func.id):
                return self._values(arguments, depth)
            if self._torch_layer(node.func):
                return self._values(arguments, depth)  # torch.nn.Linear(4, 2), nn.Sequential(Net())
            return False
        if isinstance(node, ast.Name) and self.function is not None and depth == 0:
            return self._model_name(node.id, depth)
        return False

    def _local_class(self, name: str) -> bool:
        """`name` is, wherever the wrap runs, a class of this file, and its code is shown."""
        if self.function is not None and name in self.local_names():
            return False
        defs = self.module_defs.get(name, [])
        if len(defs) != 1 or not isinstance(defs[0], ast.ClassDef):
            return False
        return self._code(defs[0])

    def _torch_layer(self, func: ast.expr) -> bool:
        """`func` is a class of torch.nn (imported at module level; its arguments are looked at
        apart): torch's own layers hold a BatchNorm only where one is named."""
        if isinstance(func, ast.Name):
            if self.function is not None and func.id in self.local_names():
                return False
            defs = self.module_defs.get(func.id, [])
            if len(defs) != 1 or not isinstance(defs[0], ast.ImportFrom) or defs[0].level:
                return False
            qualname = next((f"{defs[0].module}.{a.name}" for a in defs[0].names
                             if (a.asname or a.name) == func.id), "")
        else:
            root = func
            while isinstance(root, ast.Attribute):
                root = root.value
            if not isinstance(root, ast.Name) or len(self.module_defs.get(root.id, [])) != 1 or (
                    self.function is not None and root.id in self.local_names()):
                return False
            qualname = _dotted_import(func, self.module_defs) or ""
        return qualname.startswith("torch.nn.") and qualname[9:10].isupper() and _allowed(qualname)

    def _model_name(self, name: str, depth: int) -> bool:
        """A local of the wrap's function assigned only a model built here (and itself again),
        and read before the wrap only as a module is read."""
        function = self.function
        if name in {a.arg for a in _arguments(function)} or name in self.declared():
            return False
        own = {id(node) for node in self.own_nodes()}
        if any(isinstance(node, ast.Name) and node.id == name and id(node) not in own for node in walk(function)):
            return False  # a function or lambda in it uses the model: not followed
        parents = {}
        for node in self.own_nodes():
            for child in ast.iter_child_nodes(node):
                parents[id(child)] = node
        child = self.statement
        while id(child) in parents:
            child = parents[id(child)]
            if isinstance(child, (ast.For, ast.AsyncFor, ast.While)):
                return False  # a wrap in a loop: what a pass assigns reaches the next one
        wrap = {id(node) for node in ast.walk(self.statement)}
        built = False
        for node in self.own_nodes():
            if id(node) in wrap or (isinstance(node, ast.expr) and node.lineno > self.statement.lineno):
                continue  # the wrap, and what runs after it, change nothing it wrapped
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
                return False
            if isinstance(node, ast.alias) and (node.asname or node.name.split(".")[0]) == name:
                return False
            if not (isinstance(node, ast.Name) and node.id == name):
                continue
            parent = parents.get(id(node))
            if not isinstance(node.ctx, ast.Load):
                if not (isinstance(parent, ast.Assign) and parent.targets == [node]):
                    return False  # a loop variable, an unpacking, `with ... as`, `del`
                value = _strip_chain(parent.value)
                if isinstance(value, ast.Name) and value.id == name:
                    continue
                if not self.built_here(value, depth + 1):
                    return False
                built = True
            elif not self._module_read(node, parent, parents):
                return False
        return built

    def _module_read(self, node: ast.Name, parent: ast.AST | None, parents: dict) -> bool:
        if isinstance(parent, ast.Call) and parent.func is node:
            return True  # model(x)
        if isinstance(parent, ast.Attribute) and parent.attr in _READS | _RETURNS_SELF:
            return isinstance(parents.get(id(parent)), ast.Call)
        return False

    def _values(self, values: list[ast.expr], depth: int) -> bool:
        """The names in a construction's arguments, where the wrap runs."""
        for value in values:
            for node in ast.walk(value):
                if isinstance(node, _SCOPES):
                    return False
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and not self._value_name(node, depth):
                    return False
        return True

    def _value_name(self, node: ast.Name, depth: int) -> bool:
        name = node.id
        if self.function is None or name not in self.local_names():
            return self._global(name)
        if depth >= _DEPTH or name in {a.arg for a in _arguments(self.function)} or name in self.declared():
            return False
        assigned = []
        for stmt in self.own_nodes():
            if isinstance(stmt, ast.Name) and stmt.id == name and not isinstance(stmt.ctx, ast.Load):
                assigned.append(stmt)
        values = []
        for stmt in self.own_nodes():
            if isinstance(stmt, ast.Assign) and any(t in assigned for t in stmt.targets):
                if len(stmt.targets) != 1 or not isinstance(stmt.targets[0], ast.Name):
                    return False
                values.append(stmt.value)
        if len(values) != len(assigned):
            return False  # bound otherwise: a loop, an unpacking, an import, a parameter
        return self._values(values, depth + 1)

    def _global(self, name: str) -> bool:
        """A module-level name (or a builtin) read by the model's code."""
        defs = self.module_defs.get(name)
        if not defs:
            return hasattr(builtins, name) and name not in _DYNAMIC and name != "getattr"
        for stmt in defs:
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                if not self._imported(stmt, name):
                    return False
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if not self._code(stmt):
                    return False
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
                if not self._code(stmt):
                    return False
            else:
                return False  # bound in an if, a loop, a try: not followed
        return True

    def _imported(self, stmt: ast.Import | ast.ImportFrom, name: str) -> bool:
        for alias in stmt.names:
            if (alias.asname or alias.name.split(".")[0]) != name:
                continue
            if isinstance(stmt, ast.ImportFrom):
                if stmt.level:
                    return False  # the project's own module: not shown here
                qualname = f"{stmt.module}.{alias.name}"
            else:
                qualname = alias.name if alias.asname else alias.name.split(".")[0]
            return _allowed(qualname)
        return False

    def _code(self, node: ast.AST) -> bool:
        """Every name a class, function or module-level assignment of this file reads is shown."""
        if id(node) in self.seen:
            return True
        self.seen.add(id(node))
        local = set()
        for sub in walk(node):
            if isinstance(sub, ast.Name) and not isinstance(sub.ctx, ast.Load):
                local.add(sub.id)
            elif isinstance(sub, ast.arg):
                local.add(sub.arg)
            elif isinstance(sub, ast.ExceptHandler) and sub.name:
                local.add(sub.name)
            elif isinstance(sub, (ast.Import, ast.ImportFrom)) and sub is not node:
                return False  # an import inside the model's code: not followed
            elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and sub is not node:
                local.add(sub.name)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            local.discard(node.name)
        for sub in walk(node):
            if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id == "getattr":
                if len(sub.args) < 2 or not isinstance(sub.args[1], ast.Constant):
                    return False
            if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id not in local:
                dotted = _dotted_import(sub, self.module_defs)
                if dotted is not None and not _allowed(dotted):
                    return False
            # A local of one method may be a module-level name in another: both are followed.
            if (isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load)
                    and (sub.id not in local or sub.id in self.module_defs)):
                if sub.id != "getattr" and not self._global(sub.id):
                    return False
        return True


def _allowed(qualname: str) -> bool:
    root = qualname.split(".")[0]
    return root in _ALLOWED_ROOTS and not any(qualname == d or qualname.startswith(d + ".") for d in _DENIED)


def _dotted_import(node: ast.Attribute, module_defs: dict) -> str | None:
    """`torch.hub.load` of `import torch`: the qualified name an attribute chain on a module-level
    `import` reads (None for anything else)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    for stmt in module_defs.get(node.id, []):
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.asname == node.id:
                    return ".".join([alias.name, *reversed(parts)])
                if alias.asname is None and alias.name.split(".")[0] == node.id:
                    return ".".join([node.id, *reversed(parts)])
        elif isinstance(stmt, ast.ImportFrom) and not stmt.level:
            for alias in stmt.names:
                if (alias.asname or alias.name) == node.id:
                    return ".".join([f"{stmt.module}.{alias.name}", *reversed(parts)])
    return None


def _bound_by(stmt: ast.stmt) -> list[str]:
    """The names a module-level statement binds (an `if`, a loop, a `try`: every name bound in
    it, so that such a name is not followed)."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [stmt.name]
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return [a.asname or a.name.split(".")[0] for a in stmt.names if a.name != "*"]
    names = []
    for node in _own_nodes(ast.Module(body=[stmt], type_ignores=[])):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.append(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.alias):
            names.append(node.asname or node.name.split(".")[0])
    return names


def _arguments(function: ast.AST) -> list[ast.arg]:
    args = function.args
    return [*args.posonlyargs, *args.args, *args.kwonlyargs, *filter(None, [args.vararg, args.kwarg])]


def _declared(function: ast.AST, own_nodes: list[ast.AST]) -> set[str]:
    return {name for node in own_nodes if isinstance(node, (ast.Global, ast.Nonlocal)) for name in node.names}


def _local_names(function: ast.AST, own_nodes: list[ast.AST], declared: set[str]) -> set[str]:
    """The names a function binds itself (its parameters included; `own_nodes`: `_own_nodes` of
    it, `declared`: its global and nonlocal names)."""
    names = {a.arg for a in _arguments(function)}
    for node in own_nodes:
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.split(".")[0])
    return names - declared
