"""A launch that stays torch_xla's in another module of the project (rewrite/kept_launches.py):
the converted collectives and rank reads it runs see a world of one until it is ported, and
carry a TODO that says so; under a converted launch they carry none."""

from __future__ import annotations

import os

from tpu_migrate.rewrite.context import Options
from tpu_migrate.rewrite.engine import rewrite_bytes
from tpu_migrate.rewrite.kept_launches import kept_launch_modules

# Lightning's shape: the strategy imports its launcher, whose xmp.spawn of a bound method TPU060
# leaves to a human.
LAUNCHER = """\
import torch_xla.distributed.xla_multiprocessing as xmp


class Launcher:
    def launch(self, function):
        xmp.spawn(self._wrapping_function, args=(function,))

    def _wrapping_function(self, index, function):
        function()
"""
STRATEGY = """\
import torch_xla.core.xla_model as xm

from lib.launchers.xla import Launcher


class Strategy:
    def __init__(self):
        self.launcher = Launcher()

    def barrier(self):
        xm.rendezvous("barrier")
"""
HELPERS = """\
import torch_xla.runtime as xr


def shard(items):
    return items[xr.global_ordinal()::xr.world_size()]


class XLAHelper:
    def rank(self):
        return xr.global_ordinal()
"""
KEPT_TRAIN = """\
import torch_xla.distributed.xla_multiprocessing as xmp

import helpers


class Trainer:
    def fit(self, index):
        helpers.shard(list(range(8)))

    def run(self):
        xmp.spawn(self.fit)
"""
CONVERTED_TRAIN = """\
import torch_xla.distributed.xla_multiprocessing as xmp

import helpers


def _mp_fn(index):
    helpers.shard(list(range(8)))


if __name__ == "__main__":
    xmp.spawn(_mp_fn)
"""
TODO = "# TODO(tpu-migrate): "


def _write(root, files: dict[str, str]) -> list[str]:
    (root / "pyproject.toml").write_text("")
    paths = []
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        paths.append(str(path))
    return paths


def _rewrite(path: str, text: str, kept) -> str:
    return rewrite_bytes(text.encode(), path, Options(kept_launches=kept)).output.decode()


def test_a_module_that_imports_a_launcher_kept_torch_xla_s_marks_its_collectives(tmp_path):
    _, strategy = _write(tmp_path, {"lib/launchers/xla.py": LAUNCHER, "lib/strategy.py": STRATEGY})
    kept = kept_launch_modules([], tmp_path)
    assert [(os.path.relpath(path, tmp_path), why) for path, why in kept] == [
        ("lib/strategy.py", "this file imports lib/launchers/xla.py, whose launch `xmp.spawn` stays torch_xla's")]
    lines = _rewrite(strategy, STRATEGY, kept).splitlines()
    barrier = next(i for i, line in enumerate(lines) if "dist.barrier()" in line)
    todo = lines[barrier - 2].strip()
    assert todo.startswith(TODO + "TPU106 torch_xla reduced across every process without a process group; "
                           "this file imports lib/launchers/xla.py, whose launch `xmp.spawn` stays torch_xla's "
                           "and creates none"), lines
    assert todo.endswith("or this collective reaches this process alone")


def test_a_module_a_kept_launch_imports_marks_its_rank_reads(tmp_path):
    helpers, _ = _write(tmp_path, {"helpers.py": HELPERS, "train.py": KEPT_TRAIN})
    kept = kept_launch_modules([], tmp_path)
    assert [(os.path.basename(path), why) for path, why in kept] == [
        ("helpers.py", "train.py imports this module and launches with `xmp.spawn`, which stays torch_xla's")]
    output = _rewrite(helpers, HELPERS, kept)
    todos = [line.strip() for line in output.splitlines() if TODO in line]
    assert [todo.split()[2] for todo in todos] == ["TPU021", "TPU020", "TPU021"], output
    assert all("every process reads rank 0 of 1 here" in todo for todo in todos)
    # Without the project pass nothing shows a launch: the function's reads are not marked (the
    # class named for XLA is: a library's torch_xla backend).
    alone = _rewrite(helpers, HELPERS, ())
    assert [line.strip().split()[2] for line in alone.splitlines() if TODO in line] == ["TPU021"], alone


def test_under_a_converted_launch_nothing_is_marked(tmp_path):
    helpers, _ = _write(tmp_path, {"helpers.py": HELPERS, "train.py": CONVERTED_TRAIN})
    kept = kept_launch_modules([], tmp_path)
    assert [(os.path.basename(path), why) for path, why in kept] == [("helpers.py", "")]
    output = _rewrite(helpers, HELPERS, kept)
    assert TODO not in output and "_rank()" in output, output


def test_a_project_without_a_launch_is_not_read_further(tmp_path):
    _write(tmp_path, {"helpers.py": HELPERS, "lib/strategy.py": STRATEGY})
    assert kept_launch_modules([], tmp_path) == ()


def test_a_file_that_names_pjrt_but_no_launcher_is_not_parsed(tmp_path, monkeypatch):
    """torch_xla's own modules say pjrt without calling a launcher: a plain source file that does
    not spell a launcher's name (spawn, launch, run_multiprocess, spawn_threads) whole cannot
    launch, and is not parsed; one that does still is."""
    from tpu_migrate.rewrite import project as project_files

    _write(tmp_path, {"runtime.py": "import torch_xla._internal.pjrt as pjrt\n\nDEVICES = pjrt.devices()\n",
                      "spawned.py": "import torch_xla._internal.pjrt as pjrt\n\npjrt.spawn_threads(print)\n",
                      "launched.py": "import torch_xla\n\n# see torch_xla.launcher\n"})
    parsed = []
    parse = project_files.parse
    monkeypatch.setattr(project_files, "parse", lambda path, *rest: parsed.append(path) or parse(path, *rest))
    assert kept_launch_modules([], tmp_path) == ()
    assert sorted(map(os.path.basename, parsed)) == ["spawned.py"]


def test_a_file_s_launches_and_process_groups_are_found_once(monkeypatch):
    """make_plans finds what each launch starts and the file's init_process_group calls; the
    kept-launch TODOs read them from its Plans (each was found again per file)."""
    from tpu_migrate.rewrite import kept_launches, plans

    asked = []
    spawn_worker, group_calls = plans.spawn_worker, plans.init_process_group_calls
    for module in (plans, kept_launches):
        monkeypatch.setattr(module, "spawn_worker", lambda call, *rest: asked.append(id(call)) or spawn_worker(call, *rest))
        monkeypatch.setattr(module, "init_process_group_calls",
                            lambda nodes: asked.append("groups") or group_calls(nodes), raising=False)
    source = ("import torch_xla.distributed.xla_multiprocessing as xmp\nimport torch_xla.runtime as xr\n\n\n"
              "class Trainer:\n    def fit(self, index):\n        print(xr.global_ordinal(), xr.world_size())\n\n"
              "    def run(self):\n        xmp.spawn(self.fit)\n")
    output = rewrite_bytes(source.encode(), "train.py", Options()).output.decode()
    assert "this file's launch is left to you" in output
    assert sorted(asked, key=str) == sorted(set(asked), key=str) and asked.count("groups") == 1, asked
