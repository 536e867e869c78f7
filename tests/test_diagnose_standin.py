"""`diagnose` on TorchTPU code runs it on the TorchTPU stand-in (backend `standin`, issue 47): the
`tpu` device emulated on the CPU reports every transfer to the host, so host syncs are counted
exactly (a read is a sync exactly when its tensor is a tpu tensor) instead of guessed from the
source. Real programs under the real CLI, on the stand-in's Python (.venv-tpu, torch 2.13)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import shared_runs
from conftest import ROOT
from test_diagnose import diagnose, diagnosed

from tpu_migrate.diagnose.analysis import HOST_ONLY_NATIVE_NOTE, HOST_ONLY_NOTE
from tpu_migrate.diagnose.command import auto_backend
from tpu_migrate.rewrite.context import Options
from tpu_migrate.rewrite.engine import rewrite_bytes

PROGRAMS = ROOT / "fixtures" / "diagnose" / "standin"


def line_of(program: Path, marker: str) -> int:
    for number, text in enumerate(program.read_text().splitlines(), 1):
        if "# expect:" in text and marker in text.split("# expect:", 1)[1]:
            return number
    raise AssertionError(f"no '# expect: {marker}' in {program.name}")


def findings(document) -> dict[tuple, dict]:
    return {(f["kind"], Path(f["file"]).name, f["line"], f["op"]): f for f in document["findings"]}


def run(program: Path, *options: str):
    result = diagnosed(program, *options)
    assert result.stdout, result.stderr[-3000:]
    return result, json.loads(result.stdout)


# -- auto picks the backend from the program's imports and device (fast) ------------------------------

def test_auto_backend_is_an_import_check_not_a_text_search():
    tpu = 'device = torch.device("tpu")\n'
    assert auto_backend(b"import torch_xla.core.xla_model as xm\n") == "xla"
    assert auto_backend(b"def f():\n    from torch_xla import runtime\n") == "xla"
    # The tool's own helpers name torch_xla in their docstrings: no import, not xla.
    assert auto_backend(b'"""As torch_xla answered it."""\nimport torch\n' + tpu.encode()) == "standin"
    assert auto_backend(b"import torch\nmodel = model.to('tpu:0')\n") == "standin"
    assert auto_backend(b"import torch\nx = torch.ones(2, device='tpu')\n") == "standin"
    assert auto_backend(b"model = model.tpu()\n") == "standin"
    assert auto_backend(b"import torch\nn = torch.tpu.device_count()\n") == "standin"
    assert auto_backend(b"import torch_tpu\n") == "standin"
    # torch_xla wins: a program that imports it runs on torch_xla whatever else it names.
    assert auto_backend(b"import torch_xla\nd = torch.device('tpu')\n") == "xla"
    # Not the device: a flag, a word in a string, a CPU or CUDA program.
    for source in (b"if args.tpu:\n    pass\n", b"print('tpu time')\n", b"d = torch.device('cpu')\n",
                   b"d = 'cuda'\n"):
        assert auto_backend(source) == "auto", source
    assert auto_backend(b"import torch_xla\nthis is not python(\n") == "xla"
    assert auto_backend(b"this is not python(\n") == "auto"


def test_auto_backend_picks_the_stand_in_for_the_tools_own_tpu_output():
    original = (ROOT / "fixtures" / "examples" / "train_mnist_xla.py").read_bytes()
    migrated = rewrite_bytes(original, "train_mnist_xla.py", Options(target="tpu")).output
    assert b"torch_xla" in migrated  # the helpers' docstrings: "as torch_xla answered it"
    assert auto_backend(original) == "xla"
    assert auto_backend(migrated) == "standin"


# -- runs on the stand-in ----------------------------------------------------------------------------

@pytest.mark.slow  # a TorchTPU training program under diagnose, on the stand-in
def test_reads_of_tpu_tensors_are_counted_exactly_and_host_reads_are_not_syncs():
    program = PROGRAMS / "train_tpu.py"
    result, document = run(program)  # auto: the program names the tpu device
    assert result.returncode == 0, result.stderr[-3000:]
    assert document["backend"] == "standin" and document["device"] == "tpu"
    assert document["steps"] == 6
    name = program.name
    every, other = line_of(program, "sync (item) every step"), line_of(program, "every other step")
    index = line_of(program, "indexing with a tpu scalar")
    found = findings(document)
    assert set(found) == {("sync", name, every, "item"), ("sync", name, other, "item"),
                          ("sync", name, index, "indexing with a tpu scalar")}
    assert found["sync", name, every, "item"]["count"] == 6
    assert found["sync", name, other, "item"]["count"] == 3
    assert found["sync", name, index, "indexing with a tpu scalar"]["count"] == 6  # read by torch's C++
    assert not any(f.get("via") for f in document["findings"])
    # The host tensors' reads (.item(), printing, .tolist()) are no syncs, nor noted as reads.
    for host in (line_of(program, "host read, no sync ("), line_of(program, "host reads, no sync")):
        assert not any(f["line"] == host for f in document["findings"])
        assert not any(f"{name}:{host}" in note for note in document.get("notes", []))
    assert "the TorchTPU stand-in" in result.stderr and "counted exactly" in result.stderr
    assert "estimated" in found["sync", name, every, "item"]["message"]  # the CPU's compute, labelled


@pytest.mark.slow  # the tool's --target tpu output of a torch_xla program, under diagnose --backend auto
def test_auto_diagnoses_the_tools_tpu_output_on_the_stand_in():
    source = ROOT / "fixtures" / "diagnose" / "training_state_and_closure.py"

    def make():
        directory = shared_runs.session_directory("standin-migrated")
        copy = directory / source.name
        shutil.copyfile(source, copy)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        rewritten = subprocess.run([sys.executable, "-m", "tpu_migrate", "rewrite", "--target", "tpu", "--no-cache",
                                    str(copy)], capture_output=True, text=True, env=env, timeout=300)
        assert rewritten.returncode in (0, 1), rewritten.stderr
        return copy.read_text(), diagnose("--format", "json", str(copy), env=env)

    text, result = shared_runs.once(f"diagnose standin-migrated {shared_runs.file_key(source)}", make)
    assert "torch_xla" in text and "import torch_xla" not in text  # named in a docstring only
    assert result.returncode == 0, result.stderr[-3000:]
    document = json.loads(result.stdout)
    assert document["backend"] == "standin"
    lines = text.splitlines()
    read = next(i for i, line in enumerate(lines, 1) if "round(loss.item(), 4)" in line)
    closure = next(i for i, line in enumerate(lines, 1) if '"doubled"' in line)
    picked = next(i for i, line in enumerate(lines, 1) if '"picked"' in line)  # a host table[tpu scalar]
    assert {(f["kind"], f["line"], f["op"], f["count"]) for f in document["findings"]} == {
        ("sync", read, "item", 9), ("sync", closure, "item", 2), ("sync", picked, "indexing with a tpu scalar", 2)}
    # The closure's read became a read in a loop after the training steps: a finding, as a loop is.
    assert "in a loop after the last step" in next(f for f in document["findings"] if f["line"] == closure)["message"]
    # Read once after the training loop: not repeated, noted.
    once = next(note for note in document["notes"] if note.startswith("host reads not repeated"))
    assert " int x1" in once and " item" not in once


@pytest.mark.slow  # a program on the stand-in that keeps every tensor on the host
def test_a_run_without_tpu_tensors_says_so_instead_of_a_clean_report():
    program = PROGRAMS / "host_device.py"
    result, document = run(program, "--backend", "standin")
    assert result.returncode == 0, result.stderr[-3000:]
    assert document["backend"] == "standin" and document["findings"] == []
    assert document["notes"][0] == HOST_ONLY_NOTE
    assert 'torch.device("tpu")' in HOST_ONLY_NOTE and "every tensor stayed on the host" in HOST_ONLY_NOTE
    assert "not diagnosed for a TPU" in result.stderr
    assert "no recompilation, graph break, host sync" not in result.stderr


@pytest.mark.slow  # a torch.compile program on the stand-in under diagnose
def test_dynamo_findings_and_op_coverage_work_on_the_stand_in():
    program = PROGRAMS / "compiled_tpu.py"
    _, document = run(program)
    name = program.name
    item = line_of(program, "graph break (Tensor.item)")
    found = findings(document)
    kinds = {(kind, line) for kind, _, line, _ in found}
    assert ("recompile", line_of(program, "recompiles after warm-up")) in kinds
    assert ("graph-break", item) in kinds
    assert ("unsupported-op", line_of(program, "unsupported (aten::median)")) in kinds
    assert found["sync", name, item, "item"]["count"] == 6  # the eager part after the break, every step
    # What Dynamo traced into the stand-in's own Python (its device guard) is no finding.
    assert not any("torch_tpu" in f["file"] or "sourceless" in f["message"] for f in document["findings"])


@pytest.mark.slow  # the same program natively, the CPU standing in for the TPU
def test_a_native_run_that_puts_every_tensor_on_the_cpu_says_so():
    """Issue 50, item 4: `device = torch.device("cpu")` made every tensor a host tensor, and the
    native run reported "no host sync" for reads that a TPU would wait for."""
    result, document = run(PROGRAMS / "host_device.py", "--backend", "native")
    assert result.returncode == 0, result.stderr[-3000:]
    assert document["backend"] == "native" and document["findings"] == []
    assert document["notes"][0] == HOST_ONLY_NATIVE_NOTE
    assert "every tensor was judged a host tensor" in HOST_ONLY_NATIVE_NOTE
    assert "torch.accelerator.current_accelerator()" in HOST_ONLY_NATIVE_NOTE and "stand-in" in HOST_ONLY_NATIVE_NOTE
    assert "not diagnosed for a TPU" in result.stderr
    assert "no recompilation, graph break, host sync" not in result.stderr


@pytest.mark.slow
def test_a_stand_in_python_that_does_not_fit_is_a_usage_error():
    result = diagnose("--backend", "standin", "--python", sys.executable, str(PROGRAMS / "host_device.py"))
    assert result.returncode == 2
    assert f"--python {sys.executable}: not a Python with torch 2.11 to 2.15" in result.stderr
    result = diagnose("--backend", "native", "--python", sys.executable, str(PROGRAMS / "host_device.py"))
    assert result.returncode == 2 and "--backend standin" in result.stderr


@pytest.mark.slow  # nanoGPT's training loop, migrated to the tpu device, under diagnose
def test_nanogpt_item_reads_are_found_with_exact_counts():
    program = PROGRAMS / "nanogpt_train.py"
    result, document = run(program)
    assert result.returncode == 0, result.stderr[-3000:]
    assert document["backend"] == "standin" and document["optimizer_steps"] == 9
    name = program.name
    evaluation, logging = line_of(program, "sync (item) in evaluation"), line_of(program, "every iteration")
    found = findings(document)
    assert set(found) == {("sync", name, evaluation, "item"), ("sync", name, logging, "item")}
    # 3 evaluations (iterations 0, 4, 8) x 2 splits x eval_iters 2; a log every iteration of 9.
    assert found["sync", name, evaluation, "item"]["count"] == 12
    assert "in 3 of 9 steps" in found["sync", name, evaluation, "item"]["message"]
    assert found["sync", name, logging, "item"]["count"] == 9
    # `losses` is a host tensor: its mean, formatted every evaluation, is no read of the device.
    assert "notes" not in document or not any("host reads not repeated" in note for note in document["notes"])
