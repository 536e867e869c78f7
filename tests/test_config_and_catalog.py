"""[tool.tpu-migrate] configuration, --fix-level, and the `rules` / `explain` commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tpu_migrate.rules import TARGETS, load_catalog, rule_examples

SOURCE = (
    "import torch_xla.core.xla_model as xm\n"
    "import torch_xla.distributed.parallel_loader as pl\n"
    "\n"
    "device = xm.xla_device()\n"
    "for x, y in pl.MpDeviceLoader(loader, device):\n"
    "    print(x, y)\n"
)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text(SOURCE)
    (tmp_path / "src" / "legacy.py").write_text(SOURCE)
    return tmp_path


def write_config(project: Path, body: str) -> None:
    (project / "pyproject.toml").write_text(f'[project]\nname = "demo"\n\n[tool.tpu-migrate]\n{body}')


def check_json(cli, project, *args):
    result = cli("rewrite", "--check", "--format", "json", *args, "src", cwd=project)
    return result, json.loads(result.stdout) if result.stdout else None


@pytest.mark.slow
def test_config_sets_target_select_exclude_and_fix_level(cli, project):
    write_config(project, 'target = "portable"\nselect = ["TPU0"]\nexclude = ["legacy.py"]\nfix-level = "safe"\n')
    result, doc = check_json(cli, project)
    assert doc["target"] == "portable"
    assert [f["path"] for f in doc["files"]] == ["src/train.py"]
    train = doc["files"][0]
    # TPU040 is unsafe: not applied; and the device waits with it (TPU001 is selected, but a
    # tpu device beside torch_xla's MpDeviceLoader runs on neither stack).
    assert [f["code"] for f in train["fixes"]] == []
    assert [(m["code"], m["message"]) for m in train["manual"]] == [
        ("TPU001", "not applied at --fix-level safe: it goes with TPU040 (line 5), an unsafe fix held back, "
                   "and this file runs on torch_xla until both convert"),
        ("TPU040", "unsafe fix not applied at --fix-level safe: `pl.MpDeviceLoader` / "
                   "`ParallelLoader(...).per_device_loader` become the plain loader plus `.to(device)`"),
    ]


@pytest.mark.slow
def test_cli_flags_override_the_config(cli, project):
    write_config(project, 'target = "portable"\nfix-level = "safe"\nignore = ["TPU001"]\n')
    result, doc = check_json(cli, project, "--target", "tpu", "--fix-level", "unsafe", "--ignore", "TPU099")
    assert doc["target"] == "tpu"
    codes = {f["code"] for entry in doc["files"] for f in entry["fixes"]}
    assert codes == {"TPU001", "TPU040"}


@pytest.mark.slow
def test_config_is_found_from_a_subdirectory_path(cli, project):
    write_config(project, 'ignore = ["TPU001"]\n')
    result = cli("rewrite", "--check", "--format", "json", "src/train.py", cwd=project / "src")
    assert result.returncode == 2  # src/src/train.py does not exist from there
    result = cli("rewrite", "--check", "--format", "json", "train.py", cwd=project / "src")
    doc = json.loads(result.stdout)
    assert "TPU001" not in {f["code"] for f in doc["files"][0]["fixes"]}


@pytest.mark.parametrize(
    "body, message",
    [
        ('targett = "tpu"\n', "unknown key 'targett'"),
        ('target = "gpu"\n', "'target' must be one of tpu, portable"),
        ('fix-level = "all"\n', "'fix-level' must be one of safe, unsafe"),
        ('select = "TPU001"\n', "'select' must be a list of strings"),
        ('select = ["NOPE"]\n', "no rule matches 'NOPE'"),
        ("target = \n", "invalid TOML"),
    ],
)
def test_bad_config_is_one_error_line_naming_the_file_and_the_problem(cli, project, body, message):
    write_config(project, body)
    result = cli("rewrite", "--check", "src", cwd=project)
    assert result.returncode == 2
    [line] = result.stderr.decode().splitlines()  # no click `Usage:` boilerplate
    assert line.startswith(f"tpu-migrate: error: {project / 'pyproject.toml'}: ")
    assert message in line
    assert (project / "src" / "train.py").read_text() == SOURCE


@pytest.mark.slow
@pytest.mark.parametrize("where, args", [
    ("", ["."]), ("", ["src"]), ("", ["./src/"]), ("", ["src/train.py", "./src/legacy.py"]),
    ("", ["ABS/src"]), ("", ["ABS/src/legacy.py", "ABS/src/train.py"]), ("src", ["."]), ("src", ["legacy.py", "train.py"]),
])
def test_config_excludes_are_relative_to_the_pyproject_whatever_the_path_spelling(cli, project, where, args):
    write_config(project, 'exclude = ["src/legacy.py"]\n')
    args = [a.replace("ABS", str(project)) for a in args]
    result = cli("rewrite", "--check", "--format", "json", *args, cwd=project / where)
    # (pyproject.toml is scanned too, for torch_xla requirements: TPU098)
    names = [Path(f["path"]).name for f in json.loads(result.stdout)["files"] if f["path"].endswith(".py")]
    assert names == ["train.py"], (args, names)


@pytest.mark.slow
def test_a_named_path_that_is_excluded_is_skipped_with_a_word_under_verbose(cli, project):
    """pre-commit names every staged file, excluded or not: silent by default, said with -v (and
    which setting excluded it)."""
    write_config(project, 'exclude = ["src/legacy.py"]\n')
    quiet = cli("rewrite", "--check", "src/legacy.py", cwd=project)
    assert quiet.returncode == 0 and b"skipped" not in quiet.stderr
    loud = cli("rewrite", "--check", "-v", "src/legacy.py", "src/train.py", "--exclude", "src/train.py", cwd=project)
    lines = [line for line in loud.stderr.decode().splitlines() if "skipped" in line]
    config = f"{project / 'pyproject.toml'}: [tool.tpu-migrate] exclude"
    assert lines == [f"src/legacy.py: skipped: it matches an exclude pattern ({config} or --exclude)",
                     f"src/train.py: skipped: it matches an exclude pattern ({config} or --exclude)"]
    assert (project / "src" / "legacy.py").read_text() == SOURCE


@pytest.mark.slow
def test_exclude_flags_are_relative_to_the_working_directory(cli, project):
    def names(*args, cwd=project):
        result = cli("rewrite", "--check", "--format", "json", *args, cwd=cwd)
        return sorted(Path(f["path"]).name for f in json.loads(result.stdout)["files"] if f["path"].endswith(".py"))

    for spelling in (".", "src", "./src", str(project / "src"), "src/legacy.py"):
        assert "legacy.py" not in names("--exclude", "src/legacy.py", spelling, "src/train.py"), spelling
        assert "legacy.py" not in names("--exclude", "./src/leg*", spelling, "src/train.py"), spelling
    # Relative to where the command runs, not to the pyproject.toml or the PATH argument.
    assert names("--exclude", "src/legacy.py", ".", cwd=project / "src") == ["legacy.py", "train.py"]
    assert names("--exclude", "legacy.py", ".", cwd=project / "src") == ["train.py"]  # a name: anywhere
    assert names("--exclude", "src", ".") == []  # a directory: everything below it


@pytest.mark.slow
def test_fix_level_safe_keeps_unsafe_code_without_todo_comments(cli, project):
    cli("rewrite", "--fix-level", "safe", "src/train.py", cwd=project)
    text = (project / "src" / "train.py").read_text()
    assert "pl.MpDeviceLoader(loader, device)" in text and "TODO" not in text
    # The device goes into the loader left to torch_xla: both wait, so the file still runs.
    assert "device = xm.xla_device()" in text
    cli("rewrite", "src/train.py", cwd=project)  # the default level then applies the rest
    text = (project / "src" / "train.py").read_text()
    # The loader moved only the batch's tensors: so does the converted loop.
    assert "x, y = _map_tensors((x, y), lambda t: t.to(device))" in text and 'torch.device("tpu")' in text
    assert "TODO" not in text


def test_rules_lists_every_rule(cli):
    text = cli("rules").stdout.decode()
    catalog = load_catalog()
    for rule in catalog.rules:
        assert f"{rule.code}  {rule.name}" in text
    doc = json.loads(cli("rules", "--format", "json").stdout)
    assert [r["code"] for r in doc] == [r.code for r in catalog.rules]
    assert set(doc[0]) == {"code", "name", "safety", "targets", "summary"}


def explain_in_process(code: str) -> str:
    """`tpu-migrate explain CODE`'s output, the same bytes as through a subprocess (which costs
    ~0.5 s of start-up per rule: 40 s for the catalog; the test below compares one with the real one)."""
    from click.testing import CliRunner

    from tpu_migrate.cli import main

    result = CliRunner().invoke(main, ["explain", code], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.stdout


def test_every_rule_is_explained_with_its_own_fixture(cli):
    first = load_catalog().rules[0].code
    assert cli("explain", first).stdout.decode() == explain_in_process(first)
    for rule in load_catalog().rules:
        cases = rule_examples(rule)
        assert cases, rule.code
        out = explain_in_process(rule.code.lower())
        assert out.startswith(f"{rule.code} {rule.name} ({rule.safety}" + (", also on torch_xla)" if rule.also_on_torch_xla else ")"))
        assert rule.explanation.splitlines()[0] in out
        for target in TARGETS:
            assert f"Example, --target {target}:" in out
        # The diff shown is the fixture's: its added lines are lines of the expected output.
        expected = cases[0].with_name(cases[0].name.replace(".in.py", ".tpu.py")).read_text()
        tpu_part = out.split("Example, --target tpu:")[1].split("Example, --target portable:")[0]
        added = [l[1:] for l in tpu_part.splitlines() if l.startswith("+") and not l.startswith("+++")]
        assert added or "(no change)" in tpu_part, rule.code
        assert all(line in expected for line in added), rule.code


def test_explain_unknown_rule(cli):
    result = cli("explain", "TPU999")
    assert result.returncode == 2 and b"unknown rule 'TPU999'" in result.stderr


@pytest.mark.slow
def test_wheel_carries_rules_and_examples(tmp_path):
    """A non-editable install (what pre-commit does) finds the rule tables and fixtures."""
    import subprocess
    import sys
    import zipfile

    from conftest import ROOT

    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(ROOT)],
        capture_output=True, text=True,
    )
    if result.returncode != 0 and "hatchling" in result.stderr:
        result = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(tmp_path), str(ROOT)],
            capture_output=True, text=True,
        )
    assert result.returncode == 0, result.stderr[-2000:]
    wheel = next(tmp_path.glob("tpu_migrate-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "tpu_migrate/_rules/steps.toml" in names
    assert any(n.startswith("tpu_migrate/_fixtures/rewrite/TPU001-xla-device/") for n in names)


def test_settings_above_the_project_root_never_apply(cli, tmp_path):
    """A parent directory's pyproject.toml is not the project's: its exclude (which would turn
    every check green) and its broken TOML (which would fail every run) are never read, whether
    the project's root is marked by its own pyproject.toml or by .git."""
    (tmp_path / "pyproject.toml").write_text('[tool.tpu-migrate]\nexclude = ["*.py"]\n')
    for marker in ("pyproject.toml", ".git"):
        project = tmp_path / f"project-{marker.strip('.')}"
        (project / "src").mkdir(parents=True)
        (project / "src" / "train.py").write_text(SOURCE)
        if marker == ".git":
            (project / ".git").mkdir()
        else:
            (project / "pyproject.toml").write_text('[project]\nname = "demo"\n')
        result = cli("rewrite", "--check", "-v", "src", cwd=project)
        assert result.returncode == 1, result.stderr  # train.py is checked: it has fixes
        assert f"configuration: none (no [tool.tpu-migrate] in the project, {project})" in result.stderr.decode()
    (tmp_path / "pyproject.toml").write_text("[tool.tpu-migrate\n")  # broken, above the root
    result = cli("rewrite", "--check", "src", cwd=tmp_path / "project-git")
    assert result.returncode == 1, result.stderr


def test_verbose_names_the_configuration_in_use(cli, project):
    write_config(project, 'ignore = ["TPU001"]\n')
    result = cli("rewrite", "--check", "-v", "src", cwd=project)
    assert f"configuration: {project / 'pyproject.toml'}: [tool.tpu-migrate]" in result.stderr.decode()


def test_every_bad_key_of_the_config_is_named_in_one_line(cli, project):
    write_config(project, 'target = "x"\nselect = 3\nspeed = "fast"\n')
    result = cli("rewrite", "--check", "src", cwd=project)
    assert result.returncode == 2
    [line] = result.stderr.decode().splitlines()
    assert "unknown key 'speed'" in line and "'target' must be one of tpu, portable, not 'x'" in line
    assert "'select' must be a list of strings" in line


def test_the_project_of_a_missing_first_path_is_its_folder_s_not_the_working_directory(tmp_path, monkeypatch):
    """`rewrite gone.py good.py` (a dangling link named first) looked for the project from the
    working directory: run from a large checkout, the project passes read all of it (27 s for
    three files in tests/test_cli.py)."""
    from tpu_migrate.config import project_root

    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (project / "src" / "gone.py").symlink_to(project / "src" / "nowhere.py")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "pyproject.toml").write_text("[project]\nname = 'q'\n")
    monkeypatch.chdir(elsewhere)
    assert project_root([str(project / "src" / "gone.py")]) == project.resolve()
    assert project_root([str(project / "src" / "missing" / "x.py")]) == project.resolve()
