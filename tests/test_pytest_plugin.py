"""The pytest plugin, through pytester: a real inner pytest run that loads the plugin through its
installed `pytest11` entry point."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow  # inner pytest runs of torch programs under the tracer

pytest_plugins = ["pytester"]

HEADER = '''
import pytest
import torch
import torch_xla

device = torch_xla.device()
'''


def run(pytester, body: str):
    pytester.makepyfile(test_training=HEADER + body)
    return pytester.runpytest_subprocess("-q")


# The torch_xla backend's inner tests, in one inner run: each inner pytest that imports torch_xla
# starts in 6-8 s of CPU, and the plugin diagnoses each marked test on its own. Their graphs
# differ (no test finds another's compiled), so each compiles as it would alone.
XLA_TESTS = '''
@pytest.mark.tpu_diagnose(fail_on=("sync",))
def test_logs_every_step():
    w = torch.ones(4, device=device)
    for step in range(4):
        w = w * 0.5
        torch_xla.sync()
        print(w.sum().item())  # the sync


@pytest.mark.tpu_diagnose(fail_on=("recompile",), warmup_steps=2)
def test_shapes_change():
    for size in (8, 8, 8, 5):
        x = torch.ones(size, 4, device=device) * 2
        torch_xla.sync()  # the recompile


@pytest.mark.tpu_diagnose
def test_stays_on_device():
    w = torch.ones(6, device=device)
    for step in range(5):
        w = w * 0.25
        torch_xla.sync()
    assert w.sum().item() > 0  # one read after the loop is fine


def test_unmarked_may_sync():
    for step in range(3):
        torch_xla.sync()
        torch.ones(2, device=device).sum().item()
'''


def test_the_xla_backend_fails_a_sync_and_a_recompile_after_warm_up_and_passes_clean_loops(pytester, monkeypatch):
    """A sync in the loop fails its test with the finding; a recompile after warm-up fails its
    test; a clean loop and an unmarked test pass."""
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    result = run(pytester, XLA_TESTS)
    lines = (pytester.path / "test_training.py").read_text().splitlines()  # as makepyfile wrote it
    sync, recompile = (1 + next(i for i, line in enumerate(lines) if line.endswith(f"# the {what}"))
                       for what in ("sync", "recompile"))
    result.assert_outcomes(failed=2, passed=2)
    # Each finding in its own test's failure.
    result.stdout.fnmatch_lines(["*_ test_logs_every_step _*", "*tpu-migrate diagnose: 1 finding(s)*",
                                 f"*test_training.py:{sync}: sync: host sync `item`*",
                                 "*_ test_shapes_change _*",
                                 f"*test_training.py:{recompile}: recompile: recompiled 1 time(s)*"])


def test_native_eager_sync_every_step_fails_and_a_compiled_recompile_after_warm_up_fails(pytester):
    """Without torch_xla the native backend traces the test: the CPU stands in for the TPU. A
    sync every step fails its test, a clean eager loop passes, and a torch.compile recompile after
    warm-up fails its test (in one inner run: each inner pytest start imports torch)."""
    pytester.makepyfile(test_eager='''
import pytest
import torch

@pytest.mark.tpu_diagnose(fail_on=("sync",))
def test_eager_cpu():
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(4):
        loss = model(torch.ones(2, 3)).sum()
        loss.backward()
        optimizer.step()
        print(float(loss))  # the sync


@pytest.mark.tpu_diagnose
def test_clean_eager_loop_passes():
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    for _ in range(4):
        model(torch.ones(2, 3)).sum().backward()
        optimizer.step()


@pytest.mark.tpu_diagnose(fail_on=("recompile",), warmup_steps=2)
def test_compiled_shapes_change():
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    forward = torch.compile(model, backend="aot_eager")  # Dynamo recompiles alike; no C++ builds
    for batch in (8, 8, 8, 5):
        forward(torch.ones(batch, 4)).sum().backward()  # the recompile
        optimizer.step()
''')
    result = pytester.runpytest_subprocess("-q")
    lines = (pytester.path / "test_eager.py").read_text().splitlines()
    sync, recompile = (1 + next(i for i, line in enumerate(lines) if line.endswith(f"# the {what}"))
                       for what in ("sync", "recompile"))
    result.assert_outcomes(failed=2, passed=1)
    result.stdout.fnmatch_lines(["*_ test_eager_cpu _*", f"*test_eager.py:{sync}: sync: host sync `float`*",
                                 "*_ test_compiled_shapes_change _*",
                                 f"*test_eager.py:{recompile}: recompile: torch.compile recompiled the compiled code "
                                 "called here*for a new input shape*dimension 0 changed (8 -> 5)*"])


def test_unknown_kind_is_a_usage_error(pytester):
    pytester.makepyfile(test_bad='''
import pytest

@pytest.mark.tpu_diagnose(fail_on=("slowness",))
def test_x():
    pass
''')
    result = pytester.runpytest_subprocess("-q")
    assert result.ret != 0
    assert "unknown kind(s) ['slowness']" in "\n".join(result.stdout.lines + result.stderr.lines)


def test_native_whole_compiled_training_step_does_not_hang(pytester):
    """The plugin traces in-process with the same compile callbacks as the CLI: a training step
    compiled whole (backward and optimizer inside) once deadlocked them."""
    pytester.makepyfile(test_whole_step='''
import pytest
import torch

@pytest.mark.tpu_diagnose(fail_on=("recompile",), warmup_steps=2)
def test_whole_step_compiled():
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    @torch.compile(backend="aot_eager")
    def train_step(x):
        model(x).sum().backward()
        optimizer.step()
        optimizer.zero_grad()

    for batch in (8, 8, 8, 5):
        train_step(torch.ones(batch, 4))
''')
    result = pytester.runpytest_subprocess("-q", timeout=300)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*test_whole_step.py:10: recompile: torch.compile recompiled `train_step`*for a new input shape*dimension 0 changed*"])
