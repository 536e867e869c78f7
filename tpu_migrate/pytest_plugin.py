"""pytest plugin: guard a test's TPU performance with `@pytest.mark.tpu_diagnose`.

    @pytest.mark.tpu_diagnose(fail_on=("recompile", "sync"), warmup_steps=2)
    def test_training_loop_stays_on_device():
        train(steps=10)

The test body runs under the diagnose tracer, in the test's own process: the torch_xla backend
for torch_xla code, the native one (eager and torch.compile) otherwise. The test fails when it
has findings of the kinds `fail_on` names (default: all of them): recompiles after warm-up,
host syncs step after step, data-dependent shapes, CPU fallbacks, and for native code graph
breaks, a hit recompile limit, ops TorchTPU cannot run and calls that raise on TorchTPU.
The findings are in the failure message. Installed with tpu-migrate (entry point `pytest11`).
"""

from __future__ import annotations

import shutil
import tempfile

import pytest

from tpu_migrate.diagnose.kinds import FAIL_KINDS as KINDS


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers",
        "tpu_diagnose(fail_on=('recompile', 'graph-break', 'sync', ...), warmup_steps=2): "
        "fail the test when tpu-migrate diagnose finds these in its body",
    )


# New-style hook wrappers need pytest >= 8. Installing tpu-migrate must never break an older
# pytest: there, the marker is registered but does nothing.
_ACTIVE = int(pytest.__version__.split(".")[0]) >= 8


def _runtest_call(item):
    marker = item.get_closest_marker("tpu_diagnose")
    if marker is None:
        return (yield)
    from tpu_migrate.diagnose import analysis, inprocess
    from tpu_migrate.diagnose.events import read_events
    from tpu_migrate.diagnose.runner import Evidence

    fail_on = tuple(marker.kwargs.get("fail_on", KINDS))
    unknown = set(fail_on) - set(KINDS)
    if unknown:
        raise pytest.UsageError(f"tpu_diagnose: unknown kind(s) {sorted(unknown)}; use {KINDS}")
    warmup_steps = int(marker.kwargs.get("warmup_steps", 2))
    directory = tempfile.mkdtemp(prefix="tpu-migrate-pytest-")
    try:
        with inprocess.InProcess(directory, warmup_steps) as traced:
            result = yield
        evidence = Evidence(exit_code=0, events=read_events(traced.directory))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    findings, steps = analysis.analyze(evidence, warmup_steps)
    failing = [f for f in findings if f.kind in fail_on]
    if failing:
        lines = [f"tpu-migrate diagnose: {len(failing)} finding(s) in {steps} steps (warm-up {warmup_steps}):"]
        lines += [f"  {f.file}:{f.line}: {f.kind}: {f.message}" for f in failing]
        pytest.fail("\n".join(lines), pytrace=False)
    return result


if _ACTIVE:
    pytest_runtest_call = pytest.hookimpl(wrapper=True)(_runtest_call)
