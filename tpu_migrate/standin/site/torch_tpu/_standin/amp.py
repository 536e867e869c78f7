"""`torch.autocast("tpu", dtype=torch.bfloat16)`: the AutocastPrivateUse1 kernels TorchTPU registers.

The lists follow PyTorch's CUDA autocast policy (matmuls and convolutions in the lower precision,
reductions and losses in float32), which is what a TPU program sees from TorchTPU's kernels.
"""

import torch

_LOWER_PRECISION = (
    "mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "mv", "addmv", "dot",
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d.input",
    "conv_transpose3d.input", "_convolution", "convolution", "prelu", "chain_matmul",
    "scaled_dot_product_attention",
)
_FLOAT32 = (
    "softmax.int", "log_softmax.int", "cross_entropy_loss", "nll_loss", "nll_loss2d", "mse_loss",
    "l1_loss", "smooth_l1_loss", "binary_cross_entropy_with_logits", "kl_div", "layer_norm",
    "group_norm", "norm.Scalar", "sum", "sum.dim_IntList", "prod", "cumsum", "cumprod", "exp", "log",
    "pow.Tensor_Scalar", "acos", "asin", "cosh", "erfinv", "reciprocal", "rsqrt", "sinh", "tan",
    "softplus", "dist", "pdist", "cdist", "renorm", "logsumexp",
)

_libraries = []


def _cast(value, dtype):
    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != dtype:
        return value.to(dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(item, dtype) for item in value)
    return value


def _kernel(op, fixed_dtype):
    def autocast_kernel(*args, **kwargs):
        dtype = fixed_dtype or torch.get_autocast_dtype("tpu")
        with torch._C._ExcludeDispatchKeyGuard(
            torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)
        ):
            args = _cast(args, dtype)
            kwargs = {name: _cast(value, dtype) for name, value in kwargs.items()}
            return op(*args, **kwargs)

    return autocast_kernel


def install():
    library = torch.library.Library("aten", "IMPL")
    for names, dtype in ((_LOWER_PRECISION, None), (_FLOAT32, torch.float32)):
        for qualified in names:
            name, _, overload = qualified.partition(".")
            packet = getattr(torch.ops.aten, name, None)
            if packet is None or (overload or "default") not in packet.overloads():
                continue
            op = getattr(packet, overload or "default")
            library.impl(qualified, _kernel(op, dtype), "AutocastPrivateUse1")
    _libraries.append(library)
    # Every other op runs as it is under autocast (relu, add, dropout ...), as TorchTPU's
    # autocast key falls through like CUDA's: without this, an op with no kernel above raises.
    everything_else = torch.library.Library("_", "IMPL")
    everything_else.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    _libraries.append(everything_else)
    torch.set_autocast_dtype("tpu", torch.bfloat16)
