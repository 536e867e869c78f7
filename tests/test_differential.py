"""Differential tests: every program in fixtures/programs/ computes the same thing before
(torch_xla on XLA:CPU) and after migration (--target portable, plain PyTorch on the CPU, with
torch_xla blocked). See tests/differential.py for the harness and the tolerances."""

from __future__ import annotations

import ast
import re
import shutil
import sys

import pytest

import differential as harness
from conftest import ROOT
from differential import free_port
from test_realistic import unmarked_references

pytestmark = pytest.mark.slow  # torch_xla originals and migrated programs, torchrun at world size 2

PROGRAMS = sorted(harness.PROGRAMS.glob("p*.py"))


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.stem)
def test_migrated_program_matches_the_original(program):
    result = harness.differential(program)
    assert result.ok, "\n".join(result.problems)
    assert result.steps >= 4


def test_there_are_enough_programs():
    assert len(PROGRAMS) >= 10


def _records_by_rank(run, tag="@step"):
    ranks = {}
    for record in run.records:
        if record["@"] == tag:
            ranks.setdefault(record["rank"], []).append(record)
    return ranks


def test_spawn_collectives_with_two_processes(tmp_path):
    """The migrated xmp.spawn program runs 2 processes with gloo; the all-reduced values agree
    on both ranks and the control sum is 1 + 2."""
    program = harness.PROGRAMS / "p11_spawn_collectives.py"
    copy = harness.migrate(program, tmp_path)
    run = harness.run_migrated(copy, tmp_path, ["--nprocs", "2"], extra_env={"MASTER_PORT": str(free_port())})
    assert run.returncode == 0, run.output[-3000:]
    steps = _records_by_rank(run)
    assert sorted(steps) == [0, 1]
    for a, b in zip(steps[0], steps[1]):
        assert a["world"] == b["world"] == 2
        assert a["control"] == b["control"] == 3.0
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)
    finals = _records_by_rank(run, "@final")
    assert finals[0][0]["weight_mean"] == pytest.approx(finals[1][0]["weight_mean"], rel=1e-6)
    # One process reproduces the torch_xla run (compared in the parametrized test) and its sum.
    single = harness.run_migrated(copy, tmp_path, ["--nprocs", "1"], extra_env={"MASTER_PORT": str(free_port())})
    assert {r["control"] for r in single.records if r["@"] == "@step"} == {1.0}


def test_launch_program_under_torchrun_with_two_processes(tmp_path):
    """torch_xla.launch under torchrun called the worker directly; so does the migrated code."""
    program = harness.PROGRAMS / "p12_launch_process_group.py"
    copy = harness.migrate(program, tmp_path)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                "--master_port", str(free_port())]
    run = harness.run_migrated(copy, tmp_path, launcher=torchrun)
    assert run.returncode == 0, run.output[-3000:]
    steps = _records_by_rank(run)
    assert sorted(steps) == [0, 1]
    for a, b in zip(steps[0], steps[1]):
        assert a["world"] == b["world"] == 2
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)  # the all-reduced mean


def test_fix_level_safe_output_still_runs_on_torch_xla(tmp_path):
    """`--fix-level safe` holds p13's unsafe fixes (xp.Trace, add_step_closure, the metrics
    report): the file keeps torch_xla's runtime, so what assumes TorchTPU's waits with them (the
    device, mark_step, optimizer_step, master_print) and only what runs on both converts
    (RateTracker). The output, --target tpu, runs under torch_xla and computes what the original
    did; before, its device became "tpu" beside torch_xla's calls and it ran on neither stack."""
    program = harness.PROGRAMS / "p13_progress_helpers.py"
    copy = harness.migrate(program, tmp_path, target="tpu", options=("--fix-level", "safe"))
    text = copy.read_text()
    assert "_RateTracker()" in text and "xm.RateTracker()" not in text
    assert "xm.xla_device()" in text and "xm.optimizer_step(" in text and "TODO" not in text
    safe = harness.run_program(copy, harness.original_env(harness._env({})))
    result = harness.compare(program.name, harness.run_original(program), safe)
    assert result.ok, "\n".join(result.problems)
    # The default level converts the rest, together.
    (tmp_path / "unsafe").mkdir()
    converted = harness.migrate(copy, tmp_path / "unsafe", target="tpu").read_text()
    assert 'torch.device("tpu")' in converted and "xm.optimizer_step(" not in converted


FORBIDDEN = re.compile(
    r"torch\.tpu\.(is_available|device_count|current_device|set_device|synchronize)\b|[\"']tpu:\d"
)


@pytest.fixture(scope="module")
def tpu_copies(tmp_path_factory):
    """Every program rewritten with --target tpu in one CLI run (not one run per program)."""
    return harness.migrate_many(PROGRAMS, tmp_path_factory.mktemp("tpu-target"), target="tpu")


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.stem)
def test_tpu_target_output_is_torchtpu_code(program, tpu_copies):
    text = tpu_copies[program.name].read_text()
    tree = ast.parse(text)
    assert not FORBIDDEN.search(text)
    assert unmarked_references(text) == [], program.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "init_process_group":
            backend = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "backend"), None)
            assert isinstance(backend, ast.Constant) and backend.value == "tpu_dist", program.name
    if "spawn(" in program.read_text() or "launch(" in program.read_text():
        assert 'init_process_group("tpu_dist")' in text


def test_a_broken_rule_is_caught(tmp_path, monkeypatch):
    """Mutate TPU030 so `xm.optimizer_step(opt)` becomes nothing: the harness must report it."""
    rules = tmp_path / "rules"
    shutil.copytree(ROOT / "rules", rules)
    steps = (rules / "steps.toml").read_text()
    start = steps.index("code = 'TPU030'")
    end = steps.index("[[rule]]", start)
    broken = steps[start:end].replace("transform = 'optimizer_step'\n", "")
    broken += '[rule.replace]\ntpu = "None"\nportable = "None"\n\n'
    (rules / "steps.toml").write_text(steps[:start] + broken + steps[end:])
    monkeypatch.setenv("TPU_MIGRATE_RULES_DIR", str(rules))
    result = harness.differential(harness.PROGRAMS / "p03_device_loader.py")
    assert not result.ok
    assert any("loss" in problem for problem in result.problems), result.problems
