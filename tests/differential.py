"""Differential runs: a torch_xla program and its migrated form must compute the same thing.

For each program in fixtures/programs/:

1. run the original with torch_xla on its CPU backend (PJRT_DEVICE=CPU);
2. rewrite a copy with `tpu-migrate rewrite --target portable`;
3. run the copy on the CPU where `import torch_xla` fails (a blocking package first on
   PYTHONPATH), so a leftover import is caught;
4. compare the `@step {json}` lines: same number, same keys, numbers within tolerance.

Tolerance: XLA:CPU fuses operations and may reorder float32 reductions, so the same program
rounds differently from eager CPU PyTorch. Over these programs' steps the largest difference
measured here is 3.4e-7 relative (a few float32 ulps). We allow rtol=1e-4, atol=1e-6: about 300
times the measured worst case, and still far below what a semantic error (a dropped optimizer
step, a missing gradient average, a batch left on the wrong device) produces, which changes the
losses in their first or second digit. The autocast program computes in bfloat16 on both sides,
where XLA and eager CPU round differently (measured: 3.9e-4 relative), so it gets bfloat16's
tolerance (rtol=3e-2, about eight bits of mantissa).

Usage: python tests/differential.py [PROGRAM ...]   (prints a table; exit 1 on a mismatch)
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = ROOT / "fixtures" / "programs"
DEFAULT_TOLERANCE = (1e-4, 1e-6)
TOLERANCES = {"p08_autocast.py": (3e-2, 1e-3)}
TIMEOUT = 600
RECORD = re.compile(r"(@step|@final) (\{[^{}]*\})")

BLOCKER = '''raise ImportError(
    "torch_xla is blocked in differential runs: the migrated program must not import it"
)
'''


@dataclass
class Run:
    returncode: int
    records: list[dict]
    output: str


@dataclass
class Comparison:
    program: str
    ok: bool
    steps: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    problems: list[str] = field(default_factory=list)


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PJRT_", "XLA_", "TPU_"))}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0", "TORCH_CPP_LOG_LEVEL": "ERROR"})
    env.update(extra)
    return env


def run_program(path: Path, env: dict[str, str], args: list[str] = (), launcher: list[str] | None = None) -> Run:
    command = [*(launcher or [sys.executable]), str(path.resolve()), *args]
    # The program's temporary files (p06's checkpoint, torchrun's rendezvous) go with the run.
    with tempfile.TemporaryDirectory(prefix="tpu-migrate-run-") as tmp:
        proc = subprocess.run(command, capture_output=True, text=True, env={**env, "TMPDIR": tmp},
                              timeout=TIMEOUT, cwd=path.parent)
    records = []
    # Processes share the pipe: a record is found wherever it is, not only at line starts.
    for tag, payload in RECORD.findall(proc.stdout):
        record = json.loads(payload)
        record["@"] = tag
        records.append(record)
    return Run(proc.returncode, records, proc.stdout + proc.stderr)


def run_original(path: Path, args: list[str] = ()) -> Run:
    return run_program(path, _env({"PJRT_DEVICE": "CPU"}), args)


def free_port() -> int:
    """Process groups rendezvous on a port: never share one with a concurrent run."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def blocker_dir(workdir: Path) -> Path:
    blocked = workdir / "blocked"
    for package in ("torch_xla", "optimum"):
        (blocked / package).mkdir(parents=True, exist_ok=True)
        (blocked / package / "__init__.py").write_text(BLOCKER.replace("torch_xla", package))
    return blocked


def migrate(path: Path, workdir: Path, target: str = "portable") -> Path:
    copy = workdir / path.name
    shutil.copyfile(path, copy)
    proc = subprocess.run(
        [sys.executable, "-m", "tpu_migrate", "rewrite", "--target", target, str(copy)],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=TIMEOUT,
    )
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"tpu-migrate failed on {path.name}: {proc.stderr}")
    return copy


def run_migrated(copy: Path, workdir: Path, args: list[str] = (), launcher: list[str] | None = None,
                 extra_env: dict[str, str] | None = None) -> Run:
    env = _env({"PYTHONPATH": str(blocker_dir(workdir)), "MASTER_PORT": str(free_port()),
                **(extra_env or {})})
    return run_program(copy, env, args, launcher)


def compare(program: str, original: Run, migrated: Run) -> Comparison:
    rtol, atol = TOLERANCES.get(program, DEFAULT_TOLERANCE)
    result = Comparison(program, ok=True)
    if original.returncode != 0:
        result.problems.append(f"original exited {original.returncode}:\n{original.output[-3000:]}")
    if migrated.returncode != 0:
        result.problems.append(f"migrated exited {migrated.returncode}:\n{migrated.output[-3000:]}")
    a = [r for r in original.records if r["@"] == "@step"]
    b = [r for r in migrated.records if r["@"] == "@step"]
    if not a:
        result.problems.append("the original printed no @step line")
    if len(a) != len(b):
        result.problems.append(f"{len(a)} steps in the original, {len(b)} in the migrated program")
    for index, (x, y) in enumerate(zip(a, b)):
        if set(x) != set(y):
            result.problems.append(f"step {index}: keys {sorted(x)} != {sorted(y)}")
            continue
        for key in x:
            u, v = x[key], y[key]
            if isinstance(u, float) or isinstance(v, float):
                diff = abs(u - v)
                result.max_abs = max(result.max_abs, diff)
                result.max_rel = max(result.max_rel, diff / max(abs(u), 1e-12))
                if not math.isclose(u, v, rel_tol=rtol, abs_tol=atol):
                    result.problems.append(f"step {index} {key}: {u!r} vs {v!r}")
            elif u != v:
                result.problems.append(f"step {index} {key}: {u!r} vs {v!r}")
    result.steps = len(a)
    result.ok = not result.problems
    return result


def differential(program: Path, args: list[str] = ()) -> Comparison:
    with tempfile.TemporaryDirectory(prefix="tpu-migrate-diff-") as tmp:
        workdir = Path(tmp)
        original = run_original(program, args)
        copy = migrate(program, workdir)
        migrated = run_migrated(copy, workdir, args)
        return compare(program.name, original, migrated)


def main(argv: list[str]) -> int:
    programs = [Path(p) for p in argv] or sorted(PROGRAMS.glob("p*.py"))
    failures = 0
    print(f"{'program':34} {'steps':>5} {'max abs diff':>13} {'max rel diff':>13}  result")
    for program in programs:
        result = differential(program)
        failures += not result.ok
        print(f"{program.name:34} {result.steps:5d} {result.max_abs:13.3e} {result.max_rel:13.3e}  "
              f"{'ok' if result.ok else 'MISMATCH'}")
        for problem in result.problems:
            print("    " + problem.replace("\n", "\n    "))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
