"""What `verify` records inside each process of the program: per optimizer step, the losses
passed to `backward()` since the previous step, the learning rates, the squared norm of the
gradients the optimizer steps with (read just before the step) and a checksum of the
parameters (just after it).

Installed by the sitecustomize that `verify` puts on PYTHONPATH (runs.py), so every Python
process of the program records: xmp.spawn's and torchrun's workers as well. The hooks go in
when the program has imported torch (diagnose's after_import), and each process appends JSON
lines to a file of its own in $TPU_MIGRATE_VERIFY_DIR, one per optimizer step, before the step
returns (a process that dies later keeps what it recorded).

Each process also keeps what it prints on stdout (`stdout-*.txt`, named by its start time,
pid and launcher rank; printed.py compares the numbers in it), and a process that passed losses
to `backward()` but never stepped an optimizer (a hand-written update, a loop without an
optimizer) records them at exit, one per call, to be compared call by call.

In the original's first run ($TPU_MIGRATE_VERIFY_WRITES=1), each process notes the first files
it opens for writing (`writes-*`: Python's opens, audited, and torch.save's paths; not its
temporary files, nor what the recorder and the import system write): verify runs the rest at
once only for a program that writes none, which cannot overwrite what another run reads
(schedule.py). The other runs' writes are never read: their processes have no audit hook (one
cannot be removed, and it is called on every audited event).

Where the program does not seed torch's and Python's generators itself, they start from 0 in
every process of every run, and torch uses its deterministic algorithms: an unseeded program is
deterministic too (its own settings still win).

FSDP2 shards parameters and gradients (DTensors): their local shards' sums are recorded apart
(`*_sharded`), to be added over the ranks; the other tensors are whole in every rank.
Under torch_xla the recorder never syncs: reading a value there would execute the graph
(three executions a step where the program did one: that tripled the run's time). The values are
built as tensors of the program's own graph (the losses are kept), which the program's own sync
computes with the step (`xm.mark_step`, `torch_xla.sync`, MpDeviceLoader's, the end of a
`torch_xla.compile` region); a step closure then reads them (`xm.add_step_closure`: transfers of
values already computed, no execution). A program that never syncs has them read at its next
step once computed, at exit, or after BACKLOG steps, whichever comes first (that read executes
a graph of its own). So recording never changes what the program can do: inside
`torch_xla.compile(full_graph=True)`, which fails on any execution, nothing is read. On the
TorchTPU stand-in (a `tpu` device whose tensors the CPU computes) the values are read from copies
(`.cpu()`, one per tensor, as a TPU would transfer them), never the program's tensors; on the CPU
they are read as they are.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time

ENV_DIR = "TPU_MIGRATE_VERIFY_DIR"
ENV_WRITES = "TPU_MIGRATE_VERIFY_WRITES"  # "1": note the files written (the original's first run only)

_losses: list = []
_steps: dict[int, int] = {}  # id(optimizer) -> its last step's index, in order of first step
_pending: dict[int, tuple] = {}  # id(optimizer) -> its gradients' squared norm (tensors, in a region)
_deferred: list = []  # (path, record with tensors): built lazily (torch_xla), read once computed
_closure = [False]  # whether a step closure that reads them waits for the program's next sync
BACKLOG = 16  # records kept unread at most, in a program that never syncs: then read (an execution)
_region = [0]  # how deep the program is in torch_xla.compile regions
_unread = [0]  # records that could not be read at the end of their region
_autocast: set = set()  # the dtypes of the autocast regions entered since the previous step
_device_rng: list = []  # the program's lines that drew from torch_xla's device generator (the first few)


def install() -> None:
    directory = os.environ.get(ENV_DIR)
    if directory:
        from tpu_migrate.diagnose.import_hooks import after_import

        rank = os.environ.get("RANK", "-")  # a launcher's worker; "-": no launcher (or the launcher)
        sys.stdout = _Tee(sys.stdout, os.path.join(directory, f"stdout-{time.time_ns()}-{os.getpid()}-{rank}.txt"))
        after_import("torch_xla.core.xla_model", lambda: _record_reductions(
            os.path.join(directory, f"reduced-{os.getpid()}.jsonl")))
        import random

        random.seed(0)
        if os.environ.get(ENV_WRITES) == "1":
            _watch_writes(directory)
        after_import("torch", lambda: _hook(os.path.join(directory, f"steps-{os.getpid()}.jsonl")))


WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
NOT_WRITES = (os.sep + "__pycache__" + os.sep, "/dev/", "/proc/", "/sys/")
_writes: list = []  # the first files the program opened for writing
_temporary: list = []  # the folders tempfile.mkdtemp made for it (names of their own, never shared)


def _watch_writes(directory: str) -> None:
    """An audit hook noting (`writes-PID` in the directory) the first few files the program opens
    for writing: open() and os.open(), which the libraries' Python writers go through; torch.save's
    C++ writer is noted by _watch_save. Not: the recorder's own files, the import system's
    bytecode, devices, files created exclusively (O_EXCL: tempfile's names, unique) or with no
    name (O_TMPFILE: tempfile's anonymous files), and files in the folders tempfile.mkdtemp made
    (torch writes one at import). An audit hook cannot be removed: past the first few writes it
    returns at once."""
    import functools
    import tempfile

    mine = _own_folder(directory)
    noted = os.path.join(directory, f"writes-{os.getpid()}")
    mkdtemp = tempfile.mkdtemp

    @functools.wraps(mkdtemp)
    def made(*args, **kwargs):
        folder = mkdtemp(*args, **kwargs)
        if len(_temporary) < 1000:
            _temporary.append(os.path.abspath(os.fsdecode(folder)) + os.sep)
        return folder

    tempfile.mkdtemp = made

    def hook(event, args):
        if event != "open" or len(_writes) >= 3:
            return
        try:
            path, mode, flags = args
            if isinstance(path, int) or not (flags & WRITE_FLAGS or any(c in (mode or "") for c in "wax+")):
                return
            if flags & (os.O_EXCL | getattr(os, "O_TMPFILE", 0)) or "x" in (mode or ""):
                return  # a name of its own (tempfile's), or none (an anonymous file)
            _note_write(os.fsdecode(path), mine, noted)
        except Exception:  # noqa: BLE001 (never the program's failure)
            pass

    sys.addaudithook(hook)


def _own_folder(directory: str) -> tuple[str, ...]:
    """The recorder's own folder as the program's paths may name it: as given (what `noted` and
    the recorder's files are opened by) and with its links resolved. _note_write compares
    absolute paths without resolving them (a realpath per write-mode open would cost each one)."""
    return tuple(dict.fromkeys((os.path.abspath(directory) + os.sep, os.path.realpath(directory) + os.sep)))


def _note_write(path: str, mine: tuple[str, ...], noted: str) -> None:
    full = os.path.abspath(path)
    if full.startswith((*mine, *_temporary)) or any(part in full for part in NOT_WRITES) or full in _writes \
            or os.path.isdir(full):  # tempfile's files open their folder (an opener makes the file)
        return
    _writes.append(full)
    with open(noted, "a", encoding="utf-8") as handle:  # in `mine`: not noted again
        handle.write(full + "\n")


class _Tee:
    """sys.stdout, also written to a file as it is printed (unbuffered: a process that dies
    keeps what it printed). A forked child (a DataLoader worker) prints to the terminal only.
    Beside it (`.once`), a character per line: "1" where the code that printed it did so for one
    process of the world only (guards.py), else "0"; and (`.derived`, JSON lines) the lines that
    print a value computed from reduced ones, with their parts (reductions.py)."""

    def __init__(self, stream, path: str):
        self._stream = stream
        self._pid = os.getpid()
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._once_fd = os.open(path[:-len(".txt")] + ".once", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._once = None  # the line being printed: whether it is printed once (at its first write)
        self._derived = False  # and what of it a reduction computed (reductions.printed_parts)
        self._derived_path = path[:-len(".txt")] + ".derived"
        self._lines = 0  # lines printed so far

    def write(self, text):
        written = self._stream.write(text)
        if os.getpid() == self._pid and isinstance(text, str):
            os.write(self._fd, text.encode("utf-8", "replace"))
            if text:
                self._note_lines(text)
        return written

    def _note_lines(self, text: str) -> None:
        if self._once is None:
            self._once = _printed_once(sys._getframe(2))
            self._derived = _printed_derived(sys._getframe(2))
        ends = text.count("\n")
        if ends:
            os.write(self._once_fd, (("1" if self._once else "0") * ends).encode())
            if self._derived is not False:
                with open(self._derived_path, "a", encoding="utf-8") as handle:
                    handle.writelines(json.dumps({"line": self._lines + k, "parts": self._derived}) + "\n"
                                      for k in range(ends))
            self._lines += ends
            # What follows the last newline starts a line printed by the same code.
            self._once = self._once if not text.endswith("\n") else None

    def writelines(self, texts):
        for text in texts:
            self.write(text)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _printed_once(frame) -> bool:
    try:
        from tpu_migrate.diagnose.recording import is_library
        from tpu_migrate.verify.guards import printed_once

        return printed_once(frame, is_library)
    except Exception:  # noqa: BLE001 (never the program's failure: counted as every process's)
        return False


def _printed_derived(frame):
    try:
        from tpu_migrate.diagnose.recording import is_library
        from tpu_migrate.verify.reductions import printed_parts

        return printed_parts(frame, is_library)
    except Exception:  # noqa: BLE001 (never the program's failure: nothing reduced)
        return False


def _record_reductions(path: str) -> None:
    """xm.mesh_reduce and xm.all_reduce, their results noted (the scalar ones), in the original: a
    number it prints that one of them returned was reduced over the processes (printed.py). A
    tensor's value is read at exit, never when the program did not read it."""
    import functools

    xm = sys.modules.get("torch_xla.core.xla_model")
    kept: list = []

    def noting(function):
        if function is None or getattr(function, "_tpu_migrate_verify", False):
            return function

        @functools.wraps(function)
        def reduction(*args, **kwargs):
            result = function(*args, **kwargs)
            if len(kept) < 10000:
                if isinstance(result, (int, float)) or type(result).__module__ == "numpy":
                    kept.append(result)
                elif getattr(result, "numel", None) is not None and result.numel() == 1:
                    kept.append(result.detach())
            return result

        reduction._tpu_migrate_verify = True
        return reduction

    def write():
        values = []
        for value in kept:
            try:
                values.append(float(value.cpu()) if hasattr(value, "cpu") else float(value))  # a transfer, no op
            except Exception:  # noqa: BLE001 (a value that cannot be read: left out)
                continue
        if values:
            _write(path, {"reduced": values})

    xm.mesh_reduce = noting(getattr(xm, "mesh_reduce", None))
    xm.all_reduce = noting(getattr(xm, "all_reduce", None))
    atexit.register(write)


def _hook(path: str) -> None:
    import torch

    from tpu_migrate.diagnose.import_hooks import after_import
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    backward = torch.Tensor.backward

    def recording_backward(self, *args, **kwargs):
        if self.numel() == 1:  # a loss (a tensor's backward needs a gradient argument)
            _losses.append(self.detach())
        return backward(self, *args, **kwargs)

    torch.Tensor.backward = recording_backward
    if os.environ.get(ENV_WRITES) == "1":
        _watch_save(torch, os.path.dirname(path))
    _watch_autocast(torch)
    # torch_xla's processes only (the original's): no other draws from its device generator.
    after_import("torch_xla.torch_xla", lambda: (_wrap_xla_compile(), _watch_device_rng(torch)))
    after_import("torch.distributed.distributed_c10d", lambda: _mark_process_groups(os.path.dirname(path)))
    register_optimizer_step_pre_hook(_before_step)
    register_optimizer_step_post_hook(lambda optimizer, args, kwargs: _after_step(optimizer, path))
    atexit.register(_backward_only, path)
    atexit.register(_flush)  # registered last, run first: a region's records not read yet
    # Before the program's code, which may set its own: its seed replaces this one, and its
    # use_deterministic_algorithms(False) this choice (warn_only: an op without a deterministic
    # kernel warns instead of failing the run).
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True, warn_only=True)


# Where each draws its device from: a factory's `device=`, else its first argument's (a tensor).
RANDOM_FACTORIES = ("randn", "rand", "randint", "randperm")
RANDOM_OF_A_TENSOR = ("randn_like", "rand_like", "randint_like", "normal", "bernoulli", "multinomial",
                      "poisson")
RANDOM_IN_PLACE = ("normal_", "uniform_", "bernoulli_", "random_", "exponential_", "cauchy_", "log_normal_",
                   "geometric_")
# torch.nn.functional's dropouts call these (torch._VF): patched there, F's own functions stay
# what TorchScript compiles from their source.
RANDOM_DROPOUT = ("dropout", "dropout_", "feature_dropout", "feature_dropout_", "alpha_dropout", "alpha_dropout_",
                  "feature_alpha_dropout", "feature_alpha_dropout_")


def _watch_save(torch, directory: str) -> None:
    """torch.save, noting the path it writes (its C++ writer opens it unaudited)."""
    import functools

    original = torch.save
    if getattr(original, "_tpu_migrate_verify", False):
        return
    mine = _own_folder(directory)
    noted = os.path.join(directory, f"writes-{os.getpid()}")

    @functools.wraps(original)
    def save(obj, f, *args, **kwargs):
        if isinstance(f, (str, bytes, os.PathLike)) and len(_writes) < 3:
            try:
                _note_write(os.fsdecode(f), mine, noted)
            except Exception:  # noqa: BLE001 (never the program's failure)
                pass
        return original(obj, f, *args, **kwargs)

    save._tpu_migrate_verify = True
    torch.save = save


def _watch_autocast(torch) -> None:
    """torch.set_autocast_dtype, noting the dtype of each autocast region the program enters
    (torch.autocast's and torch_xla.amp.autocast's __enter__ both call it, after enabling the
    region): per step, what the program computed in (compare.py's rounding of that dtype)."""
    import functools

    original = getattr(torch, "set_autocast_dtype", None)
    if original is None:
        return

    @functools.wraps(original)
    def set_autocast_dtype(device_type, dtype, *args, **kwargs):
        try:
            if torch.is_autocast_enabled(device_type):
                _autocast.add(str(dtype).removeprefix("torch."))
        except Exception:  # noqa: BLE001 (a device type autocast does not know: nothing noted)
            pass
        return original(device_type, dtype, *args, **kwargs)

    torch.set_autocast_dtype = set_autocast_dtype


def _watch_device_rng(torch) -> None:
    """torch's random functions, noting the program's line where one draws on torch_xla's device
    (`device=` an xla device, a tensor on it): the original's device generator, which no other
    device's can reproduce (compare.py says so where the runs differ). Only these calls pay;
    TorchScript still compiles them (registered as the builtins they wrap)."""
    import functools

    def on_xla(device) -> bool:
        return device is not None and str(getattr(device, "type", device)).startswith("xla")

    def watched(function, device_of):
        if function is None or getattr(function, "_tpu_migrate_verify", False):
            return function

        @functools.wraps(function)
        def draw(*args, **kwargs):
            if len(_device_rng) < 3:
                try:
                    if on_xla(device_of(args, kwargs)):
                        where = _caller()
                        if where not in _device_rng:
                            _device_rng.append(where)
                except Exception:  # noqa: BLE001 (never the program's failure)
                    pass
            return function(*args, **kwargs)

        draw._tpu_migrate_verify = True
        try:  # TorchScript knows torch's own functions by identity: the wrapper compiles as they do
            from torch.jit._builtins import _find_builtin, _register_builtin

            if _find_builtin(function) is not None:
                _register_builtin(draw, _find_builtin(function))
        except Exception:  # noqa: BLE001 (an older torch: scripted code calls the original)
            pass
        return draw

    def factory(args, kwargs):
        return kwargs.get("device")

    def of_tensor(args, kwargs):
        first = args[0] if args else kwargs.get("input", kwargs.get("mean"))
        return getattr(first, "device", None) or kwargs.get("device")

    def dropout(args, kwargs):  # (input, p, train)
        training = kwargs.get("train", args[2] if len(args) > 2 else True)
        return of_tensor(args, kwargs) if training else None

    for names, module, device_of in ((RANDOM_FACTORIES, torch, factory), (RANDOM_OF_A_TENSOR, torch, of_tensor),
                                     (RANDOM_IN_PLACE, torch.Tensor, of_tensor), (RANDOM_DROPOUT, torch._VF, dropout)):
        for name in names:
            if getattr(module, name, None) is not None:
                setattr(module, name, watched(getattr(module, name), device_of))


def _precision(optimizer) -> dict:
    """What the step computed in: the autocast dtypes entered since the previous step, and the
    parameters' dtypes (a model cast to bfloat16)."""
    params = sorted({str(p.dtype).removeprefix("torch.") for p in _params(optimizer)})
    return {"autocast": sorted(_autocast), "param_dtypes": params}


def _backward_only(path: str) -> None:
    """At exit, in a process that never stepped an optimizer: the losses of its backward() calls."""
    if _steps or not _losses:
        return
    rank, world = _rank_and_world()
    record = {"backward": [float(loss.cpu()) for loss in _losses], "rank": rank, "world": world}
    if _device_rng:
        record["device_rng"] = list(_device_rng)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")


def _params(optimizer) -> list:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _sums(tensors, power: int, deferred: bool) -> tuple:
    """(sum over the whole tensors, sum over the DTensor shards this rank holds) of each
    element to `power`, in float64 (the parameters' sum cancels: float32 would round it to about
    the default --rtol on a large model).
    `deferred` (torch_xla's lazy tensors): the sums as tensors of the program's graph, read by
    _read later: one concatenation per device and dtype, cast and summed as one, so that the
    compiled graph gets one reduction more per sum, not one per tensor (whose kernels its
    compilations paid for: MNIST's graphs had 34 fusions more, now 10).
    Else one device read for each, per device the tensors are on (a model split between the host
    and a device: tensors of two devices do not stack). Tensors of another device (the stand-in's
    `tpu`) are copied to the CPU first: one transfer each, then the CPU computes (not an op of
    that device per step and tensor)."""
    import torch

    whole, sharded = {}, {}
    for tensor in tensors:
        is_shard = hasattr(tensor, "placements") and hasattr(tensor, "to_local")
        local = (tensor.to_local() if is_shard else tensor).detach()
        if deferred:
            (sharded if is_shard else whole).setdefault((local.device, local.dtype), []).append(local.reshape(-1))
            continue
        if local.device.type != "cpu":
            local = local.cpu()
        local = local.to(torch.float64)
        (sharded if is_shard else whole).setdefault(local.device, []).append(
            (local if power == 1 else local.pow(power)).sum())
    if deferred:
        return tuple([_power_sum(torch.cat(flat).to(torch.float64), power) for flat in part.values()]
                     for part in (whole, sharded))
    return tuple(sum((float(torch.stack(sums).sum().cpu()) for sums in part.values()), 0.0)
                 for part in (whole, sharded))


def _power_sum(flat, power: int):
    """The sum of `flat`'s elements to `power` (a square as a product: one fused multiply)."""
    return (flat if power == 1 else flat * flat if power == 2 else flat.pow(power)).sum()


def _read(value):
    """A value _sums or _after_step kept as tensors, read now."""
    if isinstance(value, list):
        return sum((float(tensor.cpu()) for tensor in value), 0.0)
    return value


def _lazy(tensors) -> bool:
    """Whether these are torch_xla's tensors, whose values only a graph execution computes."""
    return any(getattr(tensor.device, "type", None) == "xla" for tensor in tensors)


def _computed(record: dict) -> bool:
    """Whether every torch_xla tensor a kept record holds is computed (device data): reading it is
    a transfer, not an execution."""
    tensors = [value for key in ("grad_sq", "grad_sq_sharded", "param_sum", "param_sum_sharded")
               if isinstance(record[key], list) for value in record[key]]
    tensors += [value for value in (*record["losses"], *record["lr"]) if hasattr(value, "device")]
    xla = sys.modules.get("torch_xla")
    check = getattr(getattr(xla, "_XLAC", None), "_check_tensor_need_materialization", None)
    tensors = [tensor for tensor in tensors if getattr(tensor.device, "type", None) == "xla"]
    if not tensors or check is None:
        return True
    try:
        return not any(check(tensors))
    except Exception:  # noqa: BLE001 (cannot tell: read it, as before)
        return True


def _after_sync() -> None:
    """A step closure at the program's next sync (torch_xla), which reads the kept records then:
    its graph has computed them."""
    if _closure[0]:
        return
    xm = sys.modules.get("torch_xla.core.xla_model")
    if xm is None or not hasattr(xm, "add_step_closure"):
        return

    def closure():
        _closure[0] = False
        try:
            _flush(computed_only=True)
        except Exception:  # noqa: BLE001 (never the program's failure: read at the next step or at exit)
            pass

    try:
        xm.add_step_closure(closure)
        _closure[0] = True
    except Exception:  # noqa: BLE001 (read at the next step or at exit)
        pass


def _in_region() -> bool:
    """Whether the program runs inside a torch_xla.compile region, where a device read would cut
    the graph (its full_graph=True fails on any execution). A function torch.compile traces
    (dynamo) is not one: there a read is a graph break, and the rest of the step runs eagerly."""
    if _region[0]:
        return True
    xla = sys.modules.get("torch_xla")
    if xla is not None and hasattr(getattr(xla, "_XLAC", None), "_get_allow_execution"):
        try:
            if not xla._XLAC._get_allow_execution():
                return True
        except Exception:  # noqa: BLE001 (an older torch_xla: no such state)
            pass
    return False


def _flush(computed_only: bool = False) -> None:
    """Read and write the kept records, in order (at the end of a region, at exit; with
    `computed_only`, those the program's own sync computed, up to the first it did not)."""
    while _deferred:
        path, record = _deferred[0]
        if computed_only and not _computed(record):
            return
        _deferred.pop(0)
        try:
            for key in ("grad_sq", "grad_sq_sharded", "param_sum", "param_sum_sharded"):
                record[key] = _read(record[key])
            record["losses"] = [float(loss.cpu()) for loss in record["losses"]]
            record["lr"] = [float(lr) for lr in record["lr"]]
        except Exception:  # noqa: BLE001 (never the program's failure: the step is said unread)
            _unread[0] += 1
            continue
        _write(path, record)


def _write(path: str, record: dict) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")


def _wrap_xla_compile() -> None:
    """torch_xla.compile, marking its region: what a step records in it is read at its end (after
    the region's own sync), never in it. Patched in torch_xla.torch_xla before torch_xla's
    __init__ binds its names (`from .torch_xla import *`)."""
    import functools

    module = sys.modules.get("torch_xla.torch_xla")
    original = getattr(module, "compile", None)
    if original is None or getattr(original, "_tpu_migrate_verify", False):
        return

    def region(call):
        @functools.wraps(call)
        def run(*args, **kwargs):
            _region[0] += 1
            try:
                return call(*args, **kwargs)
            finally:
                _region[0] -= 1
                if not _region[0]:
                    _flush()
        return run

    class Region:
        """torch_xla.compile()'s context manager (also a decorator), its region marked."""

        def __init__(self, manager):
            self._manager = manager

        def __enter__(self):
            _region[0] += 1
            try:
                return self._manager.__enter__()
            except BaseException:
                _region[0] -= 1
                raise

        def __exit__(self, *exc):
            try:
                return self._manager.__exit__(*exc)
            finally:
                _region[0] -= 1
                if not _region[0]:
                    _flush()

        def __call__(self, function):
            return region(self._manager(function))

        def __getattr__(self, name):
            return getattr(self._manager, name)

    @functools.wraps(original)
    def compile(f=None, *args, **kwargs):
        compiled = original(f, *args, **kwargs)
        return Region(compiled) if f is None else region(compiled)

    compile._tpu_migrate_verify = True
    module.compile = compile
    xla = sys.modules.get("torch_xla")
    if xla is not None and getattr(xla, "compile", None) is original:
        xla.compile = compile


def _before_step(optimizer, args, kwargs) -> None:
    region = _in_region()
    if _deferred and not region:
        _flush(computed_only=len(_deferred) < BACKLOG)
    params = _params(optimizer)
    _pending[id(optimizer)] = _sums([p.grad for p in params if p.grad is not None], 2, region or _lazy(params))


def _caller() -> str | None:
    """The program's line that stepped the optimizer (past torch's, libraries' and the tool's
    frames: xm.optimizer_step's caller), as `file:line: code`."""
    import linecache

    from tpu_migrate.diagnose.recording import user_frame

    filename, line = user_frame(2)
    if filename is None:
        return None
    return f"{os.path.basename(filename)}:{line}: {linecache.getline(filename, line).strip()}"


def _after_step(optimizer, path: str) -> None:
    key = id(optimizer)
    _steps[key] = _steps.get(key, -1) + 1
    grad_sq, grad_sq_sharded = _pending.pop(key, (0.0, 0.0))
    params = _params(optimizer)
    region = _in_region()
    deferred = region or _lazy(params)
    param_sum, param_sum_sharded = _sums(params, 1, deferred)
    losses = list(_losses) if deferred else [float(loss.cpu()) for loss in _losses]
    _losses.clear()
    rank, world = _rank_and_world()
    record = {"optimizer": list(_steps).index(key), "step": _steps[key], "rank": rank, "world": world,
              "losses": losses, "lr": [_lr(group, deferred) for group in optimizer.param_groups], "grad_sq": grad_sq, "grad_sq_sharded": grad_sq_sharded,
              "param_sum": param_sum, "param_sum_sharded": param_sum_sharded, "where": _caller(),
              **_precision(optimizer)}
    _autocast.clear()
    if _device_rng:
        record["device_rng"] = list(_device_rng)
    if deferred:
        _deferred.append((path, record))
        if not region:
            _after_sync()
    else:
        _write(path, record)


def _mark_process_groups(directory: str) -> None:
    """init_process_group, noting that the program made one (`group-PID` in the directory): a
    program that made none and started no other process is single-process (verify's N-process
    runs do not apply to it)."""
    import functools

    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    original = getattr(c10d, "init_process_group", None)
    if original is None or getattr(original, "_tpu_migrate_verify", False):
        return

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        try:
            open(os.path.join(directory, f"group-{os.getpid()}"), "a").close()
        except OSError:
            pass
        return original(*args, **kwargs)

    init_process_group._tpu_migrate_verify = True
    c10d.init_process_group = init_process_group
    dist = sys.modules.get("torch.distributed")
    if dist is not None and getattr(dist, "init_process_group", None) is original:
        dist.init_process_group = init_process_group


def _lr(group: dict, deferred: bool):
    """A parameter group's learning rate; a tensor one kept unread inside a region."""
    lr = group.get("lr", 0.0)
    return lr if deferred and hasattr(lr, "cpu") else float(lr)


def _rank_and_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
