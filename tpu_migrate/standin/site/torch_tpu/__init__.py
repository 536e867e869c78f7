"""The tpu-migrate TorchTPU stand-in: TorchTPU 0.2.0's `tpu` device, emulated on the CPU.

A program that imports `torch_tpu` here gets this package (its directory comes first on
PYTHONPATH); the device itself is set up by `torch_tpu._loader.load()`, which sitecustomize calls
as soon as torch is imported. Nothing here imports tpu-migrate.
"""

from torch_tpu import _loader

__version__ = "0.2.0+standin"

_loader.load()
