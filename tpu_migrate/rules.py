"""Load the rule tables in rules/*.toml into Rule objects.

Rules are data: codes, names, matched qualified names, templates and explanations live in TOML so
they can be reviewed and extended without reading the engine. A rule that needs code names a
transform: functions of tpu_migrate/rewrite/transforms/ registered under that name
(tpu_migrate/rewrite/registry.py). The rewrite refuses a catalog whose `transform`s name no
registered function (rewrite/engine.py: flagged_names); loading here stays data only, so that
`tpu-migrate rules` and `explain` need not import libcst.

A file is a family: `[family]` (what users call it, what it converts) then its rules; the code of
rules/<family>.toml is tpu_migrate/rewrite/transforms/<family>.py (rules/README.md).
"""

from __future__ import annotations

import os
import string
import tomllib
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path

SAFETY_LEVELS = ("safe", "unsafe", "manual")
TARGETS = ("tpu", "portable")


class RuleError(Exception):
    """A rule table is malformed."""


class TomlError(ValueError):
    """A TOML document that cannot be read; the message names the line."""


# What `loads_toml` may spend finding where an unclosed value opened: characters parsed.
_SEARCH_BUDGET = 2_000_000


def loads_toml(text: str) -> dict:
    """tomllib.loads, for the rule files and the configuration, whose every error names a line
    (TomlError): tomllib says only "(at end of document)" of a value left open, and a value
    nested a few hundred levels deep (legal TOML) exhausts its recursion."""
    try:
        return tomllib.loads(text)
    except RecursionError:
        line = _deepest_line(text)
        raise TomlError("cannot be read: a value is nested too deeply for Python's TOML parser"
                        + (f" (at line {line})" if line else "")) from None
    except tomllib.TOMLDecodeError as exc:
        message = f"invalid TOML: {exc}"
    end = "(at end of document)"
    if message.endswith(end):
        last = text.rstrip().count("\n") + 1
        opened = _unclosed_since(text)
        where = f"at the end of the document, line {last}"
        if opened is not None and opened < last:
            where += f"; what is left open starts at line {opened}"
        message = f"{message[:-len(end)]}({where})"
    raise TomlError(message)


def _unclosed_since(text: str) -> int | None:
    """The line where the statement that runs to the end of `text` starts: the one after the
    longest prefix of whole lines that parses (a prefix that ends inside a value never does)."""
    lines = text.splitlines(keepends=True)
    spent = 0
    for count in range(len(lines) - 1, -1, -1):
        prefix = "".join(lines[:count])
        spent += len(prefix)
        if spent > _SEARCH_BUDGET:
            return None
        try:
            tomllib.loads(prefix)
        except (tomllib.TOMLDecodeError, RecursionError):
            continue
        return count + 1
    return None


def _deepest_line(text: str, depth: int = 100) -> int | None:
    """The first line at which brackets and braces (quotes not considered) are `depth` deep."""
    level = 0
    for number, line in enumerate(text.splitlines(), 1):
        for char in line:
            level += (char in "[{") - (char in "]}")
            if level >= depth:
                return number
    return None


@dataclass(frozen=True)
class Rule:
    code: str
    name: str
    summary: str
    safety: str
    explanation: str
    matches: tuple[str, ...] = ()
    match_prefixes: tuple[str, ...] = ()  # every name under these modules
    replace: dict[str, str] = field(default_factory=dict)
    rename: dict[str, str] = field(default_factory=dict)
    params: tuple[str, ...] = ()
    transform: str | None = None
    # The converted value is a plain number or bool with torch_xla's meaning (a rank, a count):
    # a name bound to it may go to calls left to torch_xla (rewrite/flows.py).
    plain_value: bool = False
    # The converted code also runs, with the same meaning, in a program still on torch_xla's
    # runtime (a torch.optim optimizer, a pure-Python helper): `--fix-level safe` applies it in a
    # file whose unsafe fixes wait. Every other conversion goes with them (engine.py).
    also_on_torch_xla: bool = False
    # What the value was in a program that runs SPMD (one process drove every device of a host),
    # where TorchTPU's one process per TPU answers differently: such a call is left with a TODO
    # that says so (transforms/__init__.py).
    under_spmd: str | None = None
    # The matched names `under_spmd` speaks for, where the rule matches names that meant different
    # things under SPMD (`xr.global_device_count()` was 1, `xr.global_runtime_device_count()` not);
    # empty: every name the rule matches.
    under_spmd_for: tuple[str, ...] = ()
    source: str = ""  # the table's file name: <family>.toml

    @property
    def family(self) -> str:
        return self.source.removesuffix(".toml")

    def spmd_meaning(self, qualname: str) -> str | None:
        """What the call of `qualname` answered in a program that ran SPMD, where converting it
        would change that; None where the conversion keeps its meaning there too."""
        if self.under_spmd_for and qualname not in self.under_spmd_for:
            return None
        return self.under_spmd


@dataclass(frozen=True)
class Family:
    name: str  # the table's file name without .toml, and its code's module name
    title: str  # what users call it
    summary: str  # what it converts, with examples (Markdown)


class Catalog:
    """All rules, indexed by code and by the qualified names they match."""

    def __init__(self, rules: tuple[Rule, ...], module_aliases: dict[str, str], families: tuple[Family, ...] = ()):
        self.rules = rules
        self.module_aliases = module_aliases
        self.families = {family.name: family for family in families}  # in the order of their first code
        self.by_qualname: dict[str, Rule] = {
            name: rule for rule in rules for name in rule.matches
        }
        self.rule_names = frozenset(self.by_qualname)
        self._alias_roots = tuple({name.split(".")[0] for name in module_aliases}) or ("\0",)
        self._by_prefix: dict[str, Rule] = {
            prefix: rule for rule in rules for prefix in rule.match_prefixes
        }
        self._by_code: dict[str, Rule] = {}
        for rule in rules:
            self._by_code.setdefault(rule.code, rule)

    def lookup(self, qualname: str | None) -> Rule | None:
        """The rule for a qualified name: an exact match, else the longest module prefix."""
        if not qualname:
            return None
        rule = self.by_qualname.get(qualname)
        if rule is not None:
            return rule
        parts = qualname.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            rule = self._by_prefix.get(".".join(parts[:cut]))
            if rule is not None:
                return rule
        return None

    @property
    def codes(self) -> frozenset[str]:
        return frozenset(self._by_code)

    def by_code(self, code: str) -> Rule:
        return self._by_code[code]  # KeyError for an unknown code

    def canonical(self, qualname: str) -> str:
        """Map a historical spelling (`torch_xla_py.xla_model.x`) to the canonical one."""
        if not qualname.startswith(self._alias_roots):
            return qualname
        parts = qualname.split(".")
        for cut in range(len(parts), 0, -1):
            prefix = ".".join(parts[:cut])
            if prefix in self.module_aliases:
                return ".".join([self.module_aliases[prefix], *parts[cut:]])
        return qualname


def rules_dir() -> Path:
    """rules/ next to the package in a checkout, or the copy packed into the wheel.

    TPU_MIGRATE_RULES_DIR points elsewhere: for developing rules, and for the tests that
    mutate a rule to prove the differential harness catches it.
    """
    override = os.environ.get("TPU_MIGRATE_RULES_DIR")
    if override:
        return Path(override)
    checkout = Path(__file__).resolve().parent.parent / "rules"
    if (checkout / "aliases.toml").is_file():
        return checkout
    return Path(str(resources.files("tpu_migrate") / "_rules"))


def examples_dir() -> Path:
    """fixtures/rewrite/ (each rule's before/after cases) in a checkout, or the wheel's copy."""
    checkout = Path(__file__).resolve().parent.parent / "fixtures" / "rewrite"
    if checkout.is_dir():
        return checkout
    return Path(str(resources.files("tpu_migrate") / "_fixtures" / "rewrite"))


def rule_examples(rule: Rule) -> list[Path]:
    """The rule's fixture inputs (`<case>.in.py`); the expected outputs sit beside them."""
    return sorted(examples_dir().glob(f"{rule.code}-*/*.in.py"))


@lru_cache(maxsize=None)
def load_catalog(directory: str | None = None) -> Catalog:
    root = Path(directory) if directory else rules_dir()
    rules: list[Rule] = []
    aliases: dict[str, str] = {}
    families: dict[str, Family] = {}
    for path in sorted(root.glob("*.toml")):
        try:
            data = loads_toml(path.read_text(encoding="utf-8"))
        except TomlError as exc:
            raise RuleError(f"{path}: {exc}") from None
        unknown = sorted(set(data) - set(_FILE_KEYS))
        loose = [key for key in unknown if not isinstance(data[key], (dict, list))]
        if loose:
            raise RuleError(f"{path.name}: key(s) {', '.join(loose)} outside any table (they go in [family] or a [[rule]])")
        if unknown:
            raise RuleError(f"{path.name}: unknown table(s) {', '.join(unknown)} (a rule table is [[rule]])")
        aliases.update(data.get("modules", {}))
        if "rule" in data or "family" in data:
            families[path.stem] = _family_from_table(data.get("family"), path)
        for table in data.get("rule", []):
            rules.append(_rule_from_table(table, path))
    codes = [r.code for r in rules]
    duplicates = {c for c in codes if codes.count(c) > 1}
    if duplicates:
        raise RuleError(f"duplicate rule codes: {', '.join(sorted(duplicates))}")
    rules.sort(key=lambda r: r.code)
    order = dict.fromkeys([rule.family for rule in rules] + list(families))
    return Catalog(tuple(rules), aliases, tuple(families[name] for name in order))


# Every key a rule table may have, and its type; anything else is a mistake (`[rule.replce]`)
# that would otherwise load and quietly change what the rule does.
_KEYS = {"code": str, "name": str, "summary": str, "safety": str, "explanation": str, "matches": list,
         "match_prefixes": list, "replace": dict, "rename": dict, "params": list, "transform": str,
         "plain_value": bool, "also_on_torch_xla": bool, "under_spmd": str,
         "under_spmd_for": list}
_FILE_KEYS = ("family", "rule", "modules")
_FAMILY_KEYS = ("title", "summary")


def _family_from_table(table, path: Path) -> Family:
    where = f"{path.name}: [family]"
    if not isinstance(table, dict):
        raise RuleError(f"{path.name}: a file of rules starts with a [family] table ({', '.join(_FAMILY_KEYS)})")
    for key in table:
        if key not in _FAMILY_KEYS:
            raise RuleError(f"{where}: unknown key '{key}' (known: {', '.join(_FAMILY_KEYS)})")
    for key in _FAMILY_KEYS:
        if not isinstance(table.get(key), str) or not table[key].strip():
            raise RuleError(f"{where}: missing string field '{key}'")
    return Family(path.stem, table["title"], " ".join(table["summary"].split()))


def _check_table(table: dict, where: str) -> None:
    """One line naming the file, the rule and the key for the first thing wrong."""
    for key, value in table.items():
        kind = _KEYS.get(key)
        if kind is None:
            raise RuleError(f"{where}: unknown key '{key}' (known: {', '.join(_KEYS)})")
        if not isinstance(value, kind) or (kind is list and not all(isinstance(v, str) for v in value)):
            raise RuleError(f"{where}: '{key}' must be {'a list of strings' if kind is list else kind.__name__}")
    fixes = [key for key in ("replace", "rename", "transform") if key in table]
    if table.get("safety") in ("safe", "unsafe") and not fixes:
        raise RuleError(f"{where}: a {table['safety']} rule needs 'replace', 'rename' or 'transform' to fix with")
    if table.get("safety") == "manual" and ("replace" in table or "rename" in table):
        raise RuleError(f"{where}: a manual rule fixes nothing: it cannot have '{fixes[0]}'")
    if "under_spmd" in table and ("rename" in table or table.get("safety") == "manual"):
        raise RuleError(f"{where}: 'under_spmd' says what a converted call meant under SPMD: a "
                        f"{'rename' if 'rename' in table else 'manual'} rule converts no call")
    if "under_spmd_for" in table:
        if "under_spmd" not in table:
            raise RuleError(f"{where}: 'under_spmd_for' names the calls 'under_spmd' speaks for: give 'under_spmd'")
        stray = sorted(set(table["under_spmd_for"]) - set(table.get("matches", ())))
        if stray:
            raise RuleError(f"{where}: 'under_spmd_for' names {', '.join(stray)}, which the rule does not match")
    for key in ("replace", "rename"):
        for target, template in table.get(key, {}).items():
            if not isinstance(template, str):
                raise RuleError(f"{where}: '{key}.{target}' must be a string")
            try:
                list(string.Formatter().parse(template))
            except ValueError as exc:
                raise RuleError(f"{where}: '{key}.{target}' is not a valid template: {exc}") from None
    # Which placeholders the engine can fill is the code's knowledge: registry.check.


def template_fields(rule: Rule) -> dict[str, set[str]]:
    """`replace.tpu` / `rename.portable` / ... -> the placeholders its template names."""
    return {f"{key}.{target}": {field for _, field, _, _ in string.Formatter().parse(template) if field}
            for key, templates in (("replace", rule.replace), ("rename", rule.rename))
            for target, template in templates.items()}


def _rule_from_table(table: dict, path: Path) -> Rule:
    where = f"{path.name}: rule {table.get('code', '?')}"
    _check_table(table, where)
    for key in ("code", "name", "summary", "safety", "explanation"):
        if not isinstance(table.get(key), str):
            raise RuleError(f"{where}: missing string field '{key}'")
    code = table["code"]
    if not (len(code) == 6 and code.startswith("TPU") and code[3:].isdigit()):
        raise RuleError(f"{where}: code must be TPU followed by 3 digits")
    if table["safety"] not in SAFETY_LEVELS:
        raise RuleError(f"{where}: safety must be one of {', '.join(SAFETY_LEVELS)}")
    replace = table.get("replace", {})
    rename = table.get("rename", {})
    for templates in (replace, rename):
        unknown_targets = set(templates) - set(TARGETS)
        if unknown_targets:
            raise RuleError(f"{where}: unknown target(s) {sorted(unknown_targets)}")
        if templates and set(templates) != set(TARGETS):
            raise RuleError(f"{where}: templates must cover every target ({', '.join(TARGETS)})")
    for flag in ("plain_value", "also_on_torch_xla"):
        if not isinstance(table.get(flag, False), bool):
            raise RuleError(f"{where}: {flag} must be true or false")
    if sum(bool(x) for x in (replace, rename, table.get("transform"))) > 1:
        raise RuleError(f"{where}: give one of 'replace', 'rename' or 'transform'")
    return Rule(
        code=code,
        name=table["name"],
        summary=table["summary"],
        safety=table["safety"],
        explanation=table["explanation"].strip(),
        matches=tuple(table.get("matches", ())),
        match_prefixes=tuple(table.get("match_prefixes", ())),
        replace=dict(replace),
        rename=dict(rename),
        params=tuple(table.get("params", ())),
        transform=table.get("transform"),
        plain_value=table.get("plain_value", False),
        also_on_torch_xla=table.get("also_on_torch_xla", False),
        under_spmd=table.get("under_spmd"),
        under_spmd_for=tuple(table.get("under_spmd_for", ())),
        source=path.name,
    )
