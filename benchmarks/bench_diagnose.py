"""How much does `tpu-migrate diagnose` slow a training program down?

    python benchmarks/bench_diagnose.py [--steps 300] [--pairs 3]

Runs a small training program on torch_xla's CPU backend plainly and under `diagnose`,
alternating the two (these machines are noisy, and alternation spreads the noise over both), and
prints the median wall time of each and their ratio; then the same for `diagnose --explain`.
Wall time includes interpreter and torch_xla start-up, as a user experiences it.
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

ROOT = Path(__file__).resolve().parent.parent

PROGRAM = """
import sys
import torch
import torch_xla
import torch_xla.core.xla_model as xm

steps = int(sys.argv[1])
device = torch_xla.device()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, 32).to(device), torch.randn(64, 1).to(device)
for step in range(steps):
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    xm.mark_step()
    if step % 50 == 0:
        print(step, loss.item())
"""


def timed(command: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    env = {**os.environ, "PJRT_DEVICE": "CPU", "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as tmp:
        program = Path(tmp) / "train_small.py"
        program.write_text(PROGRAM)
        plain = [sys.executable, str(program), str(args.steps)]
        traced = [sys.executable, "-m", "tpu_migrate", "diagnose", str(program), str(args.steps)]
        explained = [sys.executable, "-m", "tpu_migrate", "diagnose", "--explain", str(program), str(args.steps)]
        times = {"plain": [], "diagnose": [], "diagnose --explain": []}
        for _ in range(args.pairs):
            times["plain"].append(timed(plain, env))
            times["diagnose"].append(timed(traced, env))
            times["plain"].append(timed(plain, env))
            times["diagnose --explain"].append(timed(explained, env))
    base = statistics.median(times["plain"])
    print(f"{args.steps} steps, {args.pairs} alternating pairs, median wall time")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:20} {median:7.2f}s   ratio {median / base:5.2f}")


if __name__ == "__main__":
    main()
