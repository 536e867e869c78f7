"""What differs between two graphs of one line (the `changed` of an xla recompile under
--explain), from the IR text torch_xla saves per graph."""

from __future__ import annotations

import re
from collections import Counter

IR_NODE = re.compile(r"^\s*%\d+ = \S+ (?P<op>[\w:.]+)\(.*?\)(?P<attrs>.*)$")
LAYOUT = re.compile(r"\{[\d,]*\}")


def _nodes(ir: str) -> list[tuple[str, str, str]]:
    nodes = []
    for line in ir.splitlines():
        match = IR_NODE.match(line)
        if not match:
            continue
        attrs = dict(
            part.strip().split("=", 1) for part in match["attrs"].split(", ") if "=" in part
        )
        shape = LAYOUT.sub("", attrs.get("xla_shape", "")).strip()
        location = attrs.get("location", "").strip()
        nodes.append((match["op"], location, shape))
    return nodes


def graph_change(old_ir: str | None, new_ir: str | None, user_files: frozenset[str] = frozenset()) -> str | None:
    """What differs between two graphs of one line: input shapes first, else the operations one
    has and the other lacks. A place is named only where it is the user's (`user_files`: the
    file names of the program's lines; torch_xla's IR names a file without its directory): the
    graph of `loss.backward()` is full of torch's own lines (`_make_grads@__init__.py:221`)."""
    if not old_ir or not new_ir:
        return None
    old, new = _nodes(old_ir), _nodes(new_ir)

    def at(location: str, word: str) -> str:
        short = _short(location)
        return f" {word} {short}" if short and short.rsplit(":", 1)[0] in user_files else ""

    old_inputs = [n for n in old if n[0] == "xla::device_data"]
    new_inputs = [n for n in new if n[0] == "xla::device_data"]
    changes = [
        f"input {a[2]} -> {b[2]}" + (f" (created{at(b[1], 'at')})" if at(b[1], "at") else "")
        for a, b in zip(old_inputs, new_inputs) if a[2] != b[2]
    ]
    if changes:
        return "; ".join(changes[:3])
    parts = []
    for word, ours, theirs in (("gained", new, old), ("lost", old, new)):
        extra = Counter((op, shape) for op, _, shape in ours) - Counter((op, shape) for op, _, shape in theirs)
        if extra:
            parts.append(f"{word} {_operations(extra, ours, at)}")
    return f"the graph {' and '.join(parts)}" if parts else None


def _operations(extra: Counter, nodes, at) -> str:
    """`2 inputs (f32[4], f32[4,16]) and aten::add f32[4,16] at train.py:12 (and 1 more)`:
    inputs (the tensors a step reads, such as gradients kept from the last one) apart from
    operations, each in graph order."""
    inputs = [shape for (op, shape), n in extra.items() if op == "xla::device_data" for _ in range(n)]
    said = []
    if inputs:
        shown = ", ".join(inputs[:3]) + (", ..." if len(inputs) > 3 else "")
        said.append(f"{len(inputs)} input{'s' if len(inputs) != 1 else ''} ({shown})")
    operations = sum(n for (op, _), n in extra.items() if op != "xla::device_data")
    if operations:
        first = next(node for node in nodes if node[0] != "xla::device_data" and (node[0], node[2]) in extra)
        said.append(f"{first[0]} {first[2]}{at(first[1], 'at')}"
                    + (f" (and {operations - 1} more operations)" if operations > 1 else ""))
    return " and ".join(said)


def _short(location: str) -> str:
    return location.split("@", 1)[1] if "@" in location else location
