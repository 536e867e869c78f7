"""Loads the tpu-migrate TorchTPU stand-in into every Python process that imports torch.

`tpu-migrate run` (and verify, diagnose) put this directory first on PYTHONPATH and set
TORCH_DEVICE_BACKEND_AUTOLOAD=0, so an installed torch-tpu (which aborts `import torch` without a
TPU) is never autoloaded. Python imports this file at start-up; it waits for `import torch` to
finish, then loads the stand-in (`torch_tpu._loader.load`), as torch's autoload would load the real
package. Children started by torchrun or multiprocessing inherit PYTHONPATH and load it too.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


class _LoadStandInAfterTorch(importlib.abc.MetaPathFinder):
    """Finds `torch` as the other finders do, and loads the stand-in once torch has run."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)  # once: the stand-in's own imports of torch find it loaded
        # The other finders still see torch (another tool's import hook wraps it too).
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_load(module):
            exec_module(module)
            import torch_tpu._loader

            torch_tpu._loader.load()

        spec.loader.exec_module = exec_then_load
        return spec


def _chain_next_sitecustomize():
    """Runs the sitecustomize this file shadows (further on sys.path), as site would have. Kept
    apart from tpu-migrate's own copy of this logic: the stand-in imports nothing of the tool."""
    entries = [os.path.abspath(entry or os.curdir) for entry in sys.path]
    # Only what comes after this directory: a sitecustomize before it (one that chained to this
    # one) is not run again.
    rest = sys.path[entries.index(_HERE) + 1:] if _HERE in entries else sys.path
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.stderr.write(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}\n")


# Once per process, however the sitecustomize files of a run chain to each other.
if "_tpu_migrate_standin_site" not in sys.modules:
    sys.modules["_tpu_migrate_standin_site"] = sys.modules[__name__]
    if "torch" not in sys.modules:
        sys.meta_path.insert(0, _LoadStandInAfterTorch())
    _chain_next_sitecustomize()
