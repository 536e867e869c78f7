"""The warm python's child gives each descriptor the client sent it the client's number
(warm_python._place_fds), whatever numbers the server's fork left free: a run whose descriptors
landed on one another read the wrong pipe (multiprocessing's spawn child got its tracker's
descriptor for its parent's pipe, or none: EBADF in spawn_main, with two xmp.spawn at once).

Runs in a child python of its own: placing descriptors closes every other one."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from conftest import ROOT

# The child as the server's fork leaves it: low numbers free between open ones (the listener,
# the wake-up pipe and the other runs' connections it closed). Descriptors 3, 4 and 6 are
# open, 5 and 7 free; the client's two files arrive at 40 and 41 and belong at 7 and 8. A
# copy "out of the way" that takes the lowest free number lands on 5 and 7, and placing the
# first at 7 then overwrites the copy of the second before it is placed.
PLACE = textwrap.dedent("""
    import os, sys, tempfile
    sys.path.insert(0, sys.argv[1])
    import warm_python

    def holding(text):
        fd, path = tempfile.mkstemp()
        os.write(fd, text)
        os.unlink(path)
        return fd

    one, two = holding(b"one"), holding(b"two")
    os.dup2(one, 40)
    os.dup2(two, 41)
    null = os.open(os.devnull, os.O_RDONLY)
    for number in (3, 4, 6):
        os.dup2(null, number)
    for number in range(5, 40):
        if number != 6:
            try:
                os.close(number)
            except OSError:
                pass
    warm_python._place_fds([40, 41], [7, 8])
    placed = (os.pread(7, 3, 0), os.pread(8, 3, 0))
    def is_open(fd):
        try:
            os.fstat(fd)
            return True
        except OSError:
            return False

    others = [fd for fd in (3, 4, 5, 6, 40, 41) if is_open(fd)]
    os._exit(0 if placed == (b"one", b"two") and not others else 1)
""")


def test_received_descriptors_take_the_clients_numbers_whatever_is_free():
    run = subprocess.run([sys.executable, "-c", PLACE, str(ROOT / "tests")], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
