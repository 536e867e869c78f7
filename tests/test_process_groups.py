"""tests/process_groups.py: a run's leftovers are killed, a stranger holding a reused number is not."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

import process_groups

pytestmark = pytest.mark.slow  # real processes, a second or two

# Starts a sleeper in its own process group, prints its pid, and exits.
LEAVES_A_SLEEPER = (
    "import subprocess, sys;"
    "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
    "print(p.pid, flush=True)"
)


def state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0].decode()
    except OSError:
        return None


def gone(pid: int, within: float = 10) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if state(pid) in (None, "Z"):
            return True
        time.sleep(0.02)
    return False


def test_the_group_is_killed_while_its_leader_is_not_reaped():
    leader = subprocess.Popen([sys.executable, "-c", LEAVES_A_SLEEPER], stdout=subprocess.PIPE,
                              start_new_session=True, text=True)
    sleeper = int(leader.stdout.readline())
    assert process_groups.wait_unreaped(leader, timeout=60)
    assert leader.returncode is None and state(leader.pid) == "Z"  # exited, its number still held
    assert process_groups.group_members(leader.pid) == sorted([leader.pid, sleeper])
    process_groups.kill_group(leader)
    assert leader.wait() == 0
    assert gone(sleeper)
    leader.stdout.close()


def test_after_reaping_the_members_left_are_killed():
    leader = subprocess.Popen([sys.executable, "-c", LEAVES_A_SLEEPER], stdout=subprocess.PIPE,
                              start_new_session=True, text=True)
    sleeper = int(leader.stdout.readline())
    leader.wait()
    assert state(sleeper) in ("R", "S")  # alive, in the reaped leader's group
    process_groups.kill_group(leader)
    assert gone(sleeper)
    leader.stdout.close()


def test_a_group_whose_number_a_new_process_holds_is_left_alone():
    """As when the reaped leader's number went to a stranger that leads a session of its own."""
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        reaped = SimpleNamespace(pid=stranger.pid, returncode=0)
        process_groups.kill_group(reaped)
        time.sleep(0.2)
        assert stranger.poll() is None
    finally:
        stranger.send_signal(signal.SIGKILL)
        stranger.wait()


def test_waiting_ends_at_the_timeout():
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        started = time.monotonic()
        assert not process_groups.wait_unreaped(sleeper, timeout=0.3)
        assert 0.3 <= time.monotonic() - started < 5
    finally:
        process_groups.kill_group(sleeper)
        assert sleeper.wait() == -signal.SIGKILL
