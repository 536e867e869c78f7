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


def test_requirement_directories_and_container_files():
    assert is_dependency_file("requirements/tpu.txt") and is_dependency_file("requirements-ci/base.in")
    assert is_dependency_file("environment-tpu.yml") and is_dependency_file("docker/Dockerfile.tpu")
    assert is_dependency_file("Dockerfile") and is_dependency_file("tpu.dockerfile")
    assert not is_dependency_file("docs/notes.txt")  # a .txt outside a requirements directory
    dockerfile = ("FROM python:3.11\nRUN pip install torch torch_xla[tpu] -f https://x  # runtime\n"
                  "RUN python -m pip install numpy \\\n    optimum-tpu==0.2 \\\n    rich\n"
                  "RUN echo torch_xla\n# RUN pip install torch_xla\n")
    assert found("Dockerfile", dockerfile) == [(2, 23), (4, 5)]


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


@pytest.mark.slow
def test_dependency_files_are_found_wherever_a_team_keeps_them(cli, tmp_path):
    """`rewrite --check requirements/` scanned nothing and exited 0 with requirements/tpu.txt
    pinning torch_xla[tpu]; naming the file said "not a Python file". Requirement directories,
    environment-*.yml and Dockerfiles are found in a tree and scanned when named."""
    (tmp_path / "requirements").mkdir()
    (tmp_path / "requirements" / "tpu.txt").write_text("numpy\ntorch_xla[tpu]~=2.5\n")
    (tmp_path / "requirements" / "base.in").write_text("torch\n")
    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "Dockerfile.tpu").write_text("FROM python:3.11\nRUN pip install torch_xla[tpu]\n")
    (tmp_path / "environment-tpu.yml").write_text("dependencies:\n  - pip:\n    - torch-xla\n")
    (tmp_path / "notes.txt").write_text("torch_xla[tpu]\n")  # not a dependency file
    result = cli("rewrite", "--check", "--no-cache", "requirements/", cwd=tmp_path)
    assert result.returncode == 1, result.stdout.decode() + result.stderr.decode()
    assert b"requirements/tpu.txt:2:1 TPU098" in result.stdout and b"2 file(s) scanned" in result.stdout
    named = cli("rewrite", "--check", "--no-cache", "requirements/tpu.txt", cwd=tmp_path)
    assert named.returncode == 1 and b"not a Python file" not in named.stdout + named.stderr
    tree = cli("rewrite", "--check", "--no-cache", ".", cwd=tmp_path).stdout.decode()
    assert "docker/Dockerfile.tpu:2:17 TPU098" in tree and "environment-tpu.yml:3:7 TPU098" in tree
    # notes.txt is no dependency file: not scanned, only listed as a text file that mentions torch_xla.
    assert "notes.txt:1:1" not in tree and "4 file(s) scanned" in tree
    assert "not rewritten: 1 script or config file(s) mention torch_xla" in tree and "\n  notes.txt:1: torch_xla[tpu]" in tree
