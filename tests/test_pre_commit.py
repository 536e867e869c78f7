"""The pre-commit hooks, through the real pre-commit and git, in a temporary repository whose
.pre-commit-config.yaml points at this checkout (at its current commit)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

XLA = "import torch_xla.core.xla_model as xm\n\ndevice = xm.xla_device()\nxm.mark_step()\n"
REWRITTEN = 'import torch\n\ndevice = torch.device("tpu")\n'


@pytest.fixture(scope="module")
def pre_commit_home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("pre-commit-home")  # hook environments, shared by the tests


def git(repo: Path, *args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, env=env, timeout=900)


def make_repo(tmp_path: Path, hook: str, home: Path):
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    repo = tmp_path / "project"
    repo.mkdir()
    env = {**os.environ, "PRE_COMMIT_HOME": str(home),
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    env.pop("PYTHONPATH", None)
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "test@example.com")
    git(repo, "config", "user.name", "test")
    (repo / ".pre-commit-config.yaml").write_text(
        f"repos:\n  - repo: {ROOT}\n    rev: {head}\n    hooks:\n      - id: {hook}\n"
    )
    subprocess.run([sys.executable, "-m", "pre_commit", "install"], cwd=repo, env=env, check=True,
                   capture_output=True)
    (repo / "train.py").write_text(XLA)
    git(repo, "add", "-A")
    return repo, env


def test_fix_hook_rewrites_and_fails_then_passes(tmp_path, pre_commit_home):
    repo, env = make_repo(tmp_path, "tpu-migrate", pre_commit_home)
    first = git(repo, "commit", "-q", "-m", "add training script", env=env)
    assert first.returncode != 0, first.stdout + first.stderr
    assert (repo / "train.py").read_text() == REWRITTEN  # the rewrite is left in the working tree
    git(repo, "add", "-A")
    second = git(repo, "commit", "-q", "-m", "add training script", env=env)
    assert second.returncode == 0, second.stdout + second.stderr
    assert git(repo, "show", "HEAD:train.py").stdout == REWRITTEN


def test_check_hook_fails_without_touching_the_file(tmp_path, pre_commit_home):
    repo, env = make_repo(tmp_path, "tpu-migrate-check", pre_commit_home)
    result = git(repo, "commit", "-q", "-m", "add training script", env=env)
    assert result.returncode != 0
    assert (repo / "train.py").read_text() == XLA
    assert "1 would change" in result.stdout + result.stderr
