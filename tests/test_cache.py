"""The rewrite result cache, through the real CLI: reuse, identical output, invalidation, damage.

Every test here gets its own TPU_MIGRATE_CACHE_DIR (the suite's is a temporary directory too). `--verbose` says on stderr how many
files came from the cache; the strongest proof that a cached file is not processed again is
`test_a_cached_file_is_not_processed_again`, which edits a stored finding and sees it printed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from tpu_migrate.findings import FileResult
from tpu_migrate.rewrite import cache as result_cache

pytestmark = pytest.mark.slow  # the CLI as a subprocess, concurrent runs

XLA = "import torch_xla.core.xla_model as xm\n\ndevice = xm.xla_device()\nxm.mark_step()\n"
MANUAL = "import torch_xla.core.xla_model as xm\n\nxm.collective_permute(t, [(0, 1)])\n"
CLEAN = "import torch\n\nx = torch.ones(2)\n"
NEAR_MISS = "# tuned with XLA_FLAGS\nimport torch\n"
# Migrated, with open manual work: no torch_xla marker left, only our TODO comment.
OPEN_TODO = "import os\n\n# TODO(tpu-migrate): TPU060 start the workers by hand\nos.getpid()\n"
NOTEBOOK = {
    "cells": [
        {"cell_type": "markdown", "id": "c0", "metadata": {}, "source": ["# Train"]},
        {"cell_type": "code", "id": "c1", "execution_count": None, "metadata": {}, "outputs": [],
         "source": ["import torch_xla.core.xla_model as xm\n", "device = xm.xla_device()"]},
        {"cell_type": "code", "id": "c2", "execution_count": None, "metadata": {}, "outputs": [],
         "source": ["xm.collective_permute(t, [(0, 1)])"]},
    ],
    "metadata": {}, "nbformat": 4, "nbformat_minor": 5,
}


@pytest.fixture(autouse=True)
def own_cache_dir(tmp_path_factory, monkeypatch):
    """Each test here starts with an empty cache of its own."""
    monkeypatch.setenv("TPU_MIGRATE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))


@pytest.fixture
def project(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "train.py").write_text(XLA)
    (src / "pkg" / "manual.py").write_text(MANUAL)
    (src / "pkg" / "clean.py").write_text(CLEAN)
    (src / "pkg" / "near_miss.py").write_text(NEAR_MISS)
    (src / "pkg" / "broken.py").write_text("import torch_xla\ndef (:\n")
    (src / "nb.ipynb").write_text(json.dumps(NOTEBOOK))
    return tmp_path


def cache_dir() -> Path:
    return Path(os.environ["TPU_MIGRATE_CACHE_DIR"])


def cache_files() -> list[Path]:
    return sorted(cache_dir().glob("rewrite-*.json")) if cache_dir().exists() else []


def from_cache(result) -> int:
    match = re.search(rb"(\d+) file\(s\), (\d+) from the cache", result.stderr)
    assert match, result.stderr
    return int(match[2])


def without_verbose_line(stderr: bytes) -> bytes:
    """stderr without what -v adds: the configuration in use and the cache's line."""
    return b"".join(line for line in stderr.splitlines(keepends=True)
                    if b"from the cache" not in line and not line.startswith(b"configuration: "))


def test_a_second_run_takes_every_file_from_the_cache(cli, project):
    first = cli("rewrite", "--check", "-v", "src", cwd=project)
    assert first.returncode == 2, first.stderr  # broken.py: a syntax error
    assert from_cache(first) == 0
    assert len(cache_files()) == 1
    second = cli("rewrite", "--check", "-v", "src", cwd=project)
    # Every file but the one with an error (errors are never stored).
    assert from_cache(second) == 5
    assert (second.returncode, second.stdout) == (first.returncode, first.stdout)
    assert without_verbose_line(second.stderr) == without_verbose_line(first.stderr)


def test_a_cached_file_is_not_processed_again(cli, project):
    assert cli("rewrite", "--check", "src/pkg/manual.py", cwd=project).returncode == 1
    [path] = cache_files()
    document = json.loads(path.read_text())
    [entry] = [e for key, e in document["files"].items() if key.endswith("manual.py")]
    entry[8][0][3] = "a message only the cache knows"
    path.write_text(json.dumps(document))
    again = cli("rewrite", "--check", "src/pkg/manual.py", cwd=project)
    assert b"TPU109 a message only the cache knows" in again.stdout
    fresh = cli("rewrite", "--check", "--no-cache", "src/pkg/manual.py", cwd=project)
    assert b"a message only the cache knows" not in fresh.stdout
    assert b"TPU109 `xm.collective_permute`" in fresh.stdout


def test_the_migration_report_takes_the_kept_imports_from_the_cache(cli, project):
    """The workers find the torch_xla imports a file keeps; a warm run does not recompute them."""
    first = json.loads(cli("rewrite", "--check", "--format", "json", "src/pkg/manual.py", cwd=project).stdout)
    assert first["migration"]["blocked"] == [
        {"path": "src/pkg/manual.py", "imports": [{"line": 1, "module": "torch_xla.core.xla_model"}]}]
    [path] = cache_files()
    document = json.loads(path.read_text())
    [entry] = [e for key, e in document["files"].items() if key.endswith("manual.py")]
    assert entry[10] is True  # the input imports torch_xla
    entry[11][0][1] = "a.module.only.the.cache.knows"
    path.write_text(json.dumps(document))
    again = json.loads(cli("rewrite", "--check", "--format", "json", "src/pkg/manual.py", cwd=project).stdout)
    assert again["migration"]["blocked"][0]["imports"][0]["module"] == "a.module.only.the.cache.knows"
    assert again["migration"]["files_with_xla"] == 1


@pytest.mark.parametrize("output_format", ["text", "json", "sarif", "github"])
@pytest.mark.parametrize("mode", ["--check", "--diff"])
def test_output_is_identical_with_and_without_the_cache(cli, project, mode, output_format):
    args = ("rewrite", mode, "--format", output_format, "src")
    plain = cli(*args, "--no-cache", cwd=project)
    filling = cli(*args, cwd=project)
    cached = cli(*args, "-v", cwd=project)
    # With --diff, files that would change are processed again for their new bytes.
    assert from_cache(cached) == (5 if mode == "--check" else 2)
    for run in (filling, cached):
        assert run.returncode == plain.returncode
        assert run.stdout == plain.stdout
        assert without_verbose_line(run.stderr) == plain.stderr
    assert (project / "src/pkg/train.py").read_text() == XLA


def test_write_mode_after_check_still_rewrites_and_a_diff_still_shows(cli, project):
    check = cli("rewrite", "--check", "src/pkg/train.py", cwd=project)
    assert check.returncode == 1
    diff = cli("rewrite", "--diff", "src/pkg/train.py", cwd=project)
    assert b"+device = torch.device(\"tpu\")" in diff.stdout
    write = cli("rewrite", "src/pkg/train.py", cwd=project)
    assert write.returncode == 0  # written, nothing left to do
    assert b"Rewrote: src/pkg/train.py" in write.stdout
    assert (project / "src/pkg/train.py").read_text() != XLA
    again = cli("rewrite", "--check", "-v", "src/pkg/train.py", cwd=project)
    assert again.returncode == 0, again.stdout
    assert from_cache(again) == 0  # new bytes: processed, found clean, stored
    assert from_cache(cli("rewrite", "--check", "-v", "src/pkg/train.py", cwd=project)) == 1


def test_a_changed_file_is_processed_again(cli, project):
    cli("rewrite", "--check", "src", cwd=project)
    # Same size, written within the same second as the first run read it: only the content
    # hash can tell.
    target = project / "src/pkg/manual.py"
    same_size = MANUAL.replace("collective_permute(t, ", "reduce_scatter(t,     ")
    assert len(same_size) == len(MANUAL)
    target.write_text(same_size)
    run = cli("rewrite", "--check", "-v", "src", cwd=project)
    assert from_cache(run) == 4
    assert b"src/pkg/manual.py:3:1 TPU102" in run.stdout
    assert b"TPU109" in run.stdout  # the notebook's
    # A file the pre-filter skipped that now mentions torch_xla.
    (project / "src/pkg/clean.py").write_text(MANUAL)
    run = cli("rewrite", "--check", "-v", "src", cwd=project)
    assert from_cache(run) == 4
    assert b"src/pkg/clean.py:3:1 TPU109" in run.stdout


def test_options_and_config_select_another_cache(cli, project):
    cli("rewrite", "--check", "src", cwd=project)
    assert from_cache(cli("rewrite", "--check", "-v", "--select", "TPU001", "src", cwd=project)) == 0
    assert from_cache(cli("rewrite", "--check", "-v", "--target", "portable", "src", cwd=project)) == 0
    assert from_cache(cli("rewrite", "--check", "-v", "--fix-level", "safe", "src", cwd=project)) == 0
    (project / "pyproject.toml").write_text('[tool.tpu-migrate]\nignore = ["TPU109"]\n')
    ignored = cli("rewrite", "--check", "-v", "src", cwd=project)
    assert from_cache(ignored) == 0
    assert b"TPU109" not in ignored.stdout
    assert len(cache_files()) == 5
    # The key is the settings, not where they come from, nor the mode: --diff with the same
    # --ignore reuses what --check stored for the files that do not change (manual.py is clean now).
    assert from_cache(cli("rewrite", "--diff", "-v", "--ignore", "TPU109", "src", cwd=project)) == 3


def test_a_changed_rule_file_invalidates(cli, project, tmp_path, monkeypatch):
    rules = tmp_path / "rules"
    shutil.copytree(ROOT / "rules", rules)
    monkeypatch.setenv("TPU_MIGRATE_RULES_DIR", str(rules))
    cli("rewrite", "--check", "src", cwd=project)
    assert from_cache(cli("rewrite", "--check", "-v", "src", cwd=project)) == 5
    table = rules / "collectives.toml"
    table.write_text(table.read_text().replace("have no direct equivalent: port by hand",
                                               "have no direct equivalent: port them by hand"))
    run = cli("rewrite", "--check", "-v", "src", cwd=project)
    assert from_cache(run) == 0
    assert b"port them by hand" in run.stdout


@pytest.mark.parametrize("damage", [b"", b"{not json", b"[1, 2]", b'{"format": 1, "files": []}',
                                    b'{"format": 1, "files": {"x": 3}}', b"\xff\xfe\x00garbage"])
def test_a_damaged_cache_is_ignored_and_rebuilt(cli, project, damage):
    first = cli("rewrite", "--check", "src", cwd=project)
    [path] = cache_files()
    path.write_bytes(damage)
    run = cli("rewrite", "--check", "-v", "src", cwd=project)
    assert (run.returncode, run.stdout) == (first.returncode, first.stdout)
    assert without_verbose_line(run.stderr) == first.stderr
    assert from_cache(run) == 0
    assert len(json.loads(path.read_text())["files"]) == 5
    assert from_cache(cli("rewrite", "--check", "-v", "src", cwd=project)) == 5


def test_damaged_entries_are_processed_again(cli, project):
    cli("rewrite", "--check", "src", cwd=project)
    [path] = cache_files()
    document = json.loads(path.read_text())
    for entry in document["files"].values():
        entry[8] = [["TPU109", "not a line", 1, "message", None]] if entry[8] else "nonsense"
    path.write_text(json.dumps(document))
    run = cli("rewrite", "--check", "-v", "src", cwd=project)
    assert b"not a line" not in run.stdout
    assert from_cache(run) == 0


@pytest.mark.parametrize("how", ["flag", "env", "config"])
def test_no_cache_neither_reads_nor_writes(cli, project, monkeypatch, tmp_path, how):
    cli("rewrite", "--check", "src", cwd=project)
    [path] = cache_files()
    document = json.loads(path.read_text())
    for entry in document["files"].values():
        entry[8] = [["TPU109", 1, 1, "planted", None]]
    path.write_text(json.dumps(document))
    assert b"planted" in cli("rewrite", "--check", "src", cwd=project).stdout
    before = path.read_bytes()

    args = ["rewrite", "--check", "-v", "src"]
    if how == "flag":
        args.insert(1, "--no-cache")
    elif how == "env":
        monkeypatch.setenv("TPU_MIGRATE_NO_CACHE", "1")
    else:
        (project / "pyproject.toml").write_text("[tool.tpu-migrate]\ncache = false\n")
    run = cli(*args, cwd=project)
    assert b"cache off" in run.stderr
    assert b"planted" not in run.stdout
    assert path.read_bytes() == before
    monkeypatch.setenv("TPU_MIGRATE_CACHE_DIR", str(tmp_path / "unused"))
    cli(*args, cwd=project)
    assert not (tmp_path / "unused").exists()


def test_bad_cache_config_value_is_a_usage_error(cli, project):
    (project / "pyproject.toml").write_text('[tool.tpu-migrate]\ncache = "no"\n')
    run = cli("rewrite", "--check", "src", cwd=project)
    assert run.returncode == 2
    assert b"'cache' must be true or false" in run.stderr


def test_concurrent_runs_leave_a_valid_cache(project):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for i in range(6):
        (project / "src" / f"extra_{i}.py").write_text(MANUAL.replace("t,", f"t{i},"))
    runs = [subprocess.Popen([sys.executable, "-m", "tpu_migrate", "rewrite", "--check", "--jobs", "1",
                              f"src/extra_{i}.py", "src/pkg"], cwd=project, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(6)]
    assert [run.wait(timeout=300) for run in runs] == [2] * 6
    [path] = cache_files()
    files = json.loads(path.read_text())["files"]
    assert len(files) >= 5
    assert not list(cache_dir().glob("*.tmp"))


def test_cache_location(monkeypatch, tmp_path):
    monkeypatch.setenv("TPU_MIGRATE_CACHE_DIR", str(tmp_path / "explicit"))
    assert result_cache.cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv("TPU_MIGRATE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert result_cache.cache_dir() == tmp_path / "xdg" / "tpu-migrate"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert result_cache.cache_dir() == tmp_path / "home" / ".cache" / "tpu-migrate"


def test_stat_is_trusted_only_while_ctime_is_unchanged(tmp_path, monkeypatch):
    """A same-size edit that puts the old mtime back is still seen: ctime moved."""
    monkeypatch.setattr(result_cache, "TRUST_MARGIN_NS", -10**12)  # trust files written just now
    path = tmp_path / "a.py"
    path.write_text(MANUAL)
    settings = {"target": "tpu"}
    cache = result_cache.Cache.open(settings, tmp_path / "cache")
    found = cache.lookup(str(path))
    assert found.result is None and found.data == MANUAL.encode() and found.fingerprint.trusted
    cache.store(str(path), found.fingerprint, FileResult(str(path)))
    cache.save()
    cache = result_cache.Cache.open(settings, tmp_path / "cache")
    hit = cache.lookup(str(path))
    assert hit.result is not None and hit.data is None
    before = path.stat()
    edited = MANUAL.replace("(0, 1)", "(1, 0)")
    path.write_text(edited)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_size == before.st_size and path.stat().st_mtime_ns == before.st_mtime_ns
    miss = cache.lookup(str(path))
    assert miss.result is None and miss.data == edited.encode()


def test_a_cached_run_never_imports_libcst(cli, project):
    """Importing libcst costs about 0.15 s, as much as reading 5,000 files: a run served from the
    cache must not pay it (benchmarks/bench_scale.py's cached-run target)."""
    (project / "src" / "pkg" / "broken.py").unlink()  # errors are never cached
    files = ["src"]
    assert cli("rewrite", "--check", *files, cwd=project).returncode == 1
    probe = ("import runpy, sys\n"
             f"sys.argv = ['tpu-migrate', 'rewrite', '--check', '-v', *{files!r}]\n"
             "try:\n    runpy.run_module('tpu_migrate', run_name='__main__')\n"
             "except SystemExit:\n    pass\n"
             "print('libcst imported:', 'libcst' in sys.modules)\n")
    run = subprocess.run([sys.executable, "-c", probe], cwd=project, capture_output=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert re.search(rb"(\d+) file\(s\), \1 from the cache", run.stderr), run.stderr
    assert run.stdout.endswith(b"libcst imported: False\n"), run.stdout[-2000:]


def test_an_open_todo_is_reported_from_the_cache_until_it_is_removed(cli, project):
    todo = project / "src/pkg/todo.py"
    todo.write_text(OPEN_TODO)
    plain = cli("rewrite", "--check", "--no-cache", "src/pkg/todo.py", cwd=project)
    for _ in range(2):
        run = cli("rewrite", "--check", "-v", "src/pkg/todo.py", cwd=project)
        assert (run.returncode, run.stdout) == (plain.returncode, plain.stdout)
        assert b"src/pkg/todo.py:3:1 TPU060 start the workers by hand" in run.stdout
    assert plain.returncode == 1
    assert from_cache(run) == 1
    todo.write_text(OPEN_TODO.replace("# TODO(tpu-migrate): TPU060 start the workers by hand\n", ""))
    done = cli("rewrite", "--check", "-v", "src/pkg/todo.py", cwd=project)
    assert done.returncode == 0, done.stdout
    assert from_cache(done) == 0
