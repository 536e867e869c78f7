"""The modules of tpu_migrate.diagnose import each other without a cycle, counting the imports
inside functions too (a lazy import hides a cycle, it does not remove it)."""

from __future__ import annotations

import ast
from pathlib import Path

import tpu_migrate.diagnose

PACKAGE = "tpu_migrate.diagnose"
DIRECTORY = Path(tpu_migrate.diagnose.__file__).parent


def import_graph() -> dict[str, set[str]]:
    """module -> the diagnose modules it imports anywhere in its file."""
    modules = {f"{PACKAGE}.{p.stem}": p for p in DIRECTORY.glob("*.py") if p.stem != "__init__"}
    graph = {}
    for name, path in modules.items():
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                base = node.module if node.level == 0 else _relative(name, node.module, node.level)
                imported.add(base)
                imported.update(f"{base}.{alias.name}" for alias in node.names)
        graph[name] = {m for m in imported if m in modules and m != name}
    return graph


def _relative(module: str, target: str, level: int) -> str:
    return ".".join(module.split(".")[:-level] + [target])


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return path[path.index(node):] + [node]
        if node in done:
            return None
        for child in sorted(graph[node]):
            cycle = visit(child, path + [node])
            if cycle:
                return cycle
        done.add(node)
        return None

    for start in sorted(graph):
        cycle = visit(start, [])
        if cycle:
            return cycle
    return None


def test_diagnose_modules_import_without_a_cycle():
    graph = import_graph()
    assert f"{PACKAGE}.tracer" in graph and f"{PACKAGE}.native" in graph
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_the_backends_share_the_recorder_not_each_other():
    graph = import_graph()
    assert f"{PACKAGE}.native" in graph[f"{PACKAGE}.tracer"]  # a lazy import, counted
    assert f"{PACKAGE}.tracer" not in graph[f"{PACKAGE}.native"]
    assert f"{PACKAGE}.recording" in graph[f"{PACKAGE}.native"]


def test_the_cycle_finder_finds_a_lazy_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
