"""The runs `verify` compares: the original under torch_xla on the CPU (twice: its own run-to-run
noise is the floor of the tolerance), and the migrated copy with torch_xla unimportable, as one
process and under torchrun at each process count. A `--target tpu` migration runs on the
TorchTPU stand-in (tpu_migrate/standin: the `tpu` device computed by the CPU, tpu_dist over
gloo) under a Python with torch 2.11-2.15; a `--target portable` one with gloo on the CPU.

Every process of every run records its optimizer steps (recorder.py) through diagnose's
sitecustomize (runner.sitecustomize), which the program's workers inherit. The runs go in the
user's working directory (the program's relative paths mean what they meant): at once only where
the original wrote no file (schedule.py), else one after another, so what a run writes there is
overwritten by the next one.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tpu_migrate import standin
from tpu_migrate.standin import launcher as standin_launcher
from tpu_migrate.diagnose.runner import sitecustomize
from tpu_migrate.verify import processes
from tpu_migrate.verify.recorder import ENV_DIR, ENV_WRITES

BLOCKER = 'raise ImportError("torch_xla is unimportable in tpu-migrate verify\'s migrated runs")\n'
# Launcher variables a plain run must not inherit (verify may itself run under a launcher).
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                      "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")
LARGEST_COPIED = 10 * 1024 * 1024  # bytes: data files stay where they are (the runs share the cwd)
NOT_COPIED = shutil.ignore_patterns(".git", ".hg", ".svn", "__pycache__", ".venv", "venv", "node_modules")


class VerifyError(Exception):
    """A usage problem, one line, exit status 2."""


@dataclass
class Run:
    name: str            # what ran: "original", "migrated, torchrun 2", ...
    side: str            # "original" or "migrated"
    world: int           # processes the launcher started
    returncode: int
    output: str          # its stdout and stderr, the end of them
    records: list[dict] = field(default_factory=list)  # every process's optimizer steps
    printed: str = ""    # what its first process (rank 0) printed on stdout
    left: list[str] = field(default_factory=list)  # processes it left running when it exited (stopped)
    processes: int = 1   # the Python processes that recorded (the program's own children too)
    group: bool = False  # whether a process made a process group (init_process_group)
    nodes: int = 1       # torchruns of `world // nodes` processes each, at once (--nnodes)
    once: set[int] = field(default_factory=set)  # lines of `printed` (1-based) printed by one process only
    ranks: list[tuple[int, bool, str]] = field(default_factory=list)  # every launcher rank's printing:
    #   (rank, whether it is the first of its node, what it printed); empty without a launcher
    reduced: list[float] = field(default_factory=list)  # what xm.mesh_reduce / xm.all_reduce returned
    writes: list[str] = field(default_factory=list)  # files its processes opened for writing (the first
    #                                                  few; noted only where run with watch_writes)
    derived: dict[int, list | None] = field(default_factory=dict)  # lines of `printed` that print values
    #   computed from reduced ones: their parts (reductions.py; None: not known)
    beside_others: int | None = None  # run again alone: the exit status it had beside other runs (schedule.py)

    @property
    def single_process(self) -> bool:
        """It made no process group, started no other Python process and ran at world size 1:
        the N-process runs do not apply to it."""
        return (not self.group and self.processes <= 1
                and all(record.get("world", 1) <= 1 for record in self.records))


@dataclass(frozen=True)
class Target:
    """What a run runs: a script, or a module of a tree (`python -m`)."""
    path: Path          # the script; for a module, the tree it imports from
    module: str | None  # for `python -m`
    is_copy: bool       # a migrated copy: its `imports` come before anything else on the path
    imports: tuple[Path, ...] = ()  # the folders its imports resolve in: a module's tree (or its
    #                                 src/), a copied script's tree and its src/ (a src layout)

    @classmethod
    def find(cls, name: str, module: bool, root: str | None) -> Target:
        """The user's SCRIPT (or -m MODULE under --root, default the working directory, or the
        src/ folder of either: a src layout)."""
        if module:
            tree = Path(root or ".").resolve()
            return cls(tree, name, False, (_module_folder(name, tree),))
        path = Path(name)
        if not path.is_file():
            raise VerifyError(f"no such script: {name}")
        if root and not path.resolve().is_relative_to(Path(root).resolve()):
            raise VerifyError(f"{name} is not under --root {root}")
        return cls(path, None, False)

    @classmethod
    def against(cls, copy: str, original: Target, root: str | None) -> Target:
        """The user's own migrated copy (`--against`) of `original`: a script, or for a module the
        copied tree (or the module's file in it). Its tree comes first on the path, so that it
        imports its own package, never the original's that the working directory or an editable
        install also offers."""
        path = Path(copy).resolve()
        if original.module:
            parts = original.module.split(".")
            if path.is_file():  # .../pkg/train.py or .../pkg/train/__main__.py: the folder above pkg
                module = path.parent if path.name == "__main__.py" else path.with_suffix("")
                if module.parts[-len(parts):] != tuple(parts):
                    raise VerifyError(f"--against {copy}: not the file of module {original.module} (give the "
                                      "migrated tree, or the module's file in it)")
                path = module.parents[len(parts) - 1]
            elif not path.is_dir():
                raise VerifyError(f"no such migrated tree: {copy}")
            folder = _module_folder(original.module, path, f"--against {copy}: ")
            return cls(path, original.module, True, (folder,))
        if not path.is_file():
            raise VerifyError(f"no such script: {copy}")
        return cls(path, None, True, _copied_tree(path, original, root))

    def tree(self, root: str | None) -> Path:
        """The tree a migration copies: --root, else the script's folder (a module's tree)."""
        if self.module:
            return self.path
        return Path(root).resolve() if root else self.path.resolve().parent

    def command(self) -> list[str]:
        return ["-m", self.module] if self.module else [str(self.path)]


def _module_folder(name: str, tree: Path, what: str = "") -> Path:
    """Where module `name` imports from in `tree`: the tree, or its src/ (a src layout)."""
    relative = Path(*name.split("."))
    if not all(part.isidentifier() for part in name.split(".")):
        raise VerifyError(f"{what}{name} is not a module name")
    for folder in (tree, tree / "src"):
        if (folder / relative).with_suffix(".py").is_file() or (folder / relative / "__main__.py").is_file():
            return folder
    raise VerifyError(f"{what}no module {name} under {tree} or its src/ (its .py file or its package's __main__.py)")


def _imports(tree: Path) -> tuple[Path, ...]:
    """A copied tree's folders to import from: the tree, and its src/ where it has one."""
    return (tree, tree / "src") if (tree / "src").is_dir() else (tree,)


def _copied_tree(copy: Path, original: Target, root: str | None) -> tuple[Path, ...]:
    """The tree of a user's copy of a script: where the copy sits as the script sits in its tree
    (`migrated/scripts/train.py` for `scripts/train.py` under the tree); else its own folder."""
    relative = original.path.resolve().relative_to(original.tree(root))
    if copy.parts[-len(relative.parts):] == relative.parts:
        return _imports(copy.parents[len(relative.parts) - 1])
    return _imports(copy.parent)


def project_root(script: Path) -> Path | None:
    """The nearest folder above the script's, up to the working directory, that holds a
    pyproject.toml, setup.py or setup.cfg (the project the script belongs to, whose package it
    may import); None for a script outside the working directory, or where there is none above
    the script's own folder."""
    folder, stop = script.resolve().parent, Path.cwd().resolve()
    if not folder.is_relative_to(stop):
        return None
    for candidate in (folder, *folder.parents):
        if any((candidate / marker).is_file() for marker in ("pyproject.toml", "setup.py", "setup.cfg")):
            return None if candidate == folder else candidate
        if candidate == stop:
            return None
    return None


class Workspace:
    """A temporary directory with the recorder's sitecustomize, the torch_xla blocker, the
    stand-in's package (target tpu) and the migrated copy; removed by close()."""

    def __init__(self, interpreter=None, target: str = "tpu", migrated_interpreter=None):
        # `interpreter(env)`: the Python to run a program with under that environment (torchrun's
        # workers too); the tool's own by default. `migrated_interpreter(env)`: the same for the
        # migrated program (default: `interpreter`); for target tpu, one with torch 2.11-2.15.
        self.interpreter = interpreter or (lambda env: sys.executable)
        self.migrated_interpreter = migrated_interpreter or self.interpreter
        self.target = target
        self.path = Path(tempfile.mkdtemp(prefix="tpu-migrate-verify-"))
        self.site = self.path / "site"
        self.site.mkdir()
        # The recorder needs only the standard library and this package: another interpreter
        # (the project's own environment, where the tool is not installed) imports it from here.
        self.tool = self.path / "tool"
        self.tool.mkdir()
        (self.tool / "tpu_migrate").symlink_to(Path(__file__).resolve().parent.parent, target_is_directory=True)
        (self.site / "sitecustomize.py").write_text(
            sitecustomize("verify: record every optimizer step", "tpu_migrate.verify.recorder"))
        self.blocker = self.path / "blocker"
        (self.blocker / "torch_xla").mkdir(parents=True)
        (self.blocker / "torch_xla" / "__init__.py").write_text(BLOCKER)

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    def migrate(self, target: Target, root: str | None = None) -> Target:
        """A copy of the target's tree rewritten with `rewrite --target` this workspace's target; the
        target in it."""
        tree = target.tree(root)
        # A folder of its own per migration and per run: mkdtemp's names never collide, even
        # between threads (the suite runs a workspace's programs two at a time).
        copy = Path(tempfile.mkdtemp(prefix="migrated-", dir=self.path)) / tree.name
        workspace = self.path.resolve()
        shutil.copytree(tree, copy, ignore=lambda directory, names: _not_copied(directory, names, workspace))
        proc = subprocess.run([sys.executable, "-m", "tpu_migrate", "rewrite", "--target", self.target, "--no-cache",
                               str(copy)], capture_output=True, text=True)
        if proc.returncode not in (0, 1):
            raise VerifyError(f"{target.module or target.path}: the rewrite of its copy failed: "
                              f"{(proc.stderr or proc.stdout).strip()}")
        if target.module:
            return Target(copy, target.module, True, tuple(copy / folder.relative_to(tree) for folder in target.imports))
        return Target(copy / target.path.resolve().relative_to(tree), None, True, _imports(copy))

    def run(self, name: str, side: str, target: Target, args: list[str], nproc: int, timeout: float,
            nnodes: int = 1, watch_writes: bool = False) -> Run:
        """`nproc` processes (under torchrun above 1); with `nnodes` above 1, that many torchruns of
        `nproc` at once, one per node (`--node_rank K`, one rendezvous on 127.0.0.1), as on the
        hosts of a pod: a world of nproc * nnodes. `watch_writes`: its processes note the files
        they write (Run.writes; the original's first run, which decides the schedule)."""
        env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
        env.pop(ENV_WRITES, None)
        if watch_writes:
            env[ENV_WRITES] = "1"
        path = [str(self.site), str(self.tool)]
        if target.module or target.is_copy:
            # The module's tree first; for a copy, its own tree, not the original's that the
            # working directory (`python -m` puts it first: PYTHONSAFEPATH, which its workers
            # inherit too), $PYTHONPATH or an editable install offers.
            path[:0] = map(str, target.imports)
            if target.module and target.is_copy:
                env["PYTHONSAFEPATH"] = "1"
        if side == "original":
            env.setdefault("PJRT_DEVICE", "CPU")
        else:
            path.insert(0, str(self.blocker))
            if self.target == "tpu":
                # The stand-in's environment (TORCH_DEVICE_BACKEND_AUTOLOAD=0: an installed torch-tpu,
                # which aborts `import torch` without a TPU, never loads) and its site after the
                # recorder's: each sitecustomize runs the next, and both hook `import torch`.
                env = standin.environment(env)
                path.append(str(standin.SITE))
                # A chip per process of the run: a program that launches itself a process a chip
                # (torch.accelerator.device_count()) starts one under python, as its original did.
                env["TORCH_TPU_DEVICES_PER_HOST"] = str(nproc)
        env["PYTHONPATH"] = os.pathsep.join([*path, *filter(None, [os.environ.get("PYTHONPATH")])])
        env.setdefault("OMP_NUM_THREADS", "1")  # the same reduction order in every run
        env.setdefault("PYTHONHASHSEED", "0")   # the same set and dict orders in every run
        # A port of its own for each run's rendezvous (a program's own process group, torch_xla's
        # xla:// one, torchrun's): never a default another run or program may hold.
        env["MASTER_PORT"] = str(_free_port())
        python = (self.interpreter if side == "original" else self.migrated_interpreter)(env)

        def node(rank: int) -> tuple[Path, processes.Finished]:
            records = Path(tempfile.mkdtemp(prefix="records-", dir=self.path))
            node_env = {**env, ENV_DIR: str(records)}
            command = [python]
            if nproc > 1 or nnodes > 1:
                node_env["PYTHON_EXEC"] = python
                command += ["-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
                            env["MASTER_PORT"], "--monitor_interval", "0.1"]
                if nnodes > 1:
                    command += ["--nnodes", str(nnodes), "--node_rank", str(rank), "--master_addr", "127.0.0.1",
                                "--rdzv-backend", "static"]
                    if side == "migrated" and self.target == "tpu":  # the stand-in's host of a pod
                        node_env = standin_launcher.pod_host_environment(node_env, nnodes, rank)
            command += [*target.command(), *args]
            # In a session of its own: at the timeout, or when the program exits, what is left of
            # it is stopped, however it was started (processes.py).
            return records, processes.run(command, node_env, timeout)

        if nnodes == 1:
            nodes = [node(0)]
        else:
            with ThreadPoolExecutor(nnodes) as pool:
                nodes = list(pool.map(node, range(nnodes)))
        outputs, returncode, left = [], 0, []
        for rank, (_, finished) in enumerate(nodes):
            output = finished.stdout + finished.stderr
            if finished.timed_out:
                output += f"\n[verify] stopped after {timeout:.0f} s, with every process it had started"
            elif finished.left:
                output += (f"\n[verify] the program exited and left {len(finished.left)} process(es) running, "
                           "stopped: " + "; ".join(finished.left[:5]))
            outputs.append(output if nnodes == 1 else f"===== node {rank} =====\n{output[-20000 // nnodes:]}")
            returncode = returncode or (124 if finished.timed_out else finished.returncode)
            left += finished.left
        directories = [records for records, _ in nodes]
        printed, once, derived = _read_printed(directories[0])
        return Run(name, side, nproc * nnodes, returncode, "\n".join(outputs)[-20000:],
                   [record for d in directories for record in _read_records(d)], printed, left,
                   sum(len(list(d.glob("stdout-*.txt"))) for d in directories),
                   any(any(d.glob("group-*")) for d in directories), nnodes, once,
                   [rank for d in directories for rank in _read_ranks(d)],
                   [value for d in directories for value in _read_reduced(d)],
                   sorted({line for d in directories for path in d.glob("writes-*")
                           for line in path.read_text(encoding="utf-8", errors="replace").splitlines()}),
                   derived)


def _read_records(directory: Path) -> list[dict]:
    records = []
    for path in sorted(directory.glob("steps-*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a process killed mid-line
    return records


def _stdout_files(directory: Path) -> list[tuple[int, str, Path]]:
    """(start time, launcher rank or "-", path) of each process's stdout, in the order they started."""
    files = []
    for path in directory.glob("stdout-*.txt"):
        _, started, pid, rank = path.stem.split("-", 3)
        files.append((int(started), rank, path))
    return sorted(files)


def _read_printed(directory: Path) -> tuple[str, set[int], dict[int, list | None]]:
    """What rank 0 printed: the processes of a launcher's rank 0, or where no launcher gave
    ranks, every process (a program and the children it spawned), in the order they started;
    which of its lines (1-based) were printed by one process of the world only; and which print
    values computed from reduced ones, with their parts."""
    files = _stdout_files(directory)
    ranked = any(rank != "-" for _, rank, _ in files)
    texts, once, derived = [], set(), {}
    for _, rank, path in files:
        if rank == "0" or not ranked:
            text = path.read_text(encoding="utf-8", errors="replace")
            flags = path.with_suffix(".once").read_text() if path.with_suffix(".once").exists() else ""
            start = sum(t.count("\n") for t in texts)
            once |= {start + k + 1 for k, flag in enumerate(flags) if flag == "1"}
            if path.with_suffix(".derived").exists():
                for line in path.with_suffix(".derived").read_text(encoding="utf-8").splitlines():
                    try:
                        noted = json.loads(line)
                        derived[start + int(noted["line"]) + 1] = noted["parts"]
                    except (ValueError, KeyError, TypeError):
                        continue  # a process killed mid-line
            texts.append(text)
    return "".join(texts), once, derived


def _read_ranks(directory: Path) -> list[tuple[int, bool, str]]:
    """(rank, first of its node, what it printed) of each launcher rank of one node's torchrun."""
    texts: dict[int, list[str]] = {}
    for _, rank, path in _stdout_files(directory):
        if rank.isdigit():
            texts.setdefault(int(rank), []).append(path.read_text(encoding="utf-8", errors="replace"))
    first = min(texts, default=None)
    return [(rank, rank == first, "".join(parts)) for rank, parts in sorted(texts.items())]


def _read_reduced(directory: Path) -> list[float]:
    return [value for path in directory.glob("reduced-*.jsonl") for line in path.read_text().splitlines()
            for value in json.loads(line).get("reduced", [])]


def _not_copied(directory: str, names: list[str], workspace: Path) -> set[str]:
    """What the copy of the tree leaves out: the workspace itself (the temporary directory may lie
    in the tree: TMPDIR under the script's folder, where the copy would copy itself without end),
    version-control and environment folders, files over LARGEST_COPIED (data: the runs share the
    working directory), what is neither a file nor a folder (a FIFO, a socket) and a link to a
    folder that holds it (a loop)."""
    ignored = set(NOT_COPIED(directory, names))
    real_directory = os.path.realpath(directory)
    for name in names:
        path = os.path.join(directory, name)
        real = os.path.realpath(path)
        if Path(real).is_relative_to(workspace):
            ignored.add(name)
        elif os.path.isdir(path):
            if os.path.islink(path) and (real_directory + os.sep).startswith(real.rstrip(os.sep) + os.sep):
                ignored.add(name)
        elif not os.path.isfile(path) or os.path.getsize(path) > LARGEST_COPIED:
            ignored.add(name)
    return ignored


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
