"""What does `tpu-migrate verify` cost, against running the two programs yourself?

    python benchmarks/bench_verify.py [--pairs 3] [--steps 200]

A small training program (torch_xla's xm.optimizer_step, equal slices of a global batch) and its
portable migration. Alternating, so that this machine's noise falls on every figure alike:

- bare: the original under torch_xla (PJRT_DEVICE=CPU) and the migrated copy at one process,
  each plainly: what a user would run by hand;
- recorded: the same two runs with verify's recorder in them (recorder overhead);
- verify: the whole command at --nproc 1 (the original twice, the migration, the copy, the
  comparison).

Prints the medians and the ratios to bare.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tpu_migrate.verify.runs import Target, Workspace

PROGRAM = """
import sys
import torch
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.runtime as xr

steps = int(sys.argv[1])
torch.manual_seed(0)
device = torch_xla.device()
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.randn(64, 64)
target = torch.randint(0, 8, (64,))
per = 64 // xr.world_size()
x = data[xr.global_ordinal() * per:][:per].to(device)
y = target[xr.global_ordinal() * per:][:per].to(device)
for step in range(steps):
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    xm.optimizer_step(optimizer)
    xm.mark_step()
"""


def _timed(command, env, cwd) -> float:
    start = time.perf_counter()
    subprocess.run(command, env=env, cwd=cwd, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "train.py"
        script.write_text(PROGRAM)
        workspace = Workspace()
        try:
            original = Target(script, None, False)
            migrated = workspace.migrate(original)
            env = {**os.environ, "PJRT_DEVICE": "CPU", "OMP_NUM_THREADS": "1"}
            blocked = {**env, "PYTHONPATH": str(workspace.blocker)}
            times: dict[str, list[float]] = {"bare": [], "recorded": [], "verify": []}
            args = [str(options.steps)]
            for _ in range(options.pairs):
                times["bare"].append(_timed([sys.executable, str(script), *args], env, tmp)
                                     + _timed([sys.executable, str(migrated.path), *args], blocked, tmp))
                start = time.perf_counter()
                for side, target in (("original", original), ("migrated", migrated)):
                    run = workspace.run(side, side, target, args, 1, 600)
                    assert run.returncode == 0 and len(run.records) == options.steps, run.output
                times["recorded"].append(time.perf_counter() - start)
                times["verify"].append(_timed([sys.executable, "-m", "tpu_migrate", "verify", "--nproc", "1",
                                               script.name, *args], os.environ, tmp))
        finally:
            workspace.close()
    bare = statistics.median(times["bare"])
    print(f"{options.steps} steps, {options.pairs} alternations, medians:")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:9} {median:6.1f} s  x{median / bare:.2f} of bare")


if __name__ == "__main__":
    main()
