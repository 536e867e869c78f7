"""Name resolution: import forms, scopes, shadowing, historical spellings."""

from __future__ import annotations

import ast
import textwrap

import pytest

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
