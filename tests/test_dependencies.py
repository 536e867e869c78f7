"""TPU098: dependencies on torch_xla / optimum-tpu in files that are not Python
(tpu_migrate.rewrite.dependencies, for the CLI to report)."""

from __future__ import annotations

import pytest

from tpu_migrate.rewrite.dependencies import install_line, is_dependency_file, scan_dependency_file


def found(path: str, text: str) -> list[tuple[int, int]]:
    return [(m.line, m.col) for m in scan_dependency_file(path, text.encode())]


def test_requirements_lines():
    text = (
        "numpy\n"
        "torch~=2.9\n"
        "torch_xla[tpu]~=2.5 ; python_version > '3.9'  # the TPU build\n"
        "# torch_xla  (a comment)\n"
        "-r base.txt\n"
        "torch-xlax\n"
        "  Torch-XLA==2.5\n"
        "optimum-tpu @ git+https://github.com/huggingface/optimum-tpu\n"
    )
    assert found("requirements-tpu.txt", text) == [(3, 1), (7, 3), (8, 1)]
    finding = scan_dependency_file("requirements.txt", text.encode())[0]
    assert finding.code == "TPU098" and "torch_xla[tpu]~=2.5" in finding.message


def test_pyproject_dependency_arrays_and_tables():
    text = (
        "[project]\n"
        "name = \"torch_xla_tools\"\n"
        "dependencies = [\n"
        "  \"torch\",\n"
        "  \"torch-xla>=2.5\",  # \"torch_xla\" in a comment\n"
        "]\n"
        "[project.optional-dependencies]\n"
        "tpu = [\"torch_xla[tpu]\", \"optimum-tpu\"]\n"
        "[tool.poetry.dependencies]\n"
        "torch_xla = \"^2.5\"\n"
    )
    assert found("pyproject.toml", text) == [(5, 4), (8, 9), (10, 1)]  # one per line


def test_setup_cfg_and_environment_yml():
    assert found("setup.cfg", "[options]\ninstall_requires =\n    torch\n    torch_xla\n") == [(4, 5)]
    assert found("environment.yml", "dependencies:\n  - python=3.11\n  - pip:\n    - torch_xla==2.5\n") == [(4, 7)]


def test_other_files_and_names():
    assert is_dependency_file("a/requirements.txt") and is_dependency_file("requirements-dev.txt")
    assert is_dependency_file("pyproject.toml") and is_dependency_file("setup.cfg")
    assert not is_dependency_file("setup.py")  # Python: the rewriter marks its strings
    assert not is_dependency_file("README.md")
    assert found("requirements.txt", "torch\nnumpy\n") == []
    assert found("requirements.txt", b"\xff\xfetorch_xla\n".decode("latin-1")) == []


@pytest.mark.parametrize("line, expected", [
    ("!pip install torch_xla[tpu] -f https://example.com", (13, "torch_xla")),
    ("%pip install -q torch-xla==2.5", (16, "torch-xla")),
    ("!python -m pip install optimum-tpu", (23, "optimum-tpu")),
    ("!pip install torch", None),
    ("!pip install torch_xlax", None),
    ("!echo torch_xla", None),
])
def test_install_lines(line, expected):
    assert install_line(line) == expected


@pytest.mark.slow
def test_the_cli_reports_dependency_files_found_or_named(cli, tmp_path):
    """`rewrite .` finds requirements*.txt and pyproject.toml beside the code and reports what
    still installs torch_xla (exit 1 under --check); named, a requirements file is scanned, not
    parsed as Python; neither is ever written."""
    (tmp_path / "requirements-tpu.txt").write_text("numpy\ntorch-xla[tpu]==2.5.0  # the runtime\n")
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\ndependencies = ["torch_xla>=2.5"]\n')
    (tmp_path / "setup.cfg").write_text("[metadata]\nname = x\n")  # nothing to report
    (tmp_path / "train.py").write_text("import os\n")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    result = cli("rewrite", "--check", "--no-cache", ".", cwd=tmp_path)
    out = result.stdout.decode()
    assert result.returncode == 1, out + result.stderr.decode()
    assert "requirements-tpu.txt:2:1 TPU098" in out and "pyproject.toml:3:18 TPU098" in out
    assert "4 file(s) scanned" in out and "2 manual finding(s)" in out
    named = cli("rewrite", "--no-cache", "requirements-tpu.txt", cwd=tmp_path)
    assert named.returncode == 1 and b"requirements-tpu.txt:2:1 TPU098" in named.stdout
    assert b"not a Python file" not in named.stdout + named.stderr
    ignored = cli("rewrite", "--check", "--no-cache", "--ignore", "TPU098", ".", cwd=tmp_path)
    assert ignored.returncode == 0, ignored.stdout.decode()
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
