"""`tpu-migrate verify`: the original program against its migration, step by step, at one
process and at N (behind the click face in cli.py).

Exit status: 0 the same, 1 a divergence, 2 a program that cannot run (or a usage problem).
"""

from __future__ import annotations

import json
from pathlib import Path

from tpu_migrate.verify import compare
from tpu_migrate.verify.runs import Run, VerifyError, Workspace

__all__ = ["VerifyError", "run_verify"]


def run_verify(script: str, args: list[str], against: str | None, root: str | None, nprocs: list[int],
               rtol: float, atol: float, timeout: float, echo, html_file: str | None = None) -> tuple[int, dict]:
    """Run everything and return (exit status, the JSON document); `echo(line)` says progress
    and the text report; `html_file` gets the page (verify/html.py)."""
    script_path = Path(script)
    if not script_path.is_file():
        raise VerifyError(f"no such script: {script}")
    tree = Path(root) if root else script_path.resolve().parent
    if not script_path.resolve().is_relative_to(tree.resolve()):
        raise VerifyError(f"{script} is not under --root {root}")
    if against is not None and not Path(against).is_file():
        raise VerifyError(f"no such script: {against}")
    workspace = Workspace()
    try:
        migrated = Path(against) if against else workspace.migrate(script_path, tree)
        runs = []
        for name, side, path, world in (
                ("original", "original", script_path, 1), ("original, again", "original", script_path, 1),
                *((f"migrated, {_processes(n)}", "migrated", migrated, n) for n in nprocs)):
            echo(f"verify: running the {name} ...")
            run = workspace.run(name, side, path, args, world, timeout)
            runs.append(run)
            if run.returncode != 0:
                return 2, _failed(run, echo)
            if not run.records and len(runs) == 1:  # no need to run the rest
                echo(f"verify: {script}: the original took no optimizer step: nothing to compare "
                     "(verify compares the losses, gradients and parameters of optimizer steps)")
                return 2, {"script": script, "error": "the original took no optimizer step"}
    finally:
        workspace.close()
    first, second, *migrated_runs = runs
    original = compare.steps(first)
    floor = compare.noise(original, compare.steps(second))
    verdicts = [compare.verdict(original, run, rtol, atol, floor) for run in migrated_runs]
    document = _document(script, against, original, floor, verdicts)
    for line in _text(script, against, original, floor, verdicts):
        echo(line)
    if html_file is not None:
        from tpu_migrate.verify import html

        Path(html_file).write_text(html.render(script, against, original, floor, verdicts), encoding="utf-8")
    return (1 if any(v.divergence for v in verdicts) else 0), document


def _processes(n: int) -> str:
    return "1 process" if n == 1 else f"torchrun, {n} processes"


def _failed(run: Run, echo) -> dict:
    echo(f"verify: the {run.name} run failed (exit status {run.returncode}); the end of its output:")
    echo(run.output[-3000:].rstrip())
    return {"error": f"the {run.name} run failed", "run": run.name, "side": run.side,
            "returncode": run.returncode, "output": run.output[-3000:]}


def _text(script, against, original, floor, verdicts) -> list[str]:
    what = against or "its portable migration"
    lines = [f"verify: {script} (torch_xla on the CPU, 1 process) against {what} (the CPU, gloo), "
             f"{len(original)} optimizer steps; the original's own run-to-run noise: "
             + compare.noise_text(floor)]
    for verdict in verdicts:
        divergence = verdict.divergence
        if divergence is None:
            lines.append(f"  {verdict.run.name}: same ({verdict.steps} steps: learning rate, loss, gradient norm and "
                         f"parameters within rtol {max(verdict.tolerance.values()):.0e})")
            continue
        if divergence.step is None:
            lines.append(f"  {verdict.run.name}: differs: {divergence.original} optimizer steps in the original, "
                         f"{divergence.migrated} in the migrated program (every common step agreed)")
        else:
            lines.append(f"  {verdict.run.name}: differs first at step {divergence.step}, {divergence.quantity}: "
                         f"{compare.shown(divergence.original)} (original) vs {compare.shown(divergence.migrated)} "
                         f"(migrated, ranks {_ranks(divergence.ranks)})")
        if divergence.where:
            lines.append(f"    at the step: {divergence.where}")
        lines.append(f"    likely: {divergence.cause}")
    return lines


def _document(script, against, original, floor, verdicts) -> dict:
    return {
        "script": script, "against": against, "steps": len(original), "noise": floor,
        "same": not any(v.divergence for v in verdicts),
        "runs": [{"run": v.run.name, "processes": v.run.world, "steps": v.steps, "tolerance": v.tolerance,
                  "divergence": None if v.divergence is None else vars(v.divergence)} for v in verdicts],
    }


def _ranks(ranks: list[int]) -> str:
    return f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 and ranks == list(range(ranks[0], ranks[-1] + 1)) \
        else ", ".join(map(str, ranks))


def dumps(document: dict) -> str:
    return json.dumps(document, indent=2)
