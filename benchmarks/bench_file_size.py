"""How `tpu-migrate rewrite --check` grows with one file's size: torch_xla files of 0.25 to
2 MiB, each rewritten by the CLI as a user runs it (a subprocess, one job, no cache).

    python benchmarks/bench_file_size.py                  # real code: 0.25, 0.5, 1, 2 MiB
    python benchmarks/bench_file_size.py --mix dense --sizes 0.25 1 4 --repeat 3

`--mix real` (the default) is made of real code: the functions and classes of fixtures/corpus/
that use torch_xla, repeated under new names (benchmarks/real_code.py). `--mix dense` repeats
one training function (a device, a loader loop, an optimizer step, a rank-gated print, a save,
a collective: the rules that look at the whole file or at their function). Beside each run, in
this process and session, the floor the tool cannot avoid: libcst's parse and print of the same
file. Printed per size: the tool's seconds, its seconds per MiB, its ratio to the floor, its
peak memory, and the growth ratio to the previous size (time(2x) / time(x): 2.0 is linear; 4.0
is quadratic); then 1 MiB / 0.25 MiB where both ran. Targets (issue 52): 1 MiB within 2x the
floor, 1 MiB / 0.25 MiB within 4.4.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import libcst as cst

ROOT = Path(__file__).resolve().parent.parent
MIB = 1 << 20
sys.path.insert(0, str(ROOT / "benchmarks"))
from real_code import real_code  # noqa: E402

HEADER = """import torch
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.distributed.parallel_loader as pl
import torch_xla.runtime as xr
"""
FUNCTION = '''

def train_{n}(model, loader, optimizer, loss_fn, path):
    device = xm.xla_device()
    model = model.to(device)
    for step, (data, target) in enumerate(pl.MpDeviceLoader(loader, device)):
        optimizer.zero_grad()
        loss = loss_fn(model(data), target)
        loss.backward()
        xm.optimizer_step(optimizer)
        if step % 10 == 0:
            xm.master_print(f"step {{step}} loss {{loss.item()}} rank {{xr.global_ordinal()}}")
    total = xm.all_reduce(xm.REDUCE_SUM, loss.detach())
    xm.save(model.state_dict(), path)
    return total
'''


def dense_file(size: int) -> str:
    parts, length, n = [HEADER], len(HEADER), 0
    while length < size:
        part = FUNCTION.format(n=n)
        parts.append(part)
        length += len(part)
        n += 1
    return "".join(parts)


def floor(text: str) -> float:
    start = time.perf_counter()
    cst.parse_module(text).code
    return time.perf_counter() - start


def run_tool(path: Path) -> tuple[float, int, int]:
    """(wall seconds, peak RSS in MiB of the tool's processes, exit status)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as cache:
        env["TPU_MIGRATE_CACHE_DIR"] = cache
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "tpu_migrate", "rewrite", "--check", "--jobs", "1",
                               "--max-file-size", "0", "--format", "json", str(path)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        wall = time.perf_counter() - start
        peak = max(before, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    return wall, peak // 1024, done.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[0.25, 0.5, 1, 2], help="MiB")
    parser.add_argument("--mix", choices=("real", "dense"), default="real",
                        help="real: fixtures/corpus' torch_xla definitions; dense: one training function")
    parser.add_argument("--repeat", type=int, default=1, help="runs per size (the best is kept)")
    args = parser.parse_args()
    print(f"{'MiB':>5} {'lines':>8} {'tool s':>8} {'s/MiB':>6} {'floor s':>8} {'x floor':>8} "
          f"{'peak MiB':>9} {'growth':>7}")
    previous, walls = None, {}
    make = real_code if args.mix == "real" else dense_file
    with tempfile.TemporaryDirectory() as tmp:
        for mib in args.sizes:
            text = make(int(mib * MIB))
            path = Path(tmp) / f"dense_{mib}.py"
            path.write_text(text)
            runs = [run_tool(path) for _ in range(args.repeat)]
            wall, peak, status = min(runs)
            if status not in (0, 1):
                sys.exit(f"the tool failed on {mib} MiB (exit {status})")
            base = min(floor(text) for _ in range(args.repeat))
            growth = f"{wall / previous[1] * previous[0] / mib * 2:.2f}" if previous else "-"
            print(f"{mib:>5} {text.count(chr(10)):>8} {wall:>8.1f} {wall / mib:>6.1f} {base:>8.1f} "
                  f"{wall / base:>8.1f} {peak:>9} {growth:>7}", flush=True)
            previous = (mib, wall)
            walls[mib] = (wall, base)
    if 0.25 in walls and 1 in walls:
        print(f"1 MiB / 0.25 MiB: {walls[1][0] / walls[0.25][0]:.2f} (target 4.4; the floor's: "
              f"{walls[1][1] / walls[0.25][1]:.2f}); 1 MiB: {walls[1][0] / walls[1][1]:.2f}x the floor (target 2)")


if __name__ == "__main__":
    main()
