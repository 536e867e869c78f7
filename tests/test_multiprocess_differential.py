"""Multi-process differential tests: each torch_xla program in fixtures/programs/multiprocess/
covers one launch or rank idiom (xmp.spawn, its arguments evaluated once per host,
torch_xla.launch, a conditional process group,
xm.optimizer_step, xm.save, rank-gated logging, DistributedSampler, rendezvous / mesh_reduce,
a `def main(*args)` worker passed through a variable with collectives inside expressions, a
plain process that creates an xla:// group itself, SyncBatchNorm with a batch sliced by process
index and count, broadcast_master_param of a BatchNorm's buffers, a library-shaped computation
model whose collectives relied on the runtime, torch_xla's FSDP wrapped by explicit nested calls
and by an auto-wrap policy, each with gradient checkpointing, a sharded checkpoint consolidated,
SPMD in FSDP style with the wrapper and with each parameter marked (its labels unmarked), and
ZeRO-1).

The original runs at world size 1 on XLA:CPU (torch_xla runs only one CPU process here; an SPMD
original drives 4 virtual CPU devices from that process); its
records do not depend on the world size (see the programs' docstrings), so the migrated program
(--target portable, torch_xla blocked, gloo on the CPU) must print the same records, each exactly
once and with the same numbers, when it runs

- `python`: plain, one process;
- `torchrun2`: under `torchrun --nproc_per_node 2` (`torchrun4`: 4);
- `pod2x2`: on an emulated 2-host pod (tests/pod.py), `torchrun --nnodes 2 --nproc_per_node 2
  --node_rank K` on each host at once: one world of 4 whose ranks 2 and 3 are another host's,
  where a "master" may be global (rank 0: host 0 prints) or local (LOCAL_RANK 0: each host
  prints, as `xm.is_master_ordinal()` did by default on a pod);
- `nprocs2`: with 2 processes it starts itself, where a flag sets the process count;
- `fake2`: plain `python` on a host that reports 2 accelerators (torch.accelerator.device_count()
  answers 2, see differential.FAKE_ACCELERATORS), where the launcher starts one process per
  device: xmp.spawn without nprocs, torch_xla.launch;
- `tpu-python`, `tpu-torchrun2`, `tpu-pod2x2`: the `--target tpu` migration (what users run) on
  the TorchTPU stand-in, a TPU VM of 2 chips (plain python: the launcher starts a process per
  chip), in the stand-in's Python (torch 2.13).

The runs are independent, so they go through a small thread pool started when the module's
first test needs it (only the runs of the selected tests). TPU_MIGRATE_DIFF_JOBS sets its size.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

import differential as harness
import pod
from conftest import ROOT

pytestmark = pytest.mark.slow  # torch_xla originals and torchrun runs at world size 2


@dataclass(frozen=True)
class Mode:
    name: str
    args: tuple[str, ...] = ()          # added to the case's arguments
    torchrun: int | None = None         # under torchrun with this many processes
    fake_accelerators: int | None = None
    processes: int | None = None        # `@proc` lines expected, for programs that print them
    pod: bool = False                   # under torchrun on each host of an emulated 2-host pod
    standin: bool = False               # the --target tpu migration, on the TorchTPU stand-in


PYTHON = Mode("python")
TORCHRUN2 = Mode("torchrun2", torchrun=2)
TORCHRUN4 = Mode("torchrun4", torchrun=4)
POD = Mode("pod2x2", pod=True)
# The default target's output, as users run it: on the TorchTPU stand-in (a TPU VM of 2 chips).
TPU_PYTHON = Mode("tpu-python", standin=True)
TPU_TORCHRUN2 = Mode("tpu-torchrun2", torchrun=2, standin=True)
TPU_POD = Mode("tpu-pod2x2", pod=True, standin=True)


@dataclass(frozen=True)
class Case:
    program: str
    args: tuple[str, ...] = ()
    extra_modes: tuple[Mode, ...] = ()
    original_devices: int | None = None  # SPMD: the original drives this many virtual devices
    # Which processes print the records: the global master, or each host's local master
    # (`xm.is_master_ordinal()`, whose default is local=True: once per host on a pod).
    printers: str = "global"

    @property
    def id(self) -> str:
        return Path(self.program).stem + "".join("-" + arg.lstrip("-") for arg in self.args)


CASES = [
    # m01 and m10 start a process per device: m01's tpu-python run does, on the stand-in's 2 chips
    # (what a portable host faking 2 accelerators showed before the stand-in).
    Case("m01_spawn_all_devices.py"),
    Case("m02_spawn_nprocs_flag.py", extra_modes=(Mode("nprocs2", args=("--nprocs", "2")),)),
    Case("m03_launch_debug_single_process.py", args=("--num_cores", "1"), extra_modes=(
        # debug_single_process=True: one process, however many devices there are.
        Mode("fake2", fake_accelerators=2, processes=1),
        # --num_cores 8: debug_single_process=False, one process per device.
        Mode("fake2-all-devices", args=("--num_cores", "8"), fake_accelerators=2, processes=2),
    )),
    # m04 and m10 hand the worker a scratch directory made in xmp.spawn's args (`tempfile.mkdtemp()`,
    # and a name bound to it): one per host, as xmp.spawn's parent made it, also under torchrun.
    Case("m04_conditional_process_group.py"),
    Case("m04_conditional_process_group.py", args=("--ddp",)),
    Case("m05_optimizer_step_no_ddp.py"),
    Case("m06_save_rendezvous_reload.py"),
    Case("m07_rank_gated_logging.py"),
    Case("m08_sampler_device_loader.py"),
    Case("m09_rendezvous_mesh_reduce.py"),
    Case("m10_varargs_worker_in_variable.py"),
    Case("m11_plain_process_group.py"),
    Case("m12_sync_batch_norm_process_index.py"),
    Case("m13_broadcast_master_param_buffers.py"),
    Case("m14_library_comp_model.py"),
    # The FSDP programs also at 4 processes: a 1-D mesh of 4 shards each parameter 4 ways.
    Case("m15_xla_fsdp_root.py", extra_modes=(TORCHRUN4,)),
    # With --checkpoint (the wrap policy's modules through torch_xla's example's gradient-
    # checkpointing auto_wrapper_callable): what the plain form runs and more, in one world.
    # Its 4 processes on two hosts: one mesh across them, each host's local master printing.
    Case("m16_xla_fsdp_auto_wrap.py", args=("--checkpoint",), extra_modes=(POD,), printers="local"),
    # SPMD in FSDP style: the original is one process driving 4 devices, the migrated program
    # one process per device, at 1, 2 and 4 (4 on one host, and on two).
    Case("m17_spmd_fsdp_v2_sharded_loader.py", original_devices=4, extra_modes=(TORCHRUN4,)),
    # The batch marked in the loop (xs.mark_sharding of the loop's batch, TPU184), and a model
    # with BatchNorm, whose statistics SPMD took over the global batch.
    Case("m18_spmd_fsdp_v2_marked_batch_norm.py", original_devices=4, extra_modes=(POD,)),
    # SPMD in FSDP style without the wrapper: each parameter marked in a loop (TPU185), and only
    # the inputs marked in the training loop: the unmarked labels are sliced with them (TPU184).
    # At 1 and 2 processes (4 matched by hand; m15-m18 keep the 4-process runs of the FSDP2 helper).
    Case("m20_spmd_marked_parameters.py", original_devices=4),
    # ZeRO-1: torch's optimizer shards the state; the helper's step averages and clips (4 by hand).
    Case("m19_zero_redundancy_optimizer.py"),
]
PROCESS_COUNTS = {"m03_launch_debug_single_process.py": {"python": 1, "torchrun2": 2, "tpu-python": 1,
                                                          "tpu-torchrun2": 2}}
# Programs whose portable migration under torchrun is made redundant by the tpu one on the
# stand-in: the rank, world-size and collective conversions are the same text on both targets,
# and nothing in them picks a backend or a mesh by target (the rest do: a process group made by
# the program itself, a library's backend choice, FSDP2 and SPMD meshes).
SAME_UNDER_TORCHRUN = {"m01_spawn_all_devices.py", "m02_spawn_nprocs_flag.py", "m03_launch_debug_single_process.py",
                       "m05_optimizer_step_no_ddp.py", "m06_save_rendezvous_reload.py", "m07_rank_gated_logging.py",
                       "m08_sampler_device_loader.py", "m09_rendezvous_mesh_reduce.py",
                       "m10_varargs_worker_in_variable.py", "m12_sync_batch_norm_process_index.py",
                       "m13_broadcast_master_param_buffers.py"}
# The tpu migration at one process where that is not a plain run of the program's own code at
# world size 1 (which the portable run and the tpu torchrun run cover between them): the programs
# that start their processes themselves, one per chip of the stand-in, or make a group themselves.
# m10's is run on the emulated pod instead (tests/test_pod.py: the same launch on each of two
# hosts of 2 chips, one world of 4), which holds everything its one-host run would show.
LAUNCHES_ITSELF = {"m01_spawn_all_devices.py", "m02_spawn_nprocs_flag.py", "m03_launch_debug_single_process.py",
                   "m04_conditional_process_group.py", "m11_plain_process_group.py"}
PARAMS = [(case, mode) for case in CASES
          for mode in (PYTHON, *(() if case.program in SAME_UNDER_TORCHRUN else (TORCHRUN2,)),
                       *case.extra_modes,
                       *((TPU_PYTHON,) if case.program in LAUNCHES_ITSELF else ()), TPU_TORCHRUN2,
                       *((TPU_POD,) if POD in case.extra_modes else ()))]


class Runs:
    """Runs the originals and the migrated programs in a thread pool; futures by key."""

    def __init__(self, workdir: Path, jobs: int):
        self.workdir = workdir
        self.pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="differential")
        self.lock = threading.Lock()
        self.futures: dict[tuple, Future] = {}
        self.serial = 0
        # With the library modules the programs import (lib_*.py), migrated in the same run.
        programs = sorted({case.program for case in CASES} | {p.name for p in harness.MP_PROGRAMS.glob("lib_*.py")})
        self.copies = harness.migrate_many([harness.MP_PROGRAMS / p for p in programs], workdir / "migrated")
        self.tpu_copies = harness.migrate_many([harness.MP_PROGRAMS / p for p in programs], workdir / "migrated-tpu",
                                               target="tpu")

    def _submit(self, key: tuple, fn, *args, **kwargs) -> Future:
        with self.lock:
            if key not in self.futures:
                self.futures[key] = self.pool.submit(fn, *args, **kwargs)
            return self.futures[key]

    def original(self, case: Case) -> Future:
        return self._submit(("original", case), harness.run_original_mp, harness.MP_PROGRAMS / case.program,
                            list(case.args), case.original_devices)

    def migrated(self, case: Case, mode: Mode, copy: Path | None = None) -> Future:
        copy = copy or (self.tpu_copies if mode.standin else self.copies)[case.program]
        return self._submit(("migrated", case, mode, copy), self._run_migrated, case, mode, copy)

    def _run_migrated(self, case: Case, mode: Mode, copy: Path) -> harness.Run | pod.Pod:
        with self.lock:
            self.serial += 1
            run_dir = self.workdir / "runs" / f"{self.serial}-{case.id}-{mode.name}"
        run_dir.mkdir(parents=True)
        if mode.pod:
            return pod.run_torchrun_pod(copy, run_dir, [*case.args, *mode.args], standin=mode.standin)
        if mode.standin:
            return harness.run_standin_mp(copy, run_dir, [*case.args, *mode.args], torchrun_procs=mode.torchrun)
        launcher = harness.torchrun(mode.torchrun) if mode.torchrun else None
        return harness.run_migrated_mp(copy, run_dir, [*case.args, *mode.args], launcher=launcher,
                                       fake_accelerators=mode.fake_accelerators)

    def close(self):
        """No test needs a run any more: drop the queued ones, kill those still going."""
        for future in self.futures.values():
            future.cancel()
        harness.kill_running_runs()
        self.pool.shutdown(wait=True)


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory):
    jobs = int(os.environ.get("TPU_MIGRATE_DIFF_JOBS", "0")) or min(4, (os.cpu_count() or 2) + 1)
    runs = Runs(tmp_path_factory.mktemp("multiprocess-differential"), jobs)
    # Start every selected run of this module now, originals (the longest) first.
    selected = [item.callspec.params["case_mode"] for item in request.session.items
                if item.module is request.module and hasattr(item, "callspec")
                and "case_mode" in item.callspec.params]
    for case in dict.fromkeys(case for case, _ in selected):
        runs.original(case)
    for case, mode in selected:
        runs.migrated(case, mode)
    yield runs
    runs.close()


@pytest.mark.parametrize("case_mode", PARAMS, ids=[f"{case.id}-{mode.name}" for case, mode in PARAMS])
def test_migrated_program_prints_the_same_records_once(runs, case_mode):
    case, mode = case_mode
    original = runs.original(case).result()
    migrated = runs.migrated(case, mode).result()
    if mode.pod:
        _check_pod(case, original, migrated)
        return
    result = harness.compare_exactly_once(case.program, original, migrated)
    assert result.ok, "\n".join(result.problems)
    expected = mode.processes or PROCESS_COUNTS.get(case.program, {}).get(mode.name)
    if expected is not None:
        assert harness.process_count(migrated) == expected, (
            f"{harness.process_count(migrated)} processes ran the worker, expected {expected}:\n"
            + migrated.output[-2000:])


def _check_pod(case: Case, original: harness.Run, result: pod.Pod) -> None:
    """One world of 4 across both hosts; host 0 prints the original's records once, and host 1
    once more where the original's master was each host's (none where it was the global one)."""
    problems = result.one_world_problems()
    host_0, host_1 = result.runs
    problems += harness.compare_exactly_once(case.program, original, host_0).problems
    if case.printers == "local":
        problems += [f"host 1: {p}" for p in harness.compare_exactly_once(case.program, original, host_1).problems]
    elif host_1.records or host_1.returncode:
        problems.append(f"host 1 exited {host_1.returncode} and printed {len(host_1.records)} records, expected none")
    assert not problems, "\n".join(problems) + "\n" + result.merged().output[-4000:]


def test_every_multiprocess_program_is_tested():
    programs = sorted(p.name for p in harness.MP_PROGRAMS.glob("m*.py"))
    assert len(programs) >= 8
    assert programs == sorted({case.program for case in CASES})


def _break_rule(rules: Path, code: str, value: str):
    """Make rule `code` replace its match by `value` in both targets (a deliberate bug)."""
    path = next(p for p in rules.glob("*.toml") if f"code = '{code}'" in p.read_text())
    text = path.read_text()
    start = text.index(f"code = '{code}'")
    end = text.find("[[rule]]", start)
    end = len(text) if end < 0 else end
    block = re.sub(r"^transform = .*\n", "", text[start:end], flags=re.M)
    block = re.sub(r"^\[rule\.replace\]\n(?:(?:tpu|portable) = .*\n)*", "", block, flags=re.M)
    block = block.rstrip("\n") + f'\n\n[rule.replace]\ntpu = "{value}"\nportable = "{value}"\n\n'
    path.write_text(text[:start] + block + text[end:])


def test_a_broken_rank_rule_is_caught(runs, tmp_path):
    """TPU021 (`xr.global_ordinal()`) answering 0 and TPU020 (`xr.world_size()`) answering 1:
    under torchrun both processes believe they are rank 0 of 1, train on the whole batch and sum
    each other's gradients; `if xr.global_ordinal() == 0:` prints on both. The comparison must
    report the duplicate record and the changed numbers."""
    rules = tmp_path / "rules"
    shutil.copytree(ROOT / "rules", rules)
    _break_rule(rules, "TPU021", "0")
    _break_rule(rules, "TPU020", "1")
    case = next(c for c in CASES if c.program == "m07_rank_gated_logging.py")
    copy = harness.migrate_many([harness.MP_PROGRAMS / case.program], tmp_path / "broken", rules_dir=rules)[case.program]
    assert copy.read_text() != runs.copies[case.program].read_text(), "the mutation changed nothing"
    broken = runs.migrated(case, TORCHRUN2, copy=copy).result()
    result = harness.compare_exactly_once(case.program, runs.original(case).result(), broken)
    assert not result.ok
    assert broken.returncode == 0, broken.output[-3000:]  # it runs: only the comparison can tell
    assert any(p.startswith("printed 2 times") and '"eval"' in p for p in result.problems), result.problems
    assert any(re.match(r'@step \{"step": \d+, "loss": [^}]*\}: loss ', p) for p in result.problems), result.problems


def broken_rules(tmp_path, file: str, code: str, old: str, new: str, table: str):
    """A copy of rules/ in which rule `code` of `file` has `old` replaced by `new` and `table`
    (a TOML table of the rule) appended: the obvious but wrong conversion a mutation test runs."""
    rules = tmp_path / "rules"
    shutil.copytree(ROOT / "rules", rules)
    path = rules / file
    text = path.read_text()
    start = text.index(f"code = '{code}'")
    end = text.index("[[rule]]", start)
    block = text[start:end].replace(old, new).rstrip("\n") + f"\n\n{table}\n\n"
    path.write_text(text[:start] + block + text[end:])
    return rules


def test_a_dropped_gradient_all_reduce_is_caught(runs, tmp_path):
    """TPU030 writing a bare `optimizer.step()` (what it did before it kept xm.optimizer_step's
    all-reduce): at one process nothing changes, so only the 2-process run can tell, where each
    replica steps with the gradients of its own slice and the averaged loss drifts."""
    rules = broken_rules(tmp_path, "steps.toml", "TPU030", "transform = 'optimizer_step'\n", 'params = ["optimizer"]\n',
                         '[rule.replace]\ntpu = "{optimizer_atom}.step()"\nportable = "{optimizer_atom}.step()"')
    case = next(c for c in CASES if c.program == "m05_optimizer_step_no_ddp.py")
    copy = harness.migrate_many([harness.MP_PROGRAMS / case.program], tmp_path / "broken", rules_dir=rules)[case.program]
    assert "param.grad" not in copy.read_text() and "optimizer.step()" in copy.read_text()
    original = runs.original(case).result()
    single = runs.migrated(case, PYTHON, copy=copy).result()
    assert harness.compare_exactly_once(case.program, original, single).ok  # one process: the same
    broken = runs.migrated(case, TORCHRUN2, copy=copy).result()
    result = harness.compare_exactly_once(case.program, original, broken)
    assert broken.returncode == 0, broken.output[-3000:]
    assert not result.ok
    assert any(": loss " in p for p in result.problems), result.problems


def test_torch_sync_batch_norm_in_place_of_torch_xla_s_is_caught(runs, tmp_path):
    """TPU126 renaming xf.SyncBatchNorm to torch.nn.SyncBatchNorm (the obvious conversion): the
    migrated launch starts a process group (of one process under `python`), and there
    torch.nn.SyncBatchNorm refuses CPU tensors, so the portable program fails even at world
    size 1. (Without a group it runs, with an unbiased running_var: p13's evaluation differs.)"""
    rules = broken_rules(tmp_path, "utilities.toml", "TPU126", "transform = 'sync_batch_norm'\n", "",
                         '[rule.rename]\ntpu = "{torch}.nn.SyncBatchNorm"\nportable = "{torch}.nn.SyncBatchNorm"')
    case = next(c for c in CASES if c.program == "m12_sync_batch_norm_process_index.py")
    copy = harness.migrate_many([harness.MP_PROGRAMS / case.program], tmp_path / "broken", rules_dir=rules)[case.program]
    assert "torch.nn.SyncBatchNorm(8)" in copy.read_text()
    broken = runs.migrated(case, PYTHON, copy=copy).result()
    assert broken.returncode != 0 and not broken.records
    assert "ValueError: SyncBatchNorm expected input tensor to be on GPU" in broken.output, broken.output[-3000:]


def test_process_index_as_node_rank_is_caught(runs, tmp_path):
    """TPU167 / TPU168 answering the node's rank and the node count (one process per host, as
    under torch_xla SPMD) instead of the rank and world size: under torchrun on one node both
    processes take the whole batch, and the processes cover 32 samples instead of 16."""
    rules = tmp_path / "rules"
    shutil.copytree(ROOT / "rules", rules)
    _break_rule(rules, "TPU167", 'int({os}.environ.get(\\"NODE_RANK\\", 0))')
    _break_rule(rules, "TPU168", 'int({os}.environ.get(\\"NNODES\\", 1))')
    case = next(c for c in CASES if c.program == "m12_sync_batch_norm_process_index.py")
    copy = harness.migrate_many([harness.MP_PROGRAMS / case.program], tmp_path / "broken", rules_dir=rules)[case.program]
    assert "NODE_RANK" in copy.read_text()
    broken = runs.migrated(case, TORCHRUN2, copy=copy).result()
    result = harness.compare_exactly_once(case.program, runs.original(case).result(), broken)
    assert broken.returncode == 0, broken.output[-3000:]
    assert not result.ok
    assert any(": samples " in p for p in result.problems), result.problems


def test_silently_local_collectives_are_caught(runs, tmp_path):
    """The converted collectives as they were before they made the default group themselves
    (`if dist.is_initialized() ...`): in m14 the file makes a group on its native path only, so
    the converted launch makes none, and under torchrun every collective of the runtime path
    quietly answers this process's value: the processes per node disagree with the world size,
    and rank 1 sees its own value where rank 0's was broadcast. At one process nothing changes."""
    case = next(c for c in CASES if c.program == "m14_library_comp_model.py")
    text = runs.copies[case.program].read_text()
    silent = re.sub(r"(?<![\w.])(?<!def )_process_group\(\)", "(dist.is_initialized() and dist.get_world_size() > 1)",
                    text.replace("if not _process_group():", "if not dist.is_initialized():"))
    assert silent != text and not re.search(r"(?<![\w.])_process_group\(\)", silent.replace("def _process_group():", ""))
    copy = tmp_path / case.program
    copy.write_text(silent)
    original = runs.original(case).result()
    single = runs.migrated(case, PYTHON, copy=copy).result()
    assert harness.compare_exactly_once(case.program, original, single).ok  # one process: the same
    broken = runs.migrated(case, TORCHRUN2, copy=copy).result()
    result = harness.compare_exactly_once(case.program, original, broken)
    assert broken.returncode == 0, broken.output[-3000:]  # it runs: only the comparison can tell
    assert not result.ok
    assert any('"nproc", "agree": true' in p for p in result.problems), result.problems
    assert any(re.match(r'@final \{"what": "broadcast", "value": 7\.0\}: value 7\.0 vs 0\.0', p)
               for p in result.problems), result.problems


def test_a_backend_name_that_became_none_is_caught(runs, tmp_path):
    """TPU005 writing None for "xla" on portable (what it did before): m13's model reads None as
    "not distributed", so under torchrun every process is rank 0 of 1 and prints every record."""
    case = next(c for c in CASES if c.program == "m14_library_comp_model.py")
    text = runs.copies[case.program].read_text()
    none = text.replace("DIST_BACKEND = _default_backend()", "DIST_BACKEND = None")
    assert none != text
    copy = tmp_path / case.program
    copy.write_text(none)
    broken = runs.migrated(case, TORCHRUN2, copy=copy).result()
    result = harness.compare_exactly_once(case.program, runs.original(case).result(), broken)
    assert broken.returncode == 0, broken.output[-3000:]
    assert not result.ok
    assert any(p.startswith("printed 2 times") for p in result.problems), result.problems


def test_a_second_gradient_average_after_fsdp_is_caught(runs, tmp_path):
    """TPU173 + TPU030 averaging the gradients once more after FSDP2 did (the obvious mistake:
    keep xm.optimizer_step's averaging beside a wrapper that already averages): at one process
    dividing by 1 changes nothing, so only the 2-process run can tell, where m16's SGD steps by
    half the gradient. (m15's AdamW could not tell: Adam's step does not depend on the
    gradient's scale. Keeping xm.optimizer_step's all-reduce itself fails at once there: FSDP2's
    gradients are DTensors, which c10d.allreduce_ refuses.)"""
    case = next(c for c in CASES if c.program == "m16_xla_fsdp_auto_wrap.py")
    text = runs.copies[case.program].read_text()
    step = "        optimizer.step()\n"
    assert text.count(step) == 1 and "param.grad" not in text, "the converted step changed: update this test"
    copy = tmp_path / case.program
    copy.write_text(text.replace(step, (
        "        for param in model.parameters():\n"
        "            if param.grad is not None:\n"
        "                param.grad /= dist.get_world_size()\n" + step)))
    original = runs.original(case).result()
    single = runs.migrated(case, PYTHON, copy=copy).result()
    assert harness.compare_exactly_once(case.program, original, single).ok  # one process: the same
    broken = runs.migrated(case, TORCHRUN2, copy=copy).result()
    result = harness.compare_exactly_once(case.program, original, broken)
    assert broken.returncode == 0, broken.output[-3000:]
    assert not result.ok
    assert any(": loss " in p for p in result.problems), result.problems


def test_every_process_reading_the_same_slice_of_the_batch_is_caught(runs, tmp_path):
    """The SPMD loader's conversion (TPU040 with FSDP-style input_sharding, through the
    `_batch_slice` helper that TPU184 shares) with a wrong slice:
    every process keeps the first part of each global batch, so the processes average the
    gradients of one part, not of the whole batch. At one process the slice is the whole batch;
    at 2 the held-out losses must differ from the SPMD original's."""
    case = next(c for c in CASES if c.program == "m17_spmd_fsdp_v2_sharded_loader.py")
    text = runs.copies[case.program].read_text()
    index = "tensor_split(parts)[index]"
    assert text.count(index) == 1, "the converted loader's slice changed: update this test"
    copy = tmp_path / case.program
    copy.write_text(text.replace(index, "tensor_split(parts)[0]"))
    original = runs.original(case).result()
    broken = runs.migrated(case, TORCHRUN2, copy=copy).result()
    result = harness.compare_exactly_once(case.program, original, broken)
    assert broken.returncode == 0, broken.output[-3000:]
    assert not result.ok
    assert any(": held_out_loss " in p for p in result.problems), result.problems


def test_a_batch_norm_over_the_slice_is_caught(runs, tmp_path):
    """The SPMD FSDP conversion without `_global_batch_norm` (what it was before): each process's
    BatchNorm normalizes by its own slice's statistics, where SPMD's normalized by the global
    batch's. At one process the slice is the batch; at 2 the held-out losses must differ."""
    case = next(c for c in CASES if c.program == "m18_spmd_fsdp_v2_marked_batch_norm.py")
    text = runs.copies[case.program].read_text()
    wrapped = "_fully_shard(_global_batch_norm(Net().to(device)))"
    assert text.count(wrapped) == 1, "the converted wrapper changed: update this test"
    copy = tmp_path / case.program
    copy.write_text(text.replace(wrapped, "_fully_shard(Net().to(device))"))
    broken = runs.migrated(case, TORCHRUN2, copy=copy).result()
    result = harness.compare_exactly_once(case.program, runs.original(case).result(), broken)
    assert broken.returncode == 0, broken.output[-3000:]
    assert not result.ok
    assert any(": held_out_loss " in p for p in result.problems), result.problems
