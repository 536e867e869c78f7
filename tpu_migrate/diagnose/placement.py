"""Would this tensor live on the TPU? A reading of the program's source, for the native backend
when the CPU stands in for the TPU and every tensor is a CPU tensor.

On a TPU a tensor lives on the device when it was moved there (`.to(device)`, `.cuda()`,
`.tpu()`, `module.to(device)`), created there (`device=`), or computed from such tensors; the
rest (`losses = torch.zeros(eval_iters)`, `.cpu()` copies) stays on the host, and reading it
waits for nothing. The source says which: each name gets the join of what is assigned to it
(flow-insensitive), a user function the join of what it returns, and a read is classified by
the expression of the statement that reads.

A device object counts as where it points: `torch.device("tpu")` and
`torch.accelerator.current_accelerator()` are the device, `torch.device("cpu")` the host, so a
call given the program's device (a device loader, `make_batch(device)`) makes device tensors.
A program that names no device at all (no `.to(...)`, no `device=`) is taken to run wholly on
the device: the CPU stands in for it.
"""

from __future__ import annotations

import ast
import functools

NEUTRAL, HOST, UNKNOWN, DEVICE = "neutral", "host", "unknown", "device"  # in join order
_ORDER = {NEUTRAL: 0, HOST: 1, UNKNOWN: 2, DEVICE: 3}
MOVES = ("to", "cuda", "tpu", "xpu")
HOST_COPIES = ("cpu", "numpy")
SCALARS = ("item", "tolist")  # Python numbers: neutral (they take the place of what they join)
# Calls whose value is the program's device (the migrated `torch.accelerator.current_accelerator(
# check_available=True) or torch.device("cpu")`): what is made with it lives there, a loader's
# batches too (`_DeviceLoader(loader, device)`).
DEVICE_QUERIES = ("current_accelerator", "current_device")
FACTORIES = ("zeros", "ones", "empty", "full", "rand", "randn", "randint", "randperm", "arange",
             "linspace", "logspace", "eye", "tensor", "as_tensor", "from_numpy", "empty_strided")


def join(*kinds: str) -> str:
    return max(kinds, key=_ORDER.__getitem__, default=NEUTRAL)


def _is_cpu_literal(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and node.value.split(":")[0] == "cpu"
    if isinstance(node, ast.Call) and node.args:  # torch.device("cpu")
        return isinstance(node.func, ast.Attribute) and node.func.attr == "device" and _is_cpu_literal(node.args[0])
    return False


def _copies_to_the_host(call: ast.Call) -> bool:
    """`t.to("cpu")`, `t.to(device="cpu")`, `t.to(torch.device("cpu"))`."""
    if not (isinstance(call.func, ast.Attribute) and call.func.attr == "to"):
        return False
    target = _device_keyword(call) or (call.args[0] if call.args else None)
    return target is not None and _is_cpu_literal(target)


def _is_dtype(node: ast.AST) -> bool:
    """`torch.float32`, `torch.bfloat16`, ...: a .to() that changes the type, not the place."""
    return (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id == "torch" and node.attr[:1].islower() and node.attr.rstrip("0123456789")
            in {"float", "half", "bfloat", "int", "long", "bool", "double", "uint", "complex", "short"})


def _device_keyword(call: ast.Call) -> ast.AST | None:
    return next((k.value for k in call.keywords if k.arg == "device"), None)


class _Scope:
    def __init__(self, node: ast.AST, parent: "_Scope | None"):
        self.node, self.parent = node, parent
        self.sources: dict[str, list] = {}  # name -> assigned expressions (or a kind)
        self.params: set[str] = set()
        self.globals: set[str] = set()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            arguments = node.args
            self.params = {a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)}
            self.params |= {a.arg for a in (arguments.vararg, arguments.kwarg) if a is not None}
        body = node.body if isinstance(node.body, list) else []
        for statement in body:
            self._collect(statement)

    def _assign(self, target: ast.AST, source) -> None:
        if isinstance(target, ast.Name):
            self.sources.setdefault(target.id, []).append(source)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._assign(element, source)
        elif isinstance(target, ast.Starred):
            self._assign(target.value, source)
        elif isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
            self.sources.setdefault(target.value.id, []).append(source)  # out[split] = value

    def _collect(self, node: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            self.sources.setdefault(node.name, []).append(NEUTRAL)
            return
        if isinstance(node, ast.Global):
            self.globals.update(node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if node.value is not None:
                    self._assign(target, node.value)
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            self._assign(node.target, node.iter)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                if item.optional_vars is not None:
                    self._assign(item.optional_vars, item.context_expr)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                self.sources.setdefault((alias.asname or alias.name).split(".")[0], []).append(NEUTRAL)
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            call = node.value  # model.to(device): modules move in place
            if (isinstance(call.func, ast.Attribute) and call.func.attr in MOVES
                    and isinstance(call.func.value, ast.Name)):
                self.sources.setdefault(call.func.value.id, []).append(call)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt) or isinstance(child, ast.excepthandler):
                self._collect(child)


class Module:
    """One source file, read once."""

    def __init__(self, tree: ast.Module):
        self.tree = tree
        self.root = _Scope(tree, None)
        self.functions = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        self.scopes: dict[ast.AST, _Scope] = {}
        self.places = any(_places(node) for node in ast.walk(tree))
        self._busy: set = set()
        self._memo: dict = {}

    def scope_of(self, function: ast.AST | None) -> _Scope:
        if function is None:
            return self.root
        scope = self.scopes.get(function)
        if scope is None:
            scope = self.scopes[function] = _Scope(function, self.root)
        return scope

    def name(self, scope: _Scope, name: str) -> str:
        if name in scope.globals:
            scope = self.root
        key = (id(scope), name)
        if key in self._memo:
            return self._memo[key]
        if key in self._busy:  # x = x.to(device): the other assignments decide
            return NEUTRAL
        if name in scope.params:
            return self.parameter(scope.node, name)
        sources = scope.sources.get(name)
        if sources is None:
            return self.name(scope.parent, name) if scope.parent is not None else NEUTRAL
        self._busy.add(key)
        try:
            kind = join(*(s if isinstance(s, str) else self.expression(s, scope) for s in sources))
        finally:
            self._busy.discard(key)
        self._memo[key] = kind
        return kind

    def parameter(self, function: ast.AST, name: str) -> str:
        """A parameter is what the file's calls of its function pass it (`_train_update(device,
        step, loss, ...)` with the loss of a device batch), joined; UNKNOWN where no call of it
        is seen (a callback, a method, a function of another file)."""
        key = ("param", id(function), name)
        if key in self._memo:
            return self._memo[key]
        if key in self._busy or not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return UNKNOWN
        self._busy.add(key)
        arguments = function.args
        positional = [a.arg for a in (*arguments.posonlyargs, *arguments.args)]
        kinds = []
        for call in self._calls_of(function.name):
            passed = next((k.value for k in call.keywords if k.arg == name), None)
            if passed is None and name in positional and positional.index(name) < len(call.args):
                passed = call.args[positional.index(name)]
                if any(isinstance(a, ast.Starred) for a in call.args[:positional.index(name) + 1]):
                    passed = None
            if passed is not None:
                caller, _ = self.statement_at(call.lineno)
                kinds.append(self.expression(passed, self.scope_of(caller)))
        self._busy.discard(key)
        kind = join(*kinds) if kinds else UNKNOWN
        self._memo[key] = kind
        return kind

    def _calls_of(self, function_name: str) -> list[ast.Call]:
        calls = self._memo.get(("calls", function_name))
        if calls is None:
            calls = self._memo[("calls", function_name)] = [
                n for n in ast.walk(self.tree)
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == function_name]
        return calls

    def returns(self, function: ast.AST) -> str:
        key = ("return", id(function))
        if key in self._memo:
            return self._memo[key]
        if key in self._busy:
            return NEUTRAL
        self._busy.add(key)
        scope = self.scope_of(function)
        values = [n.value for n in _own_nodes(function) if isinstance(n, ast.Return) and n.value is not None]
        kind = join(*(self.expression(v, scope) for v in values))
        self._busy.discard(key)
        self._memo[key] = kind
        return kind

    def expression(self, node: ast.AST, scope: _Scope) -> str:
        if isinstance(node, ast.Constant):
            return NEUTRAL
        if isinstance(node, ast.Name):
            return self.name(scope, node.id)
        if isinstance(node, ast.Attribute):
            return self.expression(node.value, scope)
        if isinstance(node, ast.Call):
            return self._call(node, scope)
        if isinstance(node, (ast.Lambda, ast.FunctionDef)):
            return NEUTRAL
        return join(*(self.expression(child, scope) for child in ast.iter_child_nodes(node)
                      if isinstance(child, ast.expr)))

    def _call(self, call: ast.Call, scope: _Scope) -> str:
        func = call.func
        arguments = [*call.args, *(k.value for k in call.keywords)]
        device = _device_keyword(call)
        if isinstance(func, ast.Attribute):
            receiver = func.value
            if func.attr in MOVES:
                places = [a for a in call.args if not _is_dtype(a)] + ([device] if device is not None else [])
                if func.attr != "to" or places:
                    host = any(_is_cpu_literal(p) or self.expression(p, scope) == HOST for p in places)
                    return HOST if host else DEVICE
                return self.expression(receiver, scope)
            if func.attr in HOST_COPIES:
                return HOST
            if func.attr in SCALARS:
                return NEUTRAL
            if func.attr in DEVICE_QUERIES:  # torch.accelerator.current_accelerator(): the device
                return DEVICE
            if isinstance(receiver, ast.Name) and receiver.id == "torch":
                if func.attr == "device" and call.args:  # torch.device("tpu"): a device, the CPU apart
                    return HOST if _is_cpu_literal(call) else DEVICE
                if device is not None:  # device=device, where the program's device may be the CPU
                    return HOST if _is_cpu_literal(device) or self.expression(device, scope) == HOST else DEVICE
                if func.attr in FACTORIES:
                    return HOST
                if func.attr.endswith("_like") and call.args:
                    return self.expression(call.args[0], scope)
                return join(*(self.expression(a, scope) for a in arguments))
            return join(self.expression(receiver, scope), *(self.expression(a, scope) for a in arguments))
        if isinstance(func, ast.Name) and func.id in self.functions and self.name(scope, func.id) == NEUTRAL:
            return self.returns(self.functions[func.id])
        return join(self.expression(func, scope), *(self.expression(a, scope) for a in arguments))

    def statement_at(self, line: int) -> tuple[ast.AST | None, ast.AST | None]:
        """The innermost function holding `line`, and the statement (or compound statement's
        header) there."""
        function, found = None, None
        for node in ast.walk(self.tree):
            if not (isinstance(node, ast.stmt) and node.lineno <= line <= (node.end_lineno or node.lineno)):
                continue
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.body[0].lineno <= line:
                if function is None or node.lineno >= function.lineno:
                    function = node
            elif not isinstance(node, ast.ClassDef) and (found is None or node.lineno >= found.lineno):
                found = node
        return function, found

    def destinations(self) -> list[str]:
        """Where each call that places a tensor sends it (DEVICE or HOST): `model.to(device)` is
        HOST where `device = torch.device("cpu")`."""
        kinds = []
        for node in ast.walk(self.tree):
            if _places(node):
                function, _ = self.statement_at(node.lineno)
                kinds.append(self.expression(node, self.scope_of(function)))
        return kinds

    def calls_of(self, functions) -> list[tuple[int, str]]:
        """(line, name) of each call of torch.<name> for a name in `functions`."""
        return sorted({(n.lineno, n.func.attr) for n in ast.walk(self.tree) if isinstance(n, ast.Call)
                       and isinstance(n.func, ast.Attribute) and n.func.attr in functions
                       and isinstance(n.func.value, ast.Name) and n.func.value.id == "torch"})

    def assignment_line(self, name: str, line: int) -> int | None:
        """The last line at or before `line`, in the function holding it, that assigns `name`."""
        function, _ = self.statement_at(line)
        nodes = _own_nodes(function) if function is not None else ast.walk(self.tree)
        lines = [node.lineno for node in nodes
                 if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For, ast.With))
                 and node.lineno <= line and name in _assigned_names(node)]
        return max(lines, default=None)

    def names_read_at(self, line: int) -> list[str]:
        """The names the statement at `line` reads (an assignment's value, a header's expression)."""
        _, statement = self.statement_at(line)
        if statement is None:
            return []
        if isinstance(statement, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            parts = [statement.value] if statement.value is not None else []
        elif isinstance(statement, (ast.For, ast.AsyncFor)):
            parts = [statement.iter]
        else:
            parts = [c for c in ast.iter_child_nodes(statement) if isinstance(c, ast.expr)]
        names = [n.id for p in parts for n in ast.walk(p) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]
        return list(dict.fromkeys(names))

    def read_at(self, line: int) -> str:
        """Where the tensors a statement reads would live."""
        function, statement = self.statement_at(line)
        if statement is None:
            return UNKNOWN
        scope = self.scope_of(function)
        if isinstance(statement, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            parts = [statement.value] if statement.value is not None else []
        elif isinstance(statement, (ast.If, ast.While)):
            parts = [statement.test]
        elif isinstance(statement, (ast.For, ast.AsyncFor)):
            parts = [statement.iter]
        elif isinstance(statement, (ast.With, ast.AsyncWith)):
            parts = [item.context_expr for item in statement.items]
        else:
            parts = [c for c in ast.iter_child_nodes(statement) if isinstance(c, ast.expr)]
        # loss.item(), h.cpu(), h.to("cpu"): the tensor read is the receiver, whatever the result is.
        receivers = [n.func.value for p in parts for n in ast.walk(p) if isinstance(n, ast.Call)
                     and isinstance(n.func, ast.Attribute) and (n.func.attr in (*SCALARS, *HOST_COPIES)
                                                                or _copies_to_the_host(n))]
        kind = join(*(self.expression(p, scope) for p in (*parts, *receivers)))
        return UNKNOWN if kind == NEUTRAL else kind


def _own_nodes(function: ast.AST):
    """The nodes of a function, not those of the functions and classes it defines."""
    stack = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))


def _assigned_names(statement: ast.AST) -> set[str]:
    if isinstance(statement, ast.Assign):
        targets = statement.targets
    elif isinstance(statement, ast.With):
        targets = [i.optional_vars for i in statement.items if i.optional_vars is not None]
    else:
        targets = [statement.target]
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def _places(node: ast.AST) -> bool:
    """A call that puts something on a device: x.to(device), .cuda(), f(..., device=...)."""
    if not isinstance(node, ast.Call):
        return False
    device = _device_keyword(node)
    if device is not None and not _is_cpu_literal(device):
        return True
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr in MOVES:
        places = [a for a in node.args if not _is_dtype(a)]
        return func.attr != "to" or any(not _is_cpu_literal(p) for p in places)
    return False


@functools.lru_cache(maxsize=None)
def module(filename: str) -> Module | None:
    try:
        with open(filename, "rb") as handle:
            return Module(ast.parse(handle.read(), filename))
    except (OSError, SyntaxError, ValueError):
        return None


def read_kind(filename: str, line: int, program_places: bool) -> str:
    """DEVICE, HOST or UNKNOWN for the read at filename:line. A program that places nothing
    anywhere (`program_places` False) runs wholly on the device."""
    if not program_places:
        return DEVICE
    parsed = module(filename)
    return UNKNOWN if parsed is None else parsed.read_at(line)


def _statement(filename: str, line: int) -> ast.AST | None:
    """The statement (or compound statement's header) at filename:line, if the file parses."""
    parsed = module(filename)
    return parsed.statement_at(line)[1] if parsed is not None else None


def host_copy_at(filename: str, line: int) -> bool:
    """Whether the statement at filename:line writes a copy to the CPU (`t.to("cpu")`): a
    `torch.device("cpu")` or `"cpu"` the program computed (its own device choice, which the CPU
    answers here) is not one."""
    statement = _statement(filename, line)
    return statement is not None and any(isinstance(n, ast.Call) and _copies_to_the_host(n)
                                         for n in ast.walk(statement))


def names_the_cpu(filename: str, line: int) -> bool:
    """Whether the statement at filename:line names the CPU as a device (`"cpu"`,
    `torch.device("cpu")`) in a call: a library choosing the host on purpose."""
    statement = _statement(filename, line)
    return statement is not None and any(
        isinstance(node, ast.Call) and any(_is_cpu_literal(a) for a in (*node.args, *(k.value for k in node.keywords)))
        for node in ast.walk(statement))


def program_places(filenames) -> bool:
    return any(m is not None and m.places for m in map(module, filenames))


def host_only(filenames) -> bool:
    """Whether the program places tensors and every place it names is the host (its device is
    `torch.device("cpu")`): the CPU standing in then stands in for nothing."""
    kinds = [kind for m in map(module, filenames) if m is not None and m.places for kind in m.destinations()]
    return bool(kinds) and all(kind == HOST for kind in kinds)
