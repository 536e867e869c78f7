"""A migrated launcher on a shared host where another job holds port 29500 (issue 51, item 8).

torch_xla's `xmp.spawn` and its xla:// rendezvous needed no port from the user. The migration's
env:// rendezvous needs MASTER_PORT; where the launch environment names none (plain `python
train.py` on one host: no torchrun, no MASTER_PORT, not a pod) the migrated program once set
29500, and failed with EADDRINUSE where another job held it. It now picks a port free at that
moment (TPU060's `_rendezvous_port()`; TPU070's defaults for a process alone use it too). On a
pod every host must agree, so there the launch environment's port stays: tests/test_pod.py.

Every run here holds 29500 (bound by the test, or already held by someone else: the same for
the program) and starts without MASTER_PORT, as a user's `python train.py` does.
"""

from __future__ import annotations

import errno
import socket

import pytest

import differential as harness
import shared_runs

pytestmark = pytest.mark.slow  # torch_xla originals, the stand-in's Python


@pytest.fixture
def port_29500_held():
    holder = socket.socket()
    try:
        holder.bind(("0.0.0.0", 29500))
        holder.listen()
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        # Already another job's: what the test wants the program to meet.
    try:
        yield
    finally:
        holder.close()


def _without_a_port(env: dict[str, str]) -> dict[str, str]:
    assert "MASTER_PORT" not in env  # _mp_env drops the launcher's variables: nothing names a port
    return env


# One target each: both write the same _rendezvous_port() (the suite's time is a budget).
@pytest.mark.parametrize("program, target", [
    ("m01_spawn_all_devices.py", "tpu"),         # xmp.spawn's launcher (TPU060) on the TorchTPU stand-in,
                                                 # 2 chips: 2 processes
    ("m11_plain_process_group.py", "portable"),  # a plain process's own xla:// group (TPU070)
])
def test_a_migrated_program_runs_at_one_host_while_another_job_holds_29500(port_29500_held, tmp_path, program,
                                                                            target):
    path = harness.MP_PROGRAMS / program
    original = harness.run_original_mp(path)
    # With every module the programs import (m11's library collective makes the group first).
    copy = harness.migrate_many(sorted(harness.MP_PROGRAMS.glob("*.py")), tmp_path, target)[program]
    text = copy.read_text()
    assert 'setdefault("MASTER_PORT", _rendezvous_port())' in text and '"29500"' in text  # the pod's default
    if target == "portable":
        env = _without_a_port(harness._mp_env({"PYTHONPATH": str(harness.blocker_dir(tmp_path))}))
        migrated = harness.run_bounded(copy, env)
    else:  # as run_standin_mp runs it, less the port it gives
        blocked = harness.blocker_dir(shared_runs.session_directory("standin"))
        env = harness.standin_env(_without_a_port(harness._mp_env({"PYTHONPATH": str(blocked)})))
        migrated = harness.run_bounded(copy, env, launcher=[harness.standin_python()])
    assert "EADDRINUSE" not in migrated.output and "address already in use" not in migrated.output, migrated.output
    result = harness.compare_exactly_once(program, original, migrated)
    assert result.ok, "\n".join(result.problems)
