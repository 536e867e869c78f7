"""The port's code that differs from tpu-migrate's migration (verify --against): no program runs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import fidelity
from conftest import ROOT
from tpu_migrate.verify import source_diff
from tpu_migrate.verify.source_diff import differing_code, program_file


def test_the_port_s_own_lines_are_named_not_its_comments_or_indentation(tmp_path):
    (tmp_path / "migrated.py").write_text("a = 1\nb = 2\n# why\nc = 3\nd = 4\ne = 5\n")
    (tmp_path / "port.py").write_text("a = 1\n    b = 2\n# my note\nc = 30\nd = 4\n")
    assert differing_code(tmp_path / "migrated.py", tmp_path / "port.py") == [
        "port.py:4: c = 30 (the migration: c = 3)", "port.py:5: after it, the migration's e = 5 is missing"]


def test_past_three_hunks_the_rest_are_counted(tmp_path):
    (tmp_path / "migrated.py").write_text("".join(f"x{i} = {i}\nkeep{i} = 0\n" for i in range(5)))
    (tmp_path / "port.py").write_text("".join(f"x{i} = -{i}\nkeep{i} = 0\n" for i in range(5)))
    code = differing_code(tmp_path / "migrated.py", tmp_path / "port.py")
    assert code[0] == "port.py:1: x0 = -0 (the migration: x0 = 0)" and code[3:] == ["and 2 more hunk(s)"]


def test_a_module_s_file_is_found_in_its_tree_or_as_its_package_s_main(tmp_path):
    (tmp_path / "pkg" / "train").mkdir(parents=True)
    (tmp_path / "pkg" / "train" / "__main__.py").write_text("")
    assert program_file(tmp_path, "pkg.train", (tmp_path,)) == tmp_path / "pkg" / "train" / "__main__.py"
    assert program_file(tmp_path, "pkg.other", (tmp_path,)) is None


# --- The hunks that feed the first divergent quantity first (issue 48, item 4) ----------------
# m05's portable migration, made in process (no program runs), and what a port changes in it.

M05 = ROOT / "fixtures" / "programs" / "multiprocess" / "m05_optimizer_step_no_ddp.py"
LOSS_AT_STEP_0 = SimpleNamespace(unit="step", step=0, quantity="loss", where="port.py:79: optimizer.step()")
STEP_LINE = '@step {"step": 0, "loss": 1.3, "unchanged": 1.0}'
EXTRA_PRINT = SimpleNamespace(unit="printed line", step=1, quantity="processes that print it",
                              where=f"{STEP_LINE}  |  {STEP_LINE}")
UNRELATED = ('return "29500"', 'return "29501"')  # the launcher's port: feeds no figure


@pytest.fixture(scope="module")
def m05():
    original = M05.read_text()
    return original, fidelity.rewrite_text(original.encode(), M05.name, "portable").decode()


def test_the_port_s_hunk_that_feeds_the_divergent_loss_comes_first_the_others_counted(m05):
    """A port that changed the launcher's port (above) and the rank's slice (below): the loss at
    step 0 differs; the slice from the backward and the step reaches `start`, not the port."""
    _, migrated = m05
    port = migrated.replace(*UNRELATED).replace("start = dist.get_rank() *", "start = 0 *")
    assert differing_code_of(migrated, port)[0].endswith('return "29501" (the migration: return "29500")')
    named = source_diff.named(source_diff.Sources(migrated, port, "m05.py", "port.py"), LOSS_AT_STEP_0)
    assert named[0].startswith("port.py:66: start = 0 * (GLOBAL_BATCH // world) (the migration: start = "
                               "dist.get_rank()")
    assert named[1:] == ["and 1 more hunk(s), 1 of them not feeding the loss at step 0"]


def test_where_no_hunk_feeds_the_quantity_the_report_says_so(m05):
    _, migrated = m05
    named = source_diff.named(source_diff.Sources(migrated, migrated.replace(*UNRELATED), "m05.py", "port.py"),
                              LOSS_AT_STEP_0)
    assert named == ["none of the 1 hunk(s) feeds the loss at step 0 (a static slice of the program from it); the "
                     "first:", 'port.py:39: return "29501" (the migration: return "29500")']


def test_a_printed_line_s_slice_starts_at_its_print_and_takes_the_test_around_it(m05):
    """Every rank prints the step line: the guard that was the master's is the hunk named."""
    _, migrated = m05
    guard = 'if int(os.environ.get("LOCAL_RANK", 0)) == 0:\n            print("@step "'
    port = migrated.replace(*UNRELATED).replace(guard, 'if True:\n            print("@step "')
    named = source_diff.named(source_diff.Sources(migrated, port, "m05.py", "port.py"), EXTRA_PRINT)
    assert named == ['port.py:88: if True: (the migration: if int(os.environ.get("LOCAL_RANK", 0)) == 0:)',
                     "and 1 more hunk(s), 1 of them not feeding the printed line 1"]


def test_without_against_the_rewrite_s_own_hunks_are_named_by_the_original_s_lines(m05):
    """verify migrating the original itself: the original's converted lines nearest the loss (the
    optimizer step) first, never the imports; for the printed step line, its guard's hunk first."""
    original, migrated = m05
    sources = source_diff.Sources(original, migrated, "m05.py", "m05.py", converted=True)
    named = source_diff.named(sources, LOSS_AT_STEP_0)
    assert named[0].startswith("m05.py:46-47: xm.optimizer_step(optimizer); loss = xm.all_reduce(") \
        and "(migrated: if dist.get_world_size() > 1:;" in named[0]
    assert len(named) == 4 and named[3].endswith("of them not feeding the loss at step 0")
    assert not any("import" in line for line in named)
    assert "if xm.is_master_ordinal():" in source_diff.named(sources, EXTRA_PRINT)[0]


def differing_code_of(before: str, after: str) -> list[str]:
    return source_diff.named(source_diff.Sources(before, after, "m05.py", "port.py"), None)
