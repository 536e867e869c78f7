"""`rewrite` run in-process (click's runner): what must hold however the tree changes under the
run, whatever the configuration holds, and however the run ends."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from tpu_migrate import cli as cli_module

XLA = "import torch_xla.core.xla_model as xm\n\ndevice = xm.xla_device()\nxm.mark_step()\n"
XLA_REWRITTEN = 'import torch\n\ndevice = torch.device("tpu")\n'


def rewrite(*args: str, cwd: Path | None = None):
    """`tpu-migrate rewrite ARGS` in this process: (exit status, stdout, stderr)."""
    previous = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        result = CliRunner().invoke(cli_module.main, ["rewrite", *args], env={"COLUMNS": "200"})
    finally:
        os.chdir(previous)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def _discover_then(monkeypatch, action):
    """Run `action()` after the walk has found every file and before any is read."""
    real = cli_module.discover

    def discover_then_act(*args, **kwargs):
        found = list(real(*args, **kwargs))
        action()
        yield from found

    monkeypatch.setattr(cli_module, "discover", discover_then_act)


@pytest.mark.parametrize("swapped", ["file", "directory"])
@pytest.mark.parametrize("run", [("--jobs", "1", "--no-cache"), ("--jobs", "2", "--no-cache"), ("--jobs", "1"),
                                 ("--jobs", "1", "--no-cache", "write")])
def test_a_file_or_directory_swapped_for_a_link_after_the_walk_is_never_written_through(
        tmp_path, monkeypatch, swapped, run):
    """Between the walk and the read (or, `write`, between the read and the write) an in-tree
    file or its directory becomes a link to a file outside the tree with the same name and
    bytes: the outside file is left alone, the in-tree path gets a one-line error, and the other
    files are still rewritten."""
    tree, outside = tmp_path / "tree", tmp_path / "outside"
    (tree / "sub").mkdir(parents=True)
    (outside / "sub").mkdir(parents=True)
    for path in (tree / "sub" / "a.py", tree / "b.py", outside / "sub" / "a.py"):
        path.write_text(XLA)

    def swap():
        if swapped == "file":
            (tree / "sub" / "a.py").rename(tmp_path / "moved.py")
            (tree / "sub" / "a.py").symlink_to(outside / "sub" / "a.py")
        else:
            (tree / "sub").rename(tmp_path / "moved")
            (tree / "sub").symlink_to(outside / "sub")

    if run[-1] == "write":
        run, write = run[:-1], cli_module.write_atomic

        def swap_then_write(path, *args, **kwargs):
            if path.endswith("a.py"):
                swap()
            return write(path, *args, **kwargs)

        monkeypatch.setattr(cli_module, "write_atomic", swap_then_write)
    else:
        _discover_then(monkeypatch, swap)
    status, stdout, stderr = rewrite(*run, str(tree))
    assert (outside / "sub" / "a.py").read_text() == XLA
    assert (tree / "b.py").read_text() == XLA_REWRITTEN
    assert status == 2, stdout + stderr
    lines = [line for line in stderr.splitlines() if line]
    assert len(lines) == 1 and lines[0].startswith(f"{tree / 'sub' / 'a.py'}: error: ") \
        and "link" in lines[0], stderr


DEEP = "x = " + "[" * 500 + "]" * 500 + "\n"


@pytest.mark.parametrize("ours", [True, False])
def test_a_pyproject_value_nested_500_deep_is_one_error_line_not_a_traceback(tmp_path, ours):
    """Legal TOML that Python's parser cannot read (it recurses per level), even in another
    tool's table: exit 2, one line naming the file and the line."""
    (tmp_path / "a.py").write_text(XLA)
    (tmp_path / "pyproject.toml").write_text("[tool.other]\n" + DEEP + ('[tool.tpu-migrate]\ntarget = "tpu"\n' * ours))
    status, stdout, stderr = rewrite("--diff", ".", cwd=tmp_path)
    assert status == 2 and stdout == ""
    assert stderr.splitlines() == [
        f"tpu-migrate: error: {tmp_path / 'pyproject.toml'}: cannot be read: a value is nested too deeply "
        "for Python's TOML parser (at line 2)"]


@pytest.mark.parametrize("body, message", [
    ('exclude = ["a",\n  "b"\n\n', "Unclosed array (at the end of the document, line 6; what is left open starts at line 5)"),
    ('target = """tpu\nmore\n\n', "Unterminated string (at the end of the document, line 6; what is left open starts "
                                   "at line 5)"),
    ("target =", "Invalid value (at the end of the document, line 5)"),
])
def test_a_toml_error_at_the_end_of_the_configuration_names_its_lines(tmp_path, body, message):
    (tmp_path / "a.py").write_text(XLA)
    (tmp_path / "pyproject.toml").write_text(f'[project]\nname = "demo"\n\n[tool.tpu-migrate]\n{body}')
    status, stdout, stderr = rewrite("--diff", ".", cwd=tmp_path)
    assert status == 2
    assert stderr.splitlines() == [f"tpu-migrate: error: {tmp_path / 'pyproject.toml'}: invalid TOML: {message}"]


@pytest.mark.parametrize("text, message", [
    ('[[rule]]\ncode = "TPU900"\nmatches = ["a",\n  "b"\n', "invalid TOML: Unclosed array (at the end of the "
                                                              "document, line 4; what is left open starts at line 3)"),
    (DEEP, "cannot be read: a value is nested too deeply for Python's TOML parser (at line 1)"),
])
def test_a_rule_file_that_cannot_be_read_names_its_line(tmp_path, text, message):
    from tpu_migrate.rules import RuleError, load_catalog

    (tmp_path / "broken.toml").write_text(text)
    with pytest.raises(RuleError) as error:
        load_catalog(str(tmp_path))
    assert str(error.value) == f"{tmp_path / 'broken.toml'}: {message}"


def test_exclude_patterns_are_compiled_once_not_matched_one_by_one_per_file(tmp_path, monkeypatch):
    """5,000 files and 5,000 patterns took two minutes when each file tried each pattern. The
    glob machinery (fnmatch's functions, and re's module-level ones a loop would use) may run
    once per pattern and a few times per file, never files x patterns times."""
    import fnmatch
    import re

    from tpu_migrate.rewrite.files import Excluder, discover

    files, patterns = 200, 200
    for i in range(files):
        (tmp_path / f"d{i % 10}").mkdir(exist_ok=True)
        (tmp_path / f"d{i % 10}" / f"f{i}.py").write_text("x = 1\n")
    globs = [f"*zz{i}*.py" for i in range(patterns // 4)] + [f"dir{i}/*/f{i}.py" for i in range(patterns // 4)] \
        + [f"gen_{i}.py" for i in range(patterns // 4)] + [f"d?/f{i}x.py" for i in range(patterns // 4)]
    calls = 0

    def counted(function):
        def call(*args, **kwargs):
            nonlocal calls
            calls += 1
            return function(*args, **kwargs)
        return call

    for module, names in ((fnmatch, ("fnmatch", "fnmatchcase", "filter", "translate")),
                          (re, ("compile", "match", "fullmatch", "search"))):
        for name in names:
            monkeypatch.setattr(module, name, counted(getattr(module, name)))
    excluder = Excluder([(glob, str(tmp_path)) for glob in globs] + [("d3", str(tmp_path))])
    found = [path for path, _ in discover([str(tmp_path)], excluder)]
    assert len(found) == files - files // 10  # d3/ excluded, nothing else matches
    assert calls <= 3 * (patterns + files), calls


def test_compiled_exclude_patterns_match_as_fnmatch_does():
    """The compiled matcher against fnmatch itself, pattern by pattern, on names and paths
    with and without wildcards, classes, a `[` without its `]`, and runs shared by many globs."""
    import fnmatch
    import random

    from tpu_migrate.rewrite.files import _Globs

    rng = random.Random(51)
    alphabet = "ab.[]!*?/-_"
    patterns = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 7))) for _ in range(400)]
    patterns += ["*.py", "a[!b]c", "[]]x", "x[", "abc*", "*abc", "a?c/*.py", "[a-c]bc", "abc"]
    texts = ["".join(rng.choice("ab.[]!/-_c") for _ in range(rng.randint(1, 9))) for _ in range(400)]
    texts += ["abc.py", "a/b.py", "abc", "xabc", "]x", "x[", "acc", "a-c/z.py", "bbc"]
    globs = _Globs(patterns)
    for text in texts:
        assert globs.match(text) == any(fnmatch.fnmatch(text, p) for p in patterns), text
    for pattern in patterns[:60]:
        one = _Globs([pattern])
        for text in texts:
            assert one.match(text) == fnmatch.fnmatch(text, pattern), (pattern, text)


def test_a_refused_hard_linked_file_counts_as_no_fix(tmp_path):
    """The write is refused (a new file under one name would leave the other name with the old
    text): its fixes were not made, so neither the summary nor the JSON count them."""
    import json

    path, other = tmp_path / "a.py", tmp_path / "other-name.py"
    path.write_text(XLA)
    os.link(path, other)
    (tmp_path / "b.py").write_text(XLA)
    status, stdout, stderr = rewrite("--no-cache", "--jobs", "1", str(path), str(tmp_path / "b.py"))
    assert status == 2 and "it has 2 hard links" in stderr
    assert "1 changed, 1 error(s), 2 fix(es)" in stdout, stdout  # b.py's two, not a.py's
    path.write_text(XLA)  # b.py is rewritten by now: only a.py has work left
    status, stdout, _ = rewrite("--no-cache", "--jobs", "1", "--format", "json", str(path))
    summary = json.loads(stdout)["summary"]
    assert (summary["fixes"], summary["changed"], summary["errors"]) == (0, 0, 1)


def test_ctrl_c_while_a_file_is_replaced_finishes_that_file_then_exits_130(tmp_path, monkeypatch):
    """SIGINT arrives in the middle of a file's replacement (after its new content is on disk,
    before the rename): that file is finished, no later file is touched, no temporary file
    stays, and the exit is 130 with one line (not click's "Aborted!" and 1)."""
    import signal

    from tpu_migrate.rewrite import files

    for name in ("a.py", "b.py", "c.py"):
        (tmp_path / name).write_text(XLA)
    real_fsync = files.os.fsync

    def fsync_then_ctrl_c(fd):
        real_fsync(fd)
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(files.os, "fsync", fsync_then_ctrl_c)
    # As a terminal's program has it: in one full run this worker's Ctrl-C did nothing here (and
    # in test_crash_safety's children), the test worker's state, not the tool's. signal.signal
    # puts Python's own handler back at the kernel too; unblocked for this thread.
    blocked = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        status, stdout, stderr = rewrite("--no-cache", "--jobs", "1", str(tmp_path))
        after = signal.getsignal(signal.SIGINT)  # the tool put its own handler back
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    assert status == 130, (stdout + stderr, previous, blocked)
    assert stderr.splitlines() == ["tpu-migrate: interrupted: the files written so far are rewritten, the others untouched"]
    assert [(tmp_path / name).read_text() for name in ("a.py", "b.py", "c.py")] == [XLA_REWRITTEN, XLA, XLA]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.py", "b.py", "c.py"]
    assert after is signal.default_int_handler


@pytest.mark.parametrize("before", [None, b"<html>the previous report</html>"])
def test_a_failed_html_write_leaves_no_empty_or_partial_page(tmp_path, before):
    """The page cannot be written whole (here: past a file size limit, as on a full disk): the
    error is one line, exit 2, and the path holds what it held before (or nothing)."""
    import resource
    import signal

    (tmp_path / "a.py").write_text(XLA)
    page = tmp_path / "report.html"
    if before is not None:
        page.write_bytes(before)
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a signal
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, limits[1]))
    try:
        status, stdout, stderr = rewrite("--check", "--no-cache", "--jobs", "1", "--html", str(page), str(tmp_path / "a.py"))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, previous)
    assert status == 2
    assert stderr.splitlines() == [f"tpu-migrate: error: cannot write {page}: File too large"]
    assert (page.read_bytes() if page.exists() else None) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["a.py", *(["report.html"] if before else [])])


def test_nbformat_warnings_are_said_in_the_tools_words(tmp_path):
    """A notebook (format 4.5) whose cells lack the `id` nbformat requires: no raw
    MissingIDFieldWarning on stderr, but one warning line that says what the rewrite does
    about it; a notebook that needs no change says nothing."""
    import json
    import warnings

    cells = [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
              "source": ["import torch_xla.core.xla_model as xm\n", "device = xm.xla_device()"]},
             {"cell_type": "markdown", "metadata": {}, "source": ["notes"]}]
    notebook = {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / "nb.ipynb").write_text(json.dumps(notebook))
    plain = {**notebook, "cells": [{**cells[0], "source": ["import torch  # and xla_device, in words"]}]}
    (tmp_path / "plain.ipynb").write_text(json.dumps(plain))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        status, stdout, stderr = rewrite("--diff", "--no-cache", "--jobs", "1", ".", cwd=tmp_path)
    assert status == 1 and "+    \"device = torch.device(\\\"tpu\\\")\"" in stdout
    assert not [w for w in caught if "nbformat" in (w.filename + str(w.category))], [str(w.message) for w in caught]
    assert "Warning" not in stderr
    assert stderr.splitlines() == [
        "nb.ipynb:1: warning: 2 cell(s), the first cell 0, have no `id`, which notebook format 4.5 requires: the "
        "rewritten notebook gives each one (nbformat does so, as Jupyter does when it saves)"]


MANUAL = XLA + "xm.some_unknown_thing()\n"


@pytest.mark.parametrize("spelled", [".", "./src", "src/", "src//pkg/../pkg", "ABS", "ABS/src/pkg/a.py"])
def test_every_line_names_a_file_as_the_diff_does(tmp_path, spelled):
    """`rewrite .` showed `./src/pkg/a.py` in findings and `Would rewrite:` while the diff said
    `a/src/pkg/a.py`: every line (findings, fixes, errors, notes, the files that change, the
    scripts not rewritten, JSON) names it `src/pkg/a.py`, however the path was spelled."""
    import json

    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "a.py").write_text(MANUAL + "x = 1  # tpu-migrate: ignore[TPU999]\n")
    (tmp_path / "src" / "pkg" / "bad.py").write_text("import torch_xla\ndef (:\n")
    (tmp_path / "src" / "run.sh").write_text("PJRT_DEVICE=TPU python -c 'import torch_xla'\n")
    whole = spelled in (".", "./src", "src/", "ABS")
    spelled = spelled.replace("ABS", str(tmp_path))
    status, stdout, stderr = rewrite("--check", "--no-cache", "--jobs", "1", spelled, cwd=tmp_path)
    assert "./" not in stdout + stderr and str(tmp_path) not in stdout + stderr, stdout + stderr
    assert "src/pkg/a.py:5:1 TPU099" in stdout and "Would rewrite: src/pkg/a.py" in stdout
    if not spelled.endswith("a.py"):
        assert "src/pkg/bad.py: error: syntax error at line 2" in stderr
    if whole:
        assert "src/run.sh:1: " in stdout
    assert "src/pkg/a.py:6: warning: unknown rule code TPU999" in stderr
    _, diff, _ = rewrite("--diff", "--no-cache", "--jobs", "1", spelled, cwd=tmp_path)
    assert "--- a/src/pkg/a.py\n+++ b/src/pkg/a.py\n" in diff and "Would rewrite: src/pkg/a.py" in diff
    _, document, _ = rewrite("--check", "--no-cache", "--format", "json", spelled, cwd=tmp_path)
    assert "src/pkg/a.py" in [entry["path"] for entry in json.loads(document)["files"]]


def test_the_docs_say_which_container_files_are_read_and_what_of_them():
    """docs/limits.md said Dockerfiles were outside the scan, docs/commands/rewrite.md that
    `Dockerfile*` was scanned: both (and TPU098's explanation) name the container files the code
    reads, and say that only their install lines are."""
    from tpu_migrate.rewrite.dependencies import CONTAINER_FILES
    from tpu_migrate.rules import load_catalog

    root = Path(__file__).resolve().parent.parent
    pages = {"limits": (root / "docs" / "limits.md").read_text(),
             "rewrite": (root / "docs" / "commands" / "rewrite.md").read_text(),
             "TPU098": load_catalog().by_code("TPU098").explanation}
    for name, text in pages.items():
        flat = " ".join(text.split())
        for pattern in CONTAINER_FILES:
            assert f"`{pattern}`" in flat, (name, pattern)
        assert "`Dockerfile*`" not in flat and "Dockerfiles." not in flat, name
        assert "install" in flat and "not read" in flat, name
