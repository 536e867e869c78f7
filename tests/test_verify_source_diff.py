"""The port's code that differs from tpu-migrate's migration (verify --against): no program runs."""

from __future__ import annotations

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
