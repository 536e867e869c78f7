"""`diagnose` on programs as people write them (issue 13): loops without steps, the first
steps of real training scripts, reads in step closures, and real public torch_xla scripts."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import ROOT
from test_diagnose import diagnose, diagnosed, diagnosed_page, findings_of

pytestmark = pytest.mark.slow  # real torch_xla training scripts under diagnose

NATIVE = ROOT / "fixtures" / "diagnose" / "native"
REAL = ROOT / "fixtures" / "programs" / "real" / "pytorch_xla"
MNIST_FLAGS = ("--fake_data", "--num_cores", "1", "--num_epochs", "1", "--batch_size", "32", "--log_steps", "5")


def test_xla_inference_loop_without_steps():
    # No sync, no optimizer: every float() runs the pending graph, and lengths 5, 6 and 7
    # compile again at the read's line (the first compile, for 4, is its warm-up).
    result, document, found = findings_of("inference_loop.py")
    assert result.returncode == 0 and document["steps"] == 0
    # Ranked by cost: the read's wait is measured; a recompile without steps is not.
    assert found == [("sync", "inference_loop.py", 14, 7, 0, "__float__"),
                     ("recompile", "inference_loop.py", 14, 3, 0, "host read")]
    assert any(note.startswith("no steps found") for note in document["notes"])
    assert "no steps found" in result.stderr and "no recompilation" not in result.stderr


def test_native_compiled_function_in_a_loop_without_steps():
    result = diagnosed(NATIVE / "compiled_inference_loop.py")  # JSON, text report and page in one run
    document = json.loads(result.stdout)
    found = {(f["kind"], f["line"], f["count"]) for f in document["findings"]}
    # Lengths 4, 5, 6, 7: three recompiles of `predict` (its first compile is its warm-up).
    assert found == {("recompile", 10, 3), ("sync", 17, 7)}
    assert "total" in result.stderr  # the program's own output, moved to stderr by --format json
    # Every call of the compiled function is timed at the line that called it: the first call at
    # each new input shape (compile + run) apart from the later calls at a shape seen before.
    costs = document["costs"]
    [site] = costs["compiled_calls"]
    assert (site["line"], site["function"], site["first_calls"], site["later_calls"]) == (17, "predict", 4, 3)
    shapes = {s["inputs"]: s for s in site["signatures"]}
    assert list(shapes) == [f"arg0 ({n}, 8) float32" for n in (4, 5, 6, 7)]
    assert all(s["first_call_compiled"] for s in shapes.values())
    four = shapes["arg0 (4, 8) float32"]
    assert four["later_calls"] == 3 and not four["later_calls_that_compiled"]
    assert four["later_mean_seconds"] < four["first_call_seconds"]  # a compile is no steady-state call
    # No steps, yet it compiled: the run's compile time is Dynamo's, not 0.
    assert costs["compile_seconds"] > 0
    # The recompiles cost the first calls at the new shapes (it was "not measured" without steps).
    recompile = next(f for f in document["findings"] if f["kind"] == "recompile")
    assert recompile["cost"]["seconds"] > 0 and "3 new input shape(s)" in recompile["cost"]["how"]
    # The run's summary counts it too (it said "cost 0.0% of the run" beside "alone 6.0%"), and the
    # read's cost estimated from the CPU run (what removing each read saves at most), labelled so.
    sync = next(f for f in document["findings"] if f["kind"] == "sync")
    assert sync["cost"]["estimate"] and sync["cost"]["seconds"] > 0
    lost = float(re.match(r"2 finding\(s\) cost ([\d.]+)% of the run", costs["summary"])[1]) / 100
    assert lost >= recompile["cost"]["share"] - 0.001 and "(reads estimated from the CPU run" in costs["summary"]
    # The first calls and the steady state as separate figures in the text report and the page.
    page = diagnosed_page(NATIVE / "compiled_inference_loop.py").read_text()
    for text in (result.stderr, page):
        assert "compiled_inference_loop.py:17 predict: 4 first call(s) at a new input shape" in text
        assert "arg0 (4, 8) float32: first" in text and "then 3 x" in text


def test_clean_program_without_steps_never_says_no_problems(tmp_path):
    program = tmp_path / "once.py"
    program.write_text("import torch\nx = torch.ones(3)\nprint(float(x.sum()))\n")
    result = diagnose("--backend", "native", str(program))
    assert result.returncode == 0
    assert "no steps found" in result.stderr and "nothing repeated" in result.stderr
    assert "after warm-up" not in result.stderr


def test_optimizer_state_accumulator_and_step_closure_are_named_not_blamed():
    # With --fail-on sync: a closure read is no sync, so it exits 0 (one run gives both).
    result, document, found = findings_of("training_state_and_closure.py", "--fail-on", "sync")
    assert result.returncode == 0
    # The set-up syncs used steps 0-1; SGD's momentum, created in step 2, changes step 3's
    # graph once: warm-up ends after it. Batch sizes 5, 6, 7 in steps 8-10 recompile: loud.
    # The JSON gives the warm-up the analysis used, as the text report does (it gave the 2 asked).
    assert document["warmup_steps"] == 4
    assert any("warm-up extended to 4 steps: the SGD optimizer" in n for n in document["notes"])
    [header] = [line for line in result.stderr.splitlines() if line.startswith("tpu-migrate diagnose:")]
    assert "4 warm-up" in header
    assert ("recompile", "training_state_and_closure.py", 28, 3, 8, None) in found
    assert ("compile", "training_state_and_closure.py", 35, 1, 11, None) in found  # evaluation's first
    changed = [f for f in document["findings"] if f["op"] == "changed once"]
    assert [(f["line"], f["first_step"]) for f in changed] == [(35, 12)]
    assert "accumulator that starts as a Python number" in changed[0]["message"]
    assert "training_state_and_closure.py:34" in changed[0]["message"]
    # The loss read in the step closure is information with what is true of it, not a sync.
    assert ("closure-read", "training_state_and_closure.py", 18, 9, 2, "item") in found
    assert not [f for f in found if f[0] == "sync"]
    closure = next(f for f in document["findings"] if f["kind"] == "closure-read" and f["line"] == 18)
    assert "neither cuts the graph nor compiles" in closure["explanation"]
    assert "move the read into xm.add_step_closure" not in closure["explanation"]
    # A closure that computes before it reads runs a graph of its own: said so, not "no compile".
    computing = next(f for f in document["findings"] if f["kind"] == "closure-read" and f["line"] == 40)
    assert "computes on the device first" in computing["message"]
    assert "runs a small graph of its own" in computing["explanation"]
    # A host table indexed with a device scalar in a closure: torch's read in C++, also the closure's.
    assert ("closure-read", "training_state_and_closure.py", 46, 2, 17, "indexing with a device scalar") in found


def _metrics(text: str) -> dict[str, int]:
    """Counters of the script's own met.metrics_report() (--metrics_debug)."""
    return {name: int(value) for name, value in re.findall(r"Counter: (\S+)\n\s+Value: (\d+)", text)}


def test_real_mnist_script_unchanged_and_findings_match_its_metrics(tmp_path):
    """test_train_mp_mnist.py, unchanged: its exit status and printed accuracy are the same
    under diagnose, and every compile and _local_scalar_dense read its own metrics report
    counts appears in the report, at the script's lines."""
    import differential
    import real_runs

    script = REAL / "test" / "test_train_mp_mnist.py"
    # The plain run is the real runs' original (test_real_runs compares its migration with it),
    # made once per session. --metrics_debug, which only the traced run needs, adds the metrics
    # report after each evaluation to what the script prints and changes nothing it computes.
    with ThreadPoolExecutor(1) as pool:
        plain = pool.submit(real_runs.original_run, real_runs.Script(f"{REAL.name}/test/{script.name}", MNIST_FLAGS))
        traced = diagnose("--format", "json", str(script), *MNIST_FLAGS, "--metrics_debug", cwd=tmp_path,
                          env=differential.original_mp_env())
        plain = plain.result()
    assert plain.returncode == traced.returncode == 0, plain.output[-3000:]
    accuracy = re.compile(r"Accuracy=[\d.]+|Max Accuracy: [\d.]+%")
    assert accuracy.findall(plain.output) == accuracy.findall(traced.stderr) != []
    metrics = _metrics(traced.stderr)
    document = json.loads(traced.stdout)
    found = {(f["kind"], f["line"], f["op"]): f["count"] for f in document["findings"]}
    # Expected, as a TPU engineer reads this script: no recompile (momentum is created in the
    # first training step, and warm-up ends after the step that reads it); evaluation's first
    # graph at its loop (174), changed once by `correct = 0; correct += ...` (177); two graphs
    # in xm.mesh_reduce (181); the loss logged in a step closure (70), every 5 steps.
    assert found == {("compile", 174, None): 1, ("compile", 174, "changed once"): 1,
                     ("compile", 181, None): 2, ("closure-read", 70, "item"): 4}
    notes = " ".join(document["notes"])
    assert "warm-up extended to 4 steps: the SGD optimizer" in notes
    # 640 fake samples in batches of 32: 20 training steps, and 4 evaluation batches plus the
    # steps of the script's own syncs end steps too: the count says which are training.
    assert document["optimizer_steps"] == 20 and document["steps"] > 24
    header = next(line for line in traced.stderr.splitlines() if line.startswith("tpu-migrate diagnose:"))
    assert f"{document['steps']} steps, 20 optimizer steps, 4 warm-up" in header
    # Its metrics: 7 compiles = 1 set-up (step 0) + 2 training (warm-up) + 4 above.
    assert metrics["CreateCompileHandles"] == 7
    # 9 host reads = 4 in the closure + correct.item() (180) + 4 in mesh_reduce (181), the
    # last two once per evaluation (a note, not a finding).
    assert metrics["aten::_local_scalar_dense"] == 9
    assert "test_train_mp_mnist.py:180 item x1" in notes
    # One mesh_reduce call, whose reads its own syncs spread over two steps: one entry, still a note.
    assert re.search(r"test_train_mp_mnist.py:181 mesh_reduce \([a-z, ]+\) x3", notes), notes


# Expected findings (kind, line, op) -> count, as a TPU engineer reads each script; every one
# also keeps its exit status and prints the same losses under diagnose.
REAL_SCRIPTS = {
    # ZeRO-1: as MNIST; SGD state appears in the first training step (step 1 here).
    ("test/test_train_mp_mnist_zero1.py", *MNIST_FLAGS): (
        {("compile", 154, None): 1, ("compile", 154, "changed once"): 1, ("compile", 161, None): 2,
         ("closure-read", 57, "item"): 4},
        "warm-up extended to 3 steps: the SGD optimizer"),
    # Fake ImageNet-style ResNet: one graph per step, the loss logged in a step closure.
    ("examples/train_resnet_base.py",): ({("closure-read", 61, "__format__"): 3}, None),
    # Decoder-only LM under torch_xla.compile, Adam: its moments change step 2's graph once.
    ("examples/train_decoder_only_base.py", "--hidden-size", "64", "--intermediate-size", "128", "--num-layers", "1"): (
        {("closure-read", 49, "__format__"): 3, ("closure-read", 50, "item"): 3},
        "warm-up extended to 3 steps: the Adam optimizer"),
}


@pytest.mark.parametrize("spec", list(REAL_SCRIPTS), ids=lambda spec: spec[0].split("/")[-1])
def test_real_scripts_unchanged_with_findings_written_down(spec, tmp_path):
    import differential
    import real_runs

    expected, note = REAL_SCRIPTS[spec]
    script, *args = spec
    # The plain run is the real runs' original (the same script, arguments and environment),
    # made once per session; the traced one runs beside it, in that environment.
    with ThreadPoolExecutor(1) as pool:
        plain = pool.submit(real_runs.original_run, real_runs.Script(f"{REAL.name}/{script}", tuple(args)))
        traced = diagnose("--format", "json", str(REAL / script), *args, cwd=tmp_path,
                          env=differential.original_mp_env())
        plain = plain.result()
    assert plain.returncode == traced.returncode == 0, plain.output[-3000:]
    losses, traced_losses = real_runs.printed_values(plain.output), real_runs.printed_values(traced.stderr)
    assert losses and losses == traced_losses
    document = json.loads(traced.stdout)
    assert {(f["kind"], f["line"], f["op"]): f["count"] for f in document["findings"]} == expected
    notes = " ".join(document.get("notes", []))
    assert (note in notes) if note else "warm-up extended" not in notes
