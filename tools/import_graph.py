"""The import graph of the tpu_migrate package, read from the source with `ast`.

Every import of a `tpu_migrate.*` module counts, wherever it is in the file: at module level, in
a function (an import deferred for start-up time is still a dependency), under `if
TYPE_CHECKING`. `from tpu_migrate.a import b` is an edge to `tpu_migrate.a.b` when that is a
module, else to `tpu_migrate.a`. tests/test_architecture.py asserts the graph has no cycle.

    python tools/import_graph.py            # module -> the package modules it imports
    python tools/import_graph.py --cycles   # every cycle, one per line
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "tpu_migrate"


def module_names(package_dir: Path) -> dict[str, Path]:
    """Dotted name -> file, for every module of the package (`pkg/__init__.py` is `pkg`)."""
    modules = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(package_dir.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """The dotted names an import statement loads: `from a import b` gives `a.b`, which
    `_resolve` maps to module `a.b` or, when b is a name defined in a, to `a`."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:  # relative: `from . import x` in pkg/mod.py is pkg.x
        anchor = module.split(".")
        anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
        base = ".".join(anchor + ([base] if base else []))
    return [f"{base}.{alias.name}" for alias in node.names]


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The package module that importing `name` names: itself, or its nearest enclosing module
    (`tpu_migrate.rules.Catalog` -> `tpu_migrate.rules`)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph(package_dir: Path = ROOT / PACKAGE) -> dict[str, set[str]]:
    """Module -> the other package modules it imports anywhere in its file."""
    modules = module_names(package_dir)
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        edges = graph.setdefault(module, set())
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_bytes(), str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            targets = {_resolve(name, modules) for name in _imported(node, module, is_package)}
            edges.update(t for t in targets if t is not None and t != module
                         and (t == PACKAGE or t.startswith(PACKAGE + ".")))
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (or a module that
    imports itself), each as a path `a -> b -> ... -> a`, in a stable order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(node: str) -> None:  # Tarjan's algorithm; the package is small, recursion is fine
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return [_cycle_through(component, graph) for component in sorted(components)]


def _cycle_through(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest cycle from the component's first module back to itself (breadth-first)."""
    start, members = component[0], set(component)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(graph[node] & members):
                if target == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if target not in previous:
                    previous[target] = node
                    following.append(target)
        frontier = following
    raise AssertionError(f"no cycle through {start}")  # a component always has one


def main(argv: list[str]) -> int:
    graph = import_graph()
    if "--cycles" in argv:
        for cycle in find_cycles(graph):
            print(" -> ".join(cycle))
        return 0
    for module in sorted(graph):
        print(f"{module} -> {', '.join(sorted(graph[module])) or '(nothing)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
