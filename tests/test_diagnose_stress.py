"""`tpu-migrate diagnose` on programs that end badly, through the real CLI (XLA:CPU).

Each case checks the exit status, the finding recorded before the trouble (at its known line),
that the tool's temporary directory is gone (TMPDIR points into tmp_path) and that no process of
the program is left running (the programs write their pids and their workers' pids to a file).
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, default_sigint
from process_groups import alive

pytestmark = pytest.mark.slow  # programs that exit, crash or get killed under diagnose

STRESS = ROOT / "fixtures" / "diagnose" / "stress"


def environment(tmp_path: Path) -> dict:
    temp = tmp_path / "tmp"
    temp.mkdir(exist_ok=True)
    return {**os.environ, "PYTHONPATH": str(ROOT), "PJRT_DEVICE": "CPU", "TMPDIR": str(temp)}


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "tpu_migrate", "diagnose", *args]


def diagnose(tmp_path: Path, *args: str, input: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(command(*args), input=input, capture_output=True,
                          env=environment(tmp_path), timeout=300)


def findings(document: dict) -> list[tuple]:
    return [(f["kind"], Path(f["file"]).name, f["line"], f["count"]) for f in document["findings"]]


def assert_cleaned_up(tmp_path: Path, pids_file: Path | None = None) -> None:
    assert not list((tmp_path / "tmp").glob("tpu-migrate-diagnose-*"))
    if pids_file is None:
        return
    pids = [int(pid) for pid in pids_file.read_text().split()]
    assert pids
    left = [pid for pid in pids if alive(pid)]
    for pid in left:  # not for the next test to find
        os.kill(pid, signal.SIGKILL)
    assert left == []


def sync_count(document: dict, program: str, line: int) -> int:
    [finding] = [f for f in findings(document) if f[:3] == ("sync", program, line)]
    return finding[3]


def test_os_exit_writes_the_last_events_and_forked_children_their_own(tmp_path):
    pids = tmp_path / "pids"
    result = diagnose(tmp_path, "--format", "json", str(STRESS / "exit_abruptly.py"), str(pids))
    assert result.returncode == 7, result.stderr[-3000:]
    document = json.loads(result.stdout)
    assert document["exit_code"] == 7
    # 4 reads: the last one came after the last step boundary (written at os._exit), and the
    # forked child, which inherited it unwritten, did not write it a second time.
    assert findings(document) == [("sync", "exit_abruptly.py", 16, 4)]
    assert b"total" in result.stderr
    assert_cleaned_up(tmp_path, pids)


def test_a_raising_spawn_worker_does_not_hang_the_report(tmp_path):
    pids = tmp_path / "pids"
    result = diagnose(tmp_path, "--format", "json", str(STRESS / "worker_raises.py"), str(pids))
    assert result.returncode == 1, result.stderr[-3000:]
    assert b"RuntimeError: worker 1 failed" in result.stderr
    document = json.loads(result.stdout)
    assert document["exit_code"] == 1
    assert sync_count(document, "worker_raises.py", 29) >= 2  # worker 0, stopped by the parent
    # Its rank is spawn's index for it, recorded when it started: it never reached its end.
    assert {f["rank"] for f in document["findings"]} == {0}
    assert b"process(es) that the program left running" in result.stderr  # worker 0's sleeper
    assert_cleaned_up(tmp_path, pids)


def test_threads_reading_device_values(tmp_path):
    report = tmp_path / "report.json"
    result = diagnose(tmp_path, "--output", str(report), str(STRESS / "thread_reads.py"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout == b"done\n"
    # 3 steps x 4 threads x 5 reads, each at the thread's own line.
    assert findings(json.loads(report.read_text())) == [("sync", "thread_reads.py", 13, 60)]
    assert_cleaned_up(tmp_path)


def test_megabytes_of_output_and_stdin(tmp_path):
    result = diagnose(tmp_path, "--format", "json", str(STRESS / "loud_stdin.py"), input=b"data\n")
    assert result.returncode == 0, result.stderr[-3000:]
    document = json.loads(result.stdout)  # stdout holds the JSON alone
    assert b"stdin: 'data'\n" in result.stderr  # the program's stdout went to stderr
    assert result.stderr.count(b"x" * 1023 + b"\n") == 20 * 1024
    assert b"\nend\n" in result.stderr
    assert findings(document) == [("sync", "loud_stdin.py", 15, 4)]
    assert_cleaned_up(tmp_path)


@pytest.mark.parametrize("name", ["KILL", "TERM"])
def test_killed_by_a_signal_from_inside(tmp_path, name):
    pids = tmp_path / "pids"
    number = getattr(signal, "SIG" + name)
    result = diagnose(tmp_path, "--format", "json", str(STRESS / "killed.py"), name, str(pids))
    assert result.returncode == 128 + number, result.stderr[-3000:]
    document = json.loads(result.stdout)
    assert document["exit_code"] == -number
    # Killed in step 3: the reads of steps 1 and 2 were written at the step boundaries.
    assert sync_count(document, "killed.py", 21) >= 2
    assert b"process(es) that the program left running" in result.stderr  # the sleeper
    assert_cleaned_up(tmp_path, pids)


def start_waiting_program(tmp_path: Path, pids: Path, **popen) -> subprocess.Popen:
    return subprocess.Popen(command("--format", "json", str(STRESS / "killed.py"), "wait", str(pids)),
                            env=environment(tmp_path), start_new_session=True,
                            preexec_fn=default_sigint, **popen)


@pytest.mark.parametrize("name", ["TERM", "INT"])
def test_the_tool_itself_signalled(tmp_path, name, reap):
    """`kill -TERM TOOL` is relayed at once (the program does not handle SIGTERM); `kill -INT
    TOOL` once the program has not reported getting it itself (Python handles SIGINT), and the
    program gets it once."""
    pids = tmp_path / "pids"
    number = getattr(signal, "SIG" + name)
    tool = start_waiting_program(tmp_path, pids, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    reap(tool)
    stderr = b""
    while b"ready" not in stderr:  # the program's stdout goes to stderr with --format json
        line = tool.stderr.readline()
        assert line, stderr.decode()[-3000:]
        stderr += line
    tool.send_signal(number)  # to the tool alone
    out, err = tool.communicate(timeout=120)
    assert tool.returncode == 128 + number, err.decode()[-3000:]
    document = json.loads(out)
    assert document["exit_code"] == -number
    assert sync_count(document, "killed.py", 21) >= 2
    assert err.count(b"KeyboardInterrupt") == (1 if name == "INT" else 0)
    assert_cleaned_up(tmp_path, pids)


@pytest.mark.parametrize("name, busy, code", [("TERM", 5.5, 5), ("INT", 0.2, 11)])
def test_a_signal_to_the_whole_process_group_reaches_the_program_once(tmp_path, reap, name, busy, code):
    """`kill -TERM -PGID` (a job scheduler) reaches the tool and the program: the program's own
    handler decides how it ends, and runs once, even while it is still busy when the tool would
    have relayed the signal (it did after 5 s: the handler ran twice)."""
    tool = subprocess.Popen(command(str(STRESS / "handled.py"), str(busy), str(code)),
                            env=environment(tmp_path), start_new_session=True, preexec_fn=default_sigint,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    reap(tool)
    output = b""
    while b"ready" not in output:
        line = tool.stdout.readline()
        assert line, output.decode()[-3000:]
        output += line
    os.killpg(tool.pid, getattr(signal, "SIG" + name))
    output += tool.communicate(timeout=120)[0]
    assert tool.returncode == code, output.decode()[-3000:]
    assert output.count(b"handler ") == 1, output.decode()[-3000:]
    assert_cleaned_up(tmp_path)


FAULTS = {
    # Lines that are not events, and the report files on a full device (stdout, --html).
    "garbage": ({}, ["3 recorded line(s) could not be read (cut short or damaged) and were skipped"]),
    # Every write after step 4 fails; the user's own compile-analysis settings are kept.
    "full": ({"PT_XLA_DEBUG_LEVEL": "2", "PT_XLA_DEBUG_FILE": "{tmp}/user-debug.txt"},
             ["1 process(es) could not write what they recorded (File too large, in {run}): steps, "
              "counts and findings stop where writing failed"]),
    "deleted": ({"PT_XLA_DEBUG_LEVEL": "0"},
                ["your PT_XLA_DEBUG_LEVEL=0 turns torch_xla's compile analysis off: recompiles are counted "
                 "per step, without the line that triggered each (unset it, or set it to 1 or more)",
                 "the run's directory {run} was deleted while the program ran: what it recorded is lost, "
                 "and nothing below is measured"]),
}


@pytest.mark.parametrize("mode", FAULTS)
def test_faults_in_what_the_tracer_records_cost_the_report_never_the_run(tmp_path, mode):
    """The program's exit status (3) stands whatever happens to the evidence or the report, and
    the report says what evidence was lost (before: a traceback and exit 1, or "0 steps" as if
    measured). The user's PT_XLA_DEBUG_* are theirs: kept, read where they allow it, else said."""
    extra, expected = FAULTS[mode]
    env = {**environment(tmp_path), **{k: v.format(tmp=tmp_path) for k, v in extra.items()}}
    user_log = tmp_path / "user-debug.txt"
    user_log.write_text("the user's own earlier lines\n")
    report_file = tmp_path / "report.json"
    with open("/dev/full", "wb") as full:
        result = subprocess.run(command("--format", "json", "--output", str(report_file), "--html", "/dev/full",
                                        str(STRESS / "faults.py"), mode),
                                stdout=full, stderr=subprocess.PIPE, env=env, timeout=300)
    stderr = result.stderr.decode()
    assert result.returncode == 3, stderr[-3000:]
    assert "Traceback" not in stderr
    assert "cannot write /dev/full: No space left on device" in stderr
    assert "cannot write the report to stdout: No space left on device" in stderr
    document = json.loads(report_file.read_text())
    [run_dir] = {m for m in re.findall(r"/\S*tpu-migrate-diagnose-[\w-]+", stderr)} or [None]
    assert document["notes"][:len(expected)] == [e.format(run=run_dir) for e in expected]
    for note in document["notes"][:len(expected)]:
        assert f"note: {note}" in stderr
    syncs = sum(f[3] for f in findings(document) if f[:3] == ("sync", "faults.py", 34))
    if mode == "garbage":
        assert syncs == 6
    elif mode == "full":  # written at the step boundaries before the damage
        assert 1 <= syncs < 6
        log = user_log.read_text()
        assert log.startswith("the user's own earlier lines\n") and "Compilation Analysis" in log
        assert "Post Compilation Analysis" in log  # level 2, as the user set it
    else:
        assert syncs == 0 and document["steps"] == 0
        assert user_log.read_text() == "the user's own earlier lines\n"
    assert_cleaned_up(tmp_path)


def test_the_program_recurses_as_deep_as_under_python_however_it_is_started(tmp_path):
    """The tool's frames (runpy, the bootstrap) sit above the program's module frame; the program
    must still see the limit it set and reach the same depth before RecursionError (it reached
    8 frames less), as a script, a zip with __main__.py (which did not run at all) and -m."""
    import zipfile

    program = STRESS / "recursion.py"
    archive = tmp_path / "app.zip"
    with zipfile.ZipFile(archive, "w") as bundle:
        bundle.write(program, "__main__.py")
    (tmp_path / "recursion_module.py").write_text(program.read_text())
    env = {**environment(tmp_path), "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"}
    for target in ([str(program)], [str(archive)], ["-m", "recursion_module"]):
        plain = subprocess.run([sys.executable, *target], capture_output=True, env=env, timeout=120, cwd=tmp_path)
        traced = subprocess.run(command("--backend", "native", *target), capture_output=True, env=env,
                                timeout=300, cwd=tmp_path)
        assert plain.returncode == traced.returncode == 0, traced.stderr.decode()[-3000:]
        assert traced.stdout == plain.stdout and plain.stdout.startswith(b"limit 1000 depth 99"), target


def test_only_python_children_get_the_tracer_s_environment(tmp_path):
    """The program, and the programs it starts that are not Python (`env`), see the environment
    they would see under python: not the run's TPU_MIGRATE_DIAGNOSE* variables, nor the tool's
    directory on PYTHONPATH (both reached every process). Its Python children are still traced
    however they start (an environment of their own, a shell, os.system, multiprocessing's
    spawn), and its threads recurse as deep as under python (8 frames deeper before)."""
    program = STRESS / "environment.py"
    env = environment(tmp_path)
    plain = subprocess.run([sys.executable, str(program)], capture_output=True, text=True, env=env, timeout=120)
    traced = subprocess.run(command("--backend", "native", str(program)), capture_output=True, text=True,
                            env=env, timeout=300)
    assert plain.returncode == traced.returncode == 3, traced.stderr[-3000:]
    seen = [line for line in plain.stdout.splitlines() if line.startswith("SEEN ")]
    assert seen and json.loads(seen[0][5:])["own"] == {"PYTHONPATH": str(ROOT)}
    assert [line for line in traced.stdout.splitlines() if line.startswith("SEEN ")] == seen
    assert [line for line in plain.stdout.splitlines() if line.startswith("TRACED")] == ["TRACED False"] * 4
    assert [line for line in traced.stdout.splitlines() if line.startswith("TRACED")] == ["TRACED True"] * 4


def test_ctrl_c_at_a_terminal(tmp_path, reap):
    """The tool and the program share the terminal's foreground process group: Ctrl-C reaches
    both (and the program's children), the tool does not relay it, and still reports."""
    import fcntl
    import pty
    import termios

    pids = tmp_path / "pids"
    report = tmp_path / "report.json"
    master, slave = pty.openpty()
    tool = subprocess.Popen(
        command("--output", str(report), str(STRESS / "killed.py"), "wait", str(pids)),
        env=environment(tmp_path), stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
        preexec_fn=lambda: (default_sigint(), fcntl.ioctl(0, termios.TIOCSCTTY, 0)),  # the terminal is the tool's
    )
    reap(tool)
    os.close(slave)
    output = b""
    deadline = time.monotonic() + 180
    interrupted = False
    while time.monotonic() < deadline:
        if select.select([master], [], [], 0.5)[0]:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every holder of the terminal has closed it
                break
            if not chunk:
                break
            output += chunk
        if not interrupted and b"ready" in output:
            os.write(master, b"\x03")  # Ctrl-C: the kernel signals the foreground group
            interrupted = True
    os.close(master)
    assert tool.wait(timeout=60) == 128 + signal.SIGINT, output.decode(errors="replace")[-3000:]
    document = json.loads(report.read_text())
    assert sync_count(document, "killed.py", 21) >= 2
    assert b"left running" not in output  # the sleeper got the Ctrl-C too
    assert_cleaned_up(tmp_path, pids)


def test_a_killed_tool_takes_its_program_along_and_the_next_run_cleans_up(tmp_path, reap):
    """SIGKILL leaves the tool no chance to stop the program or remove its directory: the program
    gets SIGTERM from the kernel (PR_SET_PDEATHSIG), and the next run removes the directory."""
    pids = tmp_path / "pids"
    tool = start_waiting_program(tmp_path, pids, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    reap(tool)  # the sleeper, which outlives its program, is in the tool's process group
    stderr = b""
    while b"ready" not in stderr:
        line = tool.stderr.readline()
        assert line, stderr.decode()[-3000:]
        stderr += line
    tool.kill()
    tool.wait(timeout=30)
    program = int(pids.read_text().split()[0])
    deadline = time.monotonic() + 30
    while alive(program) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(program)
    [left] = (tmp_path / "tmp").glob("tpu-migrate-diagnose-*")
    an_hour_ago = time.time() - 3600
    for path in [left, *left.rglob("*")]:
        os.utime(path, (an_hour_ago, an_hour_ago))
    quick = tmp_path / "quick.py"
    quick.write_text("print('hello')\n")
    result = diagnose(tmp_path, str(quick))
    assert result.returncode == 0, result.stderr[-3000:]
    assert_cleaned_up(tmp_path)


def test_only_dead_and_quiet_run_directories_are_removed(tmp_path, monkeypatch):
    from tpu_migrate.diagnose import rundir

    monkeypatch.setattr(rundir.tempfile, "gettempdir", lambda: str(tmp_path))
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    dead, live = ended.pid, os.getpid()
    names = {"dead-old": f"tpu-migrate-diagnose-{dead}-a", "dead-new": f"tpu-migrate-diagnose-{dead}-b",
             "live-old": f"tpu-migrate-diagnose-{live}-c", "other": f"not-ours-{dead}-d"}
    for name in names.values():
        (tmp_path / name).mkdir()
        (tmp_path / name / "events.1.jsonl").write_text("{}\n")
    old = time.time() - 3600
    for key in ("dead-old", "live-old", "other"):
        for path in [tmp_path / names[key], tmp_path / names[key] / "events.1.jsonl"]:
            os.utime(path, (old, old))
    (tmp_path / names["dead-new"] / "events.1.jsonl").touch()  # a file still being written
    assert rundir.remove_stale() == [str(tmp_path / names["dead-old"])]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        names[k] for k in ("dead-new", "live-old", "other"))


PROBE = '''import inspect, json, os, sys
import helper
limit: int = 3
print("PROBE " + json.dumps({
    "argv0": sys.argv[0], "file": __file__, "path0": sys.path[0], "helper": helper.VALUE,
    "loader": [type(__loader__).__name__, getattr(__loader__, "name", None)], "package": __package__,
    "spec": repr(__spec__), "cached": globals().get("__cached__"), "site": os.environ.get("USER_SITE_RAN"),
    "path": sys.path, "orig_argv": sys.orig_argv[1:], "annotations": sorted(globals().get("__annotations__", {"missing": 0})),
    "xla_env": sorted(k for k in os.environ if k.startswith(("PT_XLA", "XLA_"))), "frames": len(inspect.stack()),
}), flush=True)
if len(sys.argv) > 1:
    sys.excepthook = lambda kind, value, tb: print("HOOKED", kind.__name__, value, flush=True)
    raise KeyboardInterrupt("stop") if sys.argv[1] == "interrupt" else ValueError("bad")
'''


def _probe(output: str) -> dict:
    return json.loads(next(line for line in output.splitlines() if line.startswith("PROBE "))[len("PROBE "):])


@pytest.mark.parametrize("ending", ["", "raise", "interrupt"])
def test_the_program_cannot_tell_it_is_traced(tmp_path, ending):
    """What python gives a script reached through a symlink, with a sitecustomize of the user's on
    the path, and what an uncaught exception does: the same under diagnose (argv[0] as typed, the
    real directory first on sys.path, python's __loader__ / __package__, the user's
    sitecustomize run, sys.excepthook called, a KeyboardInterrupt ending the process by SIGINT)."""
    real, links, site = tmp_path / "real", tmp_path / "links", tmp_path / "site"
    for directory in (real, links, site):
        directory.mkdir()
    (real / "helper.py").write_text("VALUE = 7\n")
    (real / "probe.py").write_text(PROBE)
    (links / "probe.py").symlink_to(real / "probe.py")
    (site / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = '1'\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(site)])}
    args = [ending] if ending else []
    plain = subprocess.run([sys.executable, "links/probe.py", *args], cwd=tmp_path, capture_output=True,
                           text=True, env=env, timeout=120)
    traced = subprocess.run([sys.executable, "-m", "tpu_migrate", "diagnose", "--backend", "native",
                             "links/probe.py", *args], cwd=tmp_path, capture_output=True, text=True, env=env,
                            timeout=300)
    expected = _probe(plain.stdout)
    assert expected["helper"] == 7 and expected["site"] == "1" and expected["argv0"] == "links/probe.py"
    assert expected["orig_argv"] == ["links/probe.py", *args] and expected["annotations"] == ["limit"]
    seen = _probe(traced.stdout + traced.stderr)
    # The frames above the program's are the one difference docs/commands/diagnose.md lists here.
    assert seen.pop("frames") == expected.pop("frames") + 6
    assert seen == expected
    if ending:
        hooked = "HOOKED KeyboardInterrupt stop" if ending == "interrupt" else "HOOKED ValueError bad"
        assert hooked in plain.stdout and hooked in traced.stdout + traced.stderr
        assert "Traceback" not in traced.stdout + traced.stderr
        assert plain.returncode == (-signal.SIGINT if ending == "interrupt" else 1)
