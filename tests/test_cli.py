"""The CLI through a real subprocess: modes, exit codes, JSON, discovery, bad input."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from conftest import FIXTURES

pytestmark = pytest.mark.slow  # the CLI as a subprocess

XLA = "import torch_xla.core.xla_model as xm\n\ndevice = xm.xla_device()\nxm.mark_step()\n"
XLA_REWRITTEN = 'import torch\n\ndevice = torch.device("tpu")\n'
MANUAL = "import torch_xla.core.xla_model as xm\n\nxm.collective_permute(t, [(0, 1)])\n"
CLEAN = "import torch\n\nx = torch.ones(2)\n"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "train.py").write_text(XLA)
    (tmp_path / "src" / "pkg" / "clean.py").write_text(CLEAN)
    for skipped in (".venv/lib", "build", "__pycache__", ".git", "site-packages"):
        (tmp_path / "src" / skipped).mkdir(parents=True)
        (tmp_path / "src" / skipped / "vendored.py").write_text(XLA)
    return tmp_path


def test_write_mode_rewrites_in_place_and_exits_0_when_nothing_remains(cli, project):
    """ruff's model: a write that leaves no manual work succeeds, so `&&` chains go on."""
    result = cli("rewrite", "src", cwd=project)
    assert result.returncode == 0, result.stderr
    assert (project / "src/pkg/train.py").read_text() == XLA_REWRITTEN
    assert (project / "src/pkg/clean.py").read_text() == CLEAN
    for skipped in (".venv/lib", "build", "__pycache__", ".git", "site-packages"):
        assert (project / "src" / skipped / "vendored.py").read_text() == XLA
    # Plain output when not a terminal: the files written, one summary line, no box drawing.
    out = result.stdout.decode()
    assert "Rewrote: src/pkg/train.py\n2 file(s) scanned, 1 changed, 0 error(s), 2 fix(es)" in out
    assert "  fixed   TPU001 xla-device: 1\n" in out and "fixable" not in out
    assert "─" not in out
    again = cli("rewrite", "src", cwd=project)
    assert again.returncode == 0, again.stdout
    assert b"Rewrote" not in again.stdout


def test_exit_non_zero_on_fix_fails_a_write_that_changed_files(cli, project):
    result = cli("rewrite", "--exit-non-zero-on-fix", "src", cwd=project)
    assert result.returncode == 1, result.stderr
    assert (project / "src/pkg/train.py").read_text() == XLA_REWRITTEN
    again = cli("rewrite", "--exit-non-zero-on-fix", "src", cwd=project)
    assert again.returncode == 0, again.stdout
    # --check and --diff are not affected by it; --exit-zero still wins.
    (project / "src/pkg/train.py").write_text(XLA)
    assert cli("rewrite", "--check", "--exit-non-zero-on-fix", "src", cwd=project).returncode == 1
    assert cli("rewrite", "--exit-non-zero-on-fix", "--exit-zero", "src", cwd=project).returncode == 0


def test_check_and_diff_list_the_files_that_would_change_as_fixable(cli, project):
    for mode in ("--check", "--diff"):
        out = cli("rewrite", mode, "src", cwd=project).stdout.decode()
        assert "Would rewrite: src/pkg/train.py\n2 file(s) scanned, 1 would change" in out
        assert "clean.py" not in out
        assert "  fixable TPU001 xla-device: 1\n  fixable TPU010 step-marker: 1\n" in out
        assert "fixed" not in out
        # The next command, with the files to rewrite.
        assert out.endswith("run: tpu-migrate rewrite src/pkg/train.py\n")


def test_check_says_where_each_fix_is_and_the_command_that_applies_it(cli, project):
    """A failing check hook points at lines (`path:line:col`, as findings are shown) and says
    what to run, with the options given that change what a write does."""
    out = cli("rewrite", "--check", "--target", "portable", "--ignore", "TPU106", "src", cwd=project).stdout.decode()
    assert out.startswith(
        "src/pkg/train.py:3:10 TPU001 fixable: `xm.xla_device()` / `torch_xla.device()` become the native device\n"
        "src/pkg/train.py:4:1 TPU010 fixable: `xm.mark_step()` / `torch_xla.sync()` are removed")
    assert out.endswith("run: tpu-migrate rewrite --target portable --ignore TPU106 src/pkg/train.py\n")
    # A name a shell would split is quoted; nothing pending, no next command.
    (project / "src/pkg/train.py").rename(project / "src/pkg/my train.py")
    out = cli("rewrite", "--check", "src", cwd=project).stdout.decode()
    assert out.endswith("run: tpu-migrate rewrite 'src/pkg/my train.py'\n")
    assert cli("rewrite", "src", cwd=project).returncode == 0
    out = cli("rewrite", "--check", "src", cwd=project).stdout.decode()
    assert "run:" not in out and "fixable" not in out


def test_diff_prints_a_unified_diff_and_writes_nothing(cli, project):
    result = cli("rewrite", "--diff", "src", cwd=project)
    assert result.returncode == 1
    out = result.stdout.decode()
    assert "--- a/src/pkg/train.py\n+++ b/src/pkg/train.py\n" in out
    assert "-device = xm.xla_device()\n-xm.mark_step()\n+device = torch.device(\"tpu\")\n" in out
    assert (project / "src/pkg/train.py").read_text() == XLA


def test_check_writes_nothing_and_fails_on_pending_changes(cli, project):
    result = cli("rewrite", "--check", "src", cwd=project)
    assert result.returncode == 1
    assert (project / "src/pkg/train.py").read_text() == XLA
    assert cli("rewrite", "--check", "src/pkg/clean.py", cwd=project).returncode == 0


TODO_FIXTURE = FIXTURES / "TPU130-compile-backend" / "basic.in.py"
TODO_LINE = '    # TODO(tpu-migrate): TPU130 TorchTPU rejects backend="inductor" for TPU tensors: use backend="tpu"\n'


def test_open_todo_comments_stay_manual_work_after_the_write(cli, tmp_path):
    """The written TODO is the only trace of the work once torch_xla is gone from the file: it
    is reported (once, not twice) by every mode and format until a person removes it."""
    path = tmp_path / "compile.py"
    path.write_bytes(TODO_FIXTURE.read_bytes())
    check = cli("rewrite", "--check", str(path))
    assert check.returncode == 1
    assert b"1 manual finding(s)" in check.stdout
    write = cli("rewrite", str(path))
    assert write.returncode == 1, write.stdout  # manual work remains
    assert b"1 manual finding(s)" in write.stdout
    text = path.read_text()
    assert TODO_LINE in text and "xla" not in text
    after = cli("rewrite", "--check", str(path))
    assert after.returncode == 1
    assert f"{path}:8:5 TPU130 TorchTPU rejects backend=\"inductor\"".encode() in after.stdout
    assert b"0 would change, 0 error(s), 0 fix(es), 1 manual finding(s)" in after.stdout
    assert cli("rewrite", "--diff", str(path)).returncode == 1
    assert cli("rewrite", str(path)).returncode == 1 and path.read_text() == text  # nothing to write
    doc = json.loads(cli("rewrite", "--check", "--format", "json", str(path)).stdout)
    assert doc["files"][0]["manual"] == [{"code": "TPU130", "line": 8, "col": 5, "message":
                                          'TorchTPU rejects backend="inductor" for TPU tensors: use backend="tpu"'}]
    github = cli("rewrite", "--check", "--format", "github", str(path)).stdout.decode()
    assert github.startswith(f"::warning file={path},line=8,col=5,title=TPU130::TorchTPU rejects")
    sarif = json.loads(cli("rewrite", "--check", "--format", "sarif", str(path)).stdout)
    [finding] = sarif["runs"][0]["results"]
    assert finding["ruleId"] == "TPU130"
    assert finding["locations"][0]["physicalLocation"]["region"] == {"startLine": 8, "startColumn": 5}
    # A person did the work and removed the comment: green.
    path.write_text(text.replace(TODO_LINE, ""))
    done = cli("rewrite", "--check", str(path))
    assert done.returncode == 0, done.stdout
    assert b"0 manual finding(s)" in done.stdout


def test_open_todos_are_found_in_files_the_byte_prefilter_would_skip(cli, tmp_path):
    """No torch_xla marker left at all, only our comment: still open work. A TODO quoted in a
    string is not a comment."""
    path = tmp_path / "launch.py"
    path.write_text("import os\n\n# TODO(tpu-migrate): TPU060 start the workers by hand\nos.getpid()\n"
                    "s = '# TODO(tpu-migrate): TPU001 only a string'\n")
    result = cli("rewrite", "--check", str(tmp_path))
    assert result.returncode == 1
    assert result.stdout.decode().splitlines()[0] == f"{path}:3:1 TPU060 start the workers by hand"
    assert b"1 manual finding(s)" in result.stdout


def test_manual_findings_are_listed_and_exit_1_even_without_changes(cli, tmp_path):
    path = tmp_path / "m.py"
    path.write_text(MANUAL)
    first = cli("rewrite", str(path))
    assert first.returncode == 1
    assert f"{path}:3:1 TPU109 `xm.collective_permute`".encode() in first.stdout
    # The TODO comment was added; the second run changes nothing but still reports the work.
    assert "# TODO(tpu-migrate): TPU109" in path.read_text()
    second = cli("rewrite", "--check", str(path))
    assert second.returncode == 1
    assert b"0 would change" in second.stdout and b"1 manual finding" in second.stdout


def test_json_output_is_one_document_with_the_schema(cli, project):
    result = cli("rewrite", "--check", "--format", "json", "src", cwd=project)
    assert result.returncode == 1
    doc = json.loads(result.stdout)  # nothing else on stdout
    assert doc["version"] == 1 and doc["target"] == "tpu"
    files = {f["path"]: f for f in doc["files"]}
    train = files[os.path.join("src", "pkg", "train.py")]
    assert train == {
        "path": os.path.join("src", "pkg", "train.py"),
        "changed": True,
        "error": None,
        "fixes": [{"code": "TPU001", "line": 3, "col": 10}, {"code": "TPU010", "line": 4, "col": 1}],
        "manual": [],
    }
    summary = doc["summary"]
    assert {k: summary[k] for k in ("files", "changed", "errors", "fixes", "manual")} == {
        "files": 2, "changed": 1, "errors": 0, "fixes": 2, "manual": 0,
    }


def test_json_with_diff_carries_the_diff(cli, project):
    result = cli("rewrite", "--diff", "--format", "json", "src/pkg/train.py", cwd=project)
    doc = json.loads(result.stdout)
    assert doc["files"][0]["diff"].startswith("--- a/src/pkg/train.py")


def test_target_portable(cli, project):
    cli("rewrite", "--target", "portable", "src", cwd=project)
    text = (project / "src/pkg/train.py").read_text()
    assert 'torch.accelerator.current_accelerator(check_available=True) or torch.device("cpu")' in text


def test_select_ignore_and_unknown_codes(cli, project):
    result = cli("rewrite", "--diff", "--select", "TPU010", "src/pkg/train.py", cwd=project)
    assert b"-xm.mark_step()" in result.stdout and b"+device" not in result.stdout
    result = cli("rewrite", "--diff", "--ignore", "TPU00", "src/pkg/train.py", cwd=project)
    assert b"+device" not in result.stdout and b"-xm.mark_step()" in result.stdout
    bad = cli("rewrite", "--select", "TPU999X", "src", cwd=project)
    assert bad.returncode == 2 and b"no rule matches 'TPU999X'" in bad.stderr


def test_exclude_glob(cli, project):
    result = cli("rewrite", "--check", "--exclude", "train.py", "src", cwd=project)
    assert result.returncode == 0


def test_usage_errors_exit_2(cli):
    assert cli("rewrite").returncode == 2
    assert cli("rewrite", "--target", "gpu", ".").returncode == 2
    assert cli("rewrite", "--diff", "--jobs", "0", ".").returncode == 2


def test_bad_files_are_reported_and_the_others_still_processed(cli, tmp_path):
    (tmp_path / "good.py").write_text(XLA)
    (tmp_path / "syntax.py").write_text("import torch_xla\ndef broken(:\n")
    (tmp_path / "undecodable.py").write_bytes(b"import torch_xla\nx = '\xff'\n")
    unreadable = tmp_path / "unreadable.py"
    unreadable.write_text(XLA)
    unreadable.chmod(0)
    originals = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name != "unreadable.py"}
    result = cli("rewrite", str(tmp_path), str(tmp_path / "missing.py"))
    unreadable.chmod(0o644)
    assert result.returncode == 2
    err = result.stderr.decode()
    assert f"{tmp_path / 'syntax.py'}: error: syntax error at line 2" in err
    assert f"{tmp_path / 'undecodable.py'}: error: cannot decode" in err
    assert f"{tmp_path / 'missing.py'}: error: no such file or directory" in err
    if os.geteuid() != 0:  # root reads anything
        assert f"{tmp_path / 'unreadable.py'}: error: cannot read" in err
    assert (tmp_path / "good.py").read_text() == XLA_REWRITTEN
    for name in ("syntax.py", "undecodable.py"):
        assert (tmp_path / name).read_bytes() == originals[name]


def test_crlf_bom_and_mode_survive_a_real_write(cli, tmp_path):
    path = tmp_path / "win.py"
    path.write_bytes(b"\xef\xbb\xbf" + XLA.replace("\n", "\r\n").encode())
    path.chmod(0o755)
    cli("rewrite", str(path))
    assert path.read_bytes() == b"\xef\xbb\xbf" + XLA_REWRITTEN.replace("\n", "\r\n").encode()
    assert stat.S_IMODE(path.stat().st_mode) == 0o755
    assert [p.name for p in tmp_path.iterdir()] == ["win.py"]  # no temporary files left


def test_parallel_jobs_give_the_same_result_as_one(cli, tmp_path):
    for i in range(12):
        (tmp_path / f"f{i}.py").write_text(XLA if i % 2 else MANUAL)
    one = cli("rewrite", "--check", "--format", "json", "--jobs", "1", str(tmp_path))
    two = cli("rewrite", "--check", "--format", "json", "--jobs", "2", str(tmp_path))
    assert json.loads(one.stdout) == json.loads(two.stdout)


def test_python_dash_m_and_version(cli):
    result = cli("--version")
    assert result.returncode == 0 and b"tpu-migrate" in result.stdout


def test_bundled_example_rewrites(cli, tmp_path):
    example = FIXTURES.parent / "examples" / "train_mnist_xla.py"
    copy = tmp_path / example.name
    copy.write_bytes(example.read_bytes())
    result = cli("rewrite", "--check", str(copy))
    assert result.returncode == 1
    assert b"TPU060" in result.stdout or b"spawn" in result.stdout


def test_dangling_symlink_and_directory_named_like_a_file(cli, tmp_path):
    (tmp_path / "good.py").write_text(XLA)
    (tmp_path / "gone.py").symlink_to(tmp_path / "nowhere.py")
    (tmp_path / "pkg.py").mkdir()
    result = cli("rewrite", str(tmp_path / "gone.py"), str(tmp_path / "pkg.py"), str(tmp_path / "good.py"))
    assert result.returncode == 2
    err = result.stderr.decode()
    assert f"{tmp_path / 'gone.py'}: error: cannot read: No such file or directory" in err
    assert (tmp_path / "good.py").read_text() == XLA_REWRITTEN


def test_terminal_output_is_a_table(tmp_path):
    """On a terminal the summary is a rich table (run in a real pseudo-terminal)."""
    (tmp_path / "t.py").write_text(XLA)
    status, text = run_in_terminal(["rewrite", "--check", str(tmp_path)])
    assert status == 1
    assert "files scanned" in text and "TPU001 xla-device" in text
    assert "┃" in text or "│" in text  # box drawing: the table, not the plain summary


def test_progress_bar_on_a_terminal_for_many_files(tmp_path):
    """More than 50 files on a terminal: a progress bar (rich, on stderr) while rewriting."""
    for i in range(60):
        (tmp_path / f"m{i}.py").write_text(XLA)
    status, text = run_in_terminal(["rewrite", "--check", "--jobs", "1", str(tmp_path)])
    assert status == 1
    assert "rewriting" in text and "/60" in text


def run_in_terminal(args: list[str]) -> tuple[int, str]:
    """Run the CLI with a real pseudo-terminal as stdout and stderr; (status, screen text)."""
    import pty
    import subprocess
    import sys

    from conftest import ROOT

    from concurrent.futures import ThreadPoolExecutor

    leader, follower = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120", "TERM": "xterm"}

    def read_screen() -> bytes:  # while the program runs: a full terminal buffer would block it
        output = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal's last writer closed it
                break
            if not chunk:
                break
            output += chunk
        return output

    with ThreadPoolExecutor(1) as pool:
        screen = pool.submit(read_screen)
        try:
            proc = subprocess.run([sys.executable, "-m", "tpu_migrate", *args],
                                  stdout=follower, stderr=follower, env=env, timeout=300)
        finally:
            os.close(follower)
        output = screen.result()
    os.close(leader)
    return proc.returncode, output.decode(errors="replace")


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args], cwd=repo,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("spelling", [".", "./src", "src/", "./src/pkg/train.py", "ABS", "ABS/src/pkg/../pkg"])
def test_diff_applies_with_git_apply_and_patch(cli, project, spelling):
    """The whole of stdout (findings and summary lines included) is a patch that `git apply`
    and `patch -p1` take, however the path was spelled."""
    (project / "src/pkg/manual.py").write_text(MANUAL)
    for skipped in (".venv", "build", "__pycache__", ".git", "site-packages"):
        shutil.rmtree(project / "src" / skipped)
    assert _git(project, "init", "-q").returncode == 0
    _git(project, "add", "-A")
    assert _git(project, "commit", "-q", "-m", "start").returncode == 0
    result = cli("rewrite", "--diff", spelling.replace("ABS", str(project)), cwd=project)
    assert result.returncode == 1
    patch_file = project.parent / "change.diff"
    patch_file.write_bytes(result.stdout)
    assert "--- a/src/pkg/train.py\n+++ b/src/pkg/train.py\n" in result.stdout.decode()
    checked = _git(project, "apply", "--check", str(patch_file))
    assert checked.returncode == 0, checked.stderr
    dry = subprocess.run(["patch", "-p1", "--dry-run", "-i", str(patch_file)], cwd=project,
                         capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert _git(project, "apply", str(patch_file)).returncode == 0
    assert (project / "src/pkg/train.py").read_text() == XLA_REWRITTEN
    assert cli("rewrite", "--check", "src/pkg/train.py", cwd=project).returncode == 0


def test_diff_of_a_file_outside_the_working_directory_keeps_its_absolute_path(cli, tmp_path):
    (tmp_path / "outside").mkdir()
    (tmp_path / "here").mkdir()
    path = tmp_path / "outside" / "t.py"
    path.write_text(XLA)
    out = cli("rewrite", "--diff", "../outside/t.py", cwd=tmp_path / "here").stdout.decode()
    assert f"--- {path}\n+++ {path}\n" in out


def test_a_read_only_file_is_refused_not_replaced(cli, tmp_path):
    """The atomic rename only needs the directory: without this check a file nobody may write
    would be replaced (even as root, whose open() ignores the mode)."""
    locked = tmp_path / "locked.py"
    locked.write_text(XLA)
    locked.chmod(0o444)
    (tmp_path / "free.py").write_text(XLA)
    result = cli("rewrite", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.decode().splitlines() == [
        f"{locked}: error: cannot write: Permission denied (the file is read-only)"]
    assert locked.read_text() == XLA and stat.S_IMODE(locked.stat().st_mode) == 0o444
    assert (tmp_path / "free.py").read_text() == XLA_REWRITTEN
    assert sorted(p.name for p in tmp_path.iterdir()) == ["free.py", "locked.py"]


def test_an_ignore_comment_with_an_unknown_code_is_a_warning(cli, tmp_path):
    path = tmp_path / "t.py"
    path.write_text("import torch_xla.core.xla_model as xm\n\n"
                    "device = xm.xla_device()  # tpu-migrate: ignore[TPU999, TPU001]\n")
    result = cli("rewrite", "--check", "--format", "json", str(path))
    assert result.returncode == 0  # TPU001 is suppressed: nothing to do
    assert result.stderr.decode().splitlines() == [
        f"{path}:3: warning: unknown rule code TPU999 in a `# tpu-migrate: ignore[...]` comment "
        "(see `tpu-migrate rules`)"]
    json.loads(result.stdout)  # stdout stays one document


def test_a_named_file_that_is_not_python_says_so(cli, tmp_path):
    # (requirements*.txt and the other dependency files are scanned: tests/test_dependencies.py)
    (tmp_path / "notes.txt").write_text("we still use torch_xla: see xm.mark_step(\n")
    (tmp_path / "script").write_text("import torch_xla\ndef broken(:\n")  # no suffix: a script
    result = cli("rewrite", "notes.txt", "script", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.decode().splitlines() == [
        "notes.txt: error: not a Python file or notebook (.txt file); nothing to rewrite",
        "script: error: syntax error at line 2: invalid syntax"]


def test_help_says_what_each_command_does(cli):
    out = cli("--help").stdout.decode()
    assert "diagnose  Run a program under a tracer; report TPU performance problems.\n" in out
    assert "rewrite   Convert torch_xla idioms in files or directories to TorchTPU." in out
