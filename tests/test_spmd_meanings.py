"""What torch_xla's process queries and collectives answered under SPMD, run on XLA:CPU with four
virtual devices, against what the rewrite does with them: each call whose answer a conversion
would change (rules' `under_spmd`) keeps a TODO, and the one that keeps its meaning converts."""

from __future__ import annotations

import json

import pytest

import differential as harness
from tpu_migrate.rewrite.context import Options
from tpu_migrate.rewrite.engine import rewrite_bytes

PROGRAM = '''\
import json
import torch
import torch_xla.core.xla_model as xm
import torch_xla.runtime as xr

xr.use_spmd()
t = torch.arange(4.0, device=xm.xla_device())
facts = {
    "global_device_count": xr.global_device_count(),
    "local_device_count": xr.local_device_count(),
    "addressable_device_count": xr.addressable_device_count(),
    "global_runtime_device_count": xr.global_runtime_device_count(),
    "all_reduce": xm.all_reduce(xm.REDUCE_SUM, t).tolist(),
    "all_gather": xm.all_gather(t).tolist(),
    "mesh_reduce": xm.mesh_reduce("tag", 3.0, sum),
}
print("@facts " + json.dumps(facts))
'''
DEVICES = 4
# What each call answered under SPMD: 1 and the input itself, whatever the device count.
SPMD_ANSWERS = {"global_device_count": 1, "local_device_count": 1, "addressable_device_count": 1,
                "all_reduce": [0.0, 1.0, 2.0, 3.0], "all_gather": [0.0, 1.0, 2.0, 3.0], "mesh_reduce": 3.0}


@pytest.mark.slow
def test_calls_that_answered_one_process_under_spmd_keep_a_todo(tmp_path):
    program = tmp_path / "spmd_facts.py"
    program.write_text(PROGRAM)
    run = harness.run_bounded(program, {**harness.original_mp_env(), "CPU_NUM_DEVICES": str(DEVICES)})
    assert run.returncode == 0, run.output[-2000:]
    facts = json.loads(next(line for line in run.output.splitlines() if line.startswith("@facts "))[7:])
    assert facts == {**SPMD_ANSWERS, "global_runtime_device_count": DEVICES}

    result = rewrite_bytes(PROGRAM.encode(), str(program), Options(target="portable"))
    lines = PROGRAM.splitlines()
    left = {next(name for name in facts if f'"{name}"' in lines[m.line - 1]) for m in result.manual
            if m.todo and m.code != "TPU170"}
    assert left == set(SPMD_ANSWERS)
    # The device count of the job: the world size of one process per TPU, converted.
    converted = next(line for line in result.output.decode().splitlines() if '"global_runtime_device_count"' in line)
    assert "dist.get_world_size()" in converted, converted
