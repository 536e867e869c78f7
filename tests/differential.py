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
import signal
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import process_groups
import shared_runs
import warm_python
from tpu_migrate.verify import printed

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


# What `import torch_xla` sets with os.environ.setdefault (torch_xla/__init__.py): in a test worker
# that imported it (in-process diagnose, verify), every later run's environment carried them, and
# a run whose start-time variables differ is another kind of warm python (tests/warm_python.py):
# in one full run 23 runs of one worker started cold past MAX_SERVERS, each of a kind that
# differed from a running server by TF_CPP_MIN_LOG_LEVEL=1 alone. A program that imports torch_xla
# sets the same values itself.
TORCH_XLA_IMPORT_DEFAULTS = ("TF_CPP_MIN_LOG_LEVEL", "GRPC_VERBOSITY")


def _env(extra: dict[str, str]) -> dict[str, str]:
    # Not pytest's variables either: a program runs as a user runs it (and the warm python's
    # torch_xla reads PYTEST_CURRENT_TEST at import, whose value changes with every test); nor
    # what torch_xla's import left in this process (TORCH_XLA_IMPORT_DEFAULTS).
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PJRT_", "XLA_", "TPU_", "PYTEST_")) and k not in TORCH_XLA_IMPORT_DEFAULTS}
    # Unbuffered: several processes share the output pipe, and a record is written when printed
    # (as on every machine, whatever the suite's own environment says).
    env.update({"OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0", "TORCH_CPP_LOG_LEVEL": "ERROR",
                "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    return env


# What a warm python (tests/warm_python.py) imports before it forks the suite's programs: torch
# and what torchrun's agent imports; for the originals (PJRT_DEVICE set), torch_xla and the
# modules every original imports (none that registers anything a program would not: not
# xla_backend). A run whose environment the server cannot reproduce starts cold.
WARM_MODULES = ("torch", "torch.nn", "torch.optim", "torch.distributed", "torch.distributed.run",
                "torch.multiprocessing", "torch.utils.data")
WARM_XLA_MODULES = ("torch", "torch.nn", "torch.optim", "torch.distributed", "torch.multiprocessing",
                    "torch.utils.data", "torch_xla", "torch_xla.core.xla_model", "torch_xla.runtime",
                    "torch_xla.distributed.xla_multiprocessing", "torch_xla.distributed.parallel_loader")


def _command(path: Path, args: list[str], env: dict[str, str], launcher: list[str] | None) -> list[str]:
    """`python PATH ARGS` (or `LAUNCHER PATH ARGS`) with a warm python standing for python, also
    as torchrun's interpreter for its workers (PYTHON_EXEC, set in env)."""
    launcher = list(launcher or [sys.executable])
    real = launcher[0]
    if real == sys.executable:
        launcher[0] = warm_python.python_for(env, WARM_XLA_MODULES if "PJRT_DEVICE" in env else WARM_MODULES)
    elif real == os.environ.get("TPU_MIGRATE_STANDIN_PYTHON"):
        # The stand-in's Python: a server of its own imports torch (and so the stand-in) once.
        launcher[0] = warm_python.python_for(env, WARM_MODULES, keep_path=True, interpreter=real)
    if launcher[0] != real and launcher[1:3] == ["-m", "torch.distributed.run"]:
        env["PYTHON_EXEC"] = launcher[0]
    return [*launcher, str(path.resolve()), *args]


def run_program(path: Path, env: dict[str, str], args: list[str] = (), launcher: list[str] | None = None) -> Run:
    env = dict(env)
    command = _command(path, list(args), env, launcher)
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
    """Once per program and arguments in a test session, whichever xdist worker asks first: the
    originals never change, and the harness checks (a broken rule is caught) compare against the
    same original as the differential test."""
    return shared_runs.once(f"original {shared_runs.file_key(path)} {json.dumps(list(args))}",
                            lambda: run_program(path, original_env(_env({})), list(args)))


def original_env(env: dict[str, str]) -> dict[str, str]:
    """XLA:CPU, and a port of its own: torch_xla's xla:// rendezvous listens on MASTER_PORT,
    12355 when unset, so two originals that make a process group at once (one per xdist worker)
    would collide (EADDRINUSE)."""
    return {**env, "PJRT_DEVICE": "CPU", "MASTER_PORT": str(free_port())}


def original_mp_env() -> dict[str, str]:
    """An original that starts processes (run_bounded): no launcher's variables, XLA:CPU, a port."""
    return original_env(_mp_env({}))


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


def migrate(path: Path, workdir: Path, target: str = "portable", options: tuple[str, ...] = ()) -> Path:
    copy = workdir / path.name
    shutil.copyfile(path, copy)
    proc = subprocess.run(
        [sys.executable, "-m", "tpu_migrate", "rewrite", "--target", target, *options, str(copy)],
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
    """The `@step` lines, compared by `tpu-migrate verify`'s own comparison of printed numbers
    (tpu_migrate/verify/printed.py): the same lines, numbers within the tolerance."""
    rtol, atol = TOLERANCES.get(program, DEFAULT_TOLERANCE)
    result = Comparison(program, ok=True)
    if original.returncode != 0:
        result.problems.append(f"original exited {original.returncode}:\n{original.output[-3000:]}")
    if migrated.returncode != 0:
        result.problems.append(f"migrated exited {migrated.returncode}:\n{migrated.output[-3000:]}")
    a, b = (printed.lines(_step_lines(run)) for run in (original, migrated))
    if not a:
        result.problems.append("the original printed no @step line")
    verdict = printed.compare(a, b, set(), rtol, atol, world=1)
    if verdict.one_side or len(a) != len(b):
        result.problems.append(f"{len(a)} steps in the original, {len(b)} in the migrated program; "
                               f"{verdict.one_side} line(s) printed by one side only (another step count or keys)")
    if verdict.divergence is not None:
        mismatch = verdict.divergence
        result.problems.append(f"step line {mismatch.line}: {mismatch.original!r} vs {mismatch.migrated!r}: "
                               f"{mismatch.text} | {mismatch.migrated_text}")
    result.max_abs, result.max_rel = verdict.largest_absolute, verdict.largest_relative
    result.steps = len(a)
    result.ok = not result.problems
    return result


def _step_lines(run: Run) -> str:
    """The run's `@step` records, a line each, as printed (the keys in order)."""
    return "".join(f"@step {json.dumps({k: v for k, v in r.items() if k != '@'})}\n"
                   for r in run.records if r["@"] == "@step")


def differential(program: Path, args: list[str] = ()) -> Comparison:
    # The original runs while the copy is migrated and run: independent processes, one thread
    # each (OMP_NUM_THREADS=1), so on two cores the pair takes the time of the longer one.
    with tempfile.TemporaryDirectory(prefix="tpu-migrate-diff-") as tmp, ThreadPoolExecutor(1) as pool:
        workdir = Path(tmp)
        original = pool.submit(run_original, program, args)
        copy = migrate(program, workdir)
        migrated = run_migrated(copy, workdir, args)
        return compare(program.name, original.result(), migrated)


# --- Multi-process differential runs (fixtures/programs/multiprocess/) -------------------------
#
# Each program there prints its records (`@step` / `@final`) on the master only, and the numbers
# do not depend on the world size (a fixed global batch, equal contiguous slices per rank,
# averaged gradients, an all-reduced loss). So the original at world size 1 on XLA:CPU (torch_xla
# runs only one CPU process here) is the reference for the migrated program at any world size:
# under torchrun with 2 processes, as plain `python` (world size 1), or with 2 processes it
# starts itself. Each record must appear exactly once: a rank that wrongly believes it is rank 0
# prints a second copy, a rank that believes it is alone computes different numbers.

MP_PROGRAMS = PROGRAMS / "multiprocess"
MP_TIMEOUT = 300  # seconds per run: a hung rendezvous fails the run instead of the whole suite
PROC = re.compile(r"@proc (\{[^{}]*\})")
_LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                       "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "CPU_NUM_DEVICES")

FAKE_ACCELERATORS = '''"""Differential runs: pretend that the host has {n} accelerators (only their count).

torch.accelerator.device_count() answers {n}; nothing else changes: there is no accelerator, so
the program computes on the CPU. A launcher that starts one process per device (xmp.spawn
without nprocs, torch_xla.launch) then starts {n} processes, as it would on a host with {n} TPUs.
"""
import torch.accelerator

torch.accelerator.device_count = lambda: {n}
'''


_LIVE: set[subprocess.Popen] = set()  # the runs in progress, each the leader of its session
_LIVE_LOCK = threading.Lock()


def _mp_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in _env({}).items()
           if k not in _LAUNCHER_VARIABLES and not k.startswith(("TORCHELASTIC_", "TORCH_ELASTIC_"))}
    env.update(extra)
    return env


def run_bounded(path: Path, env: dict[str, str], args: list[str] = (), launcher: list[str] | None = None,
                timeout: float = MP_TIMEOUT, started=None) -> Run:
    """run_program for programs that start processes: in a session of its own, so that a run
    past its time is killed with all its processes (torchrun's workers, spawned children).
    `started(proc)`, when given, gets the run's process as soon as it starts (to stop it early)."""
    env = dict(env)
    command = _command(path, list(args), env, launcher)
    with tempfile.TemporaryDirectory(prefix="tpu-migrate-run-") as tmp:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**env, "TMPDIR": tmp}, cwd=path.parent, start_new_session=True)
        with _LIVE_LOCK:
            _LIVE.add(proc)
        if started is not None:
            started(proc)
        with ThreadPoolExecutor(2) as readers:
            stdout, stderr = readers.submit(proc.stdout.read), readers.submit(proc.stderr.read)
            try:
                finished = process_groups.wait_unreaped(proc, timeout)
                # Whatever the launcher left behind in its session, before the leader is reaped
                # (see tests/process_groups.py); on a timeout, the run itself.
                process_groups.kill_group(proc)
                returncode = proc.wait()
            finally:
                with _LIVE_LOCK:
                    _LIVE.discard(proc)
                if proc.returncode is None:  # this thread was interrupted: leave nothing running
                    process_groups.kill_group(proc)
                    proc.wait()
            stdout, stderr = stdout.result(), stderr.result()
        proc.stdout.close()
        proc.stderr.close()
        if not finished:
            stderr += f"\n[differential] killed after {timeout:.0f} s: {' '.join(command)}"
            returncode = -signal.SIGKILL
    records = []
    for tag, payload in RECORD.findall(stdout):
        record = json.loads(payload)
        record["@"] = tag
        records.append(record)
    return Run(returncode, records, stdout + stderr)


def kill_running_runs() -> None:
    """Kill every run_bounded run still going (a test session that stops early)."""
    with _LIVE_LOCK:
        running = list(_LIVE)
    for proc in running:
        process_groups.kill_group(proc)


def run_original_mp(path: Path, args: list[str] = (), devices: int | None = None) -> Run:
    """The torch_xla program on XLA:CPU: one process (world size 1), once per test session;
    `devices`: that many virtual CPU devices (an SPMD program drives them all)."""
    env = original_mp_env()
    if devices is not None:
        env["CPU_NUM_DEVICES"] = str(devices)
    key = f"original-mp {shared_runs.file_key(path)} {json.dumps(list(args))} {devices}"
    return shared_runs.once(key, lambda: run_bounded(path, env, args))


def migrate_many(paths: list[Path], workdir: Path, target: str = "portable",
                 rules_dir: Path | None = None) -> dict[str, Path]:
    """Copy the programs into workdir and rewrite them with one CLI run; {name: copy}. The rules
    directory is passed explicitly (not through os.environ), so concurrent runs do not mix."""
    workdir.mkdir(parents=True, exist_ok=True)
    copies = {}
    for path in paths:
        copies[path.name] = workdir / path.name
        shutil.copyfile(path, copies[path.name])
    env = {k: v for k, v in os.environ.items() if k != "TPU_MIGRATE_RULES_DIR"}
    env["PYTHONPATH"] = str(ROOT)
    if rules_dir is not None:
        env["TPU_MIGRATE_RULES_DIR"] = str(rules_dir)
    proc = subprocess.run(
        [sys.executable, "-m", "tpu_migrate", "rewrite", "--target", target, "--jobs", "1",
         *map(str, copies.values())],
        capture_output=True, text=True, env=env, timeout=TIMEOUT,
    )
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"tpu-migrate failed: {proc.stdout}\n{proc.stderr}")
    return copies


def torchrun(nprocs: int = 2) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nprocs),
            "--master_port", str(free_port()), "--monitor_interval", "0.1"]


AFTER_TORCH = '''"""Test-only: import {module} as soon as this process has imported torch (tests/differential.py).

A process that never imports torch (multiprocessing's resource tracker, a launcher's helper)
does not pay seconds for it, as it would if this file imported torch itself.
"""
import importlib.util
import sys


class _AfterTorch:
    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            __import__("{module}")

        spec.loader.exec_module = exec_module
        return spec


if "torch" in sys.modules:  # a warm python (tests/warm_python.py) imported it before the program
    __import__("{module}")
else:
    sys.meta_path.insert(0, _AfterTorch())
'''


def torch_patch_dir(directory: Path, module: str, code: str) -> Path:
    """`directory`, for PYTHONPATH: a sitecustomize.py that runs `code` (as module `module`) in
    every Python process right after it imports torch, and only in those."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{module}.py").write_text(code)
    (directory / "sitecustomize.py").write_text(AFTER_TORCH.format(module=module))
    return directory


def fake_accelerators_dir(workdir: Path, count: int) -> Path:
    """A directory whose sitecustomize.py makes torch.accelerator.device_count() answer count."""
    return torch_patch_dir(workdir / f"fake-accelerators-{count}", "_fake_accelerators",
                           FAKE_ACCELERATORS.format(n=count))


def run_migrated_mp(copy: Path, workdir: Path, args: list[str] = (), launcher: list[str] | None = None,
                    fake_accelerators: int | None = None) -> Run:
    """The migrated program with torch_xla blocked: under `launcher` (torchrun) or plain python,
    optionally on a host that pretends to have `fake_accelerators` devices."""
    path = [str(blocker_dir(workdir))]
    if fake_accelerators is not None:
        path.append(str(fake_accelerators_dir(workdir, fake_accelerators)))
    env = _mp_env({"PYTHONPATH": os.pathsep.join(path), "MASTER_PORT": str(free_port())})
    return run_bounded(copy, env, args, launcher)


def standin_python() -> str:
    """The TorchTPU stand-in's Python (torch 2.13, .venv-tpu): conftest.py names it."""
    return os.environ["TPU_MIGRATE_STANDIN_PYTHON"]


def standin_env(env: dict[str, str]) -> dict[str, str]:
    """`env` with the stand-in loaded in every Python process, as `tpu-migrate run` runs a program;
    a TPU VM of 2 chips (each xmp.spawn conversion starts one process per chip)."""
    from tpu_migrate import standin

    return {**standin.environment(env), "TORCH_TPU_STANDIN_QUIET": "1", "TORCH_TPU_DEVICES_PER_HOST": "2"}


def run_standin_mp(copy: Path, workdir: Path, args: list[str] = (), torchrun_procs: int | None = None) -> Run:
    """The `--target tpu` migration on the TorchTPU stand-in, torch_xla blocked: plain python
    (its own launcher starts a process per chip) or under torchrun, in the stand-in's Python."""
    # One blocker for the session: the PYTHONPATH of every stand-in run is the same, so one warm
    # server (which imports torch, and so the stand-in, through it) serves them all.
    blocked = blocker_dir(shared_runs.session_directory("standin"))
    env = standin_env(_mp_env({"PYTHONPATH": str(blocked), "MASTER_PORT": str(free_port())}))
    launcher = [standin_python()]
    if torchrun_procs is not None:
        launcher += ["-m", "torch.distributed.run", "--nproc_per_node", str(torchrun_procs), "--master_port",
                     env["MASTER_PORT"], "--monitor_interval", "0.1"]
    return run_bounded(copy, env, args, launcher)


def process_count(run: Run) -> int:
    """How many `@proc` lines the run printed (programs print one per process)."""
    return len(PROC.findall(run.output))


def _identity(record: dict) -> tuple:
    """What names a record: its tag, its keys and its non-float values (step, epoch, what)."""
    return tuple(sorted((key, None if isinstance(value, float) else json.dumps(value))
                        for key, value in record.items()))


def compare_exactly_once(program: str, original: Run, migrated: Run) -> Comparison:
    """Every record of the original appears in the migrated output exactly once, in the same
    order, with the same non-float values and floats within the tolerance; nothing else."""
    rtol, atol = TOLERANCES.get(program, DEFAULT_TOLERANCE)
    result = Comparison(program, ok=True)
    problems = result.problems
    if original.returncode != 0:
        problems.append(f"original exited {original.returncode}:\n{original.output[-3000:]}")
    if migrated.returncode != 0:
        problems.append(f"migrated exited {migrated.returncode}:\n{migrated.output[-3000:]}")
    if not any(r["@"] == "@step" for r in original.records):
        problems.append("the original printed no @step line")
    wanted = [_identity(r) for r in original.records]
    if len(set(wanted)) != len(wanted):
        problems.append("the original printed a record twice: the program is not a valid fixture")
    found: dict[tuple, list[dict]] = {}
    for record in migrated.records:
        found.setdefault(_identity(record), []).append(record)
    for record, key in zip(original.records, wanted):
        shown = {k: v for k, v in record.items() if k != "@"}
        copies = found.get(key, [])
        if not copies:
            problems.append(f"missing: {record['@']} {json.dumps(shown)}")
            continue
        if len(copies) > 1:
            problems.append(f"printed {len(copies)} times (expected once): {record['@']} {json.dumps(shown)}")
        for copy in copies:
            for name, value in record.items():
                if isinstance(value, float):
                    other = copy[name]
                    diff = abs(value - other)
                    result.max_abs = max(result.max_abs, diff)
                    result.max_rel = max(result.max_rel, diff / max(abs(value), 1e-12))
                    if not math.isclose(value, other, rel_tol=rtol, abs_tol=atol):
                        problems.append(f"{record['@']} {json.dumps(shown)}: {name} {value!r} vs {other!r}")
    for key, copies in found.items():
        if key not in wanted:
            shown = {k: v for k, v in copies[0].items() if k != "@"}
            problems.append(f"unexpected ({len(copies)}x): {copies[0]['@']} {json.dumps(shown)}")
    if not problems:
        order = list(dict.fromkeys(_identity(r) for r in migrated.records))
        if order != wanted:
            problems.append("the records are printed in another order")
    if problems and migrated.returncode == 0:
        problems.append(f"migrated output (tail):\n{migrated.output[-2000:]}")
    result.steps = sum(r["@"] == "@step" for r in original.records)
    result.ok = not problems
    return result


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

