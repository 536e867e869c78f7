"""torch_xla.launch under torchrun on two hosts (TPU060): the original called fn(LOCAL_RANK), so
the migrated worker must get the index on its host, not the global rank.

Two hosts of one process each stand as torchrun would start them (RANK, LOCAL_RANK, WORLD_SIZE,
TORCHELASTIC_RUN_ID and the master in the environment; torchrun's agents would only add time):
the original (torch_xla on the CPU; fn touches no device) and the portable migration (gloo) each
run on both "hosts" at once."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

import differential as harness
from fixture_spec import output, rewrite

pytestmark = pytest.mark.slow  # four processes that import torch

PROGRAM = harness.PROGRAMS / "pod" / "d02_launch_index_under_torchrun.py"
LAUNCH_LINE = re.compile(r"^@launch (\{.*\})$", re.M)


def _two_hosts(path: Path, tmp_path: Path, original: bool) -> list[dict]:
    """Run `path` as torchrun's one process on each of two hosts; the `@launch` records by host.
    From the harness's warm python (torch_xla imported for the original: XLA:CPU)."""
    port = str(harness.free_port())
    procs = []
    for host in (0, 1):
        # TORCH_DIST_INIT_BARRIER: the worker runs no collective, so without init's own barrier
        # host 1 could finish, and close its side of gloo's mesh, while host 0 still connects.
        env = {**harness._mp_env({}), **({"PJRT_DEVICE": "CPU"} if original else {}), "RANK": str(host),
               "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": str(host),
               "NODE_RANK": str(host), "TORCHELASTIC_RUN_ID": "pod", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
               "TORCH_DIST_INIT_BARRIER": "1"}
        procs.append(subprocess.Popen(harness._command(path, [], env, None), env=env, cwd=tmp_path, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outputs = [proc.communicate(timeout=120)[0] for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), "\n".join(
        f"===== host {host} (exit {proc.returncode}) =====\n{out[-3000:]}" for host, (proc, out)
        in enumerate(zip(procs, outputs)))
    return [[json.loads(line) for line in LAUNCH_LINE.findall(out)] for out in outputs]


def test_the_worker_gets_its_index_on_its_host_as_the_original_did(tmp_path):
    original = _two_hosts(PROGRAM, tmp_path, original=True)
    assert original == [[{"index": 0, "rank": 0}], [{"index": 0, "rank": 1}]]
    data = PROGRAM.read_bytes()
    migrated = tmp_path / PROGRAM.name
    migrated.write_bytes(output(rewrite(data, "portable", PROGRAM.name), data))
    assert "import torch_xla" not in migrated.read_text()
    assert _two_hosts(migrated, tmp_path, original=False) == original
