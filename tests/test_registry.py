"""The rule registry: rules/*.toml and the registered transforms must agree, checked when the
rewrite loads them, and rule codes appear in the Python only where a transform or helper
declares them."""

from __future__ import annotations

import ast
import importlib
import re
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tpu_migrate
from tpu_migrate.rewrite import registry, transforms
from tpu_migrate.rewrite.engine import flagged_names
from tpu_migrate.rewrite.registry import Entry, Registry, RegistryError
from tpu_migrate.rules import RuleError, load_catalog, rules_dir

PACKAGE = Path(tpu_migrate.__file__).resolve().parent
RULE_CODE = re.compile(r"TPU\d{3}\Z")


def copied_rules(tmp_path: Path) -> Path:
    target = tmp_path / "rules"
    shutil.copytree(rules_dir(), target)
    return target


def test_every_transform_of_the_tables_names_registered_code():
    catalog = load_catalog()
    assert registry.check(catalog) == []
    named = {rule.transform for rule in catalog.rules if rule.transform}
    assert named <= registry.REGISTRY.transforms
    # torch's own names that transforms convert flag their statements, like the rules' matches
    assert {"torch.compile", "torch.device", "importlib.util.find_spec"} <= flagged_names(catalog)
    # and so do the strings they declare: torch_xla's environment variables
    assert {"PJRT_DEVICE", "XLA_USE_BF16"} <= registry.trigger_strings()


def _family_of_module(module: str, families) -> str | None:
    """transforms/spmd.py and transforms/spmd_parameters.py are family spmd's code."""
    named = [f for f in families if module == f or module.startswith(f + "_")]
    return max(named, key=len) if named else None


def test_a_family_is_one_name_for_its_table_and_its_code():
    """rules/<family>.toml's transforms are registered in transforms/<family>.py (or
    <family>_*.py), and every module there is some table's code: a newcomer finds a rule's code
    by its file's name."""
    catalog = load_catalog()
    tables = {rule.transform: set() for rule in catalog.rules if rule.transform}
    for rule in catalog.rules:
        if rule.transform:
            tables[rule.transform].add(rule.family)
    modules = {path.stem for path in Path(transforms.__file__).parent.glob("*.py")} - {"__init__", "common"}
    assert modules == {family.__name__.rsplit(".", 1)[1] for family in transforms.FAMILIES}
    for module in modules:
        assert _family_of_module(module, catalog.families), f"transforms/{module}.py has no rules/<family>.toml"
    for entry in registry.REGISTRY.entries:
        module = entry.function.__module__.rsplit(".", 1)[1]
        family = _family_of_module(module, catalog.families)
        assert tables.get(entry.transform, {family}) == {family}, (
            f"{entry.function.__name__} (transforms/{module}.py) implements {entry.transform!r} of "
            f"{sorted(tables[entry.transform])}")
    # Each family with code of its own says where, and a family without code is the engine's.
    for family in catalog.families:
        text = (rules_dir() / f"{family}.toml").read_text(encoding="utf-8")
        has_code = any(_family_of_module(m, [family]) for m in modules)
        assert (f"tpu_migrate/rewrite/transforms/{family}.py" in text) == has_code, family


def test_a_misspelt_transform_is_refused_at_load(tmp_path):
    rules = copied_rules(tmp_path)
    steps = rules / "steps.toml"
    text = steps.read_text(encoding="utf-8")
    assert "transform = 'optimizer_step'\n" in text
    steps.write_text(text.replace("transform = 'optimizer_step'\n", "transform = 'optimiser_step'\n"),
                    encoding="utf-8")
    with pytest.raises(RuleError, match="TPU030: transform 'optimiser_step' names no registered function"):
        flagged_names(load_catalog(str(rules)))


TABLE_MISTAKES = [
    # (file, old text, new text, the one line it must give)
    ("ranks.toml", "[rule.replace]\ntpu = '{rank}'", "[rule.replce]\ntpu = '{rank}'",
     "ranks.toml: rule TPU021: unknown key 'replce'"),
    ("ranks.toml", "tpu = '{rank}'", "tpu = '{rank'",
     "ranks.toml: rule TPU021: 'replace.tpu' is not a valid template"),
    ("steps.toml", "transform = 'optimizer_step'\n", "",
     "steps.toml: rule TPU030: a safe rule needs 'replace', 'rename' or 'transform' to fix with"),
    ("ranks.toml", "plain_value = true\nmatches = [\n    'torch_xla.runtime.global_ordinal'",
     "plain_value = 'yes'\nmatches = [\n    'torch_xla.runtime.global_ordinal'",
     "ranks.toml: rule TPU021: 'plain_value' must be bool"),
    ("ranks.toml", "\n[[rule]]\ncode", "\n[defaults]\nsafety = \"safe\"\n\n[[rule]]\ncode",
     "ranks.toml: unknown table(s) defaults (a rule table is [[rule]])"),
    ("ranks.toml", "[family]\ntitle =", "[family]\ntitel =",
     "ranks.toml: [family]: unknown key 'titel'"),
    ("ranks.toml", "[family]\n", "[famliy]\n",
     "ranks.toml: unknown table(s) famliy"),
    ("launch.toml", "[family]\n", "",
     "launch.toml: key(s) summary, title outside any table (they go in [family] or a [[rule]])"),
    ("launch.toml", "[family]\n", "[[rule]]\n",
     "launch.toml: a file of rules starts with a [family] table"),
    ("ranks.toml", "under_spmd_for = ['torch_xla.runtime.global_device_count']",
     "under_spmd_for = ['torch_xla.runtime.global_devices_count']",
     "ranks.toml: rule TPU025: 'under_spmd_for' names torch_xla.runtime.global_devices_count, which the rule does not match"),
]


@pytest.mark.parametrize("file, old, new, message", TABLE_MISTAKES, ids=[m[3].split(": ", 2)[-1][:30] for m in TABLE_MISTAKES])
def test_a_mistake_in_a_table_is_refused_at_load_naming_file_rule_and_key(tmp_path, file, old, new, message):
    """A misspelt table or placeholder used to load and change what the rule does; the first
    regenerate.py then wrote the wrong output down as the expected one."""
    rules = copied_rules(tmp_path)
    path = rules / file
    text = path.read_text(encoding="utf-8")
    assert text.count(old) >= 1, old
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    with pytest.raises(RuleError) as refused:
        load_catalog(str(rules))
    assert str(refused.value).startswith(message), str(refused.value)
    assert "\n" not in str(refused.value)


def test_an_unknown_placeholder_is_refused_before_any_file(tmp_path):
    """Which placeholders the engine fills is the code's knowledge (registry.check), as the
    transforms are: `rules` and `explain` load the tables without the engine."""
    rules = copied_rules(tmp_path)
    ranks = rules / "ranks.toml"
    ranks.write_text(ranks.read_text(encoding="utf-8").replace("tpu = '{rank}'", "tpu = '{rank} + {oss}'", 1),
                     encoding="utf-8")
    with pytest.raises(RuleError, match=r"^ranks.toml: rule TPU021: 'replace.tpu' uses unknown placeholder\(s\) \{oss\}$"):
        flagged_names(load_catalog(str(rules)))


def test_the_rewrite_command_refuses_such_tables(tmp_path):
    """Before any file: a configuration error (exit 2, one line), not a finding per file."""
    rules = copied_rules(tmp_path)
    launch = rules / "launch.toml"
    launch.write_text(launch.read_text(encoding="utf-8").replace("transform = 'spawn'", "transform = 'spwan'"),
                      encoding="utf-8")
    program = tmp_path / "train.py"
    program.write_text("import torch_xla.core.xla_model as xm\nxm.mark_step()\n", encoding="utf-8")
    env = {**os.environ, "TPU_MIGRATE_RULES_DIR": str(rules), "PYTHONPATH": str(PACKAGE.parent)}
    done = subprocess.run([sys.executable, "-m", "tpu_migrate", "rewrite", "--no-cache", str(program)],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "TPU060: transform 'spwan' names no registered function" in done.stderr
    assert program.read_text(encoding="utf-8").endswith("xm.mark_step()\n")


def test_a_code_the_python_writes_must_be_a_rule(tmp_path):
    """environment_reads writes TPU141 findings (declared with `emits`): without the rule the
    tables are refused, not the finding written under a code no rule explains."""
    rules = copied_rules(tmp_path)
    table = rules / "environment.toml"
    blocks = table.read_text(encoding="utf-8").split("\n[[rule]]\n")
    kept = [block for block in blocks if "code = 'TPU141'" not in block]
    assert len(kept) == len(blocks) - 1
    table.write_text("\n[[rule]]\n".join(kept), encoding="utf-8")
    with pytest.raises(RuleError, match="declares rule TPU141"):
        flagged_names(load_catalog(str(rules)))


def test_the_registry_refuses_ambiguous_registrations():
    fresh = Registry()
    fresh.add(Entry("torch_compile", print, calls=("torch.compile",)))
    with pytest.raises(RegistryError, match="two functions for calls of torch.compile"):
        fresh.add(Entry("other", repr, calls=("torch.compile",)))
    with pytest.raises(RegistryError, match="unknown hook site"):
        fresh.add(Entry("x", repr, on="lambda"))
    with pytest.raises(RegistryError, match="give one of"):
        fresh.add(Entry("x", repr, form="call", on="dict"))
    fresh.add(Entry("all_reduce", repr, form="statement"))
    with pytest.raises(RegistryError, match="two statement functions"):
        fresh.add(Entry("all_reduce", print, form="statement"))


def test_hooks_run_in_their_declared_order():
    """The comparison hooks: the guard tests read the original comparison before the others
    may change it; environment reads are reported before the device type test's findings."""
    names = [f.__name__ for f in registry.REGISTRY.hooks["comparison"]]
    assert names == ["find_spec_test", "optional_import_test", "environment_comparison", "device_type_compare"]
    assert registry.REGISTRY.hooks["call"][0].__name__ == "optimum_from_pretrained"


# -- rule-code literals -------------------------------------------------------------------------


def _declared_codes(catalog) -> dict[tuple[str, str], set[str]]:
    """(module, qualified function name) -> the codes it may write: those of the rules whose
    transform it implements, its `emits`, and a helper's `@emits`."""
    owned: dict[str, set[str]] = {}
    for rule in catalog.rules:
        if rule.transform:
            owned.setdefault(rule.transform, set()).add(rule.code)
    declared: dict[tuple[str, str], set[str]] = {}  # qualified names as Python spells them
    for entry in registry.REGISTRY.entries:
        key = (entry.function.__module__, entry.function.__qualname__)
        declared.setdefault(key, set()).update(owned.get(entry.transform, ()), entry.emits)
    for function, codes in registry.REGISTRY.helper_codes.items():
        declared.setdefault((function.__module__, function.__qualname__), set()).update(codes)
    return declared


def stray_codes(source: str, module: str, declared) -> list[str]:
    """Rule-code string literals of `source` outside the places that declare them: a module-level
    `rule_code("TPU...")`, a registry decorator, or the body of a function whose declaration (its
    transform's rules, `emits`) includes the code; nested functions inherit it. Docstrings are
    prose."""
    found: list[str] = []

    def scan(node: ast.AST, path: tuple[str, ...], allowed: frozenset[str]) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            path = (*path, node.name)
            if not isinstance(node, ast.ClassDef):
                allowed = allowed | declared.get((module, ".".join(path)), frozenset())
            for statement in _without_docstring(node.body):  # decorators declare: not scanned
                scan(statement, path, allowed)
            return
        if not path and isinstance(node, ast.Call) and getattr(node.func, "id", None) == "rule_code":
            return
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and RULE_CODE.match(node.value):
            if node.value not in allowed:
                found.append(f"{module}:{node.lineno}: {node.value} in {'.'.join(path) or 'module'}")
            return
        for child in ast.iter_child_nodes(node):
            scan(child, path, allowed)

    for statement in _without_docstring(ast.parse(source).body):
        scan(statement, (), frozenset())
    return found


def _without_docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        return body[1:]
    return body


def test_rule_codes_appear_only_where_declared():
    sources = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        sources[module.removesuffix(".__init__")] = path.read_text(encoding="utf-8")
    for module, source in sources.items():
        if "rewrite.registry import" in source:
            importlib.import_module(module)  # its declarations
    assert transforms.FAMILIES
    catalog = load_catalog()
    assert registry.check(catalog) == []  # also the modules load_catalog does not import
    declared = _declared_codes(catalog)
    stray = [found for module, source in sources.items() for found in stray_codes(source, module, declared)]
    assert stray == []


def test_the_scan_finds_a_stray_code():
    """The scan itself: a literal in an undeclared function, or one its declaration lacks."""
    source = '''
"""Docstrings may name TPU010."""
from tpu_migrate.rewrite.registry import emits, rule_code

KNOWN = rule_code("TPU098")
LOOSE = "TPU099"

@emits("TPU190")
def guard(sc):
    """TPU190 in prose."""
    sc.fixed("TPU190")
    sc.fixed("TPU191")
    def inner():
        return "TPU190"

def helper(sc):
    sc.fixed("TPU002")
'''
    declared = {("m", "guard"): {"TPU190"}}
    assert stray_codes(source, "m", declared) == [
        "m:6: TPU099 in module",
        "m:12: TPU191 in guard",
        "m:17: TPU002 in helper",
    ]


def test_rule_tables_write_literal_strings_where_they_can():
    """tomllib reads a basic string ("...") a character at a time and a literal one ('...') with
    str.find; every start reads the tables, and their parse took half the time with literal
    strings (12.6 -> 5.8 ms). A string that needs a backslash or holds a quote stays basic."""
    import toml_literals

    for path in sorted(rules_dir().glob("*.toml")):
        text = path.read_text(encoding="utf-8")
        assert toml_literals.convert(text) == text, f"{path.name}: run `python tests/toml_literals.py rules/{path.name}`"
