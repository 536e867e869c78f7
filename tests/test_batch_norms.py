"""batch_norms.may_hold_batch_norm: the SPMD conversions leave `_global_batch_norm` out only
where the file shows a model without BatchNorm; anything not shown keeps it."""

from __future__ import annotations

import ast
import textwrap

import pytest

from tpu_migrate.rewrite.batch_norms import may_hold_batch_norm
from tpu_migrate.rewrite.names import analyze

HEADER = """
import functools
import torch
import torch.nn as nn
from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel as FSDPv2
WIDTH = 16


class Block(nn.Module):
    def __init__(self, width=WIDTH):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x):
        return x + torch.nn.functional.gelu(self.fc(self.norm(x)))


class Net(nn.Module):
    def __init__(self, depth=2):
        super().__init__()
        self.blocks = nn.Sequential(*[Block() for _ in range(depth)])

    def forward(self, x):
        return self.blocks(x)
"""


def _holds(body: str, expression: str = "model", extra: str = "") -> bool:
    source = HEADER + textwrap.dedent(extra) + "\n\ndef main(device, config):\n" + textwrap.indent(textwrap.dedent(body), "    ")
    tree = ast.parse(source)
    analysis = analyze(tree)
    main = tree.body[-1]
    wrap = next(stmt for stmt in main.body if "FSDPv2" in ast.unparse(stmt))
    return may_hold_batch_norm(expression, wrap, analysis)


@pytest.mark.parametrize("body, expression", [
    ("model = FSDPv2(Net().to(device))", "Net().to(device)"),
    ("model = Net(depth=3)\nmodel = model.to(device)\nmodel.train()\nmodel = FSDPv2(model)\nprint(model)", "model"),
    ("layers = 2 * WIDTH\nmodel = FSDPv2(Net(layers))", "Net(layers)"),
    ("model = FSDPv2(nn.Sequential(Net(), torch.nn.Linear(16, 2)))", "nn.Sequential(Net(), torch.nn.Linear(16, 2))"),
])
def test_a_model_of_this_file_without_batch_norm_needs_no_helper(body, expression):
    assert not _holds(body, expression)


@pytest.mark.parametrize("body, expression, extra", [
    # The model is not shown: a parameter, an attribute, another module's class.
    ("model = FSDPv2(config.model)", "config.model", ""),
    ("model = FSDPv2(Net(config))", "Net(config)", ""),
    ("from transformers import AutoModel\nmodel = FSDPv2(AutoModel.from_pretrained('x'))",
     "AutoModel.from_pretrained('x')", ""),
    ("model = FSDPv2(Wide())", "Wide()", "from .models import Backbone\nclass Wide(Backbone):\n    pass\n"),
    ("model = FSDPv2(Hub())", "Hub()",
     "class Hub(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
     "        self.body = torch.hub.load('pytorch/vision', 'resnet18')\n"),
    ("model = FSDPv2(nn.Sequential(Net(), config.head))", "nn.Sequential(Net(), config.head)", ""),
    # A BatchNorm named anywhere in the file, in a fused layer, or a layer picked by a computed name.
    ("model = FSDPv2(torch.nn.intrinsic.ConvBn2d(conv, norm))", "torch.nn.intrinsic.ConvBn2d(conv, norm)",
     "conv = nn.Conv2d(3, 3, 1)\nnorm = nn.Identity()\n"),
    ("model = FSDPv2(Net())", "Net()", "NORM = nn.BatchNorm1d\n"),
    ("model = FSDPv2(Named('x'))", "Named('x')",
     "class Named(nn.Module):\n    def __init__(self, kind):\n        super().__init__()\n"
     "        self.norm = getattr(nn, kind)(4)\n"),
    # The model handed to code that may change it before the wrap, or bound twice.
    ("model = Net()\nadd_layers(model)\nmodel = FSDPv2(model)", "model", ""),
    ("model = Net()\nmodel.extra = config.layer\nmodel = FSDPv2(model)", "model", ""),
    ("model = Net()\nif config.big:\n    model = config.big\nmodel = FSDPv2(model)", "model", ""),
])
def test_a_model_not_shown_whole_keeps_the_helper(body, expression, extra):
    assert _holds(body, expression, extra)


def test_the_wrap_s_function_is_walked_once_however_many_names_are_asked(monkeypatch):
    """A model built from 12 locals: each name was looked up by a walk of the whole function."""
    from tpu_migrate.rewrite import batch_norms

    walks = []
    own_nodes = batch_norms._own_nodes
    monkeypatch.setattr(batch_norms, "_own_nodes", lambda scope: walks.append(scope) or own_nodes(scope))
    names = [f"w{i}" for i in range(12)]
    body = "".join(f"{name} = {i}\n" for i, name in enumerate(names)) + \
        f"model = FSDPv2(nn.Sequential(*[torch.nn.Linear({', '.join(names)})]))\n"
    assert not _holds(body, f"nn.Sequential(*[torch.nn.Linear({', '.join(names)})])")
    functions = [scope for scope in walks if isinstance(scope, ast.FunctionDef) and scope.name == "main"]
    assert len(functions) == 1, len(functions)


def test_the_file_s_mention_of_a_batch_norm_is_looked_for_once_per_file():
    tree = ast.parse(HEADER + "\n\ndef main(device):\n    model = FSDPv2(Net())\n    other = FSDPv2(Net())\n")
    analysis = analyze(tree)
    memo = {}
    for wrap in tree.body[-1].body:
        assert not may_hold_batch_norm("Net()", wrap, analysis, memo)
    assert memo == {"mentions_batch_norm": False}
