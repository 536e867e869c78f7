"""Which numbers of a line the original prints are computed from what a reduction over the
processes returned (`total = xm.mesh_reduce(...); count = xm.mesh_reduce(...); print(total /
count)`): said of the original's lines, as guards.py says which are printed once, from the
source of the frame that prints (recorder.py notes it per printed line; printed.py places the
numbers; compare.py holds the ranks to agree on them, as on a value a reduction returned).

Read statically, because a value computed from a reduced one is a new float the recorder cannot
follow without changing what the program holds. A name is reduced at a line where its last
binding above that line (in the file's order) is a reduction's result (`xm.mesh_reduce`,
`xm.all_reduce`, `dist.all_reduce` in place, an `all_gather`), or an expression that reads a
name reduced there (arithmetic, `.item()`, `np.mean(...)`; `+=` keeps what it was). Only
assignments carry it: a value that a reduced one influenced otherwise (a loss of a model whose
gradients were averaged) is no reduced value, and differs between the ranks by design.

What the printing statement prints is cut into parts: its literal text and its values (a print's
arguments, an f-string's fields, `%` and `.format` fields), each value reduced or not, so that
printed.py marks only the numbers of the reduced values (an epoch number beside them stays the
original's to compare). A print through a function of the program's own (`log(f"...")`) is
known as a whole: its parts are None.
"""

from __future__ import annotations

import ast
import re
import string

REDUCTIONS = frozenset({"mesh_reduce", "all_reduce", "all_gather", "all_gather_object", "all_reduce_coalesced"})
PRINTS = frozenset({"print", "master_print"})  # they print their arguments as they are
PERCENT = re.compile(r"%%|%(?:\([^)]*\))?[-#0 +]*(?:\*|\d+)?(?:\.(?:\*|\d+))?[hlL]?[diouxXeEfFgGcrsa]")

_files: dict[str, _File | None] = {}
_answers: dict[tuple[str, int], list | None | bool] = {}


def printed_parts(frame, is_library):
    """For the line the code at `frame` prints: False where no value of it was reduced; else its
    parts (`[["lit", "eval rmse "], ["val", True]]`), or None where the program prints through a
    function of its own (the parts unknown). `is_library(filename)`: frames not the program's."""
    while frame is not None:
        filename = frame.f_code.co_filename
        if not is_library(filename):
            key = (filename, frame.f_lineno)
            if key not in _answers:
                if filename not in _files:
                    _files[filename] = _File.read(filename)
                found = _files[filename]
                _answers[key] = False if found is None else found.parts(frame.f_lineno)
            if _answers[key] is not False:
                return _answers[key]
        frame = frame.f_back
    return False


class _File:
    def __init__(self, tree: ast.Module):
        self.statements = [n for n in ast.walk(tree) if isinstance(n, ast.stmt) and not _blocks(n)]
        self.bindings: dict[str, list[tuple[int, str, ast.AST | None]]] = {}  # name -> (line, kind, value)
        for node in ast.walk(tree):
            self._bind(node)
        for events in self.bindings.values():
            events.sort(key=lambda event: event[0])

    @classmethod
    def read(cls, filename: str) -> _File | None:
        try:
            with open(filename, encoding="utf-8") as handle:
                return cls(ast.parse(handle.read()))
        except (OSError, SyntaxError, ValueError, UnicodeDecodeError, RecursionError):
            return None

    def _bind(self, node: ast.AST) -> None:
        def bind(targets, kind, value):
            for name in bound_names(targets):
                self.bindings.setdefault(name, []).append((node.lineno, kind, value))

        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            bind(targets, "reduce" if _reduces(node.value) else "assign", node.value)
        elif isinstance(node, ast.AugAssign):
            bind([node.target], "reduce" if _reduces(node.value) else "augment", node.value)
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            bind([node.target], "reduce" if _reduces(node.iter) else "assign", node.iter)
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and _called(node.value) in REDUCTIONS:
            # In place: dist.all_reduce(total); xm.all_reduce(xm.REDUCE_SUM, [a, b]) (torch_xla's
            # single tensor is returned, not changed: its first argument names the reduction).
            args = node.value.args
            xla_form = bool(args) and isinstance(args[0], ast.Attribute) and args[0].attr.startswith("REDUCE_")
            for arg in args:
                if isinstance(arg, (ast.List, ast.Tuple)):
                    bind([arg], "reduce", None)
                elif not xla_form and _root(arg) is not None:  # dist.all_reduce(stats[0]): stats
                    bind([ast.Name(_root(arg))], "reduce", None)

    def reduced(self, node: ast.AST, line: int, seen: frozenset = frozenset()) -> bool:
        """Whether the expression, evaluated at `line`, computes from a reduction's result."""
        if _reduces(node):
            return True
        return any(self._name_reduced(name, line, seen) for name in _values(node))

    def _name_reduced(self, name: str, line: int, seen: frozenset) -> bool:
        if (name, line) in seen or len(seen) > 50:
            return False
        seen = seen | {(name, line)}
        before = [event for event in self.bindings.get(name, ()) if event[0] < line]
        if not before:
            return False
        at, kind, value = before[-1]
        if kind == "reduce":
            return True
        if kind == "augment" and self._name_reduced(name, at, seen):
            return True
        return value is not None and self.reduced(value, at, seen)

    def parts(self, line: int):
        """What the statement at `line` prints (printed_parts), False where it prints no reduced value."""
        statement = min((s for s in self.statements if s.lineno <= line <= (s.end_lineno or s.lineno)),
                        key=lambda s: (s.end_lineno or s.lineno) - s.lineno, default=None)
        if statement is None:
            return False
        calls = [n for n in ast.walk(statement) if isinstance(n, ast.Call)]
        printing = next((c for c in calls if _called(c) in PRINTS), None)
        if printing is None:  # a function of the program's own that prints what it is given
            made = next((c for c in calls if isinstance(c.func, ast.Name)), None)
            return None if made is not None and any(self.reduced(a, line) for a in made.args) else False
        sep = next((k.value for k in printing.keywords if k.arg == "sep"), None)
        separator = sep.value if isinstance(sep, ast.Constant) and isinstance(sep.value, str) else " "
        parts: list[list] = []
        for index, arg in enumerate(printing.args):
            if index:
                parts.append(["lit", separator])
            parts += self._parts(arg, line)
        if not any(kind == "val" and flag for kind, flag in parts):
            return False
        merged: list[list] = []
        for kind, value in parts:
            if merged and kind == "lit" == merged[-1][0]:
                merged[-1][1] += value
            else:
                merged.append([kind, value])
        return merged

    def _parts(self, node: ast.AST, line: int) -> list[list]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [["lit", node.value]]
        if isinstance(node, ast.JoinedStr):
            return [["lit", v.value] if isinstance(v, ast.Constant) else ["val", self.reduced(v.value, line)]
                    for v in node.values]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and _text(node):
            return self._parts(node.left, line) + self._parts(node.right, line)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and isinstance(node.left, ast.Constant) \
                and isinstance(node.left.value, str):
            values = node.right.elts if isinstance(node.right, ast.Tuple) else [node.right]
            return self._fields(PERCENT, node.left.value, values, {}, line)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format" \
                and isinstance(node.func.value, ast.Constant) and isinstance(node.func.value.value, str):
            keywords = {k.arg: k.value for k in node.keywords if k.arg}
            return self._fields(None, node.func.value.value, node.args, keywords, line)
        return [["val", self.reduced(node, line)]]

    def _fields(self, pattern, text: str, values: list, keywords: dict, line: int) -> list[list]:
        """A `%` format's or a `str.format`'s literal text and fields, each field's value reduced or not."""
        parts, following = [], iter(values)
        if pattern is not None:  # %
            start = 0
            for match in pattern.finditer(text):
                parts.append(["lit", text[start:match.start()]])
                start = match.end()
                if match.group() == "%%":
                    parts.append(["lit", "%"])
                else:
                    value = next(following, None)
                    parts.append(["val", value is not None and self.reduced(value, line)])
            parts.append(["lit", text[start:]])
            return parts
        try:
            fields = list(string.Formatter().parse(text))
        except ValueError:
            return [["val", any(self.reduced(v, line) for v in [*values, *keywords.values()])]]
        for literal, name, _, _ in fields:
            parts.append(["lit", literal])
            if name is None:
                continue
            base = re.split(r"[.\[]", name, maxsplit=1)[0]
            value = (next(following, None) if base == "" else values[int(base)] if base.isdigit()
                     and int(base) < len(values) else keywords.get(base))
            parts.append(["val", value is not None and self.reduced(value, line)])
        return parts


def _text(node: ast.AST) -> bool:
    """Whether a `+` joins text (a literal string on one side)."""
    return any(isinstance(side, ast.JoinedStr) or isinstance(side, ast.Constant) and isinstance(side.value, str)
               for side in (node.left, node.right))


def _blocks(node: ast.stmt) -> bool:
    return any(isinstance(getattr(node, name, None), list) for name in ("body", "orelse", "handlers", "cases"))


def _called(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _reduces(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) and _called(n) in REDUCTIONS for n in ast.walk(node))


def _values(node: ast.AST) -> set[str]:
    """The names an expression reads for their values (not the functions it calls)."""
    called = {id(n.func) for n in ast.walk(node) if isinstance(n, ast.Call)}
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and id(n) not in called}


def _root(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def bound_names(targets) -> set[str]:
    """The plain names assignment targets bind (a tuple's, a starred one's)."""
    out, todo = set(), list(targets)
    while todo:
        target = todo.pop()
        if isinstance(target, (ast.Tuple, ast.List)):
            todo += target.elts
        elif isinstance(target, ast.Starred):
            todo.append(target.value)
        elif isinstance(target, ast.Name):  # not `x.a = ...`: x is more than what it holds there
            out.add(target.id)
    return out
