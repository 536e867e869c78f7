"""The trees the project passes parse of the run's own files go to the rewrite, which parses
those files no more (rewrite/parsed_trees.py): taken once, unchanged by either side, and the
output is what a fresh parse gives."""

from __future__ import annotations

import ast

from click.testing import CliRunner

from tpu_migrate import cli
from tpu_migrate.rewrite import parsed_trees

# Parsed by the SPMD pass (it imports the SPMD module) and by the launch pass (it calls xmp.spawn).
SPMD_PROGRAM = """\
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr

import helpers

xr.use_spmd()
print(xr.world_size(), helpers.rank())
"""
LAUNCH = """\
import torch_xla.core.xla_model as xm
import torch_xla.distributed.xla_multiprocessing as xmp

import helpers


def fit(index):
    print(xm.get_ordinal(), helpers.rank())


if __name__ == "__main__":
    xmp.spawn(fit)
"""
HELPERS = "import torch_xla.runtime as xr\n\n\ndef rank():\n    return xr.global_ordinal()\n"


def _project(tmp_path):
    (tmp_path / "pyproject.toml").write_text("")
    for name, text in {"train.py": SPMD_PROGRAM, "launch.py": LAUNCH, "helpers.py": HELPERS}.items():
        (tmp_path / name).write_text(text)


def _diff(*paths) -> str:
    result = CliRunner().invoke(cli.main, ["rewrite", "--diff", "--jobs", "1", "--no-cache", *map(str, paths)])
    assert result.exit_code == 1, result.output
    return result.stdout


def test_the_rewrite_takes_the_passes_trees_unchanged_and_prints_what_a_fresh_parse_gives(tmp_path, monkeypatch):
    _project(tmp_path)
    taken = {}
    take = parsed_trees.take

    def recorded(data):
        tree = take(data)
        if tree is not None:
            taken[data.decode()] = tree
        return tree

    monkeypatch.setattr(parsed_trees, "take", recorded)
    lent = _diff(tmp_path)
    assert sorted(taken) == sorted([SPMD_PROGRAM, LAUNCH, HELPERS])  # helpers: the SPMD program imports it
    for text, tree in taken.items():  # after both the passes and the rewrite read it
        assert ast.dump(tree, include_attributes=True) == ast.dump(ast.parse(text), include_attributes=True)
    assert parsed_trees.kept(SPMD_PROGRAM.encode()) is None  # forgotten after the run
    assert "TPU" in lent and "xr.world_size()" in lent
    monkeypatch.setattr(parsed_trees, "take", lambda data: None)
    assert _diff(tmp_path) == lent


def test_only_the_run_s_own_files_are_kept(tmp_path, monkeypatch):
    _project(tmp_path)
    kept = []
    keep = parsed_trees.keep
    monkeypatch.setattr(parsed_trees, "keep", lambda path, data, tree: keep(path, data, tree) or kept.extend(
        parsed_trees._trees))
    _diff(tmp_path / "helpers.py")  # the passes still parse train.py and launch.py: not for the rewrite
    assert SPMD_PROGRAM.encode() not in kept and LAUNCH.encode() not in kept
