"""The code of module-level helpers that rules add to a file once (FileContext.helper)."""

from __future__ import annotations


def _through_containers(params: str, leaf: str, doc: str) -> str:
    """A helper's code that rebuilds `obj` through dicts (their type and attributes kept: a state
    dict's _metadata), lists and tuples (named tuples included), with `leaf` for each tensor.
    torch 2.9 has no public pytree module (torch.utils.pytree comes later)."""
    rest = params.partition(",")[2]
    return f'''def {{name}}({params}):
    """{doc}"""
    if isinstance(obj, {{torch}}.Tensor):
        return {leaf}
    if isinstance(obj, dict):
        copied = {{copy}}.copy(obj)  # the same type and attributes (a state dict's _metadata)
        for key, value in obj.items():
            copied[key] = {{name}}(value{"," if rest else ""}{rest})
        return copied
    if isinstance(obj, (list, tuple)):
        values = [{{name}}(value{"," if rest else ""}{rest}) for value in obj]
        return type(obj)(*values) if hasattr(obj, "_fields") else type(obj)(values)
    return obj
'''


# What xm.save saved: CPU copies of the tensors, however nested.
CPU_COPIES = _through_containers("obj", "obj.cpu()", "`obj` with its tensors copied to the CPU, through dicts, lists and "
                                 "tuples (as xm.save saved).")
# What torch_xla's device loaders and send_cpu_data_to_device did to a batch: every tensor in it
# moved (TO_DEVICE; named_expressions.py gives TOML templates the helper as `{map_tensors}`).
MAP_TENSORS = _through_containers("obj, fn", "fn(obj)", "`obj` with `fn` applied to each of its tensors, through dicts, lists "
                                  "and tuples (added by tpu-migrate).")
