"""The code of module-level helpers that rules add to a file once (FileContext.helper)."""

from __future__ import annotations

import ast

# Every helper's docstring says so: a later run tells the tool's code from the program's by it.
ADDED_BY = "(added by tpu-migrate)"


def is_added_helper(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> bool:
    """A function (or class) an earlier run of the tool added to the file."""
    docstring = ast.get_docstring(node, clean=False)
    return docstring is not None and ADDED_BY in " ".join(docstring.split())


def _through_containers(params: str, leaf: str, doc: str, objects: bool = False) -> str:
    """A helper's code that rebuilds `obj` through dicts (their type and attributes kept: a state
    dict's _metadata), lists and tuples (named tuples included), with `leaf` for each tensor;
    `objects`: also through the attributes of other objects (a copy of each), as torch_xla's
    device loaders went through a transformers BatchEncoding. torch 2.9 has no public pytree
    module (torch.utils.pytree comes later)."""
    rest = params.partition(",")[2]
    through_objects = f'''    if hasattr(obj, "__dict__") and not callable(obj):  # a batch object: its attributes
        copied = {{copy}}.copy(obj)
        for key, value in vars(obj).items():
            vars(copied)[key] = {{name}}(value{"," if rest else ""}{rest})
        return copied
''' if objects else ""
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
{through_objects}    return obj
'''


# What xm.save saved: CPU copies of the tensors, however nested.
CPU_COPIES = _through_containers("obj", "obj.cpu()", "`obj` with its tensors copied to the CPU, through dicts, lists and "
                                 "tuples (as xm.save saved).")
# What torch_xla's device loaders and send_cpu_data_to_device did to a batch: every tensor in it
# moved (TO_DEVICE; named_expressions.py gives TOML templates the helper as `{map_tensors}`).
MAP_TENSORS = _through_containers("obj, fn", "fn(obj)", "`obj` with `fn` applied to each of its tensors, through dicts, lists, "
                                  "tuples and other objects' attributes (added by tpu-migrate).", objects=True)


# What SPMD did to a batch sharded FSDP style (on its first dimension over one mesh axis), with
# one process per device: each process keeps its own slice (named_expressions: `{batch_slice}`;
# the sharded device loader and a converted `xs.mark_sharding` of a batch use it).
BATCH_SLICE = '''def {name}(batch, mesh, axis):
    """This process's part of `batch` (added by tpu-migrate). SPMD sharded the first dimension of
    every tensor in it over the mesh's `axis`; with one process per device, each process keeps
    its own equal slice (the rank's along `axis`, where SPMD placed it), so together the
    processes compute on the same global batch: every process must read the same global batch
    (the same data, order and seed), as SPMD's one process did. A batch that does not split
    evenly raises rather than weigh the processes unequally."""
    parts = mesh.size(mesh.mesh_dim_names.index(axis) if isinstance(axis, str) else axis)
    index = mesh.get_local_rank(axis)
    sizes = set()

    def part(t):  # this process's part of a tensor's first dimension
        if not t.dim():
            return t
        sizes.add(t.shape[0])
        return t.tensor_split(parts)[index]

    sliced = {map_tensors}(batch, part)
    if len(sizes) > 1 or (sizes and min(sizes) % parts):
        raise ValueError(
            f"tpu-migrate: a batch whose tensors' first dimensions are {{sorted(sizes)}} does not split "
            f"evenly over {{parts}} processes: give every tensor of a batch the same first "
            "dimension, a multiple of the process count")
    return sliced
'''
