"""Known, harmless reasons for a graph to change once, and the steps of programs without any.

Real torch_xla training scripts recompile once right after their first step for two reasons
that no shape or Python number explains:

- the optimizer creates its state (SGD momentum, Adam moments) in its first step: that step's
  graph creates the buffers, the next one reads them (`input f32[] -> f32[10,1,5,5] (created at
  sgd.py:...)` with --explain);
- an accumulator starts as a Python number and becomes a device tensor
  (`correct = 0; correct += pred.eq(target).sum()`): the first sum adds a constant, the next
  ones read the last total.

The tracer records both (`opt_state`, `accumulator` events); a compile in the step right after
one of them is this change, not a recompile. Warm-up ends after the first optimizer state is
created, so the first training step's compiles count as warm-up even when the program's own
set-up (broadcasting parameters, a data loader's first sync) used up the warm-up steps.
"""

from __future__ import annotations

from tpu_migrate.diagnose.locations import relative

from tpu_migrate.diagnose.events import Event, Kind


def expected_changes(events: list[Event]) -> dict[int, str]:
    """step -> why a graph compiled in that step may differ from the one before, once."""
    changes: dict[int, str] = {}
    # `sum(losses)` adds to a Python 0 every step, and every step's graph does the same: only a
    # line that adds to a number in one step and not in the next became a tensor.
    accumulated: dict[tuple, set] = {}
    for event in events:
        if event["kind"] == Kind.ACCUMULATOR:
            accumulated.setdefault((event.get("file"), event.get("line")), set()).add(event.get("step", 0))
    for event in events:
        step = event.get("step", 0) + 1  # state created in step N changes the graph of step N+1
        if event["kind"] == Kind.ACCUMULATOR and step in accumulated[(event.get("file"), event.get("line"))]:
            continue
        if event["kind"] == Kind.OPT_STATE:
            changes.setdefault(step, f"the {event['op']} optimizer created its state (momentum, "
                                     f"moments) for {event.get('count', 1)} parameter(s) in step "
                                     f"{step - 1}, and the graph now reads it")
        elif event["kind"] == Kind.ACCUMULATOR and event.get("file"):
            changes.setdefault(step, f"an accumulator that starts as a Python number became a "
                                     f"device tensor at {relative(event['file'])}:"
                                     f"{event['line']} in step {step - 1} (start it as a tensor: "
                                     f"torch.zeros((), device=...), to compile one graph)")
    return changes


def warmup_end(events: list[Event], warmup_steps: int) -> int:
    """The first step after warm-up: at least `warmup_steps`, and after the step that reads the
    optimizer state the first optimizer step created."""
    created = [e.get("step", 0) for e in events if e["kind"] == Kind.OPT_STATE]
    return max(warmup_steps, min(created) + 2) if created else warmup_steps


def steps_of_one_call(steps: set, boundary_sites: dict[int, tuple], site: tuple) -> int:
    """Steps a read was seen in, counting as one the steps that a library call made from the
    read's own line ended (xm.mesh_reduce syncs between its reads): step N and N+1 are one
    when step N ended at `site`."""
    return len(steps) - sum(1 for s in steps if s + 1 in steps and boundary_sites.get(s) == site)
