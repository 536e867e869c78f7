"""The CLI through a real subprocess: modes, exit codes, JSON, discovery, bad input."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from conftest import FIXTURES

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


def test_write_mode_rewrites_in_place_and_exits_1(cli, project):
    result = cli("rewrite", "src", cwd=project)
    assert result.returncode == 1, result.stderr
    assert (project / "src/pkg/train.py").read_text() == XLA_REWRITTEN
    assert (project / "src/pkg/clean.py").read_text() == CLEAN
    for skipped in (".venv/lib", "build", "__pycache__", ".git", "site-packages"):
        assert (project / "src" / skipped / "vendored.py").read_text() == XLA
    # Plain output when not a terminal: one summary line, no box drawing.
    assert b"2 file(s) scanned, 1 changed, 0 error(s), 2 fix(es)" in result.stdout
    assert "─".encode() not in result.stdout
    again = cli("rewrite", "src", cwd=project)
    assert again.returncode == 0, again.stdout


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

    leader, follower = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120", "TERM": "xterm"}
    proc = subprocess.run([sys.executable, "-m", "tpu_migrate", *args],
                          stdout=follower, stderr=follower, env=env, timeout=300)
    os.close(follower)
    output = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        output += chunk
    os.close(leader)
    return proc.returncode, output.decode(errors="replace")
