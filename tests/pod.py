"""An emulated 2-host TPU pod for the launcher conversion (TPU060), on one machine.

On a pod each host runs the program (`python train.py`), which starts one process per chip; the
processes of every host must form one world. TorchTPU's launch environment is what tells a host
who it is: `torch.tpu.distributed.set_tpu_launch_env` sets, only where unset, NNODES, NODE_RANK,
MASTER_ADDR and MASTER_PORT (and TorchTPU's own variables), never RANK or WORLD_SIZE (the
reference, section 1.7). The shim below (a `sitecustomize.py` put on PYTHONPATH) makes that
environment what it would be on host POD_NODE_RANK of a 2-host pod, with gloo and the CPU
standing in for the TPU's backend and device, and prints one `@pod` line per process that joins a
process group (its rank, world size, master address and node), so a test can tell one world of
4 from two worlds of 2.

Keep this separate from differential.py (it reuses its runner and comparison).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import differential as harness
import process_groups
import shared_runs
from tpu_migrate.standin import launcher

POD_PROGRAMS = harness.PROGRAMS / "pod"
HOSTS = 2
CHIPS_PER_HOST = 2
POD_LINE = re.compile(r"@pod (\{[^{}]*\})")
PROC_LINE = re.compile(r"@proc (\{[^{}]*\})")

# Reports the process group each process joins (both pods: the shim's and the stand-in's).
OBSERVER = '''"""Test-only: report the process group this process of host $POD_NODE_RANK joins (tests/pod.py);
imported right after torch (differential.torch_patch_dir)."""
import datetime
import json
import os

import torch
import torch.distributed

_init = torch.distributed.init_process_group


def _node():
    # Read when asked, not at import: a warm python (tests/warm_python.py) imports this module
    # once for the hosts of every pod, and refuses a run whose variables read at import differ.
    return os.environ["POD_NODE_RANK"]


def init_process_group(backend=None, *args, **kwargs):
    backend = _BACKENDS.get(backend, backend)
    # A rank that never comes (two worlds sharing one master) fails the run in bounded time.
    kwargs.setdefault("timeout", datetime.timedelta(seconds=float(os.environ.get("POD_INIT_TIMEOUT", "90"))))
    _init(backend, *args, **kwargs)
    env = os.environ
    print("@pod " + json.dumps({
        "rank": torch.distributed.get_rank(), "world": torch.distributed.get_world_size(),
        "master": env.get("MASTER_ADDR", "") + ":" + env.get("MASTER_PORT", ""),
        "node": env.get("NODE_RANK"), "host": _node(), "local_rank": env.get("LOCAL_RANK"),
    }), flush=True)


_BACKENDS = {}
torch.distributed.init_process_group = init_process_group
'''

# Without the stand-in (the portable target's pod, torch 2.9): TorchTPU's launch environment, the
# chips and the backend, emulated.
SHIM = OBSERVER + '''
import sys
import types

import torch.accelerator

_PORT = os.environ["POD_MASTER_PORT"]
_CHIPS = int(os.environ.get("POD_CHIPS_PER_HOST", "2"))


def set_tpu_launch_env(*, nnodes=None, nproc_per_node=None):
    """As torch_tpu 0.2.0's on a multi-host slice: only where unset; neither RANK nor WORLD_SIZE."""
    for name, value in (("TORCH_TPU_XPROF_SESSION_ID", "pod-test"),
                        ("TORCH_TPU_SLICEBUILDER_ADDRESSES", "127.0.0.1:8471,127.0.0.1:8472"),
                        ("NNODES", str(nnodes or 2)), ("NODE_RANK", _node()),
                        ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", _PORT),
                        ("TORCH_TPU_TOPOLOGY", "2x2")):
        os.environ.setdefault(name, value)


tpu = types.ModuleType("torch.tpu")
tpu.distributed = types.ModuleType("torch.tpu.distributed")
tpu.distributed.set_tpu_launch_env = set_tpu_launch_env
sys.modules["torch.tpu"], sys.modules["torch.tpu.distributed"] = tpu, tpu.distributed
torch.tpu = tpu

# The chips: torch.accelerator counts them; there is no accelerator to compute on (what the
# tpu target asks besides the count), so "tpu" devices are the CPU.
torch.accelerator.device_count = lambda: _CHIPS
torch.accelerator.is_available = lambda: False
torch.accelerator.current_accelerator = lambda check_available=False: None
_device = torch.device


class _DeviceType(type):
    def __instancecheck__(cls, obj):
        return isinstance(obj, _device)

    def __subclasscheck__(cls, sub):
        return issubclass(sub, _device)

    def __call__(cls, *args, **kwargs):
        kind = args[0] if args else kwargs.get("type")
        if isinstance(kind, str) and kind.split(":")[0] == "tpu":
            return _device("cpu")
        return _device(*args, **kwargs)


class device(metaclass=_DeviceType):
    pass


torch.device = device

# The process group: TorchTPU's backend is gloo here.
_BACKENDS.update({"tpu_dist": "gloo", "tpu": "gloo"})
'''


@dataclass
class Pod:
    """The runs of every host of one emulated pod (host k's at index k) and its master port."""
    runs: list[harness.Run]
    port: str
    seconds: float

    def merged(self) -> harness.Run:
        """The hosts' runs as one (host 0's records first: its rank 0 prints them)."""
        runs = self.runs
        return harness.Run(next((r.returncode for r in runs if r.returncode), 0),
                           [record for run in runs for record in run.records],
                           "\n".join(f"===== host {k} =====\n{run.output}" for k, run in enumerate(runs)))

    def pod_lines(self) -> list[dict]:
        """The `@pod` line of every process, with the host whose output held it."""
        return [{**json.loads(line), "printed_by": k}
                for k, run in enumerate(self.runs) for line in POD_LINE.findall(run.output)]

    def proc_lines(self) -> list[dict]:
        """The `@proc` lines of the programs that print them (index, rank and world; some also
        the host's counts)."""
        return [json.loads(line) for run in self.runs for line in PROC_LINE.findall(run.output)]

    def one_world_problems(self) -> list[str]:
        """What shows that the processes did not form one world of HOSTS * CHIPS_PER_HOST ranks
        (host k holding ranks k * CHIPS_PER_HOST ...) around the pod's one master; and, for the
        programs that print `@proc`, that a worker was not given its global rank as its index."""
        world = HOSTS * CHIPS_PER_HOST
        lines = self.pod_lines()
        problems = []
        ranks = sorted(line["rank"] for line in lines)
        if ranks != list(range(world)):
            problems.append(f"ranks {ranks}, expected {list(range(world))}")
        if any(line["world"] != world for line in lines):
            problems.append(f"world sizes {sorted({line['world'] for line in lines})}, expected {world}")
        masters = {line["master"] for line in lines}
        if masters != {f"127.0.0.1:{self.port}"}:
            problems.append(f"masters {sorted(masters)}, expected 127.0.0.1:{self.port}")
        for line in lines:
            if line["rank"] // CHIPS_PER_HOST != line["printed_by"]:
                problems.append(f"rank {line['rank']} ran on host {line['printed_by']}")
        for proc in self.proc_lines():
            if proc["index"] != proc["rank"] or proc["world"] != world:
                problems.append(f"a worker got index {proc['index']} as rank {proc['rank']} of {proc['world']}")
            # torch_xla's runtime in each process xmp.spawn started: the processes on its host,
            # the host's devices, one device of its own (programs that print them).
            host = {key: proc[key] for key in ("local", "devices", "addressable") if key in proc}
            if host and host != {"local": CHIPS_PER_HOST, "devices": CHIPS_PER_HOST, "addressable": 1}:
                problems.append(f"rank {proc['rank']} counted {host} on its host of {CHIPS_PER_HOST} chips")
        return problems


def shim_dir(workdir: Path) -> Path:
    return harness.torch_patch_dir(workdir / "pod-shim", "_pod_shim", SHIM)


_STANDIN_PATH_LOCK = threading.Lock()
_standin_path: str | None = None


def _standin_path_once() -> str:
    """The stand-in pods' PYTHONPATH (the blocker and the observer), one for every pod this
    process runs: the stand-in's warm python is kept per PYTHONPATH, so they all share one
    server (a directory per pod cost a server, and a torch import, per pod)."""
    global _standin_path
    with _STANDIN_PATH_LOCK:
        if _standin_path is None:
            directory = shared_runs.session_directory(f"standin-pod-{os.getpid()}")
            patch = harness.torch_patch_dir(directory / "pod-observer", "_pod_observer", OBSERVER)
            _standin_path = os.pathsep.join([str(harness.blocker_dir(directory)), str(patch)])
        return _standin_path


def _pod(workdir: Path, command, standin: bool = False, stop_on_failure: bool = False) -> Pod:
    """`command(k, env, port, started)` (a Run) on every host at once: they rendezvous with each
    other. With `standin`, each host is a TPU VM of the TorchTPU stand-in, told which host it is
    by what tells a real one (TPU_WORKER_HOSTNAMES, JOB_COMPLETION_INDEX); only the observer is
    added. With `stop_on_failure`, a host that fails stops the others at once, as a pod's job
    ends when one of its hosts fails (instead of their waiting out the rendezvous)."""
    port = str(harness.free_port())
    if standin:
        path = _standin_path_once()
    else:
        path = os.pathsep.join([str(harness.blocker_dir(workdir)), str(shim_dir(workdir))])
    started = time.monotonic()
    lock = threading.Lock()
    processes: dict[int, object] = {}
    failed: list[int] = []

    def stop_others(k: int) -> None:
        for other, process in processes.items():
            if other != k:
                process_groups.kill_group(process)

    def on_start(k: int, process) -> None:
        with lock:
            processes[k] = process
            if failed:
                stop_others(failed[0])

    def host(k: int) -> harness.Run:
        env = harness._mp_env({"PYTHONPATH": path, "POD_NODE_RANK": str(k), "POD_MASTER_PORT": port,
                               "POD_CHIPS_PER_HOST": str(CHIPS_PER_HOST)})
        if standin:
            env = launcher.pod_host_environment(harness.standin_env(env), HOSTS, k)
            env["MASTER_PORT"] = port  # set_tpu_launch_env keeps it, as it keeps any set before it
        run = command(k, env, port, (lambda process: on_start(k, process)) if stop_on_failure else None)
        if stop_on_failure and run.returncode != 0:
            with lock:
                if not failed:
                    failed.append(k)
                    stop_others(k)
        return run

    with ThreadPoolExecutor(max_workers=HOSTS, thread_name_prefix="pod-host") as hosts:
        runs = list(hosts.map(host, range(HOSTS)))
    return Pod(runs, port, time.monotonic() - started)


def run_python_pod(copy: Path, workdir: Path, args: list[str] = (), timeout: float = 150,
                   init_timeout: float | None = None, standin: bool = False,
                   stop_on_failure: bool = False) -> Pod:
    """`python copy args` on every host of the emulated pod at once: the program's own launcher
    (the migrated xmp.spawn) starts the processes of each host (2 chips a host)."""
    def command(k, env, port, started):
        if init_timeout is not None:
            env["POD_INIT_TIMEOUT"] = str(init_timeout)
        python = [harness.standin_python()] if standin else None
        return harness.run_bounded(copy, env, list(args), launcher=python, timeout=timeout, started=started)

    return _pod(workdir, command, standin, stop_on_failure)


def run_torchrun_pod(copy: Path, workdir: Path, args: list[str] = (), timeout: float = 150,
                     standin: bool = False) -> Pod:
    """`torchrun --nnodes 2 --nproc_per_node 2 --node_rank K` on every host at once (static
    rendezvous on 127.0.0.1). torchrun sets RANK, WORLD_SIZE and LOCAL_RANK; the shim only
    stands in for the backend and reports the group."""
    def command(k, env, port, started):
        python = harness.standin_python() if standin else sys.executable
        launcher = [python, "-m", "torch.distributed.run", "--nnodes", str(HOSTS),
                    "--nproc_per_node", str(CHIPS_PER_HOST), "--node_rank", str(k),
                    "--master_addr", "127.0.0.1", "--master_port", port, "--rdzv-backend", "static",
                    "--monitor_interval", "0.1"]
        return harness.run_bounded(copy, env, list(args), launcher=launcher, timeout=timeout, started=started)

    return _pod(workdir, command, standin)


def migrate_with_worker_variant(path: Path, workdir: Path, old: str, new: str, target: str = "tpu") -> Path:
    """Rewrite a copy of `path` with the launch transform's wrapper template (launch.WORKER)
    changed from `old` to `new`: a deliberately broken conversion, to show the pod test sees it."""
    workdir.mkdir(parents=True, exist_ok=True)
    copy = workdir / path.name
    shutil.copyfile(path, copy)
    script = (
        "import runpy, sys\n"
        "import tpu_migrate.rewrite.transforms.launch as launch\n"
        f"assert launch.WORKER.count({old!r}) == 1, 'the variant no longer applies'\n"
        f"launch.WORKER = launch.WORKER.replace({old!r}, {new!r})\n"
        f"sys.argv = ['tpu-migrate', 'rewrite', '--no-cache', '--jobs', '1', '--target', {target!r}, {str(copy)!r}]\n"
        "runpy.run_module('tpu_migrate', run_name='__main__')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TPU_MIGRATE_RULES_DIR"}
    env["PYTHONPATH"] = str(harness.ROOT)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                          timeout=harness.TIMEOUT)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"tpu-migrate failed: {proc.stdout}\n{proc.stderr}")
    return copy
