"""In-process mode: trace a block of code in this process (the pytest plugin)."""

from __future__ import annotations

import sys

from tpu_migrate.diagnose import native, recording, tracer, xla_hooks


class InProcess:
    """Trace a block of code in this process (the pytest plugin): no child process, no
    PT_XLA_DEBUG file; torch_xla compiles are counted per step from its counters instead.
    Code without torch_xla gets the native backend."""

    def __init__(self, directory: str, warmup_steps: int = 2):
        self.directory = directory
        self.warmup_steps = warmup_steps

    def __enter__(self) -> "InProcess":
        recorder = recording.RECORDER = recording.Recorder(self.directory)
        recorder.debug_file = recorder.fallback_file = None
        if "torch_xla" in sys.modules:
            xla_hooks.install_torch_xla_hooks()
            recorder.aten = {name: recorder.metrics.counter_value(name)
                             for name in recorder.metrics.counter_names() if name.startswith("aten::")}
            tracer.emit_xla_backend(recorder)
        else:
            tracer.after_import("torch_xla", tracer.install_xla)  # hooks once the test imports torch_xla
            if "torch" in sys.modules:
                native.install(recorder, self.warmup_steps, scan_sources=False)
                tracer.after_import("torch._dynamo", tracer.dynamo_imported)
        return self

    def __exit__(self, *exc) -> None:
        native.uninstall()
        recorder, recording.RECORDER = recording.RECORDER, None
        recorder.flush()
