"""Name resolution: import forms, scopes, shadowing, historical spellings."""

from __future__ import annotations

import ast
import textwrap

import pytest

from conftest import ROOT
from tpu_migrate.rewrite.names import analyze
from tpu_migrate.rules import load_catalog


def refs(source: str) -> list[tuple[int, str]]:
    analysis = analyze(ast.parse(textwrap.dedent(source)), load_catalog().canonical)
    found = [(r.line, r.qualname) for info in analysis.infos.values() for r in info.refs]
    return sorted(q for q in found if q[1].startswith("torch_xla"))


@pytest.mark.parametrize(
    "source",
    [
        "import torch_xla.core.xla_model as xm\nxm.mark_step()",
        "from torch_xla.core import xla_model as xm\nxm.mark_step()",
        "from torch_xla.core.xla_model import mark_step as ms\nms()",
        "import torch_xla\ntorch_xla.core.xla_model.mark_step()",
        "import torch_xla.core.xla_model\ntorch_xla.core.xla_model.mark_step()",
        "import torch_xla_py.xla_model as xm\nxm.mark_step()",
        "def f():\n    import torch_xla.core.xla_model as xm\n    xm.mark_step()",
        "try:\n    import torch_xla.core.xla_model as xm\nexcept ImportError:\n    xm = None\nxm.mark_step()",
    ],
)
def test_every_import_form_resolves(source):
    assert refs(source)[-1][1] == "torch_xla.core.xla_model.mark_step"


def test_runtime_attribute_chain_after_plain_import():
    assert refs("import torch_xla\nn = torch_xla.runtime.world_size()") == [
        (2, "torch_xla.runtime.world_size")
    ]


@pytest.mark.parametrize(
    "body",
    [
        "def f(xm):\n    xm.mark_step()",
        "def f():\n    xm = object()\n    xm.mark_step()",
        "def f():\n    for xm in []:\n        xm.mark_step()",
        "def f():\n    with open('x') as xm:\n        xm.mark_step()",
        "def f():\n    try:\n        pass\n    except Exception as xm:\n        xm.mark_step()",
        "class C:\n    def xm(self):\n        pass\n    def g(self, xm):\n        xm.mark_step()",
    ],
)
def test_local_bindings_shadow_the_module_alias(body):
    source = "import torch_xla.core.xla_model as xm\n" + body
    assert refs(source) == []


def test_global_declaration_reaches_the_module_import():
    source = """
    import torch_xla.core.xla_model as xm
    def f():
        global xm
        xm = xm
        xm.mark_step()
    """
    assert refs(source)[-1][1] == "torch_xla.core.xla_model.mark_step"


def test_class_body_names_are_invisible_to_methods():
    source = """
    class C:
        import torch_xla.core.xla_model as xm
        def f(self):
            xm.mark_step()
    """
    assert refs(source) == []


def test_unrelated_aliases_are_not_torch_xla():
    source = """
    import pytorch_lightning as pl
    import jax.experimental.pallas as pl2
    xs = [1, 2]
    pl.Trainer()
    xs.append(3)
    """
    assert refs(source) == []


def resolved(source: str) -> tuple[list[int], list[int]]:
    """Lines of the torch_xla references that resolve, and of those left ambiguous."""
    analysis = analyze(ast.parse(textwrap.dedent(source)), load_catalog().canonical)
    infos = analysis.infos.values()
    found = sorted(r.line for info in infos for r in info.refs if r.qualname.startswith("torch_xla"))
    return found, sorted(ref.line for info in infos for ref, _ in info.ambiguous)


@pytest.mark.parametrize(
    "source, expected",
    [
        # Module level runs in order: the rebinding hides the import from there on.
        ("import torch_xla.core.xla_model as xm\nxm.mark_step()\nxm = object()\nxm.mark_step()", ([2], [])),
        ("from torch_xla.core.xla_model import mark_step\nmark_step()\ndef mark_step(): pass\nmark_step()",
         ([2], [])),
        ("import torch_xla.core.xla_model as xm\nclass xm: pass\nxm.mark_step()", ([], [])),
        ("import torch_xla.core.xla_model as xm\nfor xm in []: pass\nxm.mark_step()", ([], [3])),
        ("import torch_xla.core.xla_model as xm\nwith open('f') as xm: xm.mark_step()", ([], [])),
        ("import torch_xla.core.xla_model as xm\nimport os as xm\nxm.mark_step()", ([], [])),
        # A function runs later: the last module-level binding wins.
        ("import torch_xla.core.xla_model as xm\ndef f():\n    xm.mark_step()\nxm = object()", ([], [])),
        ("xm = object()\ndef f():\n    xm.mark_step()\nimport torch_xla.core.xla_model as xm", ([3], [])),
        # The optional-import fallbacks do not hide the import.
        ("try:\n    import torch_xla.core.xla_model as xm\nexcept ImportError:\n    xm = None\n"
         "def f():\n    xm.mark_step()", ([6], [])),
        ("if A:\n    import torch_xla.core.xla_model as xm\nelse:\n    xm = None\nxm.mark_step()", ([5], [])),
        ("if not A:\n    xm = None\nelse:\n    import torch_xla.core.xla_model as xm\nxm.mark_step()", ([5], [])),
        ("try:\n    from torch_xla.core.xla_model import mark_step\nexcept ImportError:\n"
         "    def mark_step(): pass\nmark_step()", ([5], [])),
        # A rebinding that may have run: left for a human, in order and in functions.
        ("import torch_xla.core.xla_model as xm\nif A:\n    xm = object()\nxm.mark_step()", ([], [4])),
        ("import torch_xla.core.xla_model as xm\nif A:\n    xm = object()\n    xm.mark_step()", ([], [])),
        ("import torch_xla.core.xla_model as xm\nif A:\n    xm = object()\ndef f():\n    xm.mark_step()",
         ([], [5])),
        ("import torch_xla.core.xla_model as xm\nwhile A:\n    xm.mark_step()\n    xm = object()", ([], [3])),
        ("xm.mark_step()\nimport torch_xla.core.xla_model as xm", ([], [1])),
        # Several imports bind the name and the use resolves to another one: a torch_xla import
        # that may have run instead leaves it for a human (it is neither converted nor lost).
        ("if A:\n    from torch.optim import AdamW\nelse:\n    from torch_xla.amp.syncfree import AdamW\n"
         "AdamW()", ([], [5])),
        ("try:\n    import my_xm as xm\nexcept ImportError:\n    import torch_xla.core.xla_model as xm\n"
         "xm.mark_step()", ([], [5])),
        ("import torch_xla.core.xla_model as xm\nif A:\n    import my_xm as xm\nxm.mark_step()", ([], [4])),
        ("def f():\n    if A:\n        from torch_xla.amp.syncfree import Adam\n    if B:\n"
         "        from torch.optim import Adam\n    return Adam()", ([], [6])),
        # ... but not once an import that always runs replaced it.
        ("from torch_xla.amp.syncfree import SGD\nSGD()\nfrom torch.optim import SGD\nSGD()", ([2], [])),
        # A class body sees the module's name until it binds its own.
        ("import torch_xla.core.xla_model as xm\nclass C:\n    d = xm.xla_device()\n    xm = 1", ([3], [])),
    ],
)
def test_bindings_are_seen_in_order(source, expected):
    assert resolved(source) == expected


def test_the_file_wide_node_list_is_ast_walk_less_the_markers():
    """Analysis.nodes, which the file-wide rules scan, holds ast.walk's nodes in its order but
    `Load`, `Add`, `Eq` and the like (shared markers no rule looks for: a third of the list)."""
    source = (ROOT / "tpu_migrate" / "rewrite" / "names.py").read_text(encoding="utf-8")
    tree = ast.parse(source + "\nx = -a + (b and c) if d is not e else [f for f in g]\ndel h\n")
    walked = list(ast.walk(tree))
    markers = (ast.expr_context, ast.operator, ast.boolop, ast.unaryop, ast.cmpop)
    nodes = analyze(tree).nodes
    assert nodes == [node for node in walked if not isinstance(node, markers)]
    assert len(walked) - len(nodes) > len(walked) // 5
    assert any(isinstance(n, ast.Compare) for n in nodes) and not any(isinstance(n, ast.Load) for n in nodes)
