"""`tpu-migrate verify`: the original program against its migration, step by step, at one
process and at N (behind the click face in cli.py).

Exit status: 0 the same, 1 a divergence, 2 a program that cannot run (or a usage problem).
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tpu_migrate import standin
from tpu_migrate.verify import compare, printed, schedule, source_diff
from tpu_migrate.verify.runs import Run, Target, VerifyError, Workspace, project_root

__all__ = ["TARGETS", "VerifyError", "run_verify"]

TARGETS = ("tpu", "portable")


def run_verify(script: str, args: list[str], against: str | None, root: str | None, nprocs: list[int],
               rtol: float, atol: float, timeout: float, echo, html_file: str | None = None,
               module: bool = False, interpreter=None, target: str = "tpu",
               migrated_python: str | None = None, nproc_default: bool = False,
               nnodes: int = 1, expected: dict[str, float] | None = None) -> tuple[int, dict]:
    """Run everything and return (exit status, the JSON document); `echo(line)` says progress
    and the text report; `html_file` gets the page (verify/html.py). With `module`, `script` is
    a module name run as `python -m` (its tree: --root, default the current directory);
    `interpreter`: see Workspace (the original's, and the migrated program's without
    `migrated_python`). `target`: the migration's (`rewrite --target`); a tpu one runs on the
    TorchTPU stand-in, under `migrated_python`, else the one standin.find_python finds or makes.
    VerifyError for a usage problem. Any other error is one line and exit status 2, never 1 (a
    divergence); an interrupt (Ctrl-C) 130, with every run's processes stopped. `nproc_default`:
    `nprocs` is the CLI's default, not the user's choice: against an original that made no process
    group and started no other process, its N-process runs do not apply and do not run. `nnodes`:
    each migrated run at N processes is that many torchruns of N at once (the hosts of a pod).
    `expected`: the user's tolerance per quantity or printed line (parse_tolerances)."""
    try:
        return _run_verify(script, args, against, root, nprocs, rtol, atol, timeout, echo, html_file, module,
                           interpreter, target, migrated_python, nproc_default, nnodes, expected or {})
    except VerifyError:
        raise
    except KeyboardInterrupt:
        echo("verify: interrupted")
        return 130, {"script": script, "error": "interrupted"}
    except Exception as exc:  # noqa: BLE001 (the tool's own failure: said in one line)
        line = " ".join(f"verify: internal error: {type(exc).__name__}: {exc}".split())[:1000]
        echo(line)
        return 2, {"script": script, "error": line}


def _run_verify(script, args, against, root, nprocs, rtol, atol, timeout, echo, html_file, module, interpreter,
                target, migrated_python, nproc_default=False, nnodes=1, expected=None) -> tuple[int, dict]:
    if target not in TARGETS:
        raise VerifyError(f"--target {target}: give one of {', '.join(TARGETS)}")
    if nnodes < 1:
        raise VerifyError(f"--nnodes {nnodes}: give 1 or more")
    if not module and root is None:
        root = _project_root(script, against, echo)
    program = Target.find(script, module, root)
    if module and program.imports[0] != program.path:
        echo(f"verify: {script} imports from {program.imports[0]} (a src layout): the tree copied is {program.path}")
    mine = Target.against(against, program, root) if against is not None else None
    torch = None
    if target == "tpu":
        try:
            migrated_python = standin.find_python(migrated_python, create=True, echo=echo)
        except standin.StandInError as exc:
            raise VerifyError(str(exc)) from None
        torch = ".".join(map(str, standin.torch_version(migrated_python) or ()))
    migrated_interpreter = (lambda env: os.path.abspath(migrated_python)) if migrated_python else None
    side = _migrated_side(against, target, torch)
    workspace = Workspace(interpreter, target, migrated_interpreter)
    try:
        runs, failed, skipped, mechanical = [], None, None, None
        # The original's first run alone (the migration of its copy beside it: with --against, the
        # mechanical one the port is told from): it decides the rest.
        with ThreadPoolExecutor(1) as pool:
            migrating = pool.submit(workspace.migrate, program, root)
            echo("verify: running the original ...")
            before = schedule.snapshot(Path.cwd(), workspace.path)
            first = workspace.run("original", "original", program, args, 1, timeout, watch_writes=True)
            after = schedule.snapshot(Path.cwd(), workspace.path)
            _left(first, echo)
            if first.returncode != 0:
                return 2, _failed(first, echo)
            if not compare.steps(first) and not printed.lines(first.printed):  # no need to run the rest
                echo(f"verify: {script}: the original took no optimizer step, called no backward() and printed no "
                     "number: nothing to compare")
                return 2, {"script": script, "error": "the original took no step and printed no number"}
            migrated = mine or migrating.result()
            if mine is not None and migrating.exception() is None:
                mechanical = migrating.result()
        runs.append(first)
        plan = [("original, again", "original", program, 1, 1),
                *((f"migrated, {_processes(n, nnodes)}", "migrated", migrated, n * nnodes, nnodes) for n in nprocs)]
        if nproc_default and nnodes == 1 and first.single_process and any(p[3] > 1 for p in plan):
            skipped = [p[3] for p in plan if p[3] > 1]
            plan = [p for p in plan if p[3] <= 1]
            if len(plan) == 1:
                plan.append(("migrated, 1 process", "migrated", migrated, 1, 1))
            echo(f"verify: {script} is a single-process program (the original made no process group and "
                 f"started no other process): the torchrun run(s) at {', '.join(map(str, skipped))} processes do "
                 "not apply, not run (give --nproc to run them)")
        # At once only where the original wrote no file another run could read (schedule.py).
        alone = first.writes or before is None or before != after
        if alone and first.writes:
            echo(f"verify: the original writes files ({', '.join(first.writes)}): its runs go one after another")
        for wave in schedule.waves(plan, 1 if alone else schedule.cores()):
            done = _run_wave(workspace, wave, args, timeout, echo)
            failed = next((run for run in done if run.returncode != 0), None)
            runs += [run for run in done[:done.index(failed) if failed else len(done)]]
            if failed is not None:
                break
        # The code told apart where a run differs (read before the copy goes): a port's against
        # tpu-migrate's migration of the original; without --against, the original against that migration.
        pair = (mechanical, mine) if mechanical is not None else (program, migrated) if against is None else None
        files = [source_diff.program_file(t.path, t.module, t.imports) for t in pair or ()]
        sources = source_diff.Sources.read(*files, converted=against is None) \
            if files and None not in files else None
    finally:
        workspace.close()
    if failed is not None and (failed.side == "original" or len(runs) < 3):  # no migrated run measured
        return 2, _failed(failed, echo)
    reference = compare.original(*runs[:2])
    verdicts = []
    for run in runs[2:]:  # the 1-process run first: the others' causes know whether it differs
        alone = next((v.divergence for v in verdicts if v.run.world == 1), None)
        verdicts.append(compare.verdict(reference, run, rtol, atol, alone, any(r.world == 1 for r in runs[2:]),
                                        expected))
    codes = [source_diff.named(sources, v.divergence) if sources and v.divergence else [] for v in verdicts]
    document = _document(script, against, target, torch, reference, verdicts, codes)
    code = next((c for c in codes if c), [])
    if code:  # the first run that differs (the 1-process one where it does)
        document["converted_code" if against is None else "differing_code"] = code
    if skipped:
        document["not_run"] = {"processes": skipped, "why": "single-process program: the original made no "
                               "process group and started no other process"}
    for line in _text(script, side, reference, verdicts, codes, converted=against is None):
        echo(line)
    if html_file is not None:
        from tpu_migrate.verify import html

        Path(html_file).write_text(html.render(script, side, reference, verdicts), encoding="utf-8")
    if failed is not None:  # what was measured stands: the verdicts above, then the run that failed
        document.update(_failed(failed, echo))
        document["same"] = None
        return 2, document
    return (1 if any(v.divergence for v in verdicts) else 0), document


def _run_wave(workspace: Workspace, wave: list, args: list[str], timeout: float, echo) -> list[Run]:
    """The runs of one wave at once (schedule.run_wave: one that failed beside others runs again alone)."""

    def one(item) -> Run:
        name, kind, runnable, world, nodes = item
        return workspace.run(name, kind, runnable, args, world // nodes, timeout, nodes)

    done = schedule.run_wave(wave, one, echo)
    for run in done:
        _left(run, echo)
    return done


def _left(run: Run, echo) -> None:
    if run.left and run.returncode == 0:
        echo(f"verify: {run.name}: the program exited leaving {len(run.left)} process(es) running, stopped: "
             + "; ".join(run.left[:5]))


# --tolerance's names of the step figures (compare.QUANTITIES), and of the printed numbers.
TOLERANCE_NAMES = {"lr": "learning rate", "learning-rate": "learning rate", "loss": "loss",
                   "grad-norm": "gradient norm", "gradient-norm": "gradient norm", "params": "parameters",
                   "parameters": "parameters", "printed": "printed"}


def parse_tolerances(items: list[str]) -> dict[str, float]:
    """`--tolerance NAME=RTOL` (repeated): NAME one of TOLERANCE_NAMES, or `printed:LINE` (a line
    of the original's output, as the report numbers it). VerifyError for anything else."""
    out = {}
    for item in items:
        name, _, value = item.partition("=")
        name = name.strip().lower()
        key = TOLERANCE_NAMES.get(name)
        if name.startswith("printed:") and name[len("printed:"):].isdigit() and int(name[len("printed:"):]) > 0:
            key = f"printed:{int(name[len('printed:'):])}"
        try:
            rtol = float(value)
        except ValueError:
            rtol = -1.0
        if key is None or not rtol >= 0:
            raise VerifyError(f"--tolerance {item}: give NAME=RTOL, NAME one of {', '.join(TOLERANCE_NAMES)} or "
                              "printed:LINE (the original's printed line), RTOL a number >= 0, like loss=1e-3")
        out[key] = rtol
    return out


def _project_root(script: str, against: str | None, echo) -> str | None:
    """The tree of a script, where --root is not given: its project's (the folder with
    pyproject.toml, setup.py or setup.cfg above the script's, in the working directory), whose
    package it may import; said in one line. None: the script's folder."""
    found = project_root(Path(script)) if Path(script).is_file() else None
    if found is None:
        return None
    what = ("the copy's own tree, where it sits as the script sits in this one, is imported from (its package, "
            "not this tree's)" if against else "that tree is copied and migrated with it")
    echo(f"verify: {script} belongs to the project at {found} (its pyproject.toml, setup.py or setup.cfg): {what} "
         "(--root chooses another tree)")
    return str(found)


def _migrated_side(against: str | None, target: str, torch: str | None) -> str:
    """What the reports say the original was compared with, and where it ran."""
    if target == "portable":
        return f"{against or 'its portable migration'} (the CPU, gloo)"
    what = f"{against} (target tpu)" if against else "its tpu migration"
    return f"{what} on the TorchTPU stand-in (torch {torch}, the CPU computing; tpu_dist over gloo)"


def _processes(n: int, nnodes: int = 1) -> str:
    if nnodes > 1:
        return f"torchrun, {nnodes} nodes of {n} process{'es' * (n != 1)}"
    return "1 process" if n == 1 else f"torchrun, {n} processes"


def _failed(run: Run, echo) -> dict:
    tail = error_tail(run.output)
    again = "" if run.beside_others is None else f", run alone after exit status {run.beside_others} beside other runs"
    echo(f"verify: the {run.name} run failed (exit status {run.returncode}{again}); the end of its output:")
    echo(tail.rstrip())
    return {"error": f"the {run.name} run failed", "run": run.name, "side": run.side,
            "returncode": run.returncode, "beside_others": run.beside_others, "output": tail}


TORCHRUN_FAILURE = ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError", "ChildFailedError:")
TRACEBACK = "Traceback (most recent call last):"


def error_tail(output: str, limit: int = 3000) -> str:
    """The end of a failed run's output that shows its error: under torchrun, the traceback of the
    first rank that failed (what the program printed), not the agent's own traceback and banner
    after it, of which only the failure summary (`rank: ... exitcode: ...`) is kept."""
    cut = -1
    if any(mark in output for mark in TORCHRUN_FAILURE):
        # The agent's traceback: the last one, which ends in ChildFailedError.
        cut = output.rfind(TRACEBACK)
        while cut > 0 and not any(mark in output[cut:] for mark in TORCHRUN_FAILURE):
            cut = output.rfind(TRACEBACK, 0, cut)
    if cut <= 0:
        return output[-limit:]
    before = output[:cut]
    start = before.find(TRACEBACK)
    program = before[before.rfind("\n", 0, start) + 1:] if start >= 0 else before
    if len(program) > limit:  # the first failing rank's traceback, whole where it fits
        first = program[:program.find(TRACEBACK, len(TRACEBACK)) if program.find(TRACEBACK, len(TRACEBACK)) > 0
                        else len(program)]
        program = first[-limit:] if len(first) <= limit else first[:200] + "\n...\n" + first[-(limit - 210):]
    summary = [line.strip() for line in output[cut:].splitlines()
               if line.strip().startswith(("rank", "exitcode"))]
    return program.rstrip() + ("\n[torchrun] " + "; ".join(summary[:6]) if summary else "")


def _text(script, side: str, reference: compare.Original, verdicts, codes: list[list[str]] = (),
          converted: bool = False) -> list[str]:
    """The text report; `codes`: per verdict, the code that differs (source_diff.named), the
    original's lines the rewrite converted where `converted`."""
    label = ("code tpu-migrate converted (the original's lines, the migration's): " if converted
             else "code that differs from tpu-migrate's migration: ")
    lines = [f"verify: {script} (torch_xla on the CPU, 1 process) against {side}, "
             f"{compare.counted(reference)}; the original's own run-to-run noise: " + compare.noise_text(reference.floor)]
    for index, verdict in enumerate(verdicts):
        divergence = verdict.divergence
        code = codes[index] if index < len(codes) else []
        if divergence is None:
            figures = "learning rate, loss, gradient norm and parameters" if reference.unit == "step" else "loss"
            lines.append(f"  {verdict.run.name}: same ({verdict.steps} {reference.unit}s: {figures} within "
                         f"{compare.tolerance_text(verdict.tolerance, reference)}; "
                         f"{compare.printed_summary(verdict.printed)})")
        elif divergence.step is None:
            lines.append(f"  {verdict.run.name}: differs: {divergence.original} {divergence.quantity} in the original, "
                         f"{divergence.migrated} in the migrated program (every common {divergence.unit} agreed)")
        else:
            # Ranks that disagree on a reduced value: rank 0's against another's, not the original's.
            first = "rank 0" if divergence.quantity == "printed number" and divergence.ranks != [0] else "original"
            lines.append(f"  {verdict.run.name}: differs first at {divergence.unit} {divergence.step}, "
                         f"{divergence.quantity}: {compare.shown(divergence.original)} ({first}) vs "
                         f"{compare.shown(divergence.migrated)} (migrated, {_ranks(divergence.ranks)})")
        if divergence is not None and divergence.where:
            lines.append(f"    {compare.where_label(divergence)}: {divergence.where}")
        if divergence is not None:
            lines.append(f"    likely: {divergence.cause}")
            for number, hunk in enumerate(code):
                lines.append(f"    {label if number == 0 else '  '}{hunk}")
        if verdict.run.beside_others is not None:
            lines.append(f"    run again alone: it {_beside(verdict.run.beside_others)} beside the other runs")
        if verdict.excursions:
            lines.append(f"    {compare.excursions_text(verdict.excursions)}")
        for item in (verdict.printed.world_only if verdict.printed else [])[:5]:
            lines.append(f"    agrees at 1 process only (can be right by design): printed line {item['line']} "
                         f"`{item['migrated']}`: {compare.shown(item['values'][1])} for the original's "
                         f"{compare.shown(item['values'][0])}, {item['why']}")
    return lines


def _beside(returncode: int) -> str:
    return "timed out" if returncode == schedule.TIMED_OUT else f"failed (exit status {returncode})"


def _document(script, against, target: str, torch: str | None, reference: compare.Original, verdicts,
              codes: list[list[str]] = ()) -> dict:
    return {
        "script": script, "against": against, "target": target,
        "standin": None if torch is None else {"torch": torch}, "unit": reference.unit, "steps": len(reference.steps),
        "noise": reference.floor, "same": not any(v.divergence for v in verdicts),
        "runs": [{"run": v.run.name, "processes": v.run.world, "steps": v.steps, "tolerance": v.tolerance,
                  "excursions": v.excursions, "beside_others": v.run.beside_others,
                  "printed": None if v.printed is None else
                  {"same": v.printed.compared, "noisy": v.printed.noisy, "one_side": v.printed.one_side,
                   "world_only": v.printed.world_only},
                  "divergence": None if v.divergence is None else vars(v.divergence),
                  "code": codes[k] if k < len(codes) else []} for k, v in enumerate(verdicts)],
    }


def _ranks(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return f"ranks {ranks[0]}-{ranks[-1]}" if ranks == list(range(ranks[0], ranks[-1] + 1)) \
        else "ranks " + ", ".join(map(str, ranks))


def dumps(document: dict) -> str:
    return json.dumps(document, indent=2)
