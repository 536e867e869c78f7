"""Launches that stay torch_xla's: the converted collectives and rank reads they run see one process.

torch_xla's launchers (`xmp.spawn`, `torch_xla.launch`, `pjrt.run_multiprocess`) started workers
that needed no process group: its runtime answered their ranks and reduced across them. The
converted code asks `torch.distributed`, whose group a converted launch makes (TPU060) or a
launcher's environment gives (torchrun's RANK and WORLD_SIZE). A launch the rewrite leaves
torch_xla's (a TPU060 refusal, a launcher no rule converts, TPU060 not selected) makes no group
and sets neither: until it is ported, each converted collective reaches its own process alone
and each rank read answers rank 0 of 1. Those lines get a TODO that says so (`mark`).

The launch is known to stay torch_xla's:
1. in the file itself;
2. in another module of the project (`kept_launch_modules`, read before the rewrite as
   spmd_programs.py reads SPMD): a module that imports this one, directly or through others (its
   workers run this code), or a module this one imports (its launcher: Lightning's
   `XLAStrategy` and `strategies/launchers/xla.py`);
3. where the project shows no launch at all, in a class named for XLA (`XLAStrategy`,
   `_XlaDistModel`): a library's torch_xla backend, whose processes only a torch_xla launcher
   started (its library's, in a module not at hand); or in a branch whose test compares with an
   enum member named XLA (accelerate's `distributed_type == DistributedType.XLA`), which holds
   only under torch_xla's runtime.
Nothing is marked where a converted launch runs the code (this file's, or one in a module that
imports it), or where the file makes a process group itself. A module with no launch in sight
and no XLA class or branch (a library's helper, run by whatever launched the user's script, which
may be torchrun) is not marked: the tool does not know that its launch stays torch_xla's.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from tpu_migrate.rewrite import parsed_trees
from tpu_migrate.rewrite.names import Analysis, finding_position
from tpu_migrate.rewrite.plans import SPAWN_NAMES, Worker, spawn_worker
from tpu_migrate.rewrite.project import Project
from tpu_migrate.rewrite.registry import rule_code

# torch_xla's launchers no rule converts (TPU099): their workers never join a process group.
OTHER_LAUNCHERS = frozenset({
    "torch_xla._internal.pjrt.run_multiprocess", "torch_xla._internal.pjrt.spawn_threads",
    "torch_xla._internal.pjrt.spawn", "torch_xla.experimental.pjrt.run_multiprocess",
    "torch_xla.experimental.pjrt.spawn_threads",
})
# The rank rules whose conversion reads the process group or the launcher's environment.
PROCESS_QUERIES = frozenset({
    rule_code("TPU020"), rule_code("TPU021"), rule_code("TPU022"), rule_code("TPU023"), rule_code("TPU024"),
    rule_code("TPU166"), rule_code("TPU167"), rule_code("TPU168"),
})
# Bytes a module that calls a torch_xla launcher holds (a file without any is not parsed).
_LAUNCH_MARKERS = (b"xla_multiprocessing", b"pjrt", b"torch_xla.launch", b"import launch", b", launch")
# The last names of the launchers: a call of one spells its name whole in plain source.
_LAUNCHER_NAMES = tuple(sorted({name.rpartition(".")[2].encode() for name in SPAWN_NAMES | OTHER_LAUNCHERS}))
# `XLAStrategy`, `_XlaDistModel`, `TorchXLATrainer`; not `Xlarge`, `MAXLAYERS`.
_XLA_CLASS = re.compile(r"(?:^|[_a-z0-9])(?:XLA|Xla)(?![a-z])")

# The rank rules whose conversion reads the launcher's per-host variables (LOCAL_RANK,
# LOCAL_WORLD_SIZE), which only a launcher sets: a process group does not give them.
HOST_QUERIES = frozenset({rule_code("TPU022"), rule_code("TPU166")})

COLLECTIVE, RANK, LOCAL, GROUP = "collective", "rank", "local", "group"
_MESSAGES = {
    COLLECTIVE: ("torch_xla reduced across every process without a process group; {reason} and creates none: "
                 "start the workers with RANK and WORLD_SIZE set, or call dist.init_process_group in them, or "
                 "this collective reaches this process alone"),
    RANK: ("torch_xla's runtime answered this in every worker without a process group; {reason} and creates "
           "none: start the workers with RANK and WORLD_SIZE set, or call dist.init_process_group in them, or "
           "every process reads rank 0 of 1 here"),
    LOCAL: ("torch_xla's runtime answered this in every worker; {reason} and sets no LOCAL_RANK or "
            "LOCAL_WORLD_SIZE: start the workers with them set (torchrun, or the launch ported), or every process "
            "reads local rank 0, of 1 process on its host, here"),
    GROUP: ("torch_xla's xla:// took rank and world size from its runtime; {reason} and sets no RANK or "
            "WORLD_SIZE: start the workers with them set (torchrun, or the launch ported), or each worker "
            "makes a group of its own here (rank 0 of 1)"),
}


def launch_calls(analysis: Analysis, canonical, workers: dict[int, Worker] | None = None,
                 ) -> Iterable[tuple[ast.stmt, str, bool]]:
    """(statement, callee as written, whether TPU060 can convert it) of each call of a torch_xla
    launcher in the module (`workers`: what `spawn_worker` found of the launch statements, where
    make_plans already asked: Plans.launch_workers)."""
    launchers = [(info, ref) for info in analysis.infos.values() for ref in info.refs
                 if ref.qualname in SPAWN_NAMES or ref.qualname in OTHER_LAUNCHERS]
    if not launchers:  # most files: no need to index every call of the file
        return
    calls = {finding_position(node.func): node for node in analysis.nodes if isinstance(node, ast.Call)}
    for info, ref in launchers:
        call = calls.get((ref.line, ref.col))
        if call is None:
            continue
        worker = None
        if ref.qualname in SPAWN_NAMES and isinstance(info.node, ast.Expr) and info.node.value is call:
            worker = spawn_worker(call, info, analysis, canonical) if workers is None else \
                workers.get(id(info.node))
        yield info.node, ref.dotted, worker is not None and worker.name is not None


def kept_launch(sc) -> str | None:
    """Why the launch that runs this statement stays torch_xla's (a clause that `... and creates
    none` ends); None where that is not known, or where a process group is made for it."""
    file = sc.file
    if "kept_launch" not in file.memo:
        file.memo["kept_launch"] = _file_reason(file)
    reason = file.memo["kept_launch"]
    if reason is not None or file.kept_launch_why is not None or _group_made(file.plans):
        return reason
    scope = sc.info.scope
    while scope is not None:
        if scope.kind == "class" and _XLA_CLASS.search(scope.path[-1]):
            return (f"`{scope.path[-1]}` is a torch_xla backend: the launch that starts its processes (not "
                    "found in this project) is torch_xla's")
        scope = scope.parent
    for ancestor in reversed(sc.ancestors or ()):
        member = _xla_member_test(ancestor)
        if member is not None:
            return (f"this branch runs only under torch_xla's runtime (its test compares with `{member}`): the "
                    "launch that starts its processes (not found in this project) is torch_xla's")
    return None


def _xla_member_test(statement: ast.AST) -> str | None:
    """`DistributedType.XLA` where `statement` is an `if`/`while` whose test compares with an
    enum member named XLA (accelerate's `state.distributed_type == DistributedType.XLA`): a
    library's torch_xla branch, which holds only in processes torch_xla's runtime runs."""
    if not isinstance(statement, (ast.If, ast.While)):
        return None
    for node in ast.walk(statement.test):
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.Is)) for op in node.ops):
            for side in (node.left, *node.comparators):
                if isinstance(side, ast.Attribute) and side.attr == "XLA":
                    return ast.unparse(side)
    return None


def _group_made(plans) -> bool:
    """Whether a process group is made for the file's code: by its converted launch, or by the
    file itself ("xla" included: under torchrun that group is the real one)."""
    return plans is None or plans.launcher_group or bool(plans.group_calls)


def _file_reason(file) -> str | None:
    plans = file.plans
    if plans is None or plans.launcher_group or plans.group_backends:
        return None
    kept = []  # every launcher the file keeps, once (test_ddp: run_multiprocess and spawn_threads)
    for statement, dotted, _ in launch_calls(file.analysis, file.catalog.canonical, plans.launch_workers):
        if id(statement) in plans.spawn_refusals:
            return "this file's launch is left to you"
        if id(statement) not in plans.spawn_workers and dotted not in kept:
            kept.append(dotted)
    if len(kept) == 1:
        return f"this file's launch `{kept[0]}` stays torch_xla's"
    if kept:
        return f"each of this file's launches ({', '.join(f'`{d}`' for d in kept)}) stays torch_xla's"
    return file.kept_launch_why or None


def mark(sc, code: str, where: tuple[int, int] | None, what: str) -> None:
    """A TODO on the converted line (`what`: COLLECTIVE, RANK, LOCAL or GROUP) where its launch stays
    torch_xla's."""
    reason = kept_launch(sc)
    if reason is not None:
        sc.needs_manual(code, _MESSAGES[what].format(reason=reason), where=where)


# -- the project ------------------------------------------------------------------------------


def kept_launch_modules(run_files: Iterable[str], root: Path | None, project: Project | None = None,
                        rewrite_arguments: Callable[[], tuple | None] | None = None) -> tuple[tuple[str, str], ...]:
    """(module's real path, why its launch stays torch_xla's; "" where a converted launch runs it)
    for the project's modules that name torch_xla and are run by a launch in another module,
    sorted. Only the files that name torch_xla and a launch are parsed first; the import graph
    is spmd_programs.py's (`project`: the project already read, shared with the other passes).
    `rewrite_arguments`: the arguments the rewrite gives `analyze` (None where they are not to
    be had), asked where the rewrite of every file follows: each file is then analysed as the
    rewrite analyses it, and the analysis lent to it with the tree (parsed_trees.py; the launches
    found are the same: they are read from the resolved names, not from what is flagged)."""
    from tpu_migrate.rewrite.names import analyze
    from tpu_migrate.rewrite.spmd_programs import _first_importers, import_graph
    from tpu_migrate.rules import load_catalog

    project = project if project is not None else Project(run_files, root)
    canonical = load_catalog().canonical
    arguments: tuple | None = None
    kept: dict[str, str] = {}  # module -> its kept launch's callee
    converted: set[str] = set()
    xla_files = project.xla_files()
    imports = import_graph(project)
    for path in xla_files:
        data = project.read(path)
        if not _may_launch(path, data):
            continue
        tree = project.tree(path, data)
        if tree is None:
            continue
        if arguments is None:
            arguments = rewrite_arguments() if rewrite_arguments is not None else None
            arguments = arguments if arguments and arguments[0] == canonical else (canonical,)
        analysis = analyze(tree, *arguments)
        if len(arguments) > 1:
            parsed_trees.lend_analysis(data, tree, arguments, analysis)
        launches = list(launch_calls(analysis, canonical))
        if any(convertible for _, _, convertible in launches):
            converted.add(path)
        elif launches:
            kept[path] = launches[0][1]
        if launches:  # where the import graph starts: its imports found from this parse
            imports.add(path, tree, data)
    if not kept and not converted:
        return ()
    shown = project.shown
    by_converted = _first_importers(sorted(converted), imports.of) if converted else {}
    found: dict[str, str] = dict.fromkeys(by_converted, "")
    for module, program in (_first_importers(sorted(kept), imports.of) if kept else {}).items():
        found.setdefault(module, f"{shown(program)} imports this module and launches with `{kept[program]}`, "
                                 "which stays torch_xla's")
    # The modules that import a launcher module (its caller: a strategy), by a byte search of
    # their `from ... import` lines (parameter_flows.py's), resolved as Python would.
    stems = {os.path.splitext(os.path.basename(path))[0] for path in kept}
    for path in xla_files:
        if path in found or path in kept or path in converted:
            continue
        launcher = _imported_launcher(path, project, stems, kept)
        if launcher is not None:
            found[path] = f"this file imports {shown(launcher)}, whose launch `{kept[launcher]}` stays torch_xla's"
    named = set(xla_files)
    return tuple(sorted((path, why) for path, why in found.items()
                        if path in named and path not in kept and path not in converted))


def _may_launch(path: str, data: bytes) -> bool:
    """Whether `launch_calls` can find a launch in the file, from its bytes: it names a launcher's
    module, and in plain ASCII source (spmd_programs._plain_identifiers) the launcher's own name
    as a whole word (the catalog's historical spellings rename modules only): torch_xla's own
    modules say pjrt without calling a launcher (7 of 29 such files of its package)."""
    from tpu_migrate.rewrite.spmd_programs import _has_word, _plain_identifiers

    if not any(marker in data for marker in _LAUNCH_MARKERS):
        return False
    return not _plain_identifiers(path, data) or any(_has_word(data, name) for name in _LAUNCHER_NAMES)


def _imported_launcher(path: str, project: Project, stems: set[str], kept: dict[str, str]) -> str | None:
    """The first module of `kept` that the file imports with `from ... import` (`from
    pkg.launchers.xla import _XLALauncher`, `from .launchers import xla`), None if none."""
    for level, module, names in project.from_imports(path):
        for dotted in (module, *(f"{module}.{name}" for name, _ in names)):
            if dotted.rpartition(".")[2] not in stems:
                continue
            for candidate in project.imported_files(path, level, dotted):
                if candidate in kept and candidate.endswith(os.path.join(*dotted.split(".")) + ".py"):
                    return candidate
    return None


__all__ = ["COLLECTIVE", "GROUP", "RANK", "PROCESS_QUERIES", "kept_launch", "kept_launch_modules", "launch_calls",
           "mark"]
