"""The TorchTPU stand-in, from the tool's side: where it is, the environment that loads it, and a
Python that can run it (torch 2.11 to 2.15, as torch-tpu 0.2.0 needs).

The stand-in itself is `site/`: a `torch_tpu` package and a sitecustomize that loads it after
`import torch` in every process. It imports nothing of tpu-migrate; this module never imports it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SITE = Path(__file__).resolve().parent / "site"
PYTHON_VARIABLE = "TPU_MIGRATE_STANDIN_PYTHON"
TORCH_RANGE = ((2, 11), (2, 15))
# What the cached environment installs; pip takes a CPU build where one lies on the machine.
TORCH_REQUIREMENT = os.environ.get("TPU_MIGRATE_STANDIN_TORCH", "torch==2.13.0")


class StandInError(Exception):
    """No Python can run the stand-in: one line, exit status 2."""


def environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """`base` (default os.environ) with the stand-in loaded in every Python process started with it.

    TORCH_DEVICE_BACKEND_AUTOLOAD=0 keeps an installed torch-tpu (which aborts `import torch`
    without a TPU) from loading; the stand-in's sitecustomize takes its place."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join([str(SITE), *filter(None, [env.get("PYTHONPATH")])])
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    return env


def torch_version(python: str) -> tuple[int, int] | None:
    """The (major, minor) of torch in that Python, or None without torch (or without that Python)."""
    probe = "import importlib.metadata as m; print(m.version('torch'))"
    try:
        proc = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    parts = proc.stdout.strip().split("+")[0].split(".")
    if proc.returncode != 0 or len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
        return None
    return int(parts[0]), int(parts[1])


def fits(python: str) -> bool:
    version = torch_version(python)
    return version is not None and TORCH_RANGE[0] <= version <= TORCH_RANGE[1]


def cached_environment() -> Path:
    """The stand-in's own environment, made once per machine (tpu-migrate's cache directory)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "tpu-migrate" / "standin-venv"


def find_python(explicit: str | None = None, create: bool = True, echo=None) -> str:
    """A Python with torch 2.11-2.15: `explicit` (--migrated-python), else $TPU_MIGRATE_STANDIN_PYTHON,
    else this one, else the cached environment, made now (once) if `create`."""
    for candidate, origin in ((explicit, "--migrated-python"), (os.environ.get(PYTHON_VARIABLE), PYTHON_VARIABLE)):
        if candidate:
            if not fits(candidate):
                raise StandInError(f"{origin} {candidate}: not a Python with torch 2.11 to 2.15, which the "
                                   "TorchTPU stand-in needs (as torch-tpu 0.2.0 does)")
            return candidate
    if fits(sys.executable):
        return sys.executable
    cached = cached_environment() / "bin" / "python"
    if cached.exists() and fits(str(cached)):
        return str(cached)
    if not create:
        raise StandInError("no Python with torch 2.11 to 2.15 for the TorchTPU stand-in: give one with "
                           f"--migrated-python or ${PYTHON_VARIABLE}")
    return str(_create(cached.parent.parent, echo))


def _create(venv: Path, echo) -> Path:
    if echo:
        echo(f"tpu-migrate: making the TorchTPU stand-in's environment once ({TORCH_REQUIREMENT}) in {venv} ...")
    venv.parent.mkdir(parents=True, exist_ok=True)
    steps = ([sys.executable, "-m", "venv", "--clear", str(venv)],
             [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", TORCH_REQUIREMENT, "numpy"])
    for command in steps:
        proc = subprocess.run(command, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
            raise StandInError(f"could not make the stand-in's environment in {venv}: {tail[0]} (give a Python "
                               f"with torch 2.11 to 2.15 with --migrated-python or ${PYTHON_VARIABLE})")
    return venv / "bin" / "python"
