"""`tpu-migrate verify` on a real torch_xla program and its migration, and on realistic
migration mistakes, each of which it must catch at the right step and quantity.

m05 (xm.optimizer_step without DDP: torch_xla averaged the gradients over the replicas) is
world-size invariant: equal slices of a fixed global batch, averaged gradients. Its migration
keeps the average, so it is the same at 1 and 2 processes; the mutations break it the way a
hand-port would. The mutations and most tests take the portable migration (its programs start
from the suite's warm python); the default target's, tpu, runs on the TorchTPU stand-in under
$TPU_MIGRATE_STANDIN_PYTHON (tests/conftest.py: .venv-tpu), cold.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

import differential
import shared_runs
import warm_python
from conftest import ROOT
from tpu_migrate.verify import compare
from tpu_migrate.verify.runs import Target, Workspace

pytestmark = pytest.mark.slow  # torch_xla originals and torchrun worlds

PROGRAM = ROOT / "fixtures" / "programs" / "multiprocess" / "m05_optimizer_step_no_ddp.py"


# The command's own test needs no torch_xla: a program of torch alone runs as the original too
# (torch_xla's programs run through run_verify below, from a warm python: the cold imports of
# torch_xla cost this test 30 s). Every process computes the same without a process group.
TORCH_ONLY = """\
import torch

torch.manual_seed(1)
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(8, 4), torch.randn(8, 2)
for step in range(3):
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.6f}")
"""


def test_the_command_finds_the_migration_the_same_at_one_and_two_processes(tmp_path):
    """The command end to end: a copy of the program's folder migrated, the runs, JSON on stdout
    and the text on stderr, the HTML page, exit 0, nothing left behind. Its programs run with the
    --python given (as a project's own environment would be), torchrun's workers too: an
    interpreter that notes each start, then is python."""
    (tmp_path / "train.py").write_text(TORCH_ONLY)
    starts = tmp_path.parent / f"{tmp_path.name}-starts"
    # ... then is the suite's warm python for the environment verify gives the run.
    python = verify_python(tmp_path.parent / f"{tmp_path.name}-python", torch_xla=False,
                           first=f"echo started >> {starts}")
    proc = subprocess.run([sys.executable, "-m", "tpu_migrate", "verify", "--target", "portable", "--format", "json",
                           "--nproc", "1,2", "--python", str(python), "--html", "verify.html", "train.py"], capture_output=True,
                          text=True, cwd=tmp_path, timeout=600)
    # The original twice, the migration at one process, torchrun and its two workers.
    assert starts.read_text().count("started") == 6, proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stdout + proc.stderr
    document = json.loads(proc.stdout)
    assert document["same"] and document["steps"] == 3
    assert (document["target"], document["standin"]) == ("portable", None)
    assert [(r["processes"], r["steps"], r["divergence"], r["printed"]["same"]) for r in document["runs"]] == [
        (1, 3, None, 6), (2, 3, None, 6)]
    assert "migrated, torchrun, 2 processes: same (3 steps: learning rate, loss" in proc.stderr
    assert "against its portable migration (the CPU, gloo), 3 optimizer steps" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py", "verify.html"]  # the copy was temporary
    page = (tmp_path / "verify.html").read_text()
    assert 'migrated, torchrun, 2 processes: <span class="same">same</span>' in page
    assert page.count("<tr><td") == 6 and "number diverged" not in page  # 3 steps, 2 runs


def warm(env: dict[str, str]) -> str:
    """verify's interpreter in the suite: a warm python (tests/warm_python.py) with torch, and
    torch_xla for the originals, imported."""
    modules = differential.WARM_XLA_MODULES if "PJRT_DEVICE" in env else differential.WARM_MODULES
    return warm_python.python_for(env, modules)


def warm_migrated(env: dict[str, str]) -> str:
    """run_verify's interpreter for a program of torch alone, as verify_python(torch_xla=False)
    picks in a subprocess: the migrated runs (verify's torch_xla blocker first on PYTHONPATH)
    from the warm python, the originals cold."""
    return warm(env) if "/blocker" in env.get("PYTHONPATH", "").split(os.pathsep)[0] else sys.executable


def verify_python(path, torch_xla: bool, first: str = ""):
    """An interpreter for `tpu-migrate verify --python` in a subprocess: a script that runs the
    suite's warm python for the run's environment, as `warm` does for run_verify in this process
    (a cold start imports torch, 2-6 s of CPU a process). The servers are those of the
    environments verify makes from this one (runs.Workspace.run), which this module's runs use
    too (conftest.SAME_WORKER_MODULES: one worker); a run they cannot reproduce starts the real
    interpreter. A migrated run has verify's torch_xla blocker first on its PYTHONPATH. An
    original (PJRT_DEVICE=CPU) whose program never imports torch_xla (`torch_xla=False`) starts
    cold: from the originals' server it would find torch_xla imported (the recorder acts on its
    modules where they are), and a server of its own would be one kind more for the worker.
    `first`: a shell line run before."""
    migrated = {**os.environ}
    for name, value in (("OMP_NUM_THREADS", "1"), ("PYTHONHASHSEED", "0")):
        migrated.setdefault(name, value)
    original = warm({"PJRT_DEVICE": "CPU", **migrated}) if torch_xla else sys.executable
    path.write_text(f'#!/bin/sh\n{first}\ncase "$PYTHONPATH" in */blocker:*) exec {warm(migrated)} "$@";; esac\n'
                    f'exec {original} "$@"\n')
    path.chmod(0o755)
    return path


def original_run(workspace: Workspace, name: str, program: Target, args: list[str]):
    """The original's run of `program`, made once per test session: XLA:CPU repeats itself
    exactly (the noise floor has tests of its own, and the command's test runs an original
    twice), so the mutations and the stand-in's tests share one."""
    key = f"verify original {shared_runs.file_key(program.path)} {args}"
    run = shared_runs.once(key, lambda: _WORKSPACE_RUN(workspace, "original", "original", program, args, 1, 300,
                                                             watch_writes=True))
    return dataclasses.replace(run, name=name)


_WORKSPACE_RUN = Workspace.run  # shared_originals' patch calls through to it


@pytest.fixture
def shared_originals(monkeypatch):
    """run_verify's originals of the fixture programs from original_run (two runs of the same)."""
    def shared(self, name, side, program, args, nproc, timeout, nnodes=1, watch_writes=False):
        if side == "original" and program.path.is_relative_to(ROOT / "fixtures"):
            return original_run(self, name, program, args)  # its writes noted: it may be the first run
        return _WORKSPACE_RUN(self, name, side, program, args, nproc, timeout, nnodes, watch_writes)

    monkeypatch.setattr(Workspace, "run", shared)


# (what the mutation does to the migrated program, the text it replaces, with what) and what
# verify must say: the step (a printed line's number for a printed number), the quantity and
# words of the cause. m05 takes the most; m08 (DistributedSampler, an all-reduced printed loss)
# the sampler's and the printed loss's; v01 (an evaluation of each process's own rows, reduced
# with xm.mesh_reduce and printed by every process) the reduced value's.
M08 = ROOT / "fixtures" / "programs" / "multiprocess" / "m08_sampler_device_loader.py"
V01 = ROOT / "fixtures" / "programs" / "verify" / "v01_per_process_eval.py"
V02 = ROOT / "fixtures" / "programs" / "verify" / "v02_loader_schedule_clip.py"
P08 = ROOT / "fixtures" / "programs" / "p08_autocast.py"
PROGRAMS = (PROGRAM, M08, V01, V02, P08)
GRADIENT_AVERAGE = "                    dist.all_reduce(param.grad)\n                    param.grad /= dist.get_world_size()\n"
MUTATIONS = {
    "a dropped gradient all-reduce": (PROGRAM, GRADIENT_AVERAGE, "                    pass\n",
                                      0, "gradient norm", "each process stepped with its own gradients"),
    "gradients summed, not averaged": (PROGRAM, "                    param.grad /= dist.get_world_size()\n", "",
                                       0, "gradient norm", "summed over the 2 processes, not averaged"),
    "gradients averaged twice": (PROGRAM, GRADIENT_AVERAGE, GRADIENT_AVERAGE.replace("/= dist", "/= 2 * dist"),
                                 0, "gradient norm", "averaged over the processes twice"),
    "the rank answered 0": (PROGRAM, "start = dist.get_rank() *", "start = 0 *",
                            0, "loss", "did not read equal slices of the same global batch"),
    "the learning rate scaled by the world size": (PROGRAM, "lr=0.01,", "lr=0.01 * dist.get_world_size(),",
                                                   0, "learning rate", "2 times the original's, the world size 2"),
    # At one process (ONE_PROCESS): the model starts from other weights.
    "a seed on another generator": (PROGRAM, "torch.manual_seed(5)", "__import__('random').seed(5)",
                                    0, "loss", "one process already differs"),
    "a sampler that does not shard": (M08, "num_replicas=dist.get_world_size(), rank=dist.get_rank(),",
                                      "num_replicas=1, rank=0,", 0, "loss", "a sampler without num_replicas"),
    "the printed loss averaged twice": (M08, "loss = loss * (1.0 / dist.get_world_size())",
                                        "loss = loss * (1.0 / dist.get_world_size() ** 2)",
                                        1, "printed number", "averaged over the 2 processes twice"),
    # Issue 48, item 1: blind spots. A rank from LOCAL_RANK is the global rank on one node only
    # (TWO_NODES: 2 torchruns of 1 process); the master's test dropped, every rank prints (rank 1
    # too); the mesh_reduce dropped, rank 0 prints its own error, which is the original's.
    "a rank taken from LOCAL_RANK": (PROGRAM, "start = dist.get_rank() *", 'start = int(os.environ["LOCAL_RANK"]) *',
                                     0, "loss", "did not read equal slices of the same global batch"),
    "every rank prints": (PROGRAM, '        if int(os.environ.get("LOCAL_RANK", 0)) == 0:\n            print("@step "',
                          '        if True:\n            print("@step "',
                          1, "processes that print it", "printed it from one process only"),
    "a reduced value printed rank-local": (V01, "    error = np.mean(gathered)\n", "    error = error.item()\n",
                                           4, "printed number", "a value of each process's own"),
    # Issue 48, item 4 and its proof: the bookkeeping of a training loop (v02, at one process:
    # a partial last batch, a schedule per batch, clipping), an autocast (p08), and at 2
    # processes a dropped initial broadcast and a loss scaled by the world size (m05).
    "ranks seeded apart": (PROGRAM, "torch.manual_seed(5)", "torch.manual_seed(5 + dist.get_rank())",
                           0, "parameters", "the initial broadcast of the parameters is missing"),
    "the loss scaled by the world size": (PROGRAM, "cross_entropy(model(x), y)\n",
                                          "cross_entropy(model(x), y) * dist.get_world_size()\n",
                                          0, "loss", "2 times the original's, the world size 2"),
    "drop_last changed": (V02, "drop_last=True", "drop_last=False", 4, "loss", "drop_last changed"),
    "zero_grad dropped": (V02, "            optimizer.zero_grad()\n", "", 1, "parameters",
                          "one process already differs"),
    "a scheduler step dropped": (V02, "            scheduler.step()\n", "", 3, "learning rate",
                                 "a schedule stepped differently"),
    "the optimizer stepped twice": (V02, "            optimizer.step()\n", "            optimizer.step()\n" * 2,
                                    1, "parameters", "stepped again without a backward"),
    "the gradient clipping dropped": (V02, "            torch.nn.utils.clip_grad_norm_(model.parameters(), "
                                           "max_norm=0.5)\n", "", 0, "gradient norm", "clip"),
    "an autocast dropped": (P08, "with torch.autocast(", "with torch.autocast(enabled=False, device_type=",
                            0, "precision", "changed the autocast region"),
    "an autocast added": (V02, "            loss = torch.nn.functional.mse_loss(model(x), y)\n",
                          "            with torch.autocast(device.type, dtype=torch.bfloat16):\n"
                          "                loss = torch.nn.functional.mse_loss(model(x), y)\n",
                          0, "precision", "changed the autocast region"),
}
# Edits that change nothing the original computes: no alarm (at one process).
NEUTRAL = {
    "drop_last dropped where the batches divide the data": (M08, "drop_last=True", "drop_last=False"),
    "the model's zero_grad for the optimizer's": (V02, "optimizer.zero_grad()", "model.zero_grad(set_to_none=True)"),
    "the loss written out": (V02, "torch.nn.functional.mse_loss(model(x), y)", "((model(x) - y) ** 2).mean()"),
}
ONE_PROCESS = {"a seed on another generator", "drop_last changed", "zero_grad dropped", "a scheduler step dropped",
               "the optimizer stepped twice", "the gradient clipping dropped", "an autocast dropped",
               "an autocast added"}
TWO_NODES = {"a rank taken from LOCAL_RANK"}
RANKS = {"every rank prints": [1], "a reduced value printed rank-local": [1]}  # else: every rank (0 at one process)


@pytest.fixture(scope="module")
def mutated_runs(tmp_path_factory):
    """Per program, the original and the migration at one process; each mutation of the
    migration at 2 processes (ONE_PROCESS: at 1; TWO_NODES: 2 nodes of 1), each neutral edit at
    1, and v01's migration at 2 too (its correct reduction). Two runs at a time."""
    workspace = Workspace(warm, "portable")
    try:
        with ThreadPoolExecutor(2) as pool:
            # Each original once (original_run). Both are xmp.spawn launches from one warm python
            # at once (tests/test_warm_python_fds.py: what that once broke). They start first: the
            # migrations go meanwhile.
            originals = {p: pool.submit(original_run, workspace, "original", Target(p, None, False), [])
                         for p in PROGRAMS}
            # A migration rewrites the program's whole folder: m05 and m08 share one, v01 and v02
            # another (the same files a migration of each would make); p08's folder holds every
            # program, so p08 is migrated from a folder of its own.
            alone = tmp_path_factory.mktemp("p08")
            (alone / P08.name).write_text(P08.read_text())
            migrated, copies, trees = {}, {}, {P08.parent: workspace.migrate(Target(alone / P08.name, None, False)).path.parent}
            for program in originals:
                if program.parent not in trees:
                    trees[program.parent] = workspace.migrate(Target(program, None, False)).path.parent
                migrated[program] = trees[program.parent] / program.name
            for name, (program, old, new, *_) in {**MUTATIONS, **NEUTRAL}.items():
                text = migrated[program].read_text()
                assert text.count(old) == 1, f"{name}: the migration changed, update the mutation"
                copies[name] = Target(migrated[program].with_name(f"mutated-{len(copies)}.py"), None, True)
                copies[name].path.write_text(text.replace(old, new))
            runs = {name: pool.submit(workspace.run, name, "migrated", copy, [],
                                      1 if name in ONE_PROCESS | TWO_NODES | set(NEUTRAL) else 2, 300,
                                      2 if name in TWO_NODES else 1)
                    for name, copy in copies.items()}
            same = {p: pool.submit(workspace.run, "migrated", "migrated", Target(path, None, True), [], 1, 300)
                    for p, path in migrated.items()}
            same[V01, 2] = pool.submit(workspace.run, "migrated, 2", "migrated", Target(migrated[V01], None, True),
                                       [], 2, 300)
            originals = {p: [f.result()] * 2 for p, f in originals.items()}
            yield ({p: compare.original(*originals[p]) for p in migrated}, {p: f.result() for p, f in same.items()},
                   {name: f.result() for name, f in runs.items()})
    finally:
        workspace.close()


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.stem[:3])
def test_the_migration_is_the_same_at_one_process(mutated_runs, program):
    references, same, _ = mutated_runs
    result = compare.verdict(references[program], same[program], 1e-4, 1e-5)
    assert result.divergence is None and result.steps == len(references[program].steps) >= 3, same[program].output
    # Its step lines are among its printed numbers; nothing differed between the original's two runs.
    assert result.printed.compared >= 7 and not result.printed.noisy and not result.printed.one_side


def test_a_value_the_original_reduced_agrees_at_one_process_only_where_every_rank_prints_it_alike(mutated_runs):
    """v01's correct migration at 2 processes: both ranks print the mean over their 16 rows, not
    the original's 8: a reduction over the processes' own data, listed as agreeing at one process
    only (it was a divergence: the printed value differed from the original's), while the copy
    that prints each rank's own error, rank 0's equal to the original's, is caught (the
    mutation "a reduced value printed rank-local")."""
    references, same, _ = mutated_runs
    reference = references[V01]
    # The steps' all-reduced losses and the eval error were reduced; the master printed the steps.
    # The rmse (total / count of two reductions) is computed from reduced values: reduced too (issue
    # 48, item 1c; it was compared with the original's and failed the correct migration at 2).
    assert reference.reduced == {(1, 1), (2, 1), (3, 1), (4, 0), (5, 0), (5, 1)} and reference.once == {1, 2, 3}
    run = same[V01, 2]
    assert run.returncode == 0, run.output
    assert [(rank, first) for rank, first, _ in run.ranks] == [(0, True), (1, False)]
    result = compare.verdict(reference, run, 1e-4, 1e-5)
    assert result.divergence is None, result.divergence
    assert [item["line"] for item in result.printed.world_only] == [4, 5, 5]
    assert "a reduction over the 2 processes' own data" in result.printed.world_only[0]["why"]


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_a_migration_mistake_is_caught_at_its_first_step(mutated_runs, mutation):
    references, _, runs = mutated_runs
    program, _, _, step, quantity, cause = MUTATIONS[mutation]
    run = runs[mutation]
    assert run.returncode == 0, run.output  # it runs: only the comparison can tell
    result = compare.verdict(references[program], run, 1e-4, 1e-5)
    divergence = result.divergence
    assert divergence is not None, f"{mutation} was not caught"
    assert (divergence.step, divergence.quantity) == (step, quantity), divergence
    assert cause in divergence.cause, divergence.cause
    assert divergence.ranks == RANKS.get(mutation, [0] if mutation in ONE_PROCESS or quantity == "printed number"
                                         else [0, 1])


@pytest.mark.parametrize("edit", list(NEUTRAL))
def test_an_edit_that_changes_nothing_computed_is_no_alarm(mutated_runs, edit):
    references, _, runs = mutated_runs
    run = runs[edit]
    assert run.returncode == 0, run.output
    result = compare.verdict(references[NEUTRAL[edit][0]], run, 1e-4, 1e-5)
    assert result.divergence is None, result.divergence
    assert result.steps == len(references[NEUTRAL[edit][0]].steps) and not result.excursions


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
    assert "the original took no optimizer step, called no backward() and printed no number: nothing to compare" \
        in proc.stdout
    assert "running the original, again" not in proc.stdout  # it stopped after the first run


# A package whose training module updates its weights by hand (no optimizer: compared per
# backward() call) and prints a held-out error (compared as a printed number).
HAND_WRITTEN = """\
import torch
import torch_xla.core.xla_model as xm

torch.manual_seed(0)
device = xm.xla_device()
truth = torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
x, held_out = torch.randn(32, 4), torch.randn(16, 4)
x, y = x.to(device), (x @ truth).to(device)
w = torch.zeros(4, 1, device=device, requires_grad=True)
for step in range(4):
    loss = ((x @ w - y) ** 2).mean()
    loss.backward()
    with torch.no_grad():
        w -= 0.05 * w.grad
        w.grad.zero_()
    xm.mark_step()
error = ((held_out.to(device) @ w - (held_out @ truth).to(device)) ** 2).mean()
print(f"step {step}: held-out error {error.item():.4f} (lr 0.05)")
"""


def test_a_module_without_an_optimizer_is_compared_per_backward_call_and_by_what_it_prints(tmp_path, monkeypatch):
    """`verify -m pkg.train`: the package's tree copied and migrated, the copy's module run (not
    the original's, which the working directory holds too); the same, then a hand-port that
    evaluates another way: every backward call agrees, the printed error is the divergence."""
    from tpu_migrate.verify.command import run_verify

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text(HAND_WRITTEN)
    monkeypatch.chdir(tmp_path)
    said = []
    status, document = run_verify("pkg.train", [], None, None, [1], 1e-4, 1e-5, 300, said.append, module=True,
                                  interpreter=warm, target="portable")
    assert status == 0, "\n".join(said)
    assert (document["unit"], document["steps"]) == ("backward call", 4)
    assert "4 backward calls (no optimizer step), 3 printed numbers on 1 line(s)" in said[-2]
    assert "migrated, 1 process: same (4 backward calls: loss within rtol 1e-04; 3 printed numbers the same)" in said[-1]

    port = tmp_path / "ported.py"  # a hand-port whose evaluation sums where the original averaged
    port.write_text(HAND_WRITTEN.replace("import torch_xla.core.xla_model as xm\n", "").replace(
        "xm.xla_device()", "torch.device('cpu')").replace("    xm.mark_step()\n", "").replace(
        "** 2).mean()\nprint", "** 2).sum()\nprint"))
    said.clear()
    status, document = run_verify(str(tmp_path / "pkg" / "train.py"), [], str(port), None, [1], 1e-4, 1e-5, 300,
                                  said.append, interpreter=warm, target="portable")
    assert status == 1, "\n".join(said)
    divergence = document["runs"][0]["divergence"]
    assert (divergence["unit"], divergence["step"], divergence["quantity"]) == ("printed line", 1, "printed number")
    assert divergence["migrated"] == pytest.approx(16 * divergence["original"], rel=1e-3)
    assert divergence["cause"].startswith("every backward call's loss agrees, so what differs is computed outside "
                                          "the training steps, already at one process")


MNIST = ROOT / "fixtures" / "programs" / "real" / "pytorch_xla" / "test" / "test_train_mp_mnist.py"
MNIST_FLAGS = ["--fake_data", "--num_cores", "1", "--num_epochs", "1", "--batch_size", "32", "--log_steps", "5"]


def test_pytorch_xla_s_mnist_script_is_the_same_as_its_migration(tmp_path, monkeypatch):
    """A real script, as a user would verify it: its losses, epochs and accuracy printed with
    the device's name and the rates and clock times around them. (At two processes it scales its
    learning rate by the world size, by design: the m05 mutation of that name shows what verify
    says.) It prints through xm.master_print, whose `fd=sys.stdout` default a warm python bound
    at its import: see warm_python._StartupStream."""
    from tpu_migrate.verify.command import run_verify

    monkeypatch.chdir(tmp_path)
    said = []
    status, document = run_verify(str(MNIST), MNIST_FLAGS, None, None, [1], 1e-4, 1e-5, 300, said.append,
                                  interpreter=warm, target="portable")
    assert status == 0, "\n".join(said)
    assert document["steps"] == 20 and document["runs"][0]["divergence"] is None
    # It writes no file: after its first run, its second and the migrated run go at once (2 cores).
    from tpu_migrate.verify import schedule

    assert ("verify: running the original, again and the migrated, 1 process at once ..." in said) == \
        (schedule.cores() >= 2), said
    # 4 loss lines (epoch, step, loss: 12), the epoch of 4 other lines, test accuracy and max accuracy: the
    # rates differ between the original's own runs and are left out.
    printed = document["runs"][0]["printed"]
    assert (printed["same"], printed["noisy"], printed["one_side"]) == (21, 8, 0)


DEVICE_DRAW = """\
import torch
import torch_xla

torch.manual_seed(0)
device = torch_xla.device()
w = torch.zeros(4, device=device, requires_grad=True)
optimizer = torch.optim.SGD([w], lr=0.1)
for step in range(2):
    optimizer.zero_grad()
    loss = ((w - torch.randn(4, device=device)) ** 2).sum()
    loss.backward()
    optimizer.step()
    torch_xla.sync()
"""


def test_without_against_a_divergence_names_the_lines_the_rewrite_converted(tmp_path, monkeypatch):
    """No --against: the code named is the rewrite's own, the original's lines it converted with
    what it made of them (JSON "converted_code"). A draw from torch_xla's device generator makes
    the runs differ at step 0 (the migration draws from the CPU's)."""
    from tpu_migrate.verify.command import run_verify

    (tmp_path / "train.py").write_text(DEVICE_DRAW)
    monkeypatch.chdir(tmp_path)
    said = []
    status, document = run_verify("train.py", [], None, None, [1], 1e-4, 1e-5, 300, said.append,
                                  interpreter=warm, target="portable")
    assert status == 1, "\n".join(said)
    assert document["runs"][0]["divergence"]["step"] == 0
    assert "device generator" in document["runs"][0]["divergence"]["cause"]
    converted = document["converted_code"]
    assert converted and "differing_code" not in document
    assert any("torch_xla.device()" in hunk for hunk in converted), converted
    assert any(line.startswith("    code tpu-migrate converted (the original's lines, the migration's): ")
               for line in said), said


def test_a_missing_script_is_one_line_and_exit_2(tmp_path):
    proc = _verify(tmp_path, "nowhere.py")
    assert proc.returncode == 2
    assert "no such script: nowhere.py" in proc.stderr


def test_the_default_target_s_migration_is_the_same_on_the_torchtpu_stand_in(shared_originals, tmp_path, monkeypatch):
    """verify's default: m05's tpu migration (torch.device("tpu"), tpu_dist, torch.accelerator's
    device count) run on the stand-in, under the Python $TPU_MIGRATE_STANDIN_PYTHON names, as one
    process (its own torch.multiprocessing launch) and under torchrun, its workers too: the
    recorder reads the tpu tensors' gradients and parameters, and changes nothing."""
    from tpu_migrate.verify.command import run_verify

    monkeypatch.chdir(tmp_path)
    said = []
    status, document = run_verify(str(PROGRAM), [], None, None, [1, 2], 1e-4, 1e-5, 300, said.append,
                                  interpreter=warm)
    assert status == 0, "\n".join(said)
    torch = document["standin"]["torch"]
    assert document["target"] == "tpu" and (2, 11) <= tuple(map(int, torch.split("."))) <= (2, 15)
    assert [(r["processes"], r["steps"], r["divergence"]) for r in document["runs"]] == [(1, 5, None), (2, 5, None)]
    assert all(r["printed"]["same"] >= 11 and not r["printed"]["one_side"] for r in document["runs"])
    assert (f"against its tpu migration on the TorchTPU stand-in (torch {torch}, the CPU computing; tpu_dist over "
            "gloo), 5 optimizer steps") in said[-3]


def test_a_broken_tpu_port_given_with_against_is_caught_on_the_stand_in(shared_originals, tmp_path, monkeypatch):
    """A hand-port in TorchTPU's dialect (m05's tpu migration without its gradient average) as
    `verify --against`: it runs on the stand-in, and the first divergent step is named."""
    from tpu_migrate.verify.command import run_verify

    workspace = Workspace(target="tpu")
    try:
        migrated = workspace.migrate(Target(PROGRAM, None, False)).path.read_text()
    finally:
        workspace.close()
    assert "torch.device(\"tpu\")" in migrated and migrated.count(GRADIENT_AVERAGE) == 1
    port = tmp_path / "port.py"
    port.write_text(migrated.replace(GRADIENT_AVERAGE, "                    pass\n"))
    monkeypatch.chdir(tmp_path)
    said = []
    status, document = run_verify(str(PROGRAM), [], str(port), None, [2], 1e-4, 1e-5, 300, said.append,
                                  interpreter=warm)
    assert status == 1, "\n".join(said)
    assert f"against {port} (target tpu) on the TorchTPU stand-in (torch " in said[-5]
    assert said[-4].startswith("  migrated, torchrun, 2 processes: differs first at step 0, gradient norm: ")
    assert said[-4].endswith("(migrated, ranks 0-1)")
    assert said[-3].startswith("    at the step: port.py:") and said[-3].endswith(": optimizer.step()")
    assert "each process stepped with its own gradients" in said[-2]
    assert document["target"] == "tpu" and document["runs"][0]["divergence"]["step"] == 0
    # Issue 48, item 4: the code the port changed, told from what the rewrite makes of the original.
    line = migrated[:migrated.index(GRADIENT_AVERAGE)].count("\n") + 1
    assert said[-1] == (f"    code that differs from tpu-migrate's migration: port.py:{line}: pass (the migration: "
                        "dist.all_reduce(param.grad); param.grad /= dist.get_world_size())")
    assert document["differing_code"] == [said[-1].split("migration: ", 1)[1]]


def test_a_migrated_python_without_a_torch_for_the_stand_in_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "train.py").write_text(TORCH_ONLY)
    proc = _verify(tmp_path, "--migrated-python", sys.executable, "train.py")  # torch 2.9: too old
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"--migrated-python {sys.executable}: not a Python with torch 2.11 to 2.15" in proc.stderr
    assert "running the original" not in proc.stdout  # nothing ran


# --- A run ends with its program, and leaves nothing running (issue 51, item 3) ------------------

def _pids(path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def _gone(pids: list[int], within: float = 10) -> list[int]:
    """Those of `pids` still running after `within` seconds (a SIGKILLed process may take a moment)."""
    import time

    import process_groups

    deadline = time.monotonic() + within
    while any(map(process_groups.alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = [pid for pid in pids if process_groups.alive(pid)]
    for pid in alive:  # a failed test leaves nothing running either
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    return alive


def test_at_the_timeout_torchrun_s_workers_are_stopped_with_it(tmp_path):
    """torch's elastic agent starts each worker in a session of its own: killing the agent (or
    its process group) at --timeout once left them running under init, executing a script from
    a workspace already deleted. The original and the run at one process pass; under torchrun the
    workers hang, and every one of them must be gone when verify returns."""
    pids = tmp_path.parent / f"{tmp_path.name}-workers"
    (tmp_path / "train.py").write_text(
        "import os, time\nprint('step 0 loss 0.5', flush=True)\n"
        "if 'TORCHELASTIC_RUN_ID' in os.environ:\n"
        f"    with open({str(pids)!r}, 'a') as f:\n        f.write(f'{{os.getpid()}}\\n')\n"
        "    time.sleep(600)\n")
    try:
        proc = subprocess.run([sys.executable, "-m", "tpu_migrate", "verify", "--target", "portable", "--nproc", "2",
                               "--timeout", "12", "train.py"], capture_output=True, text=True, cwd=tmp_path,
                              timeout=120)
    finally:
        workers = _pids(pids)
        outlived = _gone(workers)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    # On 3 cores or more it timed out beside the original's second run first, and went again alone.
    again = "run alone after exit status 124 beside other runs" in proc.stdout
    assert ("the migrated, torchrun, 2 processes run failed (exit status 124" + (", " if again else ")")) \
        in proc.stdout, proc.stdout
    assert "stopped after 12 s" in proc.stdout
    assert len(workers) == 2 * (1 + again), proc.stdout + proc.stderr  # all started before the timeout
    assert outlived == [], "torchrun's workers outlived verify"


def test_a_background_process_that_holds_stdout_does_not_hold_the_run(tmp_path):
    """A program that exits at once, leaving a process (in a session of its own) that keeps its
    stdout open: the run ends when the program exits (it once waited for the pipe's end, then
    failed with 124 at the timeout); the process is stopped, and verify names it."""
    pids = tmp_path.parent / f"{tmp_path.name}-background"
    (tmp_path / "background.py").write_text(
        f"import os, time\nwith open({str(pids)!r}, 'a') as f:\n    f.write(f'{{os.getpid()}}\\n')\ntime.sleep(600)\n")
    (tmp_path / "train.py").write_text(
        "import os, subprocess, sys\nprint('step 0 loss 0.5', flush=True)\n"
        "subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), 'background.py')], "
        "start_new_session=True)\n")
    import time

    started = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "tpu_migrate", "verify", "--target", "portable", "--nproc", "1",
                               "--timeout", "30", "train.py"], capture_output=True, text=True, cwd=tmp_path,
                              timeout=200)
    finally:
        took = time.monotonic() - started
        background = _pids(pids)
        outlived = _gone(background)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert took < 25, took  # three runs, none of them waiting for the background process
    # The background process writes a file (its pid): the runs go one after another.
    assert f"verify: the original writes files ({pids}): its runs go one after another" in proc.stdout
    assert len(background) == 3, proc.stdout  # one per run: the original twice, the migration once
    assert outlived == [], "the background processes outlived verify"
    for pid in background:
        assert f"the program exited leaving 1 process(es) running, stopped: pid {pid}: " in proc.stdout


def test_a_temporary_directory_inside_the_script_s_folder_is_not_copied_into_itself(tmp_path):
    """TMPDIR under the script's folder: the migration's copy of the folder once copied the
    workspace, which held the copy, 245 levels deep, then ended in a traceback and exit 1 (the
    status of a divergence). A FIFO and a link to the folder itself are left out of the copy too."""
    (tmp_path / "train.py").write_text("print('step 0 loss 0.5')\n")
    (tmp_path / "tmp").mkdir()
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "loop").symlink_to(".")
    proc = subprocess.run([sys.executable, "-m", "tpu_migrate", "verify", "--target", "portable", "--nproc", "1",
                           "train.py"], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          env={**os.environ, "TMPDIR": str(tmp_path / "tmp")})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "migrated, 1 process: same" in proc.stdout
    assert list((tmp_path / "tmp").iterdir()) == []  # the workspace is gone


def test_an_internal_error_is_one_line_and_exit_2_never_1(tmp_path, monkeypatch):
    """Exit status 1 says that the migration diverges: the tool's own failure must not say so."""
    from tpu_migrate.verify.command import run_verify

    (tmp_path / "train.py").write_text("print('step 0 loss 0.5')\n")
    monkeypatch.chdir(tmp_path)

    def broken(self, target, root=None):
        raise RecursionError("maximum recursion depth exceeded\nwhile copying")

    monkeypatch.setattr(Workspace, "migrate", broken)
    said = []
    status, document = run_verify("train.py", [], None, None, [1], 1e-4, 1e-5, 60, said.append, target="portable")
    assert status == 2
    # The migration goes beside the original's first run: that run is said, then the error alone.
    assert said == ["verify: running the original ...",
                    "verify: internal error: RecursionError: maximum recursion depth exceeded while copying"]
    assert document["error"] == said[-1]


# --- Packages and layouts (issue 48, item 6) ----------------------------------------------------

LIBRARY_TRAIN = """\
import torch

from mylib.settings import LR

torch.manual_seed(1)
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=LR)
x, y = torch.randn(8, 4), torch.randn(8, 2)
for step in range(3):
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.6f}")
"""


def _project(root, lr: str, src: bool):
    """A project: pyproject.toml, its package `mylib` (under src/ in a src layout) with a module
    `mylib.train`, and a script scripts/train.py that imports the package."""
    package = root / "src" / "mylib" if src else root / "mylib"
    package.mkdir(parents=True)
    (root / "pyproject.toml").write_text("[project]\nname = 'mylib'\nversion = '0'\n")
    (package / "__init__.py").write_text("")
    (package / "settings.py").write_text(f"LR = {lr}\n")
    (package / "train.py").write_text(LIBRARY_TRAIN)
    (root / "scripts").mkdir()
    (root / "scripts" / "train.py").write_text(LIBRARY_TRAIN)


def test_a_finished_migration_of_a_src_layout_package_is_verified_in_one_command(tmp_path):
    """`verify -m mylib.train --against COPY` from the project's root, the package under src/: it
    was refused (`--against` with -m), and without --root src the module was not found. The
    user's copy has a hand-edited learning rate in the package: its own package runs, not the
    original's, and the rate is the divergence."""
    _project(tmp_path / "project", "0.1", src=True)
    _project(tmp_path / "ported", "0.2", src=True)
    proc = subprocess.run([sys.executable, "-m", "tpu_migrate", "verify", "--target", "portable", "--nproc", "1",
                           "--format", "json", "-m", "mylib.train", "--against", str(tmp_path / "ported")],
                          capture_output=True, text=True, cwd=tmp_path / "project", timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})  # this checkout's tool
    assert proc.returncode == 1, proc.stdout + proc.stderr
    divergence = json.loads(proc.stdout)["runs"][0]["divergence"]
    assert (divergence["step"], divergence["quantity"], divergence["migrated"]) == (0, "learning rate", 0.2)
    assert f"mylib.train imports from {tmp_path / 'project' / 'src'} (a src layout)" in proc.stderr


def test_a_script_s_hand_edited_copy_imports_its_own_package_not_the_original_s(tmp_path, monkeypatch):
    """scripts/train.py imports the project's package (on $PYTHONPATH, as an editable install puts
    it): the copy's run imported the original's package, so a hand-edit there passed. The
    project's root (its pyproject.toml) is found and said; the copy's tree comes first."""
    from tpu_migrate.verify.command import run_verify

    _project(tmp_path / "project", "0.1", src=False)
    _project(tmp_path / "ported", "0.2", src=False)
    monkeypatch.chdir(tmp_path / "project")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "project"))
    said = []
    status, document = run_verify("scripts/train.py", [], str(tmp_path / "ported" / "scripts" / "train.py"), None,
                                  [1], 1e-4, 1e-5, 300, said.append, target="portable", interpreter=warm_migrated)
    assert status == 1, "\n".join(said)
    assert document["runs"][0]["divergence"]["quantity"] == "learning rate"
    assert f"scripts/train.py belongs to the project at {tmp_path / 'project'}" in said[0]
