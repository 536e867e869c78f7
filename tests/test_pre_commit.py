"""The pre-commit hooks, through the real pre-commit and git, in a temporary repository whose
.pre-commit-config.yaml points at this checkout (at its current commit)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow  # pre-commit installs the hooks into its own environments

XLA = "import torch_xla.core.xla_model as xm\n\ndevice = xm.xla_device()\nxm.mark_step()\n"
REWRITTEN = 'import torch\n\ndevice = torch.device("tpu")\n'
# Migrated already, with the manual work left: no torch_xla, only the TODO comment.
TODO = "# TODO(tpu-migrate): TPU060 start the workers by hand\n"
MIGRATED = f"import os\n\n{TODO}os.getpid()\n"


@pytest.fixture(scope="module")
def pre_commit_home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("pre-commit-home")  # hook environments, shared by the tests


def git(repo: Path, *args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, env=env, timeout=900)


def make_repo(tmp_path: Path, hook: str, home: Path, source: str = XLA):
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
    (repo / "train.py").write_text(source)
    git(repo, "add", "-A")
    return repo, env


def test_fix_hook_rewrites_and_fails_then_passes(tmp_path, pre_commit_home):
    repo, env = make_repo(tmp_path, "tpu-migrate", pre_commit_home)
    first = git(repo, "commit", "-q", "-m", "add training script", env=env)
    assert first.returncode != 0, first.stdout + first.stderr
    assert "Rewrote: train.py" in first.stdout + first.stderr
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


@pytest.mark.parametrize("hook", ["tpu-migrate", "tpu-migrate-check"])
def test_both_hooks_fail_on_an_open_todo_until_it_is_removed(tmp_path, pre_commit_home, hook):
    """A TODO(tpu-migrate) comment is manual work still to do, even once nothing refers to
    torch_xla any more: the commit fails, naming it, until a person removes the comment."""
    repo, env = make_repo(tmp_path, hook, pre_commit_home, source=MIGRATED)
    blocked = git(repo, "commit", "-q", "-m", "add training script", env=env)
    assert blocked.returncode != 0
    assert "train.py:3:1 TPU060 start the workers by hand" in blocked.stdout + blocked.stderr
    assert (repo / "train.py").read_text() == MIGRATED  # nothing to write
    (repo / "train.py").write_text(MIGRATED.replace(TODO, ""))
    git(repo, "add", "-A")
    done = git(repo, "commit", "-q", "-m", "add training script", env=env)
    assert done.returncode == 0, done.stdout + done.stderr


def _readme_local_hook_config() -> str:
    """The first YAML block of the documentation's pre-commit section (docs/ci.md): the snippet
    users paste as is."""
    text = (ROOT / "docs" / "ci.md").read_text()
    section = text[text.index("## pre-commit"):]
    return section.split("```yaml\n", 1)[1].split("```", 1)[0]


def test_the_readme_local_hook_works_as_pasted(tmp_path, pre_commit_home):
    """The documentation promises a snippet without placeholders: paste it, commit, and the check runs the
    installed tpu-migrate (on PATH, as in a project's environment)."""
    config = _readme_local_hook_config()
    assert "<" not in config and "repo: local" in config
    repo, env = make_repo(tmp_path, "tpu-migrate-check", pre_commit_home)
    (repo / ".pre-commit-config.yaml").write_text(config)
    git(repo, "add", "-A")
    blocked = git(repo, "commit", "-q", "-m", "add training script", env=env)
    assert blocked.returncode != 0
    assert "1 would change" in blocked.stdout + blocked.stderr
    assert (repo / "train.py").read_text() == XLA
    (repo / "train.py").write_text(REWRITTEN)
    git(repo, "add", "-A")
    passed = git(repo, "commit", "-q", "-m", "add the migrated script", env=env)
    assert passed.returncode == 0, passed.stdout + passed.stderr
