"""A converted value passed to a function of another module of the project, whose parameter
reaches torch_xla (rewrite/parameter_flows.py): HeegyuKim's train_with_spmd.py hands the converted
mesh to spmd_util.partition_module, which calls `xs.mark_sharding` on it."""

from __future__ import annotations

import ast
import os
from pathlib import Path

from tpu_migrate.rewrite.context import Options
from tpu_migrate.rewrite.engine import rewrite_bytes
from tpu_migrate.rewrite.parameter_flows import project_parameters, reaching_parameters

CORPUS = Path(__file__).resolve().parent.parent / "fixtures" / "corpus"

SPMD_UTIL = """\
import re

import torch_xla.experimental.xla_sharding as xs


def partition_module(model, mesh, verbose=False):
    for name, module in model.named_modules():
        if re.findall("0$", name):
            xs.mark_sharding(module.weight, mesh, ("fsdp", None))


def count(model, mesh):
    return len(list(model.parameters()))
"""
TRAIN = """\
import numpy as np
import torch.nn as nn
import torch_xla.runtime as xr
from torch_xla.experimental.xla_sharding import Mesh

from spmd_util import count, partition_module

xr.use_spmd()
num_devices = xr.global_runtime_device_count()
mesh = Mesh(np.array(range(num_devices)), (1, num_devices, 1), ("dp", "fsdp", "mp"))
model = nn.Sequential(nn.Linear(16, 32))
partition_module(model, mesh)
count(model, mesh)
"""


def _project(tmp_path):
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "spmd_util.py").write_text(SPMD_UTIL)
    (tmp_path / "train_with_spmd.py").write_text(TRAIN)
    return [str(tmp_path / "spmd_util.py"), str(tmp_path / "train_with_spmd.py")]


def test_the_mesh_passed_to_another_module_s_torch_xla_call_is_marked_at_the_call(tmp_path):
    files = _project(tmp_path)
    flows = project_parameters(files, tmp_path)
    assert [(os.path.basename(path), [entry[:3] for entry in imported]) for path, imported in flows] == [
        ("train_with_spmd.py", [("partition_module", "spmd_util.py", "partition_module")])]
    result = rewrite_bytes(TRAIN.encode(), files[1], Options(xla_parameters=flows))
    output = result.output.decode()
    lines = output.splitlines()
    call = lines.index("partition_module(model, mesh)")
    assert lines[call - 1].startswith("# TODO(tpu-migrate): TPU171 `mesh` holds the conversion of `Mesh`")
    assert "`partition_module` (spmd_util.py) passes it to `xs.mark_sharding`" in lines[call - 1]
    assert "mesh = _device_mesh(" in output  # marked, not held: SPMD's conversion goes on
    assert not lines[lines.index("count(model, mesh)") - 1].startswith("#")  # reaches no torch_xla call


def test_without_the_project_pass_the_call_is_not_marked(tmp_path):
    files = _project(tmp_path)
    result = rewrite_bytes(TRAIN.encode(), files[1], Options())
    assert "partition_module` passes" not in result.output.decode()


def test_a_project_of_one_torch_xla_file_is_not_read_further(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    assert project_parameters([str(tmp_path / "train.py")], tmp_path) == ()


SHARDING = """\
import torch_xla.core.xla_model as xm


def setup():
    import torch_xla.distributed.spmd as xs


def shard(tensor, mesh):
    return place(tensor, mesh)


def place(tensor, mesh):
    xs.mark_sharding(tensor, mesh, (0, 1))


def step(device):
    xm.mark_step(device)
"""


def test_the_functions_read_alone_come_out_as_a_whole_read_gives_them():
    """flows.passed_to_functions reads only the functions a file calls with a converted name, and
    resolves their calls through every function's imports (`setup`'s `xs` here), as a read of
    the whole module does; the project pass reads the imports of the functions it reads."""
    tree = ast.parse(SHARDING)
    whole, orders = reaching_parameters(tree)
    assert sorted(whole) == ["place", "shard", "step"]
    alone, alone_orders = reaching_parameters(tree, {"shard"}, every_import=True)
    assert alone == {name: whole[name] for name in ("shard", "place")}
    assert alone_orders == {name: orders[name] for name in ("shard", "place")}
    assert reaching_parameters(tree, {"shard"})[0] == {}  # `xs` is bound in `setup`, not read


def test_every_corpus_file_s_called_functions_come_out_as_a_whole_read_gives_them():
    for path in sorted(CORPUS.glob("*.py")):
        tree = ast.parse(path.read_bytes())
        whole, _ = reaching_parameters(tree)
        called = {node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
        alone, _ = reaching_parameters(tree, called, every_import=True)
        assert alone == {name: sinks for name, sinks in whole.items() if name in alone}, path.name
        assert {name for name in whole if name in called} <= set(alone), path.name


def test_the_file_s_torch_xla_assignments_are_found_once_for_both_flows(tmp_path, monkeypatch):
    """held_assignments and passed_to_functions ask which assignments a rule converted of one
    analysis: its statements are read for them once (flows._xla_assignments), not per flow."""
    from tpu_migrate.rewrite import flows

    files = _project(tmp_path)
    flows_found = project_parameters(files, tmp_path)
    read = []
    simple_assignment = flows._simple_assignment
    monkeypatch.setattr(flows, "_simple_assignment", lambda node: read.append(node) or simple_assignment(node))
    output = rewrite_bytes(TRAIN.encode(), files[1], Options(xla_parameters=flows_found)).output.decode()
    assert "`partition_module` (spmd_util.py) passes it to `xs.mark_sharding`" in output
    assert read and len(read) == len(set(map(id, read)))
