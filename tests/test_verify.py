"""`tpu-migrate verify` on a real torch_xla program and its migration, and on realistic
migration mistakes, each of which it must catch at the right step and quantity.

m05 (xm.optimizer_step without DDP: torch_xla averaged the gradients over the replicas) is
world-size invariant: equal slices of a fixed global batch, averaged gradients. Its migration
keeps the average, so it is the same at 1 and 2 processes; the mutations break it the way a
hand-port would.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import ROOT
from tpu_migrate.verify import compare
from tpu_migrate.verify.runs import Workspace

pytestmark = pytest.mark.slow  # torch_xla originals and torchrun worlds

PROGRAM = ROOT / "fixtures" / "programs" / "multiprocess" / "m05_optimizer_step_no_ddp.py"


def test_the_command_finds_the_migration_the_same_at_two_processes(tmp_path):
    """The command end to end: a copy of the program's folder migrated, the runs, JSON on stdout
    and the text on stderr, exit 0. (One process: below, with the mutations' shared runs.)"""
    script = tmp_path / PROGRAM.name
    script.write_bytes(PROGRAM.read_bytes())
    proc = subprocess.run([sys.executable, "-m", "tpu_migrate", "verify", "--format", "json", "--nproc", "2",
                           "--html", "verify.html", script.name], capture_output=True, text=True, cwd=tmp_path,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    document = json.loads(proc.stdout)
    assert document["same"] and document["steps"] == 5
    assert [(r["processes"], r["steps"], r["divergence"]) for r in document["runs"]] == [(2, 5, None)]
    assert "migrated, torchrun, 2 processes: same (5 steps: learning rate, loss" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [PROGRAM.name, "verify.html"]  # the copy was temporary
    page = (tmp_path / "verify.html").read_text()
    assert 'migrated, torchrun, 2 processes: <span class="same">same</span>' in page
    assert page.count("<tr><td") == 5 and "number diverged" not in page


# (what the mutation does to the migrated program, the text it replaces, with what) and what
# verify must say: the quantity and words of the cause.
GRADIENT_AVERAGE = "                    dist.all_reduce(param.grad)\n                    param.grad /= dist.get_world_size()\n"
MUTATIONS = {
    "a dropped gradient all-reduce": (GRADIENT_AVERAGE, "                    pass\n",
                                      "gradient norm", "each process stepped with its own gradients"),
    "gradients summed, not averaged": ("                    param.grad /= dist.get_world_size()\n", "",
                                       "gradient norm", "summed over the 2 processes, not averaged"),
    "gradients averaged twice": (GRADIENT_AVERAGE, GRADIENT_AVERAGE.replace("/= dist", "/= 2 * dist"),
                                 "gradient norm", "averaged over the processes twice"),
    "the rank answered 0": ("start = dist.get_rank() *", "start = 0 *",
                            "loss", "did not read equal slices of the same global batch"),
    "the learning rate scaled by the world size": ("lr=0.01,", "lr=0.01 * dist.get_world_size(),",
                                                   "learning rate", "2 times the original's, the world size 2"),
    # At one process (ONE_PROCESS): the model starts from other weights.
    "a seed on another generator": ("torch.manual_seed(5)", "__import__('random').seed(5)",
                                    "loss", "one process already differs"),
}
ONE_PROCESS = {"a seed on another generator"}


@pytest.fixture(scope="module")
def mutated_runs(tmp_path_factory):
    """The original twice, the migration at one process, and each mutation of it at 2
    processes (ONE_PROCESS: at 1), two runs at a time."""
    workspace = Workspace()
    try:
        script = PROGRAM
        migrated = workspace.migrate(script, script.parent)
        text = migrated.read_text()
        copies = {}
        for name, (old, new, *_) in MUTATIONS.items():
            assert text.count(old) == 1, f"{name}: the migration changed, update the mutation"
            copies[name] = migrated.with_name(f"mutated-{len(copies)}.py")
            copies[name].write_text(text.replace(old, new))
        with ThreadPoolExecutor(2) as pool:
            originals = [pool.submit(workspace.run, f"original {k}", "original", script, [], 1, 300) for k in (1, 2)]
            runs = {name: pool.submit(workspace.run, name, "migrated", copy, [], 1 if name in ONE_PROCESS else 2, 300)
                    for name, copy in copies.items()}
            runs["none"] = pool.submit(workspace.run, "migrated", "migrated", migrated, [], 1, 300)
            yield [f.result() for f in originals], {name: f.result() for name, f in runs.items()}
    finally:
        workspace.close()


def test_the_migration_is_the_same_at_one_process(mutated_runs):
    (first, second), runs = mutated_runs
    original = compare.steps(first)
    result = compare.verdict(original, runs["none"], 1e-4, 1e-5, compare.noise(original, compare.steps(second)))
    assert result.divergence is None and result.steps == len(original) == 5


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_a_migration_mistake_is_caught_at_its_first_step(mutated_runs, mutation):
    (first, second), runs = mutated_runs
    assert first.returncode == 0 and second.returncode == 0, first.output
    run = runs[mutation]
    assert run.returncode == 0, run.output  # it runs: only the comparison can tell
    original = compare.steps(first)
    result = compare.verdict(original, run, 1e-4, 1e-5, compare.noise(original, compare.steps(second)))
    _, _, quantity, cause = MUTATIONS[mutation]
    divergence = result.divergence
    assert divergence is not None, f"{mutation} was not caught"
    assert (divergence.step, divergence.quantity) == (0, quantity), divergence
    assert cause in divergence.cause, divergence.cause
    assert divergence.ranks == ([0] if mutation in ONE_PROCESS else [0, 1])


def _verify(cwd, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tpu_migrate", "verify", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def test_a_program_that_cannot_run_exits_2_naming_the_side(tmp_path):
    (tmp_path / "broken.py").write_text("import sys\nprint('starting')\nsys.exit('no data at /nowhere')\n")
    proc = _verify(tmp_path, "broken.py")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "the original run failed (exit status 1)" in proc.stdout
    assert "no data at /nowhere" in proc.stdout


def test_a_program_without_an_optimizer_step_has_nothing_to_compare(tmp_path):
    (tmp_path / "no_steps.py").write_text("print('inference only')\n")
    proc = _verify(tmp_path, "no_steps.py")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "the original took no optimizer step: nothing to compare" in proc.stdout
    assert "running the original, again" not in proc.stdout  # it stopped after the first run


def test_a_missing_script_is_one_line_and_exit_2(tmp_path):
    proc = _verify(tmp_path, "nowhere.py")
    assert proc.returncode == 2
    assert "no such script: nowhere.py" in proc.stderr
