"""The static fidelity pass (tests/static_fidelity.py): each check on small input / output pairs
(it catches its violation and passes what it must), then every realistic, corpus, program and
example file rewritten in-process for both targets."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from static_fidelity import (
    altered_manual_calls,
    edited_workers,
    inputs,
    launched_functions,
    rewrite,
    static_problems,
    unmarked_xla_uses,
)
from tpu_migrate.findings import FileResult, Fix, Manual


def src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


WORKER_IN = src("""
    import torch
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.xla_multiprocessing as xmp
    import torch_xla.distributed.parallel_loader as pl

    def _mp_fn(index, loader):
        torch.manual_seed(index)
        device = xm.xla_device()
        train_loader = pl.MpDeviceLoader(loader, device)
        for x in train_loader:
            print(x.sum(),
                  index)
        xm.mark_step()

    if __name__ == "__main__":
        xmp.spawn(_mp_fn, args=(None,))
""")


def test_launched_functions_follow_imports_and_names():
    assert launched_functions(WORKER_IN) == {"_mp_fn"}
    text = src("""
        import torch.multiprocessing as mp
        import torch_xla
        def a(i): pass
        def b(i): pass
        def c(i): pass
        fn = c
        torch_xla.launch(a)
        mp.spawn(b, nprocs=2)
        mp.spawn(fn)
        other.spawn(a)
    """)
    assert launched_functions(text) == {"a", "b", "c"}


def test_worker_conversions_inside_pass():
    out = src("""
        import torch

        def _mp_fn(index, loader):
            torch.manual_seed(index)
            device = torch.device("tpu")
            for x in loader:
                x = x.to(device)
                print(x.sum(),
                      index)

        if __name__ == "__main__":
            launch()
    """)
    assert edited_workers(WORKER_IN, out) == []


def test_lines_added_to_a_worker_are_caught():
    out = src("""
        import torch

        def _mp_fn(index, loader):
            dist.init_process_group("tpu_dist")
            torch.manual_seed(index)
            device = torch.device("tpu")
            for x in loader:
                print(x.sum(),
                      index)
    """)
    [problem] = edited_workers(WORKER_IN, out)
    assert "added `dist.init_process_group(\"tpu_dist\")`" in problem


def test_a_changed_torch_xla_free_statement_is_caught():
    out = src("""
        import torch

        def _mp_fn(index, loader):
            torch.manual_seed(index + 1)
            device = torch.device("tpu")
            for x in loader:
                print(x.sum(),
                      index)
    """)
    [problem] = edited_workers(WORKER_IN, out)
    assert "torch.manual_seed(index)" in problem and "changed or gone" in problem


def test_reindented_statements_compare_equal():
    before = src("""
        import torch_xla
        def _mp_fn(index):
            with torch_xla.step():
                print(index,
                      index)
        torch_xla.launch(_mp_fn)
    """)
    after = src("""
        def _mp_fn(index):
            print(index,
                  index)
    """)
    assert edited_workers(before, after) == []


def test_a_branch_of_a_torch_xla_test_the_output_answered_may_go_or_move():
    """Target tpu knows the device kind: `if xm.xla_device_hw(d) in (...)` keeps only the branch
    that runs, one level out. The other branch of such a test may go; a statement of an `if`
    the output still has, or of the program's own test, may not."""
    before = src("""
        import torch_xla
        import torch_xla.core.xla_model as xm
        def _mp_fn(index):
            if xm.xla_device_hw(torch_xla.device()) in ("TPU", "NEURON"):
                print(index,
                      index)
            else:
                print("not a TPU")
            if index:
                print("kept")
        torch_xla.launch(_mp_fn)
    """)
    folded = src("""
        def _mp_fn(index):
            print(index,
                  index)
            if index:
                print("kept")
    """)
    assert edited_workers(before, folded) == []
    dropped_own = folded.replace('    if index:\n        print("kept")\n', "")
    [problem] = edited_workers(before, dropped_own)
    assert '<If> if index:' in problem


def _result(fixes=(), manual=()) -> FileResult:
    return FileResult(path="case.py", fixes=list(fixes), manual=list(manual))


def test_altered_manual_call_is_caught():
    before = "import torch_xla.core.xla_model as xm\nxm.add_step_closure(f, args=(a,))\n"
    after = "import torch_xla.core.xla_model as xm\n# TODO(tpu-migrate): TPU165 ...\nxm.add_step_closure(f, args=(b,))\n"
    manual = Manual(code="TPU165", message="m", line=2, col=1)
    [problem] = altered_manual_calls(before, after, _result(manual=[manual]))
    assert "xm.add_step_closure(f, args=(a,))" in problem
    kept = after.replace("(b,)", "(a,)")
    assert altered_manual_calls(before, kept, _result(manual=[manual])) == []
    # A call converted with a TODO for what differs is not a call left manual.
    fix = Fix(code="TPU060", line=2, col=1)
    assert altered_manual_calls(before, after, _result(fixes=[fix], manual=[manual])) == []


def test_unmarked_torch_xla_use_is_caught():
    after = src("""
        import torch_xla.core.xla_model as xm
        # TODO(tpu-migrate): TPU151 ...
        print(xm.metrics_report())
        def f(xm):
            return xm.value  # a parameter, not the import
        xm.get_ordinal()
    """)
    [problem] = unmarked_xla_uses(after, after)
    assert problem.startswith("line 6: xm.get_ordinal()")


def test_a_binding_the_rewrite_left_unused_is_caught():
    before = "import torch_xla.core.xla_model as xm\nd = xm.xla_device()\n"
    after = "import torch\nimport torch_xla.core.xla_model as xm\nd = torch.device('tpu')\n"
    [problem] = unmarked_xla_uses(before, after)
    assert "stale import" in problem and "no longer used" in problem


# --------------------------------------------------------------------------------------------
# Every whole file, both targets: the rewrites run once for the module.

INPUTS = inputs()
TARGETS = ("tpu", "portable")


@pytest.fixture(scope="module")
def problems() -> dict[tuple[str, str], dict[str, list[str]]]:
    found = {}
    for path in INPUTS:
        data = path.read_bytes()
        for target in TARGETS:
            output, result = rewrite(data, path.name, target)
            found[(str(path), target)] = static_problems(data.decode("utf-8"), output.decode("utf-8"), result)
    return found


def test_the_inputs_are_there():
    names = {p.parent.name for p in INPUTS}
    assert {"realistic", "corpus", "examples", "multiprocess"} <= names
    assert len(INPUTS) >= 60


@pytest.mark.parametrize("target", TARGETS)
def test_every_file_keeps_its_meaning_statically(problems, target):
    failures = [
        f"{Path(path).relative_to(Path(__file__).resolve().parent.parent)} [{target}] {kind}: {problem}"
        for (path, t), by_check in problems.items() if t == target
        for kind, found in by_check.items() for problem in found
    ]
    assert failures == []


def test_a_todo_above_the_first_statement_of_a_block_is_not_an_edit():
    before = src("""
        import torch_xla.core.xla_model as xm
        import torch_xla
        def _mp_fn(index):
            for step in range(3):
                xm.add_step_closure(print, args=(step,))
                print(step)
        torch_xla.launch(_mp_fn)
    """)
    after = src("""
        import torch_xla.core.xla_model as xm
        def _mp_fn(index):
            for step in range(3):
                # TODO(tpu-migrate): TPU165 ...
                xm.add_step_closure(print, args=(step,))
                print(step)
    """)
    assert edited_workers(before, after) == []
