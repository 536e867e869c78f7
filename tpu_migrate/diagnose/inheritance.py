"""Which processes of the program get the tracer's environment.

A Python process of the diagnosed program is traced because its environment names the run
(`TPU_MIGRATE_DIAGNOSE*`) and puts the tool's sitecustomize first on PYTHONPATH. The program must
not see either (README: "as python would"): a program that prints its environment, or starts
`env`, `git` or a compiler, sees what it would see under python. So each traced process takes
the tracer's variables out of `os.environ` as it starts (`take`), and gives them back only to
the children that need them (`wants_tracer`): a Python interpreter, a script run by one, and a
shell or launcher that may start one (`sh -c "python w.py"`, `timeout 60 python w.py`; the
shell itself then sees them, as the one exception). Every way Python starts a program passes
through here: `_posixsubprocess.fork_exec` (subprocess, multiprocessing), `os.posix_spawn[p]`,
`os.execv[e]` (the exec and spawn families) and `os.system`.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
from collections.abc import Callable, Mapping

# A Python interpreter by its file name: python, python3, python3.11, pypy3, python3.11-dbg.
_PYTHON = re.compile(r"(python|pypy)[0-9.]*(-[a-z]+)?")
# Programs that run a command line that may start Python: they get the variables too.
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "fish", "busybox"})
LAUNCHERS = frozenset({"nohup", "timeout", "nice", "ionice", "stdbuf", "setsid", "taskset", "numactl",
                       "time", "xargs", "chrt", "prlimit", "unbuffer", "srun", "mpirun", "mpiexec"})

_carried: dict[str, str] = {}  # the tracer's variables, as this process received them
_site = ""  # the tool's sitecustomize directory, first on the carried PYTHONPATH
_taken = False  # take() ran in this process (or in the one it was forked from)
_lock = threading.Lock()  # os.system's brief window (see _traced_system)


def take(names: tuple[str, ...], run_directory: str) -> None:
    """Take the tracer's variables (`names`, and the tool's directory on PYTHONPATH) out of
    this process's environment, keeping them for the children that need them."""
    global _site, _taken
    if _taken:
        return
    _taken = True
    site = os.path.join(run_directory, "site")
    for name in names:
        if name in os.environ:
            _carried[name] = os.environ.pop(name)
    path = os.environ.get("PYTHONPATH", "")
    if path == site or path.startswith(site + os.pathsep):
        _site = site
        rest = path[len(site) + 1:]
        if rest:
            os.environ["PYTHONPATH"] = rest
        else:
            del os.environ["PYTHONPATH"]
    _patch()


def setting(name: str, default: str) -> str:
    """A tracer variable this process received (they are no longer in os.environ)."""
    return _carried.get(name, default)


def with_tracer(env: Mapping[str, str]) -> dict[str, str]:
    """`env` (a child's environment, as the program made it) with the tracer's variables."""
    child = {**env, **_carried}
    if _site:
        rest = env.get("PYTHONPATH")
        child["PYTHONPATH"] = _site + os.pathsep + rest if rest else _site
    return child


def wants_tracer(path: str | bytes, argv=()) -> bool:
    """Whether the program at `path`, run with `argv`, is or may start a Python process."""
    path = os.fsdecode(path)
    real = os.path.realpath(path)
    name = os.path.basename(real)
    if _PYTHON.fullmatch(name) or name in SHELLS or name in LAUNCHERS:
        return True
    if name == "env":  # `env [-i] [NAME=VALUE]... COMMAND`: the command decides; bare `env` prints
        rest = [os.fsdecode(a) for a in list(argv)[1:]]
        command = next((a for a in rest if not a.startswith("-") and "=" not in a), None)
        found = command and (command if os.path.dirname(command) else shutil.which(command))
        return bool(found) and wants_tracer(found, rest[rest.index(command):])
    return _interpreter_line_wants_tracer(real)


def _interpreter_line_wants_tracer(path: str) -> bool:
    """A script whose `#!` line names Python or a shell (torchrun's console script, launch.sh)."""
    try:
        with open(path, "rb") as handle:
            first = handle.readline(256)
    except OSError:
        return False
    if not first.startswith(b"#!"):
        return False
    words = first[2:].split()
    if not words:
        return False
    interpreter = os.path.basename(os.fsdecode(words[0]))
    if interpreter == "env":  # `#!/usr/bin/env [-S] python3 [-u]`
        interpreter = next((os.fsdecode(w) for w in words[1:] if not w.startswith(b"-") and b"=" not in w), "")
    return bool(_PYTHON.fullmatch(interpreter)) or interpreter in SHELLS


def _first_found(candidates) -> bytes | str | None:
    """The program a PATH search over `candidates` would run."""
    for candidate in candidates:
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            return candidate
    return None


def _patch() -> None:
    import _posixsubprocess

    fork_exec = _posixsubprocess.fork_exec

    def traced_fork_exec(args, executable_list, close_fds, pass_fds, cwd, env, *rest):
        found = _first_found(executable_list)
        if found is not None and wants_tracer(found, args):
            base = os.environ if env is None else _env_from_list(env)
            env = [os.fsencode(k) + b"=" + os.fsencode(v) for k, v in with_tracer(base).items()]
        return fork_exec(args, executable_list, close_fds, pass_fds, cwd, env, *rest)

    _posixsubprocess.fork_exec = traced_fork_exec
    execv, execve = os.execv, os.execve

    def traced_execv(path, argv):
        if wants_tracer(path, argv):
            return execve(path, argv, with_tracer(os.environ))
        return execv(path, argv)

    def traced_execve(path, argv, env):
        return execve(path, argv, with_tracer(env) if wants_tracer(path, argv) else env)

    os.execv, os.execve = _named(traced_execv, execv), _named(traced_execve, execve)
    for name, search in (("posix_spawn", False), ("posix_spawnp", True)):
        if hasattr(os, name):
            setattr(os, name, _named(_traced_spawn(getattr(os, name), search), getattr(os, name)))
    os.system = _named(_traced_system(os.system), os.system)


def _traced_spawn(spawn: Callable, search: bool) -> Callable:
    def traced_spawn(path, argv, env, *args, **kwargs):
        found = shutil.which(os.fsdecode(path)) if search and not os.path.dirname(path) else path
        if found and wants_tracer(found, argv):
            env = with_tracer(env)
        return spawn(path, argv, env, *args, **kwargs)

    return traced_spawn


def _traced_system(system: Callable) -> Callable:
    def traced_system(command):
        # system() runs /bin/sh with this process's own environment and no way to give it
        # another: the variables are back in it for the length of the call (the program's other
        # threads could see them meanwhile; os.system's signal handling is kept exactly).
        with _lock:
            saved = {name: os.environ.get(name) for name in (*_carried, "PYTHONPATH")}
            os.environ.update(with_tracer(os.environ))
            try:
                return system(command)
            finally:
                for name, value in saved.items():
                    if value is None:
                        os.environ.pop(name, None)
                    else:
                        os.environ[name] = value

    return traced_system


def _env_from_list(entries) -> dict[str, str]:
    env = {}
    for entry in entries:
        name, _, value = os.fsdecode(entry).partition("=")
        env[name] = value
    return env


def _named(wrapper: Callable, original: Callable) -> Callable:
    """The wrapper under the original's name and documentation (help(), tracebacks)."""
    wrapper.__name__, wrapper.__qualname__, wrapper.__doc__ = original.__name__, original.__name__, original.__doc__
    return wrapper
