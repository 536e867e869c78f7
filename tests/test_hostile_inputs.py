"""Hostile inputs through the real CLI, mixed with good files in one tree.

Each bad file gets exactly one error line naming it (`path: error: problem`), is left byte for
byte as it was, and does not stop the others: the good files (odd names, odd line endings and
encodings among them) are rewritten. Engine-level cases live in test_engine.py; this is the
end-to-end view, with what only the file system can do (FIFOs, links, directories, permissions).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the CLI as a subprocess over hostile trees

XLA = "import torch_xla.core.xla_model as xm\n\ndevice = xm.xla_device()\nxm.mark_step()\n"
XLA_REWRITTEN = 'import torch\n\ndevice = torch.device("tpu")\n'
BIG = 20 * 1024 * 1024

GOOD = {
    "good.py": (XLA.encode(), XLA_REWRITTEN.encode()),
    "with space.py": (XLA.encode(), XLA_REWRITTEN.encode()),
    "naïve_ü_日本.py": (XLA.encode(), XLA_REWRITTEN.encode()),
    "pkg.py/inside.py": (XLA.encode(), XLA_REWRITTEN.encode()),  # a directory named like a file
    "empty.py": (b"", b""),
    "no_newline.py": (XLA.rstrip("\n").encode(), XLA_REWRITTEN.rstrip("\n").encode()),
    "crlf.py": (XLA.replace("\n", "\r\n").encode(), XLA_REWRITTEN.replace("\n", "\r\n").encode()),
    "cr.py": (XLA.replace("\n", "\r").encode(), XLA_REWRITTEN.replace("\n", "\r").encode()),
    "bom.py": (b"\xef\xbb\xbf" + XLA.encode(), b"\xef\xbb\xbf" + XLA_REWRITTEN.encode()),
    "tabs.py": (
        b"import torch_xla.core.xla_model as xm\nif True:\n\td = xm.xla_device()\n",
        b'import torch\nif True:\n\td = torch.device("tpu")\n',
    ),
    "latin1.py": (
        "# -*- coding: latin-1 -*-\nimport torch_xla.core.xla_model as xm\ns = 'café'\nd = xm.xla_device()\n".encode("latin-1"),
        "# -*- coding: latin-1 -*-\nimport torch\ns = 'café'\nd = torch.device(\"tpu\")\n".encode("latin-1"),
    ),
    "big_plain.py": (b"x = 1  # nothing to see here\n" * (BIG // 29 + 1), None),  # None: unchanged
}

BAD = {
    "syntax.py": (b"import torch_xla\ndef broken(:\n", "syntax error at line 2"),
    "py2_print.py": (b"import torch_xla\nprint 'hello'\n", "syntax error at line 2: Missing parentheses"),
    "py2_except.py": (
        b"import torch_xla\ntry:\n    pass\nexcept ValueError, e:\n    pass\n",
        "syntax error at line 4: multiple exception types must be parenthesized",
    ),
    "undecodable.py": (b"import torch_xla\nx = '\xff\xfe'\n", "cannot decode as utf-8"),
    "unknown_cookie.py": (b"# -*- coding: no-such-codec -*-\nimport torch_xla\n", "unknown encoding: no-such-codec"),
    "wrong_cookie.py": ("# coding: ascii\nimport torch_xla\ns = 'café'\n".encode(), "cannot decode as ascii"),
    "nul.py": (b"import torch_xla\nx = 1\x00\n", "cannot parse: source code string cannot contain null bytes"),
    "mixed_tabs.py": (b"import torch_xla\nif True:\n\tx = 1\n        y = 2\n", "syntax error at line 4: inconsistent use of tabs"),
    "deep_parens.py": (b"x = " + b"(" * 5000 + b"torch_xla" + b")" * 5000 + b"\n", "syntax error at line 1: too many nested parentheses"),
    "deep_binop.py": (
        b"import torch_xla.core.xla_model as xm\nx = " + b"1 + " * 100_000 + b"xm.xla_device()\n",
        "too deeply nested to rewrite",
    ),
    # Flat in Python's ast, a 30000-deep chain in libcst: its native parser used to overflow the C
    # stack here (a segfault that took the whole run down).
    "deep_and.py": (
        b"import torch_xla.core.xla_model as xm\nx = " + b"a and " * 30_000 + b"xm.xla_device()\n",
        "too deeply nested to rewrite (over 1000 levels of nested expressions at line 2)",
    ),
    "big_xla.py": (
        b"import torch_xla.core.xla_model as xm\n" + b"d = xm.xla_device()\n" * (BIG // 20),
        "too large to rewrite: 20.0 MiB, over the 1.0 MiB limit (--max-file-size)",
    ),
    "ü bad name.py": (b"import torch_xla\n)\n", "syntax error at line 2"),
}


def write(root: Path, name: str, data: bytes) -> None:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def error_lines(stderr: bytes) -> dict[str, str]:
    lines = stderr.decode().splitlines()
    errors = {}
    for line in lines:
        path, sep, message = line.partition(": error: ")
        assert sep, f"not a one-line error: {line!r}"
        assert path not in errors, f"two errors for {path}"
        errors[path] = message
    return errors


def test_a_tree_of_hostile_files(cli, tmp_path):
    root = tmp_path / "hostile tree ü"
    for name, (data, _) in {**GOOD, **BAD}.items():
        write(root, name, data)
    os.mkfifo(root / "fifo.py")  # unreadable for root too: never opened for reading
    (root / "dangling.py").symlink_to(root / "gone.py")
    (root / "loop.py").symlink_to(root / "loop.py")
    (root / "again").symlink_to(root)  # a directory loop: not entered
    missing = root / "missing.py"
    unreadable = root / "unreadable.py"
    write(root, "unreadable.py", XLA.encode())
    unreadable.chmod(0)
    locked = root / "locked"
    write(root, "locked/hidden.py", XLA.encode())
    locked.chmod(0)

    started = time.monotonic()
    try:
        result = cli("rewrite", str(root), str(missing))
    finally:
        unreadable.chmod(0o644)
        locked.chmod(0o755)
    elapsed = time.monotonic() - started

    assert result.returncode == 2, result.stderr
    errors = error_lines(result.stderr)
    expected = {str(root / name): message for name, (_, message) in BAD.items()}
    expected[str(root / "fifo.py")] = "cannot read: not a regular file"
    expected[str(root / "dangling.py")] = "cannot read: No such file or directory"
    expected[str(root / "loop.py")] = "cannot read: Too many levels of symbolic links"
    expected[str(missing)] = "no such file or directory"
    if os.geteuid() != 0:  # root reads and lists anything; the FIFO above fails for root too
        expected[str(unreadable)] = "cannot read: Permission denied"
        expected[str(locked)] = "cannot read directory: Permission denied"
    else:  # ... but a file without any write bit is read-only on purpose: not replaced
        expected[str(unreadable)] = "cannot write: Permission denied (the file is read-only)"
    for path, message in expected.items():
        assert path in errors, f"no error for {path}: {errors}"
        assert errors[path].startswith(message), (path, errors[path])
    assert set(errors) == set(expected)

    for name, (data, _) in BAD.items():
        assert (root / name).read_bytes() == data, f"{name} was touched"
    for name, (data, rewritten) in GOOD.items():
        assert (root / name).read_bytes() == (data if rewritten is None else rewritten), name
    assert not any(p.name.endswith(".tpu-migrate") for p in root.rglob("*"))
    # Two 20 MB files: the plain one only goes through the byte pre-filter, the torch_xla one is
    # refused by size before any parser sees it. Neither may take long.
    assert elapsed < 60, elapsed


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_segfault_sized_input_does_not_take_the_run_down(cli, tmp_path, jobs):
    """With a pool (and in-process), the good files next to the worst input are still written."""
    for i in range(4):
        write(tmp_path, f"good{i}.py", XLA.encode())
    data, message = BAD["deep_and.py"]
    write(tmp_path, "deep_and.py", data)
    result = cli("rewrite", "--jobs", jobs, str(tmp_path))
    assert result.returncode == 2, result.stderr
    assert error_lines(result.stderr) == {str(tmp_path / "deep_and.py"): message}
    for i in range(4):
        assert (tmp_path / f"good{i}.py").read_text() == XLA_REWRITTEN


def test_max_file_size_option(cli, tmp_path):
    path = tmp_path / "a.py"
    path.write_text(XLA)
    size = len(XLA)
    small = cli("rewrite", "--max-file-size", "50", str(path))
    assert small.returncode == 2
    assert error_lines(small.stderr) == {
        str(path): f"too large to rewrite: {size} bytes, over the 50 bytes limit (--max-file-size)"}
    assert path.read_text() == XLA
    # Sizes take binary units; 0 means no limit.
    assert cli("rewrite", "--check", "--max-file-size", "1K", str(path)).returncode == 1
    assert cli("rewrite", "--check", "--max-file-size", "0", str(path)).returncode == 1
    bad = cli("rewrite", "--max-file-size", "lots", str(path))
    assert bad.returncode == 2 and b"not a size" in bad.stderr
    # A file without torch_xla is never too large: it only passes the byte pre-filter.
    plain = tmp_path / "plain.py"
    plain.write_text("x = 1\n" * 100)
    assert cli("rewrite", "--max-file-size", "10", str(plain)).returncode == 0


@pytest.mark.parametrize("value, limited", [('"50"', True), ("50", True), ('"1K"', False), ("0", False)])
def test_max_file_size_from_pyproject(cli, tmp_path, value, limited):
    (tmp_path / "pyproject.toml").write_text(f"[tool.tpu-migrate]\nmax-file-size = {value}\n")
    path = tmp_path / "a.py"
    path.write_text(XLA)
    result = cli("rewrite", "--check", str(path), cwd=tmp_path)
    assert result.returncode == (2 if limited else 1), result.stderr
    assert (b"too large to rewrite" in result.stderr) == limited
    # The flag overrides the file.
    assert cli("rewrite", "--check", "--max-file-size", "0", str(path), cwd=tmp_path).returncode == 1


@pytest.mark.parametrize("value", ['"lots"', "-1", "true", "[1]"])
def test_max_file_size_bad_in_pyproject(cli, tmp_path, value):
    (tmp_path / "pyproject.toml").write_text(f"[tool.tpu-migrate]\nmax-file-size = {value}\n")
    path = tmp_path / "a.py"
    path.write_text(XLA)
    result = cli("rewrite", "--check", str(path), cwd=tmp_path)
    assert result.returncode == 2
    assert b"'max-file-size' must be a size" in result.stderr
    assert path.read_text() == XLA


EVIL_NAME = "a\n::error file=evil.py,line=1::injected.py"
EVIL_TEXT = ("import torch_xla.core.xla_model as xm\nd = xm.xla_device()\n"
             "# TODO(tpu-migrate): TPU099 look \x1b]0;title\x07 \x1b[31mred\x1b[0m\n")


def _no_raw_control(text: str) -> None:
    """Nothing a terminal obeys, and no line a CI log reads as a workflow command."""
    assert "\x1b" not in text and "\x07" not in text
    assert not [line for line in text.splitlines() if line.startswith("::")], text


@pytest.mark.parametrize("mode", ["--check", "--diff"])
def test_names_and_comments_cannot_inject_commands_or_escapes(cli, tmp_path, mode):
    """A file name with a line break and a workflow command, a TODO comment with OSC and colour
    sequences: every line of the text output shows them escaped; the diff still applies with
    git, and the suggested command names the file."""
    import subprocess

    (tmp_path / EVIL_NAME).write_text(EVIL_TEXT)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    result = cli("rewrite", mode, ".", cwd=tmp_path)
    out, err = result.stdout.decode(), result.stderr.decode()
    _no_raw_control(err)
    if mode == "--diff":  # the file's own lines stay as they are (git apply needs them so), the rest not
        _no_raw_control("\n".join(line for line in out.splitlines() if not line.startswith((" ", "-", "+"))
                                  or line.startswith(("--- ", "+++ "))))
        assert not [line for line in out.splitlines() if line.startswith("::")]
    else:
        _no_raw_control(out)
    if mode == "--check":
        assert "a\\n::error file=evil.py,line=1::injected.py:3:1 TPU099 look \\x1b]0;title\\x07" in out
        command = next(line for line in out.splitlines() if line.startswith("run: "))[len("run: "):]
        listed = subprocess.run(["bash", "-c", command.replace("tpu-migrate rewrite", "ls", 1)], cwd=tmp_path,
                                capture_output=True, text=True)
        assert listed.returncode == 0 and EVIL_NAME in listed.stdout, (command, listed.stderr)
    else:
        (tmp_path / "x.diff").write_text(out)
        applied = subprocess.run(["git", "apply", "x.diff"], cwd=tmp_path, capture_output=True, text=True)
        assert applied.returncode == 0, applied.stderr
        assert "xla_device" not in (tmp_path / EVIL_NAME).read_text()


@pytest.mark.slow  # a traced run
def test_diagnose_names_and_source_lines_cannot_inject(tmp_path):
    """diagnose's report on stderr: the script's name and the source lines it quotes, escaped."""
    import subprocess
    import sys

    from conftest import ROOT

    script = tmp_path / "train\n::error file=evil.py,line=1::x.py"
    script.write_text(
        "import torch\n"
        "model = torch.nn.Linear(4, 1)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for step in range(6):\n"
        "    loss = model(torch.randn(8, 4)).pow(2).mean()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    optimizer.zero_grad()\n"
        "    print(loss.item())  # \x1b]0;title\x07 read every step\n")
    result = subprocess.run([sys.executable, "-m", "tpu_migrate", "diagnose", "--backend", "native", str(script)],
                            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    report = result.stderr[result.stderr.index("tpu-migrate diagnose:"):]
    _no_raw_control(report)
    assert "train\\n::error file=evil.py,line=1::x.py" in report
    assert "\\x1b]0;title\\x07 read every step" in report


def test_small_first_day_frictions(cli, tmp_path):
    """A missing path is an error, not a file scanned; a named notes.txt that happens to parse is
    not rewritten as Python; a binary .py says it is binary, not that its encoding declaration
    is wrong."""
    (tmp_path / "good.py").write_text("import torch_xla.core.xla_model as xm\nd = xm.xla_device()\n")
    (tmp_path / "notes.txt").write_text("import torch_xla.core.xla_model as xm\nd = xm.xla_device()\n")
    (tmp_path / "blob.py").write_bytes(b"\x00\xff\xfeimport torch_xla\n")
    missing = cli("rewrite", "--check", "nope/", "good.py", cwd=tmp_path)
    assert b"1 file(s) scanned" in missing.stdout and b"nope/: error: no such file or directory" in missing.stderr
    named = cli("rewrite", "notes.txt", "blob.py", cwd=tmp_path)
    assert named.returncode == 2
    err = named.stderr.decode()
    assert "notes.txt: error: not a Python file or notebook (.txt file); nothing to rewrite" in err
    assert "blob.py: error: a binary file (it holds NUL bytes), not Python source" in err
    assert (tmp_path / "notes.txt").read_text().startswith("import torch_xla")
