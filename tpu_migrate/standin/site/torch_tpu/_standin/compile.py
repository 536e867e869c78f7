"""`torch.compile` as TorchTPU 0.2.0 patches it, with a `"tpu"` backend that runs on the CPU.

- The `"tpu"` backend compiles through AOTAutograd (forward and backward graphs, the tpu tensors
  desugared to the CPU tensors inside) and runs the graphs eagerly: compiles, recompiles, guards
  and graph breaks are Dynamo's own, as on a TPU; the kernels are the CPU's.
- It refuses what 0.2.0's backend refuses: `dynamic=True`, `mode=` and unknown options.
- `torch.compile` without a backend picks `"tpu"` for tpu inputs and defaults to `dynamic=False`;
  `backend="inductor"` on tpu inputs raises, with TorchTPU's message.
"""

import functools

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.backends.registry import lookup_backend, register_backend
from torch._functorch.aot_autograd import make_boxed_func
from torch.utils import _pytree as pytree

_OPTIONS = {
    "async_compile", "num_dynamic_buckets", "bucket_size", "serializable", "debug_callback",
    "custom_module_name", "name", "tpu_backend",
}
_MAX_DYNAMIC_BUCKETS = 8
_INDUCTOR_TPU_ERROR = (
    "torch.compile(..., backend='inductor') on TPU is experimental and does"
    " not yet have full TPU support; compilation is likely to fail with"
    " cryptic errors, e.g."
    " https://github.com/google-pytorch/torch_tpu/issues/4300. Pass"
    " backend='tpu' or do not specify `backend` in torch.compile to use"
    " TorchTPU, which does have full TPU support. If you do want to run"
    " Inductor on TPU, you can bypass this error by passing"
    " options={'tpu_backend': 'pallas'}."
)


def _run_graph(graph_module, example_inputs):
    return make_boxed_func(graph_module.forward)  # the CPU runs the graph as traced


_aot_eager_cpu = aot_autograd(fw_compiler=_run_graph, bw_compiler=_run_graph)


def tpu_backend(graph_module, example_inputs, **kwargs):
    options = kwargs.pop("options", None) or {}
    _check_options(options)
    if kwargs:
        raise TypeError("Unexpected keyword arguments: {}".format(kwargs))
    if not torch._dynamo.config.assume_static_by_default:
        raise NotImplementedError(
            "TPU backend does not support torch.compile(..., dynamic=True, ...)."
            " Please run torch.compile() with dynamic=None or default dynamism"
            " i.e. torch.compile(model) and try again."
        )
    return _aot_eager_cpu(graph_module, example_inputs)


def _check_options(options):
    unknown = set(options) - _OPTIONS
    if unknown:
        raise TypeError("Unexpected keyword arguments: {}".format({"options": options}))
    buckets = options.get("num_dynamic_buckets", 1)
    buckets = 1 if buckets is None else buckets
    if not isinstance(buckets, int) or not 1 <= buckets <= _MAX_DYNAMIC_BUCKETS:
        raise ValueError(
            "`num_dynamic_buckets` must be an integer between 1 and"
            f" {_MAX_DYNAMIC_BUCKETS}, got {buckets}"
        )
    bucket_size = options.get("bucket_size", 128)
    bucket_size = 128 if bucket_size is None else bucket_size
    if not isinstance(bucket_size, int) or bucket_size <= 0:
        raise ValueError(f"`bucket_size` must be a positive integer, got {bucket_size}")
    callback = options.get("debug_callback")
    if callback is not None and not callable(callback):
        raise TypeError("'debug_callback' must be callable")


def _has_tpu_inputs(example_inputs):
    return any(
        isinstance(value, torch.Tensor) and value.device.type == "tpu"
        for value in pytree.tree_leaves(example_inputs)
    )


def _default_backend_selector(graph_module, example_inputs, **kwargs):
    if _has_tpu_inputs(example_inputs):
        return tpu_backend(graph_module, example_inputs, **kwargs)
    return lookup_backend("inductor")(graph_module, example_inputs, **kwargs)


def _is_tpu_backend(backend):
    return backend == "tpu" or backend is _default_backend_selector or backend is tpu_backend


def install():
    # Dynamo compiles the user's frames, never the stand-in's own: the device guard's Python
    # methods are called from C++ while a graph is traced, and would be frames of their own.
    torch._dynamo.trace_rules.add("torch_tpu")
    register_backend(tpu_backend, name="tpu")
    original_compile = torch.compile
    inductor_wrapper = torch._TorchCompileInductorWrapper
    original_inductor_call = inductor_wrapper.__call__

    @functools.wraps(original_compile)
    def compile_as_torch_tpu(*args, **kwargs):
        if kwargs.get("backend") is None:
            kwargs["backend"] = _default_backend_selector
        if "dynamic" not in kwargs and _is_tpu_backend(kwargs["backend"]):
            kwargs["dynamic"] = False
        return original_compile(*args, **kwargs)

    @functools.wraps(original_inductor_call)
    def refuse_tpu_inputs(self, model, inputs, *args, **kwargs):
        pallas = (getattr(self, "config", None) or {}).get("tpu_backend") == "pallas"
        if not pallas and _has_tpu_inputs(inputs):
            raise RuntimeError(_INDUCTOR_TPU_ERROR)
        return original_inductor_call(self, model, inputs, *args, **kwargs)

    torch.compile = compile_as_torch_tpu
    inductor_wrapper.__call__ = refuse_tpu_inputs
