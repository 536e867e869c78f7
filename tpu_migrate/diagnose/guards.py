"""Dynamo's shape guards, read: which input of a compiled function changed, in which dimension,
and what pattern the new values make.

A guard failure names the input by its source in the frame: `x`, `L['x']`, `args[0]`,
`kwargs['input_ids']`, `L['kwargs']['input_ids']`, `L['self'].cache[0]`. Models called with
keyword arguments (Hugging Face's `model(**inputs)`, `generate`) fail guards on the nested forms,
which a pattern for the plain ones took for "a Python number changed". Each recompile's guard
gives one new value of the dimension; over a site's recompiles the values say why:

- the second dimension one longer each time: a cache that grows by a token per call (generation
  without a static cache);
- the first dimension: the batch size (a last, shorter batch; prompts batched by count);
- another dimension taking several values: a length per input (prompts, sequences), for padding
  to a few bucket lengths.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SHAPE = re.compile(r"^tensor '(?P<source>.+?)' (?P<what>size|stride|rank) mismatch"
                    r"(?: at index (?P<dim>\d+))?(?:\. expected (?P<expected>\d+), actual (?P<actual>\d+))?")
# One step of a source: a name, `['key']`, `[0]` or `.attribute`.
_STEP = re.compile(r"\['(?P<key>[^']*)'\]|\[(?P<index>\d+)\]|\.(?P<attr>\w+)|(?P<name>\w+)")


@dataclass(frozen=True)
class ShapeGuard:
    source: str  # as Dynamo wrote it
    path: tuple  # ("kwargs", "input_ids"), ("args", 0): how to find the tensor in the frame
    what: str  # size, stride or rank
    dim: int | None
    expected: int | None
    actual: int | None

    @property
    def name(self) -> str:
        """The input as the user passed it: `input_ids`, not `L['kwargs']['input_ids']`; a tensor
        inside one as the path to it: `cache.layers[0].keys` (a cache object's)."""
        path = list(self.path)
        while path and path[0] in ("kwargs", "args", "self"):
            if path[0] == "args" and len(path) == 2 and isinstance(path[1], int):
                return f"positional input {path[1]}"
            path = path[1:]
        if not path or isinstance(path[0], int):
            return self.source
        named = [step for step in path if isinstance(step, str)]
        if len(named) == 1 or not any(step.startswith(".") for step in named):
            return named[-1].lstrip(".")  # `cache`; `inputs['input_ids']`: the keyword passed
        text = path[0].lstrip(".")
        for step in path[1:]:
            text += f"[{step}]" if isinstance(step, int) else step if step.startswith(".") else f"['{step}']"
        return text

    def find(self, frame_locals: dict):
        """The tensor in the frame whose guard failed, or None."""
        if not self.path or not isinstance(self.path[0], str):
            return None
        value = frame_locals.get(self.path[0])
        for step in self.path[1:]:
            if value is None:
                return None
            value = getattr(value, step[1:], None) if isinstance(step, str) and step.startswith(".") else value[step]
        return value

    def describe(self) -> str:
        if self.what == "size" and self.dim is not None and self.expected is not None:
            return f"`{self.name}` dimension {self.dim} changed ({self.expected} -> {self.actual})"
        return f"`{self.name}` {self.what} changed"


def shape_guard(reason: str | None) -> ShapeGuard | None:
    """The shape guard a (readable) guard failure states, or None for any other guard."""
    match = _SHAPE.match((reason or "").strip())
    if match is None:
        return None
    path = tuple(_path(match["source"]))
    if path and path[0] == "L":
        path = path[1:]  # Dynamo's frame locals
    number = (lambda value: int(value) if value is not None else None)  # noqa: E731
    return ShapeGuard(match["source"], path, match["what"], number(match["dim"]), number(match["expected"]),
                      number(match["actual"]))


def _path(source: str):
    position = 0
    while position < len(source):
        step = _STEP.match(source, position)
        if step is None:
            return
        position = step.end()
        if step["index"] is not None:
            yield int(step["index"])
        elif step["attr"] is not None:
            yield "." + step["attr"]  # an attribute, apart from a key
        else:
            yield step["key"] if step["key"] is not None else step["name"]


def pattern(guards: list[ShapeGuard]) -> str | None:
    """What the new values of one dimension say, over a site's recompiles (see the module)."""
    sized = [g for g in guards if g.what == "size" and g.dim is not None and g.actual is not None]
    if not sized:
        return None
    # The input and dimension that changed most often: a generation's prefill changes the prompt's
    # length once, then every token grows the cache.
    groups: dict[tuple, list[int]] = {}
    for g in sized:
        groups.setdefault((g.name, g.dim), []).append(g.actual)
    (name, dim), values = max(groups.items(), key=lambda item: len(item[1]))
    shown = ", ".join(str(v) for v in values[:6]) + (", ..." if len(values) > 6 else "")
    if dim > 0 and len(values) >= 2 and all(b == a + 1 for a, b in zip(values, values[1:])):
        return (f"`{name}` dimension {dim} grew by one at each of {len(values)} recompiles ({shown}): a "
                "new graph per generated token, as a cache that grows without a static cache makes "
                "(generate: cache_implementation=\"static\"; a loop: preallocate to the maximum length)")
    if dim == 0:
        return (f"`{name}` dimension 0 took {len(set(values))} new value(s) ({shown}): a graph per size of "
                "the first dimension, in a batch its batch size (DataLoader(drop_last=True); batch "
                "prompts to a fixed count)")
    return (f"`{name}` dimension {dim} took {len(set(values))} new value(s) ({shown}): a graph per length "
            "(pad to a few bucket lengths, or to one maximum length)")
