"""What does `tpu-migrate verify` cost, against running the two programs yourself?

    python benchmarks/bench_verify.py [--pairs 3] [--steps 200] [--target tpu|portable] [--mnist]

A small training program (torch_xla's xm.optimizer_step, equal slices of a global batch; with
`--mnist`, pytorch/xla's test_train_mp_mnist.py on fake data, the suite's fixture) and its
migration. Alternating, so that this machine's noise falls on every figure alike:

- bare: each side (the original under torch_xla, PJRT_DEVICE=CPU; the migrated copy at one
  process, on the stand-in for `--target tpu`) run exactly as verify runs it, without the
  recorder: what a user would run by hand;
- recorded: the same runs with verify's recorder in them (its overhead, per side);
- verify: the whole command at --nproc 1 (the original twice, the migration, the copy, the
  comparison), against the sum of the bare runs it needs (the original twice, the migrated once).

Prints the medians and the ratios, of the wall time and of the CPU time the runs' processes
took (user + system, of every process of the run: on a machine that others load, the wall time
is mostly theirs; the CPU time is the run's own).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tpu_migrate import standin
from tpu_migrate.verify.runs import Target, Workspace

ROOT = Path(__file__).resolve().parent.parent
MNIST = ROOT / "fixtures" / "programs" / "real" / "pytorch_xla" / "test" / "test_train_mp_mnist.py"
MNIST_FLAGS = ["--fake_data", "--num_cores", "1", "--num_epochs", "1", "--batch_size", "32", "--log_steps", "5"]

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


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(workspace: Workspace, side: str, target: Target, args: list[str], recorded: bool) -> tuple[float, float]:
    """One run of `side` as verify runs it; without the recorder where not `recorded` (its
    sitecustomize taken away, the rest of the environment the same)."""
    site = workspace.site
    if not recorded:
        workspace.site = workspace.path / "bare-site"
        workspace.site.mkdir(exist_ok=True)
    start, cpu = time.perf_counter(), _children_cpu()
    try:
        # The original as its first run, the costliest: its writes watched (schedule.py).
        run = workspace.run(side, side, target, args, 1, 900, watch_writes=recorded and side == "original")
    finally:
        workspace.site = site
    elapsed = time.perf_counter() - start, _children_cpu() - cpu
    assert run.returncode == 0, run.output
    assert bool(run.records) == recorded, (side, recorded, len(run.records))
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--target", choices=("tpu", "portable"), default="tpu")
    parser.add_argument("--mnist", action="store_true", help="pytorch/xla's MNIST script on fake data")
    parser.add_argument("--no-verify", action="store_true", help="the runs only, not the whole command")
    options = parser.parse_args()
    migrated_python = standin.find_python(None, create=False) if options.target == "tpu" else None
    with tempfile.TemporaryDirectory() as tmp:
        if options.mnist:
            script, args = MNIST, list(MNIST_FLAGS)
        else:
            script, args = Path(tmp) / "train.py", [str(options.steps)]
            script.write_text(PROGRAM)
        workspace = Workspace(target=options.target,
                              migrated_interpreter=(lambda env: migrated_python) if migrated_python else None)
        os.chdir(tmp)
        try:
            original = Target(script, None, False)
            migrated = workspace.migrate(original)
            times: dict[str, list[tuple[float, float]]] = {name: [] for name in (
                "original bare", "original recorded", "migrated bare", "migrated recorded", "verify")}
            for _ in range(options.pairs):
                for side, target in (("original", original), ("migrated", migrated)):
                    for recorded in (False, True):
                        times[f"{side} {'recorded' if recorded else 'bare'}"].append(
                            _run(workspace, side, target, args, recorded))
                if not options.no_verify:
                    start, cpu = time.perf_counter(), _children_cpu()
                    env = {**os.environ, "PYTHONPATH": str(ROOT)}
                    if migrated_python:
                        env[standin.PYTHON_VARIABLE] = migrated_python
                    subprocess.run([sys.executable, "-m", "tpu_migrate", "verify", "--nproc", "1", "--target",
                                    options.target, str(script), *args], env=env, cwd=tmp, check=True,
                                   capture_output=True)
                    times["verify"].append((time.perf_counter() - start, _children_cpu() - cpu))
        finally:
            workspace.close()
    print(f"{'MNIST' if options.mnist else f'{options.steps} steps'}, target {options.target}, "
          f"{options.pairs} alternations, medians (wall | CPU):")
    for what, index in (("wall", 0), ("CPU", 1)):
        median = {name: statistics.median(v[index] for v in values) for name, values in times.items() if values}
        for side in ("original", "migrated"):
            bare, recorded = median[f"{side} bare"], median[f"{side} recorded"]
            print(f"  {what:4} {side:9} bare {bare:6.2f} s  recorded {recorded:6.2f} s  x{recorded / bare:.2f}")
        if "verify" in median:
            plain = 2 * median["original bare"] + median["migrated bare"]
            print(f"  {what:4} verify    {median['verify']:6.2f} s  x{median['verify'] / plain:.2f} of the plain runs "
                  f"it needs (the original twice, the migrated once: {plain:.2f} s)")


if __name__ == "__main__":
    main()
