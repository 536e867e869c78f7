"""Which of verify's runs go at once (tpu_migrate/verify/schedule.py): no program runs here."""

from __future__ import annotations

import os

from tpu_migrate.verify import schedule


def test_runs_go_at_once_as_far_as_the_cores_hold_their_processes():
    plan = [("original, again", 1), ("migrated, 1", 1), ("migrated, 2", 2), ("migrated, 4", 4)]
    plan = [(name, None, None, processes) for name, processes in plan]
    names = lambda waves: [[item[0] for item in wave] for wave in waves]  # noqa: E731
    assert names(schedule.waves(plan, 2)) == [["original, again", "migrated, 1"], ["migrated, 2"], ["migrated, 4"]]
    assert names(schedule.waves(plan, 4)) == [["original, again", "migrated, 1", "migrated, 2"], ["migrated, 4"]]
    assert names(schedule.waves(plan, 1)) == [[item[0]] for item in plan]  # one after another


def test_the_working_directory_s_snapshot_sees_a_rewritten_file_but_not_the_workspace(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "model.pt").write_bytes(b"1")
    workspace = tmp_path / "tpu-migrate-verify-x"
    workspace.mkdir()
    before = schedule.snapshot(tmp_path, workspace)
    (workspace / "steps.jsonl").write_text("{}")  # the recorder's, in the workspace
    (tmp_path / "__pycache__").mkdir()  # the import system's
    assert schedule.snapshot(tmp_path, workspace) == before
    os.utime(tmp_path / "data" / "model.pt", ns=(1, 1))  # overwritten in place: no new name
    assert schedule.snapshot(tmp_path, workspace) != before


def test_a_working_directory_too_large_to_watch_is_not_watched(tmp_path, monkeypatch):
    monkeypatch.setattr(schedule, "LARGEST_TREE", 3)
    for name in "abcd":
        (tmp_path / name).write_text(name)
    assert schedule.snapshot(tmp_path, tmp_path / "none") is None


def test_the_recorder_s_own_folder_named_through_a_link_is_not_a_program_write(tmp_path, monkeypatch):
    """The run's folder behind a link (a linked TMPDIR, macOS's /var): the recorder's own files,
    opened by the name it was given, are not the program's writes, which would put every later
    run one after another."""
    from tpu_migrate.verify import recorder

    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    monkeypatch.setattr(recorder, "_writes", [])
    mine, noted = recorder._own_folder(str(link)), str(link / "writes-1")
    recorder._note_write(str(link / "steps-1.jsonl"), mine, noted)
    recorder._note_write(str(real / "stdout-1"), mine, noted)
    assert recorder._writes == []
    recorder._note_write(str(tmp_path / "checkpoint.pt"), mine, noted)
    assert recorder._writes == [str(tmp_path / "checkpoint.pt")]
    assert (real / "writes-1").read_text() == f"{tmp_path / 'checkpoint.pt'}\n"
