"""The expression walk: apply the rules inside one statement (or one compound header).

The walk is generic: a call, a reference or a piece of syntax reaches the rule that handles
it through the registry (tpu_migrate/rewrite/registry.py): by the rule the catalog finds for
its qualified name, by a registered `calls=` name, or by the hooks registered on its kind.
"""

from __future__ import annotations

import dataclasses

import libcst as cst

from tpu_migrate.rewrite import transforms
from tpu_migrate.rewrite.constant_tests import folded
from tpu_migrate.rewrite.context import StatementContext, cst_dotted
from tpu_migrate.rewrite.registry import REGISTRY
from tpu_migrate.rewrite.transforms.common import LOOSE, is_xla

HOOKS = REGISTRY.hooks


# Nodes that never contain anything a rule rewrites: tokens, whitespace, comments, leaves.
_LEAVES = (
    cst.BaseParenthesizableWhitespace,
    cst.TrailingWhitespace,
    cst.EmptyLine,
    cst.Comment,
    cst.Newline,
    cst.Name,
    cst.Integer,
    cst.Float,
    cst.Imaginary,
    cst.SimpleString,
    cst.Dot,
    cst.Comma,
    cst.LeftParen,
    cst.RightParen,
    cst.LeftSquareBracket,
    cst.RightSquareBracket,
    cst.LeftCurlyBrace,
    cst.RightCurlyBrace,
    cst.BaseBinaryOp,
    cst.BaseBooleanOp,
    cst.BaseCompOp,
    cst.BaseUnaryOp,
    cst.BaseAugOp,
    cst.AssignEqual,
    cst.Colon,
    cst.Semicolon,
    cst.ImportStar,
    # Bodies of compound statements are separate statements, rewritten on their own.
    cst.IndentedBlock,
    cst.SimpleStatementSuite,
    cst.Else,
    cst.Finally,
)
_LEAVES_SET = frozenset(_LEAVES)
# isinstance() against libcst's abstract base classes dominated this walk; match exact types.
# Built from the classes' MROs: issubclass() against those ABCs cost 24 ms of every start-up
# (libcst registers no virtual subclasses, so the MRO says the same).
_NODE_TYPES = frozenset(
    obj for obj in vars(cst).values()
    if isinstance(obj, type) and cst.CSTNode in obj.__mro__ and not getattr(obj, "__abstractmethods__", None)
)
_LEAF_TYPES = frozenset(t for t in _NODE_TYPES if not _LEAVES_SET.isdisjoint(t.__mro__))
_SKIPPED_FIELDS = ("whitespace", "lpar", "rpar", "leading_lines", "comma", "semicolon", "header", "footer")
_FIELDS: dict[type, tuple[str, ...]] = {}


def _child_fields(cls: type) -> tuple[str, ...]:
    names = _FIELDS.get(cls)
    if names is None:
        names = tuple(
            f.name for f in dataclasses.fields(cls)
            if not any(skip in f.name for skip in _SKIPPED_FIELDS)
        )
        _FIELDS[cls] = names
    return names


def map_children(node: cst.CSTNode, fn) -> cst.CSTNode:
    """`node` with `fn` applied to each child node (whitespace and tokens skipped), rebuilt only
    when a child changed."""
    changes = {}
    for name in _child_fields(type(node)):
        value = getattr(node, name)
        if type(value) in _NODE_TYPES:
            new = fn(value)
            if new is not value:
                changes[name] = new
        elif type(value) in (list, tuple) and value and type(value[0]) in _NODE_TYPES:
            items = [fn(item) for item in value]
            if any(a is not b for a, b in zip(items, value)):
                changes[name] = items
    return node.with_changes(**changes) if changes else node


# Where a plain name is a value read (`wrap = checkpoint_module if c else (lambda m: m)`): the
# fields of these nodes that hold it. Names elsewhere (attributes, keywords, parameters,
# targets) are never references, and calls' names and arguments have their own paths.
_VALUE_FIELDS: dict[type, tuple[str, ...]] = {
    cst.IfExp: ("body", "orelse"), cst.Assign: ("value",), cst.AnnAssign: ("value",),
    cst.Return: ("value",), cst.Element: ("value",), cst.DictElement: ("value",),
}
# Expressions a conversion inside may make constant (constant_tests.folded).
_FOLDABLE = frozenset({cst.Comparison, cst.BooleanOperation, cst.UnaryOperation})
# Expressions whose parts may run several times or not at all.
_CONDITIONAL_CODE = frozenset({
    cst.Lambda, cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp, cst.IfExp,
    cst.BooleanOperation,
})


class ExprRewriter:
    """Applies expression-level rules inside one statement (or one compound header).

    A lean post-order walk instead of a libcst CSTTransformer: it skips whitespace and tokens
    and rebuilds a node only when a child changed. Measured about 3x cheaper per statement,
    and this walk is the main cost of rewriting a file beyond the parse and print.
    """

    def __init__(self, sc: StatementContext, root: cst.CSTNode, statement_call=None):
        self.sc = sc
        self.root = root
        # The call of an expression statement, left for statement-level rules.
        self.statement_call = statement_call
        self.loose: set[int] = set()
        self.call_funcs: set[int] = set()  # a call's own name is handled by leave_Call
        self.deferred: set[int] = set()  # calls left to a statement-level rule
        # The statement's plain-name references (`checkpoint_module` after a from-import).
        self.plain_refs = frozenset(ref.dotted for ref in sc.info.refs if "." not in ref.dotted)

    def rewrite(self, node):
        if type(node) in _FOLDABLE:
            # A conversion inside may make the test constant: it is then written as its value,
            # and the modules the thrown-away code used are not imported for it.
            used = self.sc.file.import_plan.used()
            updated = self._rewrite(node)
            value = folded(node, updated)
            if value is not updated:
                self.sc.file.import_plan.restore(used)
            return value
        return self._rewrite(node)

    def _rewrite(self, node):
        kind = type(node)
        if kind in _LEAF_TYPES:
            return node
        if self.plain_refs and kind in _VALUE_FIELDS:
            node = self._plain_values(node, _VALUE_FIELDS[kind])
        if kind is cst.Attribute and cst_dotted(node) is not None:
            # Nothing inside `torch.utils.data` can change; the whole name may be renamed.
            if id(node) in self.call_funcs:
                return node
            return self.reference(node)
        if kind is cst.Arg and type(node.value) is cst.Name:
            # A name passed as an argument (`partial(size_based_auto_wrap_policy, ...)`): rename
            # rules apply to it.
            value = self.name_argument(node.value)
            return node if value is node.value else node.with_changes(value=value)
        if kind is cst.If and node is not self.root:
            return node  # an `elif` is a statement of its own
        if kind in _CONDITIONAL_CODE:
            self.sc.hoist_blocked += 1
            try:
                updated = map_children(node, self.rewrite)
            finally:
                self.sc.hoist_blocked -= 1
            leave = _LEAVE.get(kind)
            return leave(self, node, updated) if leave is not None else updated
        if kind is cst.Call:
            self.call_funcs.add(id(node.func))
            qualname = self.sc.resolve(node.func)
            if qualname is not None and is_xla(qualname):
                return self.xla_call(node)
        updated = map_children(node, self.rewrite)
        leave = _LEAVE.get(type(node))
        return leave(self, node, updated) if leave is not None else updated

    def xla_call(self, node: cst.Call) -> cst.BaseExpression:
        """A call of torch_xla: if no rule replaces it, it stays for a human exactly as it was,
        arguments included (`xm.all_reduce(xm.REDUCE_SUM, x, groups=g)` must not come out with
        a converted constant inside a call that still needs torch_xla)."""
        snapshot = self.sc.snapshot()
        updated = map_children(node, self.rewrite)
        result = self.leave_Call(node, updated)
        if result is updated and updated is not node and id(node) not in self.deferred:
            self.sc.rollback(snapshot)
            return node
        return result

    def reference(self, node: cst.BaseExpression) -> cst.BaseExpression:
        """A dotted name that is not called: rename rules and manual rules apply to it."""
        sc = self.sc
        qualname = sc.resolve(node)
        rule = sc.file.catalog.lookup(qualname)
        if rule is None or not (rule.rename or rule.transform in REGISTRY.reference or rule.safety == "manual"):
            return node
        if not sc.may_fix(rule, qualname):
            return node
        return self._wrap(transforms.apply_reference_rule(rule, qualname, node, sc))

    def _plain_values(self, node: cst.CSTNode, fields: tuple[str, ...]) -> cst.CSTNode:
        changes = {}
        for field in fields:
            value = getattr(node, field)
            if type(value) is cst.Name and value.value in self.plain_refs:
                new = self.name_argument(value)
                if new is not value:
                    changes[field] = new
        return node.with_changes(**changes) if changes else node

    def name_argument(self, node: cst.Name) -> cst.BaseExpression:
        """A plain name read as a value (a call's argument, a class's base, an assigned or
        returned value, a branch of `x if c else y`): rename rules and the transforms written
        for a name used as a value apply; any other rule's name stays for the leftover report
        (TPU099)."""
        sc = self.sc
        qualname = sc.resolve(node)
        rule = sc.file.catalog.lookup(qualname)
        if rule is None or not (rule.rename or rule.transform in REGISTRY.reference):
            return node
        if not sc.may_fix(rule, qualname):
            return node
        return self._wrap(transforms.apply_reference_rule(rule, qualname, node, sc))

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        sc = self.sc
        if id(original) in sc.handled:
            return updated
        qualname = sc.resolve(updated.func)
        for hook in HOOKS["call"]:
            claimed = hook(updated, qualname, sc)
            if claimed is not None:
                return claimed
        if qualname is not None:
            rule = sc.file.catalog.lookup(qualname)
            if rule is not None and rule.rename:
                if not sc.may_fix(rule, qualname):
                    return updated
                new_func = transforms.apply_reference_rule(rule, qualname, updated.func, sc)
                return updated.with_changes(func=new_func)
            if rule is not None:
                if original is self.statement_call and rule.transform in REGISTRY.statement and (
                    isinstance(self.root, cst.Expr) or rule.transform in REGISTRY.assign
                ) and transforms.spmd_change(rule, qualname, sc) is None:
                    self.deferred.add(id(original))
                    return updated  # the statement-level rule takes the whole statement
                if not sc.may_fix(rule, qualname):
                    return updated
                return self._wrap(transforms.apply_call_rule(rule, qualname, updated, sc))
            special = REGISTRY.qualname_calls.get(qualname)
            if special is not None:
                return self._wrap(special(updated, sc))
        for hook in HOOKS["arguments"]:
            updated = hook(updated, sc)
        return self._wrap(updated)

    def leave_FormattedString(self, original, updated):
        """Before Python 3.12 an f-string's expressions cannot reuse its quote character, and
        replacements bring their own strings (`torch.device("tpu")`): swap their quotes."""
        if updated is original or len(updated.start.lstrip("rfbuRFBU")) == 3:
            return updated
        quote = updated.start[-1]
        other = "'" if quote == '"' else '"'
        parts = [
            part.with_changes(expression=_requote(part.expression, quote, other))
            if isinstance(part, cst.FormattedStringExpression) else part
            for part in updated.parts
        ]
        return updated.with_changes(parts=parts)

    def hooks(self, kind: str, node):
        """`node` through the hooks registered on its kind, in order."""
        for hook in HOOKS[kind]:
            node = hook(node, self.sc)
        return node

    def leave_Param(self, original: cst.Param, updated: cst.Param) -> cst.Param:
        return self.hooks("param", updated)

    def leave_Comparison(self, original, updated) -> cst.BaseExpression:
        for hook in HOOKS["comparison"]:
            updated = hook(original, updated, self.sc)
            if type(updated) is not cst.Comparison:
                return self._wrap(updated)  # the test became another expression
        return updated

    def leave_Subscript(self, original, updated):
        return self.hooks("subscript", updated)

    def leave_Dict(self, original, updated):
        return self.hooks("dict", updated)

    # -- parentheses ------------------------------------------------------------------------
    # Replacements such as `a if c else b` are parenthesised where they land, and the
    # parentheses are dropped again where the expression stands alone (argument, assignment).

    def _wrap(self, node: cst.BaseExpression) -> cst.BaseExpression:
        if isinstance(node, LOOSE) and not node.lpar:
            node = node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            self.loose.add(id(node))
        return node

    def _unwrapped(self, node, field: str):
        value = getattr(node, field)
        if value is not None and id(value) in self.loose:
            return node.with_changes(**{field: value.with_changes(lpar=[], rpar=[])})
        return node

    def leave_Arg(self, original, updated):
        return self._unwrapped(updated, "value")

    def leave_Assign(self, original, updated):
        return self.hooks("assign", self._unwrapped(updated, "value"))

    def leave_AnnAssign(self, original, updated):
        return self.hooks("assign", self._unwrapped(updated, "value"))

    def leave_Return(self, original, updated):
        return self.hooks("return", self._unwrapped(updated, "value"))

    def leave_Element(self, original, updated):
        return self.hooks("element", updated)

    def leave_DictElement(self, original, updated):
        return self.hooks("dict_element", updated)

    def leave_Expr(self, original, updated):
        return self._unwrapped(updated, "value")

    def leave_If(self, original, updated):
        test = updated.test
        for hook in HOOKS["if_test"]:
            test = hook(test, self.sc)
        if test is not updated.test:
            updated = updated.with_changes(test=self._wrap(test))
        return self._unwrapped(updated, "test")

    def leave_ClassDef(self, original, updated):
        for hook in HOOKS["class_header"]:
            updated = hook(updated, self.sc)
        return updated

    def leave_Assert(self, original, updated):
        return self._unwrapped(updated, "test")

    def leave_While(self, original, updated):
        return self._unwrapped(updated, "test")


# ExprRewriter's leave_<node type> methods, by node type (no attribute lookup by name per node).
_LEAVE = {kind: getattr(ExprRewriter, "leave_" + kind.__name__) for kind in _NODE_TYPES
          if hasattr(ExprRewriter, "leave_" + kind.__name__)}


def _requote(node, quote: str, other: str):
    """Rewrite the simple strings under `node` that use `quote` to use `other`."""
    if isinstance(node, cst.SimpleString):
        prefix = node.prefix
        body = node.value[len(prefix):]
        if body.startswith(quote) and other not in body and "\\" not in body:
            return cst.SimpleString(prefix + other + body[1:-1] + other)
        return node
    if type(node) in _LEAF_TYPES:
        return node
    return map_children(node, lambda child: _requote(child, quote, other))
