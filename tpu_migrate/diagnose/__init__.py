"""`tpu-migrate diagnose`: run a program under a tracer and report what would make it slow on a TPU."""
