"""The command-line face: `tpu-migrate rewrite`, `rules`, `explain`, `diagnose`, `verify`, `run`.

Exit codes (like ruff): 0 nothing left to do; 1 manual work remains (findings, or TODO comments
of an earlier run), or with --check / --diff files would change, or with --exit-non-zero-on-fix
files were changed; 2 usage or configuration error, or an error in some file.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
from contextlib import contextmanager
from pathlib import Path

import click

from tpu_migrate import __version__, process_exit
from tpu_migrate.findings import FileResult
from tpu_migrate.config import ConfigError, load_config, project_root
from tpu_migrate.diagnose.kinds import BY_NAME as DIAGNOSE_KINDS
from tpu_migrate.diagnose.kinds import FAIL_KINDS
from tpu_migrate.report import render, terminal
from tpu_migrate.printable import printable
from tpu_migrate.rewrite import unscanned
from tpu_migrate.rewrite.files import DEFAULT_MAX_FILE_SIZE, Excluder, discover, parse_size, replace_file, write_atomic
from tpu_migrate.rules import RuleError, load_catalog

PROGRESS_THRESHOLD = 50


def _expand_codes(selectors: list[str], origin: str) -> frozenset[str]:
    """Rule codes or code prefixes (`TPU0`) -> the set of matching codes. `origin`: the flag, or
    the configuration file (whose mistakes are configuration errors, not usage errors)."""
    catalog = load_catalog()
    codes: set[str] = set()
    for selector in (s.strip().upper() for s in selectors):
        if not selector:
            continue
        matching = {r.code for r in catalog.rules if r.code.startswith(selector)}
        if not matching:
            message = f"{origin}: no rule matches '{selector}' (see `tpu-migrate rules`)"
            raise click.UsageError(message) if origin.startswith("--") else ConfigError(message)
        codes |= matching
    return frozenset(codes)


# Modules only some runs need, imported where they do: a `rewrite --check` pays for its start-up
# on every run (benchmarks/bench_rewrite.py --cli).
def _result_cache():
    from tpu_migrate.rewrite import cache

    return cache


def _migration():
    from tpu_migrate.report.migration import Migration

    return Migration


def _ci_formats():
    from tpu_migrate.report import ci_formats

    return ci_formats


def _split(value: str | None) -> list[str] | None:
    return None if value is None else value.split(",")


def _rewrite_paths(files, settings, jobs, sources=None, reals=None):
    # Imported here: a run answered from the cache never loads libcst.
    from tpu_migrate.rewrite.context import Options
    from tpu_migrate.rewrite.engine import flagged_names
    from tpu_migrate.rewrite.paths import rewrite_paths

    try:
        flagged_names(load_catalog())  # the rules and the registered transforms agree
    except RuleError as exc:
        _configuration_error(exc)
    return rewrite_paths(files, Options(**settings), jobs, sources=sources, reals=reals)


def _project_passes(paths, files: list[str], reals: dict[str, str] | None = None,
                    every_file_rewritten: bool = False) -> dict[str, tuple]:
    """What the rewrite's project-wide passes find, over one reading of the project
    (rewrite/project.py: under the project root, or among the run's files where no
    pyproject.toml or .git marks one): the modules that run SPMD without naming it
    (spmd_programs.py), the functions each file imports from the project that pass a parameter
    to torch_xla (parameter_flows.py), and the modules run by a launch in another module
    (kept_launches.py). With the garbage collector as idle as in the rewrite (the trees they
    parse form no cycles; collections took 14-19% of their CPU time over this repository).
    The trees they parse of the run's own files (`reals`: their real paths, where found) are
    kept for the rewrite, which then parses them no more (parsed_trees.py; `clear` after it).
    Where `every_file_rewritten` (no result cache: the rewrite's code is loaded for the run
    anyway), the launch pass analyses them as the rewrite does, which then takes the analyses too
    (a run answered from the cache never loads libcst: its passes analyse as before)."""
    from tpu_migrate.rewrite import parsed_trees
    from tpu_migrate.rewrite.gc_settings import fewer_collections
    from tpu_migrate.rewrite.kept_launches import kept_launch_modules
    from tpu_migrate.rewrite.parameter_flows import project_parameters
    from tpu_migrate.rewrite.project import Project
    from tpu_migrate.rewrite.spmd_programs import spmd_modules

    root = project_root(list(paths))
    reals = reals or {}
    parsed_trees.start(frozenset(reals.get(f) or os.path.realpath(f) for f in files if f.endswith(".py")))
    with fewer_collections():
        project = Project(files, None if root == Path(root.anchor) else root)
        return {"spmd_modules": spmd_modules(files, project.root, project),
                "xla_parameters": project_parameters(files, project.root, project),
                "kept_launches": kept_launch_modules(files, project.root, project,
                                                     _rewrite_arguments if every_file_rewritten else None)}


def _rewrite_arguments() -> tuple | None:
    """engine.analysis_arguments of the rules (None where they and the registered code disagree:
    `_rewrite_paths` says so)."""
    from tpu_migrate.rewrite.engine import analysis_arguments

    try:
        return analysis_arguments(load_catalog())
    except RuleError:
        return None


def _forget_parsed_trees() -> None:
    """The rewrite is done: the trees the project passes kept for it go (parsed_trees.py)."""
    from tpu_migrate.rewrite import parsed_trees

    parsed_trees.clear()


@contextmanager
def _progress_bar(total: int, shown: bool):
    """A function that advances the progress bar by one file, drawn on stderr (rich imported only
    where the bar is shown: a check in CI or pre-commit never shows one)."""
    if not shown:
        yield lambda: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with Progress(TextColumn("rewriting"), BarColumn(), MofNCompleteColumn(),
                  console=Console(stderr=True, highlight=False, soft_wrap=True),
                  transient=True) as progress:
        task = progress.add_task("files", total=total)
        yield lambda: progress.advance(task)


def _configuration_error(exc: Exception) -> None:
    """One line naming the file and the problem, exit 2: the command line was fine, so click's
    `Usage:` text would only hide the message."""
    click.echo(f"tpu-migrate: error: {exc}", err=True)
    sys.exit(2)


def _interrupt_exits_130(command):
    """Ctrl-C ends the command as an interrupted program does, with status 130 (128 + SIGINT),
    not click's "Aborted!" and 1 (which means manual work left): the files already written
    stay written, the others are as they were (`_uninterrupted`), and no temporary file stays."""

    @functools.wraps(command)
    def run(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except KeyboardInterrupt:
            click.echo("tpu-migrate: interrupted: the files written so far are rewritten, the others untouched",
                       err=True)
            sys.exit(130)

    return run


def _with_fewer_collections(command):
    """The whole command with the garbage collector as idle as in the rewrite itself
    (rewrite/gc_settings.py): importing libcst alone made it scan the young objects over a
    thousand times, 10% of that import (22-33 ms of every start)."""

    @functools.wraps(command)
    def run(*args, **kwargs):
        from tpu_migrate.rewrite.gc_settings import fewer_collections

        with fewer_collections():
            return command(*args, **kwargs)

    return run


@contextmanager
def _uninterrupted():
    """Ctrl-C during the block (replacing one file, saving the cache) takes effect when it
    ends: a file is replaced or not, and nothing of the step is left half done."""
    pending: list[int] = []
    previous = signal.getsignal(signal.SIGINT)
    if previous in (signal.SIG_IGN, None):  # ignored by whoever started us, or not Python's to restore
        yield
        return
    try:
        signal.signal(signal.SIGINT, lambda signum, frame: pending.append(signum))
    except ValueError:  # not the main thread: signals go to the main one
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if pending:
        raise KeyboardInterrupt


def _size_option(ctx, param, value):
    if value is None:
        return None
    try:
        return parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tpu-migrate")
def main() -> None:
    """Port torch_xla / Optimum TPU code to native TorchTPU."""


@main.command(short_help="Convert torch_xla idioms in files or directories to TorchTPU.")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option("--diff", "mode", flag_value="diff", help="Print a unified diff; write nothing.")
@click.option("--notebook-diff", type=click.Choice(["file", "cells"]), default="file", show_default=True,
              help="With --diff, a notebook's diff: of its .ipynb file (git apply and patch -p1 take it), "
                   "or one per changed code cell, for reading.")
@click.option("--check", "mode", flag_value="check",
              help="Write nothing; exit 1 if anything would change or needs manual work.")
@click.option("--target", type=click.Choice(["tpu", "portable"]), default=None,
              help="tpu (default): TorchTPU code. portable: device-agnostic code that also runs on the CPU.")
@click.option("--select", metavar="CODES",
              help="Only these rules (comma-separated codes or prefixes, e.g. TPU001,TPU02).")
@click.option("--ignore", metavar="CODES", help="Skip these rules.")
@click.option("--fix-level", type=click.Choice(["safe", "unsafe"]), default=None,
              help="safe: apply only safe fixes (unsafe ones are reported). unsafe (default): both.")
@click.option("--format", "output_format", type=click.Choice(["text", "json", "sarif", "github"]),
              default="text", show_default=True,
              help="json / sarif (SARIF 2.1.0): one document on stdout, nothing else; "
                   "github: workflow annotations.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=None,
              help="Worker processes (default: number of CPUs).")
@click.option("--exclude", multiple=True, metavar="GLOB",
              help="Skip files or directories matching GLOB (repeatable).")
@click.option("--exit-zero", is_flag=True,
              help="Exit 0 even when files would change or manual work remains (errors still exit 2).")
@click.option("--exit-non-zero-on-fix", is_flag=True,
              help="After writing, also exit 1 when files were changed (the pre-commit fix hook).")
@click.option("--max-file-size", metavar="SIZE", default=None, show_default="1M", callback=_size_option,
              help="A file that mentions torch_xla and is larger than this is reported, not rewritten "
                   "(e.g. 500K, 4M; 0: no limit). Other files are only byte-scanned, whatever their size.")
@click.option("--no-cache", is_flag=True,
              help="Neither read nor write the result cache (also: cache = false, TPU_MIGRATE_NO_CACHE=1).")
@click.option("--verbose", "-v", is_flag=True, help="Say on stderr how many files came from the cache.")
@click.option("--html", "html_file", type=click.Path(dir_okay=False, writable=True),
              help="Write the migration report here: a self-contained HTML page of what converts, what "
                   "is manual and which files still need torch_xla (with --check: writes no source file).")
@_interrupt_exits_130
@_with_fewer_collections
def rewrite(paths, mode, notebook_diff, target, select, ignore, fix_level, output_format, jobs, exclude, exit_zero,
            exit_non_zero_on_fix, max_file_size, no_cache, verbose, html_file) -> None:
    """Convert torch_xla idioms in PATHS (files or directories) to TorchTPU.

    Settings come from [tool.tpu-migrate] in the nearest pyproject.toml; flags override them.
    """
    mode = mode or "write"
    # The options given that change what a write does, for the command --check / --diff suggest
    # (the size in bytes, which parses back).
    write_options = [part for flag, value in (("--target", target), ("--select", select), ("--ignore", ignore),
                                              ("--fix-level", fix_level), ("--max-file-size", max_file_size))
                     if value is not None for part in (flag, str(value))]
    try:
        config = load_config(list(paths))
        catalog = load_catalog()
    except (ConfigError, RuleError) as exc:
        _configuration_error(exc)
    origin = f"{config.path}: [tool.tpu-migrate]" if config.path else "tpu-migrate"
    select_list = _split(select) if select is not None else config.select
    ignore_list = _split(ignore) if ignore is not None else config.ignore
    target = target or config.target or "tpu"
    try:
        settings = dict(
            target=target,
            select=_expand_codes(select_list, "--select" if select else origin) if select_list is not None else None,
            ignore=_expand_codes(ignore_list or [], "--ignore" if ignore else origin),
            fix_level=fix_level or config.fix_level or "unsafe",
            max_file_size=next((size for size in (max_file_size, config.max_file_size) if size is not None),
                               DEFAULT_MAX_FILE_SIZE),
        )
    except ConfigError as exc:
        _configuration_error(exc)
    # Config globs are relative to the pyproject.toml's directory, flags to the working directory.
    excluder = Excluder([*((p, str(config.path.parent)) for p in config.exclude),
                         *((p, os.curdir) for p in exclude)])

    results: list[FileResult] = []
    files: list[str] = []
    where = " or ".join([*([f"{config.path}: [tool.tpu-migrate] exclude"] if config.exclude else []),
                         *(["--exclude"] if exclude else [])])

    def excluded(path: str) -> None:  # pre-commit names every staged file: only when asked
        if verbose:
            terminal.write_line(sys.stderr, printable(f"{path}: skipped: it matches an exclude pattern ({where})"))

    others: list[str] = []  # scripts and configs of the searched directories: not rewritten
    reals: dict[str, str] = {}  # where each file was found: read and written there, never through a link

    def not_rewritten(path: str) -> None:
        if unscanned.is_candidate(path):
            others.append(path)

    for path, error in discover(paths, excluder, clean_temp_files=mode == "write", on_excluded=excluded,
                                on_unscanned=not_rewritten, reals=reals):
        if error is not None:
            results.append(FileResult(path, error=error))
        else:
            files.append(path)

    uncached = no_cache or not config.cache or _result_cache().disabled_by_env()
    settings.update(_project_passes(paths, files, reals, every_file_rewritten=uncached))
    show_progress = output_format == "text" and len(files) > PROGRESS_THRESHOLD and terminal.is_terminal(sys.stderr)
    with _progress_bar(len(files), show_progress) as advance:
        cache = None
        if not uncached:
            result_cache = _result_cache()
            cache = result_cache.Cache.open(settings)
            outcomes = result_cache.cached_results(
                files, cache, lambda todo, sources: _rewrite_paths(todo, settings, jobs, sources, reals),
                need_output=mode != "check", store_changed=mode != "write", reals=reals)
        else:
            outcomes = _rewrite_paths(files, settings, jobs, reals=reals)
        for result in outcomes:
            if result.changed and mode == "write":
                try:
                    with _uninterrupted():
                        write_atomic(result.path, result.output, expected=result.original, inode=result.inode,
                                     real=reals.get(result.path))
                except OSError as exc:
                    result.error = f"cannot write: {exc.strerror or exc}"
                    result.changed = False
                    result.fixes = []  # not applied: nothing was fixed (its manual findings stand)
            results.append(result)
            advance()
    _forget_parsed_trees()
    if cache is not None:
        with _uninterrupted():
            cache.save()
    if verbose:
        terminal.write_line(sys.stderr, f"configuration: {config.path}: [tool.tpu-migrate]" if config.path else
                            f"configuration: none (no [tool.tpu-migrate] in the project, {project_root(list(paths))})")
        terminal.write_line(sys.stderr, f"{len(files)} file(s), {cache.hits} from the cache {cache.path}" if cache
                            else f"{len(files)} file(s), cache off")

    summary = render.Summary()
    for result in results:
        summary.add(result)
    mentions = [m for m in map(unscanned.first_mention, others) if m is not None]

    migration = _migration().build(results, catalog, mode, mentions) if html_file or output_format == "json" else None
    if html_file:
        try:
            with _uninterrupted():  # the page whole, or what was there before: never an empty file
                replace_file(html_file, migration.html(target, list(paths)).encode("utf-8"))
        except OSError as exc:
            _configuration_error(f"cannot write {html_file}: {exc.strerror or exc}")
    if output_format == "json":
        sys.stdout.write(render.json_document(results, summary, target, diffs=mode == "diff",
                                              migration=migration.to_json(),
                                              notebook_cells=notebook_diff == "cells") + "\n")
    elif output_format == "sarif":
        sys.stdout.write(_ci_formats().rewrite_sarif(results, catalog) + "\n")
    elif output_format == "github":
        sys.stdout.write(_ci_formats().rewrite_github(results, catalog))
    else:
        for result in results:
            if result.changed and mode == "diff":
                sys.stdout.write(render.unified_diff(result, notebook_diff == "cells"))
            for line in render.finding_lines(result):
                sys.stdout.write(line + "\n")
        if mode == "check":
            for result in results:
                for line in render.fix_lines(result, catalog):
                    sys.stdout.write(line + "\n")
        for line in render.changed_file_lines(results, mode):
            sys.stdout.write(line + "\n")
        render.print_summary(summary, catalog, mode, terminal.is_terminal(sys.stdout))
        for line in render.unscanned_lines(mentions):
            sys.stdout.write(line + "\n")
        next_command = render.next_command_line(results, mode, write_options, list(paths))
        if next_command:
            sys.stdout.write(next_command + "\n")
    for result in results:
        for line in render.note_lines(result):
            terminal.write_line(sys.stderr, line)
        if result.error is not None:
            terminal.write_line(sys.stderr, render.error_line(result))
    process_exit.leave(_exit_status(summary, mode, exit_zero, exit_non_zero_on_fix))


def _exit_status(summary: render.Summary, mode: str, exit_zero: bool, exit_non_zero_on_fix: bool) -> int:
    """ruff's model: a write that leaves nothing to do succeeds (so `&&` chains go on); manual
    work left (findings, open TODO comments) fails; --check and --diff also fail on what would
    change; --exit-non-zero-on-fix also fails a write that changed files."""
    if summary.errors:
        return 2
    if exit_zero:
        return 0
    pending = summary.changed and (mode != "write" or exit_non_zero_on_fix)
    return 1 if pending or sum(summary.manual.values()) else 0


@main.command()
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text",
              show_default=True)
def rules(output_format) -> None:
    """List every rule: code, name, safety, targets, summary."""
    from tpu_migrate.report import explain as explain_report  # rich.markdown: only here

    catalog = load_catalog()
    if output_format == "json":
        sys.stdout.write(explain_report.rules_json(catalog) + "\n")
    else:
        explain_report.print_rules(catalog, explain_report.stdout_console())


@main.command(short_help="Show a rule's explanation and example, or a diagnose kind's.")
@click.argument("code")
def explain(code) -> None:
    """Show a rule's explanation and its before/after example (from its test fixture), or what a
    kind of `diagnose` finding (recompile, sync, ...) means and how to fix it."""
    from tpu_migrate.report import explain as explain_report  # rich.markdown: only here

    kind = DIAGNOSE_KINDS.get(code.lower())
    if kind is not None:
        explain_report.print_kind_explanation(kind, explain_report.stdout_console())
        return
    catalog = load_catalog()
    try:
        rule = catalog.by_code(code.upper())
    except KeyError:
        raise click.UsageError(f"unknown rule '{code}' (see `tpu-migrate rules`)") from None
    explain_report.print_explanation(rule, explain_report.stdout_console())


def _fail_kinds(ctx, param, value):
    if value is None:
        return frozenset()
    kinds = {k.strip() for k in value.split(",") if k.strip()}
    if "any" in kinds:
        return frozenset(FAIL_KINDS)
    unknown = kinds - set(FAIL_KINDS)
    if unknown:
        raise click.BadParameter(f"unknown kind(s) {', '.join(sorted(unknown))}; use {', '.join(FAIL_KINDS)} or any")
    return frozenset(kinds)


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
              short_help="Run a program under a tracer; report TPU performance problems.")
@click.option("-m", "module", metavar="MODULE", help="Run a module, like `python -m MODULE`.")
@click.option("--warmup-steps", type=click.IntRange(min=0), default=2, show_default=True,
              help="Compiles before the end of this step are expected, not findings.")
@click.option("--fail-on", callback=_fail_kinds, metavar="KINDS",
              help="Exit 1 when a finding of these kinds exists (comma-separated): " + ",".join(FAIL_KINDS)
              + " or any.")
@click.option("--backend", type=click.Choice(["auto", "xla", "native", "standin"]), default="auto",
              show_default=True,
              help="xla: torch_xla programs; native: eager and torch.compile programs on tpu/cuda/cpu; "
                   "standin: TorchTPU programs, run on the TorchTPU stand-in (the tpu device emulated on the "
                   "CPU), which reports every host sync exactly; auto: xla when the program imports "
                   "torch_xla, standin when it targets the tpu device (torch.device(\"tpu\"), .to(\"tpu\"), "
                   ".tpu(), torch.tpu, import torch_tpu), else native.")
@click.option("--format", "output_format", type=click.Choice(["text", "json", "sarif", "github"]), default="text",
              show_default=True,
              help="json / sarif / github: the report on stdout after the program ends (its stdout goes to stderr).")
@click.option("--output", type=click.Path(dir_okay=False, writable=True), help="Also write the JSON report here.")
@click.option("--explain", is_flag=True,
              help="Record every graph's IR to say what changed between two compiles of a line (slower).")
@click.option("--html", "html_file", type=click.Path(dir_okay=False, writable=True),
              help="Write a self-contained HTML report (findings and a per-step timeline) here.")
@click.option("--python", "python", type=click.Path(dir_okay=False, exists=True), metavar="PYTHON",
              help="standin: a Python with torch 2.11 to 2.15 to run the program with (default: "
                   "$TPU_MIGRATE_STANDIN_PYTHON, this one if its torch fits, else an environment tpu-migrate "
                   "makes once and keeps in its cache).")
@click.argument("target", required=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def diagnose(module, warmup_steps, fail_on, backend, output_format, output, explain, html_file, python, target,
             args) -> None:
    """Run SCRIPT [ARGS]... (or -m MODULE [ARGS]...) under a tracer and report, at your own
    lines, recompilations, host syncs, data-dependent shapes and CPU fallbacks (torch_xla), and
    for native PyTorch also graph breaks, unsupported TorchTPU ops and calls that raise there.
    A TorchTPU program runs on the TorchTPU stand-in, which counts its host syncs exactly."""
    from tpu_migrate.diagnose.command import DiagnoseError, run_diagnose

    try:
        status, document, findings = run_diagnose(target, list(args), module, warmup_steps,
                                                  output_format, output, explain, html_file, backend, python)
    except DiagnoseError as exc:
        raise click.UsageError(str(exc)) from None
    machine = {  # nothing when there is no report (said on stderr)
        "json": lambda: document + "\n",
        "sarif": lambda: _ci_formats().diagnose_sarif([f.to_json() for f in findings]) + "\n",
        "github": lambda: _ci_formats().diagnose_github([f.to_json() for f in findings]),
    }.get(output_format)
    if document is not None and machine is not None:
        _write_stdout(machine())
    if fail_on and any(f.kind in fail_on for f in findings):
        sys.exit(1)
    sys.exit(status)


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
              short_help="Run a TorchTPU program on the CPU, on the TorchTPU stand-in.")
@click.option("-m", "module", metavar="MODULE", help="Run a module, like `python -m MODULE`.")
@click.option("--nproc", type=click.IntRange(min=1), default=None,
              help="Processes per node, under torchrun (one per chip, as on a TPU VM).")
@click.option("--nnodes", type=click.IntRange(min=1), default=1, show_default=True,
              help="Hosts of an emulated pod: one torchrun per host on this machine, each seeing itself as "
                   "host K.")
@click.option("--python", "python", type=click.Path(dir_okay=False, exists=True), metavar="PYTHON",
              help="A Python with torch 2.11 to 2.15 (default: $TPU_MIGRATE_STANDIN_PYTHON, this one if its "
                   "torch fits, else an environment tpu-migrate makes once and keeps in its cache).")
@click.argument("script", required=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run(module, nproc, nnodes, python, script, args) -> None:
    """Run SCRIPT [ARGS]... (or -m MODULE [ARGS]...) as `python` would on a TPU VM, with the `tpu`
    device emulated on the CPU: torch.tpu as in torch-tpu 0.2.0, torch.accelerator, tpu_dist,
    torch.compile(backend="tpu"), autocast. The exit status is the program's."""
    from tpu_migrate import standin
    from tpu_migrate.standin import launcher

    if module is not None:
        target = ["-m", module, *((script,) if script is not None else ()), *args]
    elif script is None:
        raise click.UsageError("give a SCRIPT or -m MODULE")
    else:
        target = [script, *args]
    try:
        interpreter = launcher.python_for_run(python)
    except standin.StandInError as exc:
        raise click.UsageError(str(exc)) from None
    sys.exit(launcher.run(interpreter, target, nproc, nnodes))


def _process_counts(ctx, param, value):
    try:
        counts = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        counts = []
    if not counts or any(n < 1 for n in counts):
        raise click.BadParameter(f"{value!r}: give process counts like 1,2")
    return counts


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
              short_help="Prove a migration: the original and the migrated program, step by step.")
@click.option("--target", type=click.Choice(["tpu", "portable"]), default="tpu", show_default=True,
              help="The migration to prove (rewrite --target): tpu runs it on the TorchTPU stand-in (the tpu "
                   "device emulated on the CPU, tpu_dist over gloo); portable on the CPU with gloo.")
@click.option("--against", metavar="MIGRATED", type=click.Path(),
              help="Compare with this migrated (and hand-edited) copy, of --target's dialect, instead of a fresh "
                   "migration: a script, or with -m MODULE the migrated tree (or the module's file in it).")
@click.option("--root", type=click.Path(file_okay=False, exists=True),
              help="The tree the script imports from, copied and migrated with it (default: the script's folder).")
@click.option("--nproc", "nprocs", default="1,2", show_default=True, callback=_process_counts,
              help="Process counts to run the migrated program at (more than 1: under torchrun, gloo).")
@click.option("--nnodes", type=click.IntRange(min=1), default=1, show_default=True,
              help="Nodes to run each torchrun at: N torchruns (--nnodes N --node_rank K) at once on this machine, "
                   "as on the hosts of a pod, each of --nproc processes.")
@click.option("--rtol", type=float, default=1e-4, show_default=True, help="Relative tolerance.")
@click.option("--atol", type=float, default=1e-5, show_default=True, help="Absolute tolerance.")
@click.option("--tolerance", "tolerances", metavar="NAME=RTOL", multiple=True,
              help="The relative difference you expect of one quantity, in place of --rtol (repeatable): "
                   "lr, loss, grad-norm, params, printed (every printed number) or printed:LINE (a line of the "
                   "original's output, as the report numbers it), e.g. --tolerance loss=1e-3 --tolerance "
                   "printed:12=1e-2.")
@click.option("--timeout", type=float, default=1800, show_default=True, help="Seconds per run.")
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--html", "html_file", type=click.Path(dir_okay=False, writable=True),
              help="Write a self-contained HTML page (each run's steps beside the original's) here.")
@click.option("-m", "module", metavar="MODULE",
              help="Run a module, like `python -m MODULE` (its tree: --root, default the working directory).")
@click.option("--python", "python", type=click.Path(dir_okay=False, exists=True), metavar="PYTHON",
              help="The Python (3.11+) to run the original with (and the migrated program, with --target "
                   "portable): your project's environment, with torch and torch_xla (default: the one "
                   "tpu-migrate runs in).")
@click.option("--migrated-python", "migrated_python", type=click.Path(dir_okay=False, exists=True),
              metavar="PYTHON",
              help="The Python to run the migrated program with: for --target tpu, one with torch 2.11 to 2.15, "
                   "such as your TorchTPU environment (default: $TPU_MIGRATE_STANDIN_PYTHON, this one if its "
                   "torch fits, else an environment tpu-migrate makes once and keeps in its cache).")
@click.argument("script", required=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def verify(target, against, root, nprocs, nnodes, rtol, atol, tolerances, timeout, output_format, html_file, module,
           python, migrated_python, script, args) -> None:
    """Run SCRIPT [ARGS]... (or -m MODULE [ARGS]...) under torch_xla on the CPU (one process, twice:
    its own noise), and its migration with torch_xla unimportable, at each --nproc: by default the
    tpu migration, on the TorchTPU stand-in; compare, per optimizer step, the loss, the gradient
    norm and the parameters, then the numbers it prints. Exit 0: the same; 1: they differ (the
    first divergence and its likely cause); 2: a program failed, or no Python for the stand-in."""
    from tpu_migrate.verify.command import VerifyError, dumps, parse_tolerances, run_verify

    if module is not None:  # `-m pkg.train ARGS`: SCRIPT took the first argument
        args = (script, *args) if script is not None else args
    elif script is None:
        raise click.UsageError("give a SCRIPT or -m MODULE")
    echo = (lambda line: click.echo(line, err=True)) if output_format == "json" else click.echo
    try:
        expected = parse_tolerances(list(tolerances))
    except VerifyError as exc:
        raise click.BadParameter(str(exc).removeprefix("--tolerance "), param_hint="--tolerance") from None
    try:
        status, document = run_verify(module or script, list(args), against, root, nprocs, rtol, atol, timeout,
                                      echo, html_file, module=module is not None,
                                      interpreter=(lambda env: os.path.abspath(python)) if python else None,
                                      target=target, migrated_python=migrated_python,
                                      nproc_default=click.get_current_context().get_parameter_source("nprocs")
                                      == click.core.ParameterSource.DEFAULT, nnodes=nnodes, expected=expected)
    except VerifyError as exc:
        raise click.UsageError(str(exc)) from None
    if output_format == "json":
        _write_stdout(dumps(document) + "\n")
    sys.exit(status)


def _write_stdout(text: str) -> None:
    """diagnose's machine output: one that cannot be written (`> /dev/full`, a closed pipe) is
    a line on stderr, and the exit status stays the program's (Python would end with 120)."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except OSError as exc:
        sys.stderr.write(f"tpu-migrate diagnose: cannot write the report to stdout: {exc.strerror or exc}\n")
        # What is still buffered would fail again at exit: it goes nowhere instead.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


@main.group()
def report() -> None:
    """Work with diagnose reports."""


@report.command("merge")
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--output", type=click.Path(dir_okay=False, writable=True), help="Write the merged JSON here.")
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text", show_default=True)
def report_merge(directory, output, output_format) -> None:
    """Merge the per-rank JSON reports that `diagnose` wrote under torchrun in DIRECTORY."""
    from tpu_migrate.diagnose.command import DiagnoseError, merge_reports

    try:
        merge_reports(directory, output, output_format)
    except DiagnoseError as exc:
        raise click.UsageError(str(exc)) from None
