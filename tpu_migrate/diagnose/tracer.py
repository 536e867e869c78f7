"""The in-process half of `diagnose`: install() starts recording in the traced program (and its
workers, through the sitecustomize runner.py writes) and picks the backend's hooks.

Hooks are installed when the program imports torch_xla (xla_hooks.py) or torch (native.py), by
a meta-path finder, never before: the program's own environment set-up (PJRT_DEVICE, ...) must
run first. On the TorchTPU stand-in, the tracer loads the stand-in right after `import torch`
(as the stand-in's sitecustomize does too), then the hooks, which see the `tpu` device and its
reports. The recorder (recording.py) writes the events (events.py).
"""

from __future__ import annotations

import atexit
import functools
import os
import sys

from tpu_migrate.diagnose import inheritance, recording, xla_hooks
from tpu_migrate.diagnose.import_hooks import after_import
from tpu_migrate.diagnose.events import BackendEvent, Kind, RankEvent
from tpu_migrate.diagnose.recording import ENV_BACKEND, ENV_DIR


def _safely(what: str, install_hooks) -> None:
    """The tracer must never break the program it diagnoses: a failure is one line on stderr."""
    try:
        install_hooks()
    except Exception as exc:  # noqa: BLE001
        sys.stderr.write(f"tpu-migrate diagnose: {what} tracing disabled: {type(exc).__name__}: {exc}\n")


# native.py is imported only when a backend needs it: every Python process of the program,
# torch or not, runs install().


def install_xla() -> None:
    from tpu_migrate.diagnose import native

    native.uninstall()  # auto backend: the program uses torch_xla after all
    _safely("torch_xla", xla_hooks.install_torch_xla_hooks)
    emit_xla_backend(recording.RECORDER)


def _install_xla_if_the_program_imports_it() -> None:
    """auto: torch_xla imported by the program's own code hands over to the xla backend; imported
    by a library because it is installed (Diffusers imports it and calls xm.mark_step wherever it
    can), the program still computes with torch: it stays native."""
    if _importer_is_library():
        return
    install_xla()


def _importer_is_library() -> bool:
    """Whether the frame that ran the `import` under way is a library's (site-packages, torch, the
    standard library), past the import machinery and the tool's own frames."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not (filename.startswith("<frozen importlib") or _TOOL_DIR in filename):
            return recording.is_library(filename)
        frame = frame.f_back
    return False


_TOOL_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "")


def emit_xla_backend(recorder: recording.Recorder) -> None:
    recorder.emit(BackendEvent(kind=Kind.BACKEND, op="xla", file=None, line=None, started=recorder.started))


def _install_native() -> None:
    from tpu_migrate.diagnose import native

    if "torch_xla" not in sys.modules:
        _safely("native", lambda: native.install(recording.RECORDER))


def _install_standin() -> None:
    """Right after `import torch`: the stand-in, loaded as its own sitecustomize loads it (once:
    whichever of the two import hooks runs first loads it), then the hooks, which must see the
    `tpu` device. A stand-in that cannot load (another torch) fails `import torch` with its
    message, as under `tpu-migrate run`."""
    import torch_tpu._loader

    torch_tpu._loader.load()
    from tpu_migrate.diagnose import native

    _safely("standin", lambda: native.install(recording.RECORDER, standin=True))


def dynamo_imported() -> None:
    from tpu_migrate.diagnose import native

    _safely("torch.compile", native.dynamo_imported)


def _spawn_rank_hook() -> None:
    """torch.multiprocessing.spawn starts each worker through `_wrap(fn, i, ...)`: `i` is the
    worker's rank, which a report must show even for a worker that never ends by itself. The
    module attribute is replaced, which the spawn start method's pickled target resolves to."""
    import torch.multiprocessing.spawn as spawn

    original = spawn._wrap
    if getattr(original, "_tpu_migrate", False):
        return

    @functools.wraps(original)
    def _wrap(fn, i, *args, **kwargs):
        recorder = recording.RECORDER
        if recorder is not None and isinstance(i, int):
            recorder.rank = i
            recorder.emit(RankEvent(kind=Kind.RANK, op=None, file=None, line=None, rank=i))
        return original(fn, i, *args, **kwargs)

    _wrap._tpu_migrate = True
    spawn._wrap = _wrap


def install_backend(backend: str) -> None:
    """xla: hooks when torch_xla is imported; native: hooks when torch is imported; auto:
    native, replaced by xla if the program's own code imports torch_xla; standin: the stand-in, then the
    native hooks with the stand-in's reports of its transfers, when torch is imported."""
    if backend == "standin":
        after_import("torch", _install_standin)
        after_import("torch._dynamo", dynamo_imported)
    if backend == "xla":
        after_import("torch_xla", install_xla)
    if backend == "auto":
        after_import("torch_xla", _install_xla_if_the_program_imports_it)
    if backend in ("native", "auto"):
        after_import("torch", _install_native)
        after_import("torch._dynamo", dynamo_imported)


# The run's site directory (runner.run: its sitecustomize) and backend, kept by install():
# the program's environment loses the tool's variables then.
_RUN: dict[str, str] = {}


def site_directory() -> str | None:
    directory = _RUN.get("dir")
    return os.path.join(os.path.abspath(directory), "site") if directory else None


def keeps_site_on_path() -> bool:
    """Under the stand-in backend the tool is imported from the site directory (another Python,
    without the tool installed): it stays on sys.path."""
    return _RUN.get("backend") == "standin"


def install() -> bool:
    """Start recording in this process when the diagnose environment is set."""
    directory = os.environ.get(ENV_DIR)
    if not directory or recording.RECORDER is not None:
        return False
    recording.RECORDER = recording.Recorder(directory)
    _RUN.update(dir=directory, backend=os.environ.get(ENV_BACKEND, "xla"))
    atexit.register(recording.RECORDER.finish)
    recording.install_exit_hooks()
    install_backend(os.environ.get(ENV_BACKEND, "xla"))
    after_import("torch.multiprocessing.spawn", lambda: _safely("spawn rank", _spawn_rank_hook))
    # The program sees its own environment; its Python children get the tracer's back.
    _safely("environment", lambda: inheritance.take(recording.INHERITED, directory))
    return True
