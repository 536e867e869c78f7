"""`tpu-migrate run`: a TorchTPU program on the stand-in, as `python SCRIPT ARGS` would run it on a
TPU VM (same argv, cwd, stdio and exit status), or under torchrun on this machine with --nproc
and --nnodes (each node a torchrun of its own, as on the hosts of a pod)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

from tpu_migrate import standin


def command(python: str, target: list[str]) -> list[str]:
    return [python, *target]


def run(python: str, target: list[str], nproc: int | None, nnodes: int) -> int:
    """Run the program; return its exit status (the worst of every node's under torchrun).

    `target` is ["SCRIPT", ARGS...] or ["-m", "MODULE", ARGS...]."""
    env = standin.environment()
    if nproc is None and nnodes == 1:
        # Nothing stands between the user and the program: its signals, stdio and status are its own.
        os.execve(python, command(python, target), env)
    return _torchrun(python, target, nproc or 1, nnodes, env)


def pod_host_environment(env: dict[str, str], nnodes: int, node_rank: int) -> dict[str, str]:
    """What makes a process on this machine see itself as host `node_rank` of an `nnodes`-host pod:
    the variables TorchTPU's set_tpu_launch_env reads on a TPU VM (the stand-in reads the same)."""
    env = dict(env)
    env["TPU_WORKER_HOSTNAMES"] = ",".join(["127.0.0.1"] * nnodes)
    env["JOB_COMPLETION_INDEX"] = str(node_rank)
    return env


def _torchrun(python: str, target: list[str], nproc: int, nnodes: int, env: dict[str, str]) -> int:
    port = _free_port()
    nodes = []
    for node_rank in range(nnodes):
        node_env = pod_host_environment(env, nnodes, node_rank) if nnodes > 1 else dict(env)
        node_env["PYTHON_EXEC"] = python  # torchrun's workers: this Python too
        launcher = [python, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--nnodes",
                    str(nnodes), "--node_rank", str(node_rank), "--master_addr", "127.0.0.1",
                    "--master_port", str(port), *target]
        nodes.append(subprocess.Popen(launcher, env=node_env))
    try:
        statuses = [node.wait() for node in nodes]
    except KeyboardInterrupt:
        for node in nodes:
            node.send_signal(signal.SIGINT)
        statuses = [node.wait() for node in nodes]
    return next((status for status in statuses if status != 0), 0)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def python_for_run(explicit: str | None) -> str:
    return standin.find_python(explicit, echo=lambda line: print(line, file=sys.stderr))
