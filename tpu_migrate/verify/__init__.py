"""`tpu-migrate verify`: the original program against its migration, optimizer step by
optimizer step, at one process and under torchrun (command.py; runs.py runs them, recorder.py
records inside them, compare.py finds the first divergence)."""
