"""What a library compiles by itself on a TPU, predicted from the run (native backend, the CPU
standing in).

Transformers' `generate` compiles the model's forward on its own when the cache is static
(`cache_implementation="static"`, or a static cache passed in) and the model is on a device its
auto-compile covers, "tpu" among them (transformers PR #45918); it compiles with
`generation_config.compile_config`, by default `CompileConfig(backend="inductor",
mode="reduce-overhead")`. On TorchTPU both raise: backend "inductor" with TPU tensors
(RuntimeError) and any `mode=` (TypeError). With the CPU standing in, generate does not compile
(the CPU is not on its list), so nothing would show it, and where it does compile (a GPU) the
compile is the library's own call, which the compile hook does not check: each generate call asks
`_valid_auto_compile_criteria`, and where the other conditions hold (a static cache, compiling
not disabled), the call is reported as the compile a TPU would make, with the arguments it would
get.
"""

from __future__ import annotations

import functools
import sys

from tpu_migrate.diagnose import recording
from tpu_migrate.diagnose.events import Kind

GENERATION = "transformers.generation.utils"


def install_generate_hook(recorder: recording.Recorder, problems) -> None:
    """Wrap GenerationMixin._valid_auto_compile_criteria (once transformers' generation module is
    imported). `problems(kwargs)`: what of torch.compile's arguments raises on TorchTPU."""
    generation = sys.modules.get(GENERATION)
    mixin = getattr(generation, "GenerationMixin", None)
    original = getattr(mixin, "_valid_auto_compile_criteria", None)
    if original is None or getattr(original, "_tpu_migrate", False):
        return
    reported: set = set()

    @functools.wraps(original)
    def valid_auto_compile_criteria(self, model_kwargs, generation_config, *args, **kwargs):
        valid = original(self, model_kwargs, generation_config, *args, **kwargs)
        if _would_compile_on_a_tpu(model_kwargs, generation_config):
            config = getattr(generation_config, "compile_config", None) or _default_compile_config(self)
            arguments = config.to_dict() if config is not None else {}
            found = problems(arguments)
            if found:
                site = recording.user_frame()
                if site not in reported:  # once per generate line
                    reported.add(site)
                    shown = ", ".join(f"{key}={arguments[key]!r}" for key in ("backend", "mode", "dynamic")
                                      if arguments.get(key) is not None)
                    recorder.at_user_line(Kind.INCOMPATIBLE, f"generate's own torch.compile({shown})", depth=2)
        return valid

    valid_auto_compile_criteria._tpu_migrate = True
    mixin._valid_auto_compile_criteria = valid_auto_compile_criteria


def _would_compile_on_a_tpu(model_kwargs: dict, generation_config) -> bool:
    """generate's other conditions for compiling (besides the device): compiling not disabled, and
    a static (compileable, not dynamic) cache."""
    if getattr(generation_config, "disable_compile", False):
        return False
    cache = model_kwargs.get("cache", model_kwargs.get("past_key_values"))
    decoder = getattr(cache, "self_attention_cache", cache)
    return (cache is not None and bool(getattr(cache, "is_compileable", False))
            and type(decoder).__name__ != "DynamicCache")


def _default_compile_config(model):
    """The CompileConfig generate falls back on (the model's `_default_compile_config()`, as
    get_compiled_call asks it), else transformers' CompileConfig()."""
    default = getattr(model, "_default_compile_config", None)
    if default is not None:
        return default()
    try:
        from transformers.generation.configuration_utils import CompileConfig
    except ImportError:
        return None
    return CompileConfig()
