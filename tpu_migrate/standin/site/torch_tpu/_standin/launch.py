"""The emulated TPU host, and TorchTPU 0.2.0's launch environment on it.

`torch.tpu.distributed.set_tpu_launch_env` and `python -m torch.tpu.distributed` behave as in
torch-tpu 0.2.0; only the hardware they read is emulated. The variables that say which host this
process emulates:

  TORCH_TPU_DEVICES_PER_HOST  chips on this host (default 4): a TPU v4 host, 32 GiB of HBM a chip,
                              one process per chip. 1, 2, 4 or 8 chips make the topologies
                              "1,1,1", "1,2,1", "2,2,1", "2,2,2"; another count is a host no v4
                              has, and asking for its topology raises as the real one does. (The
                              real one counts the chips on the PCI bus and reads this variable
                              only for the multi-host addresses; here it is the PCI bus too.)
  TPU_WORKER_HOSTNAMES        the pod's hosts, comma-separated (what a TPU VM sets). Two or more
                              names make a multi-host job; the first is MASTER_ADDR.
  JOB_COMPLETION_INDEX        this host's index K in the pod, which becomes NODE_RANK (what a
                              Kubernetes Indexed Job sets). Set alone, it makes a multi-host job.
  TORCH_TPU_BASE_PORT         first slicebuilder port on every host (default 8070).

So `TPU_WORKER_HOSTNAMES=127.0.0.1,127.0.0.1 JOB_COMPLETION_INDEX=K` makes a process host K of a
2-host pod of v4 hosts (4 chips each, or TORCH_TPU_DEVICES_PER_HOST). The real one ranks hosts by
their chips' physical coordinates when TORCH_TPU_TOPOLOGY is set from outside; emulated chips
have no coordinates, so NODE_RANK always comes from JOB_COMPLETION_INDEX here, and without it a
multi-host call raises the error the real one raises when it has neither.

Like the real one, every variable is read once a process (the real reads them through a memo in
C++), and a value it generated once is set again, not generated anew, if the variable is unset
later. This module imports neither torch nor tpu-migrate: `python -m torch.tpu.distributed` runs
it as `__main__`.
"""

import os
import socket
import sys
import time

GENERATION = "TPU v4"
HBM_BYTES_PER_CHIP = 32 * 1024**3
# Chips on one host -> the topology TorchTPU gives that many processes ("X,Y,Z" chips).
_TOPOLOGIES = {1: "1,1,1", 2: "1,2,1", 4: "2,2,1", 8: "2,2,2"}
_DEFAULT_CHIPS = 4

_read_once = {}  # variable -> its value (None: unset) when this process first read it
_generated = {}  # variable -> the value this process generated for it


def _env_once(name):
    """The variable's value as this process first read it (TorchTPU's GetEnvOnce)."""
    if name not in _read_once:
        _read_once[name] = os.environ.get(name)
    return _read_once[name]


def _int_env_once(name, default):
    value = _env_once(name)
    return default if value is None else int(value)


def _set_once(name, make_value):
    """Sets `name` unless it is set; `make_value` runs at most once a process (as the real one)."""
    value = os.environ.get(name)
    if value is not None:
        return value
    if name not in _generated:
        _generated[name] = make_value()
    os.environ[name] = value = _generated[name]
    return value


def host_chip_count():
    """Chips on the emulated host: what TorchTPU's PCI scan would count."""
    return max(0, _int_env_once("TORCH_TPU_DEVICES_PER_HOST", _DEFAULT_CHIPS))


def host_topology(world_size=None):
    """TorchTPU's topology for `world_size` processes (default: one a chip), None without chips."""
    chips = host_chip_count()
    if not chips:
        return None
    count = chips if world_size is None else world_size
    if count not in _TOPOLOGIES:
        raise RuntimeError(f"No TPU topology found for count: {count}")
    return _TOPOLOGIES[count]


def _unused_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("localhost", 0))
        return probe.getsockname()[1]


def _require_hostnames(hostnames):
    if not hostnames:
        raise ValueError(
            "set_tpu_launch_env(): expected environment variable "
            "TPU_WORKER_HOSTNAMES to be a comma-separated list of worker "
            "hostnames or IP addresses, got it as unset"
        )
    return hostnames


def _node_rank(completion_index):
    # No chip coordinates here, so the real one's fallback: the host's job index.
    if completion_index is not None:
        return str(int(completion_index))
    raise ValueError(
        "set_tpu_launch_env(): expected either TPU device coordinates together"
        " with environment variable TORCH_TPU_TOPOLOGY, or environment"
        " variable JOB_COMPLETION_INDEX to be a 0-based index of this host"
        " (Kubernetes Indexed Jobs set this automatically), to determine"
        " NODE_RANK, got neither"
    )


def _set_multi_host_env(nnodes, nproc_per_node, hostnames, completion_index):
    def slicebuilder_addresses():
        hosts = _require_hostnames(hostnames)
        base_port = _int_env_once("TORCH_TPU_BASE_PORT", 8070)
        default = nproc_per_node or host_chip_count() or 8
        per_host = _int_env_once("TORCH_TPU_DEVICES_PER_HOST", default)
        return ",".join(f"{host}:{base_port + i}" for host in hosts for i in range(per_host))

    _set_once("TORCH_TPU_SLICEBUILDER_ADDRESSES", slicebuilder_addresses)
    _set_once("NNODES", lambda: str(nnodes if nnodes is not None else len(_require_hostnames(hostnames))))
    _set_once("NODE_RANK", lambda: _node_rank(completion_index))
    _set_once("MASTER_ADDR", lambda: _require_hostnames(hostnames)[0])
    _set_once("MASTER_PORT", lambda: "29500")
    topology = host_topology()
    if topology is not None:
        _set_once("TORCH_TPU_TOPOLOGY", lambda: topology)


def _set_single_host_env(nproc_per_node):
    topology = host_topology(nproc_per_node)
    count = nproc_per_node if nproc_per_node is not None else host_chip_count()

    def require_topology():
        if topology is None:
            raise ValueError("set_tpu_launch_env(): expected TPU devices, got none")
        return topology

    _set_once("TORCH_TPU_SLICEBUILDER_ADDRESSES",
              lambda: ",".join(f"localhost:{_unused_port()}" for _ in range(count)))
    _set_once("TORCH_TPU_TOPOLOGY", require_topology)


def set_tpu_launch_env(*, nnodes=None, nproc_per_node=None):
    """Sets, only where unset, the variables a TorchTPU job needs before its workers spawn.

    As torch-tpu 0.2.0: idempotent; only `os.environ` changes; never RANK or WORLD_SIZE. One host:
    TORCH_TPU_SLICEBUILDER_ADDRESSES (a free localhost port a process) and TORCH_TPU_TOPOLOGY
    (`nproc_per_node` must be a count the host's generation supports). Host K of a pod: also
    NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT. Both: TORCH_TPU_XPROF_SESSION_ID.
    """
    _set_once("TORCH_TPU_XPROF_SESSION_ID", lambda: str(time.time_ns()))
    hostnames_text = _env_once("TPU_WORKER_HOSTNAMES")
    hostnames = [h for h in hostnames_text.split(",") if h] if hostnames_text else []
    if nnodes is not None and hostnames and nnodes != len(hostnames):
        raise ValueError(
            "set_tpu_launch_env(): expected nnodes to match the number of hosts in "
            f"environment variable TPU_WORKER_HOSTNAMES ({len(hostnames)}: "
            f'"{hostnames_text}"), got {nnodes}'
        )
    completion_index = _env_once("JOB_COMPLETION_INDEX")
    # Count the names: a single-host TPU VM sets TPU_WORKER_HOSTNAMES to its own name.
    if (nnodes is not None and nnodes > 1) or len(hostnames) > 1 or completion_index is not None:
        _set_multi_host_env(nnodes, nproc_per_node, hostnames, completion_index)
    else:
        _set_single_host_env(nproc_per_node)


def launch_env_lines():
    """Sets the launch environment, then the shell assignments `python -m torch.tpu.distributed`
    prints (the real one's lines, quotes included)."""
    set_tpu_launch_env()
    env = os.environ
    addresses = env.get("TORCH_TPU_SLICEBUILDER_ADDRESSES", "")
    world_size = len(addresses.split(",")) if addresses else host_chip_count()
    lines = [
        f'TORCH_TPU_TOPOLOGY="{env.get("TORCH_TPU_TOPOLOGY", "")}"',
        f'TORCH_TPU_SLICEBUILDER_ADDRESSES="{addresses}"',
        f'TORCH_TPU_XPROF_SESSION_ID="{env.get("TORCH_TPU_XPROF_SESSION_ID", "")}"',
        f"WORLD_SIZE={world_size}",
        f'NODE_RANK="{env.get("NODE_RANK", "0")}"',  # on one host too, for --node_rank
    ]
    lines += [f'{name}="{env[name]}"' for name in ("NNODES", "MASTER_ADDR", "MASTER_PORT") if name in env]
    return lines


def main(argv=None):
    """`python -m torch.tpu.distributed`: prints the launch environment as `KEY=value` lines."""
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--print_local_device_coords"]:
        print("emulated TPU chips have no physical coordinates", file=sys.stderr)
        return 1
    for line in launch_env_lines():
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
