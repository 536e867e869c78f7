"""`diagnose`'s native backend predicts the TPU run where the CPU stands in for it (issue 19):
one regression program per point in fixtures/diagnose/native/, checked against Dynamo's own logs
(TORCH_LOGS=recompiles,graph_breaks) where they apply."""

from __future__ import annotations

import ast
import re

import pytest

from test_diagnose_native import dynamo_stats, line_of, run, run_plain, summary

from tpu_migrate.diagnose import dynamo_hooks, guards, op_coverage, placement


def dynamo_log(program: str, as_torchtpu: bool = True) -> str:
    """What Dynamo itself logs about recompiles and graph breaks in a plain run of `program`."""
    return run_plain(program, as_torchtpu, TORCH_LOGS="recompiles,graph_breaks").stderr


def by_line(document) -> dict[tuple, dict]:
    return {(f["kind"], f["line"], f["op"]): f for f in document["findings"]}


@pytest.mark.slow  # a torch.compile program under diagnose, and Dynamo's own log
def test_shape_recompiles_are_predicted_as_torchtpu_compiles():
    name = "tpu_shape_recompiles.py"
    _, document = run(name)
    recompiles = {f["line"]: f for f in document["findings"] if f["kind"] == "recompile"}
    assert set(recompiles) == {line_of(name, "recompiles per length"), line_of(name, "keyword recompiles")}
    recompile, keyword = recompiles[line_of(name, "recompiles per length")], recompiles[line_of(name, "keyword recompiles")]
    # Dynamo on the CPU recompiles once (then a shape-generic graph); TorchTPU once per new length.
    assert dynamo_log(name, as_torchtpu=False).count("Recompiling function") == 2
    assert dynamo_log(name).count("Recompiling function") == recompile["count"] + keyword["count"] == 7
    assert recompile["first_step"] == 1  # in the warm-up, and still reported
    assert "`positional input 0` dimension 1 changed (8 -> 12)" in recompile["message"]
    assert f"{name}:{line_of(name, 'the varying shape')}" in recompile["message"]
    # Each new length over the recompiles, and what that pattern means.
    assert "dimension 1 took 3 new value(s) (12, 16, 20): a graph per length" in recompile["message"]
    assert "dynamic=False" in recompile["explanation"]
    # Called with keywords: the input by its keyword, its shape's origin found through kwargs.
    assert keyword["op"] == "mean_id" and keyword["count"] == 4
    assert "for a new input shape" in keyword["message"] and "`input_ids` dimension 1 changed (8 -> 12)" in keyword["message"]
    assert f"{name}:{line_of(name, 'the varying shape')}" in keyword["message"]
    # Called from two lines (training, then evaluation): each named, with its share (issue 27, item 4).
    assert "; recompiled from " in keyword["message"]
    assert f"{name}:{line_of(name, 'keyword call in training')} (3 of 4), " in keyword["message"]
    assert f"{name}:{line_of(name, 'keyword call in evaluation')} (1 of 4)" in keyword["message"]


@pytest.mark.slow  # a torch.compile program under diagnose, and Dynamo's own log
def test_attention_is_checked_as_a_tpu_dispatches_it():
    name = "sdpa_attention.py"
    _, document = run(name)
    assert summary(document) == {("unsupported-op", name, line_of(name, "unsupported"), "aten::median")}


@pytest.mark.slow  # a torch.compile program under diagnose, and Dynamo's own log
def test_ops_of_compiled_graphs_are_checked_without_changing_them():
    name = "compiled_unsupported_op.py"
    result, document = run(name)
    assert summary(document) == {("unsupported-op", name, line_of(name, "unsupported in the compiled graph"),
                                  "aten::median")}
    assert "graph(s) torch.compile captured" in document["findings"][0]["message"]
    stats = dynamo_stats(run_plain(name).stdout)
    assert stats and stats == dynamo_stats(result.stderr)


@pytest.mark.slow  # a torch.compile program under diagnose, and Dynamo's own log
def test_reads_of_host_tensors_are_not_syncs():
    name = "host_tensors.py"
    _, document = run(name)
    assert summary(document) == {
        ("sync", name, line_of(name, "sync every step"), "item"),
        ("sync", name, line_of(name, "copy to the host every step"), "to('cpu')"),
        ("sync", name, line_of(name, "sync in evaluation"), "item"),
        ("sync", name, line_of(name, "cannot place"), "__format__"),
        ("sync", name, line_of(name, "save copies to the host every step"), "torch.save"),
        ("sync", name, line_of(name, "save of a model the source does not follow"), "torch.save"),
    }
    saves = {f["line"]: f for f in document["findings"] if f["op"] == "torch.save"}
    save = saves[line_of(name, "save copies to the host every step")]
    assert "every step" in save["message"] and "async_save" in save["explanation"]
    # The trainer's `self.model`: the source cannot place it, and its tensors are no host tensors
    # (issue 50, item 3: it was missed). Counted, and saying so.
    unplaced = saves[line_of(name, "save of a model the source does not follow")]
    assert unplaced["count"] == 6 and "could not tell" in unplaced["message"]
    by_place = {f["line"]: f for f in document["findings"] if f["op"] != "torch.save"}
    every, copy = by_place[line_of(name, "sync every step")], by_place[line_of(name, "copy to the host every step")]
    cannot_place, evaluation = by_place[line_of(name, "cannot place")], by_place[line_of(name, "sync in evaluation")]
    assert "every step" in every["message"] and "every step" in copy["message"]
    # With the CPU standing in, each read waits for the work queued before it; removing it saves at
    # most its overlap with the work after it.
    assert every["cost"]["estimate"] and 0 < every["cost"]["seconds"] <= every["cost"]["waits_seconds"]
    assert "estimated: waits for" in every["message"] and "removing it saves at most" in every["message"]
    assert "could not tell" in cannot_place["message"] and "could not tell" not in every["message"]
    assert evaluation["count"] == 18 and "in 3 of 6 steps (not every step)" in evaluation["message"]


@pytest.mark.slow  # a torch.compile program under diagnose, and the program alone
def test_host_tensors_are_followed_after_the_program_compiles():
    """Issue 50, item 3: the tracker of host tensors went for good at `torch.compile`, so the
    evaluation's host losses, made after it, were placed by the source only: their formatted
    means were 6 false `__format__` syncs. It now steps aside only inside compiled calls."""
    name = "compiled_host_tensors.py"
    result, document = run(name)
    found = {(f["kind"], f["line"], f["op"]): f["count"] for f in document["findings"] if f["kind"] == "sync"}
    assert found == {
        # The compiled model's loss is a device tensor: its reads are found, after the compile too.
        ("sync", line_of(name, "sync in evaluation"), "item"): 12,
        ("sync", line_of(name, "sync every step"), "item"): 6,
    }
    # Off the mode stack inside compiled calls and the lazily compiled backward: Dynamo compiles
    # exactly what it compiles without diagnose.
    stats = dynamo_stats(run_plain(name).stdout)
    assert stats and stats == dynamo_stats(result.stderr)


@pytest.mark.slow  # a torch.compile program under diagnose, and Dynamo's own log
def test_function_form_data_dependent_ops_under_compile():
    name = "compiled_dynamic_functions.py"
    _, document = run(name)
    dynamic = {(f["line"], f["op"]) for f in document["findings"] if f["kind"] == "dynamic-shape"}
    assert dynamic == {(line_of(name, "dynamic nonzero"), "nonzero"),
                       (line_of(name, "dynamic masked_select"), "masked_select"),
                       (line_of(name, "dynamic unique"), "unique"),
                       (line_of(name, "dynamic in compiled code"), "nonzero")}
    compiled_line = line_of(name, "dynamic in compiled code")
    assert ("graph-break", compiled_line, "Dynamic shape operator") in by_line(document)
    assert f"{name}\", line {compiled_line}" in dynamo_log(name)  # Dynamo breaks the graph there


@pytest.mark.slow  # a torch.compile program under diagnose, and Dynamo's own log
def test_advice_fits_the_cause():
    name = "advice_fits_cause.py"
    _, document = run(name)
    found = by_line(document)
    log = dynamo_log(name)
    # Evaluation under no_grad: Dynamo recompiles for the grad mode, once; information, no shape advice.
    assert "GLOBAL_STATE changed: grad_mode" in log
    second = found["compile", line_of(name, "second graph for no_grad"), "forward"]
    assert "grad_mode" in second["message"] and "shape" not in second["explanation"]
    assert not [f for f in document["findings"] if f["kind"] == "recompile"]
    # The graph break shows Dynamo's hint.
    graph_break = next(f for f in document["findings"] if f["kind"] == "graph-break")
    assert "capture_scalar_outputs = True" in graph_break["explanation"]
    assert "capture_scalar_outputs = True" in log
    # The read of every step ranks above the more frequent read of evaluation steps only: by what
    # removing each saves, the shorter of the work queued before and after it (four forwards and
    # backwards against one forward), estimated on the CPU.
    syncs = [f for f in document["findings"] if f["kind"] == "sync"]
    lines = [f["line"] for f in syncs]
    evaluation, every = line_of(name, "sync in evaluation steps"), line_of(name, "sync every step")
    assert lines.index(every) < lines.index(evaluation)
    in_evaluation = syncs[lines.index(evaluation)]
    assert in_evaluation["count"] == 10 and "in 2 of 8 steps (not every step)" in in_evaluation["message"]
    assert all("every step" in f["message"] and "not every" not in f["message"] for f in syncs if f is not in_evaluation)


# -- units ---------------------------------------------------------------------------------------

PROGRAM = '''
import torch
device = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Linear(4, 1)
model.to(device)
def get_batch():
    return torch.randn(8, 4).to(device)
def estimate():
    out = {}
    losses = torch.zeros(3)
    for k in range(3):
        loss = model(get_batch()).sum()
        losses[k] = loss.item()
    out["val"] = losses.mean()
    return out
def show(value):
    print(value)
for step in range(2):
    losses = estimate()
    if losses["val"] < 1.0:
        print(losses)
    x = get_batch()
    h = model(x).detach().cpu()
    print(h)
    y = x.to(torch.float16)
    print(y.sum())
    z = torch.ones(2, device="cpu")
    print(z)
'''


@pytest.mark.parametrize("statement, kind", [
    ("losses[k] = loss.item()", placement.DEVICE),
    ('if losses["val"] < 1.0:', placement.HOST),
    ("print(losses)", placement.HOST),
    ("h = model(x).detach().cpu()", placement.DEVICE),  # the copy waits for the device
    ("print(h)", placement.HOST),
    ("print(y.sum())", placement.DEVICE),  # .to(dtype) keeps the place
    ("print(z)", placement.HOST),
    ("print(value)", placement.UNKNOWN),  # a parameter: could be either
])
def test_placement_of_reads(statement, kind):
    module = placement.Module(ast.parse(PROGRAM))
    line = next(i for i, text in enumerate(PROGRAM.splitlines(), 1) if text.strip() == statement)
    assert module.read_at(line) == kind


def test_a_program_whose_every_place_is_the_cpu_is_host_only(tmp_path):
    """`device = torch.device("cpu")`: every `.to(device)` and `device=device` is the host (issue
    50, item 4), so the report must say that every tensor was judged a host tensor."""
    chosen = tmp_path / "chosen.py"
    chosen.write_text('import torch\ndevice = torch.device("cpu")\nmodel = torch.nn.Linear(2, 2).to(device)\n'
                      'x = torch.ones(2, device=device)\n')
    assert placement.host_only([str(chosen)])
    accelerator = tmp_path / "accelerator.py"
    accelerator.write_text(MIGRATED)  # the device found at run time: not the host
    assert not placement.host_only([str(accelerator)])
    nowhere = tmp_path / "nowhere.py"
    nowhere.write_text("import torch\nx = torch.ones(2)\n")  # places nothing: runs wholly on the device
    assert not placement.host_only([str(nowhere)])


MIGRATED = '''
import torch
device = torch.accelerator.current_accelerator(check_available=True) or torch.device("cpu")
class _DeviceLoader:
    def __init__(self, loader, device):
        self._loader, self._device = loader, device
    def __iter__(self):
        for batch in self._loader:
            yield batch.to(self._device)
for x in _DeviceLoader([torch.zeros(2)], device):
    print(x.sum().item())
host = torch.device("cpu")
print(torch.zeros(2).to(host))
'''


@pytest.mark.parametrize("statement, kind", [
    ("print(x.sum().item())", placement.DEVICE),  # the tool's own device loader, given the device
    ("print(torch.zeros(2).to(host))", placement.HOST),
])
def test_placement_follows_the_programs_device_choice(statement, kind):
    """A migrated program names its device by a query (issue 27, item 7): the batches its
    generated loader yields live there; they were "could not tell" before."""
    module = placement.Module(ast.parse(MIGRATED))
    line = next(i for i, text in enumerate(MIGRATED.splitlines(), 1) if text.strip() == statement)
    assert module.read_at(line) == kind


def test_a_program_that_names_no_device_runs_on_the_device():
    assert placement.Module(ast.parse("import torch\nx = torch.zeros(3)\nprint(x)\n")).places is False
    assert placement.read_kind("/nonexistent.py", 3, program_places=False) == placement.DEVICE


class _Op:
    def __init__(self, name, overload="default"):
        self._schema = type("Schema", (), {"name": name})()
        self._overloadname = overload


@pytest.mark.parametrize("op, reported", [
    ("aten::_scaled_dot_product_flash_attention_for_cpu", ""),  # the TPU dispatches the fused one
    ("aten::_scaled_dot_product_flash_attention_for_cpu_backward", ""),
    ("aten::mkldnn_linear", ""),  # CPU-only, never the TPU's
    ("aten::_weight_int4pack_mm_for_cpu", ""),
    ("aten::median", "aten::median"),
    ("aten::mm", ""),
])
def test_ops_are_checked_as_a_tpu_dispatches_them(op, reported):
    assert op_coverage.unsupported_on_tpu(_Op(op), op_coverage.op_table()) == reported


@pytest.mark.parametrize("kwargs, expected", [
    ({}, {"dynamic": False}),
    ({"backend": "aot_eager", "dynamic": None}, {"backend": "aot_eager", "dynamic": False}),
    ({"dynamic": True, "mode": "max-autotune"}, {"dynamic": False}),
    ({"dynamic": False, "fullgraph": True}, {"dynamic": False, "fullgraph": True}),
])
def test_compile_arguments_become_torchtpus(kwargs, expected):
    assert dynamo_hooks.as_torchtpu_compiles(kwargs) == expected


def test_shape_guards_name_their_input():
    positional = guards.shape_guard("tensor 'args[0]' size mismatch at index 1. expected 8, actual 12")
    assert positional.path == ("args", 0) and positional.find({"args": ("first",)}) == "first"
    plain = guards.shape_guard("tensor 'x' size mismatch at index 0. expected 4, actual 5")
    assert (plain.name, plain.dim, plain.expected, plain.actual) == ("x", 0, 4, 5)
    assert guards.shape_guard("GLOBAL_STATE changed: grad_mode") is None
    # Keyword arguments (Hugging Face's model(**inputs)), with and without Dynamo's L[...]: these
    # were read as "a Python number changed".
    for source in ("kwargs['input_ids']", "L['kwargs']['input_ids']"):
        keyword = guards.shape_guard(f"tensor '{source}' size mismatch at index 1. expected 5, actual 7")
        assert keyword.name == "input_ids" and keyword.find({"kwargs": {"input_ids": "ids"}}) == "ids"
        assert keyword.describe() == "`input_ids` dimension 1 changed (5 -> 7)"
    attribute = guards.shape_guard("tensor 'L['self'].cache[0]' size mismatch at index 2. expected 3, actual 4")
    assert attribute.path == ("self", ".cache", 0) and attribute.name == "cache"
    # A tensor inside an object passed by keyword (Transformers' cache): the path to it.
    cache = guards.shape_guard("tensor 'L['kwargs']['cache'].layers[0].keys' size mismatch at index 2. "
                               "expected 8, actual 9")
    assert cache.name == "cache.layers[0].keys"


def _guards(source: str, dim: int, values: list[int]) -> list:
    return [guards.shape_guard(f"tensor '{source}' size mismatch at index {dim}. expected {a}, actual {b}")
            for a, b in zip([values[0] - 1, *values], values)]


def test_the_values_a_dimension_takes_name_the_pattern():
    assert "per generated token" in guards.pattern(_guards("L['kwargs']['past']", 1, [6, 7, 8]))
    # generate: the prompt's length changes once (prefill, then one token), the cache every token;
    # the input that changed most often names the pattern.
    prefill = _guards("L['kwargs']['input_ids']", 1, [1])
    growing = _guards("L['kwargs']['cache'].layers[0].keys", 2, [4, 5, 6, 7])
    assert "`cache.layers[0].keys` dimension 2 grew by one" in guards.pattern(prefill + growing)
    assert "in a batch its batch size" in guards.pattern(_guards("x", 0, [5, 3]))
    by_length = guards.pattern(_guards("L['kwargs']['input_ids']", 1, [7, 12, 9]))
    assert "a graph per length" in by_length and "(7, 12, 9)" in by_length
    assert re.search(dynamo_hooks.DYNAMIC_OPERATOR, "Operator `aten.nonzero.default`'s output shape depends")["op"] == "nonzero"


def test_sync_wording_by_the_steps_it_was_seen_in():
    from tpu_migrate.diagnose.analysis import Finding
    from tpu_migrate.diagnose.messages import _native_sync

    finding = Finding("sync", "a.py", 3, 4, 1, "item", None, "", steps={1, 2})
    assert _native_sync(finding, "a.py:3")[0].endswith("4 time(s) in 2 steps")  # no optimizer steps
    finding.total_steps = 6
    assert _native_sync(finding, "a.py:3")[0].endswith("in 2 of 6 steps (not every step)")
    finding.steps = set(range(1, 7))
    assert _native_sync(finding, "a.py:3")[0].endswith("every step")


def test_xla_sync_wording_says_what_was_measured():
    """The xla backend's sync says in how many of the steps it was read, not "every step", and
    a read inside xm.mesh_reduce gets advice about the exchange, not about logging."""
    from tpu_migrate.diagnose.analysis import Finding
    from tpu_migrate.diagnose.messages import describe

    finding = Finding("sync", "a.py", 3, 2, 1, "item", None, "", steps={1, 11})
    finding.total_steps = 20
    message, advice = describe(finding, "xla")
    assert message.endswith("2 time(s) in 2 of 20 steps (not every step)")
    assert "every step" not in advice and "each time" in advice
    finding.steps = set(range(1, 21))
    assert describe(finding, "xla")[0].endswith("every step")
    finding.via = ["torch_xla/core/xla_model.py:1445 in mesh_reduce"]
    assert "exchange Python values" in describe(finding, "xla")[1]


@pytest.mark.slow  # imports torch (2-5 s), which the fast lane's workers otherwise need not
def test_a_save_on_a_real_device_is_found_in_its_state_dict():
    """Where tensors are on an accelerator (not the CPU standing in), torch.save is a sync when
    the saved object holds one: a tensor, or one inside a state dict, list or tuple."""
    from types import SimpleNamespace

    import torch

    from tpu_migrate.diagnose.native import NativeHooks

    hooks = SimpleNamespace(cpu_stands_in=False, torch=torch)
    on_device = torch.empty(2, device="meta")  # any device but the CPU
    assert NativeHooks._device_object(hooks, {"model": {"w": torch.zeros(1), "b": on_device}}, None)
    assert NativeHooks._device_object(hooks, [torch.zeros(1), (on_device,)], None)
    assert not NativeHooks._device_object(hooks, {"step": 3, "w": torch.zeros(2)}, None)
