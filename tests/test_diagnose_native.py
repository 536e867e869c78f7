"""`tpu-migrate diagnose` with the native backend: eager and torch.compile programs on the CPU,
which stands in for the TPU. Real programs, the real CLI, real Dynamo."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from test_diagnose import diagnose, diagnosed

from tpu_migrate.diagnose import dynamo_hooks, incompatible, op_coverage

pytestmark = pytest.mark.slow  # real torch programs (eager, torch.compile) under diagnose

PROGRAMS = ROOT / "fixtures" / "diagnose" / "native"


def line_of(program: str, marker: str) -> int:
    """The line of `program` whose `# expect:` comment contains `marker`."""
    for number, text in enumerate((PROGRAMS / program).read_text().splitlines(), 1):
        if "# expect:" in text and marker in text.split("# expect:", 1)[1]:
            return number
    raise AssertionError(f"no '# expect: {marker}' in {program}")


def run(program: str, *options: str):
    result = diagnosed(PROGRAMS / program, *options)
    assert result.stdout, result.stderr[-3000:]
    return result, json.loads(result.stdout)


def run_plain(program: str, as_torchtpu: bool = True, **env: str) -> subprocess.CompletedProcess:
    """`program` run without diagnose; `as_torchtpu`: compiled as TorchTPU compiles, which is what
    diagnose does with the CPU standing in (torch.compile's dynamic=False: no automatic dynamic
    shapes)."""
    setup = "import torch._dynamo; torch._dynamo.config.automatic_dynamic_shapes = False; " if as_torchtpu else ""
    code = f"import runpy, torch; {setup}runpy.run_path({str(PROGRAMS / program)!r}, run_name='__main__')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                            env={**os.environ, **env})
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def dynamo_stats(output: str) -> list[str]:
    """The Dynamo counters a program printed (the `dynamo:` line)."""
    return [line for line in output.splitlines() if line.startswith("dynamo:")]


def summary(document) -> set[tuple]:
    return {(f["kind"], Path(f["file"]).name, f["line"], f["op"]) for f in document["findings"]}


@pytest.fixture(scope="module")
def eager():
    return run("eager_problems.py")


@pytest.fixture(scope="module")
def compiled():
    return run("compiled_problems.py")


def test_eager_problems_at_their_lines(eager):
    result, document = eager
    assert result.returncode == 0
    assert document["backend"] == "native" and document["device"] == "cpu"
    assert document["steps"] == 6
    name = "eager_problems.py"
    assert summary(document) == {
        ("sync", name, line_of(name, "sync (item)"), "item"),
        ("sync", name, line_of(name, "sync (__bool__)"), "__bool__"),
        ("dynamic-shape", name, line_of(name, "dynamic shape"), "nonzero"),
        ("unsupported-op", name, line_of(name, "unsupported"), "aten::median"),
        ("tpu-incompatible", name, line_of(name, "fork start method"), "fork start method"),
    }
    counts = {f["kind"] + ":" + str(f["op"]): f["count"] for f in document["findings"]}
    assert counts["sync:item"] == 6 and counts["sync:__bool__"] == 6
    assert counts["dynamic-shape:nonzero"] == 6
    # The op-coverage mode runs in the warm-up steps and one more, then steps aside.
    assert counts["unsupported-op:aten::median"] == 2
    assert all(f["rank"] is None for f in document["findings"])


def test_report_header_says_the_cpu_stands_in():
    result, _ = run("legacy_device_api.py", "--backend", "native", "--fail-on", "tpu-incompatible")  # the text report is on stderr
    assert "backend native" in result.stderr
    assert "the CPU stands in for the TPU" in result.stderr


def test_compiled_problems_from_dynamo(compiled):
    result, document = compiled
    assert result.returncode == 0
    found = {(f["kind"], f["line"]): f for f in document["findings"]}
    name = "compiled_problems.py"
    loss_fn = line_of(name, "recompiles after warm-up")
    recompile = found[("recompile", loss_fn)]
    assert recompile["op"] == "loss_fn" and recompile["first_step"] == 3
    assert "`x` dimension 0 changed (16 -> 12)" in recompile["message"]
    graph_break = found[("graph-break", line_of(name, "graph break"))]
    assert "Tensor.item()" in graph_break["op"] and "GB0124" in graph_break["message"]
    limit = found[("recompile-limit", line_of(name, "recompile limit"))]
    assert limit["op"] == "recompile_limit=2" and "name ==" in limit["message"]
    mode = found[("tpu-incompatible", line_of(name, "mode= raises"))]
    assert mode["op"] == "torch.compile(mode='reduce-overhead')"
    # Compiled code under torch.inference_mode() crashes on TorchTPU (issue 27, item 5).
    inference = found[("tpu-incompatible", line_of(name, "compiled under inference_mode"))]
    assert inference["op"] == "torch.compile under torch.inference_mode()"
    assert "torch.no_grad()" in inference["explanation"]
    assert inference["via"] == []  # the user's call, not Dynamo's eval_frame / convert_frame
    kinds = {f["kind"] for f in document["findings"]}
    assert kinds <= {"recompile", "recompile-limit", "graph-break", "sync", "tpu-incompatible"}
    # torch's own torch.compile(..., backend="inductor") re-call is not the user's.
    assert not any("inductor" in (f["op"] or "") for f in document["findings"])


def test_dynamo_compiles_the_same_graphs_with_and_without_diagnose(compiled):
    stats = dynamo_stats(run_plain("compiled_problems.py").stdout)
    result, _ = compiled
    assert stats and stats == dynamo_stats(result.stderr)  # graphs, calls captured and graph breaks alike
    assert "'unique_graphs': " in stats[0]


def test_clean_native_program_has_no_findings():
    result, document = run("clean_native.py")
    assert result.returncode == 0 and document["findings"] == []
    assert document["steps"] == 6


def test_legacy_device_api_found_in_the_source():
    _, document = run("legacy_device_api.py", "--backend", "native", "--fail-on", "tpu-incompatible")  # one run for the three tests
    name = "legacy_device_api.py"
    assert summary(document) == {
        ("tpu-incompatible", name, line_of(name, "legacy device API"), "torch.tpu.is_available()"),
        ("tpu-incompatible", name, line_of(name, "device index"), "device index 'tpu:1'"),
    }
    explanation = document["findings"][0]["explanation"]
    assert "torch.accelerator.is_available()" in explanation


def test_fail_on_graph_break_exits_1(compiled):
    result = diagnose("--backend", "native", "--fail-on", "graph-break", str(PROGRAMS / "legacy_device_api.py"))
    assert result.returncode == 0  # no graph break there
    result, _ = run("legacy_device_api.py", "--backend", "native", "--fail-on", "tpu-incompatible")
    assert result.returncode == 1


def test_auto_backend_switches_to_xla_when_a_module_imports_torch_xla(tmp_path):
    (tmp_path / "helper.py").write_text(
        "import torch_xla\n\n\ndef device():\n    return torch_xla.device()\n\n\n"
        "def step(x):\n    y = (x * 2).sum()\n    torch_xla.sync()\n    return y\n")
    # The script never names the library: auto starts native and the import switches it.
    (tmp_path / "main.py").write_text(
        "import torch\nimport helper\nx = torch.ones(3, device=helper.device())\n"
        "for _ in range(4):\n    print(helper.step(x).item())\n")
    result = diagnose("--format", "json", str(tmp_path / "main.py"), cwd=tmp_path)
    document = json.loads(result.stdout)
    assert document["backend"] == "xla"
    assert ("sync", "main.py", 5, "item") in summary(document)


def test_auto_backend_stays_native_when_only_a_library_imports_torch_xla():
    """Diffusers imports torch_xla wherever it is installed: the program still computes with torch,
    so auto stays native and finds its read (handed to xla, the run showed nothing)."""
    name = "library_imports_torch_xla.py"
    _, document = run(name)
    assert document["backend"] == "native"
    assert summary(document) == {("sync", name, line_of(name, "sync every step"), "item")}


def test_explicit_native_backend_on_a_torch_xla_free_script():
    result, document = run("legacy_device_api.py", "--backend", "native")
    assert document["backend"] == "native"


# -- units: the pieces that turn Dynamo's text and the source into findings ---------------------

def test_guard_reason_is_made_readable():
    raw = ("2/0: name == 'relu'                                  # return f(x) if name == 'relu' "
           "else x  # models/act.py:30 in activation")
    assert dynamo_hooks.guard_reason(raw) == ("name == 'relu' (guarding `return f(x) if name == 'relu' "
                                        "else x` at models/act.py:30)")
    assert dynamo_hooks.guard_reason("0/0: tensor 'x' size mismatch at index 0. expected 4, actual 5") == \
        "tensor 'x' size mismatch at index 0. expected 4, actual 5"


def test_resume_functions_are_named_after_the_user_function():
    assert dynamo_hooks._function_name("torch_dynamo_resume_in_loss_fn_at_13") == "loss_fn after line 13"
    assert dynamo_hooks._function_name("forward") == "forward"


@pytest.mark.parametrize("kwargs, problems", [
    ({}, []),
    ({"backend": "tpu"}, []),
    ({"mode": "max-autotune"}, ["torch.compile(mode='max-autotune')"]),
    ({"dynamic": True, "backend": "inductor"},
     ["torch.compile(dynamic=True)", "torch.compile(backend='inductor')"]),
    ({"dynamic": None}, []),
])
def test_compile_arguments_that_raise_on_torchtpu(kwargs, problems):
    assert dynamo_hooks.compile_problems(kwargs) == problems


def test_source_scan_of_legacy_calls_and_device_indices():
    source = (
        "import torch as T\nfrom torch import tpu\n"
        "T.tpu.device_count()\ntpu.set_device(1)\nT.tpu.get_device_name()\n"
        "d = T.device('tpu', 2)\ne = T.device('tpu', 0)\nf = 'tpu:0'\ng = 'tpu:3'\n"
        "torch.tpu.synchronize()\n"
    )
    assert incompatible.scan(source) == [
        (3, "torch.tpu.device_count()"), (4, "torch.tpu.set_device()"),
        (6, "device index tpu:N with N > 0"), (9, "device index 'tpu:3'"),
        (10, "torch.tpu.synchronize()"),
    ]
    assert incompatible.scan("def broken(:\n") == []


def test_op_table_is_loaded_and_has_the_documented_ops():
    table = op_coverage.op_table()
    assert len(table) > 3000
    for op in ("aten::convolution", "aten::native_layer_norm", "aten::embedding", "aten::mm.out"):
        assert table[op] == "device", op
    assert table["aten::scaled_dot_product_attention"] == "composite-implicit"
    assert table["aten::median"] == "none"
    assert set(table.values()) == {"device", "composite-explicit", "composite-implicit", "none"}
    assert all(re.match(r"^aten::\w+(\.\w+)?$", op) for op in table)


def test_a_compiled_training_step_with_backward_and_optimizer():
    """Dynamo runs its compile callbacks holding a lock, and a lazily compiled backward runs them
    while the caller's frames are converted: a Python call in our callbacks deadlocked here."""
    name = "compiled_train_step.py"
    result, document = run(name)
    assert result.returncode == 0, result.stderr[-3000:]
    assert document["steps"] == 8  # optimizer steps, counted in the eager remainder
    found = {(f["kind"], f["line"]): f for f in document["findings"]}
    recompile = found["recompile", line_of(name, "recompile")]
    assert recompile["first_step"] == 5
    assert "dimension 0 changed (16 -> 12)" in recompile["message"]
    assert ("graph-break", line_of(name, "graph break (backward)")) in found
    stats = dynamo_stats(run_plain(name).stdout)
    assert stats and stats == dynamo_stats(result.stderr)


def test_a_graph_break_inside_library_code_is_placed_at_the_users_call():
    name = "compiled_library_break.py"
    result, document = run(name)
    assert result.returncode == 0, result.stderr[-3000:]
    breaks = {(Path(f["file"]).name, f["line"]) for f in document["findings"] if f["kind"] == "graph-break"}
    assert breaks == {(name, line_of(name, "graph break inside DDP"))}  # not contextlib.py, not torch


def test_a_relative_script_path_is_run_as_python_runs_it(tmp_path):
    """`python train.py` gives the program an absolute __file__ and code file name (and argv[0] as
    typed): a program that changes directory must still find itself, and diagnose its lines."""
    (tmp_path / "train.py").write_text(
        "import os, sys\n"
        "import torch\n"
        "print(__file__, sys._getframe().f_code.co_filename, sys.argv[0])\n"
        "os.chdir('/')\n"
        "w = torch.nn.Parameter(torch.ones(3))\n"
        "optimizer = torch.optim.SGD([w], lr=0.1)\n"
        "for step in range(4):\n"
        "    loss = (w * 2).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    optimizer.zero_grad()\n"
        "    value = loss.item()\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-m", "tpu_migrate", "diagnose", "--format", "json", "train.py"],
                            cwd=tmp_path, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    script = str(tmp_path / "train.py")
    assert f"{script} {script} train.py" in result.stderr  # the program's stdout; argv[0] as typed
    [finding] = json.loads(result.stdout)["findings"]
    assert (finding["kind"], finding["file"], finding["line"]) == ("sync", script, 12)
