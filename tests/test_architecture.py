"""The package's modules import each other without cycles.

A cycle hidden in a function-level import still ties the two modules together: neither can be
understood, tested or moved alone, and the import order decides what works. The graph comes from
the source (tools/import_graph.py: every `tpu_migrate.*` import anywhere in a file), so a deferred
import counts as much as one at the top.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("import_graph", ROOT / "tools" / "import_graph.py")
import_graph = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(import_graph)

def test_package_import_graph_has_no_cycles():
    cycles = import_graph.find_cycles(import_graph.import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_cycle_finder_sees_a_function_level_import(tmp_path):
    """The check itself: a cycle closed only by an import inside a function is found and printed."""
    package = tmp_path / "tpu_migrate"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "a.py").write_text("from tpu_migrate.sub.b import helper\n")
    (package / "sub" / "b.py").write_text("def helper():\n    from . import a\n    return a\n")
    (package / "c.py").write_text("import tpu_migrate.sub.a\nimport os\n")
    graph = import_graph.import_graph(package)
    assert graph["tpu_migrate.c"] == {"tpu_migrate.sub.a"}
    assert graph["tpu_migrate.sub.b"] == {"tpu_migrate.sub.a"}
    assert import_graph.find_cycles(graph) == [["tpu_migrate.sub.a", "tpu_migrate.sub.b", "tpu_migrate.sub.a"]]


def test_import_graph_prints_one_line_per_module(capsys):
    assert import_graph.main([]) == 0
    lines = dict(line.split(" -> ") for line in capsys.readouterr().out.splitlines())
    assert set(lines) == set(import_graph.module_names(ROOT / "tpu_migrate"))
    assert "tpu_migrate.rewrite.notebooks" in lines["tpu_migrate.rewrite.paths"].split(", ")
    assert lines["tpu_migrate.rules"] == "(nothing)"


def test_the_diagnose_backends_share_the_recorder_not_each_other():
    graph = import_graph.import_graph()
    diagnose = "tpu_migrate.diagnose"
    assert f"{diagnose}.native" in graph[f"{diagnose}.tracer"]  # a lazy import, counted
    assert f"{diagnose}.tracer" not in graph[f"{diagnose}.native"]
    assert f"{diagnose}.recording" in graph[f"{diagnose}.native"]


def test_rewrite_and_diagnose_import_nothing_from_the_reports_above_them():
    """report/ and verify/ present what rewrite and diagnose find; what they share with them
    (html_page.py, printable.py) lives below all of them, so neither engine reaches up."""
    graph = import_graph.import_graph()
    upward = sorted(f"{module} -> {target}" for module, targets in graph.items()
                    if module.startswith(("tpu_migrate.rewrite", "tpu_migrate.diagnose"))
                    for target in targets if target.startswith(("tpu_migrate.report", "tpu_migrate.verify")))
    assert not upward, "\n".join(upward)
