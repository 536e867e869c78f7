"""The TorchTPU stand-in (tpu_migrate/standin): a program written against torch-tpu 0.2.0's API
behaves under `tpu-migrate run` as shared/reference/torchtpu-target-api.md says it does on a TPU
VM: the device, torch.accelerator, the legacy torch.tpu calls that raise, autograd, host reads
counted exactly, torch.compile's "tpu" backend and what it refuses, autocast, and tpu_dist
across processes and across the hosts of an emulated pod.

The programs run in the stand-in's own environment (.venv-tpu, torch 2.13, made by README's test
command), as a user's would: `tpu-migrate run` from the tool's environment (torch 2.9).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from conftest import ROOT, cli_env, run_cli

pytestmark = pytest.mark.slow  # torch 2.13 programs, torchrun worlds

PROGRAMS = ROOT / "fixtures" / "standin"
INTERNAL = ("{} is internal to TorchTPU and can only be called by the PyTorch framework (torch and torch_tpu). "
            "Use torch.accelerator.{} instead.")


def observations(stdout: str) -> dict:
    return {name: json.loads(value) for name, _, value in (line.partition(" ") for line in stdout.splitlines())}


def test_a_torchtpu_program_behaves_as_on_a_tpu_vm(tmp_path):
    proc = run_cli("run", str(PROGRAMS / "torchtpu_api.py"), "5", cwd=tmp_path)
    stdout, stderr = proc.stdout.decode(), proc.stderr.decode()
    assert proc.returncode == 5, stdout + stderr  # the program's own exit status
    seen = observations(stdout)
    assert seen["device"] == "tpu"
    # A TPU VM of 4 chips (a v4 host), this process bound to chip 0.
    assert seen["accelerator"] == [True, "tpu", 4, 0]
    assert seen["set_device_index_0"] == ["value", None]
    assert seen["set_device_index_1"] == [
        "ValueError", "Cannot set TPU device to index 1, current process is bound to device index 0. Changing the "
        "active TPU device within a process is not supported."]
    assert seen["legacy_is_available"] == ["RuntimeError", INTERNAL.format("is_available", "is_available")]
    assert seen["legacy_device_count"] == ["RuntimeError", INTERNAL.format("device_count", "device_count")]
    assert seen["missing_name"] == ["AttributeError", "module 'torch.tpu' has no attribute 'mark_step'"]
    assert seen["synchronize"] == ["value", None]
    assert seen["placement"] == [True, "tpu", "tpu:0", "tpu:0"]
    assert seen["mixed_devices"][0] == "RuntimeError" and "tpu:0 and cpu" in seen["mixed_devices"][1]
    assert len(seen["losses"]) == 3 and seen["losses"] == sorted(seen["losses"], reverse=True)
    # One .item() per step, and the formatted loss and its .item(): 5 host reads, nothing else.
    assert seen["reads"] == {"read": 5, "copy": 0, "dynamic": 0}
    assert seen["formatted"] is True
    # .cpu() and .tolist() are copies; bool() of a tpu tensor is a read.
    assert seen["transfers"] == {"read": 1, "copy": 2, "dynamic": 0}
    assert seen["host_copy"] == ["cpu", 8]
    assert seen["compiled"] is True and seen["compile_default"][0] == "value"
    assert seen["compiled_module"] == ["tpu:0", 2]
    assert "torch.compile(..., backend='inductor') on TPU is experimental" in seen["compile_inductor"][1]
    assert "TPU backend does not support torch.compile(..., dynamic=True, ...)" in seen["compile_dynamic"][1]
    assert "Unexpected keyword arguments: {'mode': 'max-autotune'}" in seen["compile_mode"][1]
    assert seen["autocast"] == ["torch.bfloat16", "tpu:0", "torch.bfloat16", "torch.bfloat16", "torch.float32",
                                "torch.float32"]
    assert seen["experimental_warns"] == [True, True]
    assert "Successfully renamed PrivateUse1 backend to 'tpu'" in stderr


def test_the_legacy_apis_warn_instead_with_torchtpu_s_escape_hatch(tmp_path):
    program = tmp_path / "legacy.py"
    program.write_text("import sys, warnings\nimport torch\nwarnings.simplefilter('always')\n"
                       "print(torch.tpu.is_available(), torch.tpu.device_count())\n"
                       "print('tpu_migrate' in sys.modules)\n")
    env = {**cli_env(), "TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS": "1"}
    proc = subprocess.run([sys.executable, "-m", "tpu_migrate", "run", str(program)], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    # Answered, with TorchTPU's warning; and the program never loaded the tool.
    assert proc.stdout.splitlines() == ["True 4", "False"]
    assert ("<TorchTpu/ApiStage/InternalApi/> is_available is internal to TorchTPU and may change or be removed "
            "without notice. Use torch.accelerator.is_available instead.") in proc.stderr


def test_tpu_dist_carries_tpu_tensors_across_processes_and_hosts(tmp_path):
    """Two hosts of two chips: each host's torchrun on this machine, one world of 4; a group made
    with backend gloo refuses tpu tensors."""
    proc = run_cli("run", "--nproc", "2", "--nnodes", "2", str(PROGRAMS / "torchtpu_distributed.py"), cwd=tmp_path)
    stdout = proc.stdout.decode()
    assert proc.returncode == 0, stdout + proc.stderr.decode()[-3000:]
    records = sorted((json.loads(line) for line in stdout.splitlines() if line.startswith("{")),
                     key=lambda record: record["rank"])
    assert [r["rank"] for r in records] == [0, 1, 2, 3]
    assert {r["world"] for r in records} == {4} and {r["device"] for r in records} == {"tpu:0"}
    assert [r["node"] for r in records] == [0, 0, 1, 1] and {r["nnodes"] for r in records} == {"2"}
    assert all(r["all_reduce"] == [10.0, 10.0] for r in records)  # 1 + 2 + 3 + 4
    assert all(r["all_gather"] == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0] for r in records)
    # DDP averaged the gradients of inputs 1..4: (1 + 2 + 3 + 4) * 2 rows / 4 ranks = 5.
    assert all(r["ddp_grad"] == [[5.0, 5.0, 5.0]] for r in records)
    # A gloo group carries CPU tensors; c10d finds no backend of it for a tpu tensor, as with TorchTPU.
    assert all(r["gloo_cpu"] == 4.0 for r in records)
    assert all(r["gloo_tpu"] == "No backend type associated with device type tpu" for r in records)


def test_run_is_python_with_the_tpu_device(tmp_path):
    """argv, the working directory, stdin, a module, and the exit status are the program's."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "main.py").write_text(
        "import os, sys\nimport torch\n"
        "print(sys.argv[1:], os.getcwd(), sys.stdin.read().strip(), torch.ones(1, device='tpu').device)\n"
        "sys.exit(7)\n")
    proc = run_cli("run", "-m", "pkg.main", "a", "--flag", cwd=tmp_path, input=b"fed\n")
    assert proc.returncode == 7, proc.stderr.decode()
    assert proc.stdout.decode().split() == ["['a',", "'--flag']", str(tmp_path), "fed", "tpu:0"]


def test_run_refuses_a_python_whose_torch_torchtpu_cannot_run_on(tmp_path):
    """The tool's own environment has torch 2.9 (torch_xla's): TorchTPU needs 2.11 to 2.15."""
    (tmp_path / "train.py").write_text("print('ran')\n")
    proc = run_cli("run", "--python", str(ROOT / ".venv" / "bin" / "python"), "train.py", cwd=tmp_path)
    stderr = proc.stderr.decode()
    assert proc.returncode == 2 and b"ran" not in proc.stdout
    assert "not a Python with torch 2.11 to 2.15" in stderr and "Traceback" not in stderr


def test_the_docs_name_every_public_name_the_stand_in_only_raises_for():
    """docs/commands/run.md lists what is not modelled: each name by itself or by a `prefix*`."""
    probe = ("import json, torch\nfrom torch_tpu._standin import public_api\n"
             "print(json.dumps(public_api.NOT_MODELLED + public_api.NOT_MODELLED_PRIVATE))")
    from tpu_migrate import standin

    proc = subprocess.run([standin.find_python(create=False), "-c", probe], capture_output=True, text=True,
                          env={**standin.environment(), "TORCH_TPU_STANDIN_QUIET": "1"}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    names = json.loads(proc.stdout)
    assert len(names) > 30
    page = (ROOT / "docs" / "commands" / "run.md").read_text()
    words = set(re.findall(r"`[^`]*`", page))
    prefixes = [word.strip("`").rstrip("*").rpartition(".")[2] for word in words if word.endswith("*`")]
    missing = [name for name in names if f"`{name.rpartition('.')[2]}`" not in words and f"`{name}`" not in words
               and not any(prefix and name.rpartition(".")[2].startswith(prefix) for prefix in prefixes)]
    assert not missing, missing
