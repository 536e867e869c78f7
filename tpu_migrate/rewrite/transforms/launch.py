"""Process launch and the process group (rules/launch.toml): `xmp.spawn`, `torch_xla.launch`, `init_process_group("xla")` (TPU060, TPU070)."""

from __future__ import annotations

import ast

import libcst as cst

from tpu_migrate.rewrite import kept_launches
from tpu_migrate.rewrite.context import StatementContext, parse_expr, parse_stmt
from tpu_migrate.rewrite.plans import init_process_group_calls, is_xla_backend_init, main_guard_only
from tpu_migrate.rewrite.process_values import varying_parts
from tpu_migrate.rewrite.registry import STATEMENT, emits, transform
from tpu_migrate.rewrite.transforms.device import device_string_args
from tpu_migrate.rewrite.transforms.common import (
    atom,
    parse_block,
    code,
    bind,
    fresh_name,
    helper,
    literal_bool,
    clean_args,
    quote_of,
    spmd_reason,
)


XLA_COLLECTIVES = frozenset(f"torch_xla.core.xla_model.{name}" for name in (
    "all_reduce", "all_gather", "collective_broadcast", "rendezvous", "mesh_reduce", "reduce_gradients",
    "optimizer_step", "broadcast_master_param", "save",
))
# One accelerator per process: each rank selects its own (an index-less device is the current
# one, 0 unless set; NCCL refuses duplicates). Not on TorchTPU: its launch environment binds
# each process to one device, which it sees as index 0, and set_device_index(i > 0) raises.
SELECT_LOCAL_DEVICE = (
    "if {torch}.accelerator.is_available() and {torch}.accelerator.current_accelerator().type != \"tpu\":\n"
    "    {torch}.accelerator.set_device_index({local_rank})\n"
)


@transform("init_process_group", calls=("torch.distributed.init_process_group",))
def init_process_group(call: cst.Call, sc: StatementContext):
    bound = bind(call, ["backend", "init_method"])
    if bound is None or "backend" not in bound:
        return call
    backend = bound["backend"]
    if not (isinstance(backend.value, cst.SimpleString) and backend.value.evaluated_value == "xla"):
        if (
            sc.file.target == "tpu" and not isinstance(backend.value, cst.SimpleString)
            and not (isinstance(backend.value, cst.Name) and backend.value.value == "None")  # the default
            and (sc.file.analysis.qualnames & XLA_COLLECTIVES or sc.file.plans.ported_collectives)
            and sc.enabled("TPU070")
        ):
            # A literal backend other than tpu_dist is marked on each collective (TPU100...); the
            # collectives an earlier run ported (a portable tree checked again) count as torch_xla's.
            sc.needs_manual("TPU070", "the torch_xla collectives of this file, which needed no group, now "
                            "run on the default group this call makes: make sure its backend can carry "
                            "tpu tensors (\"tpu_dist\"; gloo carries only CPU tensors)")
        if _xla_rendezvous(bound.get("init_method")) and sc.enabled("TPU070"):
            # A gloo (or other) group that rendezvoused through torch_xla's handler, which only
            # `import torch_xla` registered: env://, as the "xla" backend's call gets.
            return _without_xla_rendezvous(call, bound["init_method"], sc)
        # `backend=args.backend or "xla"`: its "xla" strings, like any backend keyword's (TPU005)
        return device_string_args(call, sc)
    if not sc.enabled("TPU070"):
        return call
    sc.consume_string()
    where = sc.fixed("TPU070", "torch.distributed.init_process_group")
    plan = sc.file.import_plan
    method = bound.get("init_method")
    drop_method = _xla_rendezvous(method)
    kept = [a for a in call.args if not (a is method and drop_method)]
    args = []
    for i, arg in enumerate(kept):
        if arg is backend:
            if sc.file.target == "portable":
                later_positional = any(a.keyword is None for a in kept[i + 1 :])
                if not later_positional:
                    continue  # the default backend
                arg = arg.with_changes(value=cst.Name("None"))
            else:
                q = quote_of(arg.value)
                arg = arg.with_changes(value=cst.SimpleString(f"{q}tpu_dist{q}"))
        args.append(arg)
    new = call.with_changes(args=clean_args(args))
    if drop_method and not sc.file.plans.workers:
        _env_rendezvous_defaults(sc, where)
    if drop_method:  # (env:// read the environment under torch_xla too)
        kept_launches.mark(sc, "TPU070", where, kept_launches.GROUP)
    if sc.file.target == "portable" and not sc.file.plans.workers and sc.can_prefix:
        # torchrun and friends start one process per accelerator: each must use its own
        # (an index-less device is the current one, 0 unless set; NCCL refuses duplicates).
        os_name = plan.use("os")
        sc.before.append(parse_stmt(SELECT_LOCAL_DEVICE.format(
            torch=plan.use("torch"), local_rank=f'int({os_name}.environ.get("LOCAL_RANK", 0))'
        )))
    if sc.file.plans.workers and not sc.file.plans.other_inits:
        # The launcher's worker already joined the group; the program's own call (often on one
        # path only) runs where no launcher of this file made one, e.g. under torchrun.
        return parse_expr(f"{code(new)} if not {plan.use('dist')}.is_initialized() else None")
    # A converted collective that ran first, in this module or in any other the program imports
    # (a library's), made the default group from the launch environment (_process_group), as
    # torch_xla's needed none: this call must not make a second one.
    return parse_expr(f"{code(new)} if not {plan.use('dist')}.is_initialized() else None")


@transform("init_process_group", calls=("torch.distributed.barrier",))
def barrier_in_rank_branch(call: cst.Call, sc: StatementContext):
    """torch_xla's "xla" backend made `dist.barrier()` a no-op (ProcessGroupXla.barrier returns at
    once): a barrier that only some ranks reach (`if rank == 0: ...; dist.barrier()`) went on.
    TorchTPU's barrier waits for every rank of the group, so there it hangs: marked."""
    if not sc.enabled("TPU070") or not _xla_backend_group(sc):
        return call
    test = _rank_branch(sc)  # `if rank == 0`, or after `if rank != 0:` leaves
    if test is not None:
        sc.needs_manual("TPU070", f"only some ranks reach this barrier ({test}): torch_xla's "
                        "\"xla\" backend made dist.barrier() a no-op, and TorchTPU's waits for every rank "
                        "of the group, so it hangs unless the other ranks reach a barrier too: move it out "
                        "of the branch, pair it, or delete it (it waited for nothing)")
    return call


def _xla_backend_group(sc: StatementContext) -> bool:
    """Whether the file's process group may be torch_xla's "xla" backend: it registers the backend
    (`import torch_xla.distributed.xla_backend`) or makes a group with it."""
    found = sc.file.memo.get("xla_backend_group")
    if found is None:
        analysis = sc.file.analysis
        found = sc.file.memo["xla_backend_group"] = any(
            b.qualname == "torch_xla.distributed.xla_backend" for b in analysis.imports
        ) or any(map(is_xla_backend_init, sc.file.plans.group_calls if sc.file.plans is not None
                     else init_process_group_calls(analysis.nodes)))
    return found


_RANK_WORDS = ("rank", "ordinal", "master")


def _rank_branch(sc: StatementContext) -> str | None:
    """`if TEST` (as written) where TEST asks for the rank (`xm.is_master_ordinal()`, `rank == 0`,
    `args.local_rank in (-1, 0)`) and decides, in the statement's own function, whether it runs:
    an `if` around it, or one before it that leaves (`if rank != 0: return`)."""
    chain = [*(sc.ancestors or []), sc.info.node]
    for parent, child in reversed(list(zip(chain, chain[1:]))):
        if isinstance(parent, ast.If) and _asks_rank(parent.test):
            return f"under `if {ast.unparse(parent.test)}`"
        for earlier in _statements_before(parent, child):
            if isinstance(earlier, ast.If) and _asks_rank(earlier.test) and any(
                    isinstance(stmt, _LEAVES) for stmt in [*earlier.body, *earlier.orelse]):
                return f"after `if {ast.unparse(earlier.test)}:` leaves"
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return None
    return None


# Statements that leave the rest of a block unrun (a `continue` or `break` leaves it for the
# loop's pass, which holds the barrier where it follows in the loop's body).
_LEAVES = (ast.Return, ast.Raise, ast.Continue, ast.Break)


def _asks_rank(test: ast.expr) -> bool:
    return any(word in (getattr(name, "id", None) or getattr(name, "attr", "")).lower()
               for name in ast.walk(test) if isinstance(name, (ast.Name, ast.Attribute))
               for word in _RANK_WORDS)


def _statements_before(parent: ast.AST, child: ast.AST) -> list[ast.stmt]:
    """The statements before `child` in the block of `parent` that holds it."""
    for block in ("body", "orelse", "finalbody", "handlers", "cases"):
        statements = getattr(parent, block, None) or []
        for index, statement in enumerate(statements):
            if statement is child:
                return statements[:index]
    return []


def _xla_rendezvous(method: cst.Arg | None) -> bool:
    """`init_method="xla://"` / `"pjrt://"`: torch_xla's rendezvous handlers."""
    return method is not None and isinstance(method.value, cst.SimpleString) and \
        method.value.evaluated_value in ("xla://", "pjrt://")


@emits("TPU070")
def _env_rendezvous_defaults(sc: StatementContext, where) -> None:
    """xla:// took rank and world size from torch_xla's runtime: `python train.py` needed no
    environment. env:// reads it: a process no launcher started is rank 0 of 1 (what a launcher
    such as torchrun set is kept)."""
    if sc.can_prefix:
        os_name = sc.file.import_plan.use("os")
        sc.before.extend(parse_block([*_rendezvous_defaults(sc),
                                      f'{os_name}.environ.setdefault("RANK", "0")',
                                      f'{os_name}.environ.setdefault("WORLD_SIZE", "1")']))
    else:
        sc.needs_manual("TPU070", "the env:// rendezvous needs RANK, WORLD_SIZE, MASTER_ADDR and "
                        "MASTER_PORT, which `python train.py` does not set (xla:// needed none): "
                        "set them before this statement", where=where)


@emits("TPU070")
def _without_xla_rendezvous(call: cst.Call, method: cst.Arg, sc: StatementContext):
    """`init_process_group("gloo", init_method="xla://")`: the same group through env://."""
    reason = spmd_reason(sc)
    if reason is not None:
        # One process per host: xla:// made a group of the hosts, env:// under TorchTPU's launch
        # one of every TPU's process.
        sc.needs_manual("TPU070", f"{reason}, where xla:// made a group of "
                        "the hosts; TorchTPU runs one process per TPU: port the SPMD code first, then "
                        "rendezvous through env:// (the launcher's RANK and WORLD_SIZE)")
        return call
    where = sc.fixed("TPU070", "torch.distributed.init_process_group")
    if not sc.file.plans.workers:
        _env_rendezvous_defaults(sc, where)
    return call.with_changes(args=clean_args([a for a in call.args if a is not method]))


@transform("spawn", form=STATEMENT)
def spawn_statement(call, qualname, sc: StatementContext, rule, plans):
    if id(sc.info.node) not in plans.spawn_workers:
        why = plans.spawn_refusals.get(id(sc.info.node), "the call is too dynamic to convert")
        sc.needs_manual(
            rule.code,
            f"launch with torch.multiprocessing.spawn (start method spawn) and call "
            f"dist.init_process_group in the worker: {why}",
            qualname,
        )
        return None
    launch = qualname == "torch_xla.launch"
    params = (
        ["fn", "args", "start_method", "debug_single_process"]
        if launch
        else ["fn", "args", "nprocs", "join", "daemon", "start_method"]
    )
    bound = bind(call, params) or {}
    plan = sc.file.import_plan
    where = sc.fixed(rule.code, qualname)
    if plans.other_inits:
        sc.needs_manual(
            rule.code,
            "the program creates its own process group (another backend, or one not known "
            "here), so the worker gets none from the launcher: where it creates none, rank and "
            "world size come from the environment (each worker's RANK; WORLD_SIZE where torchrun "
            "sets it, else 1) and collectives fail; create it on every path of the worker",
            where=where,
        )
    if not launch:
        _unsupported_nprocs(bound, sc, rule, where)
    fn = code(bound["fn"].value)
    args = bound["args"].value if "args" in bound else None
    os_name = plan.use("os")
    dist = plan.use("dist")
    call_args = _spread(args)
    worker = plans.spawn_workers[id(sc.info.node)]
    wrapper = _wrapper(sc, worker, launch)
    if _forked(bound):
        for problem in _what_spawn_loses(sc, worker, wrapper):
            sc.needs_manual(rule.code, f"start_method='fork' became spawn: {problem}", where=where)
    # torchrun started this process as one of the workers (on one host or several): RANK,
    # WORLD_SIZE and LOCAL_RANK are its; torch_xla.launch called fn itself.
    local_rank = f'int({os_name}.environ["LOCAL_RANK"])'
    under_torchrun = f"{wrapper}({local_rank}, {fn}, None{call_args})"
    shared = None if launch else _arguments_evaluated_once(fn, args, worker, sc, rule, where)
    if shared is not None:
        under_torchrun = f"{wrapper}({local_rank}, {shared}, None)"
    lines = [f"if {dist}.is_torchelastic_launched():", f"    {under_torchrun}"]
    single = _single_process(bound, launch)
    if single is not None:
        # torch_xla ran fn(ordinal, *args) in this process (nprocs=1, debug_single_process=True):
        # one process per host.
        in_process = [*_world("1", sc), f"{wrapper}(0, {fn}, 1{call_args})"]
        if single == "always":
            return [parse_stmt("\n".join(lines + ["else:"] + _indent(in_process)) + "\n")]
        lines += [f"elif {single}:", *_indent(in_process)]
    count = _process_count(bound, sc)
    spawned = []
    if not count.isdigit():
        name = fresh_name(sc, "nprocs")
        spawned.append(f"{name} = {count}")
        count = name
    spawned += [*_world(count, sc),
                plan.fill("{torch}.multiprocessing.spawn") + f"({wrapper}, args=({fn}, {count}{call_args}), "
                f"nprocs={count})"]
    lines += ["else:", *_indent(spawned)]
    return [parse_stmt("\n".join(lines) + "\n")]


# What xmp.spawn / torch_xla.launch did in each process before calling fn, as a function of its
# own: the launched function is never edited (a GPU path or a test may call it too). RANK is the
# global rank on a pod: this host's NODE_RANK (set_tpu_launch_env sets it on a multi-host slice)
# times the processes per host, plus the local index; fn gets it, as torch_xla gave fn the global
# ordinal; under torchrun, torch_xla.launch gave fn the local rank (`{index}`). LOCAL_WORLD_SIZE
# stands for PJRT_LOCAL_PROCESS_COUNT (xr.local_process_count(), TPU166). `{setup}` selects
# the local accelerator (portable), `{init}` starts the group.
WORKER = '''def {name}(local_index, fn, nprocs, *args):
    """Prepare this process as xmp.spawn did, then call fn unchanged (added by tpu-migrate)."""
    if not {dist}.is_torchelastic_launched():
        {os}.environ["LOCAL_RANK"] = str(local_index)
        {os}.environ["LOCAL_WORLD_SIZE"] = str(nprocs)
        {os}.environ["RANK"] = str(int({os}.environ.get("NODE_RANK", 0)) * nprocs + local_index)
{setup}{init}    try:
        return fn({index}, *args)
    finally:
        if {dist}.is_initialized():
            {dist}.destroy_process_group()
'''


# The index fn gets: xmp.spawn gave the global ordinal; torch_xla.launch too, except under
# torchrun, where it called fn(LOCAL_RANK) in the process torchrun started.
SPAWN_INDEX = 'int({os}.environ["RANK"])'
LAUNCH_INDEX = 'local_index if {dist}.is_torchelastic_launched() else int({os}.environ["RANK"])'


def _wrapper(sc: StatementContext, worker: str, launch: bool) -> str:
    """The name of the file's wrapper that starts `worker` (added once per file and variant)."""
    file = sc.file
    setup = init = ""
    if file.target == "portable":
        # One accelerator per process: each rank's index-less device is its own one.
        setup = "    " + SELECT_LOCAL_DEVICE.format(torch="{torch}", local_rank="local_index").replace("\n    ", "\n        ")
    base = "_launch_worker" if launch else "_xmp_worker"
    if not file.plans.other_inits:
        if worker in file.plans.self_initializing:
            base += "_own_group"  # the worker starts the group itself, on every path
        else:
            backend = '"tpu_dist"' if file.target == "tpu" else ""
            init = f"    {{dist}}.init_process_group({backend})\n"
    template = WORKER.replace("{setup}", setup).replace("{init}", init).replace(
        "{index}", LAUNCH_INDEX if launch else SPAWN_INDEX)
    return helper(sc, base, template)


def _world(count: str, sc: StatementContext) -> list[str]:
    """The parent's launch environment for `count` processes on this host: TorchTPU's first
    (on a pod it names the master, the node count and this node's rank, and never overwrites
    a variable), then the local defaults for what it left unset, then the world of every host."""
    os_name = sc.file.import_plan.use("os")
    nodes = f'{os_name}.environ.get("NNODES", "1")'
    size = nodes if count == "1" else f'str(int({os_name}.environ.get("NNODES", 1)) * {count})'
    return [*_launch_env(count, sc), *_rendezvous_defaults(sc), f'{os_name}.environ["WORLD_SIZE"] = {size}']


def _rendezvous_defaults(sc: StatementContext) -> list[str]:
    """Where the env:// rendezvous meets when no launcher said (torch_xla's needed no address
    and no port): this host, at a port `RENDEZVOUS_PORT` picks."""
    os_name = sc.file.import_plan.use("os")
    return [f'{os_name}.environ.setdefault("MASTER_ADDR", "127.0.0.1")',
            f'{os_name}.environ.setdefault("MASTER_PORT", {helper(sc, "_rendezvous_port", RENDEZVOUS_PORT)}())']


# The port where the launch environment names none. On one host (plain `python train.py`: no
# torchrun, no MASTER_PORT, not a pod) a port free now: a fixed one may be held by another job on
# a shared host (EADDRINUSE), and torch_xla's spawn needed none. The processes that meet there
# are this process and the workers it starts, which inherit its choice. Where processes of
# several hosts (NNODES, which set_tpu_launch_env sets on a multi-host slice, with MASTER_PORT)
# or of another launcher (WORLD_SIZE) must meet, each picks alone, so they must agree on a fixed
# one: torch's default, 29500.
RENDEZVOUS_PORT = '''def {name}():
    """MASTER_PORT where the launch environment names none (added by tpu-migrate): on one host a
    port free now (a fixed one may be another job's); 29500 where the processes of several hosts
    (NNODES) or of another launcher (WORLD_SIZE) must agree on it."""
    if int({os}.environ.get("NNODES", 1)) > 1 or int({os}.environ.get("WORLD_SIZE", 1)) > 1:
        return "29500"
    with {socket}.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])
'''


@emits("TPU060")
def _arguments_evaluated_once(fn: str, args: cst.BaseExpression | None, worker: str,
                              sc: StatementContext, rule, where) -> str | None:
    """The worker to start under torchrun with xmp.spawn's `args` evaluated once per host (code),
    or None where fn and its arguments stay as they are. xmp.spawn
    evaluated them in the launching process and handed the values to every worker; under
    torchrun every worker runs this line, and a value that may differ between processes
    (`tempfile.mkdtemp()`, the time, a random draw: process_values.py) would. Where the wrapper
    makes the group, each host's first process evaluates them and the others receive its values
    (`_host_arguments`); where the worker makes its own group, nothing can carry them before fn
    runs: marked on the line. Arguments the same in every process stay as they are."""
    call = sc.info.node.value if isinstance(sc.info.node, ast.Expr) else None
    given = _ast_args(call) if isinstance(call, ast.Call) else None
    varying = varying_parts(given, sc.info, sc.file.analysis) if given is not None else []
    if not varying:
        return None
    shown = ", ".join(f"`{part}`" for part in varying)
    if sc.file.plans.other_inits or worker in sc.file.plans.self_initializing:
        sc.needs_manual(rule.code, f"under torchrun every process evaluates {shown}, which xmp.spawn "
                        "evaluated once, in the launching process of each host: the workers get values of "
                        "their own; compute them in one process and share them once the worker's group "
                        "exists (dist.broadcast_object_list)", where=where, anchor='["LOCAL_RANK"]), ')
        return None
    if isinstance(args, cst.Tuple) and all(isinstance(e, cst.Element) for e in args.elements):
        items = [code(e.value) for e in args.elements]
    else:
        items = [f"*{atom(args)}"]
    values = "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    return f"{helper(sc, '_host_arguments', HOST_ARGUMENTS)}({fn}, lambda: {values})"


def _ast_args(call: ast.Call) -> ast.expr | None:
    """xmp.spawn's `args` (keyword or second positional), or None."""
    keyword = next((k.value for k in call.keywords if k.arg == "args"), None)
    return keyword if keyword is not None else (call.args[1] if len(call.args) > 1 else None)


# xmp.spawn's arguments under torchrun, as the launching process of each host evaluated them:
# its first process (LOCAL_RANK 0) evaluates them, once the wrapper made the group, and every
# process takes its host's (torchrun numbers each host's processes after the previous host's).
HOST_ARGUMENTS = '''def {name}(fn, arguments):
    """fn with xmp.spawn's arguments as each host's launching process evaluated them (added by
    tpu-migrate): under torchrun every process runs the launch, so the first process of each host
    calls arguments() and the others receive its values (a temporary directory, a time, a random
    draw: one per host, as xmp.spawn's workers got)."""
    def launched(index):
        local_rank = int({os}.environ["LOCAL_RANK"])
        values = [None] * {dist}.get_world_size()
        {dist}.all_gather_object(values, arguments() if local_rank == 0 else None)
        return fn(index, *values[{dist}.get_rank() - local_rank])
    return launched
'''


def _spread(args: cst.BaseExpression | None) -> str:
    """`, a, b` for `args=(a, b)`; `, *args` for anything else."""
    if args is None:
        return ""
    if isinstance(args, cst.Tuple) and all(isinstance(e, cst.Element) for e in args.elements):
        return "".join(f", {code(e.value)}" for e in args.elements)
    return f", *{atom(args)}"


def _indent(lines: list[str]) -> list[str]:
    return ["    " + line for block in lines for line in block.split("\n")]


def _single_process(bound: dict, launch: bool) -> str | None:
    """"always", a condition (code) under which torch_xla ran the worker in this process, or
    None when it always spawned."""
    if launch:
        arg = bound.get("debug_single_process")
        if arg is None:
            return None
        literal = literal_bool(arg, False)
        if literal is not None:
            return "always" if literal else None
        return code(arg.value.with_changes(lpar=[], rpar=[]))
    nprocs = bound.get("nprocs")
    if nprocs is not None and isinstance(nprocs.value, cst.Integer) and nprocs.value.evaluated_value == 1:
        return "always"
    return None


def _unsupported_nprocs(bound: dict, sc: StatementContext, rule, where) -> None:
    """torch_xla 2.x's xmp.spawn took nprocs=1 (fn ran in this process) or None (every device)
    and raised ValueError for any other count (`_internal/pjrt.py` spawn); the conversion starts
    that many processes: marked, since the original program never ran so."""
    nprocs = bound.get("nprocs")
    if nprocs is None or (isinstance(nprocs.value, cst.Name) and nprocs.value.value == "None"):
        return
    if isinstance(nprocs.value, cst.Integer):
        count = nprocs.value.evaluated_value
        if count == 1:
            return
        sc.needs_manual(
            rule.code,
            f"torch_xla 2.x raised ValueError for nprocs={nprocs.value.value} (xmp.spawn accepted "
            f"only 1 or None, every device); the migrated program now starts {nprocs.value.value} "
            "processes: check that this is what you want",
            where=where,
        )
        return
    sc.needs_manual(
        rule.code,
        f"torch_xla 2.x raised ValueError unless nprocs ({code(nprocs.value)}) was 1 (fn ran in "
        "this process) or None (every device); the migrated program starts that many processes "
        "(one for 1): check the counts you pass",
        where=where,
    )


def _process_count(bound: dict, sc: StatementContext) -> str:
    every_device = sc.file.import_plan.fill(
        "{torch}.accelerator.device_count()"
        if sc.file.target == "tpu"
        else "max({torch}.accelerator.device_count(), 1)"
    )
    nprocs = bound.get("nprocs")
    if nprocs is None or (isinstance(nprocs.value, cst.Name) and nprocs.value.value == "None"):
        return every_device
    if isinstance(nprocs.value, cst.Integer):
        return nprocs.value.value
    return f"{atom(nprocs.value)} or {every_device}"  # xmp.spawn took None: every device


def _launch_env(count: str, sc: StatementContext) -> list[str]:
    """TorchTPU's launch variables, computed once in the parent (a no-op off TPU hosts for
    the portable target, which tests for a TPU first)."""
    plan = sc.file.import_plan
    call = plan.fill("{torch}.tpu.distributed.set_tpu_launch_env") + f"(nproc_per_node={count})"
    if sc.file.target == "tpu":
        return [call]
    test = plan.fill(
        '{torch}.accelerator.is_available() and {torch}.accelerator.current_accelerator().type == "tpu"'
    )
    return [f"if {test}:\n    {call}"]


def _forked(bound: dict) -> bool:
    method = bound.get("start_method")
    return method is not None and isinstance(method.value, cst.SimpleString) and method.value.evaluated_value == "fork"


def _what_spawn_loses(sc: StatementContext, worker: str, wrapper: str) -> list[str]:
    """What a forked worker had from its parent and a spawned one, which starts a new
    interpreter and imports the file, does not have."""
    if sc.file.notebook:
        # The spawned interpreter cannot import a notebook: nothing its cells define exists there.
        return [f"a spawned worker cannot import what a notebook defines (`{worker}`, `{wrapper}`); "
                f"move them into a .py module and import them here"]
    problems = []
    # A module-level launch outside the guard runs again in each worker's import. (Inside a
    # function, the call that reaches it is usually guarded: not judged.)
    if sc.scope.kind == "module" and not sc.file.plans.under_main_guard(sc.info.node):
        problems.append("each worker re-runs this module on import; put the launch under "
                        "`if __name__ == \"__main__\":`")
    missing = main_guard_only(sc.file.analysis, worker)
    if missing:
        names = ", ".join(f"`{name}` (" + (f"read by `{reader}`" if reader else "the worker") + ")"
                          for name, reader in missing)
        problems.append(f"a spawned worker imports this file without running `if __name__ == \"__main__\":`, "
                        f"the only block that binds {names}; bind {'it' if len(missing) == 1 else 'them'} "
                        f"at module level (a value can also reach the worker through `args`)")
    return problems


def insert_at_body_start(stmt, new: list[cst.BaseStatement]):
    body = stmt.body
    if isinstance(body, cst.SimpleStatementSuite):
        body = cst.IndentedBlock(
            body=[cst.SimpleStatementLine(body=body.body, trailing_whitespace=body.trailing_whitespace)]
        )
    statements = list(body.body)
    index = 0
    if isinstance(stmt, cst.FunctionDef) and statements:
        first = statements[0]
        if (
            isinstance(first, cst.SimpleStatementLine)
            and isinstance(first.body[0], cst.Expr)
            and isinstance(first.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
        ):
            index = 1
    return stmt.with_changes(body=body.with_changes(body=[*statements[:index], *new, *statements[index:]]))
