"""What does the TorchTPU stand-in cost, against the same program on plain CPU tensors?

    python benchmarks/bench_standin.py [--python .venv-tpu/bin/python] [--pairs 5] [--steps 200]

One training program (an MLP, SGD, a loss read with .item() every step), run in the stand-in's
Python twice over, alternating so this machine's noise falls on both alike:

- cpu: `--device cpu`, the stand-in not loaded: the floor;
- standin: `--device tpu` under `tpu-migrate run`'s environment: every op dispatched through
  the stand-in's tpu tensor;
- standin-compiled: the same with the step under torch.compile(backend="tpu").

Each run times its own steps (after two warm-up steps), so interpreter start-up is left out.
Prints the medians and the ratios to cpu.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tpu_migrate import standin  # noqa: E402

PROGRAM = """
import sys, time
import torch
device, steps, compiled = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 64).to(device), torch.randn(32, 8).to(device)
loss_of = lambda: torch.nn.functional.mse_loss(model(x), y)
if compiled:
    loss_of = torch.compile(loss_of)
for step in range(steps + 2):
    if step == 2:
        start = time.perf_counter()
    optimizer.zero_grad()
    loss = loss_of()
    loss.backward()
    optimizer.step()
    loss.item()
print(f"{(time.perf_counter() - start) / steps * 1e6:.1f}")
"""


def run(python: str, env: dict[str, str], path: str, device: str, steps: int, compiled: bool) -> float:
    proc = subprocess.run([python, path, device, str(steps), "1" if compiled else "0"], env=env,
                          capture_output=True, text=True, check=True)
    return float(proc.stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=None, help="a Python with torch 2.11-2.15 (default: as tpu-migrate run)")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200)
    options = parser.parse_args()
    python = standin.find_python(options.python)
    plain = {**os.environ, "OMP_NUM_THREADS": "1"}
    stand_in = {**standin.environment(plain), "TORCH_TPU_STANDIN_QUIET": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "train.py")
        Path(path).write_text(PROGRAM)
        times = {"cpu": [], "standin": [], "standin-compiled": []}
        for _ in range(options.pairs):
            times["cpu"].append(run(python, plain, path, "cpu", options.steps, False))
            times["standin"].append(run(python, stand_in, path, "tpu", options.steps, False))
            times["standin-compiled"].append(run(python, stand_in, path, "tpu", options.steps, True))
    floor = statistics.median(times["cpu"])
    print(f"{'run':<18}{'us/step':>10}{'ratio':>8}   ({options.pairs} runs each, {options.steps} steps, median)")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:<18}{median:>10.1f}{median / floor:>8.2f}")


if __name__ == "__main__":
    main()
