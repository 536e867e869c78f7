"""The stand-in's own parts; `torch_tpu._loader.load()` wires them into torch."""
