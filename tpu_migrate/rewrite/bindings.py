"""What a name refers to at one point of its scope: the bindings made before it, in order.

A scope records every binding of a name (Binding): where it takes effect, whether it is an
import, and whether it may not run (inside an `if`, a loop, an `except` ...). `state` folds
them for a use at a position, or for a use that runs after the whole scope (`at=None`: inside
a function or lambda). The rule: an import replaces what came before (a guarded import is
still the one the program means); a binding that always runs replaces it too; one that may
not run adds a possibility. A fallback (`except ImportError: xm = None`) is no possibility:
it stands in for the import where the import failed.
"""

from __future__ import annotations

from dataclasses import dataclass

Position = tuple[int, int]  # (line, column), comparable
Span = tuple[Position, Position]


@dataclass(frozen=True)
class Binding:
    name: str
    at: Position  # where it takes effect: uses in statements that start after it see it
    qualname: str | None = None  # an import's target; None for any other binding
    block: Span | None = None  # the innermost block of the scope that may not run (if, loop, except)
    loop: Span | None = None  # the outermost loop of the scope around it: its next pass sees it
    fallback: bool = False  # stands in for an import of the same name (see module docstring)

    @property
    def is_import(self) -> bool:
        return self.qualname is not None


def _inside(at: Position, span: Span) -> bool:
    return span[0] <= at <= span[1]


def state(bindings: list[Binding], at: Position | None) -> list[Binding]:
    """The bindings `name` may refer to at `at` (None: after the whole scope); [] when it is
    not bound yet."""
    values: list[Binding] = []
    for binding in bindings:
        if binding.fallback:
            continue
        if at is not None and not (binding.at < at or (binding.loop and _inside(at, binding.loop))):
            continue
        certain = binding.block is None or (
            at is not None and binding.at < at and _inside(at, binding.block)
        )
        if binding.is_import or certain:
            values = [binding]
        else:
            values.append(binding)
    return values


def reaching(bindings: list[Binding], at: Position | None) -> list[Binding]:
    """Every binding of the name whose value a use at `at` may see, imports and fallbacks alike:
    unlike `state`, an import that may not run, or that another import stands in for, replaces
    nothing. (`if fast: from torch.optim import AdamW` / `else: from torch_xla.amp.syncfree
    import AdamW`: a use after them may be either.)"""
    values: list[Binding] = []
    for binding in bindings:
        if at is not None and not (binding.at < at or (binding.loop and _inside(at, binding.loop))):
            continue
        certain = binding.block is None or (
            at is not None and binding.at < at and _inside(at, binding.block)
        )
        if certain and not binding.fallback:
            values = [binding]
        else:
            values.append(binding)
    return values
