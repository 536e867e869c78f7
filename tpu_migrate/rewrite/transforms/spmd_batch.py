"""Which values of a training step hold one row per sample of the batch a loop marks (TPU184).

Under SPMD `xs.mark_sharding(x, mesh, ("fsdp", None))` is a layout: the program still computes
on the whole global batch, the unmarked labels included. Once each process keeps its slice of
`x` (spmd.py), every other value the step reads per sample must be sliced with it, or the loss
pairs 16 inputs with 32 labels. A value counts as per sample where it comes from where `x` comes
from: the loop's element (`for step, (x, y) in enumerate(loader)`), one value unpacked into
several (`x, y = batch`), what the loop's element holds (`x = batch["x"]`: then `batch` itself
is sliced where the step reads more of it), or containers indexed alike by the loop's index
(`x = X[i * B:(i + 1) * B]`, `y = Y[i * B:(i + 1) * B]`). Where `x` comes from none of these
(`x = torch.randn(...)`, `x = next(it)`), the per-sample values are unknown: only `x` is sliced,
with a TODO naming the other values the step reads from the loop (none: no TODO, since a value
made outside the loop is the same every step, not a part of this step's batch).

Only names bound on every path to the mark count (the statements before it in its blocks, and
`with` bodies among them), and only what the step reads after the mark is sliced.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field


@dataclass
class StepValues:
    """What the marking slices: `together` (source texts, the marked value or the element it is
    part of first), and, where the tool cannot tell where the marked value comes from, what
    else the step reads from the loop after the mark (`unknown`: `labels[i]`, `y`), for the
    TODO. (Nothing: the step reads no other value of the iteration, so none is per sample.)"""

    together: list[str]
    unknown: list[str] = field(default_factory=list)


def per_sample_values(marked: ast.expr, mark: ast.stmt, chain: list[ast.AST],
                      other_marks: list[ast.expr]) -> StepValues:
    """The values to slice with `marked`, the tensor the statement `mark` marks; `chain`: the
    statements from the training loop down to the mark's parent; `other_marks`: the tensors the
    loop's other markings slice themselves (left to them)."""
    loop = chain[0]
    index, data = _loop_names(loop)
    groups = _Groups(index)
    groups.union(*data)
    bound = set(index) | set(data)
    for statement in _bound_before(chain, mark):
        groups.link(statement, bound)
        bound |= {name for target in _targets(statement) for name in _names(target)}
    root = _root(marked)
    first = ast.unparse(marked)
    reads = _reads_after(loop, mark)
    other_roots = {_root(other) for other in other_marks}
    own = {ast.unparse(other) for other in other_marks} | {name for name in other_roots if name}
    # A part of the loop's element marked (`batch["input_ids"]`) while the step reads more of
    # it (`model(**batch)`): the element goes whole (unless another marking takes another part).
    if root != first and root not in other_roots and any(
            name == root and first not in through for name, through in reads):
        first = root
    family = groups.members(root)
    others = [name for name in dict.fromkeys(name for name, _ in reads)
              if name in family and name in bound and name not in (root, first, *index, *own)]
    unknown = []
    if not groups.known(root, data):
        unknown = [name for name in dict.fromkeys(name for name, _ in reads)
                   if name in bound and name not in (*family, *index, *own)]
        unknown += _indexed_reads(loop, mark, index, first)
    return StepValues([first, *others], unknown)


def _loop_names(loop: ast.AST) -> tuple[set[str], list[str]]:
    """(the loop's index names, the names its element binds): `for i in range(n)` binds an index
    only; `for step, batch in enumerate(loader)` an index and an element."""
    target, iterable = loop.target, loop.iter
    called = ast.unparse(iterable.func) if isinstance(iterable, ast.Call) else ""
    if called == "range":
        return _names(target), []
    if called == "enumerate" and isinstance(target, (ast.Tuple, ast.List)) and len(target.elts) == 2:
        return _names(target.elts[0]), sorted(_names(target.elts[1]))
    return set(), sorted(_names(target))


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _targets(statement: ast.Assign | ast.AnnAssign) -> list[ast.expr]:
    return statement.targets if isinstance(statement, ast.Assign) else [statement.target]


class _Groups:
    """Union-find over the loop's names (and `[index]` nodes: containers indexed alike by the
    loop's index): one group per place per-sample values come from."""

    def __init__(self, index: set[str]):
        self.index = index
        self.parent: dict[str, str] = {}
        self.unpacked: set[str] = set()  # names unpacked together from one value

    def find(self, name: str) -> str:
        self.parent.setdefault(name, name)
        while self.parent[name] != name:
            self.parent[name] = self.parent[self.parent[name]]
            name = self.parent[name]
        return name

    def union(self, *names: str) -> None:
        for name in names[1:]:
            self.parent[self.find(name)] = self.find(names[0])
        if names:
            self.find(names[0])

    def members(self, name: str | None) -> set[str]:
        if name is None:
            return set()
        root = self.find(name)
        return {n for n in list(self.parent) if self.find(n) == root}

    def known(self, name: str | None, data: list[str]) -> bool:
        """Whether `name` comes from a place that holds several per-sample values."""
        if name is None:
            return False
        family = self.members(name)
        return bool(family & (set(data) | self.unpacked)) or any(n.startswith("[") for n in family)

    def link(self, statement: ast.Assign | ast.AnnAssign, bound: set[str]) -> None:
        """Names assigned from the loop's values join their sources' group; names unpacked from
        one value join each other's (`x, y = batch`, `x, y = next(it)`)."""
        value = statement.value
        if value is None:
            return
        for target in _targets(statement):
            if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)) \
                    and len(target.elts) == len(value.elts):
                for part, source in zip(target.elts, value.elts):  # `x, y = x.to(d), y.to(d)`
                    self.union(*sorted(_names(part)), *self._sources(source, bound))
            elif isinstance(target, (ast.Tuple, ast.List)):
                names = sorted(_names(target))
                self.union(*names, *self._sources(value, bound))
                if len(names) > 1:
                    self.unpacked.update(names)
            elif isinstance(target, ast.Name):
                self.union(target.id, *self._sources(value, bound))

    def _sources(self, value: ast.expr, bound: set[str]) -> list[str]:
        """What a value is made from: the loop's names read in it (its index aside:
        `batches[step][0]` is not made from another sample), and `[index]` for a container
        indexed by the loop's index (`data[i * B:(i + 1) * B]`)."""
        found = {n.id for n in ast.walk(value) if isinstance(n, ast.Name) and n.id in bound - self.index}
        found |= {"[" + ast.unparse(n.slice) + "]" for n in ast.walk(value)
                  if isinstance(n, ast.Subscript) and self.index & _names(n.slice)}
        return sorted(found)


def _bound_before(chain: list[ast.AST], mark: ast.stmt) -> Iterator[ast.Assign | ast.AnnAssign]:
    """The assignments that run on every path from the top of the loop's body to the mark:
    those before it in each block that holds it, and in `with` bodies among them."""
    path = [*chain, mark]
    for holder, held in zip(path, path[1:]):
        for block in ("body", "orelse", "finalbody"):
            statements = getattr(holder, block, None) or []
            if any(statement is held for statement in statements):
                yield from _straight(statements[:next(i for i, s in enumerate(statements) if s is held)])
                break


def _straight(statements: list[ast.stmt]) -> Iterator[ast.Assign | ast.AnnAssign]:
    for statement in statements:
        if isinstance(statement, (ast.With, ast.AsyncWith)):
            yield from _straight(statement.body)
        elif isinstance(statement, (ast.Assign, ast.AnnAssign)):
            yield statement


def _root(expr: ast.expr) -> str | None:
    while isinstance(expr, (ast.Attribute, ast.Subscript)):
        expr = expr.value
    return expr.id if isinstance(expr, ast.Name) else None


def _after(node: ast.AST, mark: ast.stmt) -> bool:
    return (node.lineno, node.col_offset) >= (mark.end_lineno, mark.end_col_offset)


def _reads_after(loop: ast.AST, mark: ast.stmt) -> list[tuple[str, set[str]]]:
    """(name, the expressions it is read through) for each read of a name after the mark in the
    loop body: `batch["labels"].to(d)` gives ("batch", {'batch["labels"]', 'batch["labels"].to',
    ...}); `model(**batch)` gives ("batch", {"batch"})."""
    parents: dict[int, ast.AST] = {}
    for node in ast.walk(loop):
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
    reads = []
    for statement in loop.body:
        for node in ast.walk(statement):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and _after(node, mark):
                through, outer = {node.id}, node
                while isinstance(parent := parents.get(id(outer)), (ast.Attribute, ast.Subscript)) \
                        and parent.value is outer:
                    outer = parent
                    through.add(ast.unparse(outer))
                reads.append((node.id, through))
    return reads


def _indexed_reads(loop: ast.AST, mark: ast.stmt, index: set[str], marked: str) -> list[str]:
    """What the step reads after the mark by the loop's index (`labels[i]`, `batches[step][1]`):
    as likely per sample as the marked value, for the TODO."""
    found: list[str] = []
    for statement in loop.body:
        for node in ast.walk(statement):
            if isinstance(node, ast.Subscript) and _after(node, mark) and index & _names(node.slice):
                text = ast.unparse(node)
                if text != marked and not any(text in other for other in found):
                    found.append(text)
    return found


def marks_in(loop: ast.AST, mark: ast.stmt, slices_itself: Callable[[ast.Expr], ast.expr | None]) -> list[ast.expr]:
    """The tensors that the loop's other markings slice, by `slices_itself`: a call statement's
    marked tensor where it becomes a slice, else None."""
    found = []
    for node in ast.walk(loop):
        if isinstance(node, ast.Expr) and node is not mark and isinstance(node.value, ast.Call):
            marked = slices_itself(node)
            if marked is not None:
                found.append(marked)
    return found
