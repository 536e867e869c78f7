"""Shared helpers: the fixture corpus and running the real CLI in a subprocess."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
from pathlib import Path

import pytest

import fixture_spec
import process_groups
import shared_runs
import warm_python

ROOT = Path(__file__).resolve().parent.parent

# torch.compile's inductor on the CPU (the migrated compiled programs, native diagnose runs):
# compile each program's kernels in its own process instead of starting a pool of compile
# workers for it, and take the compiler's word for the CPU's vector instructions instead of
# building and loading a probe per instruction set in fresh Python processes (both only speed:
# the same kernels run). Set here, so every program the suite starts inherits them.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")
# The TorchTPU stand-in's Python (torch 2.13), made by README's test command beside .venv: the
# tool finds it through this variable (tpu_migrate/standin), as a user's environment would.
STANDIN_PYTHON = ROOT / ".venv-tpu" / "bin" / "python"
os.environ.setdefault("TPU_MIGRATE_STANDIN_PYTHON", str(STANDIN_PYTHON))

# Modules whose tests share one module-scoped run, and the run: under pytest-xdist
# (`--dist loadgroup`, pyproject.toml) all their tests go to one worker (tests/scheduling.py),
# so it is made once. Runs shared across modules go through tests/shared_runs.py instead.
ONE_WORKER_MODULES = {
    "test_multiprocess_differential": "one pool of every selected original and torchrun world",
    "test_pod": "one pool of the emulated pod's hosts and torchrun nodes",
    "test_crash_safety": "the 520-file tree and its rewritten copy",
    "test_pre_commit": "pre-commit's hook environments",
    "test_migration_report": "one rewrite --check --html run",
    "test_warm_python": "one warm python server of each flavour",
    "test_fsdp_wrap_walk": "one torch_xla process comparing every wrap policy",
    "test_verify": "the original's runs that every mutation is compared with",
}
# Modules whose tests go to the worker of a module of ONE_WORKER_MODULES: {module: that module}.
# test_verify_runs' programs start from the warm python servers of test_verify's runs: on another
# worker each of its kinds would be a server more there (MAX_SERVERS, tests/warm_python.py).
SAME_WORKER_MODULES = {"test_verify_runs": "test_verify"}
# Tests of other modules that must share a worker: {node id: group}. The migrated decoder
# scripts that torch.compile the same model run one after the other on one worker: the second
# then finds the first's kernels in the session's inductor cache (the eager_with_compile run:
# 51 s cold, 10 s after the base script; _inductor_cache below).
ONE_WORKER_TESTS = {
    f"tests/test_real_runs.py::test_real_script_keeps_its_status[{script}]": "compiled decoder"
    for script in ("train_decoder_only_base.py", "train_decoder_only_eager_with_compile.py")
}
# The rewrite fixture corpus (defined in fixture_spec, which regenerate.py shares).
FIXTURES = fixture_spec.FIXTURES
rewrite_cases = fixture_spec.rewrite_cases
expected_path = fixture_spec.expected_path


# What a warm python (tests/warm_python.py) imports for the CLI runs: the tool's modules that
# every command loads, from this checkout (PYTHONPATH). A run costs a fork instead of ~0.6 s of
# imports; a run the server cannot reproduce starts cold.
TOOL_MODULES = ("tpu_migrate.cli", "tpu_migrate.rewrite.engine", "tpu_migrate.report.render",
                "tpu_migrate.report.ci_formats", "tpu_migrate.diagnose.command")


def run_cli(*args: str, cwd: Path | None = None, input: bytes | None = None) -> subprocess.CompletedProcess:
    """`python -m tpu_migrate ARGS` as a user would run it (not a TTY: plain output)."""
    env = cli_env()
    return subprocess.run(
        [tool_python(env), "-m", "tpu_migrate", *args],
        cwd=cwd, input=input, capture_output=True, env=env, timeout=300,
    )


def cli_env() -> dict[str, str]:
    """run_cli's environment: this checkout's tool, a wide terminal."""
    return {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}


def tool_python(env: dict[str, str]) -> str:
    """The interpreter for a CLI run under `env` (whose PYTHONPATH names this checkout)."""
    return warm_python.python_for(env, TOOL_MODULES, keep_path=True)


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture(scope="session", autouse=True)
def _result_cache_dir(tmp_path_factory):
    """The rewrite result cache of every CLI run of the suite (module-scoped fixtures included)
    lives in a temporary directory: nothing is written to ~/.cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TPU_MIGRATE_CACHE_DIR", str(tmp_path_factory.mktemp("tpu-migrate-cache")))
        yield


@pytest.fixture(scope="session", autouse=True)
def _shared_runs(tmp_path_factory):
    """Expensive runs (torch_xla originals, torchrun worlds, diagnose runs) are made once per
    test session and shared by the xdist workers: see tests/shared_runs.py."""
    shared_runs.configure(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="session", autouse=True)
def _inductor_cache(_shared_runs):
    """One torch.compile (inductor) cache for every process of the session. Each harness run has
    a TMPDIR of its own, where inductor would otherwise compile every kernel from nothing, and
    the same model compiles in several runs (the two decoder scripts of the real runs: 80 s cold,
    25 s warm). Per session, as on CI's fresh machine: never the ~/.cache or /tmp one another
    session filled. A cached kernel is the same code."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCHINDUCTOR_CACHE_DIR", str(shared_runs.session_directory("torchinductor")))
        yield


@pytest.fixture(scope="session", autouse=True)
def _warm_python(tmp_path_factory, _inductor_cache):
    """The programs the harness runs (tests/differential.py) start from a warm python with torch
    imported, one server per xdist worker: see tests/warm_python.py."""
    warm_python.configure(tmp_path_factory.getbasetemp() / "warm-python")
    yield
    warm_python.close_all()


@pytest.fixture
def reap():
    """`reap(process)` for a Popen started with start_new_session=True: when the test ends, pass
    or fail, its whole process group gets SIGKILL. A failed test must not leave its program
    running: one such endless loop, under diagnose, once wrote events until the disk was full."""
    processes: list[subprocess.Popen] = []
    yield processes.append
    for process in processes:
        process_groups.kill_group(process)  # not a stranger's, should the test have reaped it
        process.wait(timeout=60)


def default_sigint() -> None:
    """Start with Ctrl-C's default action, as from a terminal: a test run started in the
    background by a non-interactive shell inherits SIGINT ignored, and so would the program."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def undefined_names(source: bytes) -> set[str]:
    """The names pyflakes reports as undefined in `source`; in-process (the same findings as
    `python -m pyflakes`, and a subprocess per file cost the fixture and realistic tests ~90 s)."""
    import pyflakes.checker
    import pyflakes.messages

    found = pyflakes.checker.Checker(ast.parse(source)).messages
    return {m.message_args[0] for m in found if isinstance(m, pyflakes.messages.UndefinedName)}


# The fast lane (`pytest -m "not slow"`, README: Quick start) stays fast: with TPU_MIGRATE_FAST_LIMIT=S
# set, a test not marked slow fails when its call takes over S seconds. (Set-up is not counted:
# a module-scoped fixture's one run is shared by its tests.)
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    limit = os.environ.get("TPU_MIGRATE_FAST_LIMIT")
    if limit and report.when == "call" and report.passed and item.get_closest_marker("slow") is None \
            and report.duration > float(limit):
        report.outcome = "failed"
        report.longrepr = (f"call took {report.duration:.1f} s, over TPU_MIGRATE_FAST_LIMIT={limit}: "
                           "make it faster or mark it @pytest.mark.slow")


def pytest_collection_modifyitems(config, items):
    """Schedule for two workers: the slow tests before the fast ones, so that the long runs
    start at once on both workers and the many short tests fill the end (pyproject.toml turns
    xdist's own reordering off); the modules of ONE_WORKER_MODULES first of all, each one unit
    (pytest_xdist_make_scheduler)."""
    front = {*ONE_WORKER_MODULES, *SAME_WORKER_MODULES}
    items.sort(key=lambda item: (item.module.__name__ not in front,
                                 item.get_closest_marker("slow") is None))


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup` with ONE_WORKER_MODULES (SAME_WORKER_MODULES joining theirs) and
    ONE_WORKER_TESTS as the groups (see tests/scheduling.py for why not xdist's own xdist_group
    marks)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    import scheduling

    return scheduling.Groups(config, log, {**{module: module for module in ONE_WORKER_MODULES}, **SAME_WORKER_MODULES},
                             ONE_WORKER_TESTS)
