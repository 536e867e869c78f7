"""The user's own torch_xla debug settings win over diagnose's (diagnose/debug_env.py), and a
recorded line that is not an event is skipped and counted. tests/test_diagnose_stress.py runs
both through the CLI."""

from __future__ import annotations

from tpu_migrate.diagnose import debug_env, events


def test_without_settings_of_the_user_the_tool_writes_its_own_files(tmp_path):
    outputs = debug_env.plan({}, str(tmp_path), explain=True)
    assert outputs.env == {
        "PT_XLA_DEBUG_LEVEL": "1", "PT_XLA_DEBUG_FILE": str(tmp_path / "xla_debug.txt"),
        "XLA_IR_DEBUG": "1", "XLA_SAVE_TENSORS_FMT": "text", "XLA_SAVE_TENSORS_FILE": str(tmp_path / "graphs.txt"),
        "XLA_FNTRACKER_FILE": str(tmp_path / "fallbacks.txt"), "XLA_FNTRACKER_LEVEL": "3",
    }
    assert outputs.notes == []
    assert debug_env.plan({}, str(tmp_path), explain=False).env == {
        "PT_XLA_DEBUG_LEVEL": "1", "PT_XLA_DEBUG_FILE": str(tmp_path / "xla_debug.txt")}


def test_a_file_of_the_user_is_kept_and_only_what_the_run_appends_is_read(tmp_path):
    log = tmp_path / "mine.txt"
    log.write_bytes(b"earlier\n")
    graphs = tmp_path / "ir.txt"
    (tmp_path / "ir.txt.0").write_text("old graph\n")
    environ = {"PT_XLA_DEBUG_LEVEL": "2", "PT_XLA_DEBUG_FILE": str(log), "XLA_SAVE_TENSORS_FILE": str(graphs),
               "XLA_FNTRACKER_LEVEL": "1"}
    outputs = debug_env.plan(environ, str(tmp_path / "run"), explain=True)
    assert not {"PT_XLA_DEBUG_LEVEL", "PT_XLA_DEBUG_FILE", "XLA_SAVE_TENSORS_FILE",
                "XLA_FNTRACKER_LEVEL"} & set(outputs.env)
    assert outputs.notes == []
    with open(log, "ab") as handle:  # torch_xla appends
        handle.write(b"Compilation Analysis: new\n")
    (tmp_path / "ir.txt.0").write_text("old graph\nnew graph 0\n")
    (tmp_path / "ir.txt.1").write_text("new graph 1\n")
    assert outputs.compiles.read() == b"Compilation Analysis: new\n"
    assert outputs.compiles.base == len(b"earlier\n")  # the events' offsets are the file's
    assert outputs.read_graphs() == "new graph 0\nnew graph 1\n"


def test_settings_that_turn_output_off_are_kept_and_said():
    off = debug_env.plan({"PT_XLA_DEBUG_LEVEL": "0"}, "/run", explain=False)
    assert off.env == {} and off.compiles is None
    assert off.notes == ["your PT_XLA_DEBUG_LEVEL=0 turns torch_xla's compile analysis off: recompiles are "
                         "counted per step, without the line that triggered each (unset it, or set it to 1 or more)"]
    to_stderr = debug_env.plan({"PT_XLA_DEBUG_LEVEL": "1"}, "/run", explain=False)
    assert to_stderr.env == {} and to_stderr.compiles is None
    assert "sends torch_xla's compile analysis to stderr, as you asked" in to_stderr.notes[0]
    explain = debug_env.plan({"XLA_IR_DEBUG": "0", "XLA_SAVE_TENSORS_FMT": "dot"}, "/run", explain=True)
    assert "XLA_IR_DEBUG" not in explain.env and "XLA_SAVE_TENSORS_FILE" not in explain.env
    assert explain.read_graphs() == ""
    assert [note.split(" ", 3)[2] for note in explain.notes] == ["XLA_IR_DEBUG=0", "XLA_SAVE_TENSORS_FMT=dot"]


def test_lines_that_are_not_events_are_skipped_and_counted(tmp_path):
    good = '{"kind": "sync", "op": "item", "file": "a.py", "line": 3, "step": 1, "ostep": 0}'
    (tmp_path / "events.12.jsonl").write_text(
        f'{good}\n[1, 2]\n{{"kind": 3, "step": 0, "ostep": 0}}\n\n{{"kind": "sync", "st\n{good}\n')
    found, skipped = events.read_events_counting(str(tmp_path))
    assert [e["line"] for e in found[12]] == [3, 3]
    assert skipped == 3
