"""tests/warm_python.py must be invisible: a program run through its client observes what it
observes under `python`, and ends the same way. A probe reports everything a program can see
at start (arguments, paths, environment, its __main__ module, standard streams, signal
dispositions, inherited descriptors, sitecustomize, a blocked import) and then ends in each of
the ways a program ends; both runs must print the same, on both streams, with the same status."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import conftest
import differential as harness
import warm_python
from conftest import ROOT

pytestmark = pytest.mark.slow  # servers that import torch and torch_xla; only the slow tests use them

PROBE = r'''
import json, os, signal, sys, tempfile, threading, atexit
def disposition(s):
    try:
        h = signal.getsignal(s)
    except ValueError:
        return "?"
    return h if isinstance(h, (int, type(None))) else getattr(h, "__name__", repr(h))
def stream(s):
    return None if s is None else [s.encoding, s.errors, s.line_buffering, s.write_through, s.mode, s.isatty(),
                                   s.fileno(), type(s.buffer).__name__ if hasattr(s, "buffer") else None]
def main():
    module = sys.modules["__main__"]
    try:
        import torch_xla
        blocked = None
    except ImportError as error:
        blocked = str(error)
    tmp = tempfile.gettempdir()  # torch_xla's import makes a directory there, named at random
    path = ["<made under TMPDIR>" if os.path.dirname(p) == tmp and os.path.basename(p).startswith("tmp") else p
            for p in sys.path]
    state = {
        "blocked": blocked, "argv": sys.argv, "path": path, "cwd": os.getcwd(), "env": dict(os.environ),
        "name": __name__, "file": globals().get("__file__"), "spec": repr(__spec__), "package": __package__,
        "loader": type(__loader__).__name__ if not isinstance(__loader__, type) else __loader__.__name__,
        "cached": globals().get("__cached__"), "builtins": type(__builtins__).__name__,
        "main_is_module": module.__dict__ is globals(),
        "streams": [stream(sys.stdin), stream(sys.stdout), stream(sys.stderr)],
        "same_streams": [sys.stdin is sys.__stdin__, sys.stdout is sys.__stdout__, sys.stderr is sys.__stderr__],
        "signals": {int(s): disposition(s) for s in signal.valid_signals()},
        "mask": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "fds": sorted(int(f) for f in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{f}")
                      and os.get_inheritable(int(f))),
        "bytecode": sys.dont_write_bytecode, "tmp": tempfile.gettempdir(),
        "site": os.environ.get("PROBE_SITE_RAN"), "threads": threading.active_count(),
        "stdin": sys.stdin.readline(),
    }
    with os.fdopen(int(os.environ["PROBE_FD"]), "w") as extra:
        extra.write("through the inherited pipe")
    print(json.dumps(state, sort_keys=True))
    if blocked is None:  # a stream torch_xla bound at its import: the output must not stay in it
        import inspect
        import torch_xla.core.xla_model as xm
        held = inspect.signature(xm.master_print).parameters["fd"].default
        print("through the stream torch_xla holds", file=held)
    def said():
        print("atexit ran", flush=True)
    atexit.register(said)
    def late():
        import time; time.sleep(0.2); print("thread finished")
    late_thread = threading.Thread(target=late)
    late_thread.start()
    sys.stdout.write("no newline at the end")
    ending = sys.argv[1]
    if ending == "exit3": sys.exit(3)
    if ending == "exit-message": sys.exit("a message")
    if ending == "exception": raise ValueError("the probe failed")
    if ending == "interrupt": raise KeyboardInterrupt
    if ending == "terminated": os.kill(os.getpid(), signal.SIGTERM)
    if ending == "closed-stdout":  # Python skips a closed stream at exit: status 0, not 120
        late_thread.join()
        atexit.unregister(said)
        sys.stdout.close()
    if ending == "multiprocessing":
        import multiprocessing
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            values = pool.map(abs, [-1, -2])
        late_thread.join()  # a warm child can answer within the thread's 0.2 s: keep one order
        print(values)

if __name__ == "__main__":  # not again in a spawned child, which imports this file
    main()
'''

SITE = "import os\nos.environ['PROBE_SITE_RAN'] = 'yes'\n"


# The two servers of the harness: the migrated programs' (torch; torch_xla blocked) and the
# originals' (torch_xla imported, PJRT_DEVICE=CPU).
FLAVOURS = {"migrated": (harness.WARM_MODULES, {}), "original": (harness.WARM_XLA_MODULES, {"PJRT_DEVICE": "CPU"})}


@pytest.fixture(scope="module")
def servers():
    """`servers(flavour)`: the client of that flavour's server, the very one the harness runs
    its programs with (started on first use, stopped at the end of the session)."""
    def client(flavour: str) -> str:
        modules, extra = FLAVOURS[flavour]
        python = warm_python.python_for(harness._env(extra), modules)
        assert python != sys.executable, "no warm python server started"
        return python

    return client


@pytest.fixture
def warm(servers):
    return servers("migrated")


def _run(python: str, workdir: Path, flavour: str, *args: str) -> tuple[subprocess.CompletedProcess, str]:
    """The probe under `python` with an extra inherited pipe, a sitecustomize (and for the
    migrated flavour a blocking package) on PYTHONPATH, some standard input, SIGUSR2 blocked
    (a program starts with the mask its launcher had) and the suite's environment."""
    site = workdir / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITE)
    probe = workdir / "probe.py"
    probe.write_text(PROBE)
    tmp = workdir / "tmp"
    tmp.mkdir(exist_ok=True)
    read, write = os.pipe()
    path = [str(site)] if flavour == "original" else [str(harness.blocker_dir(workdir)), str(site)]
    env = harness._env({"PYTHONPATH": os.pathsep.join(path), "PROBE_FD": str(write), "TMPDIR": str(tmp),
                        **FLAVOURS[flavour][1]})
    try:
        proc = subprocess.run([python, "probe.py", *args], cwd=workdir, env=env, input="a line\nanother\n",
                              capture_output=True, text=True, pass_fds=[write], timeout=120,
                              preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2}))
    finally:
        os.close(write)
        with os.fdopen(read) as pipe:
            through = pipe.read()
    return proc, through


ENDINGS = ["normal", "exit3", "exit-message", "exception", "interrupt", "terminated", "multiprocessing",
           "closed-stdout"]
# A cold original imports torch_xla for seconds: for it, the endings in which it could differ.
CASES = [pytest.param("migrated", ending, id=f"migrated-{ending}") for ending in ENDINGS] + [
    pytest.param("original", ending, id=f"original-{ending}")
    for ending in ("normal", "exception", "multiprocessing")]


@pytest.mark.parametrize("flavour, ending", CASES)
def test_a_program_cannot_tell_the_warm_python_from_python(servers, tmp_path, flavour, ending):
    warm = servers(flavour)
    cold, cold_pipe = _run(sys.executable, tmp_path, flavour, ending)
    hot, hot_pipe = _run(warm, tmp_path, flavour, ending)
    assert cold.returncode == hot.returncode, (cold.stderr, hot.stderr)
    assert hot.stdout == cold.stdout
    assert hot.stderr == cold.stderr
    assert hot_pipe == cold_pipe == "through the inherited pipe"
    # The probe really ran, and really warm (the comparison above would pass if both failed alike).
    assert '"site": "yes"' in hot.stdout and '"stdin": "a line\\n"' in hot.stdout
    assert f'"mask": [{int(signal.SIGUSR2)}]' in hot.stdout
    if flavour == "migrated":
        assert "torch_xla is blocked" in hot.stdout
    else:
        assert '"blocked": null' in hot.stdout and "<made under TMPDIR>" in hot.stdout
        assert "through the stream torch_xla holds" in hot.stdout
    if ending == "normal":
        assert hot.stdout.endswith("atexit ran\n") and "thread finished" in hot.stdout


def test_the_client_is_warm_and_its_program_imports_nothing_again(warm, tmp_path):
    script = tmp_path / "warmth.py"
    script.write_text("import sys\nprint('torch' in sys.modules)\n")
    env = harness._env({})
    hot = subprocess.run([warm, str(script)], env=env, capture_output=True, text=True, timeout=60)
    cold = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert (hot.stdout, cold.stdout) == ("True\n", "False\n")


def test_a_run_the_server_cannot_reproduce_starts_a_real_python(warm, tmp_path):
    """An environment variable torch reads at import with another value, an interpreter option
    the client does not know, other buffering: the real interpreter runs it (no torch loaded)."""
    script = tmp_path / "warmth.py"
    script.write_text("import sys\nprint('torch' in sys.modules, sys.flags.optimize)\n")
    env = harness._env({})
    other = subprocess.run([warm, str(script)], env={**env, "TORCH_LOGS": "graph_breaks"},
                           capture_output=True, text=True, timeout=60)
    option = subprocess.run([warm, "-O", str(script)], env=env, capture_output=True, text=True, timeout=60)
    # Buffered streams, where the server's (which modules hold since their import) are not.
    buffered = subprocess.run([warm, str(script)], env={**env, "PYTHONUNBUFFERED": ""},
                              capture_output=True, text=True, timeout=60)
    assert (other.stdout, option.stdout, buffered.stdout) == ("False 0\n", "False 1\n", "False 0\n")


def test_killing_the_client_kills_its_program(warm, tmp_path, reap):
    """The harness kills a run past its time by killing the client's session: the program, in
    a session the server made, must die with it."""
    pid_file = tmp_path / "pid"
    script = tmp_path / "sleeper.py"
    script.write_text(f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(600)\n")
    client = subprocess.Popen([warm, str(script)], env=harness._env({}), start_new_session=True)
    reap(client)
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    program = int(pid_file.read_text())
    os.killpg(client.pid, signal.SIGKILL)
    client.wait(timeout=30)
    deadline = time.monotonic() + 30
    while _alive(program) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(program)


def test_a_signal_to_the_client_reaches_the_program_once(warm, tmp_path):
    """torchrun stops its workers with SIGTERM: the program's handler runs (once) and decides
    the status, which the client passes on."""
    script = tmp_path / "handler.py"
    script.write_text(textwrap.dedent("""
        import signal, sys, time
        def handler(signum, frame):
            print("handled", signum, flush=True)
            sys.exit(5)
        signal.signal(signal.SIGTERM, handler)
        print("ready", flush=True)
        time.sleep(60)
    """))
    client = subprocess.Popen([warm, str(script)], env=harness._env({}), stdout=subprocess.PIPE, text=True)
    assert client.stdout.readline() == "ready\n"
    client.send_signal(signal.SIGTERM)
    out, _ = client.communicate(timeout=60)
    assert (client.returncode, out) == (5, f"handled {int(signal.SIGTERM)}\n")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for the server to reap it is dead too
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z"
    except OSError:
        return False


def test_the_tool_runs_warm_only_from_the_checkout_it_imported(tmp_path):
    """The CLI runs of the suite (conftest.run_cli) fork a server that imported the tool from
    this checkout: a run with another PYTHONPATH, which could find another tpu_migrate, starts
    cold; a warm run writes what a cold one writes."""
    env = conftest.cli_env()
    python = conftest.tool_python(env)
    assert python != sys.executable, "no warm python server started"
    source = tmp_path / "train.py"
    source.write_text("import torch_xla.core.xla_model as xm\ndevice = xm.xla_device()\n")
    command = ["-c", "import sys; print(sorted(m for m in sys.modules if m.startswith('tpu_migrate'))[:1])"]
    hot = subprocess.run([python, *command], env=env, capture_output=True, text=True, timeout=60)
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    elsewhere = subprocess.run([python, *command], env={**env, "PYTHONPATH": f"{shadow}{os.pathsep}{ROOT}"},
                               capture_output=True, text=True, timeout=60)
    assert (hot.stdout, elsewhere.stdout) == ("['tpu_migrate']\n", "[]\n")
    rewrite = ["-m", "tpu_migrate", "rewrite", "--diff", "--no-cache", str(source)]
    runs = [subprocess.run([interpreter, *rewrite], env=env, capture_output=True, text=True, timeout=60)
            for interpreter in (python, sys.executable)]
    assert runs[0].returncode == runs[1].returncode == 1
    assert runs[0].stdout == runs[1].stdout and "torch.device" in runs[0].stdout
    assert runs[0].stderr == runs[1].stderr


def test_the_harness_runs_are_one_kind_whether_or_not_this_process_imported_torch_xla(monkeypatch):
    """`import torch_xla` in a test worker (in-process diagnose, verify) sets TF_CPP_MIN_LOG_LEVEL
    and GRPC_VERBOSITY in its environment: the harness's runs after it were another kind of warm
    python than before (a server more per worker, and cold runs past MAX_SERVERS)."""
    for name in harness.TORCH_XLA_IMPORT_DEFAULTS:
        monkeypatch.delenv(name, raising=False)
    before = harness.original_mp_env(), harness._mp_env({})
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "1")  # what torch_xla/__init__.py sets by default
    monkeypatch.setenv("GRPC_VERBOSITY", "ERROR")
    after = harness.original_mp_env(), harness._mp_env({})
    assert [{k: v for k, v in env.items() if k != "MASTER_PORT"} for env in after] == \
        [{k: v for k, v in env.items() if k != "MASTER_PORT"} for env in before]  # (a free port each)
    assert [warm_python._signature(env, set()) for env in after] == [warm_python._signature(env, set()) for env in before]
