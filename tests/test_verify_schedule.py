"""Which of verify's runs go at once (tpu_migrate/verify/schedule.py): no torch program runs here
(the runs of a wave are programs of a few lines)."""

from __future__ import annotations

import dataclasses
import os

from tpu_migrate.verify import schedule
from tpu_migrate.verify.runs import Target, Workspace

# Appends a line to `starts` under a lock: the second process to start hangs, as a run starved of
# its cores by the others of its wave would, until the timeout.
STARVED_SECOND = """\
import fcntl, time
with open("starts", "a+") as starts:
    fcntl.flock(starts, fcntl.LOCK_EX)
    starts.write("x\\n")
    starts.flush()
    starts.seek(0)
    started = len(starts.read().splitlines())
if started == 2:
    time.sleep(60)
print("step 0 loss 0.5")
"""


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


def test_a_run_that_timed_out_beside_others_runs_again_alone_with_the_whole_timeout(tmp_path, monkeypatch):
    """A timeout (exit status 124) beside other runs is likely theirs (the cores they took): the
    run goes again alone, and what is kept says so. Before, only a crash was run again."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(STARVED_SECOND)
    workspace = Workspace(target="portable")
    program = Target(tmp_path / "train.py", None, False)
    wave = [("original, again", "original", program, 1, 1), ("migrated, 1 process", "original", program, 1, 1)]
    said = []
    try:
        done = schedule.run_wave(wave, lambda item: workspace.run(item[0], item[1], item[2], [], 1, 4), said.append)
    finally:
        workspace.close()
    assert [run.returncode for run in done] == [0, 0], [run.output for run in done]
    assert sorted(run.beside_others is None for run in done) == [False, True]  # one of them, run again
    again = next(run for run in done if run.beside_others is not None)
    assert again.beside_others == schedule.TIMED_OUT and again.printed == "step 0 loss 0.5\n"
    assert f"verify: the {again.name} run timed out beside the others (exit status 124): running it again alone ..." \
        in said, said
    assert (tmp_path / "starts").read_text().count("x") == 3
    # Had it timed out alone too, its failure would say where it ran.
    from tpu_migrate.verify.command import _failed

    said.clear()
    failed = _failed(dataclasses.replace(again, returncode=124), said.append)
    assert failed["beside_others"] == 124 and said[0] == (
        f"verify: the {again.name} run failed (exit status 124, run alone after exit status 124 beside other runs); "
        "the end of its output:")
