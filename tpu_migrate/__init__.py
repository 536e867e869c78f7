"""tpu-migrate: port torch_xla and Optimum TPU code to native TorchTPU."""

__version__ = "0.1.0"
