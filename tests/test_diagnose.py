"""`tpu-migrate diagnose` on real torch_xla programs (XLA:CPU), through the real CLI."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import shared_runs
from conftest import ROOT, default_sigint, tool_python
from differential import free_port

pytestmark = pytest.mark.slow  # real torch_xla programs under diagnose, torchrun

PROGRAMS = ROOT / "fixtures" / "diagnose"


def diagnose(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**(os.environ if env is None else env), "PYTHONPATH": str(ROOT), "PJRT_DEVICE": "CPU"}
    return subprocess.run([tool_python(env), "-m", "tpu_migrate", "diagnose", *args],
                          capture_output=True, text=True, env=env, cwd=cwd, timeout=600)


def diagnosed(program: Path, *options: str) -> subprocess.CompletedProcess:
    """`diagnose --format json --html PAGE OPTIONS program`, run once per test session for all
    the modules that read it (this one, test_diagnose_native, test_diagnose_event_limit's full
    runs, test_html_report): the JSON on stdout, the text report on stderr, the page in the file
    `diagnosed_page` names. One run gives all three, as it gives a user."""
    key = _diagnosed_key(program, options)
    page = _page_of(key)
    return shared_runs.once(key, lambda: diagnose("--format", "json", "--html", str(page), *options, str(program)))


def diagnosed_page(program: Path, *options: str) -> Path:
    """Where `diagnosed(program, *options)` writes its HTML report (shared by the session)."""
    return _page_of(_diagnosed_key(program, options))


def _diagnosed_key(program: Path, options: tuple[str, ...]) -> str:
    return f"diagnose {shared_runs.file_key(program)} {json.dumps(options)}"


def _page_of(key: str) -> Path:
    return shared_runs.session_directory("diagnose-html") / (hashlib.sha256(key.encode()).hexdigest()[:16] + ".html")


def findings_of(program: str, *options: str):
    result = diagnosed(PROGRAMS / program, *options)
    document = json.loads(result.stdout)
    return result, document, [
        (f["kind"], Path(f["file"]).name, f["line"], f["count"], f["first_step"], f["op"])
        for f in document["findings"]
    ]


def test_json_schema():
    _, doc, _ = findings_of("host_sync_item.py")
    assert set(doc) == {"version", "script", "backend", "exit_code", "steps", "optimizer_steps", "warmup_steps",
                        "findings", "costs"}
    assert doc["version"] == 1 and doc["backend"] == "xla"
    assert doc["script"] == str(PROGRAMS / "host_sync_item.py")
    assert doc["costs"]["run_seconds"] > doc["costs"]["first_step_seconds"] > 0
    for finding in doc["findings"]:
        assert set(finding) == {"kind", "file", "line", "count", "first_step", "op", "rank",
                                "message", "explanation", "source", "via", "cost"}
        assert set(finding["cost"]) == {"seconds", "share", "how", "slow_steps", "estimate", "waits_seconds",
                                        "fails_on_tpu"}
        assert finding["cost"]["estimate"] is False  # measured: the xla backend times host reads
        assert isinstance(finding["line"], int) and isinstance(finding["count"], int)


def test_recompile_after_warmup_at_the_step_line():
    result, doc, found = findings_of("recompile_last_batch.py")
    assert found == [("recompile", "recompile_last_batch.py", 16, 1, 4, None)]
    assert doc["steps"] == 7 and doc["warmup_steps"] == 2 and doc["exit_code"] == 0
    assert "drop_last=True" in doc["findings"][0]["explanation"]
    assert Path(doc["findings"][0]["file"]).is_absolute()


def test_host_sync_inside_the_step_loop():
    _, _, found = findings_of("host_sync_item.py")
    assert found == [("sync", "host_sync_item.py", 15, 6, 1, "item")]


def test_dynamic_shapes_and_cpu_fallback():
    _, _, found = findings_of("dynamic_and_fallback.py")
    assert sorted(found) == [
        ("dynamic-shape", "dynamic_and_fallback.py", 8, 4, 0, "nonzero"),
        ("dynamic-shape", "dynamic_and_fallback.py", 9, 4, 0, "boolean mask indexing"),
        ("fallback", "dynamic_and_fallback.py", 10, 4, 0, "aten::linalg_eig"),  # found by default
        # A 0-d xla tensor indexing a host table: torch reads it in C++ (issue 50, item 3), after
        # each step's sync, so in the next step.
        ("sync", "dynamic_and_fallback.py", 12, 4, 1, "indexing with a device scalar"),
    ]


def test_clean_program_has_no_findings():
    result, doc, found = findings_of("clean.py", "--fail-on", "any")  # the run test_fail_on_... reads
    assert found == [] and doc["steps"] == 6
    assert "final loss" in result.stderr  # the program's stdout went to stderr with --format json


def test_spawned_worker_is_traced_with_its_rank():
    _, doc, found = findings_of("spawn_worker_sync.py")
    assert found == [("sync", "spawn_worker_sync.py", 13, 5, 1, "item")]
    assert doc["findings"][0]["rank"] == 0


def test_warmup_steps_option():
    # The shorter batch first compiles in step 4: inside a 5-step warm-up it is expected, and its
    # second occurrence (step 6) hits the compile cache.
    _, _, found = findings_of("recompile_last_batch.py", "--warmup-steps", "5")
    assert found == []


def test_fail_on_and_exit_codes(tmp_path):
    assert diagnose("--fail-on", "sync", str(PROGRAMS / "host_sync_item.py")).returncode == 1
    # Findings of kinds not asked for do not fail it: test_diagnose_steps' training_state_and_closure
    # (recompiles and closure reads, no sync) exits 0 under --fail-on sync.
    assert diagnosed(PROGRAMS / "clean.py", "--fail-on", "any").returncode == 0  # shared with the test above
    script = tmp_path / "exits.py"
    script.write_text("import sys\nprint(sys.argv[1:], __name__)\nsys.exit(3)\n")  # no torch: 5 s less
    result = diagnose(str(script), "--flag", "value")
    assert result.returncode == 3
    assert "['--flag', 'value'] __main__" in result.stdout


def test_program_exception_is_printed_and_the_report_still_produced(tmp_path):
    script = tmp_path / "boom.py"
    script.write_text(
        "import torch, torch_xla\n"
        "d = torch_xla.device()\n"
        "for step in range(4):\n"
        "    torch_xla.sync()\n"
        "    print((torch.ones(2, device=d) * step).sum().item())\n"
        "raise ValueError('boom')\n"
    )
    result = diagnose("--format", "json", str(script))
    assert result.returncode == 1  # the program's status
    doc = json.loads(result.stdout)
    assert doc["exit_code"] == 1
    assert 'File "' + str(script) + '", line 6, in <module>' in result.stderr
    assert "ValueError: boom" in result.stderr
    assert "bootstrap" not in result.stderr.split("Traceback")[1].split("ValueError")[0]
    # `* step` bakes a changing Python number into the graph: it recompiles, and reads every step.
    assert sorted((f["kind"], f["line"]) for f in doc["findings"]) == [("recompile", 5), ("sync", 5)]


def test_output_file_and_module_mode(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text((PROGRAMS / "host_sync_item.py").read_text())
    report = tmp_path / "report.json"
    result = diagnose("--output", str(report), "-m", "pkg.train", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    doc = json.loads(report.read_text())
    assert doc["script"] == "pkg.train"
    assert [(Path(f["file"]).name, f["line"]) for f in doc["findings"]] == [("train.py", 15)]


def test_clear_errors(tmp_path):
    missing = diagnose(str(tmp_path / "nope.py"))
    assert missing.returncode == 2 and "no such script" in missing.stderr
    module = diagnose("-m", "no_such_module_here")
    assert module.returncode == 2 and "no module named 'no_such_module_here'" in module.stderr
    bad = diagnose("--fail-on", "slowness", str(PROGRAMS / "clean.py"))
    assert bad.returncode == 2 and "unknown kind" in bad.stderr


def test_explain_says_what_changed_and_where_fallbacks_run():
    _, doc, found = findings_of("recompile_last_batch.py", "--explain")
    assert found == [("recompile", "recompile_last_batch.py", 16, 1, 4, None)]
    assert "input f32[8,16] -> f32[5,16] (created at recompile_last_batch.py:11)" in doc["findings"][0]["message"]
    _, _, found = findings_of("dynamic_and_fallback.py", "--explain")
    assert ("fallback", "dynamic_and_fallback.py", 10, 4, 0, "aten::linalg_eig") in found


def test_torchrun_ranks_write_reports_that_merge(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PJRT_DEVICE": "CPU"}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
               "--master_port", str(free_port()), "-m", "tpu_migrate", "diagnose", "--output",
               str(tmp_path / "report.json"), str(PROGRAMS / "host_sync_item.py")]
    run = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.rank0.json", "report.rank1.json"]
    merged = subprocess.run(
        [sys.executable, "-m", "tpu_migrate", "report", "merge", "--format", "json", str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=120,
    )
    document = json.loads(merged.stdout)
    assert document["ranks"] == [0, 1]
    assert sorted((f["rank"], f["kind"], f["line"]) for f in document["findings"]) == [
        (0, "sync", 15), (1, "sync", 15)
    ]


def test_ctrl_c_stops_the_program_and_still_reports(tmp_path, reap):
    import signal
    import time

    script = tmp_path / "forever.py"
    script.write_text(
        "import torch, torch_xla\n"
        "d = torch_xla.device()\n"
        "step = 0\n"
        "while True:\n"
        "    torch_xla.sync()\n"
        "    value = torch.ones(2, device=d).sum().item()\n"
        "    step += 1\n"
        "    if step == 3:\n"
        "        print('ready', flush=True)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PJRT_DEVICE": "CPU"}
    process = subprocess.Popen(
        [sys.executable, "-m", "tpu_migrate", "diagnose", "--format", "json", str(script)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True,
        preexec_fn=default_sigint,
    )
    reap(process)
    deadline = time.time() + 120
    stderr_lines = []
    while time.time() < deadline:
        line = process.stderr.readline()
        stderr_lines.append(line)
        if "ready" in line:
            break
    os.killpg(process.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    out, err = process.communicate(timeout=120)
    document = json.loads(out)
    assert "KeyboardInterrupt" in err
    assert document["exit_code"] != 0
    assert [(f["kind"], f["line"]) for f in document["findings"]] == [("sync", 6)]
    assert not list(tmp_path.glob("tpu-migrate-diagnose*"))


def test_optimizer_steps_are_the_steps_without_a_step_marker():
    """Reading the loss every step without torch_xla.sync() also recompiles every step: the
    pending graph is cut at the read (diagnose-anchors finding 6)."""
    _, doc, found = findings_of("optimizer_steps_only.py")
    assert doc["steps"] == 5
    # Ranked by cost: the read's wait holds the compiles of the recompiles it causes.
    assert found == [
        ("sync", "optimizer_steps_only.py", 14, 5, 1, "__float__"),
        ("recompile", "optimizer_steps_only.py", 14, 4, 2, "host read"),
    ]
    assert "host read" in doc["findings"][1]["explanation"]
    assert "including the recompiles at this line" in doc["findings"][0]["message"]


def test_terminal_timeline_marks_each_step():
    result = diagnosed(PROGRAMS / "recompile_last_batch.py")  # the text report is on stderr
    assert "steps: c.|..C.." in result.stderr  # warm-up compile, then the recompile in step 4


def test_openxla_compile_syncs_are_not_steps():
    _, document, found = findings_of("compiled_openxla.py")
    assert document["steps"] == 5
    assert found == [("sync", "compiled_openxla.py", 17, 5, 1, "item")]


def test_an_unwritable_report_path_is_refused_before_the_program_runs(tmp_path):
    marker = tmp_path / "ran"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    for flag in ("--output", "--html"):
        result = diagnose(flag, str(tmp_path / "missing" / "report"), str(script))
        assert result.returncode == 2
        assert f"cannot write {flag} {tmp_path / 'missing' / 'report'}: no such directory" in result.stderr
        assert "Traceback" not in result.stderr
    assert not marker.exists()


def test_a_report_file_that_cannot_be_written_at_the_end_loses_nothing_else(tmp_path):
    """The program removes the report's directory while it runs: one error line, the program's
    exit status (a report that cannot be written never changes it), and the report still on
    stdout (JSON) and stderr."""
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "train.py"
    script.write_text(f"import shutil\nshutil.rmtree({str(out)!r})\n")
    result = diagnose("--format", "json", "--output", str(out / "report.json"), str(script))
    assert result.returncode == 0
    assert f"tpu-migrate diagnose: cannot write {out / 'report.json'}: No such file or directory" in result.stderr
    assert json.loads(result.stdout)["exit_code"] == 0
    assert "Traceback" not in result.stderr


def test_report_merge_refuses_an_unwritable_output(tmp_path):
    (tmp_path / "r.rank0.json").write_text(json.dumps({"version": 1, "script": "t.py", "backend": "xla",
                                                        "exit_code": 0, "steps": 1, "warmup_steps": 2,
                                                        "findings": []}))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    merged = subprocess.run([sys.executable, "-m", "tpu_migrate", "report", "merge", "--output",
                             str(tmp_path / "missing" / "m.json"), str(tmp_path)],
                            capture_output=True, text=True, env=env, timeout=120)
    assert merged.returncode == 2
    assert "cannot write --output" in merged.stderr and "Traceback" not in merged.stderr
