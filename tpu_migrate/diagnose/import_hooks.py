"""Callbacks run right after a module is imported: the tracer's hooks go in once the program
imports torch (or torch_xla, transformers' generation), not before."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a callback right after `import NAME` finishes: the hooks go in only once the
    program's own set-up before that import (PJRT_DEVICE, ...) has run."""

    def __init__(self, name: str, callback):
        self.name = name
        self.callback = callback

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        # Found by the finders after this one, not by the path alone: another import hook on the
        # same module (the TorchTPU stand-in's, loading it after torch) wraps it as well.
        index = sys.meta_path.index(self)
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(index, self)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original_exec = loader.exec_module

        def exec_module(module):
            original_exec(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            self.callback()

        loader.exec_module = exec_module
        return spec


def after_import(name: str, callback) -> None:
    if name in sys.modules:
        callback()
    elif not any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, callback))
