"""The launcher conversion (TPU060) on an emulated 2-host TPU pod, and the launched function left
as it was (issue 25).

On a pod every host runs the program; xmp.spawn started one process per chip on each and called
`fn(global ordinal, *args)`: the processes of all hosts were one world. The migrated program
must do the same under TorchTPU's launch environment (the `--target tpu` migration runs on the
TorchTPU stand-in, each host told which it is as a TPU VM is: TPU_WORKER_HOSTNAMES and
JOB_COMPLETION_INDEX) and, for the portable migration, under `torchrun --nnodes 2` (tests/pod.py's
shim stands in for the backend there). Each original runs once at world size 1 on XLA:CPU; its records do not
depend on the world size, so the 4 processes of the pod must print them exactly once, with
the same numbers, and report one world (ranks 0-3 of 4, one master, host k holding ranks 2k and
2k + 1, each worker given its global rank as its index).

All runs start at once in one module-scoped pool (they are independent; the two hosts of a pod
run concurrently by construction).
"""

from __future__ import annotations

import ast
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

import differential as harness
import pod
from fixture_spec import FIXTURES, TARGETS, expected_path, output, rewrite

pytestmark = pytest.mark.slow  # torch_xla originals and 4-process pods

DIRECT = pod.POD_PROGRAMS / "d01_worker_called_directly.py"
VARARGS = harness.MP_PROGRAMS / "m10_varargs_worker_in_variable.py"
# m10: xmp.spawn of a `def main(*args)` worker passed through a variable, with collectives inside
# expressions, started on every device (one process per chip), handed a scratch directory made
# before the launch (under torchrun, each host's first process makes it for the host). d01 (the same launch, plainer)
# runs on the pod only broken, below: each pod costs 6 processes that import torch, and the
# module must stay short on two cores.
TPU_POD = [VARARGS]           # the migrated xmp.spawn on both hosts (--target tpu)
TORCHRUN_POD = [VARARGS]      # --target portable under torchrun --nnodes 2
# The deliberate bug: each worker's RANK is its index on its host (what the conversion did
# before issue 25), so the two hosts hold ranks 0 and 1 twice.
GLOBAL_RANK = 'str(int({os}.environ.get("NODE_RANK", 0)) * nprocs + local_index)'
LOCAL_RANK_ONLY = "str(local_index)"


class PodRuns:
    """Every run of the module, started at once; futures by name."""

    def __init__(self, workdir: Path):
        self.started = time.monotonic()
        self.workdir = workdir
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="pod")
        self.futures: dict[str, Future] = {}
        self.seconds: dict[str, float] = {}  # wall time of each finished run
        # The originals take longest (torch_xla): they start before anything is migrated.
        for program in sorted({*TPU_POD, *TORCHRUN_POD, DIRECT}):
            self._submit(f"original {program.name}", harness.run_original_mp, program)
        self.mutated = self.pool.submit(pod.migrate_with_worker_variant, DIRECT, workdir / "mutated",
                                        GLOBAL_RANK, LOCAL_RANK_ONLY)
        self.tpu = harness.migrate_many(sorted(set(TPU_POD)), workdir / "tpu", target="tpu")
        self.portable = harness.migrate_many(sorted({*TORCHRUN_POD, DIRECT}), workdir / "portable")
        for program in TPU_POD:
            self._submit(f"tpu {program.name}", pod.run_python_pod, self.tpu[program.name], self._dir("tpu", program),
                         standin=True)
        for program in TORCHRUN_POD:
            self._submit(f"torchrun {program.name}", pod.run_torchrun_pod, self.portable[program.name],
                         self._dir("torchrun", program))
        direct_dir = self._dir("direct", DIRECT)
        self._submit("direct", harness.run_bounded, self.portable[DIRECT.name],
                     harness._mp_env({"PYTHONPATH": str(harness.blocker_dir(direct_dir))}), ["--direct"])
        # The broken conversion fails its rendezvous (two rank 0s): the host whose rank 0 cannot
        # open the master's port fails at once and stops the other, which would wait out its
        # rendezvous (20 s; the bound should the stop come too late).
        self._submit("mutated", lambda: pod.run_python_pod(self.mutated.result(), self._dir("mutated", DIRECT),
                                                           timeout=90, init_timeout=20, standin=True,
                                                           stop_on_failure=True))

    def _dir(self, kind: str, program: Path) -> Path:
        path = self.workdir / "runs" / f"{kind}-{program.stem}"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _submit(self, name: str, fn, *args, **kwargs) -> None:
        def timed():
            start = time.monotonic()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] = time.monotonic() - start

        self.futures[name] = self.pool.submit(timed)

    def get(self, name: str):
        return self.futures[name].result()

    def original(self, program: Path) -> harness.Run:
        return self.get(f"original {program.name}")

    def close(self) -> None:
        for future in self.futures.values():
            future.cancel()
        harness.kill_running_runs()
        self.pool.shutdown(wait=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    runs = PodRuns(tmp_path_factory.mktemp("pod"))
    yield runs
    runs.close()
    times = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in runs.seconds.items())
    print(f"\n[pod] every run of the module: {time.monotonic() - runs.started:.1f} s wall ({times})")


def _check(program: Path, original: harness.Run, result: pod.Pod) -> None:
    merged = result.merged()
    problems = result.one_world_problems()
    comparison = harness.compare_exactly_once(program.name, original, merged)
    problems += comparison.problems
    assert not problems, "\n".join(problems) + "\n" + merged.output[-4000:]


@pytest.mark.parametrize("program", TPU_POD, ids=[p.stem for p in TPU_POD])
def test_the_tpu_launcher_makes_one_world_of_every_host(runs, program):
    """`python prog.py` on both hosts: 2 processes each, one world of 4, the original's records
    printed once (by global rank 0 on host 0)."""
    result = runs.get(f"tpu {program.name}")
    _check(program, runs.original(program), result)
    assert len(result.pod_lines()) == 4


@pytest.mark.parametrize("program", TORCHRUN_POD, ids=[p.stem for p in TORCHRUN_POD])
def test_the_portable_program_under_torchrun_on_two_nodes(runs, program):
    """`torchrun --nnodes 2 --nproc_per_node 2 --node_rank K`: the launcher's RANK, WORLD_SIZE
    and LOCAL_RANK are kept, and the worker gets the global rank (not LOCAL_RANK) as its index."""
    result = runs.get(f"torchrun {program.name}")
    _check(program, runs.original(program), result)
    assert len(result.pod_lines()) == 4


def test_a_worker_rank_from_the_local_index_is_caught(runs):
    """The launch wrapper's RANK taken as the process's index on its host: on one host nothing
    changes, on the pod both hosts hold ranks 0 and 1. The pod test must fail."""
    copy = runs.mutated.result()
    text = copy.read_text()
    assert 'os.environ["RANK"] = str(local_index)' in text and "NODE_RANK" not in text, text
    result = runs.get("mutated")
    problems = result.one_world_problems()
    comparison = harness.compare_exactly_once(DIRECT.name, runs.original(DIRECT), result.merged())
    assert problems and not comparison.ok
    assert any(r.returncode != 0 for r in result.runs)
    assert any(p.startswith("ranks ") for p in problems), problems


def test_the_worker_called_directly_still_runs(runs):
    """d01 with --direct calls its worker itself (world size 1, no launcher, no group): the
    migrated worker's body has no launcher code left in it, so it prints what the original
    (xmp.spawn at world size 1) printed."""
    direct = runs.get("direct")
    comparison = harness.compare_exactly_once(DIRECT.name, runs.original(DIRECT), direct)
    assert comparison.ok, "\n".join(comparison.problems)
    assert '@proc {"index": 0, "rank": 0, "world": 1}' in direct.output


def _function_text(source: str, name: str) -> str:
    tree = ast.parse(source)
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    return ast.get_source_segment(source, node, padded=True)


@pytest.mark.parametrize("target", TARGETS)
def test_the_launched_function_is_byte_identical(target):
    """TPU060's fixture whose worker is also started by torch.multiprocessing.spawn and called
    directly: the launch conversion adds a wrapper and leaves `main` as it was, byte for byte."""
    case = FIXTURES / "TPU060-spawn" / "other_callers.in.py"
    data = case.read_bytes()
    for new in (output(rewrite(data, target), data), expected_path(case, target).read_bytes()):
        assert _function_text(new.decode(), "main") == _function_text(data.decode(), "main")
        assert "_xmp_worker" in new.decode() and "mp.spawn(main, args=(cfg,)" in new.decode()
