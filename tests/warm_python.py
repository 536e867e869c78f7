"""A `python` whose programs start with torch already imported: the suite's program runs cost a
fork instead of an import.

Measured over a whole suite run (every process logging its CPU time and its imports' at exit):
60% of the CPU time of the programs the suite ran went into `import torch` / `import torch_xla`,
2-5 s per process, in about 450 processes. A WarmPython server imports the modules once; each run then connects to it through
an executable client (tests/warm_client.py) that stands where `python` stands: in a command
line, as torchrun's PYTHON_EXEC for its workers, as multiprocessing's spawn executable.

The server forks a child per run, and the child becomes `python ARGS` started in the client's
environment, working directory, file descriptors and signal dispositions (`become`), in a
session of its own. What the child cannot reproduce, it refuses, and the client runs the real
interpreter instead: an interpreter option other than -u / -B / -c / -m, or an environment
variable that was read while the modules were imported (or that the C++ runtimes read at load:
OMP_*, PYTORCH_*, ...) with another value than the server's. tests/test_warm_python.py runs a
probe of everything a program can observe both ways and requires the same answers.

TPU_MIGRATE_COLD_PYTHON=1 turns it off: every run then starts a real interpreter.
"""

from __future__ import annotations

import fcntl
import importlib
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Variables the native libraries read when they load (not seen by the Python-level recording).
LOAD_TIME_PREFIXES = ("PYTHON", "OMP_", "KMP_", "MKL_", "OPENBLAS_", "GOMP_", "LD_", "MALLOC_", "TORCH_",
                      "PYTORCH_", "C10_", "XLA_", "PJRT_", "TF_", "TPU_", "NPY_", "LC_", "LANG")
# ... of which these are reproduced per run: the interpreter's own, and the temporary directory
# (tempfile's choice is reset; the one directory an import makes is made again, see
# _own_import_time_tempdir).
# PJRT_DYNAMIC_PLUGINS: torch_xla sets it when its runtime starts (an original's children inherit
# it) and reads it only then (torch_xla/experimental/plugins.py), never while importing.
# TORCH_NCCL_ASYNC_ERROR_HANDLING: torchrun sets it for its workers; ProcessGroupNCCL reads it
# when it is made. TORCH_DIST_INIT_BARRIER: read when a process group is made (torch's
# distributed_c10d._is_barrier_after_init, torch_xla's rendezvous), in Python only.
# TPU_MIGRATE_*: the tool's own (verify's record directory), read by its sitecustomize, which runs
# per run. (TORCH_TPU_* is not: the TorchTPU stand-in's server imports torch_tpu, which reads
# TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS at import.)
# TORCH_TPU_SLICEBUILDER_ADDRESSES, TORCH_TPU_TOPOLOGY, TORCH_TPU_XPROF_SESSION_ID: what the stand-in's
# set_tpu_launch_env sets before a launch (the children of a pod host start with them) and reads only
# then (torch_tpu/_standin/launch.py), never while importing: each spawned worker of a pod started cold.
PER_RUN = {"PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHON_EXEC", "TMPDIR", "TEMP", "TMP",
           "PJRT_DYNAMIC_PLUGINS", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_DIST_INIT_BARRIER",
           "TORCH_TPU_SLICEBUILDER_ADDRESSES", "TORCH_TPU_TOPOLOGY", "TORCH_TPU_XPROF_SESSION_ID"}
PER_RUN_PREFIXES = ("TPU_MIGRATE_",)


def per_run(name: str) -> bool:
    return name in PER_RUN or name.startswith(PER_RUN_PREFIXES)


def cold_python() -> bool:
    return os.environ.get("TPU_MIGRATE_COLD_PYTHON") == "1"


# --- the server ----------------------------------------------------------------------------------

def _import_recording_environment(modules: list[str]) -> set[str]:
    """Import `modules`; the names of the environment variables read meanwhile."""
    reads: set[str] = set()
    plain = type(os.environ)

    class Recording(plain):
        def __getitem__(self, key):
            reads.add(key)
            return super().__getitem__(key)

        def __contains__(self, key):
            reads.add(key)
            return super().__contains__(key)

        def get(self, key, default=None):
            reads.add(key)
            return super().get(key, default)

        # A scan of the whole environment reads every value without using most (networkx keeps
        # the NETWORKX_* ones): not a read of each, or every variable would decide.
        def items(self):
            return [(key, plain.__getitem__(self, key)) for key in plain.__iter__(self)]

        def values(self):
            return [plain.__getitem__(self, key) for key in plain.__iter__(self)]

        def copy(self):
            return {key: plain.__getitem__(self, key) for key in plain.__iter__(self)}

    os.environ.__class__ = Recording
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _StartupStream("stdout"), _StartupStream("stderr")
    try:
        for module in modules:
            importlib.import_module(module)
    finally:
        os.environ.__class__ = plain
        sys.stdout, sys.stderr = streams
    return reads


_RUN_STREAMS: dict[str, object] = {}  # in a run: its sys.stdout / sys.stderr when its startup ended


class _StartupStream:
    """What a module binds as sys.stdout / sys.stderr while the server imports it (torch_xla's
    `def master_print(..., fd=sys.stdout)`, a logging handler): in a run, the stream the run had
    when its startup ended, as the module would have bound had the run imported it. That is
    another object than the server's own where a sitecustomize stood in for sys.stdout (verify's
    recorder keeps what the program prints)."""

    def __init__(self, name: str):
        self._name = name

    def _stream(self):
        return _RUN_STREAMS.get(self._name) or getattr(sys, f"__{self._name}__")

    def write(self, text):
        return self._stream().write(text)

    def flush(self):
        return self._stream().flush()

    def __getattr__(self, name):
        return getattr(self._stream(), name)


def _signature(env: dict[str, str], read: set[str]) -> dict[str, str | None]:
    keys = {k for k in env if k.startswith(LOAD_TIME_PREFIXES)} | read
    return {k: env.get(k) for k in sorted(keys) if not per_run(k)}


def _recv_request(conn: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 20, 256)
    if len(data) < 4:
        raise ConnectionError("short request")
    size = struct.unpack("!I", data[:4])[0]
    data = bytearray(data[4:])
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("truncated request")
        data += chunk
    return json.loads(data), fds


def _refusal(request: dict, signature: dict[str, set]) -> str | None:
    """Why this run cannot be reproduced in a forked child, or None."""
    mismatched = [k for k, values in signature.items() if request["env"].get(k) not in values]
    mismatched += [k for k in request["env"] if k.startswith(LOAD_TIME_PREFIXES) and k not in signature
                   and not per_run(k)]
    if mismatched:
        return "read at start with another value: " + ", ".join(sorted(mismatched))
    try:
        options = _parse_args(request["args"])[0]
    except ValueError as error:
        return str(error)
    # Unbuffered or not decides the kind of the standard streams, which modules may hold since
    # their import (they are the server's): only a run of the server's kind can have them.
    if (options["unbuffered"] or bool(request["env"].get("PYTHONUNBUFFERED"))) != _SERVER_UNBUFFERED:
        return "standard streams buffered otherwise (-u or PYTHONUNBUFFERED)"
    # A server of modules found through PYTHONPATH (the tool's, from the checkout) serves only
    # runs that would find the same ones.
    if _SERVER_PYTHONPATH is not None and request["env"].get("PYTHONPATH") != _SERVER_PYTHONPATH:
        return "another PYTHONPATH than the one the modules were imported from"
    return None


_SERVER_UNBUFFERED = False  # whether the server's own standard streams are unbuffered
_SERVER_PYTHONPATH: str | None = None  # the server's PYTHONPATH, when it kept one (WarmPython's keep_path)


def serve(socket_path: str, modules: list[str], client: str) -> None:
    global _SERVER_UNBUFFERED, _SERVER_PYTHONPATH
    _SERVER_UNBUFFERED = bool(os.environ.get("PYTHONUNBUFFERED"))
    _SERVER_PYTHONPATH = os.environ.get("PYTHONPATH")
    before = dict(os.environ)
    read = _import_recording_environment(modules)
    # What the imports saw decides. torch_xla sets variables of its own while it imports (a
    # program that imports it gets them, so each child gets them again on top of its own), and
    # a child of such a program starts with them set: torch_xla's settings are idempotent
    # (setdefault, flags added when missing), so those values are the same start.
    changes = {k: os.environ.get(k) for k in before.keys() | os.environ.keys() if before.get(k) != os.environ.get(k)}
    signature = {k: {v} | ({changes[k]} if k in changes else set()) for k, v in _signature(before, read).items()}
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(128)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(wake_r, selectors.EVENT_READ, "children")
    children: dict[int, socket.socket] = {}     # pid -> the connection of its client
    print("ready", flush=True)
    while True:
        for key, _ in selector.select():
            if key.data == "accept":
                conn, _ = listener.accept()
                try:
                    request, fds = _recv_request(conn)
                except (OSError, ValueError):
                    conn.close()
                    continue
                refusal = _refusal(request, signature)
                # server.log: one line per run, so that a suite that starts cold shows why.
                print(f"cold ({refusal}): {request['args'][:3]}" if refusal else f"warm: {request['args'][:3]}",
                      file=sys.stderr, flush=True)
                if refusal:
                    conn.sendall(json.dumps({"cold": refusal}).encode() + b"\n")
                    conn.close()
                    for fd in fds:
                        os.close(fd)
                    continue
                pid = os.fork()
                if pid == 0:
                    try:
                        selector.close()
                        for fd in (listener.fileno(), wake_r, wake_w, *(c.fileno() for c in children.values())):
                            os.close(fd)
                        conn.close()
                        become(request, fds, client, changes)
                    except BaseException:  # noqa: BLE001 (the run failed before the program started: say why)
                        import traceback
                        traceback.print_exc()
                    finally:
                        os._exit(70)
                for fd in fds:
                    os.close(fd)
                children[pid] = conn
                selector.register(conn, selectors.EVENT_READ, pid)
                try:
                    conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
                except OSError:  # the client is gone already: so is its program
                    _kill_session(pid)
            elif key.data == "children":
                try:
                    while os.read(wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
                while True:
                    # A run ends with its program: what it left in its session is killed, as the
                    # harness kills what a cold run leaves in its own; before the child is reaped,
                    # while its number is still its session's (see tests/process_groups.py).
                    try:
                        exited = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                    except ChildProcessError:
                        break
                    if exited is None:
                        break
                    if exited.si_pid in children:
                        _kill_session(exited.si_pid)
                    pid, status = os.waitpid(exited.si_pid, 0)
                    conn = children.pop(pid, None)
                    if conn is not None:
                        try:
                            selector.unregister(conn)
                        except (KeyError, ValueError):
                            pass
                        try:
                            conn.sendall(json.dumps({"status": status}).encode() + b"\n")
                        except OSError:
                            pass
                        conn.close()
            else:  # a client closed its end: it was killed, so its program goes too
                if key.data not in children:  # reaped in this same round: its number is free
                    continue
                try:
                    closed = not key.fileobj.recv(1)
                except OSError:
                    closed = True
                if closed:
                    selector.unregister(key.fileobj)
                    _kill_session(key.data)


def _kill_session(pid: int) -> None:
    """Kill the child `pid` and its session (the child itself too, should it not have made the
    session yet)."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


# --- the child: becoming `python ARGS` -------------------------------------------------------------

def _parse_args(args: list[str]) -> tuple[dict, str, str, list[str]]:
    """(options, kind, target, argv) for `python ARGS`: kind is script, module or code. ValueError
    for what the child cannot reproduce."""
    options = {"unbuffered": False, "no_bytecode": False}
    index = 0
    while index < len(args):
        arg = args[index]
        if arg == "-u":
            options["unbuffered"] = True
        elif arg == "-B":
            options["no_bytecode"] = True
        elif arg in ("-c", "-m"):
            if index + 1 >= len(args):
                raise ValueError(f"{arg} without an argument")
            kind = "code" if arg == "-c" else "module"
            return options, kind, args[index + 1], [arg, *args[index + 2:]]
        elif arg.startswith("-") and arg != "-":
            raise ValueError(f"interpreter option {arg}")
        else:
            if arg == "-":
                raise ValueError("a program on standard input")
            return options, "script", arg, args[index:]
        index += 1
    raise ValueError("an interactive interpreter")


def _reset_signals(ignored: list[int]) -> None:
    signal.set_wakeup_fd(-1)
    for signum in signal.valid_signals():
        if signum in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            signal.signal(signum, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
    # What python itself sets at start: Ctrl-C raises KeyboardInterrupt (unless ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in (signal.SIGPIPE, signal.SIGXFSZ, *ignored):
        signal.signal(signum, signal.SIG_IGN)


def _place_fds(received: list[int], numbers: list[int]) -> None:
    """Give each received descriptor its number in the client; close every other."""
    # Copies above every number they will take: a plain dup takes the lowest free number, which
    # can be one of those (the fork leaves gaps), and placing an earlier one there would
    # overwrite a copy not yet placed.
    floor = max(numbers, default=2) + 1
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor) for fd in received]
    for fd in received:
        os.close(fd)
    for fd, number in zip(high, numbers):
        os.dup2(fd, number, inheritable=True)
    keep = set(numbers)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def _std_streams(unbuffered: bool) -> None:
    """sys.stdin/stdout/stderr for descriptors 0-2, now the client's: the server's own objects,
    which are of the run's kind (_refusal serves only runs buffered as the server is), made
    line-buffered where python would make them so. Modules hold them since their import
    (torch_xla's `def master_print(..., fd=sys.stdout)`, a logging handler): another object
    beside them would leave their output in their buffers."""
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        try:
            os.fstat(fd)
        except OSError:  # closed in the client: python has None there too
            stream = None
        else:
            stream = getattr(sys, f"__{name}__")
            stream.reconfigure(line_buffering=not unbuffered and (os.isatty(fd) or name == "stderr"))
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _base_path() -> list[str]:
    """sys.path without its first entry and the server's PYTHONPATH: what site made of it."""
    own = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return [p for p in sys.path[1:] if p not in own]


def become(request: dict, fds: list[int], client: str, changes: dict[str, str | None]) -> None:
    """Turn this forked server into `python ARGS` for the request; never returns. `changes`:
    what importing the preloaded modules did to the environment, done again here."""
    options, kind, target, argv = _parse_args(request["args"])
    os.setsid()
    _reset_signals(request["ignored"])
    # The client's mask, not the server's: python keeps the mask it was executed with.
    signal.pthread_sigmask(signal.SIG_SETMASK, request.get("blocked", []))
    _place_fds(fds, request["fds"])
    base_path = _base_path()
    os.chdir(request["cwd"])
    env = dict(request["env"])
    if env.get("PYTHON_EXEC") == client and not (kind == "module" and target == "torch.distributed.run"):
        del env["PYTHON_EXEC"]  # only torchrun's agent needs it (for its workers)
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    os.environ.clear()
    os.environ.update(env)
    _std_streams(options["unbuffered"] or bool(env.get("PYTHONUNBUFFERED")))
    sys.dont_write_bytecode = options["no_bytecode"] or bool(env.get("PYTHONDONTWRITEBYTECODE"))
    sys.argv = argv
    sys.orig_argv = [sys.executable, *request["args"]]
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if kind == "script":
        first = os.path.dirname(os.path.realpath(target))
    elif kind == "module":
        first = os.getcwd()
    else:
        first = ""
    # PYTHONSAFEPATH (python -P): neither the script's folder nor the working directory goes first.
    sys.path[:] = [*([] if env.get("PYTHONSAFEPATH") else [first]), *extra, *base_path]
    importlib.invalidate_caches()
    tempfile.tempdir = None  # TMPDIR is the run's
    _fresh_process_state(client)
    # site imports the first sitecustomize on the path: one on the run's PYTHONPATH runs now.
    for entry in extra:
        if os.path.isfile(os.path.join(entry, "sitecustomize.py")):
            sys.modules.pop("sitecustomize", None)
            importlib.import_module("sitecustomize")
            break
    _RUN_STREAMS.update(stdout=sys.stdout, stderr=sys.stderr)
    _run_main(kind, target)


def _fresh_process_state(client: str) -> None:
    """What a new process would not share with its siblings: random seeds, the authkey."""
    import multiprocessing
    import multiprocessing.process

    multiprocessing.process.current_process().authkey = os.urandom(32)
    multiprocessing.set_executable(client)  # spawn's children are warm too
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    _own_import_time_tempdir()


def _own_import_time_tempdir() -> None:
    """torch.distributed.nn.jit.instantiator (which `import torch_xla` imports) makes a
    temporary directory at import, appends it to sys.path and deletes it at exit: each process
    gets its own under its TMPDIR, and never deletes the server's."""
    import atexit

    module = sys.modules.get("torch.distributed.nn.jit.instantiator")
    old = getattr(module, "_TEMP_DIR", None)
    if not isinstance(old, tempfile.TemporaryDirectory):
        return
    atexit.unregister(old.cleanup)
    old._finalizer.detach()
    new = tempfile.TemporaryDirectory()
    module._TEMP_DIR = new
    module.INSTANTIATED_TEMPLATE_DIR_PATH = new.name
    atexit.register(new.cleanup)
    sys.path[:] = [new.name if entry == old.name else entry for entry in sys.path]


def _run_main(kind: str, target: str) -> None:
    import atexit
    import builtins
    import runpy
    import types

    interrupted = False
    try:
        if kind == "module":
            runpy._run_module_as_main(target, alter_argv=True)
        else:
            main = types.ModuleType("__main__")
            main.__builtins__ = builtins
            sys.modules["__main__"] = main
            if kind == "script":
                path = os.path.abspath(target)
                with open(path, "rb") as source:
                    code = compile(source.read(), path, "exec", dont_inherit=True)
                from importlib.machinery import SourceFileLoader
                main.__file__ = path
                main.__cached__ = None
                main.__loader__ = SourceFileLoader("__main__", path)
            else:
                code = compile(target, "<string>", "exec", dont_inherit=True)
                from importlib.machinery import BuiltinImporter
                main.__loader__ = BuiltinImporter
            main.__spec__ = None
            main.__package__ = None
            exec(code, main.__dict__)
        status = 0
    except SystemExit as exit:
        status = _system_exit_status(exit)
    except BaseException as error:  # noqa: BLE001 (python's own top level)
        interrupted = isinstance(error, KeyboardInterrupt)
        # The traceback starts below this frame, as python's starts at the program's.
        error.__traceback__ = error.__traceback__.tb_next
        sys.excepthook(type(error), error, error.__traceback__)
        status = 1
    # Py_FinalizeEx: wait for the threads, run atexit, flush.
    try:
        threading._shutdown()
    except BaseException:  # noqa: BLE001
        pass
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None and not stream.closed:  # Python skips a closed stream
                stream.flush()
        except (OSError, ValueError):
            status = 120  # whatever the status was, and for either stream, as Python gives
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(status)


def _system_exit_status(exit: SystemExit) -> int:
    code = exit.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        print(code, file=sys.stderr)
    except Exception:  # noqa: BLE001
        pass
    return 1


# --- starting and stopping a server ---------------------------------------------------------------

class WarmPython:
    """One server and its client executable, in `directory`."""

    def __init__(self, directory: Path, modules: list[str], env: dict[str, str], keep_path: bool = False,
                 interpreter: str = sys.executable):
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.socket = str(directory / "server.sock")
        if len(self.socket) > 100:  # AF_UNIX paths end at 108 bytes
            self.socket = os.path.join(tempfile.mkdtemp(prefix="warm-", dir="/tmp"), "server.sock")
        self.client = str(directory / "python")
        source = (HERE / "warm_client.py").read_text()
        Path(self.client).write_text(f"#!{sys.executable} -S\n{source}\nmain({self.socket!r}, {interpreter!r})\n")
        os.chmod(self.client, 0o755)
        self.log = open(directory / "server.log", "w")
        # The run's environment less what is the run's own (TMPDIR: the first run's would be gone
        # before the server is). keep_path: the modules come from the run's PYTHONPATH, and the
        # server then serves only runs with that PYTHONPATH (_refusal).
        kept = {"PYTHONPATH": env["PYTHONPATH"]} if keep_path and env.get("PYTHONPATH") else {}
        env = {**{k: v for k, v in env.items() if not per_run(k)}, **kept, "TMPDIR": str(directory)}
        self.process = subprocess.Popen(
            [interpreter, __file__, self.socket, self.client, *modules], env=env, cwd=directory,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self.log, start_new_session=True, text=True)
        if self.process.stdout.readline().strip() != "ready":
            self.process.wait()
            raise RuntimeError(f"the warm python server did not start: {(directory / 'server.log').read_text()}")

    def close(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)  # the server and any child still running
        self.process.wait()
        self.process.stdout.close()
        self.log.close()


MAX_SERVERS = 8  # per process: a run whose start-time environment is a ninth kind starts cold (at 6, 32
#   diagnose runs of a seventh kind started cold in one full run: about 4 s of CPU each; a server
#   holds 0.3-0.9 GB)
_SERVERS: dict[tuple, WarmPython | None] = {}
_SERVERS_LOCK = threading.Lock()
_ROOT: Path | None = None


def configure(directory: Path) -> None:
    """Where this process's servers live (the test session's temporary directory)."""
    global _ROOT
    _ROOT = directory


def python_for(env: dict[str, str], modules: tuple[str, ...], keep_path: bool = False,
               interpreter: str = sys.executable) -> str:
    """The interpreter to run a program under `env` with: a warm client when a server for
    `modules` and `env` can be started, else the real one (`interpreter`: this one, or another
    environment's, the TorchTPU stand-in's). keep_path: `modules` are imported through env's
    PYTHONPATH (the tool's own, from the checkout under test; the stand-in's site)."""
    if cold_python() or _ROOT is None:
        return interpreter
    path = env.get("PYTHONPATH") if keep_path else None
    key = (interpreter, modules, path, tuple(sorted(_signature(env, set()).items())))
    with _SERVERS_LOCK:
        if key not in _SERVERS and len(_SERVERS) < MAX_SERVERS:
            try:
                _SERVERS[key] = WarmPython(_ROOT / f"warm-{os.getpid()}-{len(_SERVERS)}", list(modules), env,
                                           keep_path, interpreter)
            except (OSError, RuntimeError) as error:  # only slower: say so, and run cold
                import warnings
                warnings.warn(f"no warm python, the programs start cold: {error}")
                _SERVERS[key] = None
        if key not in _SERVERS:
            # Past MAX_SERVERS: say which runs start cold for it (the servers' logs cannot).
            _ROOT.mkdir(parents=True, exist_ok=True)
            with open(_ROOT / f"cold-past-max-servers-{os.getpid()}.log", "a") as log:
                log.write(f"{interpreter} {modules[-1]} PYTHONPATH={path} {dict(key[3])}\n")
        server = _SERVERS.get(key)
        return server.client if server else interpreter


def close_all() -> None:
    with _SERVERS_LOCK:
        for server in _SERVERS.values():
            if server:
                server.close()
        _SERVERS.clear()


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[3:], sys.argv[2])
