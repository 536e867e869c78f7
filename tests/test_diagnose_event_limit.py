"""Past the event limit a traced process counts its events instead of writing each one
(recording.Recorder): the disk use stays bounded and the findings stay exactly the same."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from conftest import ROOT, tool_python
from test_diagnose import diagnosed

pytestmark = pytest.mark.slow  # long runs under diagnose

PROGRAMS = ROOT / "fixtures" / "diagnose"


def diagnose(*args: str, limit: int | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PJRT_DEVICE": "CPU"}
    env.pop("TPU_MIGRATE_DIAGNOSE_EVENT_LIMIT", None)
    if limit is not None:
        env["TPU_MIGRATE_DIAGNOSE_EVENT_LIMIT"] = str(limit)
    return subprocess.run([tool_python(env), "-m", "tpu_migrate", "diagnose", "--format", "json", *args],
                          capture_output=True, text=True, env=env, timeout=600)


def _uncosted(findings: list[dict]) -> list[dict]:
    """Findings without their measured costs, in a fixed order (ranking is by cost)."""
    plain = [{**f, "message": re.split("; (?:estimated )?cost |; estimated: waits for ", f["message"])[0]}
             for f in findings]
    for f in plain:
        f.pop("cost", None)
    return sorted(plain, key=lambda f: (f["kind"], f["file"], f["line"], str(f["op"]), str(f["rank"])))


@pytest.mark.parametrize("program, options", [
    ("host_sync_item.py", ()),
    ("recompile_last_batch.py", ()),
    ("optimizer_steps_only.py", ()),
    ("dynamic_and_fallback.py", ("--explain",)),
    # The native backend's case. native/compiled_problems.py is not repeated here: its Dynamo
    # events (recompile, graph break, recompile limit) take the same branch of the limit code as
    # this program's syncs and dynamic shapes. Recorder._count_locked reads only an event's kind
    # to tell a step boundary (the optimizer steps both programs step by) from a counted event, and
    # keys a counted one by its whole text but its step and wait, so a reason or a graph-break id
    # comes back as written (events._tally_events); nothing in a backend reads the limit.
    ("native/eager_problems.py", ()),
])
def test_counting_past_the_limit_finds_exactly_the_same(program, options):
    """A limit of 8 events starts counting in the first steps, before every compile and most
    findings of these programs."""
    # One after the other: the suite keeps both cores busy anyway, and a compiled program's
    # second run finds its graphs in the session's inductor cache (half the time).
    full = diagnosed(PROGRAMS / program, *options)  # the other modules' run
    counted = diagnose(*options, str(PROGRAMS / program), limit=8)
    assert full.returncode == counted.returncode, counted.stderr[-3000:]
    full_document, counted_document = json.loads(full.stdout), json.loads(counted.stdout)
    assert full_document["findings"], "the program must have findings to compare"
    # The same findings; not the same costs: time differs between two runs, and past the limit
    # waits and steps are counted, not timed.
    assert _uncosted(counted_document["findings"]) == _uncosted(full_document["findings"])
    assert counted_document["steps"] == full_document["steps"]


def test_a_long_run_records_a_bounded_amount(tmp_path):
    steps = 3000
    page = tmp_path / "report.html"
    result = diagnose("--html", str(page), str(PROGRAMS / "stress" / "long_run.py"), str(steps), limit=100)
    assert result.returncode == 0, result.stderr[-3000:]
    recorded = int(re.search(r"recorded (\d+)", result.stderr)[1])
    assert recorded < 60_000  # every event written one by one: 1,047,880 bytes
    document = json.loads(result.stdout)
    assert document["steps"] == steps + 1
    found = {(f["kind"], f["line"]): f for f in document["findings"]}
    assert found["sync", 15]["count"] == steps
    assert f"{steps} time(s) every step" in found["sync", 15]["message"]
    # Placed in its step past the limit: the last loop's sync() ends step STEPS - 1.
    assert found["compile", 17]["first_step"] == steps
    # The timeline covers the steps recorded one by one; the page says so.
    assert re.search(r"3001 steps &middot; the timeline shows the first \d+: later", page.read_text())


def test_recorder_counts_past_its_limit(tmp_path, monkeypatch):
    from tpu_migrate.diagnose import events, recording

    monkeypatch.setenv(recording.ENV_EVENT_LIMIT, "5")
    recorder = recording.Recorder(str(tmp_path))
    for step in range(4):
        recorder.emit({"kind": "sync", "op": "item", "file": "/a.py", "line": 3})
        recorder.emit({"kind": "sync", "op": "item", "file": "/a.py", "line": 3})
        recorder.emit({"kind": "step", "op": "mark", "file": "/a.py", "line": 2, "compiles": step // 3,
                       "time": float(step)})
        recorder.steps += 1
    recorder.finish()
    lines = [json.loads(line) for line in (tmp_path / f"events.{os.getpid()}.jsonl").read_text().splitlines()]
    # 5 events one by one; then the first step boundary, the one whose compile count moved, and
    # the end.
    assert [(e["kind"], e["step"]) for e in lines] == [
        ("sync", 0), ("sync", 0), ("step", 0), ("sync", 1), ("sync", 1),
        ("step", 1), ("step", 3), ("end", 4)]
    [events] = events.read_events(str(tmp_path)).values()
    counted = [e for e in events if "in_steps" in e or e["kind"] == "counted"]
    assert counted[0] == {"kind": "counted", "op": None, "file": None, "line": None,
                          "step": 1, "ostep": 0, "steps": 4, "osteps": 0}
    assert (counted[1]["count"], counted[1]["step"], counted[1]["in_steps"]) == (4, 2, 2)
