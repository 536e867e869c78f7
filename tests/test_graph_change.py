"""What `--explain` says changed between two graphs of one line (diagnose/graph_change.graph_change),
on IR as torch_xla writes it with XLA_IR_DEBUG: inputs first, then the operations one graph has
and the other lacks, each named at the user's line only (torch's own lines are not theirs)."""

from __future__ import annotations

from tpu_migrate.diagnose.graph_change import graph_change

USER = frozenset({"train.py", "model.py"})


def ir(*nodes: str) -> str:
    return "IR {\n" + "\n".join(f"  %{i} = {node}" for i, node in enumerate(nodes)) + "\n}\n"


BATCH_8 = "f32[8,16]{1,0} xla::device_data(), location=<module>@train.py:11, xla_shape=f32[8,16]{1,0}"
BATCH_5 = BATCH_8.replace("8,16", "5,16")
GRAD_SEED = "f32[] prim::Constant(), location=_make_grads@__init__.py:221, xla_shape=f32[]"
MATMUL = "f32[8,4]{1,0} aten::mm(%0, %1), location=forward@model.py:7, xla_shape=f32[8,4]{1,0}"
ADD = "f32[4,16]{1,0} aten::add(%2, %3), location=_engine_run_backward@graph.py:825, xla_shape=f32[4,16]{1,0}"
KEPT_GRAD = "f32[4,16]{1,0} xla::device_data(), xla_shape=f32[4,16]{1,0}"


def test_an_input_whose_shape_changed_is_named_with_the_user_s_line():
    assert graph_change(ir(BATCH_8, MATMUL), ir(BATCH_5, MATMUL), USER) == \
        "input f32[8,16] -> f32[5,16] (created at train.py:11)"


def test_operations_gained_are_counted_and_inputs_told_apart():
    change = graph_change(ir(BATCH_8, GRAD_SEED, MATMUL), ir(BATCH_8, KEPT_GRAD, GRAD_SEED, MATMUL, ADD), USER)
    assert change == "the graph gained 1 input (f32[4,16]) and aten::add f32[4,16]"


def test_a_line_of_torch_s_own_is_not_named():
    """`_make_grads@__init__.py:221` is torch.autograd's: before, the report said `at __init__.py:221`."""
    change = graph_change(ir(BATCH_8, MATMUL), ir(BATCH_8, MATMUL, GRAD_SEED), USER)
    assert change == "the graph gained prim::Constant f32[]"
    lost = graph_change(ir(BATCH_8, MATMUL, MATMUL.replace("%0, %1", "%1, %0")), ir(BATCH_8, MATMUL), USER)
    assert lost == "the graph lost aten::mm f32[8,4] at model.py:7"


def test_graphs_with_the_same_operations_have_no_change_to_name():
    reordered = ir(MATMUL.replace("forward@model.py:7", "forward@model.py:9"), BATCH_8)
    assert graph_change(ir(BATCH_8, MATMUL), reordered, USER) is None
    assert graph_change(None, ir(BATCH_8), USER) is None
