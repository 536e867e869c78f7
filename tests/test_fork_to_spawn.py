"""`xmp.spawn(..., start_method="fork")` becomes spawn, since TorchTPU cannot run in a forked
process. A forked worker had everything its parent had. A spawned worker imports the file
under another name, so a notebook's cells and a script's `if __name__ == "__main__":` block
never run there. A launch whose worker needs what only those define gets a TODO saying which
names. The slow test runs the original and the migration to show that the TODO marks a real
difference.

The rewrite fixtures (TPU060-spawn/fork_main_guard) show the script cases, one by one."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

import differential as harness
from tpu_migrate.rewrite.context import Options
from tpu_migrate.rewrite.notebooks import rewrite_notebook

PROGRAM = harness.PROGRAMS / "differs" / "d01_fork_worker_in_main_guard.py"


def _notebook(*sources: str) -> bytes:
    import nbformat

    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in sources]
    return nbformat.writes(notebook).encode()


def test_a_forked_launch_in_a_notebook_says_its_workers_must_move_to_a_module():
    data = _notebook("import torch_xla.core.xla_model as xm\nimport torch_xla.distributed.xla_multiprocessing as xmp",
                     "def _mp_fn(index):\n    print(index, xm.xla_device())",
                     "xmp.spawn(_mp_fn, start_method='fork')")
    result = rewrite_notebook(data, "train.ipynb", Options(target="tpu"))
    todos = [m for m in result.manual if m.code == "TPU060"]
    assert [(m.cell, m.line) for m in todos] == [(2, 1)]
    assert "cannot import what a notebook defines (`_mp_fn`, `_xmp_worker`)" in todos[0].message
    # A `__main__` guard would not help there: the script advice is not given.
    assert "__main__" not in todos[0].message


def test_a_notebook_launch_that_spawned_already_gets_no_fork_todo():
    data = _notebook("import torch_xla.distributed.xla_multiprocessing as xmp\ndef _mp_fn(index):\n    print(index)",
                     "xmp.spawn(_mp_fn)")
    result = rewrite_notebook(data, "train.ipynb", Options(target="tpu"))
    assert not [m for m in result.manual if m.code == "TPU060"]


@pytest.mark.slow  # the torch_xla original and two migrated runs
def test_the_todo_marks_a_launch_whose_spawned_workers_lack_the_main_blocks_names(tmp_path):
    migrated = harness.migrate(PROGRAM, tmp_path)
    launch = migrated.read_text().splitlines()
    todo = next(i for i, line in enumerate(launch) if "TODO(tpu-migrate): TPU060 start_method='fork'" in line)
    assert "`_mp_fn` (the worker), `SCALE` (read by `train`)" in launch[todo]
    assert launch[todo + 1].strip() == "if dist.is_torchelastic_launched():"  # on the launch itself
    with ThreadPoolExecutor(2) as pool:
        original = pool.submit(harness.run_original_mp, PROGRAM)
        spawned = pool.submit(harness.run_migrated_mp, migrated, tmp_path, fake_accelerators=2)
        under_torchrun = pool.submit(harness.run_migrated_mp, migrated, tmp_path, launcher=harness.torchrun(2))
    original, spawned, under_torchrun = original.result(), spawned.result(), under_torchrun.result()
    assert original.returncode == 0 and original.records == [{"step": 0, "loss": 6.0, "@": "@step"}], original.output
    # Spawned workers (one per device of a 2-device host) cannot find the worker.
    assert spawned.returncode != 0 and not spawned.records, spawned.output
    assert "Can't get attribute '_mp_fn'" in spawned.output, spawned.output
    # torchrun runs the worker in its own processes, after the block ran: the original's meaning.
    assert under_torchrun.returncode == 0 and under_torchrun.records == original.records * 2, under_torchrun.output
