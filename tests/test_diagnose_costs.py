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


# -- issue 50: ranked by what fails, then by what fixing saves, priced from what was measured -----

from tpu_migrate.diagnose import analysis  # noqa: E402
from tpu_migrate.diagnose.runner import Evidence  # noqa: E402

TRAIN, GENERATE, NANSUM, LOG, TOLIST = 29, 40, 33, 34, 41  # the lines of a train-then-generate program


def _native_run() -> dict:
    """The events of a CPU-standing-in native program: step 0 compiles the forward at line 29 and
    recompiles it for a second shape; 3 optimizer steps each log a read (2 s of work queued
    before it, 0.5 s after it); then a generate at line 40 reads its stop check 4 times in a loop
    (0.3 s of work before each) and recompiles twice for the growing cache; a nansum in step 0."""
    at = lambda kind, line, op, step, **extra: {"kind": kind, "op": op, "file": __file__, "line": line,  # noqa: E731
                                               "step": 0, "ostep": step, **extra}
    events = [{"kind": "backend", "op": "native", "device": "cpu", "started": 0.0},
              at("unsupported", NANSUM, "aten::nansum", 0),
              at("recompile", TRAIN, "(called here)", 0, reason="tensor 'input_ids' size mismatch at index 1. expected 8, actual 12",
                 caller=f"{__file__}:{TRAIN}"),
              {"kind": "compile", "op": "0/1", "file": None, "line": None, "ostep": 0},
              {"kind": "compile_time", "op": None, "file": None, "line": None, "ostep": 0, "seconds": 4.0}]
    time = 10.0
    for step in range(3):
        events.append(at("sync", LOG, "item", step, wait=0.001, queued=2.0))
        time += 2.5
        events.append({"kind": "opt_step", "op": None, "file": __file__, "line": 31, "ostep": step, "time": time})
    for token in range(4):
        events.append(at("sync", GENERATE, "__bool__", 3, wait=0.001, queued=0.3,
                         via=["transformers/generation/utils.py:2600 in generate",
                              "transformers/generation/utils.py:2505 in _has_unfinished_sequences"]))
    events.insert(-2, at("recompile", GENERATE, "(called here)", 3, reason="`cache.layers[0].keys` size mismatch",
                         caller=f"{__file__}:{GENERATE}"))
    events.append(at("sync", TOLIST, "tolist", 3, wait=0.001, queued=0.1))
    events.append(at("sync", TOLIST, "tolist", 3, wait=0.001, queued=0.1))
    signature = lambda inputs, first, later=0, fastest=None, order=0: {  # noqa: E731
        "kind": "call_time", "op": "LlamaForCausalLM.forward", "inputs": inputs, "first_seconds": first,
        "first_compiled": True, "later_calls": later, "later_seconds": later * (fastest or 0.0),
        "later_min_seconds": fastest, "later_compiled": 0}
    events += [dict(signature("(2, 8)", 9.0, 2, 0.25), file=__file__, line=TRAIN),
               dict(signature("(2, 12)", 6.25), file=__file__, line=TRAIN),
               dict(signature("(1, 3)", 2.0, 1, 0.1), file=__file__, line=GENERATE),
               dict(signature("(1, 4) cache", 1.5), file=__file__, line=GENERATE),
               dict(signature("(1, 5) cache", 1.1), file=__file__, line=GENERATE)]
    events.append({"kind": "end", "op": None, "file": None, "line": None, "ostep": 3, "step": 0, "time": 40.0,
                   "rank": None})
    return {1: events}


def _diagnosed_native():
    evidence = Evidence(0, _native_run())
    summary = analysis.summarize(evidence, 2)
    records = analysis.step_records(evidence)
    run = costs.measure(summary, records, evidence.events, "native", "cpu")
    return summary, run


def test_what_fails_on_torchtpu_ranks_first_and_compiles_are_priced_from_their_first_calls():
    summary, run = _diagnosed_native()
    ranked = [(f.kind, f.line) for f in summary.findings]
    # nansum first (it fails on TorchTPU), then by what fixing saves: the recompile in step 0
    # (its 6.25 s first call over the 0.25 s of a later call), the generate recompiles after the
    # last step, then the reads. The function's first compiled call (line 29's (2, 8)) is its warm-up.
    assert ranked[0] == ("unsupported-op", NANSUM) and summary.findings[0].cost.fails
    assert ranked[1:3] == [("recompile", TRAIN), ("recompile", GENERATE)]
    train, generate = summary.findings[1], summary.findings[2]
    assert abs(train.cost.seconds - 6.0) < 1e-9 and "first calls at 1 new input shape" in train.message
    # the generate site's three compiled first calls over its later call's 0.1 s: 1.9 + 1.4 + 1.0 s
    assert abs(generate.cost.seconds - 4.3) < 1e-9 and "first calls at 3 new input shape" in generate.message
    assert not any("not recorded one by one" in f.message for f in summary.findings)
    assert "fails on TorchTPU, so it ranks first" in summary.findings[0].message
    assert run.headline.startswith("1 finding(s) fail on TorchTPU, fix them first (the unsupported-op at ")


def test_a_read_is_priced_by_what_removing_it_saves_not_by_the_work_it_waits_for():
    summary, _ = _diagnosed_native()
    log = next(f for f in summary.findings if f.line == LOG)
    # Each log read waits for 2 s of queued work; removing one lets it overlap the work after it,
    # up to the next read: 2.0 s for the first two (the next log read), 0.3 s for the last (generate's).
    assert abs(log.cost.waits - 6.0) < 1e-9 and abs(log.cost.seconds - 4.3) < 1e-9
    assert "waits for 6.00 s in all; removing it saves at most 4.30 s" in log.message


def test_reads_repeated_in_a_loop_after_the_last_step_are_findings_with_the_per_token_via():
    summary, _ = _diagnosed_native()
    stop = next(f for f in summary.findings if f.line == GENERATE and f.kind == "sync")
    assert stop.count == 4 and stop.loop == "after the last"
    assert "in a loop after the last step" in stop.message
    assert stop.via[-1].endswith("in _has_unfinished_sequences")
    tolist = next(f for f in summary.findings if f.line == TOLIST)
    assert tolist.count == 2 and "in a loop after the last step" in tolist.message
    # ranked by what removing them saves, below the compiles: the first overlaps the 0.1 s before
    # the second, and the last read of all has nothing after it to overlap
    assert abs(tolist.cost.seconds - 0.1) < 1e-9
    assert [f.kind for f in summary.findings][-3:] == ["sync", "sync", "sync"]


def test_one_mesh_reduce_call_is_one_finding_whatever_methods_it_reads_through():
    via = ["torch_xla/core/xla_model.py:1445 in mesh_reduce"]
    events = [{"kind": "backend", "op": "xla", "started": 0.0}]
    for step in (1, 2, 3):
        events += [{"kind": "sync", "op": op, "file": __file__, "line": 7, "step": step, "via": via, "wait": 0.01}
                   for op in ("item", "cpu", "__int__")]
        events.append({"kind": "step", "op": "mark_step", "file": __file__, "line": 8, "step": step, "time": step})
    summary = analysis.summarize(Evidence(0, {1: events}), 2)
    [finding] = summary.findings
    assert finding.op == "mesh_reduce (item, cpu, int)" and finding.count == 3  # 3 calls, 3 reads each
    assert "exchange Python values" in finding.explanation
    # One call after training, whose own sync ends a step between its reads: one call, a note.
    events = events[:1] + [{"kind": "step", "op": "mark_step", "file": __file__, "line": 8, "step": s, "time": s}
                           for s in (0, 1, 2)]
    events += [{"kind": "sync", "op": op, "file": __file__, "line": 7, "step": step, "via": via, "wait": 0.01}
               for op, step in (("item", 3), ("cpu", 3), ("__int__", 4))]
    summary = analysis.summarize(Evidence(0, {1: events}), 2)
    assert summary.findings == [] and "7 mesh_reduce (item, cpu, int) x1" in summary.notes[-1]


def test_a_second_graph_of_a_called_module_names_the_code_not_a_placeholder():
    from tpu_migrate.diagnose.messages import describe

    finding = Finding("compile", "a.py", 3, 1, 6, "(called here)", None, "", changed="GLOBAL_STATE changed: grad_mode")
    message, _ = describe(finding, "native")
    assert message.startswith("torch.compile compiled a second graph of the compiled code called here at a.py:3")


def test_a_torch_xla_recompile_after_the_last_step_costs_the_compile_time_after_it():
    # Four steps; evaluation after the last recompiles the line (step 4 = after the last step):
    # torch_xla's CompileTime went from 1.5 s at the last step's end to 2.25 s at the program's end.
    times = [1.0, 1.1, 1.2, 1.3]
    records = [StepRecord(i, 0.0 if i == 0 else 0.1) for i in range(4)]
    events = _events(times, ended=3.0)
    for event, compiled in zip(events[1][1:5], (1.0, 1.5, 1.5, 1.5)):
        event["compile_time"] = compiled
    events[1][-1]["compile_time"] = 2.25
    recompile = _finding("recompile", 20, [4])
    costs.measure(Summary([recompile], 4, 2), records, events, "xla", None)
    assert abs(recompile.cost.seconds - 0.75) < 1e-9 and "compile time of its step(s)" in recompile.message
