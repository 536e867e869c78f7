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


def _summary(analysis) -> list:
    """What `analyze` found of each statement, by position (ast nodes compare by identity)."""
    return sorted((info.node.lineno, info.node.col_offset, type(info.node).__name__, info.flagged, info.trigger_string,
                   info.forced, info.subtree_interesting, [repr(ref) for ref in info.refs])
                  for info in analysis.infos.values())


def test_the_launch_pass_s_analysis_goes_to_the_rewrite_as_analyze_makes_it_without_a_cache(tmp_path, monkeypatch):
    """The launch pass analyses the files it reads with the rewrite's arguments where no cache
    can answer (the rewrite's code loads anyway), and the rewrite takes that analysis: the same
    as its own analysis, and the same output without it. With the cache on, none is lent."""
    from tpu_migrate.rewrite.engine import analysis_arguments
    from tpu_migrate.rewrite.names import analyze
    from tpu_migrate.rules import load_catalog

    _project(tmp_path)
    taken = []
    take = parsed_trees.take_analysis

    def recorded(tree, arguments):
        analysis = take(tree, arguments)
        if analysis is not None:
            assert arguments == analysis_arguments(load_catalog())
            assert _summary(analysis) == _summary(analyze(tree, *arguments))
            taken.append(analysis.tree)
        return analysis

    monkeypatch.setattr(parsed_trees, "take_analysis", recorded)
    lent = _diff(tmp_path)
    assert [ast.dump(tree) for tree in taken] == [ast.dump(ast.parse(LAUNCH))]  # the file that launches
    monkeypatch.setattr(parsed_trees, "take_analysis", lambda tree, arguments: None)
    assert _diff(tmp_path) == lent
    taken.clear()
    monkeypatch.setattr(parsed_trees, "take_analysis", recorded)
    monkeypatch.setenv("TPU_MIGRATE_CACHE_DIR", str(tmp_path / "cache"))
    result = CliRunner().invoke(cli.main, ["rewrite", "--diff", "--jobs", "1", str(tmp_path)])
    assert result.stdout == lent and taken == []
