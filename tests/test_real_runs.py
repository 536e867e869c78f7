"""Real public torch_xla scripts (fixtures/programs/real/), migrated with --target portable and
run with torch_xla blocked: the expected status of each, so progress shows and regressions fail.
See tests/real_runs.py for the harness.

EXPECTED says, for each script, either that its migrated copy runs and prints the losses of the
original ("match"), or that it fails today, with the error line it fails with and the idioms
that block it. When a conversion lands and a script starts to run, its "fails" test fails:
move it to "match" (the test then runs the original too and compares the losses)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

import real_runs as harness
from conftest import ONE_WORKER_TESTS

BLOCKED_IMPORT = "ImportError: torch_xla is blocked"


@dataclass(frozen=True)
class Expected:
    status: str            # "match" or "fails"
    error: str = ""        # for "fails": a piece of the migrated run's first error line
    why: str = ""          # for "fails": the idioms left for a human that block it


EXPECTED = {
    "test_train_mp_mnist.py": Expected("match"),
    "test_train_mp_mnist.py --ddp": Expected("match"),
    "test_train_mp_mnist_zero1.py": Expected("match"),
    "test_train_mp_mnist_fsdp_with_ckpt.py": Expected("match"),
    "train_resnet_base.py": Expected("match"),
    "train_resnet_xla_ddp.py": Expected("match"),
    "train_decoder_only_base.py": Expected("match"),
    "train_decoder_only_eager.py": Expected("match"),
    "train_decoder_only_eager_with_compile.py": Expected("match"),
    "train_decoder_only_eager_multi_process.py": Expected("match"),
}


def _key(script: harness.Script) -> str:
    """The script's name without the size flags every run passes (the mnist ones keep --ddp)."""
    return " ".join([script.path.split("/")[-1], *(a for a in script.args if a == "--ddp")])


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    return harness.Workspace(tmp_path_factory.mktemp("real-runs"))


def test_every_script_has_an_expected_status():
    assert sorted(_key(s) for s in harness.SCRIPTS) == sorted(EXPECTED)
    assert len(harness.SCRIPTS) >= 10


def test_the_scripts_that_share_a_worker_exist():
    """conftest.ONE_WORKER_TESTS names tests of this module by id: a renamed script would
    silently lose its worker (and its warm inductor cache)."""
    ids = {f"tests/test_real_runs.py::test_real_script_keeps_its_status[{_key(s)}]" for s in harness.SCRIPTS}
    pinned = [nodeid for nodeid in ONE_WORKER_TESTS if "test_real_runs.py" in nodeid]
    assert len(pinned) == 2 and set(pinned) <= ids, pinned


# The decoder scripts that compile the same model share a worker: conftest.ONE_WORKER_TESTS.
@pytest.mark.slow
@pytest.mark.parametrize("script", harness.SCRIPTS, ids=_key)
def test_real_script_keeps_its_status(script, workspace):
    expected = EXPECTED[_key(script)]
    if expected.status == "match":
        outcome = workspace.outcome(script)
        assert outcome.original_ok, "\n".join(outcome.problems)
        assert outcome.runs, outcome.error
        assert outcome.matches, "\n".join(outcome.problems)
    else:
        outcome, run = workspace.migrated_outcome(script)
        assert not outcome.runs, (
            f"{_key(script)} runs now (blocked before by: {expected.why}): mark it 'match' in EXPECTED")
        assert expected.error in outcome.error, run.output[-3000:]


# --- The instrument itself ------------------------------------------------------------------


def test_printed_values_read_the_scripts_formats():
    output = ("| Training Device=xla:0 Epoch=1 Step=0 Loss=2.30259 Rate=0.00\n"
              "epoch: 1, step: 10, loss: tensor(6.9078, device='xla:0'), rate: 3.1\n"
              "Epoch 1 test end 21:42:49, Accuracy=100.00\n")
    assert harness.printed_values(output) == [
        ("loss", 2.30259, pytest.approx(1e-5)), ("loss", 6.9078, pytest.approx(1e-4)),
        ("accuracy", 100.0, pytest.approx(1e-2))]


def test_values_match_within_the_last_printed_digit_only():
    assert harness.compare_values("Loss=2.30259\nLoss=2.10000", "Loss=2.30260\nLoss=2.10000", 1e-4) == []
    assert harness.compare_values("Loss=2.30259", "Loss=2.30300", 1e-4) != []  # a real difference
    assert harness.compare_values("Loss=2.30259\nLoss=2.1", "Loss=2.30259", 1e-4) != []  # a step missing
    assert harness.compare_values("no numbers", "no numbers", 1e-4) == ["the original printed no loss"]


SOURCE = '''import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.distributed.spmd as xs
from torch_xla.distributed.fsdp import XlaFullyShardedDataParallel as FSDP

device = xm.xla_device()
xs.mark_sharding(t, mesh, ("data", None))
model = FSDP(model)
torch_xla.sync()
'''


def test_references_are_resolved_to_qualified_names():
    assert harness.xla_references(SOURCE) == [
        (6, "torch_xla.core.xla_model.xla_device"),
        (7, "torch_xla.distributed.spmd.mark_sharding"),
        (8, "torch_xla.distributed.fsdp.XlaFullyShardedDataParallel"),
        (9, "torch_xla.sync"),
    ]
    assert harness.imports_xla(SOURCE) and not harness.imports_xla("import torch\n")


def test_share_counts_spmd_and_fsdp_apart(tmp_path):
    (tmp_path / "a.py").write_text(SOURCE)
    (tmp_path / "plain.py").write_text("import torch\n")
    result = harness.share([tmp_path])
    assert result.files == 1
    assert result.before == {"other": 2, "spmd/fsdp": 2}
    assert result.converted("other") == (2, 2)       # xla_device and sync are converted
    assert result.converted("spmd/fsdp") == (1, 2)   # FSDP is converted (TPU173), sharding left for a human
