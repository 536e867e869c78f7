"""costs.py: warm-up vs steady state and the measured cost of each finding, from recorded steps."""

from __future__ import annotations

from tpu_migrate.diagnose import costs
from tpu_migrate.diagnose.analysis import Finding, StepRecord, Summary


def _finding(kind, line, steps, waited=None, op=None):
    f = Finding(kind, __file__, line, len(steps), min(steps), op, None, f"{kind} here")
    f.steps, f.waited = set(steps), waited
    return f


def _events(step_times, started=0.0, ended=None):
    events = [{"kind": "backend", "op": "xla", "started": started}]
    events += [{"kind": "step", "step": i, "time": t} for i, t in enumerate(step_times)]
    events.append({"kind": "end", "step": len(step_times), "time": ended or step_times[-1]})
    return {1: events}


def test_costs_are_measured_ranked_and_summed():
    # Step 0 ends 2 s in; steady steps take 0.1 s; step 5 took 1.1 s with 0.8 s compiling.
    times = [2.0, 2.1, 2.2, 2.3, 2.4, 3.5, 3.6, 3.7]
    records = [StepRecord(i, 0.0 if i == 0 else times[i] - times[i - 1]) for i in range(len(times))]
    records[5].compiles, records[5].compile_seconds = 1, 0.8
    records[0].compile_seconds = 0.5
    sync = _finding("sync", 10, [1, 2, 3, 4, 5, 6, 7], waited=0.07, op="item")
    recompile = _finding("recompile", 20, [5])
    fallback = _finding("fallback", 30, [3, 4], op="aten::linalg_eig")
    summary = Summary([recompile, sync, fallback], 8, 2)
    run = costs.measure(summary, records, _events(times, ended=4.0), "xla", None)
    assert summary.findings == [recompile, sync, fallback]  # costliest first
    assert abs(recompile.cost.seconds - 1.0) < 1e-9  # 1.1 s against a 0.1 s median
    assert abs(recompile.cost.share - 0.25) < 1e-9 and recompile.cost.steps == [5]
    assert "compiling 800.0 ms" in recompile.message
    assert sync.cost.seconds == 0.07 and "host waited" in sync.message
    assert fallback.cost.seconds is None and "cost not measured: torch_xla does not time" in fallback.message
    assert run.first_step_seconds == 2.0 and run.run_seconds == 4.0
    assert abs(run.compile_seconds - 1.3) < 1e-9 and abs(run.steady_median - 0.1) < 1e-9
    assert run.slow_steps == {5: ["compile"]}
    assert run.headline.startswith("2 finding(s) cost 27% of the run (4.00 s); the recompile at ")
    assert run.headline.endswith(":20 alone 25%")
    assert "1 step(s) slower than 1.5x the median: 1 with a compile" in "\n".join(run.lines())


def test_ties_keep_their_order_and_no_steady_state_is_said():
    records = [StepRecord(0, 0.0), StepRecord(1, 0.0)]
    first, second = _finding("fallback", 1, [1], op="aten::a"), _finding("fallback", 2, [1], op="aten::b")
    summary = Summary([first, second], 2, 2)
    run = costs.measure(summary, records, {}, "xla", None)
    assert summary.findings == [first, second]
    assert run.steady_median is None and run.headline == "" and run.run_seconds is None
    assert "fewer than 3 steady-state steps" in run.lines()[1]


def test_a_native_read_costs_its_wait_on_an_accelerator_not_on_the_cpu_standing_in():
    # The native wrapper times every read; with the CPU standing in, that time is the CPU's
    # own compute, not a wait for a device.
    read = _finding("sync", 1, [1, 2], waited=0.004, op="item")
    costs.measure(Summary([read], 3, 2), [], {}, "native", "cpu")
    assert read.cost.seconds is None and "the CPU stands in for the TPU" in read.message
    read = _finding("sync", 1, [1, 2], waited=0.004, op="item")
    costs.measure(Summary([read], 3, 2), [], {}, "native", "cuda")
    assert read.cost.seconds == 0.004 and "time the host waited in the call" in read.message


def test_the_headline_counts_a_read_inside_a_slow_compile_step_once():
    # Step 5 took 1.1 s against a 0.1 s median: it compiled, and a read in it waited 0.6 s of
    # that time. The two findings lost 1.0 s + the reads of the other steps, not 1.6 s.
    times = [2.0, 2.1, 2.2, 2.3, 2.4, 3.5, 3.6, 3.7]
    records = [StepRecord(i, 0.0 if i == 0 else times[i] - times[i - 1]) for i in range(len(times))]
    records[5].compiles, records[5].compile_seconds = 1, 0.4
    waits = {1: 0.01, 2: 0.01, 3: 0.01, 4: 0.01, 5: 0.6, 6: 0.01, 7: 0.01}
    read = _finding("sync", 10, list(waits), waited=sum(waits.values()), op="item")
    recompile = _finding("recompile", 20, [5])
    events = _events(times, ended=4.0)
    events[1] += [{"kind": "sync", "op": "item", "file": __file__, "line": 10, "step": s, "wait": w}
                  for s, w in waits.items()]
    run = costs.measure(Summary([recompile, read], 8, 2), records, events, "xla", None)
    assert abs(read.cost.seconds - 0.66) < 1e-9 and abs(recompile.cost.seconds - 1.0) < 1e-9
    # (1.0 + 0.06) / 4.0 s, where adding the two costs would say (1.0 + 0.66) / 4.0 = 41%
    assert run.headline.startswith("2 finding(s) cost 26% of the run (4.00 s)"), run.headline
