"""The rules that need code, registered by decorator: the dispatch tables the walker uses.

A rule in rules/*.toml that needs code names a `transform`; here each function that implements
one declares which, what triggers it and which findings it writes:

    @transform("torch_compile", calls=("torch.compile",))
    def torch_compile(call, sc): ...

Triggers (each fixes the function's signature):

- a rule's own `matches` (the catalog finds the rule, the rule names the transform), by form:
  CALL `(call, qualname, sc, rule) -> expression`, STATEMENT `(call, qualname, sc, rule, plans)
  -> statements | None` (with `assign=True` it also takes `name = call(...)`, given as
  `assign=`), REFERENCE `(node, qualname, sc, rule) -> expression` for a name not called;
- `calls=(qualified names, ...)`: calls of names outside the rules' `matches` (torch's own),
  `(call, sc) -> expression`; these names flag their statements for the walk;
- `on=<site>` (see SITES): a hook the walker runs on every node of that sort in the
  statements it visits, in `order` (then registration order).

What every function knows besides its node, from its StatementContext `sc`: the statement's
original ast node (`sc.info.node`), its position as findings give positions (`sc.where`: line,
1-based column; names.finding_position for any ast node), the statements that hold it
(`sc.ancestors`), and the input position of an "xla" literal (`sc.consume_string(spelled)`).

`strings=(...)`, beside a trigger: string constants that flag their statement for the walk
(torch_xla's environment variables), as torch_xla references and "xla..." strings do.

Codes: a function writes the findings of the rules whose `transform` it implements, read from
the rule object, or as literals where no rule object is at hand; it declares any other rule's
code it writes in `emits`. A helper that writes a finding declares it with `@emits(...)`.
`check` (run by engine.flagged_names before the rewrite uses a catalog) refuses rules whose
`transform` names no registered function and declared codes no rule defines;
tests/test_registry.py keeps code literals inside those declarations.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

from tpu_migrate.rewrite.named_expressions import PLACEHOLDERS
from tpu_migrate.rules import template_fields

# Forms of the rules triggered by their own `matches`.
CALL = "call"
STATEMENT = "statement"
REFERENCE = "reference"

# The sites a hook can run on (sorts of syntax), and what each hook is called with and returns.
SITES = {
    # A call whose qualified name may be None, before any rule: `(call, qualname, sc)` ->
    # replacement, or None to go on.
    "call": "claims a call before the rules",
    # A call no rule and no `calls=` function took: `(call, sc)` -> the call, maybe changed.
    "arguments": "the arguments of any other call",
    # `(original, updated, sc)` -> updated; a result that is no Comparison ends the chain.
    "comparison": "a comparison",
    # `(node, sc)` -> node, for each of these.
    "dict": "a dict display",
    "subscript": "a subscript",
    "param": "a function parameter",
    "assign": "an assignment (plain or annotated)",
    "return": "a return statement",
    "element": "an element of a list, tuple or set display",
    "dict_element": "a key: value element of a dict display",
    # `(test, sc)` -> test; a new test is parenthesised where needed.
    "if_test": "the test of an if",
    # `(class, sc)` -> the class statement.
    "class_header": "a class statement's header (its bases)",
    # `(small, sc)` -> replacement statements, or None to leave it to the rules.
    "statement": "a small statement, before the rules",
    # `(result, sc)` -> result: a small statement some rule changed.
    "rewritten": "a small statement some rule changed",
    # `(with, sc)` -> the statement, or the list of statements replacing it.
    "with": "a with statement",
    # `(for, sc, plans, expr_rewriter)` -> (for, statements to put first in its body).
    "loop": "a for loop",
    # `(for, sc)` -> the statements that replace the whole loop, or None to go on.
    "replace_loop": "a for loop replaced as a whole",
}


class RegistryError(Exception):
    """A transform is registered twice or with a malformed trigger (a bug in the package)."""


@dataclass(frozen=True)
class Entry:
    transform: str  # the `transform` of rules/*.toml this function implements
    function: Callable
    form: str | None = None  # CALL, STATEMENT, REFERENCE
    assign: bool = False
    calls: tuple[str, ...] = ()
    on: str | None = None
    order: int = 0
    emits: tuple[str, ...] = ()
    strings: tuple[str, ...] = ()


class Registry:
    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.call: dict[str, Callable] = {}
        self.statement: dict[str, Callable] = {}
        self.assign: set[str] = set()
        self.reference: dict[str, Callable] = {}
        self.qualname_calls: dict[str, Callable] = {}
        self._hooks: dict[str, list[Entry]] = defaultdict(list)
        self.hooks: dict[str, tuple[Callable, ...]] = {site: () for site in SITES}
        # Codes written by helpers (`@emits`), by function.
        self.helper_codes: dict[Callable, tuple[str, ...]] = {}
        self.module_codes: set[str] = set()  # `rule_code(...)` constants

    def add(self, entry: Entry) -> None:
        triggers = (entry.form is not None) + bool(entry.calls) + (entry.on is not None)
        if triggers != 1:
            raise RegistryError(f"{entry.function.__name__}: give one of form, calls or on")
        if entry.on is not None and entry.on not in SITES:
            raise RegistryError(f"{entry.function.__name__}: unknown hook site {entry.on!r}")
        table = {CALL: self.call, STATEMENT: self.statement, REFERENCE: self.reference}.get(entry.form)
        if entry.form is not None and table is None:
            raise RegistryError(f"{entry.function.__name__}: unknown form {entry.form!r}")
        if table is not None:
            if entry.transform in table:
                raise RegistryError(f"transform {entry.transform!r} has two {entry.form} functions")
            table[entry.transform] = entry.function
            if entry.assign:
                self.assign.add(entry.transform)
        for name in entry.calls:
            if name in self.qualname_calls:
                raise RegistryError(f"two functions for calls of {name}")
            self.qualname_calls[name] = entry.function
        if entry.on is not None:
            hooks = self._hooks[entry.on]
            hooks.append(entry)
            hooks.sort(key=lambda e: e.order)  # stable: registration order within an order
            self.hooks[entry.on] = tuple(e.function for e in hooks)
        self.entries.append(entry)

    @property
    def transforms(self) -> frozenset[str]:
        return frozenset(e.transform for e in self.entries)

    def declared_codes(self) -> set[str]:
        """Codes the Python declares beyond the rules it implements (`emits`, `@emits`,
        `rule_code`)."""
        codes = {c for e in self.entries for c in e.emits}
        codes.update(c for group in self.helper_codes.values() for c in group)
        return codes | self.module_codes


REGISTRY = Registry()


def transform(
    name: str, *, form: str | None = None, assign: bool = False, calls: tuple[str, ...] = (),
    on: str | None = None, order: int = 0, emits: tuple[str, ...] = (), strings=(),
):
    """Register the decorated function as (part of) the transform `name`."""

    def register(function: Callable) -> Callable:
        REGISTRY.add(Entry(name, function, form, assign, tuple(calls), on, order, tuple(emits),
                           tuple(sorted(strings))))
        return function

    return register


def emits(*codes: str):
    """Declare the rule codes a helper writes findings for, or asks whether they are enabled."""

    def declare(function: Callable) -> Callable:
        REGISTRY.helper_codes[function] = codes
        return function

    return declare


def rule_code(code: str) -> str:
    """A rule code used outside a transform (a module constant): declared, checked at load."""
    REGISTRY.module_codes.add(code)
    return code


def trigger_names() -> frozenset[str]:
    """Names outside torch_xla whose statements the walk visits (besides the rules' `matches`)."""
    return frozenset(REGISTRY.qualname_calls)


def trigger_strings() -> frozenset[str]:
    """String constants whose statements the walk visits (besides torch_xla's and "xla...")."""
    return frozenset(s for entry in REGISTRY.entries for s in entry.strings)


def check(catalog) -> list[str]:
    """What does not resolve between the rules and the registered code: each `transform` of
    rules/*.toml names registered functions, and each code the Python declares a rule. (A
    registered transform no rule names is allowed: the tests that prove the differential
    harness catches a broken rule take a rule's `transform` away.)"""
    problems = []
    codes = {rule.code for rule in catalog.rules}
    for rule in catalog.rules:
        if rule.transform and rule.transform not in REGISTRY.transforms:
            problems.append(f"{rule.source}: rule {rule.code}: transform {rule.transform!r} names no "
                            "registered function (tpu_migrate/rewrite/transforms/)")
    for declared in sorted(REGISTRY.declared_codes() - codes):
        problems.append(f"the code declares rule {declared}, which rules/*.toml does not define")
    for rule in catalog.rules:  # a misspelt placeholder ({oss}) would fill nothing, or fail per call
        allowed = PLACEHOLDERS | {*rule.params, *(f"{p}_atom" for p in rule.params)}
        for where, fields in template_fields(rule).items():
            unknown = sorted(fields - allowed)
            if unknown:
                problems.append(f"{rule.source}: rule {rule.code}: '{where}' uses unknown placeholder(s) "
                                + ", ".join("{" + f + "}" for f in unknown))
    return problems


__all__ = [
    "CALL", "STATEMENT", "REFERENCE", "SITES", "REGISTRY", "Registry", "RegistryError",
    "transform", "emits", "rule_code", "trigger_names", "trigger_strings", "check",
]
